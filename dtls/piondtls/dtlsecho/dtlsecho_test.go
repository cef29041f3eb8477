package dtlsecho

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/shutdown"
)

// syncBuffer is a log sink shared by goroutines and the test.
type syncBuffer = testtool.SyncBuffer

// A direct client (no proxy): echo, the Observe hook, the session record,
// and the end of an idle session.
func TestEchoAndIdle(t *testing.T) {
	var logs syncBuffer
	var seen []Message
	var mu sync.Mutex
	srv, err := Listen(Config{Ordinal: 3, PSK: []byte("k"), Prefix: "3|", IdleTimeout: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Observe: func(m Message) {
			mu.Lock()
			seen = append(seen, Message{Session: m.Session, From: m.From, Data: bytes.Clone(m.Data)})
			mu.Unlock()
		}})
	require.NoError(t, err)
	defer srv.Close()

	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c, err := pion.Client(udp, net.UDPAddrFromAddrPort(srv.Addr()), PSKClientConfig([]byte("k"), "t"))
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.HandshakeContext(ctx))
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "3|ping", string(buf[:n]))

	mu.Lock()
	require.Len(t, seen, 1)
	require.Equal(t, "ping", string(seen[0].Data))
	require.Equal(t, udp.LocalAddr().(*net.UDPAddr).AddrPort(), seen[0].From.Client)
	require.False(t, seen[0].From.Proxied())
	mu.Unlock()

	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "reason=idle") }, 5*time.Second, 20*time.Millisecond)
	ss := srv.Sessions()
	require.Len(t, ss, 1)
	require.False(t, ss[0].Open)
	require.Equal(t, 1, ss[0].Messages)
}

// What package shutdown drains: the server, and pion's listener itself.
var (
	_ shutdown.Drainer = (*Server)(nil)
	_ shutdown.Drainer = (*piondtls.Listener)(nil)
)
