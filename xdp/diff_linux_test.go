package xdp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
	"github.com/cilium/ebpf"
)

// XDP verdicts.
const (
	xdpAborted  = 0
	xdpDrop     = 1
	xdpPass     = 2
	xdpTX       = 3
	xdpRedirect = 4
)

var (
	proxyMAC = net.HardwareAddr{0x02, 0, 0, 0, 1, 1}
	gwMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xfe}
	peerMAC  = net.HardwareAddr{0x02, 0, 0, 0, 2, 2} // the sender of every frame

	proxy4 = netip.MustParseAddr("192.0.2.1")
	proxy6 = netip.MustParseAddr("2001:db8::1")
)

// backendMAC is the neighbour entry of the i-th backend address.
func backendMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 3, byte(i)} }

// staleBackends is a registry whose stale flag the test sets.
type staleBackends struct {
	*registry.Registry
	stale atomic.Bool
}

func (s *staleBackends) Stale() bool { return s.stale.Load() }

// diffService is one service of the differential environment with the Go
// Router that is the reference.
type diffService struct {
	Service
	id     uint32
	router *cidroute.Router
	snap   *registry.Snapshot
	// measured: the PPv2 destination is the datagram's own destination.
	measured bool
}

// diffEnv is a namespace with one interface, neighbours for every backend,
// routes for clients, and the program loaded with a set of services.
type diffEnv struct {
	ns       *netns
	prog     *Program
	ifindex  uint32
	services []*diffService
	nextHop  map[netip.Addr]net.HardwareAddr
	// own is the pipeline's own-address set in the namespace: every
	// service and upstream socket, the host's addresses for the wildcard
	// ones (cidroute.LocalAddrs) and local routes (cidroute.LocalNets),
	// as Pipeline.OwnAddrs keeps it.
	own *cidroute.OwnAddrs
	// ifaddrs are the interfaces' addresses and nets the local routes:
	// sources the kernel refuses from the wire (kernelRefuses).
	ifaddrs map[netip.Addr]bool
	nets    []netip.Prefix
}

func mustRegistry(t testing.TB, seed uint64, bs []registry.Backend) *registry.Registry {
	t.Helper()
	r, err := registry.New(registry.Config{Service: "t", Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Update(bs); err != nil {
		t.Fatal(err)
	}
	return r
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func newDiffEnv(t testing.TB) *diffEnv {
	needRoot(t)
	e := &diffEnv{ns: newNetns(t, "d"), nextHop: map[netip.Addr]net.HardwareAddr{}}
	ns := e.ns
	ns.ip(t, "link add xd0 type veth peer name xd1")
	ns.ip(t, "link set xd0 address "+proxyMAC.String()+" up")
	ns.ip(t, "link set xd1 address "+peerMAC.String()+" up")
	ns.ip(t, "addr add 192.0.2.1/24 dev xd0")
	ns.ip(t, "addr add 2001:db8::1/64 dev xd0 nodad")
	ns.ip(t, "neigh add 192.0.2.254 lladdr "+gwMAC.String()+" dev xd0 nud permanent")
	ns.ip(t, "neigh add 2001:db8::fe lladdr "+gwMAC.String()+" dev xd0 nud permanent")
	ns.ip(t, "route add default via 192.0.2.254")
	ns.ip(t, "-6 route add default via 2001:db8::fe")

	r1 := []registry.Backend{
		{Ordinal: 0, Addr: ap("192.0.2.10:4000"), Weight: 1},
		{Ordinal: 1, Addr: ap("192.0.2.11:4000"), Weight: 3},
		{Ordinal: 2, Addr: ap("192.0.2.12:4000"), State: registry.Draining},
		{Ordinal: 3, Addr: ap("192.0.2.13:4000"), State: registry.Gone},
		{Ordinal: 7, Addr: ap("[2001:db8::17]:4000"), Weight: 2},
		{Ordinal: 200, Addr: ap("192.0.2.20:4001"), Weight: 1},
	}
	r2 := []registry.Backend{
		{Ordinal: 0, Addr: ap("[2001:db8::10]:5000")},
		{Ordinal: 1, Addr: ap("192.0.2.30:5000"), Weight: 2},
		{Ordinal: 5, Addr: ap("[2001:db8::15]:5000"), State: registry.Draining},
		{Ordinal: 9, Addr: ap("192.0.2.31:5000"), State: registry.Gone},
	}
	r3 := []registry.Backend{
		{Ordinal: 1, Addr: ap("192.0.2.40:4000"), State: registry.Draining},
		{Ordinal: 2, Addr: ap("192.0.2.41:4000"), State: registry.Gone},
	}
	// Backends at the proxy's own addresses (a registry update the
	// pipeline cannot refuse): the forward rule drops their datagrams as
	// OwnAddress. Service "ownbe" has the public address 198.51.100.81:5684.
	r4 := []registry.Backend{
		{Ordinal: 0, Addr: ap("192.0.2.1:5684")},     // dtls4's listen address
		{Ordinal: 1, Addr: ap("198.51.100.81:5684")}, // its own public address
		{Ordinal: 2, Addr: ap("192.0.2.1:7000")},     // wild4's port on a host address
		{Ordinal: 3, Addr: ap("192.0.2.1:40001")},    // an upstream port (the pipeline's)
		{Ordinal: 4, Addr: ap("192.0.2.1:9999")},     // a host address, no socket
		{Ordinal: 5, Addr: ap("[2001:db8::1]:7001")}, // wild6's port
		{Ordinal: 6, Addr: ap("192.0.2.50:4000")},    // elsewhere
		{Ordinal: 8, Addr: ap("192.0.2.60:7000")},    // wild4's port, on an address the host gains later
		{Ordinal: 9, Addr: ap("127.0.0.1:4000")},     // loopback: its replies never come from the wire
		{Ordinal: 10, Addr: ap("10.77.0.9:4000")},    // in the local route TestMartiansAsTheKernel adds
	}
	i := 0
	for _, bs := range [][]registry.Backend{r1, r2, r3, r4} {
		for _, b := range bs {
			mac := backendMAC(i)
			i++
			if b.Addr.Addr() == proxy4 || b.Addr.Addr() == proxy6 || b.Addr.Addr().IsLoopback() {
				continue // local: no neighbour
			}
			if !onLink(b.Addr.Addr()) {
				e.nextHop[b.Addr.Addr()] = gwMAC
				continue
			}
			e.nextHop[b.Addr.Addr()] = mac
			ns.ip(t, "neigh add "+b.Addr.Addr().String()+" lladdr "+mac.String()+" dev xd0 nud permanent")
		}
	}
	reg1 := &staleBackends{Registry: mustRegistry(t, 0x1234, r1)}
	reg2 := &staleBackends{Registry: mustRegistry(t, 99, r2)}
	reg3 := &staleBackends{Registry: mustRegistry(t, 7, r3)}
	reg4 := &staleBackends{Registry: mustRegistry(t, 5, r4)}
	stale := &staleBackends{Registry: mustRegistry(t, 0x1234, r1)}
	stale.stale.Store(true)

	up := uint16(40000)
	svc := func(name string, proto cidroute.Protocol, codec cidroute.CIDCodec, listen, public string, b cidroute.Backends, unroutable ...cidroute.UnroutablePolicy) *diffService {
		up++
		var u cidroute.UnroutablePolicy
		if len(unroutable) > 0 {
			u = unroutable[0]
		}
		l := ap(listen)
		pub := l
		if public != "" {
			pub = ap(public)
		}
		r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: proto, PublicAddr: pub, Codec: codec, Backends: b, Unroutable: u})
		if err != nil {
			t.Fatal(err)
		}
		return &diffService{
			Service: Service{Name: name, Protocol: proto, Codec: codec, Public: pub, Listen: l, Unroutable: u,
				Upstreams: []netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), up), netip.AddrPortFrom(netip.IPv6Unspecified(), up+100)},
				Backends:  b},
			router:   r,
			measured: pub.Addr().IsUnspecified() && l.Addr().IsUnspecified(),
		}
	}
	e.services = []*diffService{
		svc("dtls4", cidroute.DTLS, dtls.OrdinalFirst{}, "192.0.2.1:5684", "", reg1),
		svc("quic4", cidroute.QUIC, quic.LB{}, "192.0.2.1:443", "", reg1),
		svc("quic6", cidroute.QUIC, quic.LB{Length: 9, ConfigID: 2, SelfEncodeLength: true}, "[2001:db8::1]:443", "", reg2),
		svc("dtls6", cidroute.DTLS, dtls.OrdinalFirst{Length: 5}, "[2001:db8::1]:5684", "", reg2),
		svc("stale", cidroute.DTLS, dtls.OrdinalFirst{}, "192.0.2.1:6000", "", stale),
		svc("noready", cidroute.QUIC, quic.LB{}, "192.0.2.1:6001", "", reg3),
		svc("hash4", cidroute.QUIC, quic.LB{}, "192.0.2.1:6002", "", reg1, cidroute.UnroutableHash),
		svc("hashnoready", cidroute.QUIC, quic.LB{}, "192.0.2.1:6003", "", reg3, cidroute.UnroutableHash),
		svc("wild4", cidroute.QUIC, quic.LB{}, "0.0.0.0:7000", "", reg1),
		svc("wild6", cidroute.DTLS, dtls.OrdinalFirst{}, "[::]:7001", "", reg2),
		svc("vip", cidroute.DTLS, dtls.OrdinalFirst{}, "192.0.2.1:7002", "198.51.100.80:5684", reg1),
		svc("ownbe", cidroute.DTLS, dtls.OrdinalFirst{}, "192.0.2.1:7003", "198.51.100.81:5684", reg4),
		// Services on loopback (last: the fuzz corpus picks services by
		// index modulo their number, and most seeds pick the first ones).
		svc("lo4", cidroute.DTLS, dtls.OrdinalFirst{}, "127.0.0.1:7100", "", reg1),
		svc("lo6", cidroute.DTLS, dtls.OrdinalFirst{}, "[::1]:7101", "", reg2),
	}
	ns.do(t, func() {
		p, err := Load(Options{})
		if err != nil {
			t.Fatal(err)
		}
		// In the namespace: Close restores its loopback forwarding.
		t.Cleanup(func() { ns.do(t, func() { p.Close() }) })
		e.prog = p
		for i, s := range e.services {
			if err := p.AddService(s.Service); err != nil {
				t.Fatal(err)
			}
			s.id = uint32(i)
			s.snap = s.Backends.Snapshot()
		}
		xd0, err := net.InterfaceByName("xd0")
		if err != nil {
			t.Fatal(err)
		}
		e.ifindex = uint32(xd0.Index)
		if err := p.objs.Macs.Put(e.ifindex, &cidrouteMac{A: [6]byte(proxyMAC)}); err != nil {
			t.Fatal(err)
		}
	})
	e.refreshOwn(t)
	return e
}

// refreshOwn builds the pipeline's own-address set anew from the host's
// addresses and the services' sockets, and those of extra services.
func (e *diffEnv) refreshOwn(t testing.TB, extra ...Service) {
	e.ns.do(t, func() {
		host, err := cidroute.LocalAddrs()
		if err != nil {
			t.Fatal(err)
		}
		nets, err := cidroute.LocalNets()
		if err != nil {
			t.Fatal(err)
		}
		ifas, err := net.InterfaceAddrs()
		if err != nil {
			t.Fatal(err)
		}
		e.ifaddrs, e.nets = map[netip.Addr]bool{}, nets
		for _, a := range ifas {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				e.ifaddrs[p.Addr().Unmap()] = true
			}
		}
		var bound []netip.AddrPort
		for _, s := range e.services {
			bound = append(append(bound, s.Listen), s.Upstreams...)
		}
		for _, s := range extra {
			bound = append(append(bound, s.Listen), s.Upstreams...)
		}
		e.own = cidroute.NewOwnAddrs(bound, host, nets...)
	})
}

// xdpMD is struct xdp_md, the context of a test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run executes the program on frame as if it arrived on xd0 and returns
// the verdict and the frame as the program left it.
func (e *diffEnv) run(t testing.TB, frame []byte) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{
		Data: frame, DataOut: make([]byte, len(frame)+512),
		Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: e.ifindex},
	}
	var ret uint32
	e.ns.do(t, func() {
		var err error
		if ret, err = e.prog.objs.Cidroute.Run(opts); err != nil {
			t.Fatalf("test run: %v", err)
		}
	})
	return ret, opts.DataOut
}

// counter reads one per-CPU counter slot, summed.
func (e *diffEnv) counter(t testing.TB, id, dir, slot uint32) uint64 {
	t.Helper()
	var per []uint64
	if err := e.prog.objs.Counters.Lookup((id*2+dir)*numSlots+slot, &per); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

// outcome is what one side decided for a datagram.
type outcome struct {
	verdict uint32
	reason  cidroute.Reason
	frame   []byte         // the transmitted frame (forwarded only)
	backend netip.AddrPort // forward: the backend the Router chose, if any
	// mayPass names the row of the README's table under which the program
	// hands this datagram up; "" when it must decide it.
	mayPass string
	// mustPass says why the kernel would drop the frame (or refuse to
	// send what the rule forwards): the program must hand it up, where
	// the stack drops it as on the socket path.
	mustPass string
}

// forward runs client → service through the Go Router and the program,
// and fails the test when the program decided otherwise. It returns the
// program's verdict.
func (e *diffEnv) forward(t testing.TB, s *diffService, client netip.AddrPort, dst netip.Addr, payload []byte) uint32 {
	t.Helper()
	frame := udpFrame(peerMAC, proxyMAC, client, netip.AddrPortFrom(dst, s.Listen.Port()), payload, frameOpts{ttl: 57, id: 0x1234})
	want := e.goForward(s, client, dst, payload)
	want.mayPass = e.forwardMayPass(s, client, dst, payload, want)
	want.mustPass = e.kernelRefuses(client.Addr(), dst)
	return e.compare(t, s, 0, frame, want, fmt.Sprintf("forward %s %v→%v %x", s.Name, client, dst, payload))
}

// goForward is the pipeline's forward path (worker.forward) for one
// datagram: the Router's decision and header, and the datagram the
// upstream socket would send.
func (e *diffEnv) goForward(s *diffService, client netip.AddrPort, dst netip.Addr, payload []byte) outcome {
	var local netip.Addr
	if s.measured {
		local = dst
	}
	v := s.router.View(e.own)
	d, hdr := s.router.Forward(make([]byte, 0, 64), payload, client, local, &v)
	if d.Reason != cidroute.Forwarded {
		return outcome{verdict: xdpDrop, reason: d.Reason, backend: d.Backend}
	}
	src := proxy4
	if !d.Backend.Addr().Unmap().Is4() {
		src = proxy6
	}
	up := netip.AddrPortFrom(src, s.Upstreams[0].Port())
	return outcome{verdict: xdpTX, backend: d.Backend, frame: udpFrame(proxyMAC, e.nextHop[d.Backend.Addr()], up, d.Backend, append(hdr, payload...), sentOpts)}
}

// frameSrc is the IP source of a transmitted frame, or the zero Addr.
func (o outcome) frameSrc() netip.Addr {
	switch {
	case o.verdict != xdpTX || len(o.frame) < 14+20:
		return netip.Addr{}
	case o.frame[12] == 0x08:
		return netip.AddrFrom4([4]byte(o.frame[14+12 : 14+16]))
	case len(o.frame) < 14+40:
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(o.frame[14+8 : 14+24]))
}

// compare runs frame through the program and checks it against want.
func (e *diffEnv) compare(t testing.TB, s *diffService, dir uint32, frame []byte, want outcome, what string) uint32 {
	t.Helper()
	before := e.counter(t, s.id, dir, uint32(want.reason))
	got, out := e.run(t, frame)
	switch {
	case want.mustPass != "" && got != xdpPass:
		t.Fatalf("%s: verdict %d where the kernel refuses it (%s): the program must hand it up", what, got, want.mustPass)
	case got == xdpPass && want.mayPass == "" && want.mustPass == "":
		t.Fatalf("%s: handed up, where the README's table says the program decides (the Go rule: %v)", what, want.reason)
	case got == xdpPass:
		// Only a different path: the pipeline decides.
		return got
	case got != want.verdict:
		t.Fatalf("%s: verdict %d, the Go rule says %d (reason %v)", what, got, want.verdict, want.reason)
	case got == xdpTX:
		if !bytes.Equal(out, want.frame) {
			t.Fatalf("%s: transmitted\n%x\nwant\n%x", what, out, want.frame)
		}
	}
	if after := e.counter(t, s.id, dir, uint32(want.reason)); after <= before {
		t.Fatalf("%s: counter %v did not move (%d)", what, want.reason, after)
	}
	return got
}

// goReverse is the pipeline's reverse rule, Router.Reverse, for service
// s and a datagram b from the physical sender from, against the snapshot
// the program has and the pipeline's own addresses.
func (e *diffEnv) goReverse(s *diffService, from netip.AddrPort, b []byte) cidroute.Reply {
	v := s.router.View(e.own)
	v.Snapshot = s.snap
	return s.router.Reverse(b, from, cidroute.Session{}, &v)
}

// reverse runs a reply from backend addr from to the proxy's upstream port
// through the reference rule and the program.
func (e *diffEnv) reverse(t testing.TB, s *diffService, from netip.AddrPort, dst netip.Addr, b []byte) uint32 {
	t.Helper()
	frame := udpFrame(peerMAC, proxyMAC, from, netip.AddrPortFrom(dst, s.Upstreams[1].Port()), b, frameOpts{ttl: 64, id: 7, df: true})
	rep := e.goReverse(s, unmap(from), b)
	want := outcome{verdict: xdpDrop, reason: rep.Reason}
	if rep.Reason == cidroute.Forwarded {
		// The service socket sends: from the address the client used
		// (measured) or the socket's own address.
		src := unmap(s.Listen).Addr()
		if rep.Local.IsValid() {
			src = rep.Local
		}
		hop, ok := e.nextHop[rep.Client.Addr()]
		if !ok {
			hop = gwMAC
		}
		want = outcome{verdict: xdpTX, frame: udpFrame(proxyMAC, hop, netip.AddrPortFrom(src, s.Listen.Port()), rep.Client, rep.Payload, sentOpts)}
	}
	want.mustPass = e.kernelRefuses(from.Addr(), dst)
	if src := want.frameSrc(); src.IsLoopback() && !rep.Client.Addr().IsLoopback() {
		want.mustPass = "from loopback to a client elsewhere (the service socket's send fails)"
	}
	want.mayPass = e.addrRow(from.Addr(), dst)
	if want.mayPass == "" {
		want.mayPass = e.reverseMayPass(s, b, rep)
	}
	return e.compare(t, s, 1, frame, want, fmt.Sprintf("reverse %s %v→%v %x", s.Name, from, dst, b))
}

// ppHeader is a PPv2 reply header src → dst.
func ppHeader(t testing.TB, src, dst netip.AddrPort) []byte {
	h, err := ppv2.AppendProxy(nil, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// be16 appends v big-endian.
func be16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }
