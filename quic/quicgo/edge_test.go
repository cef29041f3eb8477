package quicgo

// The QUIC edge dialer on loopback: quic-go servers behind the PPv2
// adapter with a shared session ticket key, cidroute replicas as the
// edges (no distance: examples/e2e's edge_* tests add it).

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/edge"
	"github.com/cidroute/cidroute/internal/fakeclock"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

type quicLab struct {
	client *tls.Config
	pipes  []*cidroute.Pipeline
	edges  []netip.AddrPort
}

// newQUICLab starts two quic-go backends that accept 0-RTT and share a
// session ticket key, and n replicas in front of them.
func newQUICLab(t *testing.T, n int) *quicLab {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	srvTLS, cliTLS := testTLS(t)
	rand.Read(srvTLS.SessionTicketKey[:])
	var bs []registry.Backend
	for ord := range uint8(2) {
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		gen, err := NewGenerator(nil, ord)
		require.NoError(t, err)
		bc, err := backend.New(udp, backend.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			Direct: backend.DirectNoHandshake, Protocol: backend.QUIC, CIDLen: gen.ConnectionIDLen()})
		require.NoError(t, err)
		tr := &quic.Transport{Conn: bc, ConnectionIDGenerator: gen}
		ln, err := tr.ListenEarly(srvTLS.Clone(), &quic.Config{Allow0RTT: true})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		go echo(ctx, ln)
		t.Cleanup(func() { cancel(); ln.Close(); tr.Close(); bc.Close() })
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: udp.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1, State: registry.Ready})
	}
	cliTLS.ClientSessionCache = nil // the dialer brings one
	l := &quicLab{client: cliTLS}
	for range n {
		px := cidroutetest.Start(t, 42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC}}, bs...)
		p, a := px.Pipeline, px.Addr
		l.pipes = append(l.pipes, p)
		l.edges = append(l.edges, a)
	}
	return l
}

func (l *quicLab) dialer(t *testing.T, cfg EdgeConfig) *EdgeDialer {
	cfg.TLS = l.client
	cfg.Edge.Resolve = edge.Static(l.edges...)
	if cfg.Edge.Logger == nil {
		cfg.Edge.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := NewEdgeDialer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// roundTrip echoes msg on a new stream of c.
func roundTrip(t *testing.T, c *quic.Conn, msg string) {
	t.Helper()
	s, err := c.OpenStream()
	require.NoError(t, err)
	_, err = s.Write([]byte(msg))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

type switchRec struct {
	mu  sync.Mutex
	sws []edge.Switch
	old []*quic.Conn
	new []*quic.Conn
	c   chan struct{}
}

func newSwitchRec() *switchRec { return &switchRec{c: make(chan struct{}, 8)} }

func (r *switchRec) on(old, nc *quic.Conn, sw edge.Switch) {
	r.mu.Lock()
	r.sws, r.old, r.new = append(r.sws, sw), append(r.old, old), append(r.new, nc)
	r.mu.Unlock()
	r.c <- struct{}{}
}

func TestEdgeQUICProbe(t *testing.T) {
	l := newQUICLab(t, 1)
	d := l.dialer(t, EdgeConfig{})
	s, err := d.Probe(t.Context(), l.edges[0])
	require.NoError(t, err)
	assert.Positive(t, s.RTT)
	assert.GreaterOrEqual(t, s.Handshake, s.RTT)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = d.Probe(ctx, netip.MustParseAddrPort("127.0.0.1:9"))
	require.Error(t, err)

	_, err = NewEdgeDialer(EdgeConfig{TLS: &tls.Config{}, Edge: edge.Config{Resolve: edge.Static()}})
	require.ErrorIs(t, err, ErrEdgeConfig, "no ServerName")
}

func TestEdgeQUICPlannedSwitchReconnectsWith0RTT(t *testing.T) {
	l := newQUICLab(t, 2)
	a, b := l.edges[0], l.edges[1]
	var mu sync.Mutex
	rtt := map[netip.AddrPort]time.Duration{a: 5 * time.Millisecond, b: 30 * time.Millisecond}
	clk := fakeclock.New(time.Now())
	cycles := make(chan *edge.Switch, 8)
	rec := newSwitchRec()
	d := l.dialer(t, EdgeConfig{OnSwitch: rec.on, Edge: edge.Config{Clock: clk,
		Probe: func(_ context.Context, addr netip.AddrPort) (edge.Sample, error) {
			mu.Lock()
			defer mu.Unlock()
			return edge.Sample{RTT: rtt[addr]}, nil
		},
		OnEvent: func(e edge.Event) {
			if e.Kind == edge.EventCycle {
				cycles <- e.Switch
			}
		}}})
	s, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer s.Close()
	_, err = d.Dial(t.Context())
	require.ErrorIs(t, err, edge.ErrInUse)
	require.Equal(t, a, s.Edge())
	first := s.Conn()
	roundTrip(t, first, "through A") // and the session ticket arrives

	mu.Lock()
	rtt[a] = 60 * time.Millisecond
	mu.Unlock()
	clk.Fire()
	require.Nil(t, <-cycles)
	clk.Fire()
	require.NotNil(t, <-cycles)
	<-rec.c
	rec.mu.Lock()
	assert.Equal(t, edge.Better, rec.sws[0].Reason)
	assert.Same(t, first, rec.old[0])
	nc := rec.new[0]
	rec.mu.Unlock()
	assert.Same(t, nc, s.Conn())
	assert.Equal(t, b, s.Edge())
	assert.True(t, nc.ConnectionState().Used0RTT, "resumed through the other edge, on another backend maybe: the ticket key is shared")
	roundTrip(t, nc, "through B")

	// The old connection was closed by us, cleanly, with the reason.
	<-first.Context().Done()
	var app *quic.ApplicationError
	require.ErrorAs(t, context.Cause(first.Context()), &app)
	assert.False(t, app.Remote)
	assert.Equal(t, "edge switch: better", app.ErrorMessage)
}

func TestEdgeQUICFailoverOnIdleTimeout(t *testing.T) {
	// The edge dies: quic-go's idle timeout ends the connection, and the
	// session reconnects through the next edge at once, resuming with
	// 0-RTT: the first stream's data goes in the first flight.
	l := newQUICLab(t, 2)
	rec := newSwitchRec()
	d := l.dialer(t, EdgeConfig{OnSwitch: rec.on, QUIC: &quic.Config{MaxIdleTimeout: 300 * time.Millisecond}})
	s, err := d.Dial(t.Context())
	require.NoError(t, err)
	defer s.Close()
	first, from := s.Conn(), s.Edge()
	roundTrip(t, first, "before")
	for i, e := range l.edges {
		if e == from {
			require.NoError(t, l.pipes[i].Close())
		}
	}
	select {
	case <-rec.c:
	case <-time.After(10 * time.Second):
		t.Fatal("no failover")
	}
	rec.mu.Lock()
	sw, nc := rec.sws[0], rec.new[0]
	rec.mu.Unlock()
	assert.Equal(t, edge.Unreachable, sw.Reason)
	assert.Equal(t, from, sw.From)
	var idle *quic.IdleTimeoutError
	require.True(t, errors.As(context.Cause(first.Context()), &idle))
	roundTrip(t, nc, "after")
	<-nc.HandshakeComplete()
	assert.True(t, nc.ConnectionState().Used0RTT)
	assert.NotEqual(t, from, s.Edge())
	assert.Equal(t, uint64(1), d.Chooser().Stats().Switches[edge.Unreachable])
}
