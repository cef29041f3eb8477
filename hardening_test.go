package cidroute

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// Tests of issue 15's holes, each through a running Pipeline.

// runPipeline starts p and stops it when the test ends.
func runPipeline(t *testing.T, p *Pipeline) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
	})
}

// settle waits until p's counters stop moving and balance, and returns
// them by service name.
func settle(t *testing.T, p *Pipeline) map[string]ServiceStats {
	t.Helper()
	var prev []ServiceStats
	for range 150 {
		time.Sleep(20 * time.Millisecond)
		cur := p.Stats()
		same := prev != nil
		for i := range cur {
			same = same && cur[i] == prev[i] && cur[i].Forward.Balanced() && cur[i].Reverse.Balanced()
		}
		if same {
			out := map[string]ServiceStats{}
			for _, s := range cur {
				out[s.Name] = s
			}
			return out
		}
		prev = cur
	}
	t.Fatalf("counters never settled: %+v", prev)
	return nil
}

// TestPipelineSiblingReflection (issue 15 #1): a registered but hostile
// backend of service a aims replies at the sockets of the same process:
// the sibling service b's listen address and upstream socket, a's own,
// and, b listening on the wildcard address, b's port on a host address.
// Each would be relayed to the proxy itself, and a's and b's forwarding
// would pass it back and forth for ever. None reaches any service.
func TestPipelineSiblingReflection(t *testing.T) {
	ea, eb := startEcho(t, 0), startEcho(t, 1)
	rogue := newClient(t)
	regA := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: ea.Addr(), State: registry.Ready},
		registry.Backend{Ordinal: 1, Addr: rogue.addr(), State: registry.Ready})
	regB := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: eb.Addr(), State: registry.Ready})
	p, err := New(Config{Logger: quietLog, Wait: testWait, Services: []Service{
		{Name: "a", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1, RouterConfig: RouterConfig{Protocol: DTLS, Backends: regA}},
		{Name: "b", Listen: netip.MustParseAddrPort("0.0.0.0:0"), Workers: 1,
			RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: netip.MustParseAddrPort("127.0.0.1:0"), Backends: regB}},
	}})
	require.NoError(t, err)
	runPipeline(t, p)
	a, _ := p.Addr("a")
	b, _ := p.Addr("b")
	upA, _ := p.UpstreamAddrs("a")
	upB, _ := p.UpstreamAddrs("b")
	lo := a.Addr()
	targets := []netip.AddrPort{
		netip.AddrPortFrom(lo, b.Port()),        // the sibling's listen address
		netip.AddrPortFrom(lo, upB[0].Port()),   // the sibling's upstream socket
		netip.AddrPortFrom(lo, upA[0].Port()),   // the replying service's own upstream socket
		netip.AddrPortFrom(lo.Next(), b.Port()), // the sibling's wildcard port on another loopback address
	}
	if host := hostAddr(t); host.IsValid() {
		// b's wildcard port on a non-loopback host address: a's public
		// address is loopback, so only the own-address set refuses it.
		targets = append(targets, netip.AddrPortFrom(host, b.Port()))
	}
	sendTo := netip.AddrPortFrom(lo, upA[0].Port())
	for _, dst := range targets {
		h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: a, Dst: dst})
		require.NoError(t, err)
		_, err = rogue.conn.WriteToUDPAddrPort(append(h, dtlsClientHello(1)...), sendTo)
		require.NoError(t, err)
	}
	st := settle(t, p)
	t.Logf("a: forward %+v reverse %+v", st["a"].Forward, st["a"].Reverse)
	t.Logf("b: forward %+v reverse %+v", st["b"].Forward, st["b"].Reverse)
	assert.Equal(t, uint64(len(targets)), st["a"].Reverse.Received)
	assert.Equal(t, uint64(len(targets)), st["a"].Reverse.Dropped[BadDestination])
	assert.Zero(t, st["a"].Reverse.Forwarded)
	assert.Zero(t, st["a"].Forward.Received, "nothing came back to a")
	assert.Zero(t, st["b"].Forward.Received, "nothing reached the sibling")
	assert.Zero(t, st["b"].Reverse.Received)
}

// hostAddr returns a non-loopback IPv4 address of the host, or the zero
// Addr.
func hostAddr(t *testing.T) netip.Addr {
	addrs, err := LocalAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			return a
		}
	}
	return netip.Addr{}
}

// TestPipelineBackendIsOwnAddress (issue 15 #1, forward): a backend at one
// of the proxy's own addresses is refused when New can see it, and dropped
// as own_address when a registry update brings it later: in both modes,
// one datagram must not turn into a storm of datagrams (or, in transparent
// mode, of sessions and descriptors).
func TestPipelineBackendIsOwnAddress(t *testing.T) {
	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freeUDPPort(t))
	reg := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: listen, State: registry.Ready})
	_, err := New(Config{Logger: quietLog, Services: []Service{{Name: "s", Listen: listen, Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
	require.ErrorIs(t, err, ErrConfig, "a backend at the service's own listen address")

	for _, transparent := range []bool{false, true} {
		e := startEcho(t, 0)
		reg := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: e.Addr(), State: registry.Ready})
		p, err := New(Config{Logger: quietLog, Services: []Service{
			{Name: "s", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
				RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg, Transparent: transparent}},
			{Name: "t", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
				RouterConfig: RouterConfig{Protocol: DTLS, Backends: newRegistry(t, 1)}}}})
		require.NoError(t, err)
		runPipeline(t, p)
		s, _ := p.Addr("s")
		sib, _ := p.Addr("t")
		c := newClient(t)
		for i, own := range []netip.AddrPort{s, sib} {
			require.NoError(t, reg.Update([]registry.Backend{{Ordinal: 0, Addr: own, State: registry.Ready}}))
			_, err := c.conn.WriteToUDPAddrPort(dtlsClientHello(byte(i)), s)
			require.NoError(t, err)
		}
		st := settle(t, p)
		assert.Equal(t, uint64(2), st["s"].Forward.Dropped[OwnAddress], "transparent %v: %+v", transparent, st["s"].Forward)
		assert.Equal(t, uint64(2), st["s"].Forward.Received)
		assert.Zero(t, st["s"].Sessions)
		assert.Zero(t, st["t"].Forward.Received)
	}
}

func freeUDPPort(t *testing.T) uint16 {
	c := newClient(t)
	port := c.addr().Port()
	c.conn.Close()
	return port
}

// TestPipelineMixedDatagramsLimited (issue 15 #2): a ClientHello behind a
// live CID record, an Initial or 0-RTT packet behind a Handshake packet:
// each starts a session at the backend, so each counts against the
// handshake or 0-RTT limit like a plain one, although it is routed by its
// CID.
func TestPipelineMixedDatagramsLimited(t *testing.T) {
	e := startEcho(t, 0)
	bs := []registry.Backend{{Ordinal: 0, Addr: e.Addr(), State: registry.Ready}}
	limits := Limits{HandshakePPS: 1, ZeroRTTPPS: 1}
	dp := startProxy(t, DTLS, bs, func(s *Service) { s.Workers, s.Limits = 1, limits })
	qp := startProxy(t, QUIC, bs, func(s *Service) { s.Workers, s.Limits = 1, limits })
	cid := ordinalCID(t, dp.router().Codec(), 0)
	scid := ordinalCID(t, qp.router().Codec(), 0)
	hs := quicLong(2, scid, []byte{1}, 0)
	c := newClient(t)
	const n = 5
	for i := range n {
		mixed := append(dtlsCIDRecord(cid, uint64(i), []byte("x")), dtlsClientHello(byte(i))...)
		_, err := c.conn.WriteToUDPAddrPort(mixed, dp.addr())
		require.NoError(t, err)
		for _, late := range [][]byte{quicLong(0, scid, []byte{1}, 1200), quicLong(1, scid, []byte{1}, 0)} {
			_, err := c.conn.WriteToUDPAddrPort(append(append([]byte(nil), hs...), late...), qp.addr())
			require.NoError(t, err)
		}
	}
	ds := dp.settled(t, func(s ServiceStats) bool { return s.Forward.Received >= n })
	qs := qp.settled(t, func(s ServiceStats) bool { return s.Forward.Received >= 2*n })
	t.Logf("dtls %+v\nquic %+v", ds.Forward, qs.Forward)
	// One token per limit (burst of a 1 pps bucket); the rest is refused.
	assert.Equal(t, uint64(n), ds.Forward.Received)
	assert.LessOrEqual(t, ds.Forward.Forwarded, uint64(2))
	assert.GreaterOrEqual(t, ds.Forward.Dropped[RateLimited], uint64(n-2))
	assert.Equal(t, uint64(2*n), qs.Forward.Received)
	assert.LessOrEqual(t, qs.Forward.Forwarded, uint64(4), "one Initial and one 0-RTT a second, or two if the clock ticked")
	assert.GreaterOrEqual(t, qs.Forward.Dropped[RateLimited], uint64(2*n-4))
}

// TestTransparentTwoBackendsOneClient (issue 15 #8): one client socket
// holds sessions with two backends at once, as a quic-go Transport does.
// Each flow keeps its own upstream socket, so no reply is lost.
func TestTransparentTwoBackendsOneClient(t *testing.T) {
	tp, _ := startTransparent(t, 2, func(s *Service) { s.Workers = 1 })
	codec := tp.router().Codec()
	c := newClient(t)
	const rounds = 20
	for i := range rounds {
		for ord := range 2 {
			_, err := c.conn.WriteToUDPAddrPort(dtlsCIDRecord(ordinalCID(t, codec, uint8(ord)), uint64(i), []byte("x")), tp.addr())
			require.NoError(t, err)
		}
	}
	got := map[byte]int{}
	c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 256)
	for got[0]+got[1] < 2*rounds {
		n, _, err := c.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		got[buf[0]-'0'] += min(n, 1)
	}
	s := tp.quiet(t)
	t.Logf("replies by backend %v, %+v", got, s)
	assert.Equal(t, map[byte]int{0: rounds, 1: rounds}, got)
	assert.Equal(t, 2, s.Sessions, "one session per flow")
	assert.Equal(t, uint64(2*rounds), s.Reverse.Forwarded)
}

// TestTransparentFlowLimit: the bound counts flows, and a flow over it is
// dropped and counted (session_limit), never evicting a live one.
func TestTransparentFlowLimit(t *testing.T) {
	tp, _ := startTransparent(t, 3, func(s *Service) { s.Workers, s.MaxSessions = 1, 2 })
	codec := tp.router().Codec()
	c := newClient(t)
	for ord := range 3 {
		want := ord
		if ord == 2 {
			want = -1
		}
		require.Equal(t, want, c.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, uint8(ord)), 1, []byte("x"))))
	}
	require.Equal(t, 0, c.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 0), 2, []byte("y"))), "the first flow lives on")
	s := tp.quiet(t)
	assert.Equal(t, 2, s.Sessions)
	assert.Equal(t, uint64(1), s.Forward.Dropped[SessionLimit])
}

// TestTransparentEvictsQuietest (issue 35): a full table makes room for a
// new flow by expiring the session quiet the longest, once it has been
// silent for a quarter of SessionIdle, not a whole one; a flow that keeps
// talking keeps its session; the eviction is counted.
func TestTransparentEvictsQuietest(t *testing.T) {
	tp, _ := startTransparent(t, 3, func(s *Service) { s.Workers, s.MaxSessions, s.SessionIdle = 1, 2, 4*time.Second })
	codec := tp.router().Codec()
	talker, quiet, late := newClient(t), newClient(t), newClient(t)
	require.Equal(t, 0, talker.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 0), 1, []byte("x"))))
	require.Equal(t, 1, quiet.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 1), 1, []byte("x"))))
	require.Equal(t, -1, late.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 2), 1, []byte("x"))), "full, and nobody quiet for long")
	for i := range 12 { // 2.4 s: the quiet session's silence passes a quarter of SessionIdle
		time.Sleep(200 * time.Millisecond)
		require.Equal(t, 0, talker.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 0), uint64(i+2), []byte("x"))))
	}
	require.Equal(t, 2, late.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 2), 2, []byte("y"))), "the quietest session made room")
	require.Equal(t, 0, talker.ask(tp.addr(), dtlsCIDRecord(ordinalCID(t, codec, 0), 20, []byte("z"))), "the talking flow kept its session")
	s := tp.quiet(t)
	assert.Equal(t, 2, s.Sessions)
	assert.Equal(t, uint64(1), s.SessionsEvicted)
	assert.Equal(t, uint64(1), s.Forward.Dropped[SessionLimit])
}

// TestSizeSessions (issue 15 #3, issue 35): transparent tables are sized
// from RLIMIT_NOFILE and the session memory, and a MaxSessions that fits
// either not is refused.
func TestSizeSessions(t *testing.T) {
	const roomy = 1 << 40 // a session memory that bounds nothing
	svc := func(workers, max int) Service {
		return Service{Name: "t", Workers: workers, MaxSessions: max, SessionMemory: roomy, RouterConfig: RouterConfig{Transparent: true}}
	}
	size := func(svcs []Service, limit uint64, ok bool) error { return sizeSessionsFor(svcs, limit, ok, 9216) }
	// 256 descriptors: 64 reserved, 2 service sockets, 1 watcher: 189
	// sessions for two workers.
	svcs := []Service{svc(2, 0)}
	require.NoError(t, size(svcs, 256, true))
	assert.Equal(t, 94, svcs[0].MaxSessions)
	// Beside a PPv2 service of 2 workers (4 sockets).
	svcs = []Service{svc(2, 0), {Name: "p", Workers: 2}}
	require.NoError(t, size(svcs, 256, true))
	assert.Equal(t, 92, svcs[0].MaxSessions)
	// A large limit: an eighth is reserved, and the cap applies.
	svcs = []Service{svc(1, 0)}
	require.NoError(t, size(svcs, 1<<20, true))
	assert.Equal(t, DefaultMaxSessions, svcs[0].MaxSessions)
	svcs = []Service{svc(4, 0)}
	require.NoError(t, size(svcs, 4096, true))
	assert.Equal(t, (4096-512-5)/4, svcs[0].MaxSessions)
	// Configured tables must fit.
	require.NoError(t, size([]Service{svc(2, 94)}, 256, true))
	require.ErrorIs(t, size([]Service{svc(2, 95)}, 256, true), ErrConfig)
	require.ErrorIs(t, size([]Service{svc(1, 65536)}, 1024, true), ErrConfig)
	require.ErrorIs(t, size([]Service{svc(1, 0)}, 64, true), ErrConfig, "no room at all")
	// No limit known: the old default.
	svcs = []Service{svc(1, 0)}
	require.NoError(t, size(svcs, 0, false))
	assert.Equal(t, DefaultMaxSessions, svcs[0].MaxSessions)

	// The memory: by default DefaultSessionMemory, shared by the workers,
	// however many descriptors the limit allows (100k spoofed sources
	// once took 17,496 sessions and 190 MB with a limit of 1,048,576).
	per := SessionBytes(9216)
	svcs = []Service{{Name: "t", Workers: 2, RouterConfig: RouterConfig{Transparent: true}}}
	require.NoError(t, size(svcs, 1<<20, true))
	assert.Equal(t, DefaultSessionMemory/per/2, svcs[0].MaxSessions)
	svcs = []Service{{Name: "t", Workers: 1, SessionMemory: 10 << 20, RouterConfig: RouterConfig{Transparent: true}}}
	require.NoError(t, size(svcs, 0, false))
	assert.Equal(t, 10<<20/per, svcs[0].MaxSessions)
	err := size([]Service{{Name: "t", Workers: 2, MaxSessions: 400, SessionMemory: 10 << 20, RouterConfig: RouterConfig{Transparent: true}}}, 1<<20, true)
	require.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, "more than the session memory of 10 MiB")
	require.ErrorIs(t, size([]Service{{Name: "t", Workers: 1, SessionMemory: 1000, RouterConfig: RouterConfig{Transparent: true}}}, 0, false), ErrConfig)
	// A smaller MaxDatagram makes sessions cheaper.
	svcs = []Service{{Name: "t", Workers: 1, SessionMemory: 10 << 20, RouterConfig: RouterConfig{Transparent: true}}}
	require.NoError(t, sizeSessionsFor(svcs, 0, false, 1500))
	assert.Equal(t, 10<<20/SessionBytes(1500), svcs[0].MaxSessions)
}

// TestConfigErrorsWrapErrConfig: every configuration error wraps ErrConfig,
// also those a lower layer finds (a negative buffer size).
func TestConfigErrorsWrapErrConfig(t *testing.T) {
	reg := newRegistry(t, 1)
	for name, mod := range map[string]func(*Service){
		"recv buffer":           func(s *Service) { s.RecvBuffer = -1 },
		"send buffer":           func(s *Service) { s.SendBuffer = -1 },
		"workers":               func(s *Service) { s.Workers = 1000 },
		"no listen":             func(s *Service) { s.Listen = netip.AddrPort{} },
		"unroutable":            func(s *Service) { s.Unroutable = 9 },
		"cid length":            func(s *Service) { s.CIDLen = 300 },
		"idle, not transparent": func(s *Service) { s.SessionIdle = time.Second },
		"session idle 3ns":      func(s *Service) { s.Transparent, s.SessionIdle = true, 3 },
		"session idle 999ms":    func(s *Service) { s.Transparent, s.SessionIdle = true, time.Second-time.Millisecond },
		"multicast listen":      func(s *Service) { s.Listen = netip.MustParseAddrPort("224.0.0.1:5684") },
		"broadcast listen":      func(s *Service) { s.Listen = netip.MustParseAddrPort("255.255.255.255:5684") },
		"mapped broadcast":      func(s *Service) { s.Listen = netip.MustParseAddrPort("[::ffff:255.255.255.255]:5684") },
	} {
		s := Service{Name: "s", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
			RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}
		mod(&s)
		_, err := New(Config{Logger: quietLog, Services: []Service{s}})
		assert.ErrorIs(t, err, ErrConfig, name)
	}
	_, err := New(Config{Logger: quietLog, BatchSize: 5000, Services: []Service{{Name: "s"}}})
	assert.ErrorIs(t, err, ErrConfig)
	// An IPv4-mapped listen address is its IPv4 form, as everywhere else.
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "s", Listen: netip.MustParseAddrPort("[::ffff:127.0.0.1]:0"), Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
	require.NoError(t, err)
	l, _ := p.Addr("s")
	assert.Equal(t, netip.MustParseAddr("127.0.0.1"), l.Addr())
	require.NoError(t, p.Close())
	assert.True(t, errors.Is(configErr(udpio.ErrConfig), ErrConfig))
}

func TestParseProtocol(t *testing.T) {
	for s, want := range map[string]Protocol{"dtls": DTLS, "quic": QUIC} {
		p, err := ParseProtocol(s)
		require.NoError(t, err)
		assert.Equal(t, want, p)
		assert.Equal(t, s, p.String())
	}
	for _, s := range []string{"", "DTLS", "tls", "quic "} {
		_, err := ParseProtocol(s)
		assert.ErrorIs(t, err, ErrConfig, "%q", s)
	}
}
