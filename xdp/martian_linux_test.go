package xdp

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMartiansAsTheKernel sends frames the kernel drops before any socket
// (martian sources and destinations, a source that is one of the host's
// interface addresses or in a local route, loopback on the wire) into the
// namespace's stack from the wire, where a socket on the port sees none of
// them but sees a control datagram sent after each, and through the
// program, which must hand each up (XDP_PASS): the stack then drops and
// counts it exactly as on the socket path. Under rp_filter 0 (the
// default) and 1. kernelRefuses, which the differential tests and fuzzers
// apply to every frame, must name each.
func TestMartiansAsTheKernel(t *testing.T) {
	e := newDiffEnv(t)
	// An AnyIP pool: every address of it is the host's.
	e.ns.ip(t, "route add local 10.77.0.0/24 dev lo")
	e.ns.do(t, func() {
		if err := e.prog.Sync(); err != nil {
			t.Fatal(err)
		}
	})
	e.refreshOwn(t)
	svc := map[string]*diffService{}
	for _, s := range e.services {
		svc[s.Name] = s
	}
	c4, c6 := ap("203.0.113.5:40000"), ap("[2001:db8:ffff::5]:50000")
	cid4 := dtlsCIDRecord(8, 1, 40)
	cid5 := dtlsCIDRecord(5, 1, 33)
	short := quicShort(lbCID(12, 0, 1, false), 30)
	reply := func(s *diffService, client netip.AddrPort) []byte {
		return append(ppHeader(t, s.Public, client), "the backend's reply"...)
	}
	own, d4, d6, w4, w6, lo4, lo6 := svc["ownbe"], svc["dtls4"], svc["dtls6"], svc["wild4"], svc["wild6"], svc["lo4"], svc["lo6"]
	type tc struct {
		name      string
		s         *diffService
		reverse   bool // a reply to the service's upstream port
		src       netip.AddrPort
		dst       netip.Addr
		b         []byte
		delivered bool // the kernel takes it: the program may decide it or hand it up
	}
	cases := []tc{
		{name: "to 127.0.0.1, a loopback service", s: lo4, src: c4, dst: netip.MustParseAddr("127.0.0.1"), b: cid4},
		{name: "to 127.0.0.1, a wildcard service", s: w4, src: c4, dst: netip.MustParseAddr("127.0.0.1"), b: short},
		{name: "to 127.1.2.3, a wildcard service", s: w4, src: c4, dst: netip.MustParseAddr("127.1.2.3"), b: short},
		{name: "to 0.0.0.0, a wildcard service", s: w4, src: c4, dst: netip.IPv4Unspecified(), b: short},
		{name: "to ::, a wildcard service", s: w6, src: c6, dst: netip.IPv6Unspecified(), b: cid4},
		{name: "to ::1, a loopback service", s: lo6, src: c6, dst: netip.IPv6Loopback(), b: cid4},
		{name: "to ::1, a wildcard service", s: w6, src: c6, dst: netip.IPv6Loopback(), b: cid4},
		{name: "from the host's address", s: d4, src: ap("192.0.2.1:40000"), dst: proxy4, b: cid4},
		{name: "from the host's address to a wildcard service", s: w4, src: ap("192.0.2.1:40000"), dst: proxy4, b: short},
		{name: "from a local route", s: d4, src: ap("10.77.0.5:40000"), dst: proxy4, b: cid4},
		{name: "from loopback", s: d4, src: ap("127.0.0.1:40000"), dst: proxy4, b: cid4},
		{name: "from 0.0.0.0", s: d4, src: ap("0.0.0.0:40000"), dst: proxy4, b: cid4},
		{name: "from 0/8", s: d4, src: ap("0.1.2.3:40000"), dst: proxy4, b: cid4, delivered: true},
		{name: "from multicast", s: d4, src: ap("224.0.0.9:40000"), dst: proxy4, b: cid4},
		{name: "from broadcast", s: d4, src: ap("255.255.255.255:40000"), dst: proxy4, b: cid4},
		{name: "from ::1", s: d6, src: ap("[::1]:40000"), dst: proxy6, b: cid5},
		{name: "from v6 multicast", s: d6, src: ap("[ff02::1]:40000"), dst: proxy6, b: cid5},
		{name: "v6 from the host's address", s: d6, src: ap("[2001:db8::1]:40000"), dst: proxy6, b: cid5, delivered: true},

		{name: "reply from the host's address", s: own, reverse: true, src: ap("192.0.2.1:5684"), dst: proxy4, b: reply(own, c4)},
		{name: "reply from a local route", s: own, reverse: true, src: ap("10.77.0.9:4000"), dst: proxy4, b: reply(own, c4)},
		{name: "reply from loopback", s: own, reverse: true, src: ap("127.0.0.1:4000"), dst: proxy4, b: reply(own, c4)},
		{name: "reply to 127.0.0.1", s: d4, reverse: true, src: ap("192.0.2.10:4000"), dst: netip.MustParseAddr("127.0.0.1"), b: reply(d4, c4)},
		{name: "reply to ::1", s: svc["quic6"], reverse: true, src: ap("[2001:db8::10]:5000"), dst: netip.IPv6Loopback(), b: reply(svc["quic6"], c6)},
	}
	var xd1 int
	e.ns.do(t, func() {
		i, err := net.InterfaceByName("xd1")
		if err != nil {
			t.Fatal(err)
		}
		xd1 = i.Index
	})
	for _, rp := range []int{0, 1} {
		e.setRPFilter(t, rp)
		for _, c := range cases {
			t.Run(fmt.Sprintf("rp_filter %d/%s", rp, c.name), func(t *testing.T) {
				port := c.s.Listen.Port()
				if c.reverse {
					port = c.s.Upstreams[1].Port()
				}
				opts := frameOpts{ttl: 57, id: 0x1234}
				if c.reverse {
					opts = frameOpts{ttl: 64, id: 7, df: true}
				}
				frame := udpFrame(peerMAC, proxyMAC, c.src, netip.AddrPortFrom(c.dst, port), c.b, opts)
				got := e.kernelDelivers(t, xd1, frame, c.b, c.src.Addr().Is4(), port)
				if got != c.delivered {
					t.Fatalf("the kernel delivered it: %v, the case says %v: fix the case", got, c.delivered)
				}
				why := e.kernelRefuses(c.src.Addr(), c.dst)
				if (why == "") != c.delivered {
					t.Fatalf("kernelRefuses says %q; the kernel delivered it: %v", why, got)
				}
				var v uint32
				if c.reverse {
					v = e.reverse(t, c.s, c.src, c.dst, c.b)
				} else {
					v = e.forward(t, c.s, c.src, c.dst, c.b)
				}
				if !c.delivered && v != xdpPass {
					t.Fatalf("verdict %d, want XDP_PASS", v)
				}
			})
		}
	}
}

// setRPFilter sets the namespace's IPv4 reverse path filter on xd0 and the
// program's copy of it.
func (e *diffEnv) setRPFilter(t testing.TB, v int) {
	t.Helper()
	e.ns.do(t, func() {
		for _, f := range []string{"all", "xd0"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+f+"/rp_filter", []byte(fmt.Sprint(v)), 0); err != nil {
				t.Fatal(err)
			}
		}
		var cfg cidrouteConfig
		if err := e.prog.objs.Settings.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.RpFilter = uint32(v)
		if err := e.prog.objs.Settings.Put(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
	})
}

// kernelDelivers writes frame onto the wire at xd1, so that it arrives on
// xd0 without the program, and then a control datagram from a plain
// client to the same port; it reports whether a socket bound to the port
// (any address) received payload before the control and a moment after.
func (e *diffEnv) kernelDelivers(t testing.TB, xd1 int, frame, payload []byte, v4 bool, port uint16) bool {
	t.Helper()
	var (
		conn *net.UDPConn
		fd   int
	)
	network, wild, client, proxy := "udp4", netip.IPv4Unspecified(), ap("203.0.113.5:40000"), proxy4
	if !v4 {
		network, wild, client, proxy = "udp6", netip.IPv6Unspecified(), ap("[2001:db8:ffff::5]:50000"), proxy6
	}
	e.ns.do(t, func() {
		var err error
		if conn, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(wild, port))); err != nil {
			t.Fatal(err)
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
	})
	defer conn.Close()
	defer unix.Close(fd)
	control := []byte("control datagram")
	to := &unix.SockaddrLinklayer{Ifindex: xd1, Halen: 6}
	copy(to.Addr[:], proxyMAC)
	for _, f := range [][]byte{frame, udpFrame(peerMAC, proxyMAC, client, netip.AddrPortFrom(proxy, port), control, frameOpts{ttl: 57})} {
		if err := unix.Sendto(fd, f, 0, to); err != nil {
			t.Fatal(err)
		}
	}
	delivered, seen := false, false
	buf := make([]byte, 2048)
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		n, err := conn.Read(buf)
		if err != nil {
			if !seen {
				t.Fatalf("the control datagram did not arrive: %v", err)
			}
			return delivered
		}
		switch {
		case bytes.Equal(buf[:n], control):
			seen = true
			// The frame may still be in another CPU's backlog.
			conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		case bytes.Equal(buf[:n], payload):
			delivered = true
		}
	}
}
