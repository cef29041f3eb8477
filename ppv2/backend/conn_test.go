package backend

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
)

var (
	dtlsHello   = "../../dtls/testdata/pion_clienthello_1.hex"
	dtlsAppData = "../../dtls/testdata/pion_appdata.hex"
	quicInitial = "../../quic/testdata/quicgo_initial_1.hex"
	quicShort   = "../../quic/testdata/quicgo_short.hex"
)

func TestProxiedClaimedAndMeasured(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	px.proxied(c, client1, []byte("hello"))
	b, a := read(t, c)
	assert.Equal(t, "hello", string(b))
	assert.Equal(t, client1, a.Client, "claimed")
	assert.Equal(t, px.addr(), a.Proxy, "measured")
	assert.Equal(t, service, a.Service)
	assert.Equal(t, client1.String()+" via "+px.addr().String(), a.String(), "String names the path: client and proxy")
	assert.Equal(t, "udp", a.Network())
	assert.True(t, a.Proxied())

	n, err := c.WriteTo([]byte("world"), a)
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	h, p := reverse(t, px.recv())
	assert.Equal(t, ppv2.Header{Command: ppv2.Proxy, Src: service, Dst: client1}, h, "reverse header")
	assert.Equal(t, "world", string(p))

	r, ok := c.Route(client1)
	require.True(t, ok, "commit-on-write")
	assert.Equal(t, *a, r)
	_, err = c.WriteTo([]byte("later"), net.UDPAddrFromAddrPort(client1))
	require.NoError(t, err)
	_, p = reverse(t, px.recv())
	assert.Equal(t, "later", string(p))
	s := c.Stats()
	assert.Equal(t, uint64(1), s.AcceptedProxied)
	assert.Equal(t, uint64(2), s.WrittenProxied)
	assert.Equal(t, 1, s.Routes)
	balanced(t, s, 1)
}

// The reverse datagram is the header AppendHeader makes followed by the
// payload, byte for byte, for IPv4 and IPv6 claims.
func TestReverseDatagramByteExact(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	for _, cl := range []netip.AddrPort{client1, netip.MustParseAddrPort("[2001:db8::7]:40001")} {
		svc := service
		if cl.Addr().Is6() {
			svc = netip.MustParseAddrPort("[2001:db8::10]:5684")
		}
		h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: cl, Dst: svc})
		require.NoError(t, err)
		px.send(c, h, []byte("q"))
		_, a := read(t, c)
		require.Equal(t, cl, a.Client)
		payload := make([]byte, 1200)
		for i := range payload {
			payload[i] = byte(i)
		}
		_, err = c.WriteTo(payload, a)
		require.NoError(t, err)
		want, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: svc, Dst: cl})
		require.NoError(t, err)
		want = append(want, payload...)
		assert.Equal(t, want, px.recv())
	}
}

func TestUntrustedProxy(t *testing.T) {
	// Only 127.0.0.2 may send PPv2; the peer sends from 127.0.0.1.
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}})
	px := newPeer(t)
	px.proxied(c, client1, []byte("forged"))
	px.send(c, nil, []byte("direct"))
	b, a := read(t, c)
	assert.Equal(t, "direct", string(b), "the PPv2 datagram was dropped")
	assert.False(t, a.Proxied())
	assert.Equal(t, px.addr(), a.Client, "direct: the measured sender")
	s := c.Stats()
	assert.Equal(t, uint64(1), s.DroppedUntrusted)
	assert.Equal(t, uint64(1), s.AcceptedDirect)
	balanced(t, s, 2)

	// No trusted proxies at all: every header is untrusted.
	c2 := newConn(t, Config{})
	px.proxied(c2, client1, []byte("x"))
	px.send(c2, nil, []byte("y"))
	b, _ = read(t, c2)
	assert.Equal(t, "y", string(b))
	assert.Equal(t, uint64(1), c2.Stats().DroppedUntrusted)
}

// The first PPv2 datagram from an untrusted sender is logged with the
// sender and the trusted set, then at most one line per 10 s; every one is
// counted.
func TestUntrustedSenderLogged(t *testing.T) {
	for _, tc := range []struct {
		trusted []netip.Prefix
		want    string
	}{
		{nil, `trusted_proxies="none: Config.TrustedProxies is empty"`},
		{[]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, `trusted_proxies=[10.0.0.0/8]`},
	} {
		var logs testtool.SyncBuffer
		c := newConn(t, Config{TrustedProxies: tc.trusted, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		ck := withClock(c)
		px := newPeer(t)
		lines := func() int { return strings.Count(logs.String(), "\n") }
		px.proxied(c, client1, []byte("1"))
		px.proxied(c, client1, []byte("2"))
		px.send(c, nil, []byte("sync"))
		read(t, c)
		require.Equal(t, 1, lines(), logs.String())
		assert.Contains(t, logs.String(), "level=WARN")
		assert.Contains(t, logs.String(), "sender="+px.addr().String())
		assert.Contains(t, logs.String(), tc.want)
		assert.Contains(t, logs.String(), "dropped_untrusted=1")
		ck.advance(9 * time.Second)
		px.proxied(c, client1, []byte("3"))
		px.send(c, nil, []byte("sync"))
		read(t, c)
		assert.Equal(t, 1, lines(), "rate-limited")
		ck.advance(time.Second)
		px.proxied(c, client1, []byte("4"))
		px.send(c, nil, []byte("sync"))
		read(t, c)
		assert.Equal(t, 2, lines())
		assert.Contains(t, logs.String(), "dropped_untrusted=4")
		assert.Equal(t, uint64(4), c.Stats().DroppedUntrusted)
	}
}

func TestBadHeader(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client1, Dst: service})
	require.NoError(t, err)
	px.send(c, h[:20], nil) // truncated
	bad := append([]byte(nil), h...)
	bad[12] = 0x31 // version 3
	px.send(c, bad, []byte("v3"))
	zeroPort, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: netip.AddrPortFrom(client1.Addr(), 0), Dst: service})
	require.NoError(t, err)
	px.send(c, zeroPort, []byte("port 0"))
	px.proxied(c, client1, []byte("ok"))
	b, _ := read(t, c)
	assert.Equal(t, "ok", string(b))
	s := c.Stats()
	assert.Equal(t, uint64(3), s.DroppedBadHeader)
	balanced(t, s, 4)
}

func TestLocal(t *testing.T) {
	local, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Local})
	require.NoError(t, err)
	px := newPeer(t)

	// Default: delivered as direct from the proxy, even under DirectDrop,
	// and the answer goes straight back without a header.
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}, Direct: DirectDrop})
	px.send(c, local, []byte("health?"))
	b, a := read(t, c)
	assert.Equal(t, "health?", string(b))
	assert.Equal(t, Addr{Client: px.addr(), Local: true}, *a)
	assert.False(t, a.Proxied())
	assert.Equal(t, px.addr().String(), a.String(), "String is the sender's")
	_, err = c.WriteTo([]byte("ok"), a)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(px.recv()))
	assert.Equal(t, uint64(1), c.Stats().AcceptedLocal)
	assert.Equal(t, uint64(1), c.Stats().WrittenDirect)

	// DropLocal.
	c2 := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}, DropLocal: true})
	px.send(c2, local, []byte("health?"))
	px.proxied(c2, client1, []byte("after"))
	b, _ = read(t, c2)
	assert.Equal(t, "after", string(b))
	assert.Equal(t, uint64(1), c2.Stats().DroppedLocal)
}

func TestDirectPolicies(t *testing.T) {
	hello, app := testtool.ReadHex(t, dtlsHello), testtool.ReadHex(t, dtlsAppData)
	initial, short := testtool.ReadHex(t, quicInitial), testtool.ReadHex(t, quicShort)
	for _, tc := range []struct {
		name      string
		cfg       Config
		send      [][]byte
		delivered [][]byte
		dropped   func(Stats) uint64
	}{
		{"accept", Config{}, [][]byte{hello, initial}, [][]byte{hello, initial}, func(s Stats) uint64 { return 0 }},
		{"drop", Config{Direct: DirectDrop}, [][]byte{hello, app}, nil, func(s Stats) uint64 { return s.DroppedDirect }},
		{"dtls no handshake", Config{Direct: DirectNoHandshake, Protocol: DTLS},
			[][]byte{hello, app}, [][]byte{app}, func(s Stats) uint64 { return s.DroppedDirectHandshake }},
		{"quic no handshake", Config{Direct: DirectNoHandshake, Protocol: QUIC},
			[][]byte{initial, short}, [][]byte{short}, func(s Stats) uint64 { return s.DroppedDirectHandshake }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.TrustedProxies = []netip.Prefix{loop}
			c := newConn(t, tc.cfg)
			px := newPeer(t)
			for _, b := range tc.send {
				px.send(c, nil, b)
			}
			// A proxied handshake is always let through.
			px.proxied(c, client1, hello)
			for _, want := range tc.delivered {
				b, a := read(t, c)
				assert.Equal(t, want, b)
				assert.False(t, a.Proxied())
			}
			b, a := read(t, c)
			assert.Equal(t, hello, b)
			assert.True(t, a.Proxied())
			s := c.Stats()
			assert.Equal(t, uint64(len(tc.send)-len(tc.delivered)), tc.dropped(s))
			balanced(t, s, uint64(len(tc.send)+1))
		})
	}
}

// Q1 arrives via proxy A, Q2 of the same client via proxy B before Q1 is
// answered: each answer leaves through the proxy of its own request.
func TestReplyGoesThroughItsRequestsProxy(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	pa, pb := newPeer(t), newPeer(t)
	pa.proxied(c, client1, []byte("Q1"))
	pb.proxied(c, client1, []byte("Q2"))
	_, a1 := read(t, c)
	_, a2 := read(t, c)
	require.Equal(t, a1.Client, a2.Client)
	require.NotEqual(t, a1.Proxy, a2.Proxy)
	_, err := c.WriteTo([]byte("R2"), a2)
	require.NoError(t, err)
	_, err = c.WriteTo([]byte("R1"), a1)
	require.NoError(t, err)
	_, p := reverse(t, pa.recv())
	assert.Equal(t, "R1", string(p))
	_, p = reverse(t, pb.recv())
	assert.Equal(t, "R2", string(p))
	// The table holds the newest committed route, used only for writes
	// that name the client alone.
	r, _ := c.Route(client1)
	assert.Equal(t, a1.Proxy, r.Proxy)
}

// A datagram that was only read (inspected) commits nothing: a forged one
// claiming the client via another proxy, or carrying the session's CID
// from another address, does not move the route.
func TestForgedDatagramDoesNotMoveRoute(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	pa, pb := newPeer(t), newPeer(t)
	cid := []byte{7, 1, 2, 3, 4, 5, 6, 7}

	pa.proxied(c, client1, []byte("real"))
	_, real := read(t, c)
	c.Commit(*real, cid) // the stack authenticated it

	pb.proxied(c, client1, []byte("forged, same client via B"))
	pb.proxied(c, client2, []byte("forged, same CID from elsewhere"))
	_, f1 := read(t, c)
	_, f2 := read(t, c)
	require.Equal(t, pb.addr(), f1.Proxy)
	require.Equal(t, client2, f2.Client)

	r, ok := c.Route(client1)
	require.True(t, ok)
	assert.Equal(t, *real, r)
	r, ok = c.RouteCID(cid)
	require.True(t, ok)
	assert.Equal(t, *real, r)
	_, ok = c.Route(client2)
	assert.False(t, ok)

	_, err := c.WriteToCID([]byte("push"), cid)
	require.NoError(t, err)
	_, p := reverse(t, pa.recv())
	assert.Equal(t, "push", string(p))
	assert.True(t, pb.nothing())

	// Once the stack accepts a datagram of the session from a new address
	// (a rebinding) and commits it, the CID route follows.
	c.Commit(*f2, cid)
	r, _ = c.RouteCID(cid)
	assert.Equal(t, *f2, r)
	_, ok = c.Route(client1)
	assert.False(t, ok, "the old address no longer routes")
	r, ok = c.Route(client2)
	assert.True(t, ok)
	assert.Equal(t, *f2, r)
}

func TestManualCommit(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}, ManualCommit: true})
	px := newPeer(t)
	px.proxied(c, client1, []byte("q"))
	_, a := read(t, c)
	_, err := c.WriteTo([]byte("r"), a)
	require.NoError(t, err)
	px.recv()
	_, ok := c.Route(client1)
	assert.False(t, ok, "no commit-on-write")
	_, err = c.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(client1))
	assert.ErrorIs(t, err, ErrNoRoute)
	assert.Equal(t, uint64(1), c.Stats().WriteNoRoute)
}

func TestRouteTableBoundAndExpiry(t *testing.T) {
	c := newConn(t, Config{MaxRoutes: 3, RouteIdle: time.Minute})
	ck := withClock(c)
	proxy := netip.MustParseAddrPort("127.0.0.1:9")
	addr := func(i int) Addr {
		return Addr{Client: netip.AddrPortFrom(client1.Addr(), uint16(1000+i)), Service: service, Proxy: proxy}
	}
	for i := range 3 {
		c.Commit(addr(i), []byte{byte(i), 0, 0, 0, 0, 0, 0, 0})
		ck.advance(time.Second)
	}
	assert.Equal(t, 3, c.Stats().Routes)
	c.Commit(addr(3), nil)
	s := c.Stats()
	assert.Equal(t, 3, s.Routes, "bounded")
	assert.Equal(t, uint64(1), s.RoutesEvicted)

	// Expiry: a route not committed for RouteIdle is gone, by client and
	// by CID; committing again keeps a route alive.
	ck.advance(30 * time.Second)
	c.Commit(addr(3), nil)
	ck.advance(40 * time.Second)
	_, ok := c.Route(addr(3).Client)
	assert.True(t, ok, "refreshed 40 s ago")
	live := 0
	for i := range 3 {
		if _, ok := c.Route(addr(i).Client); ok {
			live++
		}
		if _, ok := c.RouteCID([]byte{byte(i), 0, 0, 0, 0, 0, 0, 0}); ok {
			live++
		}
	}
	assert.Zero(t, live, "idle routes expired")
	s = c.Stats()
	assert.Equal(t, 1, s.Routes)
	assert.NotZero(t, s.RoutesExpired)

	// A full table sweeps expired routes before evicting live ones.
	for i := 10; i < 12; i++ {
		c.Commit(addr(i), nil)
	}
	ck.advance(2 * time.Minute)
	c.Commit(addr(20), nil)
	c.Commit(addr(21), nil)
	s = c.Stats()
	assert.Equal(t, 2, s.Routes, "the three expired routes were swept, not evicted")
	assert.Equal(t, uint64(1), s.RoutesEvicted)

	c.Forget(addr(20).Client, nil)
	_, ok = c.Route(addr(20).Client)
	assert.False(t, ok)
}

func TestCommitRekeysAddressOfAnotherSession(t *testing.T) {
	c := newConn(t, Config{})
	proxy := netip.MustParseAddrPort("127.0.0.1:9")
	a := Addr{Client: client1, Service: service, Proxy: proxy}
	b := Addr{Client: client2, Service: service, Proxy: proxy}
	c.Commit(a, []byte("cid-one!"))
	c.Commit(b, []byte("cid-two!"))
	// Session two rebinds onto the address session one used (a NAT reused
	// the port): the address now belongs to session two.
	c.Commit(a, []byte("cid-two!"))
	r, ok := c.Route(client1)
	require.True(t, ok)
	r2, _ := c.RouteCID([]byte("cid-two!"))
	assert.Equal(t, r, r2)
	_, ok = c.RouteCID([]byte("cid-one!"))
	assert.False(t, ok, "session one's route pointed at an address that is no longer its own")
	_, ok = c.Route(client2)
	assert.False(t, ok)
}

func TestWriteErrors(t *testing.T) {
	c := newConn(t, Config{})
	_, err := c.WriteTo([]byte("x"), nil)
	assert.ErrorIs(t, err, ErrAddress)
	_, err = c.WriteTo([]byte("x"), (*Addr)(nil))
	assert.ErrorIs(t, err, ErrAddress)
	_, err = c.WriteTo([]byte("x"), &net.UnixAddr{Name: "/x", Net: "unixgram"})
	assert.ErrorIs(t, err, ErrAddress)
	_, err = c.WriteTo([]byte("x"), Addr{Client: client1, Proxy: netip.MustParseAddrPort("127.0.0.1:9")})
	assert.ErrorIs(t, err, ErrAddress, "proxied without service")
	_, err = c.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(client1))
	assert.ErrorIs(t, err, ErrNoRoute)
	_, err = c.WriteToCID([]byte("x"), []byte("nope"))
	assert.ErrorIs(t, err, ErrNoRoute)
	_, err = c.WriteTo([]byte("x"), &net.IPAddr{IP: net.IPv4(1, 2, 3, 4)})
	assert.ErrorIs(t, err, ErrAddress)
	// A net.Addr of another type that prints as address:port is routed.
	c.Commit(Addr{Client: client1, Service: service, Proxy: newPeer(t).addr()}, nil)
	_, err = c.WriteTo([]byte("via string"), stringAddr(client1.String()))
	require.NoError(t, err)
}

type stringAddr string

func (s stringAddr) Network() string { return "udp" }
func (s stringAddr) String() string  { return string(s) }

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{MaxRoutes: -1},
		{RouteIdle: -1},
		{RouteIdle: 3},
		{RouteIdle: MaxRouteIdle + time.Second},
		{Batch: 2000},
		{MaxDatagram: 10},
		{Direct: 9},
		{Protocol: 9},
		{Direct: DirectNoHandshake},
		{Protocol: QUIC, CIDLen: 21},
		{Protocol: DTLS, CIDLen: 256},
		{TrustedProxies: []netip.Prefix{{}}},
	} {
		_, err := New(listen(t), cfg)
		assert.ErrorIs(t, err, ErrConfig, "%+v", cfg)
	}
	c, err := New(listen(t), Config{RouteIdle: MaxRouteIdle})
	require.NoError(t, err, "the longest RouteIdle")
	c.Close()
	// Each message names the field at fault.
	for want, cfg := range map[string]Config{
		"MaxRoutes -1":         {MaxRoutes: -1},
		"RouteIdle -1ns: want": {RouteIdle: -1},
		"RouteIdle 3ns: want":  {RouteIdle: 3},
		"RouteIdle 744h0m1s: want 0 (default 5m0s) or 1s to 744h0m0s": {RouteIdle: MaxRouteIdle + time.Second},
		"Batch 2000":                   {Batch: 2000},
		"MaxDatagram 10":               {MaxDatagram: 10},
		"unknown Direct policy 9":      {Direct: 9},
		"unknown Protocol 9":           {Protocol: 9},
		"set Protocol to DTLS or QUIC": {Direct: DirectNoHandshake},
		"QUIC CIDLen 21":               {Protocol: QUIC, CIDLen: 21},
		"DTLS CIDLen 256":              {Protocol: DTLS, CIDLen: 256},
		"invalid (zero) prefix":        {TrustedProxies: []netip.Prefix{{}}},
	} {
		_, err := New(listen(t), cfg)
		assert.ErrorContains(t, err, want)
	}
}

func TestShortReadBufferTruncates(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	px.proxied(c, client1, []byte("0123456789"))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
	buf := make([]byte, 4)
	n, a, err := c.ReadFromAddr(buf)
	require.NoError(t, err)
	assert.Equal(t, "0123", string(buf[:n]))
	assert.Equal(t, client1, a.Client)
}

func TestOversizedDatagramDropped(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}, MaxDatagram: 100})
	px := newPeer(t)
	px.proxied(c, client1, make([]byte, 200))
	px.proxied(c, client1, []byte("small"))
	b, _ := read(t, c)
	assert.Equal(t, "small", string(b))
	assert.Equal(t, uint64(1), c.Stats().DroppedTruncated)
}

func TestReadDeadlineAndClose(t *testing.T) {
	c := newConn(t, Config{})
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, _, err := c.ReadFrom(make([]byte, 10))
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	go func() { time.Sleep(10 * time.Millisecond); c.Close() }()
	_, _, err = c.ReadFrom(make([]byte, 10))
	assert.ErrorIs(t, err, net.ErrClosed)
}

func TestBuffers(t *testing.T) {
	c := newConn(t, Config{})
	require.NoError(t, c.SetReadBuffer(1<<20))
	require.NoError(t, c.SetWriteBuffer(1<<20))
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	require.NotNil(t, rc)
	// quic-go probes exactly these interfaces.
	var pc net.PacketConn = c
	_, ok := pc.(interface{ SetReadBuffer(int) error })
	assert.True(t, ok)
	_, ok = pc.(interface{ SetWriteBuffer(int) error })
	assert.True(t, ok)
	_, ok = pc.(interface {
		ReadMsgUDP(b, oob []byte) (n, oobn, flags int, addr *net.UDPAddr, err error)
	})
	assert.False(t, ok, "not OOB-capable: quic-go must use ReadFrom/WriteTo")
}

// Writers from many goroutines, a reader beside them; run with -race.
func TestConcurrentWriters(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	pxs := []*peer{newPeer(t), newPeer(t), newPeer(t)}
	var addrs []*Addr
	for i, px := range pxs {
		px.proxied(c, netip.AddrPortFrom(client1.Addr(), uint16(2000+i)), []byte("q"))
		_, a := read(t, c)
		addrs = append(addrs, a)
	}
	const per = 50
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				a := addrs[(g+i)%len(addrs)]
				if _, err := c.WriteTo([]byte("r"), a); err != nil {
					t.Error(err)
					return
				}
				if i%10 == 0 {
					c.Commit(*a, []byte{byte(g), 1, 2, 3, 4, 5, 6, 7})
					c.Route(a.Client)
					c.Stats()
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		pxs[0].proxied(c, client2, []byte("during"))
		b, _ := read(t, c)
		assert.Equal(t, "during", string(b))
	}()
	wg.Wait()
	assert.Equal(t, uint64(6*per), c.Stats().WrittenProxied)
}

func TestTrustedPrefixForms(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{
		netip.MustParsePrefix("::ffff:10.0.0.0/104"), // IPv4-mapped form of 10.0.0.0/8
		netip.MustParsePrefix("2001:db8::/32"),
	}})
	for ip, want := range map[string]bool{
		"10.9.9.9": true, "::ffff:10.9.9.9": true, "11.0.0.1": false,
		"2001:db8::1": true, "2001:db9::1": false, "127.0.0.1": false,
	} {
		assert.Equal(t, want, c.isTrusted(netip.MustParseAddr(ip)), ip)
	}
}
