package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/internal/testtool"
)

// The restart handover (issue 16 §3) end to end: cidproxy replaced on a
// host under examples/loadgen at 50,000 datagrams/s, by the same build (a
// restart) and by another one (an upgrade: the builds differ in their
// -ldflags -X version), each with one command, the running one's command
// line. Nothing is lost: the backends receive what loadgen sent, loadgen
// gets every echo, and each process's counters balance and add up, across
// processes, to what was sent.
//
//	go test -run TestHandover -v ./examples/e2e/

const versionVar = "github.com/cidroute/cidroute/examples/internal/proxyapp.Version"

// proxyBuilds builds cidproxy as two versions and loadgen into dir.
type proxyBuilds struct{ v1, v2, loadgen string }

// The builds are shared by the tests of one run (TestMain removes them).
var (
	buildsOnce sync.Once
	builds     proxyBuilds
	buildsDir  string
	buildsErr  error
)

func buildProxies(t *testing.T) proxyBuilds {
	t.Helper()
	buildsOnce.Do(func() {
		if buildsDir, buildsErr = os.MkdirTemp("", "cidroute-e2e-builds-"); buildsErr != nil {
			return
		}
		dir := buildsDir
		b := proxyBuilds{filepath.Join(dir, "cidproxy-v1"), filepath.Join(dir, "cidproxy-v2"), filepath.Join(dir, "loadgen")}
		for _, c := range [][]string{
			{"-o", b.v1, "-ldflags", "-X " + versionVar + "=e2e-v1", "../cidproxy"},
			{"-o", b.v2, "-ldflags", "-X " + versionVar + "=e2e-v2", "../cidproxy"},
			{"-o", b.loadgen, "../loadgen"},
		} {
			if out, err := exec.Command("go", append([]string{"build"}, c...)...).CombinedOutput(); err != nil {
				buildsErr = fmt.Errorf("go build %v: %v\n%s", c, err, out)
				return
			}
		}
		builds = b
	})
	if buildsErr != nil {
		t.Fatal(buildsErr)
	}
	return builds
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildsDir != "" {
		os.RemoveAll(buildsDir)
	}
	os.Exit(code)
}

// A cidproxyProc is one cidproxy process.
type cidproxyProc struct {
	name    string
	cmd     *exec.Cmd
	logs    testtool.SyncBuffer
	exited  chan error
	metrics string
}

func startCidproxy(t *testing.T, name, bin, metrics string, args ...string) *cidproxyProc {
	t.Helper()
	p := &cidproxyProc{name: name, cmd: exec.Command(bin, args...), exited: make(chan error, 1), metrics: metrics}
	p.cmd.Stderr = &p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
				p.cmd.Process.Kill()
				<-p.exited
			}
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", p.name, p.logs.String())
		}
	})
	return p
}

func (p *cidproxyProc) waitLog(t *testing.T, what string, within time.Duration) {
	t.Helper()
	waitUntil(t, within, p.name+": "+what, func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("%s exited (%v) before %q:\n%s", p.name, err, what, p.logs.String())
		default:
		}
		return strings.Contains(p.logs.String(), what)
	})
}

// waitExit waits for the process to exit on its own and returns its
// error (nil for status 0).
func (p *cidproxyProc) waitExit(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v", p.name, within)
		return nil
	}
}

// stop sends SIGTERM and waits for a clean exit within 2 s.
func (p *cidproxyProc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.waitExit(t, 2*time.Second), "%s exit status", p.name)
}

func (p *cidproxyProc) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	m, err := testtool.ParseMetrics(resp.Body)
	require.NoError(t, err)
	return m
}

// procCounters are a process's final counters of one service and
// direction, from its "final counters" log line.
type procCounters struct {
	Received, Forwarded, Dropped uint64
	Drops                        string
}

var finalCountersLine = regexp.MustCompile(`msg="final counters" service=(\S+) direction=(\S+) received=(\d+) forwarded=(\d+) dropped=(\d+) balanced=(\S+) drops=(\S*)`)

// finals returns the process's final counters by "service direction",
// each required to balance. The process must have exited.
func (p *cidproxyProc) finals(t *testing.T) map[string]procCounters {
	t.Helper()
	out := map[string]procCounters{}
	for _, m := range finalCountersLine.FindAllStringSubmatch(p.logs.String(), -1) {
		var c procCounters
		c.Received, _ = strconv.ParseUint(m[3], 10, 64)
		c.Forwarded, _ = strconv.ParseUint(m[4], 10, 64)
		c.Dropped, _ = strconv.ParseUint(m[5], 10, 64)
		c.Drops = strings.Trim(m[7], `"`)
		require.Equal(t, "true", m[6], "%s: %s", p.name, m[0])
		require.Equal(t, c.Received, c.Forwarded+c.Dropped, "%s: %s", p.name, m[0])
		out[m[1]+" "+m[2]] = c
	}
	require.NotEmpty(t, out, "%s logged no final counters:\n%s", p.name, p.logs.String())
	return out
}

// loadgenResult is the part of loadgen's -json output the tests read.
type loadgenResult struct {
	Sent, Received, Lost, SendErrors, Foreign uint64
	OfferedPPS                                float64 `json:"offered_pps"`
}

func (r *loadgenResult) UnmarshalJSON(b []byte) error {
	var raw struct {
		Sent       uint64  `json:"sent"`
		Received   uint64  `json:"received"`
		Lost       uint64  `json:"lost"`
		SendErrors uint64  `json:"send_errors"`
		Foreign    uint64  `json:"foreign"`
		OfferedPPS float64 `json:"offered_pps"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*r = loadgenResult{raw.Sent, raw.Received, raw.Lost, raw.SendErrors, raw.Foreign, raw.OfferedPPS}
	return nil
}

// startLoadgen runs loadgen against target with args (beyond the
// defaults here); the result arrives on the channel when it ends.
func startLoadgen(t *testing.T, bin, target string, args ...string) <-chan loadgenResult {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-target", target, "-json", "-warmup", "0", "-rcvbuf", "8388608"}, args...)...)
	var stderr testtool.SyncBuffer
	cmd.Stderr = &stderr
	out := make(chan loadgenResult, 1)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		var r loadgenResult
		err := json.NewDecoder(stdout).Decode(&r)
		if werr := cmd.Wait(); err == nil {
			err = werr
		}
		if err != nil {
			t.Errorf("loadgen: %v\n%s", err, stderr.String())
		}
		out <- r
	}()
	return out
}

func TestHandover(t *testing.T) {
	bins := buildProxies(t)
	for _, tc := range []struct {
		name, next, version string
	}{
		{"restart", bins.v1, "e2e-v1"},
		{"upgrade", bins.v2, "e2e-v2"},
	} {
		t.Run(tc.name, func(t *testing.T) { handoverUnderLoad(t, bins, tc.next, tc.version) })
	}
}

// handoverLoad is loadgen's rate and duration: 50,000 datagrams/s for
// 3 s, the handover after 1 s.
const (
	handoverRate = 50000
	handoverRun  = 3 * time.Second
)

func handoverUnderLoad(t *testing.T, bins proxyBuilds, next, nextVersion string) {
	var backs []*testecho.Echo
	var list []string
	for i := range 3 {
		b := testecho.Start(t, testecho.Config{PPv2: true, Buffer: 8 << 20, Batch: 32})
		backs = append(backs, b)
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": "%v"}`, i, b.Addr()))
	}
	dir := t.TempDir()
	svc, metrics := freeService(t), fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))
	conf := filepath.Join(dir, "cidproxy.json")
	sock := filepath.Join(dir, "handover.sock")
	writeFileAtomic(t, conf, fmt.Sprintf(`{"hrw_seed": 42, "metrics_listen": %q, "services": [{"name": "svc", "protocol": "dtls",
		"listen": "%v", "workers": 2, "recv_buffer": 8388608, "send_buffer": 8388608, "backends": [%s]}]}`, metrics, svc, strings.Join(list, ", ")))
	args := []string{"-handover", sock, "-config", conf} // the one command, for every process
	old := startCidproxy(t, "old", bins.v1, metrics, args...)
	old.waitLog(t, "handover socket listening", 10*time.Second)
	old.waitLog(t, "service started", 10*time.Second)

	res := startLoadgen(t, bins.loadgen, svc.String(), "-rate", strconv.Itoa(handoverRate), "-duration", handoverRun.String(),
		"-drain", "2s", "-clients", "64", "-sockets", "2", "-ordinals", "0-2")
	time.Sleep(handoverRun / 3)
	nw := startCidproxy(t, "new", next, metrics, args...)
	require.NoError(t, old.waitExit(t, 15*time.Second), "the old process exits 0 after the handover")
	nw.waitLog(t, "handover socket listening", 10*time.Second)
	r := <-res

	var received uint64
	for _, b := range backs {
		received += b.Received()
	}
	ports := map[uint16]bool{svc.Port(): true}
	kernel := soakSockDrops(ports)
	t.Logf("loadgen: offered %.0f/s, sent %d, echoed %d, lost %d, send errors %d; backends received %d; kernel drops at the service port %d",
		r.OfferedPPS, r.Sent, r.Received, r.Lost, r.SendErrors, received, kernel)
	require.NotZero(t, r.Sent)
	assert.Zero(t, r.Lost, "datagrams lost in the round trip")
	assert.Zero(t, r.SendErrors)
	assert.Equal(t, r.Sent, received, "the backends received what loadgen sent")
	assert.Equal(t, r.Sent, r.Received, "loadgen got every echo")

	// Every datagram counted once, by one of the two processes.
	of := old.finals(t)
	m := nw.scrape(t)
	nf := m[`cidroute_datagrams_received_total{direction="forward",path="socket",service="svc"}`]
	nr := m[`cidroute_datagrams_received_total{direction="reverse",path="socket",service="svc"}`]
	nw.stop(t)
	nfin := nw.finals(t)
	t.Logf("old (e2e-v1): forward %+v, reverse %+v", of["svc forward"], of["svc reverse"])
	t.Logf("new (%s): forward %+v, reverse %+v", nextVersion, nfin["svc forward"], nfin["svc reverse"])
	assert.Equal(t, float64(nfin["svc forward"].Received), nf, "the scrape before SIGTERM saw everything")
	assert.Equal(t, float64(nfin["svc reverse"].Received), nr)
	assert.NotZero(t, of["svc forward"].Received, "the old process served before the handover")
	assert.NotZero(t, nfin["svc forward"].Received, "the new one after")
	assert.Equal(t, r.Sent, of["svc forward"].Received+nfin["svc forward"].Received)
	assert.Equal(t, r.Sent, of["svc forward"].Forwarded+nfin["svc forward"].Forwarded)
	assert.Equal(t, r.Sent, of["svc reverse"].Forwarded+nfin["svc reverse"].Forwarded)
	assert.Contains(t, old.logs.String(), "successor_version="+nextVersion)
	assert.Contains(t, nw.logs.String(), `msg="cidproxy starting" version=`+nextVersion)
	assert.Contains(t, nw.logs.String(), "from_version=e2e-v1")
}

func writeFileAtomic(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(body), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// TestReloadUnderLoad: SIGHUP applies each kind of change to a running
// cidproxy while loadgen sends 50,000 datagrams/s, then a change that
// needs new sockets is refused by name and applied by a handover; a bad
// file changes nothing. Every reload is counted by result, and nothing is
// lost.
//
//	go test -run TestReloadUnderLoad -v ./examples/e2e/
func TestReloadUnderLoad(t *testing.T) {
	bins := buildProxies(t)
	var backs []*testecho.Echo
	var list []string
	for i := range 3 {
		b := testecho.Start(t, testecho.Config{PPv2: true, Buffer: 8 << 20, Batch: 32})
		backs = append(backs, b)
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": "%v"%%s}`, i, b.Addr()))
	}
	spare := testecho.Start(t, testecho.Config{PPv2: true}) // the added service's
	dir := t.TempDir()
	svc, two := freeService(t), freeService(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", testtool.FreePort(t, "tcp"))
	conf, sock := filepath.Join(dir, "cidproxy.json"), filepath.Join(dir, "handover.sock")
	// write writes the config: top-level keys, the svc backend list's
	// extras (one per backend), svc's extra keys, and more services.
	nworkers := 2
	write := func(top string, backendExtra [3]string, extra, more string) {
		bs := make([]string, 3)
		for i := range bs {
			bs[i] = fmt.Sprintf(list[i], backendExtra[i])
		}
		writeFileAtomic(t, conf, fmt.Sprintf(`{%s"hrw_seed": 42, "metrics_listen": %q, "services": [{"name": "svc", "protocol": "dtls",
			"listen": "%v", "workers": %d, "recv_buffer": 8388608, "send_buffer": 8388608, "backends": [%s]%s}%s]}`,
			top, metrics, svc, nworkers, strings.Join(bs, ", "), extra, more))
	}
	none := [3]string{}
	write("", none, "", "")
	args := []string{"-handover", sock, "-config", conf}
	p := startCidproxy(t, "cidproxy", bins.v1, metrics, args...)
	p.waitLog(t, "service started", 10*time.Second)

	res := startLoadgen(t, bins.loadgen, svc.String(), "-rate", strconv.Itoa(handoverRate), "-duration", "4s",
		"-drain", "2s", "-clients", "64", "-sockets", "2", "-ordinals", "0-2")
	time.Sleep(300 * time.Millisecond)
	reloads := map[string]float64{}
	hup := func(what, result string) {
		t.Helper()
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
		reloads[result]++
		want := reloads[result]
		waitUntil(t, 5*time.Second, what, func() bool {
			return p.scrape(t)[`cidroute_config_reloads_total{result="`+result+`"}`] == want
		})
		t.Logf("reload %s: %s", what, result)
		time.Sleep(150 * time.Millisecond) // under load between reloads
	}
	gauge := func(series string) float64 { return p.scrape(t)[series] }

	drain := [3]string{"", `, "weight": 3`, `, "state": "draining"`}
	write("", drain, "", "")
	hup("weights and states", "applied")
	require.Equal(t, float64(1), gauge(`cidroute_registry_backends{service="svc",state="draining"}`))
	limits := `, "limits": {"per_source_pps": 1000000, "handshake_pps": 100}`
	write("", drain, limits, "")
	hup("limits", "applied")
	health := limits + `, "health_check": {"interval": "200ms", "timeout": "100ms"}`
	write("", drain, health, "")
	hup("health_check", "applied")
	waitUntil(t, 5*time.Second, "probes", func() bool {
		_, ok := p.scrape(t)[`cidroute_backend_probe_up{ordinal="0",service="svc"}`]
		return ok
	})
	write(`"log_level": "debug", `, drain, health, "")
	hup("log_level", "applied")
	more := fmt.Sprintf(`, {"name": "two", "protocol": "dtls", "listen": "%v", "backends": [{"ordinal": 0, "address": "%v"}]}`, two, spare.Addr())
	write(`"log_level": "debug", `, drain, health, more)
	hup("a new service", "applied")
	require.True(t, echoes(t, two, cidRecord(t, 0, 1)), "the new service answers")
	nworkers = 3
	write(`"log_level": "debug", `, drain, health, more)
	hup("workers (needs sockets)", "partial")
	p.waitLog(t, `key="services[\"svc\"].workers"`, time.Second)
	version := gauge(`cidroute_registry_snapshot_version{service="svc"}`)
	writeFileAtomic(t, conf, `{"services": [{"name": "svc", "protocol": "dtls"`)
	hup("a bad file", "invalid")
	p.waitLog(t, "reload refused: the configuration is invalid", time.Second)
	assert.Equal(t, version, gauge(`cidroute_registry_snapshot_version{service="svc"}`), "a bad file changes nothing")

	// The refused change through a handover: the new process has 3
	// workers, two of them on the inherited sockets.
	write(`"log_level": "debug", `, drain, health, more)
	nw := startCidproxy(t, "successor", bins.v1, metrics, args...)
	require.NoError(t, p.waitExit(t, 15*time.Second))
	nw.waitLog(t, `service started" service=svc protocol=dtls listen=`+svc.String()+` workers=3`, 10*time.Second)
	r := <-res

	var received uint64
	for _, b := range backs {
		received += b.Received() - b.Bad() // the probes are not echoed (PROXY LOCAL)
	}
	t.Logf("loadgen: offered %.0f/s, sent %d, echoed %d, lost %d; backends received %d; kernel drops at the service port %d",
		r.OfferedPPS, r.Sent, r.Received, r.Lost, received, soakSockDrops(map[uint16]bool{svc.Port(): true}))
	assert.Zero(t, r.Lost)
	assert.Equal(t, r.Sent, received)
	assert.Equal(t, r.Sent, r.Received)
	assert.Zero(t, gauge(`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="rate_limited",service="svc"}`))
	nw.stop(t)
	pf, nf := p.finals(t), nw.finals(t)
	t.Logf("first process: forward %+v, reverse %+v; successor (3 workers): forward %+v, reverse %+v",
		pf["svc forward"], pf["svc reverse"], nf["svc forward"], nf["svc reverse"])
	assert.Equal(t, r.Sent, pf["svc forward"].Received+nf["svc forward"].Received, "each datagram counted once")
	assert.Contains(t, p.logs.String(), "level=DEBUG", "log_level debug applied") // none before the reload
}
