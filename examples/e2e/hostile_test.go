package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/ppv2"

	"github.com/cidroute/cidroute/internal/testtool"
)

// The hostile-input suite: each attack of the hardening review (issue 15)
// replayed against the cidproxy binary, built and run as an operator runs
// it. A case starts its own processes from its own config, attacks, and
// checks what was refused and what was counted; every process it started
// must then balance its counters (received = forwarded + Σ dropped, per
// service and direction) and stop within 2 s of SIGTERM.
//
// A case is a hostileCase in hostileCases: its issue item, and a function
// of the environment (the binary, a directory, PPv2 echo backends).
//
//	go test -run TestHostile -v ./examples/e2e/
type hostileCase struct {
	name string
	item int // the item of issue 15
	run  func(t *testing.T, env *hostileEnv)
}

var hostileCases = []hostileCase{
	{"a reply aimed at a sibling service or the proxy itself goes nowhere", 1, attackReflection},
	{"a backend at the proxy's own address is refused", 1, attackOwnBackend},
	{"mixed datagrams count against handshake_pps", 2, attackMixedDTLS},
	{"coalesced QUIC packets count against handshake_pps and zero_rtt_pps", 2, attackMixedQUIC},
	{"rejected reloads are counted and logged per cause", 4, attackRejectedReloads},
	{"an empty backends_file keeps the live sessions", 5, attackEmptyBackendsFile},
	{"tiny durations are refused", 6, attackTinyDurations},
	{"a second instance does not join the port", 7, attackSecondInstance},
	{"config key case, repeats and broadcast are refused", 9, attackConfigKeys},
	{"a FIFO as backends_file blocks nothing", 10, attackFIFO},
	{"a FIFO as cid_keys_file blocks nothing", 10, attackFIFOKeys},
	{"one client socket keeps two transparent sessions", 8, attackTwoSessionsOneSocket},
}

func TestHostile(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "cidproxy")
	if out, err := exec.Command("go", "build", "-o", bin, "../cidproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range hostileCases {
		t.Run(fmt.Sprintf("15.%d %s", c.item, c.name), func(t *testing.T) {
			c.run(t, newHostileEnv(t, bin))
		})
	}
}

// hostileEnv is what a case works with.
type hostileEnv struct {
	bin      string
	dir      string
	backends []*testecho.Echo // three PPv2 echo backends, ordinals 0-2
}

func newHostileEnv(t *testing.T, bin string) *hostileEnv {
	env := &hostileEnv{bin: bin, dir: t.TempDir()}
	for range 3 {
		env.backends = append(env.backends, testecho.Start(t, testecho.Config{PPv2: true}))
	}
	return env
}

// backendList is the JSON list of the first n backends, all ready.
func (env *hostileEnv) backendList(n int) string {
	var l []string
	for i, b := range env.backends[:n] {
		l = append(l, fmt.Sprintf(`{"ordinal": %d, "address": "%v"}`, i, b.Addr()))
	}
	return "[" + strings.Join(l, ", ") + "]"
}

// write replaces a file of the environment atomically and returns its path.
func (env *hostileEnv) write(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(env.dir, name)
	require.NoError(t, os.WriteFile(path+".tmp", []byte(body), 0o644))
	require.NoError(t, os.Rename(path+".tmp", path))
	return path
}

// check runs -check on the config body; a check that has not exited
// within 15 s fails the test (it takes milliseconds: 150 runs took at
// most 147 ms here; the bound is for a hang, on a loaded CI machine).
func (env *hostileEnv) check(t *testing.T, body string) (code int, out string) {
	t.Helper()
	return env.exec(t, body, "-check")
}

// run starts cidproxy with body (written where check writes it) and
// returns its exit code and output, for a start that must refuse.
func (env *hostileEnv) run(t *testing.T, body string) (code int, out string) {
	t.Helper()
	return env.exec(t, body)
}

func (env *hostileEnv) exec(t *testing.T, body string, flags ...string) (code int, out string) {
	t.Helper()
	path := env.write(t, "check.json", body)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, env.bin, append(flags, "-config", path)...).CombinedOutput()
	require.NoError(t, ctx.Err(), "cidproxy %v did not exit within 15 s", flags)
	if err == nil {
		return 0, string(b)
	}
	ee, ok := err.(*exec.ExitError)
	require.True(t, ok, "%v", err)
	return ee.ExitCode(), string(b)
}

// A proxyProc is one running cidproxy.
type proxyProc struct {
	cmd     *exec.Cmd
	logs    testtool.SyncBuffer
	metrics string
	exited  chan error
	stopped bool
}

// start runs the binary on a config whose metrics_listen it fills in
// (%METRICS%), waits until /metrics answers, and registers the stop and
// the counter check for the end of the test.
func (env *hostileEnv) start(t *testing.T, name, body string, args ...string) *proxyProc {
	t.Helper()
	p := &proxyProc{metrics: fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp")), exited: make(chan error, 1)}
	path := env.write(t, name+".json", strings.ReplaceAll(body, "%METRICS%", p.metrics))
	p.cmd = exec.Command(env.bin, append(args, "-config", path)...)
	p.cmd.Stderr = &p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if !p.stopped {
			p.stop(t)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, p.logs.String())
		}
	})
	waitUntil(t, 10*time.Second, name+" metrics", func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited at start: %v\n%s", name, err, p.logs.String())
		default:
		}
		_, err := p.tryScrape()
		return err == nil
	})
	return p
}

func (p *proxyProc) tryScrape() (map[string]float64, error) {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return testtool.ParseMetrics(resp.Body)
}

func (p *proxyProc) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := p.tryScrape()
	require.NoError(t, err)
	return m
}

// metric reads one series, "" labels meaning the service's "svc".
func (p *proxyProc) metric(t *testing.T, series string) float64 {
	return p.scrape(t)[series]
}

// balanced waits until every service's counters balance in both
// directions and stand still between two scrapes, and returns the last
// scrape. Workers publish after each batch, so a scrape may run ahead of
// an outcome for a moment, or miss a whole last batch whose replies
// (relayed by a transparent session's goroutine) reached the client
// before the worker published it: balanced, but short.
func (p *proxyProc) balanced(t *testing.T) map[string]float64 {
	t.Helper()
	var m, prev map[string]float64
	var why string
	ok := waitFor(10*time.Second, func() bool {
		m = p.scrape(t)
		why = imbalance(m)
		if why == "" && !sameDatagrams(prev, m) {
			why = "counters still moving"
		}
		prev = m
		return why == ""
	})
	require.True(t, ok, "counters do not balance: %s", why)
	return m
}

// sameDatagrams reports whether a and b have the same cidroute_datagrams_*
// series with the same values (false when a is nil: no earlier scrape).
func sameDatagrams(a, b map[string]float64) bool {
	if a == nil {
		return false
	}
	n := 0
	for k, v := range b {
		if strings.HasPrefix(k, "cidroute_datagrams_") {
			if w, ok := a[k]; !ok || w != v {
				return false
			}
			n++
		}
	}
	for k := range a {
		if strings.HasPrefix(k, "cidroute_datagrams_") {
			n--
		}
	}
	return n == 0
}

// imbalance returns "" when received = Σ datagrams_total for every
// service and direction in m, and each has its received series: a scrape
// without them (a renamed metric, an empty page) balances nothing.
func imbalance(m map[string]float64) string {
	sums := map[string]float64{}
	for k, v := range m {
		if rest, ok := strings.CutPrefix(k, "cidroute_datagrams_total{"); ok {
			sums[seriesKey(rest)] += v
		}
	}
	var bad []string
	received := map[string]bool{}
	for k, v := range m {
		if rest, ok := strings.CutPrefix(k, "cidroute_datagrams_received_total{"); ok {
			key := seriesKey(rest)
			received[key] = true
			if sums[key] != v {
				bad = append(bad, fmt.Sprintf("%s received %v, outcomes %v", key, v, sums[key]))
			}
		}
	}
	if len(received) == 0 {
		return "no cidroute_datagrams_received_total series"
	}
	for key := range sums {
		if !received[key] {
			bad = append(bad, key+" has outcomes but no received series")
		}
	}
	return strings.Join(bad, "; ")
}

// seriesKey keeps the direction and service labels of a label set.
func seriesKey(labels string) string {
	var dir, svc string
	for _, l := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
		switch {
		case strings.HasPrefix(l, "direction="):
			dir = l
		case strings.HasPrefix(l, "service="):
			svc = l
		}
	}
	return svc + "," + dir
}

// stop sends SIGTERM and requires a clean exit within 2 s, after checking
// that the counters balance.
func (p *proxyProc) stop(t *testing.T) {
	t.Helper()
	p.stopped = true
	select {
	case err := <-p.exited:
		t.Fatalf("exited before SIGTERM: %v", err)
	default:
	}
	p.balanced(t)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		require.NoError(t, err, "exit status")
	case <-time.After(2 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		t.Fatal("did not exit within 2 s of SIGTERM")
	}
}

// ordinal-first CIDs of 8 bytes, the DTLS default.
var dtlsCIDs = dtls.OrdinalFirst{Length: 8}

// cidRecord is a tls12_cid record of a session on backend ord.
func cidRecord(t *testing.T, ord uint8, seq uint64) []byte {
	cid, err := dtlsCIDs.AppendCID(nil, ord)
	require.NoError(t, err)
	return soakCIDRecord(cid, seq, []byte("session data"))
}

// echoes sends msg from a fresh socket and reports whether the echo came
// back from service within a second.
func echoes(t *testing.T, service netip.AddrPort, msg []byte) bool {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.WriteToUDPAddrPort(msg, service)
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 2048)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	return err == nil && from == service && string(buf[:n]) == string(msg)
}

func freeService(t *testing.T) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), testtool.FreePort(t, "udp"))
}

func waitUntil(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	if !waitFor(limit, ok) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

func waitFor(limit time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// startFromFile starts a proxy whose one DTLS service "svc" reads the
// first n backends from backends.json, and waits until it has them.
func (env *hostileEnv) startFromFile(t *testing.T, n int) (netip.AddrPort, *proxyProc) {
	t.Helper()
	env.write(t, "backends.json", env.backendList(n))
	svc := freeService(t)
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "backends_file": "backends.json"}]}`, svc))
	waitUntil(t, 10*time.Second, "backends", func() bool {
		return p.metric(t, `cidroute_registry_backends{service="svc",state="ready"}`) == float64(n)
	})
	return svc, p
}

const rejectedSeries = `cidroute_registry_rejected_updates_total{service="svc"}`

// 15.4: a hostile or careless writer of the backends file cycles through
// distinct bad contents within one log window. Every one is counted, each
// cause is logged, the sessions keep their backends.
func attackRejectedReloads(t *testing.T, env *hostileEnv) {
	svc, p := env.startFromFile(t, 2)
	require.True(t, echoes(t, svc, cidRecord(t, 1, 1)))
	for i, bad := range []struct{ body, cause string }{
		{`[{"ordinal": 0, "address": `, "unexpected EOF"},
		{`[{"ordinal": 0, "adress": "127.0.0.1:9"}]`, `unknown key \"adress\"`},
		{`[{"ordinal": 255, "address": "127.0.0.1:9"}]`, "ordinal 255 is reserved"},
		{`[{"ordinal": 1, "address": "127.0.0.1:9"}, {"ordinal": 1, "address": "127.0.0.1:10"}]`, "duplicate ordinal"},
		{`{"ordinal": 0}`, "cannot unmarshal object"},
		{"[" + strings.Repeat(" ", 1<<20) + "]", "larger than 1 MiB"},
	} {
		env.write(t, "backends.json", bad.body)
		waitUntil(t, 10*time.Second, "rejection of "+bad.cause, func() bool { return p.metric(t, rejectedSeries) == float64(i+1) })
		waitUntil(t, 10*time.Second, "log of "+bad.cause, func() bool { return strings.Contains(p.logs.String(), bad.cause) })
		require.True(t, echoes(t, svc, cidRecord(t, 1, uint64(i+2))), "the session keeps its backend")
	}
	require.Equal(t, float64(1), p.metric(t, `cidroute_registry_snapshot_version{service="svc"}`), "no bad list was published")
}

// 15.5: the backends file is emptied while a session is live: refused
// like an empty inline list, counted, and the session's datagrams keep
// reaching its backend instead of dropping as unknown_ordinal.
func attackEmptyBackendsFile(t *testing.T, env *hostileEnv) {
	svc, p := env.startFromFile(t, 3)
	require.True(t, echoes(t, svc, cidRecord(t, 2, 1)))
	env.write(t, "backends.json", `[]`)
	waitUntil(t, 10*time.Second, "rejection", func() bool { return p.metric(t, rejectedSeries) == 1 })
	for seq := range uint64(5) {
		require.True(t, echoes(t, svc, cidRecord(t, 2, seq+2)), "the live session still reaches its backend")
	}
	m := p.balanced(t)
	unknown, ok := m[`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="unknown_ordinal",service="svc"}`]
	require.True(t, ok, "the unknown_ordinal series is exported")
	require.Zero(t, unknown)
	require.Equal(t, float64(3), m[`cidroute_registry_backends{service="svc",state="ready"}`])
	require.Contains(t, p.logs.String(), "empty backend list")

	// -check and an inline list say the same.
	code, out := env.check(t, fmt.Sprintf(`{"services": [{"name": "svc", "protocol": "dtls", "listen": "%v", "backends_file": "backends.json"}]}`, svc))
	require.Equal(t, 1, code)
	require.Contains(t, out, "the list is empty")
	code, out = env.check(t, fmt.Sprintf(`{"services": [{"name": "svc", "protocol": "dtls", "listen": "%v", "backends": []}]}`, svc))
	require.Equal(t, 1, code)
	require.Contains(t, out, "services[0].backends: the list is empty")
}

// 15.6: durations too short to work: session_idle 3ns panicked the
// process at start (NewTicker), max_registry_age 4ns spun a CPU and wrote
// tens of thousands of log lines. -check and a start refuse them, naming
// the bound.
func attackTinyDurations(t *testing.T, env *hostileEnv) {
	env.write(t, "backends.json", env.backendList(1))
	for _, tc := range []struct{ keys, want string }{
		{`"proxy_protocol": false, "session_idle": "3ns"`, `session_idle: "3ns" is less than 1s`},
		{`"max_registry_age": "4ns"`, `max_registry_age: "4ns" is less than 3s; write "0s" (off, the default) or a Go duration of at least "3s"`},
		{`"max_registry_age": "2999ms"`, `"2999ms" is less than 3s`},
	} {
		body := fmt.Sprintf(`{"services": [{"name": "svc", "protocol": "dtls", "listen": "%v", "backends_file": "backends.json", %s}]}`, freeService(t), tc.keys)
		code, out := env.check(t, body)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, tc.want)
		// A start refuses it the same way, without a panic.
		path := env.write(t, "run.json", body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b, err := exec.CommandContext(ctx, env.bin, "-config", path).CombinedOutput()
		cancel()
		require.Error(t, err)
		require.Contains(t, string(b), tc.want)
		require.NotContains(t, string(b), "panic")
	}
}

// 15.7: a second cidproxy with other backends is started on the listen
// address of a running one with workers > 1 (SO_REUSEPORT): it must fail
// with a clear error, and the first keeps all the traffic. -join, the
// handover opt-in, lets it in, and then the kernel spreads datagrams over
// both.
func attackSecondInstance(t *testing.T, env *hostileEnv) {
	svc := freeService(t)
	config := func(backends string) string {
		return fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
			{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 2, "backends": %s}]}`, svc, backends)
	}
	first := env.start(t, "first", config(env.backendList(1)))
	// The intruder routes to its own backend (ordinal 0 at backend 2).
	intruder := fmt.Sprintf(`[{"ordinal": 0, "address": "%v"}]`, env.backends[2].Addr())
	path := env.write(t, "second.json", strings.ReplaceAll(config(intruder), "%METRICS%", fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	out, err := exec.CommandContext(ctx, env.bin, "-config", path).CombinedOutput()
	require.NoError(t, ctx.Err(), "the second instance kept running:\n%s", out)
	cancel()
	require.Error(t, err, "the second instance started:\n%s", out)
	require.Contains(t, string(out), "address already in use")
	require.Contains(t, string(out), "-join")

	const n = 64
	for i := range n {
		require.True(t, echoes(t, svc, cidRecord(t, 0, uint64(i))))
	}
	require.Equal(t, uint64(n), env.backends[0].Received(), "every datagram through the first instance")
	require.Zero(t, env.backends[2].Received())

	// With -join the operator asks for it: both instances take traffic.
	second := env.start(t, "second", config(intruder), "-join")
	got := 0
	for i := range n {
		if echoes(t, svc, cidRecord(t, 0, uint64(n+i))) {
			got++
		}
	}
	require.Equal(t, n, got)
	require.Positive(t, env.backends[2].Received(), "the joined instance received some")
	require.Greater(t, env.backends[0].Received(), uint64(n), "the first instance still receives")
	first.balanced(t)
	second.balanced(t)
}

// 15.9: keys that encoding/json would take (another case, a repeat that
// overrides the first) and a broadcast listen address, also IPv4-mapped.
func attackConfigKeys(t *testing.T, env *hostileEnv) {
	svc := fmt.Sprintf(`{"name": "svc", "protocol": "dtls", "listen": "%v", "backends": %s}`, freeService(t), env.backendList(1))
	for _, tc := range []struct{ body, want string }{
		{`{"hrw_seed": 1, "HRW_SEED": 2, "services": [` + svc + `]}`, `HRW_SEED: unknown key; write "hrw_seed" (keys are lower case)`},
		{`{"hrw_seed": 1, "hrw_seed": 2, "services": [` + svc + `]}`, `hrw_seed: given twice in one object`},
		{`{"services": [` + svc[:len(svc)-1] + `, "Workers": 2}]}`, `services[0].Workers: unknown key`},
		{`{"services": [` + svc[:len(svc)-1] + `, "backends": []}]}`, `services[0].backends: given twice in one object`},
		{`{"services": [` + strings.Replace(svc, "127.0.0.1", "255.255.255.255", 1) + `]}`, "broadcast"},
		{`{"services": [` + strings.Replace(svc, "127.0.0.1", "[::ffff:255.255.255.255]", 1) + `]}`, "broadcast"},
	} {
		code, out := env.check(t, tc.body)
		require.Equal(t, 1, code, "accepted: %s", tc.body)
		require.Contains(t, out, tc.want)
	}
}

// 15.10: a FIFO as backends_file made -check wait for a writer forever and
// a running proxy ignore SIGTERM. Both now refuse it at once, alike (issue
// 35: a start used to run the service with no backends); a FIFO put in
// the file's place at run time is counted, and the proxy stops within 2 s
// (stop checks that).
func attackFIFO(t *testing.T, env *hostileEnv) {
	fifo := filepath.Join(env.dir, "backends.json")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	t.Cleanup(func() { // unblock a reader, should the test fail
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	svc := freeService(t)
	body := fmt.Sprintf(`{"services": [{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "backends_file": "backends.json"}]}`, svc)
	code, out := env.check(t, body)
	require.Equal(t, 1, code)
	require.Contains(t, out, "not a regular file")

	startCode, startOut := env.run(t, body)
	require.Equal(t, 1, startCode, "a start refuses what -check refuses")
	require.Equal(t, out, startOut, "with the same message")

	file := filepath.Join(env.dir, "good.json")
	require.NoError(t, os.WriteFile(file, []byte(`[{"ordinal": 0, "address": "127.0.0.1:9"}]`), 0o600))
	require.NoError(t, os.Rename(fifo, filepath.Join(env.dir, "fifo")))
	require.NoError(t, os.Rename(file, fifo))
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "backends_file": "backends.json"}]}`, svc))
	require.NoError(t, os.Rename(filepath.Join(env.dir, "fifo"), fifo)) // the FIFO back in the file's place
	waitUntil(t, 10*time.Second, "rejection", func() bool { return p.metric(t, rejectedSeries) >= 1 })
	require.Contains(t, p.logs.String(), "not a regular file")
}

// 15.10, the key file's turn: a FIFO as cid_keys_file made -check and a
// start wait for a writer (the open blocked) and ignore SIGTERM. Both now
// refuse it at once, as for backends_file.
func attackFIFOKeys(t *testing.T, env *hostileEnv) {
	fifo := filepath.Join(env.dir, "keys.json")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	t.Cleanup(func() { // unblock a reader, should the test fail
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	body := fmt.Sprintf(`{"services": [{"name": "svc", "protocol": "quic", "listen": "%v", "backends": %s,
		"cid_codec": "quic-lb-encrypted", "cid_keys_file": "keys.json"}]}`, freeService(t), env.backendList(1))
	code, out := env.check(t, body)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "not a regular file")

	path := env.write(t, "run.json", body)
	cmd := exec.Command(env.bin, "-config", path)
	var logs testtool.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		require.Error(t, err, "started on a FIFO key file:\n%s", logs.String())
		require.Contains(t, logs.String(), "not a regular file")
	case <-time.After(2 * time.Second):
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			t.Fatalf("the start waited on the FIFO (it stopped at SIGTERM):\n%s", logs.String())
		case <-time.After(2 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Fatalf("the start waited on the FIFO and ignored SIGTERM:\n%s", logs.String())
		}
	}
}

// Series of the proxy's datagram counters (socket path).
func receivedSeries(svc, dir string) string {
	return fmt.Sprintf(`cidroute_datagrams_received_total{direction=%q,path="socket",service=%q}`, dir, svc)
}

// kernelDropsSeries: what the kernel dropped on the sockets of svc that
// receive in direction dir, before the proxy read it.
func kernelDropsSeries(svc, dir string) string {
	return fmt.Sprintf(`cidroute_kernel_drops_total{direction=%q,service=%q}`, dir, svc)
}

// accepted is what the kernel accepted for svc in direction dir: what the
// proxy received, and what its full receive queues dropped.
func (p *proxyProc) accepted(t *testing.T, svc, dir string) float64 {
	m := p.scrape(t)
	return m[receivedSeries(svc, dir)] + m[kernelDropsSeries(svc, dir)]
}

func forwardedSeries(svc, dir string) string {
	return fmt.Sprintf(`cidroute_datagrams_total{direction=%q,outcome="forwarded",path="socket",reason="",service=%q}`, dir, svc)
}

func droppedSeries(svc, dir, reason string) string {
	return fmt.Sprintf(`cidroute_datagrams_total{direction=%q,outcome="dropped",path="socket",reason=%q,service=%q}`, dir, reason, svc)
}

// 15.1: a registered backend of service a (a socket of the test's) answers
// with PPv2 destinations that are the proxy itself: the sibling service
// b's listen address, a's own, a's upstream socket. Relayed, the first
// would loop between a and b for ever. Each is dropped as bad_destination
// and b never receives a datagram; a reply to the real client still
// arrives.
func attackReflection(t *testing.T, env *hostileEnv) {
	hostile, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer hostile.Close()
	hostileAddr := hostile.LocalAddr().(*net.UDPAddr).AddrPort()
	a, b := freeService(t), freeService(t)
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "a", "protocol": "dtls", "listen": "%v", "workers": 1, "backends": [{"ordinal": 0, "address": "%v"}]},
		{"name": "b", "protocol": "dtls", "listen": "%v", "workers": 1, "backends": %s}]}`, a, hostileAddr, b, env.backendList(1)))

	// A client's datagram reaches the hostile backend: the upstream
	// socket it came from is where replies go.
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer client.Close()
	clientAddr := client.LocalAddr().(*net.UDPAddr).AddrPort()
	_, err = client.WriteToUDPAddrPort(cidRecord(t, 0, 1), a)
	require.NoError(t, err)
	buf := make([]byte, 2048)
	hostile.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, upstream, err := hostile.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)

	// The payload is a datagram b would route to its backend, and that
	// backend's echo would come back through b: a loop, had a relayed it.
	payload := cidRecord(t, 0, 2)
	reply := func(dst netip.AddrPort) {
		h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: a, Dst: dst})
		require.NoError(t, err)
		_, err = hostile.WriteToUDPAddrPort(append(h, payload...), upstream)
		require.NoError(t, err)
	}
	const rounds = 20
	for range rounds {
		for _, dst := range []netip.AddrPort{b, a, upstream} {
			reply(dst)
		}
	}
	reply(clientAddr) // the one legitimate reply
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := client.ReadFromUDPAddrPort(buf)
	require.NoError(t, err, "the reply to the client")
	require.Equal(t, a, from)
	require.Equal(t, payload, buf[:n])

	waitUntil(t, 10*time.Second, "every reply counted", func() bool {
		return p.metric(t, receivedSeries("a", "reverse")) == 3*rounds+1
	})
	m := p.balanced(t)
	require.Equal(t, float64(3*rounds), m[droppedSeries("a", "reverse", "bad_destination")], "every reply to the proxy itself")
	require.Equal(t, float64(1), m[forwardedSeries("a", "reverse")])
	require.Zero(t, m[receivedSeries("b", "forward")], "nothing reached the sibling service")
	require.Zero(t, env.backends[0].Received(), "nor its backend")
	// Nothing keeps going: a second look finds the same counts.
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, float64(3*rounds+1), p.metric(t, receivedSeries("a", "reverse")))
	require.Zero(t, p.metric(t, receivedSeries("b", "forward")))
}

// 15.1, forward: a configuration naming the proxy's own listen address
// (the service's, or a sibling's) as a backend made one datagram a storm
// of datagrams and, in transparent mode, of sessions. -check refuses it
// now, as a start does.
func attackOwnBackend(t *testing.T, env *hostileEnv) {
	a, b := freeService(t), freeService(t)
	for name, body := range map[string]string{
		"its own listen address": fmt.Sprintf(`{"services": [{"name": "a", "protocol": "dtls", "listen": "%v", "proxy_protocol": false,
			"backends": [{"ordinal": 0, "address": "%v"}]}]}`, a, a),
		"a sibling's listen address": fmt.Sprintf(`{"services": [
			{"name": "a", "protocol": "dtls", "listen": "%v", "backends": [{"ordinal": 0, "address": "%v"}]},
			{"name": "b", "protocol": "dtls", "listen": "%v", "backends": %s}]}`, a, b, b, env.backendList(1)),
		"a wildcard listen's port": fmt.Sprintf(`{"services": [{"name": "a", "protocol": "dtls", "listen": "0.0.0.0:%d",
			"backends": [{"ordinal": 0, "address": "127.0.0.1:%d"}]}]}`, a.Port(), a.Port()),
	} {
		code, out := env.check(t, body)
		require.Equal(t, 1, code, "%s: -check accepted it:\n%s", name, out)
		require.Contains(t, out, "is an address of this proxy", name)
		path := env.write(t, "run.json", body)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := exec.CommandContext(ctx, env.bin, "-config", path).CombinedOutput()
		cancel()
		require.Error(t, err, "%s: started:\n%s", name, got)
		require.Contains(t, string(got), "is an address of this proxy", name)
	}
}

// hostileLimit is the handshake_pps and zero_rtt_pps of the mixing
// attacks; a burst may take one second's worth, and the test's own
// duration adds some.
const hostileLimit = 5

// admittedAtMost is what the limit lets through in elapsed.
func admittedAtMost(elapsed time.Duration) float64 {
	return float64(hostileLimit) * (1 + elapsed.Seconds() + 0.5)
}

// 15.2, DTLS: a ClientHello followed by a tls12_cid record of a live
// ordinal was classified established and escaped handshake_pps, and the
// backend then opened a session for the ClientHello. Every such datagram
// counts against the limit now; plain session records do not.
func attackMixedDTLS(t *testing.T, env *hostileEnv) {
	svc := freeService(t)
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "backends": %s, "limits": {"handshake_pps": %d}}]}`,
		svc, env.backendList(3), hostileLimit))
	hello := soakCaptureHello(t)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	const n = 200
	start := time.Now()
	for i := range n {
		_, err := c.WriteToUDPAddrPort(append(bytes.Clone(hello), cidRecord(t, 1, uint64(i))...), svc)
		require.NoError(t, err)
	}
	elapsed := time.Since(start)
	waitUntil(t, 10*time.Second, "every datagram counted", func() bool { return p.accepted(t, "svc", "forward") == n })
	m := p.balanced(t)
	fwd, limited := m[forwardedSeries("svc", "forward")], m[droppedSeries("svc", "forward", "rate_limited")]
	kd := m[kernelDropsSeries("svc", "forward")]
	t.Logf("%d mixed datagrams in %v: %v forwarded, %v rate_limited, %v dropped by the kernel", n, elapsed, fwd, limited, kd)
	require.LessOrEqual(t, fwd, admittedAtMost(elapsed), "handshake_pps was bypassed")
	require.Equal(t, float64(n), fwd+limited+kd)
	// The limit is on handshakes, not on sessions.
	for i := range 20 {
		require.True(t, echoes(t, svc, cidRecord(t, 1, uint64(n+i))), "a session record is not limited")
	}
}

// 15.2, QUIC: a Handshake packet (routed by its server CID) coalesced in
// front of an Initial or a 0-RTT packet cleared both flags. Each datagram
// with an Initial anywhere counts against handshake_pps, each with a
// 0-RTT packet against zero_rtt_pps.
func attackMixedQUIC(t *testing.T, env *hostileEnv) {
	svc := freeService(t)
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "svc", "protocol": "quic", "listen": "%v", "workers": 1, "backends": %s,
		 "limits": {"handshake_pps": %d, "zero_rtt_pps": %d}}]}`, svc, env.backendList(3), hostileLimit, hostileLimit))
	r := rand.New(rand.NewPCG(15, 2))
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	const n = 100 // of each kind
	var total float64
	// A burst of 1,300-byte datagrams may overflow the service socket's
	// default buffer on a busy machine: the kernel's drops are counted.
	for _, typ := range []byte{0, 1} { // Initial, 0-RTT
		before := forwardCounts(p.scrape(t))
		start := time.Now()
		for range n {
			cid := soakLBCID(r, 1) // ordinal 1 is live
			d := append(soakQUICLong(r, 2, cid, 100), soakQUICLong(r, typ, cid, 1200)...)
			_, err := c.WriteToUDPAddrPort(d, svc)
			require.NoError(t, err)
		}
		elapsed := time.Since(start)
		total += n
		waitUntil(t, 10*time.Second, "every datagram counted", func() bool { return p.accepted(t, "svc", "forward") == total })
		m := p.balanced(t)
		fwd := m[forwardedSeries("svc", "forward")] - before.fwd
		limited := m[droppedSeries("svc", "forward", "rate_limited")] - before.limited
		kd := m[kernelDropsSeries("svc", "forward")] - before.kernel
		t.Logf("packet type %d behind a Handshake: %d datagrams in %v, %v forwarded, %v rate_limited, %v dropped by the kernel", typ, n, elapsed, fwd, limited, kd)
		require.LessOrEqual(t, fwd, admittedAtMost(elapsed), "the limit of packet type %d was bypassed", typ)
		require.Equal(t, float64(n), fwd+limited+kd)
	}
	// A Handshake packet alone is a session's, and not limited.
	const alone = 50
	before := forwardCounts(p.scrape(t))
	for range alone {
		_, err := c.WriteToUDPAddrPort(soakQUICLong(r, 2, soakLBCID(r, 1), 200), svc)
		require.NoError(t, err)
	}
	waitUntil(t, 10*time.Second, "every datagram counted", func() bool {
		return p.accepted(t, "svc", "forward") == total+alone
	})
	m := p.balanced(t)
	require.Equal(t, float64(alone), m[forwardedSeries("svc", "forward")]-before.fwd+m[kernelDropsSeries("svc", "forward")]-before.kernel)
	require.Zero(t, m[droppedSeries("svc", "forward", "rate_limited")]-before.limited, "a Handshake packet alone is not limited")
}

// fwdCounts are the forward counters the QUIC mixing attack compares.
type fwdCounts struct{ fwd, limited, kernel float64 }

func forwardCounts(m map[string]float64) fwdCounts {
	return fwdCounts{m[forwardedSeries("svc", "forward")], m[droppedSeries("svc", "forward", "rate_limited")],
		m[kernelDropsSeries("svc", "forward")]}
}

// 15.8: one client socket talks to two backends at once in transparent
// mode (quic-go's Transport runs several connections on one socket).
// Each datagram to the other backend used to close the first session's
// upstream socket and lose its replies; both sessions live now, and
// every reply arrives.
func attackTwoSessionsOneSocket(t *testing.T, env *hostileEnv) {
	echo0 := testecho.Start(t, testecho.Config{Prefix: "0|"})
	echo1 := testecho.Start(t, testecho.Config{Prefix: "1|"})
	svc := freeService(t)
	p := env.start(t, "proxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "services": [
		{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "proxy_protocol": false,
		 "backends": [{"ordinal": 0, "address": "%v"}, {"ordinal": 1, "address": "%v"}]}]}`, svc, echo0.Addr(), echo1.Addr()))
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	const rounds = 50
	got := map[string]int{}
	buf := make([]byte, 2048)
	for i := range rounds {
		// Both sessions' datagrams before either reply, as two
		// connections on one socket send.
		for _, ord := range []uint8{0, 1} {
			_, err := c.WriteToUDPAddrPort(cidRecord(t, ord, uint64(i)), svc)
			require.NoError(t, err)
		}
		for range 2 {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			require.NoError(t, err, "round %d: a reply is missing (so far %v)", i, got)
			require.Equal(t, svc, from)
			require.GreaterOrEqual(t, n, 2)
			got[string(buf[:2])]++
		}
	}
	require.Equal(t, map[string]int{"0|": rounds, "1|": rounds}, got)
	m := p.balanced(t)
	require.Equal(t, float64(2*rounds), m[forwardedSeries("svc", "forward")])
	require.Equal(t, float64(2*rounds), m[forwardedSeries("svc", "reverse")], "every reply relayed")
	require.Equal(t, float64(2), m[`cidroute_sessions{service="svc"}`], "two sessions, one client socket")
}

// TestImbalance: the balance check fails where there is nothing to
// balance, and where outcomes have no received series.
func TestImbalance(t *testing.T) {
	require.NotEmpty(t, imbalance(map[string]float64{}), "no series")
	require.NotEmpty(t, imbalance(map[string]float64{forwardedSeries("svc", "forward"): 3}), "outcomes alone")
	m := map[string]float64{
		receivedSeries("svc", "forward"):                      3,
		forwardedSeries("svc", "forward"):                     2,
		droppedSeries("svc", "forward", "rate_limited"):       1,
		receivedSeries("svc", "reverse"):                      0,
		droppedSeries("svc", "reverse", "bad_destination"):    0,
		droppedSeries("other", "reverse", "untrusted_sender"): 0,
		receivedSeries("other", "reverse"):                    0,
	}
	require.Empty(t, imbalance(m))
	m[droppedSeries("svc", "forward", "malformed")] = 1
	require.NotEmpty(t, imbalance(m))
}
