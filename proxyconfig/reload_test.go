package proxyconfig

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/registry"
)

// reloadBase is a running configuration of TestDiff: two services.
const reloadBase = `{"hrw_seed": 7, "log_level": "info", "services": [
	{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "workers": 2,
	 "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}, {"ordinal": 1, "address": "127.0.0.1:6001"}]},
	{"name": "b", "protocol": "quic", "listen": "127.0.0.1:4433", "backends_file": "b.json"}]}`

// TestDiff: each key falls on its side, applied in place or refused by
// name, and a service with a refused key keeps its whole configuration.
func TestDiff(t *testing.T) {
	base := mustParse(t, reloadBase)
	d := base.Diff(mustParse(t, reloadBase))
	require.Empty(t, d.Services)
	require.Empty(t, d.Refused)
	require.False(t, d.LogLevel)
	require.Equal(t, base, d.Effective)

	edit := func(from, to string) *Config {
		t.Helper()
		require.Contains(t, reloadBase, from)
		return mustParse(t, strings.Replace(reloadBase, from, to, 1))
	}
	for _, tt := range []struct {
		name     string
		from, to string
		want     ServiceDelta
		refused  string
	}{
		{"weights", `"address": "127.0.0.1:6001"}`, `"address": "127.0.0.1:6001", "weight": 3}`, ServiceDelta{Name: "a", Backends: true}, ""},
		{"state", `"address": "127.0.0.1:6001"}`, `"address": "127.0.0.1:6001", "state": "draining"}`, ServiceDelta{Name: "a", Backends: true}, ""},
		{"a backend added", `"address": "127.0.0.1:6001"}`, `"address": "127.0.0.1:6001"}, {"ordinal": 2, "address": "127.0.0.1:6002"}`, ServiceDelta{Name: "a", Backends: true}, ""},
		{"inline to file", `"backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}, {"ordinal": 1, "address": "127.0.0.1:6001"}]`, `"backends_file": "a.json"`, ServiceDelta{Name: "a", Backends: true}, ""},
		{"backends_file", `"b.json"`, `"c.json"`, ServiceDelta{Name: "b", Backends: true}, ""},
		{"limits", `"workers": 2,`, `"workers": 2, "limits": {"per_source_pps": 100},`, ServiceDelta{Name: "a", Limits: true}, ""},
		{"health_check", `"workers": 2,`, `"workers": 2, "health_check": {"interval": "1s"},`, ServiceDelta{Name: "a", Health: true}, ""},
		{"listen", `"127.0.0.1:5684"`, `"127.0.0.1:5685"`, ServiceDelta{}, `services["a"].listen`},
		{"protocol", `"name": "a", "protocol": "dtls"`, `"name": "a", "protocol": "quic"`, ServiceDelta{}, `services["a"].protocol`},
		{"cid_length", `"workers": 2,`, `"workers": 2, "cid_length": 9,`, ServiceDelta{}, `services["a"].cid_length`},
		{"workers", `"workers": 2,`, `"workers": 3,`, ServiceDelta{}, `services["a"].workers`},
		{"proxy_protocol", `"workers": 2,`, `"workers": 2, "proxy_protocol": false,`, ServiceDelta{}, `services["a"].proxy_protocol`},
		{"max_registry_age", `"workers": 2,`, `"workers": 2, "max_registry_age": "5s",`, ServiceDelta{}, `services["a"].max_registry_age`},
		{"require_dtls13_cid", `"workers": 2,`, `"workers": 2, "require_dtls13_cid": true,`, ServiceDelta{}, `services["a"].require_dtls13_cid`},
		{"unroutable", `"backends_file": "b.json"`, `"backends_file": "b.json", "unroutable": "hash"`, ServiceDelta{}, `services["b"].unroutable`},
		{"hrw_seed", `"hrw_seed": 7`, `"hrw_seed": 8`, ServiceDelta{}, `hrw_seed`},
		{"metrics_listen", `"hrw_seed": 7`, `"hrw_seed": 7, "metrics_listen": "127.0.0.1:9100"`, ServiceDelta{}, `metrics_listen`},
		{"xdp_interfaces", `"hrw_seed": 7`, `"hrw_seed": 7, "xdp_interfaces": ["eth0"]`, ServiceDelta{}, `xdp_interfaces`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := edit(tt.from, tt.to)
			d := base.Diff(next)
			if tt.refused != "" {
				require.NotEmpty(t, d.Refused)
				assert.Equal(t, tt.refused, d.Refused[0].String()) // protocol brings its default cid_length along
				assert.Empty(t, d.Services)
				assert.Equal(t, base.Seed, d.Effective.Seed)
				assert.Equal(t, base.MetricsListen, d.Effective.MetricsListen)
				assert.Equal(t, base.Services, d.Effective.Services, "the refused service keeps its configuration")
				return
			}
			require.Empty(t, d.Refused)
			require.Equal(t, []ServiceDelta{tt.want}, d.Services)
			assert.Equal(t, next.Services, d.Effective.Services)
		})
	}

	// Several at once: a's listen is refused, so a's new weight is not
	// taken either; b's backends_file and log_level are.
	next := mustParse(t, strings.NewReplacer(`"127.0.0.1:5684"`, `"127.0.0.1:5685"`,
		`"address": "127.0.0.1:6001"}`, `"address": "127.0.0.1:6001", "weight": 3}`,
		`"b.json"`, `"c.json"`, `"info"`, `"debug"`).Replace(reloadBase))
	d = base.Diff(next)
	require.Equal(t, []Refusal{{"a", "listen"}}, d.Refused)
	require.Equal(t, []ServiceDelta{{Name: "b", Backends: true}}, d.Services)
	require.True(t, d.LogLevel)
	assert.Equal(t, slog.LevelDebug, d.Effective.LogLevel)
	assert.Equal(t, base.Services[0], d.Effective.Services[0])
	assert.Equal(t, next.Services[1], d.Effective.Services[1])

	// A new service is added; a missing one is refused and keeps running.
	next = mustParse(t, `{"hrw_seed": 7, "services": [
	{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5684", "workers": 2,
	 "backends": [{"ordinal": 0, "address": "127.0.0.1:6000"}, {"ordinal": 1, "address": "127.0.0.1:6001"}]},
	{"name": "c", "protocol": "dtls", "listen": "127.0.0.1:5686", "backends_file": "c.json"}]}`)
	d = base.Diff(next)
	require.Equal(t, []ServiceDelta{{Name: "c", Added: true}}, d.Services)
	require.Equal(t, []Refusal{{Service: "b"}}, d.Refused)
	assert.Equal(t, `services["b"] (removed)`, d.Refused[0].String())
	names := []string{}
	for _, s := range d.Effective.Services {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"a", "c", "b"}, names)
}

// TestApply: under Run, a new inline list is published at once, a new
// backends_file is read by a new source, health checks come and go (and
// take their marks with them), and an added service runs.
func TestApply(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p+".tmp", []byte(body), 0o644))
		require.NoError(t, os.Rename(p+".tmp", p))
		return p
	}
	conf := func(body string) *Config {
		t.Helper()
		c, err := Load(context.Background(), write("conf.json", body))
		require.NoError(t, err)
		return c
	}
	write("b.json", `[{"ordinal": 5, "address": "127.0.0.1:6005"}]`)
	write("c.json", `[{"ordinal": 6, "address": "127.0.0.1:6006"}]`)
	base := conf(reloadBase)
	o := Options{Logger: slog.New(slog.DiscardHandler)}
	regs, err := base.Build(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		regs.Run(ctx)
	}()
	defer func() {
		cancel()
		<-ran
		regs.Close()
	}()
	a, _ := regs.Registry("a")
	b, _ := regs.Registry("b")
	ords := func(reg *registry.Registry) (out []string) {
		for _, be := range reg.Snapshot().Backends() {
			out = append(out, be.Addr.String()+" "+be.State.String())
		}
		return out
	}
	require.Eventually(t, func() bool { return b.Snapshot().Len() == 1 }, 5*time.Second, 10*time.Millisecond)

	next := conf(strings.NewReplacer(`"address": "127.0.0.1:6001"}`, `"address": "127.0.0.1:6001", "state": "draining"}`,
		`"b.json"`, `"c.json"`).Replace(reloadBase))
	d := base.Diff(next)
	v := a.Snapshot().Version()
	require.NoError(t, regs.Apply(d, o))
	assert.Equal(t, []string{"127.0.0.1:6000 ready", "127.0.0.1:6001 draining"}, ords(a), "published before Apply returns")
	require.Eventually(t, func() bool { return b.Snapshot().Len() == 1 && b.Snapshot().Backends()[0].Ordinal == 6 }, 5*time.Second, 10*time.Millisecond)
	// One version more: the old static source is gone, not republishing.
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, v+1, a.Snapshot().Version())
	base = d.Effective

	// health_check on: a checker runs; off again: its marks are lifted.
	next = conf(strings.Replace(reloadBase, `"workers": 2,`, `"workers": 2, "health_check": {"interval": "100ms", "timeout": "50ms", "fall": 1},`, 1))
	d = base.Diff(next)
	require.Equal(t, []ServiceDelta{{Name: "a", Backends: true, Health: true}, {Name: "b", Backends: true}}, d.Services)
	require.NoError(t, regs.Apply(d, o))
	_, ok := regs.Checker("a")
	require.True(t, ok)
	require.Eventually(t, func() bool { return a.Stats().Down == 2 }, 5*time.Second, 10*time.Millisecond,
		"nothing answers the probes on 6000 and 6001")
	base = d.Effective
	d = base.Diff(conf(reloadBase))
	require.Equal(t, []ServiceDelta{{Name: "a", Health: true}}, d.Services)
	require.NoError(t, regs.Apply(d, o))
	_, ok = regs.Checker("a")
	require.False(t, ok)
	assert.Zero(t, a.Stats().Down, "no checker, no marks")
	assert.Equal(t, 2, a.Stats().Ready)

	// A service added while running gets its source started.
	next = conf(strings.Replace(reloadBase, `"backends_file": "b.json"}`, `"backends_file": "b.json"},
		{"name": "c", "protocol": "dtls", "listen": "127.0.0.1:5686", "backends_file": "c.json"}`, 1))
	d = d.Effective.Diff(next)
	require.Equal(t, []ServiceDelta{{Name: "c", Added: true}}, d.Services)
	sc, _ := d.Effective.service("c")
	def, err := regs.AddService(sc, o)
	require.NoError(t, err)
	require.Equal(t, "c", def.Name)
	c, ok := regs.Registry("c")
	require.True(t, ok)
	require.Same(t, c, def.Backends)
	require.Eventually(t, func() bool { return c.Snapshot().Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	_, err = regs.AddService(sc, o)
	require.Error(t, err, "already running")
	regs.RemoveService("c")
	_, ok = regs.Registry("c")
	require.False(t, ok)
}
