package quicgo_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo"
)

// Drain: the listener closes (new handshakes fail) while the transport and
// the accepted connections run on; a connection that ends within the grace
// period loses nothing; one still open at the deadline is closed with
// CONNECTION_CLOSE and counted.
func TestDrain(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stc, ctc := tlsPair(t)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies(), Protocol: backend.QUIC})
	require.NoError(t, err)
	gen, err := quicgo.NewGenerator(nil, 0)
	require.NoError(t, err)
	tr := &quic.Transport{Conn: bc, ConnectionIDGenerator: gen}
	ln, err := quicgo.Listen(tr, stc, &quic.Config{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			wg.Go(func() {
				for {
					st, err := c.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() { io.Copy(st, st); st.Close() }()
				}
			})
		}
	})
	defer func() { tr.Close(); wg.Wait(); bc.Close() }()

	srv := net.UDPAddrFromAddrPort(bc.LocalAddr().(*net.UDPAddr).AddrPort())
	dial := func(hs time.Duration) (*quic.Conn, error) {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		ctr := &quic.Transport{Conn: plainConn{u}}
		t.Cleanup(func() { ctr.Close() })
		return ctr.Dial(ctx, srv, ctc, &quic.Config{HandshakeIdleTimeout: hs})
	}
	short, err := dial(5 * time.Second)
	require.NoError(t, err)
	long, err := dial(5 * time.Second)
	require.NoError(t, err)
	for _, c := range []*quic.Conn{short, long} {
		require.NoError(t, echoStream(ctx, c, []byte("before")))
	}
	require.Eventually(t, func() bool { return ln.Conns() == 2 }, 5*time.Second, time.Millisecond)

	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	defer dcancel()
	cut := make(chan int, 1)
	go func() { cut <- ln.Drain(dctx, 0x11, "draining") }()

	// Refused: a new connection does not come up.
	require.Eventually(t, func() bool {
		_, err := dial(300 * time.Millisecond)
		return err != nil
	}, 5*time.Second, 10*time.Millisecond, "a new connection on a draining backend")

	// Served on: both, until one ends.
	for range 3 {
		require.NoError(t, echoStream(ctx, short, []byte("draining")))
		require.NoError(t, echoStream(ctx, long, []byte("draining")))
	}
	require.NoError(t, short.CloseWithError(0, "done"))

	assert.Equal(t, 1, <-cut)
	assert.Equal(t, uint64(1), ln.Cut())
	select {
	case <-long.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection left at the deadline was not closed")
	}
	var app *quic.ApplicationError
	require.True(t, errors.As(context.Cause(long.Context()), &app), "%v", context.Cause(long.Context()))
	assert.True(t, app.Remote)
	assert.Equal(t, quic.ApplicationErrorCode(0x11), app.ErrorCode)
	assert.Equal(t, "draining", app.ErrorMessage)
}

// Drain returns at once when no connection is open.
func TestDrainIdle(t *testing.T) {
	stc, _ := tlsPair(t)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	ln, err := quicgo.Listen(tr, stc, nil)
	require.NoError(t, err)
	start := time.Now()
	assert.Zero(t, ln.Drain(context.Background(), 0, ""))
	assert.Less(t, time.Since(start), time.Second)
	_, err = ln.Accept(context.Background())
	assert.ErrorIs(t, err, quic.ErrServerClosed)
}
