package proxyapp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/proxyconfig"
)

// TestServeInProcess runs serve under the race detector (the black-box
// test's binary is not built with it): a backends_file that changes, bad
// updates of every kind (each counted and logged), scrapes, and a stop by
// context.
func TestServeInProcess(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "b.json")
	writeFile := func(body string) {
		t.Helper()
		tmp := file + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(body), 0o644))
		require.NoError(t, os.Rename(tmp, file))
	}
	writeFile(`[{"ordinal": 0, "address": "127.0.0.1:9"}]`)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"metrics_listen": %q, "services": [
		{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1, "backends_file": %q}]}`,
		metrics, freePort(t, "udp"), file)))
	require.NoError(t, err)

	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, newLogger(&logs, slog.LevelInfo, errWindow), Options{}) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	}()

	gauge := func(name string) func() float64 {
		return func() float64 {
			resp, err := http.Get("http://" + metrics + "/metrics")
			if err != nil {
				return -1
			}
			defer resp.Body.Close()
			return parseMetrics(t, resp.Body)[name]
		}
	}
	ready := gauge(`cidroute_registry_backends{service="d",state="ready"}`)
	rejected := gauge(`cidroute_registry_rejected_updates_total{service="d"}`)
	waitFor(t, 5*time.Second, "first list", func() bool { return ready() == 1 })

	writeFile(`[{"ordinal": 0, "address": "127.0.0.1:9"}, {"ordinal": 1, "address": "127.0.0.1:10"}]`)
	waitFor(t, 5*time.Second, "second list", func() bool { return ready() == 2 })

	writeFile(`[{"ordinal": 3, "address": "127.0.0.1:9"}, {"ordinal": 3, "address": "127.0.0.1:10"}]`)
	waitFor(t, 5*time.Second, "rejection", func() bool {
		return strings.Contains(logs.String(), "duplicate ordinal")
	})
	require.Equal(t, float64(2), ready(), "a bad file keeps the previous list")
	require.Equal(t, float64(1), rejected())

	// Every rejected file counts, decode errors too, and each cause is
	// logged although they come within one log window.
	for i, bad := range []struct{ body, cause string }{
		{`[{"ordinal": 0, "address": `, "unexpected EOF"},
		{`[{"ordinal": 0, "adress": "127.0.0.1:9"}]`, `unknown key \"adress\"`},
		{`[{"ordinal": 255, "address": "127.0.0.1:9"}]`, "ordinal 255 is reserved"},
		{`[]`, "empty backend list"},
	} {
		writeFile(bad.body)
		waitFor(t, 5*time.Second, bad.cause, func() bool { return rejected() == float64(2+i) })
		waitFor(t, 5*time.Second, "log of "+bad.cause, func() bool { return strings.Contains(logs.String(), bad.cause) })
		require.Equal(t, float64(2), ready(), "the previous list stays")
	}

	cancel()
	select {
	case err := <-done:
		stopped = true
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("serve did not return within 2 s of cancel")
	}
	l := logs.String()
	require.Equal(t, 2, strings.Count(l, `msg="backends changed"`), l)
	require.Contains(t, l, "cidproxy stopped")
	_, err = http.Get("http://" + metrics + "/metrics")
	require.Error(t, err, "metrics listener closed")
}

// TestServeBadMetricsAddress: a metrics listener that cannot start fails
// start-up and releases the service's sockets.
func TestServeBadMetricsAddress(t *testing.T) {
	port := freePort(t, "udp")
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"metrics_listen": "256.0.0.1:1", "services": [{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1, "backends_file": "x"}]}`, port)))
	require.NoError(t, err)
	err = serve(context.Background(), cfg, slog.New(slog.DiscardHandler), Options{})
	require.ErrorContains(t, err, "metrics_listen")
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)))
	require.NoError(t, err, "the service port was released")
	c.Close()
}
