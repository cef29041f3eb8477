package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"

	"github.com/cidroute/cidroute/internal/testtool"
)

// mbedtlsSources are the files whose hash names the build directory, in
// the order internal/testpeers/mbedtls/build.sh hashes them.
var mbedtlsSources = []string{"build.sh", "rfc9146.patch", "peer.h", "cidserver.c", "cidclient.c"}

// mbedtlsBin returns the bin directory that build.sh installs for the
// committed sources: $CIDROUTE_PEERS (default ~/.cache/cidroute/peers)
// /mbedtls-<version>-<hash>/bin. Without it the test is skipped, or fails
// under CIDROUTE_REQUIRE_TOOLS=1.
func mbedtlsBin(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "internal", "testpeers", "mbedtls")
	h := sha256.New()
	version := ""
	for _, f := range mbedtlsSources {
		b, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		h.Write(b)
		if f == "build.sh" {
			m := regexp.MustCompile(`(?m)^version=([0-9.]+)`).FindSubmatch(b)
			require.NotNil(t, m, "build.sh names no version")
			version = string(m[1])
			m = regexp.MustCompile(`cat ([^|]+) \| sha256sum`).FindSubmatch(b)
			require.NotNil(t, m, "build.sh hashes no files")
			require.Equal(t, strings.Join(mbedtlsSources, " "), strings.TrimSpace(string(m[1])),
				"build.sh and mbedtlsSources must hash the same files in the same order")
		}
	}
	peers := os.Getenv("CIDROUTE_PEERS")
	if peers == "" {
		home, err := os.UserHomeDir()
		require.NoError(t, err)
		peers = filepath.Join(home, ".cache", "cidroute", "peers")
	}
	bin := filepath.Join(peers, fmt.Sprintf("mbedtls-%s-%x", version, h.Sum(nil)[:6]), "bin")
	for _, p := range []string{"cidserver", "cidclient", "ssl_client2"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			msg := fmt.Sprintf("the Mbed TLS peer is not built for these sources (%v): run bash internal/testpeers/mbedtls/build.sh", err)
			if testtool.Required() {
				t.Fatal(msg + " (CIDROUTE_REQUIRE_TOOLS=1)")
			}
			t.Skip(msg + " (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)")
		}
	}
	return bin
}

var mbedtlsPSK = hex.EncodeToString(testPSK)

// The two AEAD suites pion and Mbed TLS share in PSK mode; their record
// protection differs (8-byte CCM tag, 16-byte GCM tag and explicit nonce).
const (
	suiteCCM8 = "TLS-PSK-WITH-AES-128-CCM-8"
	suiteGCM  = "TLS-PSK-WITH-AES-128-GCM-SHA256"
)

// mbedtlsServer is internal/testpeers/mbedtls/cidserver: Mbed TLS on an
// unconnected socket, sessions kept by the CID it issued (ordinal first),
// replies to the source of the latest authenticated record. It answers m
// with "<ordinal>|m" and prints one line per event (-trace: and per
// datagram).
type mbedtlsServer struct {
	*transparentProc
	ord  uint8
	addr netip.AddrPort
}

func startMbedTLSServer(t *testing.T, bin string, ord uint8, cidLen int) *mbedtlsServer {
	t.Helper()
	p := startTransparentProc(t, fmt.Sprintf("cidserver %d", ord), filepath.Join(bin, "cidserver"),
		"-ordinal", strconv.Itoa(int(ord)), "-cid-len", strconv.Itoa(cidLen), "-psk", mbedtlsPSK,
		"-ciphersuites", suiteCCM8+","+suiteGCM, "-trace", "1")
	line := p.waitFor(t, "LISTEN ")
	addr, err := netip.ParseAddrPort(strings.TrimPrefix(line, "LISTEN "))
	require.NoError(t, err, "LISTEN line %q", line)
	return &mbedtlsServer{transparentProc: p, ord: ord, addr: addr}
}

// lines returns the server's output lines that start with prefix.
func (s *mbedtlsServer) lines(prefix string) []string {
	var out []string
	for line := range strings.Lines(s.out.String()) {
		if strings.HasPrefix(line, prefix) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return out
}

// mbedtlsRelay stands for the client's NAT: the client talks to in, and
// the relay forwards from up, a socket it can swap for one on a new port
// (a NAT rebinding) or point at another replica (the load balancer's
// choice changed).
type mbedtlsRelay struct {
	in *net.UDPConn
	up *cidroutetest.RebindConn
	wg sync.WaitGroup

	mu     sync.Mutex
	client netip.AddrPort
}

func startMbedTLSRelay(t *testing.T, to netip.AddrPort) *mbedtlsRelay {
	t.Helper()
	in, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	up, err := cidroutetest.ListenRebind(to, nil)
	require.NoError(t, err)
	return runMbedTLSRelay(t, in, up)
}

// runMbedTLSRelay relays between in, where the client is, and up until
// the test ends.
func runMbedTLSRelay(t *testing.T, in *net.UDPConn, up *cidroutetest.RebindConn) *mbedtlsRelay {
	r := &mbedtlsRelay{in: in, up: up}
	r.wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := in.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.client = from
			r.mu.Unlock()
			up.WriteTo(buf[:n], nil)
		}
	})
	r.wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := up.ReadFrom(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			c := r.client
			r.mu.Unlock()
			in.WriteToUDPAddrPort(buf[:n], c)
		}
	})
	t.Cleanup(func() { in.Close(); up.Close(); r.wg.Wait() })
	return r
}

func (r *mbedtlsRelay) addr() netip.AddrPort { return r.in.LocalAddr().(*net.UDPAddr).AddrPort() }

// mbedtlsClient is internal/testpeers/mbedtls/cidclient behind a relay:
// it sends a line when the test says so and waits for its echo.
type mbedtlsClient struct {
	*transparentProc
	relay   *mbedtlsRelay
	suite   string
	peerCID []byte // the CID the server issued; nil without CID
	n       int
}

// startMbedTLSClient starts a client to via (through a relay) and waits
// for its handshake; args are extra cidclient flags.
func startMbedTLSClient(t *testing.T, bin string, via netip.AddrPort, suite string, args ...string) *mbedtlsClient {
	t.Helper()
	c := startMbedTLSClientNoWait(t, bin, via, suite, args...)
	c.waitHandshake(t)
	return c
}

// waitHandshake waits for the client's handshake and notes the CID the
// server issued.
func (c *mbedtlsClient) waitHandshake(t *testing.T) {
	t.Helper()
	line := c.waitFor(t, "HANDSHAKE")
	require.NotContains(t, line, "FAILED")
	f := strings.Fields(line)
	require.Len(t, f, 4, "%q", line)
	require.Equal(t, "suite="+c.suite, f[1])
	if cid := strings.TrimPrefix(f[3], "peer_cid="); cid != "-" {
		var err error
		c.peerCID, err = hex.DecodeString(cid)
		require.NoError(t, err)
	}
}

func startMbedTLSClientNoWait(t *testing.T, bin string, via netip.AddrPort, suite string, args ...string) *mbedtlsClient {
	t.Helper()
	r := startMbedTLSRelay(t, via)
	all := append([]string{"-connect", r.addr().String(), "-psk", mbedtlsPSK, "-identity", "mbedtls",
		"-ciphersuites", suite}, args...)
	p := startTransparentProc(t, "cidclient", filepath.Join(bin, "cidclient"), all...)
	return &mbedtlsClient{transparentProc: p, relay: r, suite: suite}
}

// ordinal is byte 0 of the server's CID (ordinal-first), or -1.
func (c *mbedtlsClient) ordinal() int {
	if len(c.peerCID) == 0 {
		return -1
	}
	return int(c.peerCID[0])
}

// ask sends a line and returns the ordinal that answered it and the sends
// it took, or -1 when the client gave up (NOREPLY).
func (c *mbedtlsClient) ask(t *testing.T, what string) (ord, sends int) {
	t.Helper()
	c.n++
	msg := fmt.Sprintf("#%d %s", c.n, what)
	c.send(t, msg)
	line := c.waitFor(t, msg)
	if strings.HasPrefix(line, "NOREPLY ") {
		return -1, 0
	}
	var rest string
	_, err := fmt.Sscanf(line, "REPLY sends=%d", &sends)
	require.NoError(t, err, "%q", line)
	_, rest, _ = strings.Cut(line, " ")
	_, rest, _ = strings.Cut(rest, " ")
	return answeredBy(t, rest, msg), sends
}

// mustAsk is ask that requires an answer.
func (c *mbedtlsClient) mustAsk(t *testing.T, what string) int {
	t.Helper()
	ord, _ := c.ask(t, what)
	require.NotEqual(t, -1, ord, "no echo of %q; client output:\n%s", what, c.out.String())
	return ord
}

// An mbedtlsTier is two replicas of one DTLS service and two backends,
// ordinals 0 and 1, in one of the proxy's modes.
type mbedtlsTier struct {
	mode string
	rs   []*replica
	bs   []registry.Backend
	echo []*dtlsecho.Server // PPv2 mode: pion echo servers behind the PPv2 adapter
	srvs []*mbedtlsServer   // transparent mode: Mbed TLS cidservers
}

// The proxy modes an Mbed TLS client is tried through.
var mbedtlsModes = []string{"ppv2", "transparent"}

// startMbedTLSTier starts the tier; backends issue CIDs of cidLen bytes,
// and the service expects cidroute.DefaultDTLSCIDLen.
func startMbedTLSTier(t *testing.T, bin, mode string, cidLen int) *mbedtlsTier {
	t.Helper()
	tr := &mbedtlsTier{mode: mode}
	switch mode {
	case "ppv2":
		// What examples/dtls-backend runs: dtlsecho behind ppv2/backend.
		for ord := range uint8(2) {
			s, err := dtlsecho.Listen(dtlsecho.Config{Ordinal: ord, CIDLen: cidLen, PSK: testPSK,
				TrustedProxies: loopback, Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", ord)})
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			tr.echo = append(tr.echo, s)
			tr.bs = append(tr.bs, registry.Backend{Ordinal: ord, Addr: s.Addr()})
		}
		tr.rs = startReplicas(t, 2, cidroute.DTLS, tr.bs)
	case "transparent":
		var addrs []netip.AddrPort
		for ord := range uint8(2) {
			s := startMbedTLSServer(t, bin, ord, cidLen)
			tr.srvs = append(tr.srvs, s)
			addrs = append(addrs, s.addr)
		}
		tr.bs = transparentBackends(addrs...)
		tr.rs = startTransparent(t, 2, public, tr.bs)
	default:
		t.Fatalf("mode %q", mode)
	}
	return tr
}

// drain marks backend ord draining on every replica.
func (tr *mbedtlsTier) drain(t *testing.T, ord int) {
	t.Helper()
	bs := append([]registry.Backend(nil), tr.bs...)
	bs[ord].State = registry.Draining
	setBackends(t, tr.rs, bs)
}

// hrw is the backend HRW picks for a new session from client.
func (tr *mbedtlsTier) hrw(t *testing.T, client netip.AddrPort) int {
	t.Helper()
	b, ok := tr.rs[0].reg.Snapshot().PickNewAddrs(client, public)
	require.True(t, ok)
	return int(b.Ordinal)
}

// sessions is how many sessions backend ord completed a handshake for,
// and how often their peers moved.
func (tr *mbedtlsTier) sessions(ord int) (n, moves int) {
	if tr.mode == "ppv2" {
		for _, s := range tr.echo[ord].Sessions() {
			n++
			moves += s.Moves
		}
		return n, moves
	}
	return len(tr.srvs[ord].lines("START ")), len(tr.srvs[ord].lines("MOVED "))
}

// strays is how many datagrams backend ord got that matched none of its
// sessions: a record the proxies sent to the wrong backend, or one for a
// session that is gone.
func (tr *mbedtlsTier) strays(ord int) int {
	if tr.mode == "ppv2" {
		_, dm := tr.echo[ord].Stats()
		return int(dm.DroppedNoSession)
	}
	return len(tr.srvs[ord].lines("DROP "))
}
