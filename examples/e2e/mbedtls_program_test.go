package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
)

// The same Mbed TLS client through the programs a user runs: cidproxy (its
// JSON configuration, its Prometheus metrics) and, in PPv2 mode, the
// example dtls-backend. The modes are named "<mode>-cidproxy".

// mbedtlsPrograms returns a function that builds cidproxy and
// dtls-backend into dir the first time it is called.
func mbedtlsPrograms(dir string) func(t *testing.T) map[string]string {
	var bins map[string]string
	return func(t *testing.T) map[string]string {
		t.Helper()
		if bins != nil {
			return bins
		}
		b := map[string]string{}
		for _, name := range []string{"cidproxy", "dtls-backend"} {
			b[name] = filepath.Join(dir, name)
			out, err := exec.Command("go", "build", "-o", b[name], "../"+name).CombinedOutput()
			require.NoError(t, err, "go build %s: %s", name, out)
		}
		bins = b
		return bins
	}
}

var mbedtlsProgramScenarios = []struct {
	name string
	run  func(t *testing.T, bin string, bins map[string]string, ppv2 bool)
}{
	{"echo-rebinding", mbedtlsProgramRebinding},
	{"cid-length-longer", mbedtlsProgramCIDLength},
}

// mbedtlsProgramTier starts two backends issuing CIDs of cidLen bytes
// (dtls-backend processes in PPv2 mode, cidservers otherwise) and a
// cidproxy with one DTLS service on them. moves(ord) counts the session
// moves backend ord has logged.
func mbedtlsProgramTier(t *testing.T, bin string, bins map[string]string, ppv2 bool, cidLen int) (svc netip.AddrPort, p *proxyProc, moves func(ord int) int) {
	t.Helper()
	var list []string
	var logs []func() string
	for ord := range 2 {
		var addr netip.AddrPort
		if ppv2 {
			b := startDTLSBackendProc(t, bins["dtls-backend"], ord, "-psk", mbedtlsPSK, "-prefix", fmt.Sprintf("%d|", ord),
				"-cid-len", fmt.Sprint(cidLen), "-direct", "no-handshake")
			addr, logs = b.addr, append(logs, b.out.String)
		} else {
			s := startMbedTLSServer(t, bin, uint8(ord), cidLen)
			addr, logs = s.addr, append(logs, s.out.String)
		}
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": "%v"}`, ord, addr))
	}
	svc = freeService(t)
	env := &hostileEnv{bin: bins["cidproxy"], dir: t.TempDir()}
	p = env.start(t, "cidproxy", fmt.Sprintf(`{"metrics_listen": "%%METRICS%%", "hrw_seed": %d, "services": [
		{"name": "svc", "protocol": "dtls", "listen": "%v", "workers": 1, "proxy_protocol": %t, "backends": [%s]}]}`,
		hrwSeed, svc, ppv2, strings.Join(list, ", ")))
	moved := "MOVED "
	if ppv2 {
		moved = `msg="session moved"`
	}
	return svc, p, func(ord int) int { return strings.Count(logs[ord](), moved) }
}

// dtlsBackendProc is an examples/dtls-backend process.
type dtlsBackendProc struct {
	*transparentProc
	addr netip.AddrPort
}

// startDTLSBackendProc runs dtls-backend on a port the kernel picks (a
// port chosen beforehand can be taken by the time it binds, on a busy
// machine) and reads it from the start-up line.
func startDTLSBackendProc(t *testing.T, bin string, ord int, args ...string) *dtlsBackendProc {
	t.Helper()
	p := startTransparentProc(t, fmt.Sprint("dtls-backend ", ord), bin,
		append([]string{"-ordinal", fmt.Sprint(ord), "-listen", "127.0.0.1:0"}, args...)...)
	m := regexp.MustCompile(` listen=(\S+)`).FindStringSubmatch(p.waitFor(t, "dtls-backend started"))
	require.NotNil(t, m)
	addr, err := netip.ParseAddrPort(m[1])
	require.NoError(t, err)
	return &dtlsBackendProc{transparentProc: p, addr: addr}
}

// forwardSeries is a forward-direction datagram counter of service svc.
func forwardSeries(outcome, reason string) string {
	return fmt.Sprintf(`cidroute_datagrams_total{direction="forward",outcome=%q,path="socket",reason=%q,service="svc"}`, outcome, reason)
}

// mbedtlsProgramRebinding: handshake, echo and two NAT rebindings through
// cidproxy; the backend the CID names answers throughout and logs two
// moves; the metrics balance and show no forward drop.
func mbedtlsProgramRebinding(t *testing.T, bin string, bins map[string]string, ppv2 bool) {
	svc, p, moves := mbedtlsProgramTier(t, bin, bins, ppv2, cidroute.DefaultDTLSCIDLen)
	c := startMbedTLSClient(t, bin, svc, suiteGCM)
	owner := c.ordinal()
	require.Equal(t, owner, c.mustAsk(t, "before"))
	for k := range 2 {
		require.NoError(t, c.relay.up.Rebind(svc))
		require.Equal(t, owner, c.mustAsk(t, fmt.Sprint("after rebinding ", k+1)))
	}
	assert.Equal(t, 2, moves(owner), "the owner followed both rebindings")
	assert.Zero(t, moves(1-owner))
	m := p.balanced(t)
	assert.Positive(t, m[forwardSeries("forwarded", "")])
	for k, v := range m {
		if strings.HasPrefix(k, `cidroute_datagrams_total{direction="forward",outcome="dropped"`) {
			assert.Zero(t, v, k)
		}
	}
}

// mbedtlsProgramCIDLength: backends issue 9-byte CIDs, the service expects
// 8: cidproxy counts the flight with the first tls12_cid record under
// reason="cid_length", none as malformed, and the handshake fails.
func mbedtlsProgramCIDLength(t *testing.T, bin string, bins map[string]string, ppv2 bool) {
	svc, p, _ := mbedtlsProgramTier(t, bin, bins, ppv2, cidroute.DefaultDTLSCIDLen+1)
	c := startMbedTLSClientNoWait(t, bin, svc, suiteCCM8, "-handshake-max", "2000")
	require.Contains(t, c.waitFor(t, "HANDSHAKE"), "HANDSHAKE FAILED")
	m := p.balanced(t)
	assert.Positive(t, m[forwardSeries("dropped", "cid_length")])
	assert.Zero(t, m[forwardSeries("dropped", "malformed")])
	t.Logf("cid_length %v, forwarded %v", m[forwardSeries("dropped", "cid_length")], m[forwardSeries("forwarded", "")])
}
