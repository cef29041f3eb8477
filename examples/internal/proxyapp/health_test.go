package proxyapp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

func getBody(t *testing.T, url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// /readyz and /livez in process, against a real pion backend: ready only
// while every service has a fresh registry and a ready backend, the body
// naming the service that fails; a backend whose DTLS stack stops
// answering is marked down by the probes (one log line, no line per
// probe), which takes the service out of readiness; live throughout.
func TestReadyzLivez(t *testing.T) {
	be, err := dtlsecho.Listen(dtlsecho.Config{PSK: []byte("k"), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer be.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "b.json")
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"metrics_listen": %q, "services": [
		{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1,
		 "backends": [{"ordinal": 0, "address": "%v"}],
		 "health_check": {"interval": "100ms", "timeout": "50ms", "fall": 2, "rise": 2}},
		{"name": "f", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1, "backends_file": %q, "max_registry_age": "3s"}]}`,
		metrics, freePort(t, "udp"), be.Addr(), freePort(t, "udp"), file)))
	require.NoError(t, err)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, slog.LevelInfo, errWindow), Options{}) }()
	defer func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	}()
	readyz := func() (int, string) { return getBody(t, "http://"+metrics+"/readyz") }
	waitFor(t, 5*time.Second, "serving", func() bool { c, _ := readyz(); return c > 0 })
	code, body := readyz()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "service f: no ready backend (draining 0, down by probes 0, gone 0, snapshot version 0)\n", body,
		"the file is not there yet; d is ready")
	code, body = getBody(t, "http://"+metrics+"/livez")
	assert.Equal(t, [2]any{200, "ok\n"}, [2]any{code, body})

	require.NoError(t, os.WriteFile(file, []byte(`[{"ordinal": 0, "address": "127.0.0.1:9"}]`), 0o644))
	waitFor(t, 5*time.Second, "ready", func() bool { c, _ := readyz(); return c == 200 })
	_, body = readyz()
	assert.Equal(t, "ok\n", body)
	m := scrape(t, metrics)
	assert.Equal(t, 1.0, m[`cidroute_backend_probe_up{ordinal="0",service="d"}`])
	assert.Positive(t, m[`cidroute_probes_total{ordinal="0",result="ok",service="d"}`])
	assert.Positive(t, m[`cidroute_probe_duration_seconds_count{service="d"}`])
	assert.Zero(t, m[`cidroute_sessions_max{service="d"}`])

	// The backend's stack goes away: ICMP port unreachable, down after two
	// probes; the service is not ready, and says why.
	be.Close()
	waitFor(t, 5*time.Second, "down", func() bool { c, _ := readyz(); return c == 503 })
	_, body = readyz()
	assert.Equal(t, "service d: no ready backend (draining 0, down by probes 1, gone 0, snapshot version 3)\n", body)
	m = scrape(t, metrics)
	assert.Equal(t, 0.0, m[`cidroute_backend_probe_up{ordinal="0",service="d"}`])
	assert.Equal(t, 1.0, m[`cidroute_registry_backends{service="d",state="down"}`])
	assert.Equal(t, 0.0, m[`cidroute_registry_backends{service="d",state="ready"}`])
	assert.Positive(t, m[`cidroute_probes_total{ordinal="0",result="refused",service="d"}`])
	before := logs.String()
	time.Sleep(500 * time.Millisecond) // five more failed probes
	assert.Equal(t, before, logs.String(), "no line per probe")
	assert.Equal(t, 1, strings.Count(before, "backend down"), "one line per change")

	// The file source stops confirming: stale after max_registry_age.
	require.NoError(t, os.Remove(file))
	waitFor(t, 8*time.Second, "stale", func() bool { _, b := readyz(); return strings.Contains(b, "service f: registry stale") })
	_, body = readyz()
	assert.Contains(t, body, "service d: no ready backend", "every failing service is named")
	code, _ = getBody(t, "http://"+metrics+"/livez")
	assert.Equal(t, 200, code, "live while it serves")
}

func scrape(t *testing.T, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	return parseMetrics(t, resp.Body)
}

// -probe-dtls and -probe-quic: one probe from the operator's shell, as the
// checker sends it.
func TestProbeFlags(t *testing.T) {
	be, err := dtlsecho.Listen(dtlsecho.Config{PSK: []byte("k"), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer be.Close()
	code, out, errOut := runArgs(t, "-probe-dtls", be.Addr().String())
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `^dtls 127\.0\.0\.1:\d+: ok in \S+\n$`, out)

	code, out, _ = runArgs(t, "-probe-quic", be.Addr().String(), "-probe-timeout", "200ms")
	assert.Equal(t, 1, code, "a DTLS stack does not answer a QUIC probe")
	assert.Contains(t, out, ": timeout (")

	code, out, _ = runArgs(t, "-probe-dtls", be.Addr().String(), "-probe-direct")
	assert.Equal(t, 0, code, "without a header, as a direct client's hello (this backend accepts direct datagrams): %s", out)
	for _, args := range [][]string{
		{"-probe-dtls", "nope"},
		{"-probe-dtls", "127.0.0.1:1", "-probe-quic", "127.0.0.1:1"},
		{"-probe-dtls", "127.0.0.1:1", "extra"},
		{"-probe-dtls", "127.0.0.1:1", "-probe-timeout", "0s"},
	} {
		code, _, errOut := runArgs(t, args...)
		assert.Equal(t, 2, code, "%q: %s", args, errOut)
	}
}

// Issue 35: a handover carries the predecessor's down marks to the
// successor's health checker only. A service the successor runs without
// health_check gets none (before the fix it got them and nothing ever
// lifted them: /readyz 503, every new session no_ready_backend); one with
// health_check starts with them and its own probes lift them.
func TestHandoverMarksNeedAChecker(t *testing.T) {
	be, err := dtlsecho.Listen(dtlsecho.Config{PSK: []byte("k"), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer be.Close()
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"services": [
		{"name": "plain", "protocol": "dtls", "listen": "127.0.0.1:%d", "backends": [{"ordinal": 0, "address": "%v"}]},
		{"name": "hc", "protocol": "dtls", "listen": "127.0.0.1:%d", "backends": [{"ordinal": 0, "address": "%v"}],
		 "health_check": {"interval": "100ms", "timeout": "50ms", "rise": 2}}]}`,
		freePort(t, "udp"), be.Addr(), freePort(t, "udp"), be.Addr())))
	require.NoError(t, err)
	var logs syncBuffer
	log := newLogger(&logs, slog.LevelInfo, errWindow)
	regs, err := cfg.Build(proxyconfig.Options{Logger: log})
	require.NoError(t, err)
	defer regs.Close()
	marked := []registry.Backend{{Ordinal: 0, Addr: be.Addr()}}
	h := &inherited{down: map[string][]registry.Backend{"plain": marked, "hc": marked}, listen: map[netip.AddrPort][]*net.UDPConn{}}
	for _, d := range regs.Services() {
		h.listen[d.Listen] = nil // as if inherited: no sockets needed here
	}
	h.adopt(regs.Services(), regs, log)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); regs.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	plain, _ := regs.Registry("plain")
	hc, _ := regs.Registry("hc")
	waitFor(t, 5*time.Second, "the checker's first round", func() bool {
		c, _ := regs.Checker("hc")
		return len(c.Stats().Backends) == 1
	})
	assert.False(t, plain.Snapshot().Down(0), "no checker: no mark")
	assert.Equal(t, 1, plain.Stats().Ready)
	assert.Contains(t, logs.String(), "down marks are dropped: this service has no health_check")
	waitFor(t, 5*time.Second, "the checker lifts the mark it inherited", func() bool { return !hc.Snapshot().Down(0) })
}

// Issue 35: a handover sends every mark the predecessor's checker holds,
// a draining backend's too: once ready again it must not take new
// sessions unprobed at the successor.
func TestHandoverSendsDrainingMarks(t *testing.T) {
	dead := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(freePort(t, "udp"))) // nothing listens: probes fail at once
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"services": [
		{"name": "hc", "protocol": "dtls", "listen": "127.0.0.1:%d", "backends": [{"ordinal": 0, "address": "%v"}, {"ordinal": 1, "address": "127.0.0.1:9"}],
		 "health_check": {"interval": "100ms", "timeout": "50ms", "fall": 1}}]}`, freePort(t, "udp"), dead)))
	require.NoError(t, err)
	regs, err := cfg.Build(proxyconfig.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer regs.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); regs.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	reg, _ := regs.Registry("hc")
	waitFor(t, 5*time.Second, "the dead backend marked down", func() bool { return reg.Snapshot().Down(0) })
	// The source now says draining (a rolling restart began).
	require.NoError(t, reg.Update([]registry.Backend{{Ordinal: 0, Addr: dead, State: registry.Draining}, {Ordinal: 1, Addr: netip.MustParseAddrPort("127.0.0.1:9")}}))
	p := &proxy{regs: regs, names: []string{"hc"}}
	down := p.downMarks()["hc"]
	assert.True(t, slices.ContainsFunc(down, func(b registry.Backend) bool { return b.Ordinal == 0 && b.Addr == dead }),
		"the draining backend's mark is sent: %v", down)
}
