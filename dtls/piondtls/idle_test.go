package piondtls

import (
	"context"
	"net"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// SessionIdle: a session silent for longer is closed (the server's Read
// fails, its demultiplexer entries and route go, it is counted), while
// one that keeps talking lives on.
func TestSessionIdle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	ln, err := ListenConfig(bc, Config{SessionIdle: time.Second}, cfg)
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)
	to := bc.LocalAddr().(*net.UDPAddr).AddrPort()
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
	ln.pl.mu.Lock()
	ncid, nclient := len(ln.pl.byCID), len(ln.pl.byClient)
	ln.pl.mu.Unlock()
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
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	ln, err := ListenConfig(bc, Config{MaxSessions: 1}, cfg)
	require.NoError(t, err)
	e := serveEcho(t, ln, bc)
	to := bc.LocalAddr().(*net.UDPAddr).AddrPort()
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
