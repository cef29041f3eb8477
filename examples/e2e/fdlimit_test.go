package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/internal/testtool"
)

// TestTransparentTableFullUnderFDLimit (issue 15 #3) runs the cidproxy
// program in transparent mode under `prlimit --nofile=256` and floods it
// from 400 client addresses, more sessions than descriptors. The session
// table, sized from RLIMIT_NOFILE, fills and refuses the rest
// (session_limit), and the process keeps descriptors for everything else:
// /metrics answers and a rewritten backends_file is reloaded while the
// table is full. A max_sessions that cannot fit the limit is refused at
// start.
func TestTransparentTableFullUnderFDLimit(t *testing.T) {
	prlimit := testtool.Look(t, "util-linux", "prlimit")
	bin := filepath.Join(t.TempDir(), "cidproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cidproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	backends := filepath.Join(dir, "backends.json")
	writeBackends := func(addrs ...netip.AddrPort) {
		var list []string
		for i, a := range addrs {
			list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": %q}`, i, a))
		}
		require.NoError(t, os.WriteFile(backends+".tmp", []byte("["+strings.Join(list, ",")+"]"), 0o644))
		require.NoError(t, os.Rename(backends+".tmp", backends))
	}
	echo := testecho.Plain(t)
	writeBackends(echo)
	listen := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testtool.FreePort(t, "udp"))
	metrics := fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))
	config := func(extra string) string {
		path := filepath.Join(dir, "cidproxy.json")
		require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`{"metrics_listen": %q, "services": [
			{"name": "t", "protocol": "dtls", "listen": %q, "workers": 1, "proxy_protocol": false,
			 "backends_file": "backends.json"%s}]}`, metrics, listen, extra)), 0o644))
		return path
	}
	const nofile = "--nofile=256:256"

	// A table that cannot fit is refused at start.
	refuse, stop := context.WithTimeout(context.Background(), 15*time.Second)
	out, err := exec.CommandContext(refuse, prlimit, nofile, bin, "-config", config(`, "max_sessions": 1000`)).CombinedOutput()
	started := refuse.Err() != nil // still running when the timeout killed it
	stop()
	require.False(t, started, "max_sessions 1000 under 256 descriptors was accepted: %s", out)
	require.Error(t, err)
	assert.Contains(t, string(out), "RLIMIT_NOFILE")

	var logs testtool.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, prlimit, nofile, bin, "-config", config(""))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("cidproxy log:\n%s", logs.String())
		}
	})
	scrape := func() (map[string]float64, error) {
		// A new connection each time: the proxy must still accept one.
		c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + metrics + "/metrics")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return testtool.ParseMetrics(resp.Body)
	}
	require.Eventually(t, func() bool { _, err := scrape(); return err == nil }, 20*time.Second, 50*time.Millisecond, "metrics up")

	const (
		sessions    = `cidroute_sessions{service="t"}`
		full        = `cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="session_limit",service="t"}`
		received    = `cidroute_datagrams_received_total{direction="forward",path="socket",service="t"}`
		forwarded   = `cidroute_datagrams_total{direction="forward",outcome="forwarded",path="socket",reason="",service="t"}`
		ready       = `cidroute_registry_backends{service="t",state="ready"}`
		replyErrors = `cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="send_error",service="t"}`
	)
	hello, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte{0xfe, 0xfd})})
	require.NoError(t, err)
	// 400 client addresses, one ClientHello each, 20 at a time: a burst
	// larger than the socket's receive buffer would be dropped by the
	// kernel before the proxy counts it, on a busy machine.
	var m map[string]float64
	var last error
	for sent := 0; sent < 400; {
		for range 20 {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			defer c.Close()
			_, err = c.WriteToUDPAddrPort(hello, listen)
			require.NoError(t, err)
			sent++
		}
		ok := assert.Eventually(t, func() bool {
			m, last = scrape()
			return last == nil && m[received] == float64(sent)
		}, 20*time.Second, 20*time.Millisecond, "%d datagrams counted", sent)
		if !ok {
			t.Fatalf("last scrape: %v, %v", last, m)
		}
	}
	t.Logf("table %v sessions, %v session_limit drops, %v forwarded, %v send errors", m[sessions], m[full], m[forwarded], m[replyErrors])
	require.Positive(t, m[full], "the table filled and refused the rest")
	require.Less(t, m[sessions], 256.0, "the table stops well short of the descriptor limit")
	require.Equal(t, m[received], m[forwarded]+m[full]+m[replyErrors], "every datagram counted once")
	require.Zero(t, m[replyErrors], "no descriptor ran out")

	// With the table full, /metrics keeps answering and the backends file
	// is read again.
	for range 20 {
		_, err := scrape()
		require.NoError(t, err)
	}
	writeBackends(echo, testecho.Plain(t))
	require.Eventually(t, func() bool { m, err = scrape(); return err == nil && m[ready] == 2 }, 10*time.Second, 50*time.Millisecond,
		"the rewritten backends file is reloaded with the table full")
	require.Equal(t, 0, strings.Count(logs.String(), "too many open files"), logs.String())
}
