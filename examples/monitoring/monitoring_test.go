package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/examples/internal/proxyapp"
	"github.com/cidroute/cidroute/internal/testtool"
)

const (
	rulesFile      = "cidroute.rules.yml"
	rulesTestFile  = "cidroute.rules_test.yml"
	promRuleFile   = "../kubernetes/monitoring/prometheusrule.yaml"
	dashboardFile  = "grafana-dashboard.json"
	runbooksFile   = "../../docs/runbooks.md"
	runbookURLBase = "https://github.com/cidroute/cidroute/blob/main/docs/runbooks.md#"
)

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

// decodeYAML decodes path strictly (unknown keys are errors) into v.
func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(v), path)
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	var g ruleGroups
	decodeYAML(t, rulesFile, &g)
	var rs []rule
	for _, grp := range g.Groups {
		rs = append(rs, grp.Rules...)
	}
	require.NotEmpty(t, rs)
	return rs
}

// promtool checks the rules, runs their unit tests, and checks the
// PrometheusRule's rules, which must be the plain file's.
func TestRulesPromtool(t *testing.T) {
	promtool := testtool.Look(t, "prometheus", "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
		t.Logf("promtool %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}

	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name      string            `yaml:"name"`
			Namespace string            `yaml:"namespace"`
			Labels    map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec ruleGroups `yaml:"spec"`
	}
	decodeYAML(t, promRuleFile, &pr)
	require.Equal(t, "monitoring.coreos.com/v1", pr.APIVersion)
	require.Equal(t, "PrometheusRule", pr.Kind)
	var plain ruleGroups
	decodeYAML(t, rulesFile, &plain)
	require.Equal(t, plain, pr.Spec, "the PrometheusRule holds the rules file's groups")
	spec, err := yaml.Marshal(pr.Spec)
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "prometheusrule-spec.yml")
	require.NoError(t, os.WriteFile(f, spec, 0o644))
	out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
	require.NoError(t, err, "promtool check rules on the PrometheusRule's spec:\n%s", out)
}

// Every alert has a severity, a summary, and a runbook section that
// exists; a promtool test that sees it fire and one that sees it quiet.
func TestRulesDocumentedAndTested(t *testing.T) {
	runbooks, err := os.ReadFile(runbooksFile)
	require.NoError(t, err)
	anchors := map[string]bool{}
	for line := range strings.Lines(string(runbooks)) {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	var tests struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		Tests              []struct {
			Name          string `yaml:"name"`
			Interval      string `yaml:"interval"`
			InputSeries   []any  `yaml:"input_series"`
			AlertRuleTest []struct {
				EvalTime  string `yaml:"eval_time"`
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	decodeYAML(t, rulesTestFile, &tests)
	require.Equal(t, []string{rulesFile}, tests.RuleFiles)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		require.NotEmpty(t, r.Alert, "only alerting rules: %q", r.Expr)
		require.False(t, seen[r.Alert], "alert %s twice", r.Alert)
		seen[r.Alert] = true
		assert.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
		assert.NotEmpty(t, r.Annotations["summary"], r.Alert)
		assert.NotEmpty(t, r.Annotations["description"], r.Alert)
		url := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, runbookURLBase)
		assert.True(t, ok, "%s: runbook_url %q is not in docs/runbooks.md", r.Alert, url)
		assert.Equal(t, strings.ToLower(r.Alert), anchor, "%s: the runbook section is named after the alert", r.Alert)
		assert.True(t, anchors[anchor], "%s: docs/runbooks.md has no section %q", r.Alert, anchor)
		assert.True(t, fires[r.Alert], "%s: no promtool test sees it fire", r.Alert)
		assert.True(t, quiet[r.Alert], "%s: no promtool test sees it quiet", r.Alert)
	}
	for a := range fires {
		assert.True(t, seen[a], "a test of an alert that does not exist: %s", a)
	}
}

var reasonRegexp = regexp.MustCompile(`reason=~"([a-z0-9_|]+)"`)

// Every drop reason the pipeline counts belongs to exactly one alert: a
// drop-rate alert of its group, or, for the reasons that a registry
// state explains, the alert on that state.
func TestEveryDropReasonAlerts(t *testing.T) {
	byState := map[string]string{
		cidroute.StaleRegistry.String():  "CIDRouteRegistryStale",
		cidroute.NoReadyBackend.String(): "CIDRouteNoReadyBackend",
	}
	owner := map[string]string{}
	alerts := map[string]bool{}
	for _, r := range loadRules(t) {
		alerts[r.Alert] = true
		m := reasonRegexp.FindStringSubmatch(r.Expr)
		if m == nil {
			continue
		}
		for _, reason := range strings.Split(m[1], "|") {
			require.Empty(t, owner[reason], "reason %s in %s and %s", reason, owner[reason], r.Alert)
			owner[reason] = r.Alert
		}
	}
	counted := map[string]bool{}
	for r := range (cidroute.ForwardDrops | cidroute.ReverseDrops).All() {
		name := r.String()
		counted[name] = true
		if a, ok := byState[name]; ok {
			assert.True(t, alerts[a], "%s: its state alert %s is missing", name, a)
			assert.Empty(t, owner[name], "%s: alerted by its state", name)
			continue
		}
		assert.NotEmpty(t, owner[name], "drop reason %s has no alert", name)
	}
	for reason := range owner {
		assert.True(t, counted[reason], "an alert names reason %q, which the pipeline never counts", reason)
	}
}

type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	require.True(t, json.Valid(data), "valid JSON")
	var d dashboard
	require.NoError(t, json.Unmarshal(data, &d))
	return d
}

// The dashboard loads as Grafana reads it: unique panel IDs, panels on a
// 24-column grid without overlaps, every query on the data source
// variable, with a unique refId, and only variables that are defined.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	require.NotEmpty(t, d.Title)
	require.NotEmpty(t, d.UID)
	require.GreaterOrEqual(t, d.SchemaVersion, 36)
	vars := map[string]bool{"__rate_interval": true, "__interval": true}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	require.True(t, vars["datasource"] && vars["service"] && vars["instance"])
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]int{}
	queries := 0
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		g := p.GridPos
		require.True(t, g.W > 0 && g.H > 0 && g.X >= 0 && g.X+g.W <= 24 && g.Y >= 0, "%q: gridPos %+v", p.Title, g)
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				require.Zero(t, used[cell{x, y}], "%q overlaps panel %d", p.Title, used[cell{x, y}])
				used[cell{x, y}] = p.ID
			}
		}
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Title)
		require.NotNil(t, p.Datasource, p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		refs := map[string]bool{}
		for _, q := range p.Targets {
			require.False(t, refs[q.RefID], "%q: refId %s twice", p.Title, q.RefID)
			refs[q.RefID] = true
			require.NotEmpty(t, q.Expr, p.Title)
			for _, m := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(q.Expr, -1) {
				require.True(t, vars[m[1]], "%q: variable $%s is not defined", p.Title, m[1])
			}
			queries++
		}
	}
	require.Greater(t, queries, 10)
}

// pending names the metrics the rules and the dashboard query before the
// binary exports them, and who adds them. The test fails when one of them
// is exported, so that the entry goes once it landed.
var pending = map[string]string{}

var metricName = regexp.MustCompile(`\b(?:cidroute|process|go)_[a-z0-9_]+\b`)

// Every metric a panel or an alert queries is one a running cidproxy
// exports: the test starts one (a DTLS service in PPv2 mode, probed, in
// front of a real pion backend; a transparent QUIC service) and scrapes
// it.
func TestQueriedMetricsExist(t *testing.T) {
	exported := scrapeCidproxy(t)
	want := map[string][]string{} // metric → where it is queried
	for _, p := range loadDashboard(t).Panels {
		for _, q := range p.Targets {
			for _, m := range metricName.FindAllString(q.Expr, -1) {
				want[m] = append(want[m], "panel "+p.Title)
			}
		}
	}
	for _, r := range loadRules(t) {
		for _, m := range metricName.FindAllString(r.Expr, -1) {
			want[m] = append(want[m], "alert "+r.Alert)
		}
	}
	require.Greater(t, len(want), 10)
	for m, where := range want {
		if who, ok := pending[m]; ok {
			assert.False(t, exported[m], "%s is exported now: remove it from pending", m)
			t.Logf("not checked yet: %s (added by %s), queried by %v", m, who, where)
			continue
		}
		assert.True(t, exported[m], "%s, queried by %v, is not exported", m, where)
	}
}

// scrapeCidproxy runs cidproxy in this process and returns the names of
// the metrics its /metrics exports.
func scrapeCidproxy(t *testing.T) map[string]bool {
	t.Helper()
	be, err := dtlsecho.Listen(dtlsecho.Config{PSK: []byte("k"), TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer be.Close()
	metrics := fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))
	cfg := filepath.Join(t.TempDir(), "cidproxy.json")
	require.NoError(t, os.WriteFile(cfg, fmt.Appendf(nil, `{"metrics_listen": %q, "services": [
		{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1,
		 "backends": [{"ordinal": 0, "address": "%v"}], "health_check": {"interval": "100ms", "timeout": "50ms"}},
		{"name": "q", "protocol": "quic", "listen": "127.0.0.1:%d", "workers": 1, "proxy_protocol": false,
		 "backends": [{"ordinal": 0, "address": "127.0.0.1:9"}]}]}`,
		metrics, testtool.FreePort(t, "udp"), be.Addr(), testtool.FreePort(t, "udp")), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	var stderr testtool.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- proxyapp.Run(ctx, []string{"-config", cfg}, io.Discard, &stderr, proxyapp.Options{}) }()
	defer func() {
		cancel()
		require.Equal(t, 0, <-done, stderr.String())
	}()
	var m map[string]float64
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err == nil {
			m, err = testtool.ParseMetrics(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			if m[`cidroute_probe_duration_seconds_count{service="d"}`] > 0 {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "no answered probe in the metrics: %v\n%s", err, stderr.String())
		time.Sleep(50 * time.Millisecond)
	}
	names := map[string]bool{}
	for series := range m {
		name, _, _ := strings.Cut(series, "{")
		names[name] = true
	}
	t.Logf("cidproxy exports %d metrics: %v", len(names), slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if strings.HasPrefix(n, "cidroute_") && !yield(n) {
				return
			}
		}
	}))
	return names
}
