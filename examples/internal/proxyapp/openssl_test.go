package proxyapp

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/examples/internal/dtlsecho"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// TestOpenSSLThroughCidproxy: OpenSSL's DTLS 1.2 client completes a PSK
// handshake through the cidproxy program (its JSON config, serve) to the
// pion/dtls v3 backend of examples/dtls-backend, which accepts no direct
// ClientHello, and gets its line echoed. The backend sees the client the
// proxy claims and the proxy it measured, apart. (examples/e2e's
// TestOpenSSLThroughProxy checks the fe ff record version of the first
// ClientHello and the HRW choice over replicas.)
func TestOpenSSLThroughCidproxy(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	psk := []byte("cidproxy-openssl")
	var backendLogs syncBuffer
	srv, err := dtlsecho.Listen(dtlsecho.Config{
		PSK:            psk,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Direct:         backend.DirectNoHandshake,
		Prefix:         "0|",
		Logger:         slog.New(slog.NewTextHandler(&backendLogs, nil)),
	})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t, "udp"))
	cfg, err := parseConfig(strings.NewReader(fmt.Sprintf(`{"hrw_seed": 5, "services": [
		{"name": "coaps", "protocol": "dtls", "listen": "%v", "workers": 1,
		 "backends": [{"ordinal": 0, "address": "%v"}]}]}`, listen, srv.Addr())))
	require.NoError(t, err)
	var logs syncBuffer
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, slog.LevelInfo, errWindow), Options{}) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		if t.Failed() {
			t.Logf("cidproxy log:\n%s\nbackend log:\n%s", logs.String(), backendLogs.String())
		}
	})
	// s_client resends its ClientHello until the proxy's socket is up.
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-dtls1_2", "-quiet",
		"-connect", listen.String(),
		"-psk", hex.EncodeToString(psk), "-psk_identity", "openssl",
		"-cipher", "PSK-AES128-CCM8")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// s_client reads stdin only once the handshake is done.
	_, err = stdin.Write([]byte("hello from openssl\n"))
	require.NoError(t, err)
	select {
	case reply := <-lines:
		assert.Equal(t, "0|hello from openssl", reply)
	case <-ctx.Done():
		t.Fatalf("no echo; s_client said: %s", stderr.String())
	}

	ss := srv.Sessions()
	require.Len(t, ss, 1)
	s := ss[0]
	assert.True(t, s.First.Proxied(), "came through cidproxy")
	assert.Equal(t, listen, s.First.Service, "PPv2 destination: the service address")
	assert.NotEqual(t, s.First.Client, s.First.Proxy, "claimed client and measured proxy apart")
	st, _ := srv.Stats()
	assert.Zero(t, st.AcceptedDirect)
	assert.Contains(t, backendLogs.String(),
		fmt.Sprintf(`msg="session started" ordinal=0 session=1 client=%v proxy=%v service=%v cipher_suite=TLS_PSK_WITH_AES_128_CCM_8`, s.First.Client, s.First.Proxy, listen))
}
