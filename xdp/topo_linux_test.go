package xdp

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// topo is client — proxy — backends: three namespaces joined by two veth
// pairs, the proxy routing between them.
//
//	client ns: cv 198.51.100.2/24, default via .1
//	proxy ns:  pc 198.51.100.1/24 (peer of cv), pb 203.0.113.1/24 (peer of bv)
//	backend ns: bv 203.0.113.10..19/24, default via .1
type topo struct {
	client, proxy, backend *netns
}

var (
	proxyFront = netip.MustParseAddr("198.51.100.1")
	clientAddr = netip.MustParseAddr("198.51.100.2")
)

// backendAddr is the address of the backend with ordinal o.
func backendAddr(o uint8) netip.Addr { return netip.AddrFrom4([4]byte{203, 0, 113, 10 + o}) }

func newTopo(t testing.TB) *topo {
	needRoot(t)
	tp := &topo{client: newNetns(t, "c"), proxy: newNetns(t, "p"), backend: newNetns(t, "b")}
	run(t, "ip", "link", "add", "pc", "netns", tp.proxy.name, "type", "veth", "peer", "name", "cv", "netns", tp.client.name)
	run(t, "ip", "link", "add", "pb", "netns", tp.proxy.name, "type", "veth", "peer", "name", "bv", "netns", tp.backend.name)
	tp.client.ip(t, "addr add 198.51.100.2/24 dev cv")
	tp.client.ip(t, "link set cv up")
	tp.client.ip(t, "route add default via 198.51.100.1")
	tp.proxy.ip(t, "addr add 198.51.100.1/24 dev pc")
	tp.proxy.ip(t, "addr add 203.0.113.1/24 dev pb")
	tp.proxy.ip(t, "link set pc up")
	tp.proxy.ip(t, "link set pb up")
	for o := range uint8(10) {
		tp.backend.ip(t, "addr add "+backendAddr(o).String()+"/24 dev bv")
	}
	tp.backend.ip(t, "link set bv up")
	tp.backend.ip(t, "route add default via 203.0.113.1")
	// Frames the proxy's program transmits into a veth reach the peer
	// only when the peer has an XDP program too; senders must put full
	// UDP checksums on the wire, as a NIC does, not the partial ones
	// veth may pass along.
	for _, side := range []struct {
		ns  *netns
		if_ string
	}{{tp.client, "cv"}, {tp.backend, "bv"}} {
		side.ns.do(t, func() {
			attachPass(t, side.if_)
			txChecksumOff(t, side.if_)
		})
	}
	return tp
}

// attachPass attaches a program that passes everything, natively.
func attachPass(t testing.TB, ifname string) {
	t.Helper()
	l := passLink(t, ifname)
	t.Cleanup(func() { l.Close() })
}

// passLink attaches a program that passes everything, natively, until the
// link is closed.
func passLink(t testing.TB, ifname string) link.Link {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close() // the link holds it
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: iface.Index, Flags: link.XDPDriverMode})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// txChecksumOff turns off transmit checksum offload (ethtool -K IF tx
// off).
func txChecksumOff(t testing.TB, ifname string) { ethtoolSet(t, ifname, ethtoolSTXCSUM, 0) }

// Legacy ethtool set commands (linux/ethtool.h).
const (
	ethtoolSTXCSUM = 0x17
	ethtoolSTSO    = 0x1f
	ethtoolSGRO    = 0x2c
)

// ethtoolSet runs one legacy ethtool set command (ethtool -K) through the
// SIOCETHTOOL ioctl, on the calling thread's namespace.
func ethtoolSet(t testing.TB, ifname string, cmd, value uint32) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	v := struct{ cmd, data uint32 }{cmd: cmd, data: value}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&v)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		t.Fatalf("ethtool %#x %d on %s: %v", cmd, value, ifname, e)
	}
	runtime.KeepAlive(&v)
}

// goIn runs f on a goroutine whose thread stays in ns for its life (the
// thread ends with it), for loops such as Accel.Run that read the
// namespace's addresses.
func goIn(t testing.TB, ns *netns, ctx context.Context, f func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
			t.Error(err)
			return
		}
		f(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
}
