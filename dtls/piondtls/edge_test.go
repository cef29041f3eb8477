package piondtls

// The edge dialer on loopback, with real pion peers and cidroute
// replicas as the edges (no distance: examples/e2e's edge_* tests add
// it in network namespaces).

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/edge"
	"github.com/cidroute/cidroute/internal/fakeclock"
	"github.com/cidroute/cidroute/registry"
)

func clientConfig() *pion.Config {
	cfg := pskConfig()
	cfg.PSKIdentityHint = []byte("client")
	cfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
	return cfg
}

// edgeLab: three backends, and n replicas with distinct addresses as the
// edges.
type edgeLab struct {
	srvs  []*server
	pipes []*cidroute.Pipeline
	edges []netip.AddrPort
}

func newEdgeLab(t *testing.T, n int) *edgeLab {
	l := &edgeLab{}
	var bs []registry.Backend
	for ord := range uint8(3) {
		s := startServer(t, ord)
		l.srvs = append(l.srvs, s)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: s.addr(), Weight: 1, State: registry.Ready})
	}
	for range n {
		px := cidroutetest.Start(t, 42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}}, bs...)
		p, a := px.Pipeline, px.Addr
		l.pipes = append(l.pipes, p)
		l.edges = append(l.edges, a)
	}
	return l
}

// hops says where datagrams went, for a failure's message: each replica's
// forward and reverse counts (received, forwarded, the non-zero drops)
// and each backend's sessions, delivered and dropped records.
func (l *edgeLab) hops() string {
	var b strings.Builder
	counts := func(c cidroute.Counters) string {
		return fmt.Sprintf("%d→%d %s", c.Received, c.Forwarded, c.DropSummary())
	}
	for i, p := range l.pipes {
		for _, st := range p.Stats() {
			fmt.Fprintf(&b, "edge %v fwd %s rev %s; ", l.edges[i], counts(st.Forward), counts(st.Reverse))
		}
	}
	for _, s := range l.srvs {
		fmt.Fprintf(&b, "backend %d %+v %+v; ", s.ord, s.pl.Stats(), s.bc.Stats())
	}
	return b.String()
}

// handshakes counts the sessions the backends started (probes included).
func (l *edgeLab) handshakes() uint64 {
	var n uint64
	for _, s := range l.srvs {
		n += s.pl.Stats().NewSessions
	}
	return n
}

func (l *edgeLab) dialer(t *testing.T, cfg EdgeConfig) *EdgeDialer {
	cfg.DTLS = clientConfig()
	cfg.Edge.Resolve = edge.Static(l.edges...)
	if cfg.Edge.Logger == nil {
		cfg.Edge.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := NewEdgeDialer(cfg)
	require.NoError(t, err)
	return d
}

// askConn is ask for any net.Conn.
func askConn(t *testing.T, c net.Conn, msg string, wait time.Duration) (string, bool) {
	t.Helper()
	buf := make([]byte, 2048)
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	for {
		n, err := c.Read(buf)
		if err != nil {
			return "", false
		}
		if got := string(buf[:n]); strings.HasSuffix(got, "|"+msg) {
			return got, true
		}
	}
}

func TestEdgeProbeIsAFullHandshake(t *testing.T) {
	l := newEdgeLab(t, 1)
	d := l.dialer(t, EdgeConfig{})
	s, err := d.Probe(t.Context(), l.edges[0])
	require.NoError(t, err)
	assert.Positive(t, s.RTT)
	assert.GreaterOrEqual(t, s.Handshake, 2*s.RTT, "a DTLS 1.2 handshake takes at least two round trips")
	assert.Equal(t, uint64(1), l.handshakes())
	// The probe's session was closed with close_notify: the backend ends it.
	require.Eventually(t, func() bool {
		return l.srvs[0].pl.Stats().Sessions+l.srvs[1].pl.Stats().Sessions+l.srvs[2].pl.Stats().Sessions == 0
	},
		5*time.Second, 10*time.Millisecond)

	// Nothing listens there: the probe fails within its context.
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	dead := udp.LocalAddr().(*net.UDPAddr).AddrPort()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = d.Probe(ctx, dead)
	require.Error(t, err)
	udp.Close()
}

func TestEdgeSessionFailsOverWithoutHandshake(t *testing.T) {
	l := newEdgeLab(t, 2)
	var mu sync.Mutex
	var switches []edge.Switch
	d := l.dialer(t, EdgeConfig{Silence: 200 * time.Millisecond, Edge: edge.Config{OnEvent: func(e edge.Event) {
		if e.Kind == edge.EventSwitch {
			mu.Lock()
			switches = append(switches, *e.Switch)
			mu.Unlock()
		}
	}}})
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	_, err = d.Dial(t.Context())
	require.ErrorIs(t, err, edge.ErrInUse)

	first := c.Edge()
	reply, ok := askConn(t, c, "before", time.Second)
	require.True(t, ok)
	owner := reply[:strings.Index(reply, "|")]
	before := l.handshakes()
	assert.Equal(t, uint64(3), before, "two probes and the session")

	// The edge dies. The first message after is lost; the silence
	// detector moves the session to the other edge, and it goes on.
	for i, e := range l.edges {
		if e == first {
			require.NoError(t, l.pipes[i].Close())
		}
	}
	_, ok = askConn(t, c, "lost", 400*time.Millisecond)
	require.False(t, ok)
	require.Eventually(t, func() bool { return c.Edge() != first }, 5*time.Second, 10*time.Millisecond)
	for i := range 5 {
		msg := fmt.Sprint("after ", i)
		reply, ok := askConn(t, c, msg, time.Second)
		require.True(t, ok, "%s: no reply via %v (client %+v); %s", msg, c.Edge(), c.Stats(), l.hops())
		assert.Equal(t, owner+"|"+msg, reply, "the same backend, the same session")
	}
	assert.Equal(t, before, l.handshakes(), "no new handshake")
	mu.Lock()
	require.Len(t, switches, 1)
	assert.Equal(t, edge.Switch{From: first, To: c.Edge(), Reason: edge.Unreachable, ToRTT: switches[0].ToRTT}, switches[0])
	mu.Unlock()
	st := c.Stats()
	assert.Equal(t, uint64(1), st.Silences)
	assert.Zero(t, st.Strangers)

	// Closing releases the dialer for the next session.
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	c2, err := d.Dial(t.Context())
	require.NoError(t, err)
	c2.Close()
}

func TestEdgeSessionSwitchesWhenABetterEdgeWins(t *testing.T) {
	// Loopback edges are all as near; the fake probe says A got slow. The
	// switch is a retarget: the next record goes through B, the same
	// backend answers, no handshake.
	l := newEdgeLab(t, 2)
	a, b := l.edges[0], l.edges[1]
	var mu sync.Mutex
	rtt := map[netip.AddrPort]time.Duration{a: 5 * time.Millisecond, b: 30 * time.Millisecond}
	clk := fakeclock.New(time.Now())
	cycles := make(chan *edge.Switch, 16)
	d := l.dialer(t, EdgeConfig{Edge: edge.Config{Clock: clk,
		Probe: func(ctx context.Context, addr netip.AddrPort) (edge.Sample, error) {
			mu.Lock()
			defer mu.Unlock()
			return edge.Sample{RTT: rtt[addr]}, nil
		},
		OnEvent: func(e edge.Event) {
			if e.Kind == edge.EventCycle {
				cycles <- e.Switch
			}
		}}})
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, a, c.Edge())
	reply, ok := askConn(t, c, "on A", time.Second)
	require.True(t, ok)
	owner := reply[:strings.Index(reply, "|")]
	before := l.handshakes()

	mu.Lock()
	rtt[a] = 60 * time.Millisecond
	mu.Unlock()
	clk.Fire()
	require.Nil(t, <-cycles, "one round is not enough")
	assert.Equal(t, a, c.Edge())
	clk.Fire()
	sw := <-cycles
	require.NotNil(t, sw)
	assert.Equal(t, edge.Switch{From: a, To: b, Reason: edge.Better, FromRTT: 60 * time.Millisecond, ToRTT: 30 * time.Millisecond}, *sw)
	require.Eventually(t, func() bool { return c.Edge() == b }, 5*time.Second, time.Millisecond)
	reply, ok = askConn(t, c, "on B", time.Second)
	require.True(t, ok)
	assert.Equal(t, owner+"|on B", reply)
	assert.Equal(t, before, l.handshakes())
}

func TestEdgeSockDropsStrangers(t *testing.T) {
	l := newEdgeLab(t, 1)
	d := l.dialer(t, EdgeConfig{})
	c, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer c.Close()
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer stranger.Close()
	local := c.sock.udp.LocalAddr().(*net.UDPAddr).AddrPort()
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), local.Port())
	_, err = stranger.WriteToUDPAddrPort([]byte{23, 0xfe, 0xfd, 0, 1, 0, 0, 0, 0, 0, 9, 0, 1, 0}, to)
	require.NoError(t, err)
	_, ok := askConn(t, c, "still here", time.Second)
	require.True(t, ok)
	require.Eventually(t, func() bool { return c.Stats().Strangers == 1 }, time.Second, time.Millisecond)
}

func TestEdgeConfigErrors(t *testing.T) {
	_, err := NewEdgeDialer(EdgeConfig{Edge: edge.Config{Resolve: edge.Static()}})
	require.ErrorIs(t, err, ErrConfig)
	_, err = NewEdgeDialer(EdgeConfig{DTLS: pskConfig(), Edge: edge.Config{Resolve: edge.Static()}})
	require.ErrorIs(t, err, ErrConfig, "no connection IDs")
	_, err = NewEdgeDialer(EdgeConfig{DTLS: clientConfig()})
	require.ErrorIs(t, err, edge.ErrConfig)
}

func TestEdgeSockAcceptsEveryEdgeOfTheSet(t *testing.T) {
	// Records come from the current edge, from one the session used before
	// (a reply in flight when it moved), or from any edge the name resolves
	// to; nothing else reaches pion. Only the current edge's answer ends a
	// silence.
	peer := func() *net.UDPConn {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		t.Cleanup(func() { u.Close() })
		return u
	}
	addr := func(u *net.UDPConn) netip.AddrPort { return u.LocalAddr().(*net.UDPAddr).AddrPort() }
	old, cur, known, stranger := peer(), peer(), peer(), peer()
	udp := peer()
	var set atomic.Pointer[[]netip.AddrPort]
	set.Store(&[]netip.AddrPort{addr(old), addr(cur), addr(known)})
	s := newEdgeSock(udp, addr(old), &set)
	s.retarget(addr(cur))
	silent := make(chan netip.AddrPort, 1)
	s.watchSilence(time.Hour, func(a netip.AddrPort) { silent <- a })

	_, err := s.WriteTo([]byte("q"), s.remote)
	require.NoError(t, err)
	for _, from := range []*net.UDPConn{stranger, old, known, stranger, cur} {
		_, err := from.WriteToUDPAddrPort([]byte(fmt.Sprint(addr(from).Port())), addr(udp))
		require.NoError(t, err)
	}
	buf := make([]byte, 64)
	var got []string
	for range 3 {
		require.NoError(t, s.SetReadDeadline(time.Now().Add(time.Second)))
		n, ra, err := s.ReadFrom(buf)
		require.NoError(t, err)
		assert.Same(t, s.remote.(edgeAddr).s, ra.(edgeAddr).s, "pion sees one peer")
		got = append(got, string(buf[:n]))
	}
	want := []string{fmt.Sprint(addr(old).Port()), fmt.Sprint(addr(known).Port()), fmt.Sprint(addr(cur).Port())}
	assert.Equal(t, want, got)
	assert.Equal(t, uint64(2), s.strangers.Load())
	assert.Equal(t, addr(cur).String(), s.remote.String(), "the peer address names the current edge")
	s.mu.Lock()
	assert.True(t, s.pending.IsZero(), "the current edge answered")
	s.mu.Unlock()

	// Silence: a write, no answer, the detector fires once with the edge.
	s.watchSilence(50*time.Millisecond, func(a netip.AddrPort) { silent <- a })
	_, err = s.WriteTo([]byte("q"), s.remote)
	require.NoError(t, err)
	_, err = s.WriteTo([]byte("q again"), s.remote) // does not restart the clock
	require.NoError(t, err)
	select {
	case a := <-silent:
		assert.Equal(t, addr(cur), a)
	case <-time.After(5 * time.Second):
		t.Fatal("no silence reported")
	}
	s.Close()
}
