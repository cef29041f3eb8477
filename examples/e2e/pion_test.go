package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/registry"
)

// answeredBy splits a "<ordinal>|msg" reply.
func answeredBy(t *testing.T, reply, msg string) int {
	t.Helper()
	ord, rest, ok := strings.Cut(reply, "|")
	require.True(t, ok, "reply %q", reply)
	require.Equal(t, msg, rest)
	var n int
	_, err := fmt.Sscan(ord, &n)
	require.NoError(t, err)
	return n
}

// sessionsOf returns every server's sessions, by ordinal.
func sessionsOf(srvs []*dtlsecho.Server) map[int][]dtlsecho.Session {
	m := map[int][]dtlsecho.Session{}
	for _, s := range srvs {
		m[int(s.Ordinal())] = s.Sessions()
	}
	return m
}

// TestPionSessionsSurviveRebinding: 50 pion/dtls v3 sessions with CID
// through two replicas to three backends. Each client handshakes through
// one replica, then moves to a new source port and the other replica; its
// next messages are answered by the backend named in its CID, which sees
// the session move (claimed client and measured proxy both change) and
// never a second session.
func TestPionSessionsSurviveRebinding(t *testing.T) {
	const clients = 50
	srvs, bs := dtlsBackends(t, 3, nil)
	rs := startReplicas(t, 2, cidroute.DTLS, bs)

	cs := make([]*dtlsClient, clients)
	owner := make([]int, clients)
	first := make([]netip.AddrPort, clients)
	err := within(clients, 10, func(i int) error {
		c, err := dialDTLS(t.Context(), rs[i%2].addr)
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
		cs[i], first[i] = c, c.sock.Local()
		return nil
	})
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.conn.Close()
			}
		}
	})
	require.NoError(t, err)

	for i, c := range cs {
		msg := fmt.Sprintf("client %d before", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err, "client %d", i)
		owner[i] = answeredBy(t, reply, msg)
		require.Equal(t, owner[i], c.ordinal(), "client %d: answered by the backend its CID names", i)
	}
	perBackend := map[int]int{}
	for _, o := range owner {
		perBackend[o]++
	}
	t.Logf("sessions per backend: %v", perBackend)
	require.Len(t, perBackend, 3, "HRW spreads 50 sessions over all three backends")

	// NAT rebinding: a new source port, and the load balancer now picks the
	// other replica.
	for i, c := range cs {
		require.NoError(t, c.sock.Rebind(rs[(i+1)%2].addr))
		require.NotEqual(t, first[i], c.sock.Local())
		for k := range 2 {
			msg := fmt.Sprintf("client %d after %d", i, k)
			reply, err := c.ask(msg, 5, replyWait)
			require.NoError(t, err, "client %d after rebinding", i)
			require.Equal(t, owner[i], answeredBy(t, reply, msg), "client %d: same backend after rebinding", i)
		}
	}

	// The backends' view: one session per client, none re-created, every
	// record delivered to an existing session, and each session moved
	// from (first port, first replica) to (new port, other replica).
	byClient := map[netip.AddrPort]dtlsecho.Session{}
	total := 0
	for ord, ss := range sessionsOf(srvs) {
		for _, s := range ss {
			byClient[s.First.Client] = s
			total++
			assert.Equal(t, public, s.First.Service, "PPv2 destination is the public address")
			_ = ord
		}
	}
	require.Equal(t, clients, total, "one session per client: rebinding created none")
	for i, c := range cs {
		s, ok := byClient[first[i]]
		require.True(t, ok, "client %d: no session from %v", i, first[i])
		assert.GreaterOrEqual(t, s.Messages, 3, "client %d (more when a record was resent)", i)
		assert.Equal(t, 1, s.Moves, "client %d moved once", i)
		assert.Equal(t, c.sock.Local(), s.Last.Client, "client %d: claimed address follows the client", i)
		assert.Same(t, rs[i%2], replicaOf(rs, s.First.Proxy), "client %d: first measured proxy", i)
		assert.Same(t, rs[(i+1)%2], replicaOf(rs, s.Last.Proxy), "client %d: measured proxy after rebinding", i)
	}
	for _, s := range srvs {
		st, dm := s.Stats()
		assert.Zero(t, dm.DroppedNoSession, "backend %d: a record for a session it does not own", s.Ordinal())
		assert.Zero(t, st.AcceptedDirect+st.DroppedUntrusted+st.DroppedBadHeader, "backend %d: everything came through a trusted proxy", s.Ordinal())
		assert.Equal(t, uint64(perBackend[int(s.Ordinal())]), dm.NewSessions)
	}
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
	t.Logf("records resent after a lost echo (pion's late peer-address update): %d", resent.Swap(0))
}

// TestPionClaimedAndMeasured: the backend logs the client address the
// proxy claims and the proxy address it measured, apart, once per session
// event; and a client cannot start a session around the proxies.
func TestPionClaimedAndMeasured(t *testing.T) {
	logs := &syncBuffer{}
	srv := dtlsBackend(t, 0, logs)
	rs := startReplicas(t, 2, cidroute.DTLS, []registry.Backend{{Ordinal: 0, Addr: srv.Addr()}})
	c := mustDialDTLS(t, rs[0].addr)
	before := c.sock.Local()
	for k := range 5 {
		_, err := c.ask(fmt.Sprint("m", k), 5, replyWait)
		require.NoError(t, err)
	}
	require.NoError(t, c.sock.Rebind(rs[1].addr))
	after := c.sock.Local()
	for k := range 5 {
		_, err := c.ask(fmt.Sprint("n", k), 5, replyWait)
		require.NoError(t, err)
	}
	ss := srv.Sessions()
	require.Len(t, ss, 1)
	s := ss[0]
	// The backend's own report: the claimed client is the client's socket,
	// the measured sender is a replica's upstream socket, never mixed.
	assert.Equal(t, before, s.First.Client)
	assert.Equal(t, after, s.Last.Client)
	assert.Same(t, rs[0], replicaOf(rs, s.First.Proxy))
	assert.Same(t, rs[1], replicaOf(rs, s.Last.Proxy))
	assert.NotEqual(t, s.First.Client, s.First.Proxy)

	out := logs.String()
	t.Log(out)
	assert.Contains(t, out, fmt.Sprintf(`msg="session started" ordinal=0 session=1 client=%v proxy=%v service=%v`, before, s.First.Proxy, public))
	assert.Contains(t, out, fmt.Sprintf(`msg="session moved" ordinal=0 session=1 from=%v client=%v proxy=%v service=%v`, before, after, s.Last.Proxy, public))
	assert.Equal(t, 2, strings.Count(out, "\n"), "one line per session event, none per record")
	resent.Store(0)

	// A client that goes around the proxies gets nowhere: the backend drops
	// direct ClientHellos (backend.DirectNoHandshake) and counts them.
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	direct, err := pion.Client(udp, net.UDPAddrFromAddrPort(srv.Addr()), dtlsecho.PSKClientConfig(testPSK, "bypass"))
	require.NoError(t, err)
	defer direct.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	require.Error(t, direct.HandshakeContext(ctx))
	st, _ := srv.Stats()
	assert.NotZero(t, st.DroppedDirectHandshake)
	assert.Zero(t, st.AcceptedDirect)
	assert.Len(t, srv.Sessions(), 1)
}

// TestPionDrainAndRemove: a draining backend keeps its sessions (even
// through a rebinding) while new clients go elsewhere; a removed backend's
// clients have their next records dropped by the proxies, counted, and a
// fresh handshake lands on another backend.
func TestPionDrainAndRemove(t *testing.T) {
	srvs, bs := dtlsBackends(t, 3, nil)
	rs := startReplicas(t, 2, cidroute.DTLS, bs)

	const clients = 15
	cs := make([]*dtlsClient, clients)
	owner := make([]int, clients)
	for i := range cs {
		cs[i] = mustDialDTLS(t, rs[i%2].addr)
		msg := fmt.Sprint("hello ", i)
		reply, err := cs[i].ask(msg, 5, replyWait)
		require.NoError(t, err)
		owner[i] = answeredBy(t, reply, msg)
	}
	// The backend with the most sessions is the one to drain.
	count := map[int]int{}
	victim := 0
	for _, o := range owner {
		count[o]++
		if count[o] > count[victim] {
			victim = o
		}
	}
	require.NotZero(t, count[victim])
	t.Logf("sessions per backend %v; draining %d", count, victim)

	drained := append([]registry.Backend(nil), bs...)
	drained[victim].State = registry.Draining
	setBackends(t, rs, drained)

	// Established sessions, the victim's included, keep their backend,
	// also after a rebinding.
	for i, c := range cs {
		require.NoError(t, c.sock.Rebind(rs[(i+1)%2].addr))
		msg := fmt.Sprint("draining ", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err, "client %d", i)
		require.Equal(t, owner[i], answeredBy(t, reply, msg), "client %d", i)
	}
	// New clients avoid the draining backend.
	for i := range clients {
		c := mustDialDTLS(t, rs[i%2].addr)
		msg := fmt.Sprint("new ", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err)
		require.NotEqual(t, victim, answeredBy(t, reply, msg), "new client %d went to the draining backend", i)
		c.conn.Close()
	}

	// Remove the victim from the registry (it is still running).
	var removed []registry.Backend
	for _, b := range bs {
		if int(b.Ordinal) != victim {
			removed = append(removed, b)
		}
	}
	setBackends(t, rs, removed)
	before := forward(rs)
	sent := 0
	for i, c := range cs {
		if owner[i] == victim {
			sent++
			continue
		}
		msg := fmt.Sprint("after removal ", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err, "client %d of a remaining backend", i)
		require.Equal(t, owner[i], answeredBy(t, reply, msg))
	}
	err := within(clients, clients, func(i int) error {
		if owner[i] != victim {
			return nil
		}
		if _, err := cs[i].ask("after removal", 1, 300*time.Millisecond); !errors.Is(err, errNoReply) {
			return fmt.Errorf("client %d of the removed backend: want no reply, got %v", i, err)
		}
		return nil
	})
	require.NoError(t, err)
	after := forward(rs)
	dropped := after.Dropped[cidroute.UnknownOrdinal] - before.Dropped[cidroute.UnknownOrdinal]
	require.Equal(t, uint64(sent), dropped, "each record of the removed backend's sessions is dropped and counted as %s", cidroute.UnknownOrdinal)
	_, dm := srvs[victim].Stats()
	t.Logf("removed backend %d: %d records dropped by the proxies (%s), backend demux %+v", victim, dropped, cidroute.UnknownOrdinal, dm)

	// Those clients start over: a fresh handshake, on another backend.
	for i := range cs {
		if owner[i] != victim {
			continue
		}
		cs[i].conn.Close()
		c := mustDialDTLS(t, rs[i%2].addr)
		msg := fmt.Sprint("fresh ", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err)
		o := answeredBy(t, reply, msg)
		require.NotEqual(t, victim, o)
		require.Equal(t, o, c.ordinal())
	}
}
