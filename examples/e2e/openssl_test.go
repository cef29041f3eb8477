package e2e

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/internal/testtool"
)

// relay stands between a client and a replica and keeps the client's
// datagrams, so the test can look at what the client sent. Towards the
// replica it is one client address: out.
type relay struct {
	in, out *net.UDPConn
	mu      sync.Mutex
	sent    [][]byte
	client  netip.AddrPort
}

func startRelay(t *testing.T, to netip.AddrPort) *relay {
	t.Helper()
	in, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	out, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	r := &relay{in: in, out: out}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := in.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.sent = append(r.sent, append([]byte(nil), buf[:n]...))
			r.client = from
			r.mu.Unlock()
			out.WriteToUDPAddrPort(buf[:n], to)
		}
	})
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, err := out.Read(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			c := r.client
			r.mu.Unlock()
			in.WriteToUDPAddrPort(buf[:n], c)
		}
	})
	t.Cleanup(func() { in.Close(); out.Close(); wg.Wait() })
	return r
}

func (r *relay) first() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) == 0 {
		return nil
	}
	return r.sent[0]
}

// TestOpenSSLThroughProxy: OpenSSL's DTLS 1.2 client, which knows no
// connection IDs and opens with a ClientHello in a DTLS 1.0 (fe ff)
// record, completes a PSK handshake through a replica with a pion backend
// (routed by HRW on its address) and gets its line echoed.
func TestOpenSSLThroughProxy(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	logs := &syncBuffer{}
	srvs, bs := dtlsBackends(t, 3, logs)
	rs := startReplicas(t, 2, cidroute.DTLS, bs)
	rl := startRelay(t, rs[0].addr)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// What s_client sends after the handshake is one application record,
	// echoed by the backend.
	reply := sClient(t, ctx, openssl, rl.in.LocalAddr().(*net.UDPAddr).AddrPort(), "hello from openssl")
	ord, msg, ok := strings.Cut(reply, "|")
	require.True(t, ok, "reply %q", reply)
	assert.Equal(t, "hello from openssl", msg)

	// Its first ClientHello went out in a DTLS 1.0 record.
	first := rl.first()
	rec, _, err := dtls.ParseRecord(first, cidroute.DefaultDTLSCIDLen)
	require.NoError(t, err)
	assert.Equal(t, dtls.VersionDTLS10, rec.Version, "record version fe ff")
	cl, err := dtls.Classify(first, cidroute.DefaultDTLSCIDLen)
	require.NoError(t, err)
	assert.True(t, cl.ClientHello)

	// No CID: the replica chose the backend by HRW over the client address
	// (the relay's) and the public address.
	client := rl.out.LocalAddr().(*net.UDPAddr).AddrPort()
	want, ok := rs[0].reg.Snapshot().PickNewAddrs(client, public)
	require.True(t, ok)
	assert.Equal(t, want.Ordinal, uint8(ord[0]-'0'), "HRW choice")
	ss := srvs[want.Ordinal].Sessions()
	require.Len(t, ss, 1)
	assert.Equal(t, client, ss[0].First.Client, "claimed client")
	assert.Same(t, rs[0], replicaOf(rs, ss[0].First.Proxy), "measured proxy")
	assert.Contains(t, logs.String(), "cipher_suite=TLS_PSK_WITH_AES_128_CCM_8")
}

// sClient runs OpenSSL's DTLS 1.2 PSK client against addr, writes line once
// the handshake is done and returns the first line it prints.
func sClient(t *testing.T, ctx context.Context, openssl string, addr netip.AddrPort, line string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-dtls1_2", "-quiet",
		"-connect", addr.String(),
		"-psk", hex.EncodeToString(testPSK), "-psk_identity", "openssl",
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
	_, err = io.WriteString(stdin, line+"\n")
	require.NoError(t, err)
	select {
	case reply := <-lines:
		return reply
	case <-ctx.Done():
		t.Fatalf("no echo; s_client said: %s", stderr.String())
		return ""
	}
}

// TestOpenSSLThroughCidproxy: the same client through the cidproxy program
// itself (its JSON configuration, proxyapp.Run) rather than a bare
// Pipeline, to a pion backend that refuses direct ClientHellos. The backend
// logs the client address the proxy claims and the proxy address it
// measured, apart.
func TestOpenSSLThroughCidproxy(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	logs := &syncBuffer{}
	srv := dtlsBackend(t, 0, logs)
	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testtool.FreePort(t, "udp"))
	cfg := filepath.Join(t.TempDir(), "cidproxy.json")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `{"hrw_seed": %d, "services": [
		{"name": "coaps", "protocol": "dtls", "listen": "%v", "workers": 1,
		 "backends": [{"ordinal": 0, "address": "%v"}]}]}`, hrwSeed, listen, srv.Addr()), 0o600))

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var proxyLogs syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- proxyapp.Run(ctx, []string{"-config", cfg}, io.Discard, &proxyLogs, proxyapp.Options{})
	}()
	t.Cleanup(func() {
		cancel()
		assert.Equal(t, 0, <-code, "cidproxy exit code")
		if t.Failed() {
			t.Logf("cidproxy log:\n%s\nbackend log:\n%s", proxyLogs.String(), logs.String())
		}
	})

	// s_client resends a ClientHello that got no answer, but gives up on
	// one refused by ICMP (write:errno=111): start it once the socket is up.
	require.Eventually(t, func() bool { return strings.Contains(proxyLogs.String(), "service started") },
		10*time.Second, 10*time.Millisecond, "cidproxy did not start")
	assert.Equal(t, "0|hello via cidproxy", sClient(t, ctx, openssl, listen, "hello via cidproxy"))
	ss := srv.Sessions()
	require.Len(t, ss, 1)
	s := ss[0]
	assert.True(t, s.First.Proxied(), "came through cidproxy")
	assert.Equal(t, listen, s.First.Service, "PPv2 destination: the service address")
	assert.NotEqual(t, s.First.Client, s.First.Proxy)
	st, _ := srv.Stats()
	assert.Zero(t, st.AcceptedDirect)
	assert.Contains(t, logs.String(), fmt.Sprintf(`msg="session started" ordinal=0 session=1 client=%v proxy=%v service=%v cipher_suite=TLS_PSK_WITH_AES_128_CCM_8`,
		s.First.Client, s.First.Proxy, listen))
}
