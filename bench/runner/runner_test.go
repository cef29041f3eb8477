package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
)

func TestMedian(t *testing.T) {
	assert.Equal(t, 0.0, median(nil))
	assert.Equal(t, 2.0, median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
	v := []float64{3, 1, 2}
	median(v)
	assert.Equal(t, []float64{3, 1, 2}, v, "the input is left alone")
}

func TestSummarizePairsRatiosByRepetition(t *testing.T) {
	pt := point{"rate", 50000, 64}
	mk := func(f string, rep int, cpu, p99 float64) sample {
		return sample{Forwarder: f, Point: pt, Rep: rep, TotalUS: cpu, UserUS: cpu / 4, P99: p99, Allocs: -1}
	}
	r := &results{RateClients: 64, Samples: []sample{
		// The machine slows down between repetitions; raw slows with it.
		mk("raw", 0, 4, 100), mk("cidproxy-1w", 0, 4.2, 110),
		mk("raw", 1, 8, 200), mk("cidproxy-1w", 1, 8.4, 220),
		mk("raw", 2, 6, 150), mk("cidproxy-1w", 2, 6.3, 165),
	}}
	r.summarize()
	s, ok := r.find("cidproxy-1w", pt)
	require.True(t, ok)
	assert.Equal(t, 3, s.Runs)
	assert.InDelta(t, 6.3, s.Median.TotalUS, 1e-9)
	assert.InDelta(t, 1.05, s.CPURatio, 1e-9, "paired ratios are 1.05 every time")
	assert.InDelta(t, 1.1, s.P99Ratio, 1e-9)
	raw, _ := r.find("raw", pt)
	assert.Equal(t, 1.0, raw.CPURatio)

	md := r.markdown()
	assert.Contains(t, md, "| 50k/s | cidproxy-1w |")
	assert.Contains(t, md, "CPU per datagram ≤ 1.05× raw at 50k/s | met: 1.05×")
	assert.Contains(t, md, "p99 RTT at 50k/s ≤ 1.2× raw | met: 1.10×")
	assert.Contains(t, md, "CPU per datagram ≤ 1.05× raw at flat out | not measured")
}

func TestTargetsState(t *testing.T) {
	r := &results{ClientRate: 20000, Samples: []sample{
		{Forwarder: "cidproxy-1w", Point: point{"clients", 20000, 10}, RSSKB: 12000, FDs: 13, Allocs: 0},
		{Forwarder: "cidproxy-1w", Point: point{"clients", 20000, 10000}, RSSKB: 12500, FDs: 13, Allocs: 0.0002},
		{Forwarder: "cidproxy-2w", Point: point{"clients", 20000, 10}, RSSKB: 12000, FDs: 13, Allocs: 0},
		{Forwarder: "cidproxy-2w", Point: point{"clients", 20000, 10000}, RSSKB: 15000, FDs: 14, Allocs: 0.01},
	}}
	r.summarize()
	md := r.markdown()
	assert.Contains(t, md, "| met: 10 → 10000 clients: RSS +0.49 MiB, fds +0 | **missed**: 10 → 10000 clients: RSS +2.93 MiB, fds +1 |")
	assert.Contains(t, md, "| met: at most 0.0002 | **missed**: at most 0.0100 |")
	assert.Contains(t, md, "| cidproxy-2w | 10000 | 14.6 | 14 | +2.93 MiB | +1 |")
}

func TestOptions(t *testing.T) {
	o, err := parseOptions([]string{"-quick"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 1, o.reps)
	assert.Equal(t, []uint64{25000, 50000, 0}, o.rates)
	assert.Equal(t, "1s", o.timing.duration)
	assert.Equal(t, "go run ./bench/runner -quick", o.command)
	assert.Zero(t, o.profileSecs, "a quick run takes no profile")
	o, err = parseOptions([]string{"-command", "bash bench/run.sh -quick", "-quick"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, "bash bench/run.sh -quick", o.command)

	o, err = parseOptions(nil, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 3, o.reps)
	assert.Equal(t, []int{10, 1000, 10000}, o.clientCounts)
	assert.Len(t, o.rateFwds, 6)
	assert.Equal(t, 3, o.profileSecs, "a full run profiles cidproxy, so its results show where the CPU goes")
	o, err = parseOptions([]string{"-profile", "0"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Zero(t, o.profileSecs)

	_, err = parseOptions([]string{"-forwarders", "cidproxy-1w,nginx"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "raw", "ratios need the raw-limit forwarder")
	_, err = parseOptions([]string{"-forwarders", "raw,haproxy"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "haproxy")
	o, err = parseOptions([]string{"-rates", "none", "-clients", "none"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Empty(t, o.rates)
	assert.Empty(t, o.clientCounts)
}

func TestNginxConf(t *testing.T) {
	be := netip.MustParseAddrPort("127.0.0.1:7000")
	c := nginxConf("/m.so", "/p", 5684, be, true)
	assert.Contains(t, c, "load_module /m.so;")
	assert.Contains(t, c, "master_process off;")
	assert.Contains(t, c, "listen 127.0.0.1:5684 udp;")
	assert.Contains(t, c, "proxy_pass 127.0.0.1:7000;")
	assert.Contains(t, c, "proxy_responses 1;")
	assert.NotContains(t, nginxConf("/m.so", "/p", 5684, be, false), "proxy_responses")
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds the programs a run starts, once per test binary.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "cidroute-bench-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/",
			"github.com/cidroute/cidroute/examples/loadgen", "github.com/cidroute/cidroute/examples/echo",
			"github.com/cidroute/cidroute/examples/cidproxy", "github.com/cidroute/cidroute/bench/rawfwd",
			"github.com/cidroute/cidroute/bench/naivefwd")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = err
			binDir = string(out)
		}
	})
	require.NoError(t, buildErr, binDir)
	return binDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" && buildErr == nil {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// runQuick runs the runner in-process, unpinned, with short windows, and
// returns what it wrote.
func runQuick(t *testing.T, args ...string) (*results, string) {
	bin := binaries(t)
	out := t.TempDir()
	var log bytes.Buffer
	args = append([]string{"-quick", "-bin", bin, "-out", out, "-fwd-cpu=", "-gen-cpu=",
		"-warmup", "200ms", "-duration", "300ms"}, args...)
	require.NoError(t, cmd(context.Background(), args, &log), log.String())
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var r results
	require.NoError(t, json.Unmarshal(b, &r))
	md, err := os.ReadFile(filepath.Join(out, "table.md"))
	require.NoError(t, err)
	require.Empty(t, r.Failures, log.String())
	return &r, string(md)
}

// TestSmoke runs the benchmark end to end for a few seconds: loadgen
// through the raw-limit forwarder, cidproxy and the naive forwarder.
func TestSmoke(t *testing.T) {
	r, md := runQuick(t, "-rates", "0", "-forwarders", "raw,cidproxy-1w", "-clients", "200", "-client-forwarders", "raw,naive")
	require.Len(t, r.Samples, 4)
	for _, s := range r.Samples {
		assert.Positive(t, s.RoundTrips, "%s %s", s.Forwarder, s.Point)
		assert.Positive(t, s.RSSKB, "%s", s.Forwarder)
		assert.Positive(t, s.FDs, "%s", s.Forwarder)
		if s.Forwarder == "cidproxy-1w" {
			assert.GreaterOrEqual(t, s.Allocs, 0.0, "measured for cidproxy")
		} else {
			assert.Equal(t, -1.0, s.Allocs)
		}
	}
	assert.Contains(t, md, "| flat out | cidproxy-1w |")
	assert.Contains(t, md, "| naive | 200 |")
	assert.Contains(t, md, "## Targets")
	assert.True(t, strings.HasPrefix(r.Command, "go run ./bench/runner -quick"))

	// -render rewrites the table from the results alone.
	dir := t.TempDir()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644))
	require.NoError(t, cmd(context.Background(), []string{"-render", filepath.Join(dir, "results.json"), "-out", dir}, &bytes.Buffer{}))
	again, err := os.ReadFile(filepath.Join(dir, "table.md"))
	require.NoError(t, err)
	assert.Equal(t, md, string(again))
}

// TestNginxSmoke drives nginx's UDP stream proxy for a moment.
func TestNginxSmoke(t *testing.T) {
	testtool.Look(t, "nginx", "nginx")
	const module = "/usr/lib/nginx/modules/ngx_stream_module.so"
	if _, err := os.Stat(module); err != nil {
		if testtool.Required() {
			t.Fatalf("%s missing (install Debian package libnginx-mod-stream)", module)
		}
		t.Skipf("%s missing: install Debian package libnginx-mod-stream", module)
	}
	r, _ := runQuick(t, "-rates", "2000", "-forwarders", "raw,nginx", "-clients", "none")
	require.Len(t, r.Samples, 2)
	for _, s := range r.Samples {
		assert.Positive(t, s.RoundTrips, s.Forwarder)
	}
}
