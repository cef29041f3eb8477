package cidroute

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/registry"
)

// startPlainEcho starts a backend without PPv2 that echoes
// "<ordinal>|payload" to the datagram's source.
func startPlainEcho(t testing.TB, ord uint8) *testecho.Echo {
	return testecho.Start(t, testecho.Config{Prefix: fmt.Sprintf("%d|", ord)})
}

func startTransparent(t testing.TB, n int, mod func(*Service)) (*testProxy, []*testecho.Echo) {
	var es []*testecho.Echo
	var bs []registry.Backend
	for i := range n {
		e := startPlainEcho(t, uint8(i))
		es = append(es, e)
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: e.Addr(), State: registry.Ready})
	}
	tp := startProxy(t, DTLS, bs, func(s *Service) {
		s.Transparent = true
		if mod != nil {
			mod(s)
		}
	})
	return tp, es
}

func TestTransparentRouting(t *testing.T) {
	tp, es := startTransparent(t, 3, nil)
	codec := tp.router().Codec()
	// New sessions spread by HRW, each client seen from its own source.
	used := map[int]bool{}
	for i := range 20 {
		c := newClient(t)
		ord := c.ask(tp.addr(), dtlsClientHello(byte(i)))
		require.NotEqual(t, -1, ord)
		used[ord] = true
		require.Equal(t, ord, c.ask(tp.addr(), dtlsClientHello(byte(i))), "a client's session keeps its backend")
	}
	assert.Len(t, used, 3)
	before := len(es[1].Senders())
	// A CID session from three client addresses: same backend, and the
	// backend sees a new source address each time, as RFC 9146 expects.
	cid := ordinalCID(t, codec, 1)
	for i := range 3 {
		c := newClient(t)
		require.Equal(t, 1, c.ask(tp.addr(), dtlsCIDRecord(cid, uint64(i), []byte("hi"))))
	}
	assert.Equal(t, before+3, len(es[1].Senders()))
	s := tp.quiet(t)
	assert.Equal(t, 23, s.Sessions)
	assert.Equal(t, uint64(43), s.Forward.Forwarded)
	assert.Equal(t, uint64(43), s.Reverse.Forwarded)
}

func TestTransparentLimits(t *testing.T) {
	tp, _ := startTransparent(t, 1, func(s *Service) {
		s.Workers = 1
		s.MaxSessions = 3
		s.SessionIdle = 1500 * time.Millisecond
	})
	var cs []*testClient
	for i := range 4 {
		c := newClient(t)
		cs = append(cs, c)
		want := 0
		if i == 3 {
			want = -1 // the table is full
		}
		require.Equal(t, want, c.ask(tp.addr(), dtlsClientHello(byte(i))))
	}
	s := tp.quiet(t)
	assert.Equal(t, 3, s.Sessions)
	assert.Equal(t, 3, s.MaxSessions, "full: what an alert compares Sessions with")
	assert.Equal(t, uint64(1), s.Forward.Dropped[SessionLimit])
	// Idle sessions expire, and the refused client gets in.
	require.Eventually(t, func() bool { return tp.stats().Sessions == 0 }, 5*time.Second, 20*time.Millisecond)
	require.Equal(t, 0, cs[3].ask(tp.addr(), dtlsClientHello(3)))
}

func TestTransparentRepliesOnlyFromBackend(t *testing.T) {
	tp, _ := startTransparent(t, 1, func(s *Service) { s.Workers = 1 })
	c := newClient(t)
	require.Equal(t, 0, c.ask(tp.addr(), dtlsClientHello(1)))
	// Find the session's upstream socket and aim a stranger at it.
	st := tp.p.services[0].workers[0].up.(*sessionTable)
	st.mu.Lock()
	var up netip.AddrPort
	for _, s := range st.table {
		up = s.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	st.mu.Unlock()
	require.True(t, up.IsValid())
	rogue := newClient(t)
	_, err := rogue.conn.WriteToUDPAddrPort([]byte("0|spoofed"), up)
	require.NoError(t, err)
	c.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, _, err = c.conn.ReadFromUDPAddrPort(make([]byte, 100))
	require.Error(t, err, "the connected upstream socket accepts only its backend")
	s := tp.quiet(t)
	assert.Equal(t, uint64(1), s.Reverse.Received)
}

func TestTransparentConfig(t *testing.T) {
	reg := newRegistry(t, 1)
	_, err := New(Config{Services: []Service{{Name: "a", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}, MaxSessions: 5}}})
	require.ErrorIs(t, err, ErrConfig, "session settings need transparent mode")
}

func TestTransparentDefaults(t *testing.T) {
	// Zero settings mean the documented defaults: idle sessions expire
	// after 2 minutes, and a worker's table holds what RLIMIT_NOFILE
	// leaves for sessions, at most DefaultMaxSessions.
	require.Equal(t, 2*time.Minute, DefaultSessionIdle)
	tp, _ := startTransparent(t, 1, nil)
	// A round trip, so that Run has started before the test's Close.
	require.Equal(t, 0, newClient(t).ask(tp.addr(), dtlsClientHello(1)))
	svcs := []Service{{Name: "svc", Workers: 2, RouterConfig: RouterConfig{Transparent: true}}}
	require.NoError(t, sizeSessions(svcs, 9216))
	want := svcs[0].MaxSessions
	require.Positive(t, want)
	require.LessOrEqual(t, want, DefaultMaxSessions)
	for _, w := range tp.p.services[0].workers {
		st := w.up.(*sessionTable)
		assert.Equal(t, want, st.max)
		assert.Equal(t, int64(DefaultSessionIdle), st.idle)
	}
}
