package main

// The binary's own plumbing: flags, logs, stop on context. Connections
// through cidproxy replicas are tested in examples/e2e.

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/quic/quicgo/quicecho"

	"github.com/cidroute/cidroute/internal/testtool"
)

// syncBuffer is a log sink shared by goroutines and the test.
type syncBuffer = testtool.SyncBuffer

// start runs the program with args until ctx is done; code gets its exit
// code.
func start(t *testing.T, ctx context.Context, args ...string) (srv *quicecho.Server, code chan int, logs *syncBuffer) {
	t.Helper()
	logs = &syncBuffer{}
	srvc := make(chan *quicecho.Server, 1)
	code = make(chan int, 1)
	go func() { code <- run(ctx, context.Background(), args, logs, func(s *quicecho.Server) { srvc <- s }) }()
	select {
	case srv = <-srvc:
	case c := <-code:
		t.Fatalf("exited %d: %s", c, logs)
	case <-time.After(10 * time.Second):
		t.Fatal("not started")
	}
	return srv, code, logs
}

func TestEchoDirect(t *testing.T) {
	t.Setenv("HOSTNAME", "qs-3")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, code, logs := start(t, ctx, "-listen", "127.0.0.1:0", "-alpn", "echo-test")
	require.Equal(t, uint8(3), srv.Ordinal())

	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	conn, err := tr.Dial(dctx, net.UDPAddrFromAddrPort(srv.Addr()),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"echo-test"}}, &quic.Config{})
	require.NoError(t, err)
	s, err := conn.OpenStreamSync(dctx)
	require.NoError(t, err)
	_, err = s.Write([]byte("hello quic"))
	require.NoError(t, err)
	got := make([]byte, len("hello quic"))
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	require.Equal(t, "hello quic", string(got))
	require.NoError(t, conn.CloseWithError(0, "bye"))

	cancel()
	select {
	case c := <-code:
		require.Equal(t, 0, c, logs.String())
	case <-time.After(5 * time.Second):
		t.Fatal("did not stop")
	}
	out := logs.String()
	require.Contains(t, out, `ordinal_from="HOSTNAME qs-3"`)
	require.Contains(t, out, `msg="connection started"`)
	require.Contains(t, out, "alpn=echo-test")
	require.Contains(t, out, `proxy="none (direct)"`)
	require.Contains(t, out, "quic-backend stopped")
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-ordinal", "300"},
		{"-ordinal", "1", "-listen", "nope"},
		{"-ordinal", "1", "-alpn", ","},
		{"-ordinal", "1", "-trusted-proxies", "x"},
		{"-ordinal", "1", "-direct", "x"},
		{"-ordinal", "1", "-cert", "/nonexistent.pem"},
		{"-ordinal", "1", "extra"},
		{"-ordinal", "1", "-cid-nonce-len", "10"},
		{"-ordinal", "1", "-cid-keys", "/nonexistent.json"},
		{"-ordinal", "1", "-cid-keys", "/nonexistent.json", "-cid-len", "12", "-cid-nonce-len", "4"},
	} {
		var out syncBuffer
		c := run(context.Background(), context.Background(), args, &out, nil)
		require.Equal(t, 2, c, "%q: %s", args, out.String())
		require.NotEmpty(t, strings.TrimSpace(out.String()))
	}
	// A CID length the codec refuses fails at start.
	var out syncBuffer
	require.Equal(t, 1, run(context.Background(), context.Background(), []string{"-ordinal", "1", "-listen", "127.0.0.1:0", "-cid-len", "3"}, &out, nil), out.String())
}

// SIGTERM drains: the open connection is served until -drain-timeout,
// then closed with CONNECTION_CLOSE and counted; a second signal cuts at
// once.
func TestDrainOnSignal(t *testing.T) {
	for _, kill := range []bool{false, true} {
		drain, startDrain := context.WithCancel(context.Background())
		hard, stopNow := context.WithCancel(context.Background())
		logs := &syncBuffer{}
		srvc := make(chan *quicecho.Server, 1)
		code := make(chan int, 1)
		timeout := "300ms"
		if kill {
			timeout = "1h"
		}
		go func() {
			code <- run(drain, hard, []string{"-listen", "127.0.0.1:0", "-ordinal", "2", "-drain-timeout", timeout}, logs, func(s *quicecho.Server) { srvc <- s })
		}()
		srv := <-srvc
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		tr := &quic.Transport{Conn: udp}
		conn, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(srv.Addr()),
			&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return srv.Open() == 1 }, 5*time.Second, time.Millisecond)

		start := time.Now()
		startDrain()
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "quic-backend draining") }, 5*time.Second, time.Millisecond)
		if kill {
			stopNow()
		}
		select {
		case c := <-code:
			require.Equal(t, 0, c, logs.String())
		case <-time.After(5 * time.Second):
			t.Fatalf("did not stop: %s", logs)
		}
		if !kill {
			require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "served until the drain timeout")
		}
		<-conn.Context().Done()
		var app *quic.ApplicationError
		require.ErrorAs(t, context.Cause(conn.Context()), &app)
		require.Equal(t, "server draining", app.ErrorMessage)
		out := logs.String()
		require.Contains(t, out, "open=1")
		require.Contains(t, out, `msg="quic-backend drained" ended=0 cut=1`)
		require.Contains(t, out, `reason="cut at the drain deadline"`)
		tr.Close()
		cancel()
		stopNow()
	}
}
