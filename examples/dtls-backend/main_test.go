package main

// The binary's own plumbing: flags, both modes, logs, stop on context.
// Sessions through cidproxy replicas are tested in examples/e2e.

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2"

	"github.com/cidroute/cidroute/internal/testtool"
)

// syncBuffer is a log sink shared by goroutines and the test.
type syncBuffer = testtool.SyncBuffer

// start runs the command with args until the test ends.
func start(t *testing.T, args ...string) (*dtlsecho.Server, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	srvc := make(chan *dtlsecho.Server, 1)
	code := make(chan int, 1)
	go func() { code <- run(ctx, context.Background(), args, logs, func(s *dtlsecho.Server) { srvc <- s }) }()
	var srv *dtlsecho.Server
	select {
	case srv = <-srvc:
	case c := <-code:
		t.Fatalf("exited %d: %s", c, logs)
	case <-time.After(10 * time.Second):
		t.Fatal("not started")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			require.Equal(t, 0, c, logs.String())
		case <-time.After(5 * time.Second):
			t.Error("did not stop")
		}
		require.Contains(t, logs.String(), "dtls-backend stopped")
	})
	return srv, logs
}

func echo(t *testing.T, srv *dtlsecho.Server, cfg *pion.Config, msg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c, err := pion.Client(udp, net.UDPAddrFromAddrPort(srv.Addr()), cfg)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.HandshakeContext(ctx))
	_, err = c.Write([]byte(msg))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestPSKMode(t *testing.T) {
	srv, logs := start(t, "-listen", "127.0.0.1:0", "-ordinal", "4", "-psk", "73656372", "-prefix", "b4: ")
	require.Equal(t, uint8(4), srv.Ordinal())
	got := echo(t, srv, dtlsecho.PSKClientConfig([]byte("secr"), "tester"), "hello")
	require.Equal(t, "b4: hello", got)
	out := logs.String()
	require.Contains(t, out, "ordinal=4 ordinal_from=flag")
	require.Contains(t, out, "mode=psk")
	require.Contains(t, out, `msg="session started"`)
	require.Contains(t, out, `proxy="none (direct)"`) // no proxy in front here
	require.Contains(t, out, "cipher_suite=TLS_PSK_WITH_AES_128_CCM_8")
}

func TestCertificateModeOrdinalFromHostname(t *testing.T) {
	t.Setenv("HOSTNAME", "ds-7")
	srv, logs := start(t, "-listen", "127.0.0.1:0")
	require.Equal(t, uint8(7), srv.Ordinal())
	cfg := &pion.Config{InsecureSkipVerify: true, ConnectionIDGenerator: pion.OnlySendCIDGenerator()}
	require.Equal(t, "ping", echo(t, srv, cfg, "ping"))
	require.Contains(t, logs.String(), "ordinal_from=\"HOSTNAME ds-7\"")
	require.Contains(t, logs.String(), "certificate (self-signed)")
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-ordinal", "255"},
		{"-ordinal", "1", "-listen", "nope"},
		{"-ordinal", "1", "-psk", "zz"},
		{"-ordinal", "1", "-trusted-proxies", "10.0.0.0/99"},
		{"-ordinal", "1", "-direct", "sometimes"},
		{"-ordinal", "1", "-log-level", "loud"},
		{"-ordinal", "1", "-drain-timeout", "-1s"},
		{"-ordinal", "1", "extra"},
		{"-bogus"},
		{"-ordinal", "1", "-cid-nonce-len", "6"},
		{"-ordinal", "1", "-cid-keys", "/nonexistent.json"},
	} {
		var out syncBuffer
		code := run(context.Background(), context.Background(), args, &out, nil)
		require.Equal(t, 2, code, "%q: %s", args, out.String())
		require.NotEmpty(t, strings.TrimSpace(out.String()))
	}
}

// runDrain starts the command, opens a session that stays open, then asks
// for a drain (SIGTERM) and, with kill, a hard stop (a second signal); it
// returns the logs and how the session ended on the client.
func runDrain(t *testing.T, kill bool, args ...string) (string, error) {
	t.Helper()
	drain, startDrain := context.WithCancel(context.Background())
	hard, stopNow := context.WithCancel(context.Background())
	defer stopNow()
	logs := &syncBuffer{}
	srvc := make(chan *dtlsecho.Server, 1)
	code := make(chan int, 1)
	go func() { code <- run(drain, hard, args, logs, func(s *dtlsecho.Server) { srvc <- s }) }()
	srv := <-srvc
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c, err := pion.Client(udp, net.UDPAddrFromAddrPort(srv.Addr()), dtlsecho.PSKClientConfig([]byte("secr"), "tester"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.HandshakeContext(ctx))
	_, err = c.Write([]byte("hi"))
	require.NoError(t, err)
	_, err = c.Read(make([]byte, 64))
	require.NoError(t, err)

	startDrain()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "dtls-backend draining") }, 5*time.Second, time.Millisecond)
	if kill {
		stopNow()
	}
	select {
	case got := <-code:
		require.Equal(t, 0, got, logs.String())
	case <-time.After(5 * time.Second):
		t.Fatalf("did not stop: %s", logs)
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 64))
	return logs.String(), err
}

// SIGTERM drains: the open session is served until -drain-timeout, then
// closed with close_notify and counted.
func TestDrainOnSignal(t *testing.T) {
	start := time.Now()
	out, err := runDrain(t, false, "-listen", "127.0.0.1:0", "-ordinal", "1", "-psk", "73656372", "-drain-timeout", "300ms")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "served until the drain timeout")
	require.ErrorIs(t, err, io.EOF, "close_notify")
	require.Contains(t, out, "drain_timeout=300ms")
	require.Contains(t, out, "open=1")
	require.Contains(t, out, `msg="dtls-backend drained" ended=0 cut=1`)
	require.Contains(t, out, `reason="cut at the drain deadline"`)
	require.Contains(t, out, "dtls-backend stopped")
}

// A second signal cuts the open sessions at once, long before the drain
// timeout.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	out, err := runDrain(t, true, "-listen", "127.0.0.1:0", "-ordinal", "1", "-psk", "73656372", "-drain-timeout", "1h")
	require.ErrorIs(t, err, io.EOF)
	require.Contains(t, out, `msg="dtls-backend drained" ended=0 cut=1`)
}

// A proxied datagram from a sender outside -trusted-proxies is dropped and
// said in the log, with the sender and the trusted list: otherwise the
// client would see only a handshake timeout.
func TestUntrustedProxyLogged(t *testing.T) {
	srv, logs := start(t, "-listen", "127.0.0.1:0", "-ordinal", "1", "-psk", "73656372", "-trusted-proxies", "192.0.2.1")
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer udp.Close()
	hdr, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy,
		Src: netip.MustParseAddrPort("198.51.100.7:40001"), Dst: netip.MustParseAddrPort("192.0.2.10:5684")})
	require.NoError(t, err)
	_, err = udp.WriteToUDPAddrPort(append(hdr, "hello"...), srv.Addr())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "outside the trusted proxies") }, 5*time.Second, time.Millisecond)
	out := logs.String()
	require.Contains(t, out, "level=WARN")
	require.Contains(t, out, "sender="+udp.LocalAddr().String())
	require.Contains(t, out, "trusted_proxies=[192.0.2.1/32]")
	st, _ := srv.Stats()
	require.Equal(t, uint64(1), st.DroppedUntrusted)
}
