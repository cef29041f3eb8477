package proxyapp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
)

// TestMetricsListEveryReason: /metrics lists every drop reason each
// direction can count, at 0 before the first drop, from the library's own
// sets (cidroute.ForwardDrops, ReverseDrops): a reason added there cannot go
// missing here.
func TestMetricsListEveryReason(t *testing.T) {
	cfg, err := proxyconfig.Parse(strings.NewReader(fmt.Sprintf(`{"services": [{"name": "d", "protocol": "dtls",
		"listen": "127.0.0.1:%d", "workers": 1, "backends": [{"ordinal": 0, "address": "127.0.0.1:9"}]}]}`, freePort(t, "udp"))))
	require.NoError(t, err)
	p, err := newProxy(context.Background(), cfg, slog.New(slog.DiscardHandler), Options{})
	require.NoError(t, err)
	defer p.close()
	rec := httptest.NewRecorder()
	metricsHandler(p).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	m := parseMetrics(t, rec.Body)
	for dir, set := range map[string]cidroute.ReasonSet{"forward": cidroute.ForwardDrops, "reverse": cidroute.ReverseDrops} {
		n := 0
		for r := range set.All() {
			key := fmt.Sprintf(`cidroute_datagrams_total{direction=%q,outcome="dropped",path="socket",reason=%q,service="d"}`, dir, r)
			v, ok := m[key]
			require.True(t, ok, "missing %s", key)
			require.Zero(t, v, key)
			n++
		}
		require.Positive(t, n, dir)
	}
	_, ok := m[`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="own_address",service="d"}`]
	require.True(t, ok, "the new forward reasons are listed")
}
