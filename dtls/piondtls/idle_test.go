package piondtls

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// SessionIdle: a session silent for longer is closed (the server's Read
// fails, its demultiplexer entries and route go, it is counted), while
// one that keeps talking lives on.
func TestSessionIdle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, to := startCIDEcho(t, Config{SessionIdle: time.Second})
	quiet := dial(t, ctx, newSwitchConn(t, to))
	chatty := dial(t, ctx, newSwitchConn(t, to))
	assert.Equal(t, "0|q", ask(t, quiet, "q"))
	assert.Equal(t, "0|c", ask(t, chatty, "c"))
	require.Equal(t, 2, e.ln.Stats().Sessions)

	// chatty talks every 250 ms for 3 s; quiet says nothing.
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		assert.Equal(t, "0|again", ask(t, chatty, "again"))
		time.Sleep(250 * time.Millisecond)
	}
	st := e.ln.Stats()
	assert.Equal(t, uint64(1), st.IdleClosed, "the quiet session, and only it")
	assert.Equal(t, 1, st.Sessions)
	e.ln.pl.mu.Lock()
	ncid, nclient := len(e.ln.pl.byCID), len(e.ln.pl.byClient)
	e.ln.pl.mu.Unlock()
	assert.Equal(t, 1, ncid, "the quiet session's CID is forgotten")
	assert.Equal(t, 1, nclient)

	// The quiet client's next record reaches no session: its server-side
	// pion.Conn is closed (close_notify on the way out, which the client
	// may or may not have read), so it gets no echo.
	require.NoError(t, quiet.SetReadDeadline(time.Now().Add(500*time.Millisecond)))
	_, _ = quiet.Write([]byte("late"))
	buf := make([]byte, 100)
	n, err := quiet.Read(buf)
	assert.Error(t, err, "no echo after the idle close: got %q", buf[:n])
}

// MaxSessions: a ClientHello past the bound is dropped and counted; the
// sessions already open are served.
func TestMaxSessions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, to := startCIDEcho(t, Config{MaxSessions: 1})
	first := dial(t, ctx, newSwitchConn(t, to))
	assert.Equal(t, "0|a", ask(t, first, "a"))

	sc := newSwitchConn(t, to)
	ccfg := pskConfig()
	ccfg.PSKIdentityHint = []byte("client")
	second, err := pion.Client(sc, sc.remote, ccfg)
	require.NoError(t, err)
	defer second.Close()
	hctx, hcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer hcancel()
	require.Error(t, second.HandshakeContext(hctx), "a session past MaxSessions")
	assert.NotZero(t, e.ln.Stats().DroppedFull)
	assert.Equal(t, uint64(1), e.ln.Stats().NewSessions)
	assert.Equal(t, "0|b", ask(t, first, "b"))
}

func TestIdleConfigErrors(t *testing.T) {
	bc := newBackendConn(t, nil)
	defer bc.Close()
	for want, cfg := range map[string]Config{
		"SessionIdle 500ms: want 0 (never) or 1s to 744h0m0s":    {SessionIdle: 500 * time.Millisecond},
		"SessionIdle 744h0m1s: want 0 (never) or 1s to 744h0m0s": {SessionIdle: MaxIdle + time.Second},
		"SessionIdle -1s": {SessionIdle: -time.Second},
		"MaxSessions -1":  {MaxSessions: -1},
	} {
		_, err := NewPacketListener(bc, cfg)
		assert.ErrorIs(t, err, ErrConfig, want)
		if err != nil {
			assert.Contains(t, err.Error(), want)
		}
		_, err = ListenConfig(bc, cfg, pskConfig())
		assert.ErrorIs(t, err, ErrConfig, want)
	}
	pl, err := NewPacketListener(bc, Config{SessionIdle: MaxIdle, MaxSessions: 10})
	require.NoError(t, err, "the limits themselves")
	pl.Close()
}

// Transparent mode's idle expiry is a NAT rebinding to the backend: a CID
// session silent past the proxy's SessionIdle loses its upstream socket,
// and its next record opens a new one, from a new port, which pion
// authenticates by the CID and moves the session to. No handshake, no
// loss beyond the first reply (see docs/backends.md, "Known pion issue").
func TestTransparentExpiryIsARebinding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{Protocol: backend.DTLS}) // no PPv2: every datagram direct
	require.NoError(t, err)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	ln, err := ListenConfig(bc, Config{SessionIdle: time.Hour}, cfg)
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)
	px := cidroutetest.Start(t, 42, cidroute.Service{
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: publicAddr, Transparent: true},
		SessionIdle:  time.Second,
	}, registry.Backend{Ordinal: 0, Addr: bc.LocalAddr().(*net.UDPAddr).AddrPort()})
	c := dial(t, ctx, newSwitchConn(t, px.Addr))
	assert.Equal(t, "0|before", ask(t, c, "before"))
	sessions := func() int { return px.Pipeline.Stats()[0].Sessions }
	require.Equal(t, 1, sessions())
	first := routeOf(t, ln)

	require.Eventually(t, func() bool { return sessions() == 0 }, 10*time.Second, 50*time.Millisecond, "the transparent session expires")
	assert.Equal(t, "0|after", ask(t, c, "after"))
	assert.Equal(t, 1, sessions(), "a new upstream socket")
	second := routeOf(t, ln)
	assert.NotEqual(t, first.Port(), second.Port(), "the backend sees a new source port")
	st := e.ln.Stats()
	assert.Equal(t, uint64(1), st.NewSessions, "the same DTLS session, no new handshake")
	assert.Equal(t, 1, st.Sessions)
}

// routeOf returns the client address the listener's only session is keyed
// by (in transparent mode, the proxy's upstream socket).
func routeOf(t *testing.T, ln *Listener) netip.AddrPort {
	t.Helper()
	ln.pl.mu.Lock()
	defer ln.pl.mu.Unlock()
	require.Len(t, ln.pl.byClient, 1)
	for a := range ln.pl.byClient {
		return a
	}
	return netip.AddrPort{}
}
