package cidroute

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// startEcho starts the PPv2 echo backend of ordinal ord: it answers each
// datagram with "<ord>|payload" behind the reverse header, through the
// proxy that sent it.
func startEcho(t testing.TB, ord uint8) *testecho.Echo {
	return testecho.Start(t, testecho.Config{PPv2: true, Prefix: fmt.Sprintf("%d|", ord)})
}

// testProxy is one replica: its registry and running pipeline.
type testProxy struct {
	reg *registry.Registry
	p   *Pipeline
}

var quietLog = slog.New(slog.DiscardHandler)

// testWait is the WaitMode of the pipelines the tests start;
// TestPipelineBlocking runs them again with WaitBlocking.
var testWait = WaitNetpoller

var publicAddr = netip.MustParseAddrPort("127.0.0.1:5684")

func startProxy(t testing.TB, proto Protocol, bs []registry.Backend, mod func(*Service)) *testProxy {
	t.Helper()
	reg := newRegistry(t, 42, bs...)
	s := Service{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 2,
		RouterConfig: RouterConfig{Protocol: proto, PublicAddr: publicAddr, Backends: reg}}
	if mod != nil {
		mod(&s)
	}
	p, err := New(Config{Services: []Service{s}, Logger: quietLog, Wait: testWait})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
	})
	return &testProxy{reg: reg, p: p}
}

func (tp *testProxy) addr() netip.AddrPort { a, _ := tp.p.Addr("svc"); return a }

func (tp *testProxy) router() *Router { r, _ := tp.p.Router("svc"); return r }

func (tp *testProxy) stats() ServiceStats { return tp.p.Stats()[0] }

// settled waits until done holds for the proxy's counters, then until
// they stop moving, and returns them. Datagrams sent with no reply to wait
// for need it: on a busy machine quiet alone can see the counters still
// for 20 ms before the pipeline has read the first of them.
func (tp *testProxy) settled(t testing.TB, done func(ServiceStats) bool) ServiceStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s := tp.stats(); !done(s); s = tp.stats() {
		if time.Now().After(deadline) {
			t.Fatalf("counters never got there: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return tp.quiet(t)
}

// quiet waits until the proxy's counters stop moving and returns them.
func (tp *testProxy) quiet(t testing.TB) ServiceStats {
	t.Helper()
	prev := tp.stats()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		cur := tp.stats()
		if cur == prev && cur.Forward.Balanced() && cur.Reverse.Balanced() {
			return cur
		}
		prev = cur
	}
	t.Fatalf("counters never settled: %+v", prev)
	return prev
}

type testClient struct {
	t    testing.TB
	conn *net.UDPConn
}

func newClient(t testing.TB) *testClient {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &testClient{t: t, conn: c}
}

func (c *testClient) addr() netip.AddrPort { return c.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// ask sends b to the proxy and returns the ordinal of the backend that
// echoed it, or -1 if nothing came back.
func (c *testClient) ask(to netip.AddrPort, b []byte) int {
	c.t.Helper()
	_, err := c.conn.WriteToUDPAddrPort(b, to)
	require.NoError(c.t, err)
	c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 65536)
	for {
		n, from, err := c.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return -1
		}
		require.Equal(c.t, to, from, "replies come from the address the client sent to")
		var ord int
		var rest string
		if _, err := fmt.Sscanf(string(buf[:n]), "%d|%s", &ord, &rest); err == nil && len(buf[:n]) == len(fmt.Sprint(ord))+1+len(b) {
			require.Equal(c.t, b, buf[len(fmt.Sprint(ord))+1:n], "echo is byte-exact")
			return ord
		}
	}
}

type cluster struct {
	backends []*testecho.Echo
	proxies  []*testProxy
}

func startCluster(t testing.TB, proto Protocol, states ...registry.State) *cluster {
	cl := &cluster{}
	var bs []registry.Backend
	for i, st := range states {
		e := startEcho(t, uint8(i))
		cl.backends = append(cl.backends, e)
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: e.Addr(), Weight: 1, State: st})
	}
	for range 2 {
		cl.proxies = append(cl.proxies, startProxy(t, proto, bs, nil))
	}
	return cl
}

// update publishes bs on every replica's registry, as a shared source would.
func (cl *cluster) update(t testing.TB, bs []registry.Backend) {
	for _, p := range cl.proxies {
		require.NoError(t, p.reg.Update(bs))
	}
}

func (cl *cluster) backendList(states ...registry.State) []registry.Backend {
	var bs []registry.Backend
	for i, st := range states {
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: cl.backends[i].Addr(), Weight: 1, State: st})
	}
	return bs
}

// balanced checks the counter identity on every replica once quiet.
func (cl *cluster) balanced(t testing.TB) []ServiceStats {
	var out []ServiceStats
	for _, p := range cl.proxies {
		s := p.quiet(t)
		require.True(t, s.Forward.Balanced(), "forward %+v", s.Forward)
		require.True(t, s.Reverse.Balanced(), "reverse %+v", s.Reverse)
		out = append(out, s)
	}
	return out
}

func TestPipelineReplicasAgree(t *testing.T) {
	cl := startCluster(t, DTLS, registry.Ready, registry.Ready, registry.Ready)
	used := map[int]bool{}
	for i := range 30 {
		c := newClient(t)
		hello := dtlsClientHello(byte(i))
		a := c.ask(cl.proxies[0].addr(), hello)
		b := c.ask(cl.proxies[1].addr(), hello)
		require.NotEqual(t, -1, a)
		require.Equal(t, a, b, "both replicas pick the same backend for a new session")
		used[a] = true
		// The backend saw the client as measured by the proxy.
		require.Equal(t, 2, cl.backends[a].Clients()[c.addr()])
	}
	assert.Len(t, used, 3, "30 clients spread over 3 backends")
	st := cl.balanced(t)
	assert.Equal(t, uint64(30), st[0].Forward.Forwarded)
	assert.Equal(t, uint64(30), st[1].Reverse.Forwarded)
}

func TestPipelineCIDSurvivesRebinding(t *testing.T) {
	cl := startCluster(t, DTLS, registry.Ready, registry.Ready, registry.Ready)
	codec := cl.proxies[0].router().Codec()
	for ord := range 3 {
		cid := ordinalCID(t, codec, uint8(ord))
		for i := range 6 { // a new client socket each time: NAT rebinding
			c := newClient(t)
			rec := dtlsCIDRecord(cid, uint64(i), []byte(fmt.Sprintf("msg-%d", i)))
			require.Equal(t, ord, c.ask(cl.proxies[i%2].addr(), rec))
		}
	}
	cl.balanced(t)
}

func TestPipelineDrainAndRemove(t *testing.T) {
	cl := startCluster(t, DTLS, registry.Ready, registry.Ready, registry.Ready)
	codec := cl.proxies[0].router().Codec()
	cid1 := ordinalCID(t, codec, 1)
	c := newClient(t)
	require.Equal(t, 1, c.ask(cl.proxies[0].addr(), dtlsCIDRecord(cid1, 1, []byte("a"))))

	cl.update(t, cl.backendList(registry.Ready, registry.Draining, registry.Ready))
	require.Equal(t, 1, c.ask(cl.proxies[1].addr(), dtlsCIDRecord(cid1, 2, []byte("b"))), "draining keeps its sessions")
	for i := range 40 {
		nc := newClient(t)
		got := nc.ask(cl.proxies[i%2].addr(), dtlsClientHello(byte(i)))
		require.NotEqual(t, -1, got)
		require.NotEqual(t, 1, got, "no new session on a draining backend")
	}

	cl.update(t, cl.backendList(registry.Ready, registry.Gone, registry.Ready))
	require.Equal(t, -1, c.ask(cl.proxies[0].addr(), dtlsCIDRecord(cid1, 3, []byte("c"))))
	cl.update(t, cl.backendList(registry.Ready)) // 1 and 2 removed
	require.Equal(t, -1, c.ask(cl.proxies[0].addr(), dtlsCIDRecord(cid1, 4, []byte("d"))))
	st := cl.balanced(t)
	assert.Equal(t, uint64(1), st[0].Forward.Dropped[NotServing])
	assert.Equal(t, uint64(1), st[0].Forward.Dropped[UnknownOrdinal])
	// A fresh handshake succeeds on the remaining backend.
	require.Equal(t, 0, c.ask(cl.proxies[0].addr(), dtlsClientHello(99)))
}

func TestPipelineStaleRegistry(t *testing.T) {
	e := startEcho(t, 0)
	stale := &toggleStale{}
	reg := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: e.Addr(), State: registry.Ready})
	stale.Registry = reg
	tp := startProxy(t, QUIC, nil, func(s *Service) { s.Backends = stale })
	codec := tp.router().Codec()
	c := newClient(t)
	initial := quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200)
	short := quicShort(ordinalCID(t, codec, 0))
	require.Equal(t, 0, c.ask(tp.addr(), initial))
	stale.on.Store(true)
	require.Equal(t, -1, c.ask(tp.addr(), initial), "stale: new handshakes refused")
	require.Equal(t, 0, c.ask(tp.addr(), short), "stale: established sessions flow")
	stale.on.Store(false)
	require.Equal(t, 0, c.ask(tp.addr(), initial), "recovered")
	s := tp.quiet(t)
	assert.Equal(t, uint64(1), s.Forward.Dropped[StaleRegistry])
	assert.Equal(t, uint64(3), s.Forward.Forwarded)
}

type toggleStale struct {
	*registry.Registry
	on atomic.Bool
}

func (s *toggleStale) Stale() bool { return s.on.Load() }

func TestPipelineReversePathChecks(t *testing.T) {
	cl := startCluster(t, DTLS, registry.Ready)
	tp := cl.proxies[0]
	up, _ := tp.p.UpstreamAddrs("svc")
	require.Len(t, up, 2)
	victim := newClient(t)
	rogue := newClient(t)
	be := cl.backends[0].Conn()

	reply := func(src, dst netip.AddrPort) []byte {
		b, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: src, Dst: dst})
		require.NoError(t, err)
		return append(b, "spoof"...)
	}
	for _, u := range up {
		u = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), u.Port()) // bound to the wildcard
		// Wrong physical sender, perfect header.
		rogue.conn.WriteToUDPAddrPort(reply(publicAddr, victim.addr()), u)
		// Right sender, but no header / wrong source / bad destinations.
		be.WriteToUDPAddrPort([]byte("no header at all"), u)
		be.WriteToUDPAddrPort(reply(netip.MustParseAddrPort("127.0.0.1:9"), victim.addr()), u)
		for _, dst := range []string{"224.0.0.1:5000", "255.255.255.255:5000", "0.0.0.0:5000", "127.0.0.1:0", publicAddr.String(), u.String()} {
			be.WriteToUDPAddrPort(reply(publicAddr, netip.MustParseAddrPort(dst)), u)
		}
		// And a good one.
		be.WriteToUDPAddrPort(reply(publicAddr, victim.addr()), u)
	}
	s := tp.settled(t, func(s ServiceStats) bool { return s.Reverse.Received >= 20 })
	assert.Equal(t, uint64(2), s.Reverse.Dropped[UntrustedSender])
	assert.Equal(t, uint64(4), s.Reverse.Dropped[BadProxyHeader])
	assert.Equal(t, uint64(12), s.Reverse.Dropped[BadDestination])
	assert.Equal(t, uint64(2), s.Reverse.Forwarded)
	victim.conn.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 100)
	for range 2 {
		n, from, err := victim.conn.ReadFromUDPAddrPort(buf)
		require.NoError(t, err)
		assert.Equal(t, "spoof", string(buf[:n]))
		assert.Equal(t, tp.addr(), from)
	}
	cl.balanced(t)
}

// TestPipelineCloseBeforeRun and a second Run both report ErrClosed.
func TestPipelineLifecycle(t *testing.T) {
	reg := newRegistry(t, 1)
	mk := func() *Pipeline {
		p, err := New(Config{Logger: quietLog, Wait: testWait, Services: []Service{{Name: "a", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
			RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
		require.NoError(t, err)
		return p
	}
	p := mk()
	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Run(context.Background()), ErrClosed)
	require.NoError(t, p.Close())

	p = mk()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(50 * time.Millisecond)
	require.ErrorIs(t, p.Run(ctx), ErrClosed)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	require.NoError(t, p.Close())

	_, err := New(Config{})
	require.ErrorIs(t, err, ErrConfig)
	_, err = New(Config{Services: []Service{{Name: "a", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}, Limits: Limits{GlobalPPS: -1}}}})
	require.ErrorIs(t, err, ErrConfig)
}

// BenchmarkPipelineEcho measures round trips through a running proxy
// (client → proxy → PPv2 echo backend → proxy → client), 32 datagrams in
// flight, and the proxy process's allocations per datagram over the run
// (the client and backend loops allocate nothing themselves).
func BenchmarkPipelineEcho(b *testing.B) {
	e := startEcho(b, 0)
	tp := startProxy(b, DTLS, []registry.Backend{{Ordinal: 0, Addr: e.Addr(), State: registry.Ready}},
		func(s *Service) { s.Workers = 1 })
	codec := tp.router().Codec()
	rec := dtlsCIDRecord(ordinalCID(b, codec, 0), 1, make([]byte, 100))
	c := newClient(b)
	to := tp.addr()
	buf := make([]byte, 2048)
	const window = 32
	var lost int
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ReportAllocs()
	b.SetBytes(int64(len(rec)))
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += window {
		for range window {
			c.conn.WriteToUDPAddrPort(rec, to)
		}
		c.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		for range window {
			if _, _, err := c.conn.ReadFromUDPAddrPort(buf); err != nil {
				lost++
			}
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	n := float64((b.N + window - 1) / window * window)
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "proc-allocs/datagram")
	b.ReportMetric(float64(lost)/n, "loss")
	b.ReportMetric(n/b.Elapsed().Seconds(), "roundtrips/s")
}

// TestPipelineCIDLengthLogged: datagrams whose CIDs have another length
// than the service's are counted as cid_length and logged, once per
// window, with both lengths.
func TestPipelineCIDLengthLogged(t *testing.T) {
	var logs syncBuffer
	e := startEcho(t, 0)
	reg := newRegistry(t, 42, registry.Backend{Ordinal: 0, Addr: e.Addr()})
	p, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Services: []Service{{
		Name: "coaps", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: publicAddr, Backends: reg}}}})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	defer func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
	}()
	to, _ := p.Addr("coaps")
	c := newClient(t)
	for range 3 {
		assert.Equal(t, -1, c.ask(to, dtlsCIDRecord([]byte{0, 1, 2, 3, 4, 5}, 1, []byte("from a backend that issues 6-byte CIDs"))))
	}
	require.Eventually(t, func() bool { return p.Stats()[0].Forward.Dropped[CIDLength] == 3 }, 5*time.Second, 10*time.Millisecond)
	out := logs.String()
	assert.Contains(t, out, "service=coaps")
	assert.Contains(t, out, "cid_len=8 seen_len=6")
	assert.Equal(t, 1, strings.Count(out, "seen_len="), "one line per window: %s", out)
}

// syncBuffer is a bytes.Buffer that a logger and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPipelineOwnSockets: a service served on sockets the caller opened
// (an SO_REUSEPORT group here) routes like one the Pipeline binds, takes
// its address and worker count from them, and closes them when it stops.
func TestPipelineOwnSockets(t *testing.T) {
	e := startEcho(t, 0)
	reg := newRegistry(t, 42, registry.Backend{Ordinal: 0, Addr: e.Addr()})
	group, err := udpio.ListenGroup("udp4", "127.0.0.1:0", 2, udpio.ListenConfig{})
	require.NoError(t, err)
	at := group[0].LocalAddr().(*net.UDPAddr).AddrPort()
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "svc", Conns: group,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	addr, _ := p.Addr("svc")
	assert.Equal(t, at, addr)
	r, _ := p.Router("svc")
	assert.Equal(t, at, r.PublicAddr(), "the public address defaults to the sockets' address")
	c := newClient(t)
	assert.Equal(t, 0, c.ask(addr, dtlsClientHello(7)))
	assert.Equal(t, 0, c.ask(addr, dtlsCIDRecord(ordinalCID(t, r.Codec(), 0), 1, []byte("hi"))))
	require.NoError(t, p.Close())
	require.NoError(t, <-errc)
	assert.Equal(t, uint64(2), p.Stats()[0].Forward.Forwarded)
	for _, g := range group {
		_, err := g.WriteToUDPAddrPort([]byte("x"), e.Addr())
		assert.ErrorIs(t, err, net.ErrClosed, "the pipeline closed the caller's socket")
	}
}

func TestPipelineOwnSocketsConfig(t *testing.T) {
	reg := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	listen := func(addr string) *net.UDPConn {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	for name, mod := range map[string]func(*Service){
		"two addresses": func(s *Service) { s.Conns = append(s.Conns, listen("127.0.0.1:0")) },
		"other listen":  func(s *Service) { s.Listen = netip.MustParseAddrPort("127.0.0.1:1") },
		"nil socket":    func(s *Service) { s.Conns = append(s.Conns, nil) },
		"upstreams":     func(s *Service) { s.UpstreamConns = []*net.UDPConn{listen("127.0.0.1:0"), listen("127.0.0.1:0")} },
	} {
		c := listen("127.0.0.1:0")
		s := Service{Name: "s", Conns: []*net.UDPConn{c}, RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}
		mod(&s)
		_, err := New(Config{Logger: quietLog, Services: []Service{s}})
		assert.ErrorIs(t, err, ErrConfig, name)
		for _, c := range s.Conns {
			if c != nil {
				_, err := c.WriteToUDPAddrPort([]byte("x"), netip.MustParseAddrPort("127.0.0.1:9"))
				assert.ErrorIs(t, err, net.ErrClosed, "%s: a failed New closes the sockets", name)
			}
		}
	}
	// A wildcard socket serves a wildcard public address: New turns packet
	// info on (a socket handed over from another process has it already).
	group, err := udpio.ListenGroup("udp4", "0.0.0.0:0", 1, udpio.ListenConfig{})
	require.NoError(t, err)
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "s", Conns: group,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg, PublicAddr: netip.MustParseAddrPort("0.0.0.0:5684")}}}})
	require.NoError(t, err)
	require.NoError(t, p.Close())
}
