// Command rawfwd is the raw-limit baseline of the forwarding benchmark:
// the least work a PPv2 forwarder can do on this kernel, written without
// any of cidroute's code, so that no ratio against it measures the
// project against itself. Forward, it reads a batch with recvmmsg, puts a
// fixed 28-byte PROXY v2 IPv4 header in front of each datagram as a
// second iovec (the client's address written in, nothing parsed or looked
// up) and sends the batch to the one backend with sendmmsg. Reverse, it
// takes the client's address from fixed offsets of the backend's 28-byte
// header and sends the rest back from the service socket. No checks
// beyond the header's length: it is a measuring stick, not a proxy.
//
// Each direction is one goroutine locked to its OS thread, blocked in
// recvmmsg(MSG_WAITFORONE) on a blocking socket: one syscall per wake-up,
// the cheapest wait measured on this kind of machine. GOMAXPROCS is raised
// to 3 so that both threads find a P when the kernel returns (pinned to
// one CPU the runtime would pick 1, and the two threads would hand it
// around through sysmon).
//
// It prints "rawfwd listening on ADDR" once bound, and stops on SIGINT or
// SIGTERM.
//
//	rawfwd -listen 127.0.0.1:5684 -backend 127.0.0.1:7000
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func cmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rawfwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "service `ip:port` (IPv4)")
	backend := fs.String("backend", "", "backend `ip:port` (IPv4), required")
	batch := fs.Int("batch", 32, "datagrams per recvmmsg/sendmmsg (1-1024)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	be, err := netip.ParseAddrPort(*backend)
	if err != nil || !be.Addr().Is4() {
		fmt.Fprintf(stderr, "rawfwd: -backend %q: want an IPv4 ip:port\n", *backend)
		return 2
	}
	if *batch < 1 || *batch > 1024 {
		fmt.Fprintf(stderr, "rawfwd: -batch %d: want 1-1024\n", *batch)
		return 2
	}
	f, err := newForwarder(*listen, be, *batch)
	if err != nil {
		fmt.Fprintln(stderr, "rawfwd:", err)
		return 1
	}
	if runtime.GOMAXPROCS(0) < 3 {
		runtime.GOMAXPROCS(3)
	}
	fmt.Fprintf(stdout, "rawfwd listening on %s\n", f.service)
	f.run(ctx)
	return 0
}

// hdrLen is a PROXY v2 header for IPv4 over DGRAM: signature(12), ver/cmd,
// fam/proto, length(2) = 12, src(4) dst(4) sport(2) dport(2).
const hdrLen = 28

// mmsghdr is the kernel's struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// A batch is one direction's recvmmsg and sendmmsg arguments, allocated
// once.
type batch struct {
	rx, tx   []mmsghdr
	rxIov    []unix.Iovec
	txIov    []unix.Iovec // 2 per datagram: header, payload
	names    []unix.RawSockaddrInet4
	txNames  []unix.RawSockaddrInet4
	bufs     [][]byte
	hdrs     []byte
	capacity int
}

func newBatch(n int) *batch {
	const size = 9216
	b := &batch{rx: make([]mmsghdr, n), tx: make([]mmsghdr, n), rxIov: make([]unix.Iovec, n),
		txIov: make([]unix.Iovec, 2*n), names: make([]unix.RawSockaddrInet4, n),
		txNames: make([]unix.RawSockaddrInet4, n), bufs: make([][]byte, n), hdrs: make([]byte, n*hdrLen), capacity: size}
	slab := make([]byte, n*size)
	for i := range n {
		b.bufs[i] = slab[i*size : (i+1)*size]
		b.rxIov[i].Base = &b.bufs[i][0]
		b.rxIov[i].SetLen(size)
		b.rx[i].hdr.Iov = &b.rxIov[i]
		b.rx[i].hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	return b
}

// recv waits for at least one datagram; the number received.
func (b *batch) recv(fd int) (int, error) {
	for i := range b.rx {
		h := &b.rx[i].hdr
		h.SetIovlen(1)
		h.Namelen = unix.SizeofSockaddrInet4
		h.Flags = 0
	}
	for {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.rx[0])), uintptr(len(b.rx)), unix.MSG_WAITFORONE, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		n := int(r)
		if n > 0 && b.rx[0].hdr.Namelen == 0 {
			return 0, errStopped // shut down: the end of reception
		}
		return n, nil
	}
}

var errStopped = errors.New("rawfwd: stopped")

// send sends tx[:n], continuing after partial sends and skipping a
// datagram the kernel refuses.
func (b *batch) send(fd, n int) {
	for h := 0; h < n; {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.tx[h])), uintptr(n-h), 0, 0, 0)
		switch {
		case e == unix.EINTR:
		case e != 0:
			h++
		default:
			h += int(r)
		}
	}
}

type forwarder struct {
	svc, up  int // blocking sockets
	service  netip.AddrPort
	fwd, rev *batch
}

func newForwarder(listen string, backend netip.AddrPort, n int) (*forwarder, error) {
	l, err := netip.ParseAddrPort(listen)
	if err != nil || !l.Addr().Is4() {
		return nil, fmt.Errorf("-listen %q: want an IPv4 ip:port", listen)
	}
	f := &forwarder{svc: -1, up: -1, fwd: newBatch(n), rev: newBatch(n)}
	if f.svc, f.service, err = bound(l); err == nil {
		f.up, _, err = bound(netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	}
	if err != nil {
		f.close()
		return nil, err
	}
	to := sockaddr(backend)
	for i := range n {
		h := f.fwd.hdrs[i*hdrLen : (i+1)*hdrLen]
		copy(h, "\r\n\r\n\x00\r\nQUIT\n\x21\x12\x00\x0c")
		ip := f.service.Addr().As4()
		copy(h[20:24], ip[:])
		binary.BigEndian.PutUint16(h[26:], f.service.Port())
		f.fwd.txNames[i] = to
		m := &f.fwd.tx[i].hdr
		m.Name = (*byte)(unsafe.Pointer(&f.fwd.txNames[i]))
		m.Namelen = unix.SizeofSockaddrInet4
		m.Iov = &f.fwd.txIov[2*i]
		m.SetIovlen(2)
		f.fwd.txIov[2*i].Base = &h[0]
		f.fwd.txIov[2*i].SetLen(hdrLen)
		r := &f.rev.tx[i].hdr
		r.Name = (*byte)(unsafe.Pointer(&f.rev.txNames[i]))
		r.Namelen = unix.SizeofSockaddrInet4
		r.Iov = &f.rev.txIov[2*i]
		r.SetIovlen(1)
	}
	return f, nil
}

// bound opens a blocking IPv4 UDP socket bound to a; its bound address.
func bound(a netip.AddrPort) (int, netip.AddrPort, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, a, err
	}
	sa := &unix.SockaddrInet4{Addr: a.Addr().As4(), Port: int(a.Port())}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, a, fmt.Errorf("bind %v: %w", a, err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, a, err
	}
	s4 := got.(*unix.SockaddrInet4)
	return fd, netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(s4.Port)), nil
}

func sockaddr(a netip.AddrPort) unix.RawSockaddrInet4 {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(a.Port()>>8), byte(a.Port())
	return sa
}

func addrOf(sa *unix.RawSockaddrInet4) netip.AddrPort {
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(p[0])<<8|uint16(p[1]))
}

func (f *forwarder) close() {
	for _, fd := range []int{f.svc, f.up} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// run forwards until ctx is done: then a shutdown wakes both blocked
// threads, and the sockets close after they return.
func (f *forwarder) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { locked(f.forward) })
	wg.Go(func() { locked(f.reverse) })
	<-ctx.Done()
	unix.Shutdown(f.svc, unix.SHUT_RD)
	unix.Shutdown(f.up, unix.SHUT_RD)
	wg.Wait()
	f.close()
}

func locked(loop func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	loop()
}

func (f *forwarder) forward() {
	b := f.fwd
	for {
		n, err := b.recv(f.svc)
		if err != nil {
			return
		}
		for i := range n {
			stampClient(b.hdrs[i*hdrLen:(i+1)*hdrLen], addrOf(&b.names[i]))
			iov := &b.txIov[2*i+1]
			iov.Base = &b.bufs[i][0]
			iov.SetLen(int(b.rx[i].len))
		}
		b.send(f.up, n)
	}
}

// stampClient writes the client's IPv4 address and port into a header.
func stampClient(h []byte, client netip.AddrPort) {
	ip := client.Addr().As4()
	copy(h[16:20], ip[:])
	binary.BigEndian.PutUint16(h[24:], client.Port())
}

func (f *forwarder) reverse() {
	b := f.rev
	for {
		n, err := b.recv(f.up)
		if err != nil {
			return
		}
		k := 0
		for i := range n {
			l := int(b.rx[i].len)
			if l <= hdrLen {
				continue
			}
			buf := b.bufs[i][:l]
			b.txNames[k] = sockaddr(clientOf(buf))
			iov := &b.txIov[2*k]
			iov.Base = &buf[hdrLen]
			iov.SetLen(l - hdrLen)
			k++
		}
		b.send(f.svc, k)
	}
}

// clientOf reads the destination of a reply's header: the client.
func clientOf(b []byte) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[20:24])), binary.BigEndian.Uint16(b[26:28]))
}
