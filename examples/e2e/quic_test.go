package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

func quicBackends(t *testing.T, n int, logs *syncBuffer) ([]*quicecho.Server, []registry.Backend) {
	t.Helper()
	var srvs []*quicecho.Server
	var bs []registry.Backend
	for ord := range uint8(n) {
		cfg := quicecho.Config{Ordinal: ord, TrustedProxies: loopback, Direct: backend.DirectNoHandshake}
		if logs != nil {
			cfg.Logger = newLogger(logs)
		}
		s, err := quicecho.Listen(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		srvs = append(srvs, s)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: s.Addr()})
	}
	return srvs, bs
}

// A quicClient is a quic-go connection with one open echo stream, dialed
// from a socket that believes it talks to the public address.
type quicClient struct {
	sock   *cidroutetest.RebindConn
	tr     *quic.Transport
	conn   *quic.Conn
	stream *quic.Stream
	first  netip.AddrPort // the first local address
}

func dialQUIC(t *testing.T, ctx context.Context, via netip.AddrPort) *quicClient {
	t.Helper()
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	require.NoError(t, err)
	tr := &quic.Transport{Conn: sock}
	t.Cleanup(func() { tr.Close(); sock.Close() })
	conn, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(public),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { conn.CloseWithError(0, "done") })
	s, err := conn.OpenStreamSync(ctx)
	require.NoError(t, err)
	return &quicClient{sock: sock, tr: tr, conn: conn, stream: s, first: sock.Local()}
}

// echo writes rounds of 1 KiB on the stream and reads each back.
func (c *quicClient) echo(t *testing.T, tag string, rounds int) {
	t.Helper()
	msg := bytes.Repeat([]byte("cidroute"), 128)
	got := make([]byte, len(msg))
	for i := range rounds {
		copy(msg, fmt.Sprintf("%s %03d ", tag, i))
		_, err := c.stream.Write(msg)
		require.NoError(t, err)
		require.NoError(t, c.stream.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = io.ReadFull(c.stream, got)
		require.NoError(t, err, "%s round %d", tag, i)
		require.Equal(t, msg, got)
	}
}

// migrate moves the connection to a new local socket that reaches the
// other replica: quic-go probes the new path, then switches to it.
func (c *quicClient) migrate(t *testing.T, ctx context.Context, via netip.AddrPort) {
	t.Helper()
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	require.NoError(t, err)
	tr := &quic.Transport{Conn: sock}
	t.Cleanup(func() { tr.Close(); sock.Close() })
	path, err := c.conn.AddPath(tr)
	require.NoError(t, err)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, path.Probe(pctx), "path validation through the proxy")
	require.NoError(t, path.Switch())
	c.sock = sock
}

// owner finds the backend connection that started from client address a.
func owner(srvs []*quicecho.Server, a netip.AddrPort) (*quicecho.Server, quicecho.Connection, bool) {
	for _, s := range srvs {
		for _, c := range s.Connections() {
			if c.First.Client == a {
				return s, c, true
			}
		}
	}
	return nil, quicecho.Connection{}, false
}

// TestQUICMigration: 50 quic-go connections through two replicas to three
// quic-go backends issuing QUIC-LB CIDs with their ordinal. Mid-stream each
// client migrates to a new local address that reaches the other replica;
// the stream goes on with the same backend, which sees the client and the
// proxy change. A migrating client must use a connection ID it has not
// used before (RFC 9000 §9.5), one from the server's NEW_CONNECTION_ID
// frames: that the proxies still find the backend shows those carry the
// ordinal too.
func TestQUICMigration(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	logs := &syncBuffer{}
	srvs, bs := quicBackends(t, 3, logs)
	rs := startReplicas(t, 2, cidroute.QUIC, bs)

	const conns = 50
	cs := make([]*quicClient, conns)
	for i := range cs {
		cs[i] = dialQUIC(t, ctx, rs[i%2].addr)
		cs[i].echo(t, fmt.Sprint("c", i, " before"), 20)
	}
	for i, c := range cs {
		c.migrate(t, ctx, rs[(i+1)%2].addr)
		require.NotEqual(t, c.first, c.sock.Local())
		c.echo(t, fmt.Sprint("c", i, " after"), 10)
	}

	total := 0
	for _, s := range srvs {
		total += len(s.Connections())
	}
	require.Equal(t, conns, total, "one backend connection per client: migration created none")
	for i, c := range cs {
		s, bc, ok := owner(srvs, c.first)
		require.True(t, ok, "client %d", i)
		assert.Equal(t, int64(30*1024), bc.Bytes, "client %d: every byte reached backend %d", i, s.Ordinal())
		assert.Equal(t, c.sock.Local(), bc.Last.Client, "client %d: the backend follows the client", i)
		assert.Same(t, rs[i%2], replicaOf(rs, bc.First.Proxy), "client %d: first measured proxy", i)
		assert.Same(t, rs[(i+1)%2], replicaOf(rs, bc.Last.Proxy), "client %d: measured proxy after migration", i)
		assert.Equal(t, public, bc.Last.Service)
		assert.GreaterOrEqual(t, bc.Moves, 1)
	}
	perBackend := map[uint8]int{}
	for _, s := range srvs {
		st := s.Stats()
		assert.Zero(t, st.AcceptedDirect+st.DroppedUntrusted+st.DroppedBadHeader, "backend %d", s.Ordinal())
		if n := len(s.Connections()); n > 0 {
			perBackend[s.Ordinal()] = n
		}
	}
	t.Logf("connections per backend: %v", perBackend)
	require.Len(t, perBackend, 3, "HRW spreads 50 connections over all three backends")
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
	out := logs.String()
	assert.Contains(t, out, `msg="connection started"`)
	assert.Contains(t, out, `msg="connection moved"`)
}

// TestQUICDrainAndRemove: a draining backend keeps its connection while a
// new one goes elsewhere; once removed, the proxies drop (and count) its
// connection's packets, and a new connection lands on another backend.
// (The removed backend, still running, may send a probe or an ACK; the
// replicas no longer know its address and drop that too, counted as
// untrusted_sender on the reverse path.)
func TestQUICDrainAndRemove(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srvs, bs := quicBackends(t, 3, nil)
	rs := startReplicas(t, 2, cidroute.QUIC, bs)

	c := dialQUIC(t, ctx, rs[0].addr)
	c.echo(t, "first", 5)
	s, _, ok := owner(srvs, c.first)
	require.True(t, ok)
	victim := s.Ordinal()

	drained := append([]registry.Backend(nil), bs...)
	drained[victim].State = registry.Draining
	setBackends(t, rs, drained)
	c.echo(t, "draining", 5)
	for i := range 4 {
		n := dialQUIC(t, ctx, rs[i%2].addr)
		n.echo(t, "new", 1)
		ns, _, ok := owner(srvs, n.first)
		require.True(t, ok)
		require.NotEqual(t, victim, ns.Ordinal(), "a new connection went to the draining backend")
		n.conn.CloseWithError(0, "")
	}

	var removed []registry.Backend
	for _, b := range bs {
		if b.Ordinal != victim {
			removed = append(removed, b)
		}
	}
	setBackends(t, rs, removed)
	before := forward(rs)
	_, err := c.stream.Write([]byte("into the void"))
	require.NoError(t, err)
	require.NoError(t, c.stream.SetReadDeadline(time.Now().Add(500*time.Millisecond)))
	_, err = c.stream.Read(make([]byte, 16))
	require.Error(t, err, "no answer from a removed backend")
	after := forward(rs)
	dropped := after.Dropped[cidroute.UnknownOrdinal] - before.Dropped[cidroute.UnknownOrdinal]
	require.NotZero(t, dropped, "the removed backend's packets are dropped and counted")
	t.Logf("removed backend %d: %d packets (data and retransmissions) dropped as %s", victim, dropped, cidroute.UnknownOrdinal)

	n := dialQUIC(t, ctx, rs[1].addr)
	n.echo(t, "fresh", 2)
	ns, _, ok := owner(srvs, n.first)
	require.True(t, ok)
	require.NotEqual(t, victim, ns.Ordinal())
}
