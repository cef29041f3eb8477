package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/internal/testtool"
)

// Health probes end to end (issue 17): cidproxy, the example backends and
// the clients as separate processes and peers, as an operator runs them.
//
//	go test -run TestHealthProbes -v ./examples/e2e/
//
// The probe timing every case uses. Detection is bounded by Fall ×
// Interval + Timeout (down) and Rise × Interval + Timeout (up); the bounds
// below add one interval of slack for a loaded machine's scheduling and
// the test's own scrapes.
const (
	probeInterval = 300 * time.Millisecond
	probeTimeout  = 250 * time.Millisecond
	probeFall     = 3
	probeRise     = 2
	probeSlack    = probeInterval
)

var healthCheckJSON = fmt.Sprintf(`{"interval": %q, "timeout": %q, "fall": %d, "rise": %d}`,
	probeInterval.String(), probeTimeout.String(), probeFall, probeRise)

func TestHealthProbes(t *testing.T) {
	dir := t.TempDir()
	bins := map[string]string{}
	for _, name := range []string{"cidproxy", "dtls-backend", "quic-backend"} {
		bins[name] = filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bins[name], "../"+name).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", name, err, out)
		}
	}
	t.Run("a frozen backend is down in time, keeps its sessions, and comes back", func(t *testing.T) {
		frozenBackend(t, bins)
	})
	t.Run("a UDP echo on a backend's port is down", func(t *testing.T) {
		deadStack(t, bins)
	})
	t.Run("QUIC: quic-go answers the probes, a frozen backend is down", func(t *testing.T) {
		quicProbes(t, bins)
	})
}

// A backendProc is one example backend process.
type backendProc struct {
	name   string
	cmd    *exec.Cmd
	logs   testtool.SyncBuffer
	addr   netip.AddrPort
	exited chan error
}

// startBackend runs bin on a free loopback port with args, and waits for
// its start-up line.
func startBackend(t *testing.T, bin string, ord int, args ...string) *backendProc {
	t.Helper()
	b := &backendProc{name: fmt.Sprintf("%s %d", filepath.Base(bin), ord), addr: freeService(t), exited: make(chan error, 1)}
	b.cmd = exec.Command(bin, append([]string{"-ordinal", strconv.Itoa(ord), "-listen", b.addr.String(),
		"-drain-timeout", "1s"}, args...)...)
	b.cmd.Stderr = &b.logs
	require.NoError(t, b.cmd.Start())
	go func() { b.exited <- b.cmd.Wait() }()
	t.Cleanup(func() {
		b.cmd.Process.Signal(syscall.SIGCONT)
		b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
			b.cmd.Process.Kill()
			<-b.exited
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", b.name, b.logs.String())
		}
	})
	waitUntil(t, 10*time.Second, b.name+" start", func() bool {
		select {
		case err := <-b.exited:
			b.exited <- err
			t.Fatalf("%s exited at start: %v\n%s", b.name, err, b.logs.String())
		default:
		}
		return strings.Contains(b.logs.String(), "started")
	})
	return b
}

func (b *backendProc) signal(t *testing.T, s syscall.Signal) {
	require.NoError(t, b.cmd.Process.Signal(s))
}

// healthProxy starts cidproxy with one service "svc" of protocol proto on
// the given backends (ordinal → address), probed with the constants
// above, and waits until the probes found the backends in want up.
func healthProxy(t *testing.T, bins map[string]string, proto string, backends []netip.AddrPort, up ...int) (netip.AddrPort, *proxyProc) {
	t.Helper()
	var list []string
	for i, a := range backends {
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": "%v"}`, i, a))
	}
	svc := freeService(t)
	env := &hostileEnv{bin: bins["cidproxy"], dir: t.TempDir()}
	p := env.start(t, "cidproxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "hrw_seed": 42, "services": [
		{"name": "svc", "protocol": %q, "listen": "%v", "workers": 2, "backends": [%s], "health_check": %s}]}`,
		proto, svc, strings.Join(list, ", "), healthCheckJSON))
	waitUntil(t, 10*time.Second, "backends probed up", func() bool {
		m := p.scrape(t)
		for _, o := range up {
			if m[probeUp(o)] != 1 || m[probeResult(o, "ok")] < 1 {
				return false
			}
		}
		return true
	})
	return svc, p
}

func probeUp(ord int) string {
	return fmt.Sprintf(`cidroute_backend_probe_up{ordinal="%d",service="svc"}`, ord)
}

func probeResult(ord int, result string) string {
	return fmt.Sprintf(`cidroute_probes_total{ordinal="%d",result="%s",service="svc"}`, ord, result)
}

// waitProbeUp polls the proxy until the backend's verdict is up (1) or
// down (0) and returns how long it took.
func waitProbeUp(t *testing.T, p *proxyProc, ord int, want float64) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		m, err := p.tryScrape()
		require.NoError(t, err)
		if m[probeUp(ord)] == want {
			return time.Since(start)
		}
		require.Less(t, time.Since(start), 10*time.Second, "backend %d never %v", ord, want)
		time.Sleep(5 * time.Millisecond)
	}
}

// pskSession is a DTLS 1.2 session with CID through the proxy, as a CoAP
// device would open it: pion/dtls v3, PSK, on its own socket.
type pskSession struct {
	conn *pion.Conn
}

func dialPSK(t *testing.T, proxy netip.AddrPort) *pskSession {
	t.Helper()
	sock, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c, err := pion.Client(sock, net.UDPAddrFromAddrPort(proxy), dtlsecho.PSKClientConfig(testPSK, "e2e"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.HandshakeContext(ctx), "handshake through %v", proxy)
	t.Cleanup(func() { c.Close(); sock.Close() })
	return &pskSession{conn: c}
}

// ordinal asks the session's backend for an echo and returns the ordinal
// in its "<ordinal>|" prefix.
func (s *pskSession) ordinal(t *testing.T, msg string) int {
	t.Helper()
	reply, err := ask(s.conn, msg, 3, 2*time.Second)
	require.NoError(t, err)
	ord, rest, ok := strings.Cut(reply, "|")
	require.True(t, ok && rest == msg, "echo %q of %q", reply, msg)
	n, err := strconv.Atoi(ord)
	require.NoError(t, err)
	return n
}

func dtlsBackendProcs(t *testing.T, bin string, n int) []*backendProc {
	var bs []*backendProc
	for i := range n {
		bs = append(bs, startBackend(t, bin, i, "-psk", hex.EncodeToString(testPSK), "-prefix", fmt.Sprintf("%d|", i)))
	}
	return bs
}

func addrsOf(bs []*backendProc) []netip.AddrPort {
	var as []netip.AddrPort
	for _, b := range bs {
		as = append(as, b.addr)
	}
	return as
}

// A backend frozen with SIGSTOP answers no probe: it is marked down within
// Fall × Interval + Timeout and takes no new session, while the datagrams
// of its CID sessions are still forwarded to it (the kernel queues them);
// after SIGCONT it is up again at its Rise-th answered probe, answers what
// was sent to it during the freeze, and takes new sessions again.
func frozenBackend(t *testing.T, bins map[string]string) {
	bs := dtlsBackendProcs(t, bins["dtls-backend"], 3)
	svc, p := healthProxy(t, bins, "dtls", addrsOf(bs), 0, 1, 2)

	// Sessions until one backend has two.
	byOrd := map[int][]*pskSession{}
	victim := -1
	for i := 0; victim < 0; i++ {
		require.Less(t, i, 30)
		s := dialPSK(t, svc)
		o := s.ordinal(t, fmt.Sprintf("hello %d", i))
		byOrd[o] = append(byOrd[o], s)
		if len(byOrd[o]) == 2 {
			victim = o
		}
	}
	held := byOrd[victim][0]

	bs[victim].signal(t, syscall.SIGSTOP)
	took := waitProbeUp(t, p, victim, 0)
	bound := probeFall*probeInterval + probeTimeout + probeSlack
	t.Logf("frozen backend %d marked down after %v (bound %v)", victim, took, bound)
	assert.LessOrEqual(t, took, bound, "down within Fall × Interval + Timeout")
	m := p.scrape(t)
	assert.Equal(t, 1.0, m[`cidroute_registry_backends{service="svc",state="down"}`])
	assert.Positive(t, m[probeResult(victim, "timeout")])
	code, body := readyz(t, p)
	assert.Equal(t, 200, code, "two backends still take new sessions: %s", body)

	// Its session's next record is forwarded to it, by its CID, and
	// queued by the kernel of the frozen process.
	before := p.balanced(t)
	_, err := held.conn.Write([]byte("sent while frozen"))
	require.NoError(t, err)
	waitUntil(t, 5*time.Second, "the record forwarded", func() bool {
		return p.scrape(t)[fwd("forwarded")] == before[fwd("forwarded")]+1
	})
	// No new session goes to it.
	for i := range 12 {
		s := dialPSK(t, svc)
		assert.NotEqual(t, victim, s.ordinal(t, fmt.Sprintf("while frozen %d", i)), "a new session on the down backend")
	}
	m = p.balanced(t)
	for _, r := range []string{"unknown_ordinal", "not_serving", "no_ready_backend"} {
		assert.Zero(t, m[fwd(r)], r)
	}

	m = p.scrape(t)
	okBefore := m[probeResult(victim, "ok")]
	bs[victim].signal(t, syscall.SIGCONT)
	took = waitProbeUp(t, p, victim, 1)
	bound = probeRise*probeInterval + probeTimeout + probeSlack
	t.Logf("thawed backend %d up after %v (bound %v)", victim, took, bound)
	assert.LessOrEqual(t, took, bound, "up within Rise × Interval + Timeout")
	assert.GreaterOrEqual(t, p.scrape(t)[probeResult(victim, "ok")]-okBefore, float64(probeRise), "up after Rise answered probes")
	logs := p.logs.String()
	assert.Equal(t, 1, strings.Count(logs, "backend down"), "one line per change:\n%s", logs)
	assert.Equal(t, 1, strings.Count(logs, "backend up"), logs)
	assert.Contains(t, logs, fmt.Sprintf("successes=%d", probeRise))

	// The record sent during the freeze is answered now: its route held.
	held.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	n, err := held.conn.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("%d|sent while frozen", victim), string(buf[:n]))
	assert.Equal(t, victim, held.ordinal(t, "after"), "the session goes on")

	// It takes new sessions again.
	back := false
	for i := 0; i < 40 && !back; i++ {
		back = dialPSK(t, svc).ordinal(t, fmt.Sprintf("after %d", i)) == victim
	}
	assert.True(t, back, "no new session on the backend once up")
}

func fwd(outcome string) string {
	if outcome == "forwarded" {
		return `cidroute_datagrams_total{direction="forward",outcome="forwarded",path="socket",reason="",service="svc"}`
	}
	return fmt.Sprintf(`cidroute_datagrams_total{direction="forward",outcome="dropped",path="socket",reason="%s",service="svc"}`, outcome)
}

func readyz(t *testing.T, p *proxyProc) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// A backend whose port answers UDP but whose DTLS stack is dead (here: a
// plain UDP echo on the port) passes a port check and fails the probe: an
// echoed ClientHello is no HelloVerifyRequest. It is down at its first
// probe and takes no new session.
func deadStack(t *testing.T, bins map[string]string) {
	live := dtlsBackendProcs(t, bins["dtls-backend"], 1)[0]
	dead := testecho.Plain(t)
	hello := []byte("\x16\xfe\xfd port check")
	assert.True(t, echoes(t, dead, hello), "the port answers UDP: a port check passes it")

	svc, p := healthProxy(t, bins, "dtls", []netip.AddrPort{live.addr, dead}, 0)
	waitProbeUp(t, p, 1, 0)
	m := p.scrape(t)
	assert.Positive(t, m[probeResult(1, "bad_answer")])
	assert.Zero(t, m[probeResult(1, "ok")])
	assert.Equal(t, 1.0, m[probeUp(0)])
	assert.Contains(t, p.logs.String(), "first_probe=true result=bad_answer")
	for i := range 10 {
		assert.Equal(t, 0, dialPSK(t, svc).ordinal(t, fmt.Sprintf("s%d", i)), "a session on the dead stack")
	}
}

// QUIC: quic-go behind the PPv2 adapter answers the reserved-version probe
// with Version Negotiation, statelessly; a frozen quic-backend is down in
// time and up again after SIGCONT.
func quicProbes(t *testing.T, bins map[string]string) {
	var bs []*backendProc
	for i := range 2 {
		bs = append(bs, startBackend(t, bins["quic-backend"], i))
	}
	_, p := healthProxy(t, bins, "quic", addrsOf(bs), 0, 1)
	time.Sleep(3 * probeInterval)
	m := p.scrape(t)
	for o := range 2 {
		assert.Zero(t, m[probeResult(o, "timeout")]+m[probeResult(o, "bad_answer")]+m[probeResult(o, "refused")], "backend %d", o)
	}
	for _, b := range bs {
		assert.NotContains(t, b.logs.String(), "connection started", "a probe opens no connection")
		assert.Equal(t, 1, strings.Count(b.logs.String(), "\n"), "no log line per probe:\n%s", b.logs.String())
	}

	bs[1].signal(t, syscall.SIGSTOP)
	took := waitProbeUp(t, p, 1, 0)
	t.Logf("frozen quic backend down after %v", took)
	assert.LessOrEqual(t, took, probeFall*probeInterval+probeTimeout+probeSlack)
	assert.Equal(t, 1.0, p.scrape(t)[probeUp(0)])
	bs[1].signal(t, syscall.SIGCONT)
	took = waitProbeUp(t, p, 1, 1)
	t.Logf("thawed quic backend up after %v", took)
	assert.LessOrEqual(t, took, probeRise*probeInterval+probeTimeout+probeSlack)
}
