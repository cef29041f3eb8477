//go:build linux

package proxyapp

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

// hoEnv is a cidproxy configuration on fixed ports with three PPv2 echo
// backends, for runs of Run in this process.
type hoEnv struct {
	dir, path, sock string
	svc             netip.AddrPort
	metrics         string
	backs           []*testecho.Echo
}

func newHoEnv(t *testing.T) *hoEnv {
	e := &hoEnv{dir: t.TempDir(), metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp")),
		svc: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t, "udp"))}
	e.path, e.sock = filepath.Join(e.dir, "c.json"), filepath.Join(e.dir, "handover.sock")
	for range 3 {
		e.backs = append(e.backs, testecho.Start(t, testecho.Config{PPv2: true, Buffer: 4 << 20}))
	}
	e.write(t, "")
	return e
}

// write writes the configuration; extra goes into the service object.
func (e *hoEnv) write(t *testing.T, extra string) { e.writeTop(t, "", extra) }

// writeTop writes the configuration with top at the start of the
// top-level object.
func (e *hoEnv) writeTop(t *testing.T, top, extra string) {
	t.Helper()
	var bs []string
	for i, b := range e.backs {
		bs = append(bs, fmt.Sprintf(`{"ordinal": %d, "address": "%v"}`, i, b.Addr()))
	}
	body := fmt.Sprintf(`{`+top+`"metrics_listen": %q, "services": [{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 2,
		"recv_buffer": 4194304, "send_buffer": 4194304, "backends": [%s]%s}]}`, e.metrics, e.svc, strings.Join(bs, ", "), extra)
	require.NoError(t, os.WriteFile(e.path+".tmp", []byte(body), 0o600))
	require.NoError(t, os.Rename(e.path+".tmp", e.path))
}

// A hoRun is one Run of the program in this process.
type hoRun struct {
	logs   syncBuffer
	cancel context.CancelFunc
	code   chan int
}

func (e *hoEnv) start(t *testing.T, opts Options, args ...string) *hoRun {
	r := &hoRun{code: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.code <- Run(ctx, append(args, "-config", e.path), &bytes.Buffer{}, &r.logs, opts)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.code:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5 s of cancel")
		}
		if t.Failed() {
			t.Logf("log:\n%s", r.logs.String())
		}
	})
	return r
}

func (r *hoRun) wait(t *testing.T, what string) {
	t.Helper()
	waitFor(t, 10*time.Second, what, func() bool { return strings.Contains(r.logs.String(), what) })
}

// exited waits for Run to return on its own, and returns its code.
func (r *hoRun) exited(t *testing.T) int {
	t.Helper()
	select {
	case c := <-r.code:
		r.code <- c
		return c
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
		return -1
	}
}

var finalLine = regexp.MustCompile(`msg="final counters" service=(\S+) direction=(\S+) received=(\d+) forwarded=(\d+) dropped=(\d+) balanced=(\S+)`)

// finals reads a run's final counters: direction → received, each
// balanced.
func (r *hoRun) finals(t *testing.T) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, m := range finalLine.FindAllStringSubmatch(r.logs.String(), -1) {
		require.Equal(t, "true", m[6], "%s", m[0])
		n, _ := strconv.ParseUint(m[3], 10, 64)
		out[m[2]] += n
	}
	require.Len(t, out, 2, "final counters of both directions:\n%s", r.logs.String())
	return out
}

// hoStream sends n CID records to addr at about rate per second and
// counts the echoes.
type hoStream struct {
	conn   *net.UDPConn
	echoes atomic.Int64
	done   chan struct{}
}

func stream(t *testing.T, addr netip.AddrPort, n, rate int) *hoStream {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetReadBuffer(4<<20))
	s := &hoStream{conn: c, done: make(chan struct{})}
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			s.echoes.Add(1)
		}
	}()
	go func() {
		defer close(s.done)
		codec := dtls.OrdinalFirst{Length: cidroute.DefaultDTLSCIDLen}
		start := time.Now()
		for i := range n {
			cid, _ := codec.AppendCID(nil, uint8(i%3))
			rec, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: uint64(i), CID: cid, Fragment: []byte("payload")})
			c.WriteToUDPAddrPort(rec, addr)
			if ahead := time.Duration(i+1)*time.Second/time.Duration(rate) - time.Since(start); ahead > time.Millisecond {
				time.Sleep(ahead)
			}
		}
	}()
	return s
}

func (e *hoEnv) received() (n uint64) {
	for _, b := range e.backs {
		n += b.Received()
	}
	return n
}

func (e *hoEnv) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + e.metrics + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	return parseMetrics(t, resp.Body)
}

// TestHandoverInProcess: a second Run with the same -handover flag takes
// the first one's sockets while records stream; the first exits 0 by
// itself. Every record is echoed, the backends received each once, and
// the two runs' counters balance and add up to what was sent.
func TestHandoverInProcess(t *testing.T) {
	e := newHoEnv(t)
	a := e.start(t, Options{}, "-handover", e.sock)
	a.wait(t, "handover socket listening")
	const n = 20000
	s := stream(t, e.svc, n, 20000)
	time.Sleep(300 * time.Millisecond)
	b := e.start(t, Options{}, "-handover", e.sock)
	require.Equal(t, 0, a.exited(t), "the predecessor exits 0 after the handover")
	b.wait(t, "handover socket listening")
	<-s.done
	waitFor(t, 5*time.Second, "every echo", func() bool { return s.echoes.Load() == n })
	require.Equal(t, uint64(n), e.received(), "each record reached a backend once")

	fa := a.finals(t)
	m := e.scrape(t) // b's, on the metrics listener it inherited
	fwdB := m[`cidroute_datagrams_received_total{direction="forward",path="socket",service="svc"}`]
	t.Logf("predecessor forwarded %d, successor %v", fa["forward"], fwdB)
	assert.NotZero(t, fa["forward"])
	assert.Equal(t, float64(n), float64(fa["forward"])+fwdB, "each record counted once, by one of the two")
	l := a.logs.String()
	assert.Contains(t, l, "handover done: this process stops")
	assert.Contains(t, b.logs.String(), "handover: taking over")
	assert.Contains(t, b.logs.String(), "sockets=5", "2 service, 2 upstream sockets and the metrics listener")

	// The successor can be replaced in turn.
	c := e.start(t, Options{}, "-handover", e.sock)
	require.Equal(t, 0, b.exited(t))
	c.wait(t, "handover socket listening")
	cl := stream(t, e.svc, 100, 1000)
	<-cl.done
	waitFor(t, 5*time.Second, "echoes through the third", func() bool { return cl.echoes.Load() == 100 })
}

// TestHandoverAborted: a successor that cannot serve (its registry never
// gets a list: a source that never answers) gives up before it says
// ready; the running one goes on.
func TestHandoverAborted(t *testing.T) {
	defer func(d time.Duration) { handoverReadyWait = d }(handoverReadyWait)
	handoverReadyWait = 300 * time.Millisecond
	e := newHoEnv(t)
	a := e.start(t, Options{}, "-handover", e.sock)
	a.wait(t, "handover socket listening")

	good, err := os.ReadFile(e.path)
	require.NoError(t, err)
	bad := regexp.MustCompile(`"backends": \[.*\]\}\]\}`).ReplaceAllString(string(good), `"kubernetes": {"service": "ds"}}]}`)
	require.NotEqual(t, string(good), bad)
	require.NoError(t, os.WriteFile(e.path, []byte(bad), 0o600))
	silent := registry.SourceFunc(func(ctx context.Context, _ registry.Updater) error { <-ctx.Done(); return nil })
	b := e.start(t, Options{Kubernetes: func(proxyconfig.Kubernetes, *slog.Logger) (registry.Source, error) { return silent, nil }}, "-handover", e.sock)
	require.Equal(t, 1, b.exited(t))
	assert.Contains(t, b.logs.String(), "no backends after")
	a.wait(t, "handover aborted by the successor")

	s := stream(t, e.svc, 100, 1000)
	<-s.done
	waitFor(t, 5*time.Second, "echoes through the first", func() bool { return s.echoes.Load() == 100 })
	select {
	case code := <-a.code:
		t.Fatalf("the first run exited (%d)", code)
	default:
	}
}

// TestReloadInProcess: SIGHUP applies each kind of change to a running
// proxy while records stream, and none is lost; a change of a socket key
// is refused by name, a bad file changes nothing; each is counted.
func TestReloadInProcess(t *testing.T) {
	e := newHoEnv(t)
	hup := make(chan os.Signal, 1)
	r := e.start(t, Options{hup: hup})
	r.wait(t, "service started")
	const n = 8000
	s := stream(t, e.svc, n, 2000) // four seconds
	reloads := func(result string) float64 { return e.scrape(t)[`cidroute_config_reloads_total{result="`+result+`"}`] }
	state := func(st string) float64 {
		return e.scrape(t)[`cidroute_registry_backends{service="svc",state="`+st+`"}`]
	}
	sighup := func(top, extra, result string, want float64) {
		t.Helper()
		e.writeTop(t, top, extra)
		hup <- os.Interrupt
		waitFor(t, 5*time.Second, "reload "+result, func() bool { return reloads(result) == want })
	}

	// Backend states and weights.
	base, err := os.ReadFile(e.path)
	require.NoError(t, err)
	b2 := e.backs[2].Addr()
	draining := strings.Replace(string(base), fmt.Sprintf(`"address": "%v"}`, b2), fmt.Sprintf(`"address": "%v", "state": "draining", "weight": 5}`, b2), 1)
	require.NoError(t, os.WriteFile(e.path, []byte(draining), 0o600))
	hup <- os.Interrupt
	waitFor(t, 5*time.Second, "reload applied", func() bool { return reloads("applied") == 1 })
	waitFor(t, 5*time.Second, "draining", func() bool { return state("draining") == 1 })
	require.Equal(t, float64(2), state("ready"))

	// Limits (high enough for the stream), then health checks.
	limits := `, "limits": {"per_source_pps": 100000, "handshake_pps": 10}`
	sighup("", limits, "applied", 2)
	r.wait(t, `services[\"svc\"].limits`)
	sighup("", limits+`, "health_check": {"interval": "200ms", "timeout": "100ms"}`, "applied", 3)
	probed := func() bool {
		_, ok := e.scrape(t)[`cidroute_backend_probe_up{ordinal="0",service="svc"}`]
		return ok
	}
	waitFor(t, 5*time.Second, "probes", probed)

	// A refused key: listen. The service keeps all of its configuration.
	good := e.svc
	e.svc = netip.AddrPortFrom(good.Addr(), freePort(t, "udp"))
	sighup("", "", "partial", 1)
	e.svc = good
	r.wait(t, `key="services[\"svc\"].listen"`)
	require.True(t, probed(), "the refused reload did not take health_check away")

	// A bad file.
	version := func() float64 { return e.scrape(t)[`cidroute_registry_snapshot_version{service="svc"}`] }
	waitFor(t, 5*time.Second, "the probes' verdicts", func() bool { return state("down") == 3 }) // nothing answers them
	v := version()
	require.NoError(t, os.WriteFile(e.path, []byte(`{"services": [`), 0o600))
	hup <- os.Interrupt
	waitFor(t, 5*time.Second, "reload invalid", func() bool { return reloads("invalid") == 1 })
	r.wait(t, "reload refused: the configuration is invalid")
	require.Equal(t, v, version(), "nothing changed")
	require.True(t, probed())

	// A log level and a new service, with sockets of its own.
	addPort := freePort(t, "udp")
	sighup(`"log_level": "warn", `, fmt.Sprintf(`}, {"name": "two", "protocol": "dtls", "listen": "127.0.0.1:%d", "backends": [
		{"ordinal": 0, "address": "%v"}, {"ordinal": 1, "address": "%v"}, {"ordinal": 2, "address": "%v"}]`,
		addPort, e.backs[0].Addr(), e.backs[1].Addr(), e.backs[2].Addr()), "applied", 4)
	two := stream(t, netip.AddrPortFrom(e.svc.Addr(), addPort), 50, 1000)
	<-two.done
	waitFor(t, 5*time.Second, "echoes of the added service", func() bool { return two.echoes.Load() == 50 })
	before := strings.Count(r.logs.String(), `msg="reload done"`)
	hup <- os.Interrupt
	waitFor(t, 5*time.Second, "reload applied", func() bool { return reloads("applied") == 5 })
	assert.Equal(t, before, strings.Count(r.logs.String(), `msg="reload done"`), "log_level warn: no info lines")

	<-s.done
	waitFor(t, 5*time.Second, "every echo", func() bool { return s.echoes.Load() == n })
	m := e.scrape(t)
	assert.Zero(t, m[`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="rate_limited",service="svc"}`])
}

// TestHandoverStalledPeer: a successor of the same user that takes the
// sockets and then says nothing (stalled, or hostile) does not hold
// SIGHUP back: the handover waits off the signal loop. When it goes
// away, the process serves on.
func TestHandoverStalledPeer(t *testing.T) {
	e := newHoEnv(t)
	hup := make(chan os.Signal, 1)
	r := e.start(t, Options{hup: hup}, "-handover", e.sock)
	r.wait(t, "handover socket listening")

	c, err := dialHandover(e.sock)
	require.NoError(t, err)
	require.NotNil(t, c)
	defer c.Close()
	require.NoError(t, sendHandover(c, hoMsg{Type: "hello", PID: 1, Version: "stalled"}, nil, time.Now().Add(time.Second)))
	m, files, err := recvHandover(c, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	closeFiles(files)
	require.Equal(t, "sockets", m.Type)

	// Now stalled. A reload goes through at once.
	e.write(t, `, "limits": {"per_source_pps": 100000}`)
	start := time.Now()
	hup <- os.Interrupt
	waitFor(t, 2*time.Second, "the reload, while a successor stalls", func() bool {
		return e.scrape(t)[`cidroute_config_reloads_total{result="applied"}`] == 1
	})
	t.Logf("reload applied %v after SIGHUP, a successor stalled", time.Since(start).Round(time.Millisecond))

	c.Close()
	r.wait(t, "the successor went away before it served")
	s := stream(t, e.svc, 100, 1000)
	<-s.done
	waitFor(t, 5*time.Second, "echoes", func() bool { return s.echoes.Load() == 100 })
}

// TestHandoverDirRefused: a handover socket in a directory another user
// could write is refused at start, with the reason.
func TestHandoverDirRefused(t *testing.T) {
	for _, mode := range []os.FileMode{0o777, 0o1777, 0o770} {
		t.Run(fmt.Sprintf("%#o", mode), func(t *testing.T) {
			e := newHoEnv(t)
			dir := filepath.Join(e.dir, "run")
			require.NoError(t, os.Mkdir(dir, 0o700))
			require.NoError(t, os.Chmod(dir, mode))
			r := e.start(t, Options{}, "-handover", filepath.Join(dir, "handover.sock"))
			require.Equal(t, 1, r.exited(t), "refused")
			assert.Contains(t, r.logs.String(), "is writable by group or others")
			assert.NotContains(t, r.logs.String(), "service started")
		})
	}
	t.Run("another user's", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root, to give the directory to another user")
		}
		e := newHoEnv(t)
		dir := filepath.Join(e.dir, "run")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.Chown(dir, 65534, 65534))
		r := e.start(t, Options{}, "-handover", filepath.Join(dir, "handover.sock"))
		require.Equal(t, 1, r.exited(t), "refused")
		assert.Contains(t, r.logs.String(), "belongs to uid 65534")
	})
}

// TestHandoverPredecessorGoneBeforeHello: a predecessor that dies as the
// successor connects (it accepted, or had the connection only queued)
// makes the successor's hello fail with a broken pipe or a reset; the
// successor starts afresh instead of stopping with an error (CI saw
// "sending hello: sendmsg: connection reset by peer" stop it).
func TestHandoverPredecessorGoneBeforeHello(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handover.sock")
	log := slog.New(slog.DiscardHandler)
	for i := range 200 {
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		require.NoError(t, err)
		ln.SetUnlinkOnClose(false)
		go func() {
			if i%2 == 0 { // killed after accepting
				if c, err := ln.Accept(); err == nil {
					c.Close()
				}
			}
			ln.Close() // killed with the connection in its queue
		}()
		h, err := takeOver(context.Background(), path, log)
		require.NoError(t, err, "attempt %d", i)
		require.Nil(t, h)
		os.Remove(path)
	}
}
