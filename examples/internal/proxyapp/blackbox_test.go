package proxyapp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cidroute/cidroute/dtls"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/internal/testtool"
)

// TestBinary builds cidproxy, runs it from a config file in front of three
// PPv2 echo backends, sends DTLS-shaped traffic, reads /metrics and stops
// it with SIGTERM.
func TestBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "cidproxy")
	build := exec.Command("go", "build", "-o", bin, "../../cidproxy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	var backends []*testecho.Echo
	var list []string
	for ord := range 3 {
		b := testecho.Start(t, testecho.Config{PPv2: true})
		backends = append(backends, b)
		state := "ready"
		if ord == 2 {
			state = "draining" // keeps its CID sessions, gets no ClientHellos
		}
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": "%v", "state": "%s"}`, ord, b.Addr(), state))
	}
	// A second service reads its backends from a file, to show the file
	// source in the registry gauges.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "quic-backends.json"), []byte(`[{"ordinal": 0, "address": "127.0.0.1:9"}]`), 0o644))
	// A third service in transparent mode, in front of a plain echo, shows
	// its session gauge.
	plainEcho := testecho.Plain(t)
	service := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t, "udp"))
	plain := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t, "udp"))
	quicPort := freePort(t, "udp")
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	pprofAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	cfg := fmt.Sprintf(`{
  "hrw_seed": 99,
  "metrics_listen": %q,
  "pprof_listen": %q,
  "services": [
    {"name": "coaps", "protocol": "dtls", "listen": "%v", "workers": 2, "backends": [%s]},
    {"name": "h3", "protocol": "quic", "listen": "127.0.0.1:%d", "workers": 1, "backends_file": "quic-backends.json", "max_registry_age": "1h"},
    {"name": "plain", "protocol": "dtls", "listen": "%v", "workers": 1, "proxy_protocol": false, "backends": [{"ordinal": 0, "address": "%v"}]}
  ]
}`, metrics, pprofAddr, service, strings.Join(list, ", "), quicPort, plain, plainEcho)
	cfgPath := filepath.Join(dir, "cidproxy.json")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))

	out, err := exec.Command(bin, "-check", "-config", cfgPath).CombinedOutput()
	require.NoError(t, err, "%s", out)

	var logs syncBuffer
	cmd := exec.Command(bin, "-config", cfgPath)
	cmd.Stderr = &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("cidproxy log:\n%s", logs.String())
		}
	}()

	scrape := func() map[string]float64 {
		t.Helper()
		resp, err := http.Get("http://" + metrics + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return parseMetrics(t, resp.Body)
	}
	// Ready once the metrics listener answers and the file source loaded.
	waitFor(t, 10*time.Second, "metrics and backends", func() bool {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return false
		}
		m := parseMetrics(t, resp.Body)
		resp.Body.Close()
		return m[`cidroute_registry_backends{service="h3",state="ready"}`] == 1
	})

	// Traffic: ClientHellos (HRW) and CID records of every ordinal, each
	// from a fresh source port; echoes must come back from the service.
	const rounds = 5
	cidCodec := dtls.OrdinalFirst{Length: 8}
	sent, echoed := 0, 0
	exchange := func(msg []byte, wantEcho bool) {
		t.Helper()
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		require.NoError(t, err)
		defer c.Close()
		_, err = c.WriteToUDPAddrPort(msg, service)
		require.NoError(t, err)
		sent++
		if !wantEcho {
			return
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		require.NoError(t, err, "echo")
		require.Equal(t, service, from)
		require.Equal(t, msg, buf[:n])
		echoed++
	}
	for i := range rounds {
		exchange(helloRecord(uint64(i), []byte("hello")), true)
		for ord := range uint8(3) {
			cid, err := cidCodec.AppendCID(nil, ord)
			require.NoError(t, err)
			exchange(cidRecord(uint64(i), cid, []byte("data")), true)
		}
	}
	// Drops: garbage (malformed) and a CID naming no backend.
	exchange([]byte("not dtls"), false)
	unknown, _ := cidCodec.AppendCID(nil, 7)
	exchange(cidRecord(0, unknown, []byte("x")), false)
	require.Equal(t, 4*rounds, echoed)

	// Backends: each CID went to its ordinal; the draining one got no
	// ClientHello.
	require.Equal(t, uint64(0), backends[0].Bad()+backends[1].Bad()+backends[2].Bad())
	require.Equal(t, uint64(rounds), backends[2].Received(), "draining backend: CID datagrams only")
	require.Equal(t, uint64(4*rounds), backends[0].Received()+backends[1].Received()+backends[2].Received())

	const fwd, rev = `direction="forward"`, `direction="reverse"`
	key := func(dir, outcome, reason string) string {
		return fmt.Sprintf(`cidroute_datagrams_total{%s,outcome=%q,path="socket",reason=%q,service="coaps"}`, dir, outcome, reason)
	}
	var m map[string]float64
	// Workers publish counters after each batch's send; wait for the last.
	waitFor(t, 5*time.Second, "counters", func() bool {
		m = scrape()
		return m[key(rev, "forwarded", "")] == float64(echoed) && m[`cidroute_datagrams_received_total{`+fwd+`,path="socket",service="coaps"}`] == float64(sent)
	})
	require.Equal(t, float64(echoed), m[key(fwd, "forwarded", "")])
	require.Equal(t, float64(1), m[key(fwd, "dropped", "malformed")])
	require.Equal(t, float64(1), m[key(fwd, "dropped", "unknown_ordinal")])
	for _, dir := range []string{fwd, rev} {
		var outcomes float64
		for k, v := range m {
			if strings.HasPrefix(k, "cidroute_datagrams_total{"+dir+",") && strings.HasSuffix(k, `service="coaps"}`) {
				outcomes += v
			}
		}
		require.Equal(t, m[`cidroute_datagrams_received_total{`+dir+`,path="socket",service="coaps"}`], outcomes, "received = forwarded + dropped, %s", dir)
	}
	require.Equal(t, float64(echoed), m[`cidroute_datagrams_received_total{`+rev+`,path="socket",service="coaps"}`])
	require.Equal(t, float64(2), m[`cidroute_registry_backends{service="coaps",state="ready"}`])
	require.Equal(t, float64(1), m[`cidroute_registry_backends{service="coaps",state="draining"}`])
	require.Equal(t, float64(0), m[`cidroute_registry_backends{service="coaps",state="gone"}`])
	require.Equal(t, float64(0), m[`cidroute_registry_stale{service="h3"}`])
	require.Equal(t, float64(0), m[`cidroute_registry_rejected_updates_total{service="h3"}`])
	require.Contains(t, m, `cidroute_registry_snapshot_age_seconds{service="h3"}`)
	require.Contains(t, m, `go_goroutines`)

	// Transparent mode: one session, and one upstream socket, per client
	// address; PPv2 mode keeps none.
	const plainClients = 3
	for i := range plainClients {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		require.NoError(t, err)
		msg := helloRecord(uint64(i), []byte("plain"))
		_, err = c.WriteToUDPAddrPort(msg, plain)
		require.NoError(t, err)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		c.Close()
		require.NoError(t, err, "transparent echo")
		require.Equal(t, plain, from)
		require.Equal(t, msg, buf[:n], "forwarded unchanged")
	}
	waitFor(t, 5*time.Second, "transparent sessions gauge", func() bool {
		m = scrape()
		return m[`cidroute_sessions{service="plain"}`] == plainClients
	})
	require.Equal(t, float64(0), m[`cidroute_sessions{service="coaps"}`])

	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/") // its own listener (pprof_listen)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// SIGTERM: a clean exit, code 0, within 2 s.
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status")
	case <-time.After(2 * time.Second):
		t.Fatal("cidproxy did not exit within 2 s of SIGTERM")
	}
	l := logs.String()
	for _, want := range []string{"cidproxy starting", "backends changed", "backend file loaded", "metrics listening", "pprof listening", "pipeline stopped", "cidproxy stopped"} {
		require.Contains(t, l, want)
	}
	require.Less(t, strings.Count(l, "\n"), 20, "a handful of lines, none per datagram:\n%s", l)
}

// freePort returns a port that was free a moment ago on 127.0.0.1.
var freePort = testtool.FreePort

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// parseMetrics reads the Prometheus text format into "name{labels}" →
// value (testtool.ParseMetrics), failing the test on a bad line.
func parseMetrics(t *testing.T, r io.Reader) map[string]float64 {
	t.Helper()
	m, err := testtool.ParseMetrics(r)
	require.NoError(t, err)
	return m
}

// syncBuffer is a log sink shared by goroutines and the test.
type syncBuffer = testtool.SyncBuffer
