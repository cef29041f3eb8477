package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
)

// TestMbedTLS is the interop matrix against an independent RFC 9146
// implementation: Mbed TLS 2.28 from Debian's source package with
// internal/testpeers/mbedtls/rfc9146.patch. Subtests are named
// client/mode/scenario:
//
//   - mbedtls-client through both proxy modes: PPv2 (pion echo backends
//     behind the PPv2 adapter, as examples/dtls-backend) and transparent
//     (Mbed TLS cidservers, whose CIDs start with their ordinal), with
//     in-process replicas, and through the cidproxy program ("-cidproxy"
//     modes: the dtls-backend program behind it in PPv2 mode, its metrics
//     read as Prometheus does);
//   - pion-client through transparent mode to Mbed TLS cidservers.
//
// Every tier has two replicas and two backends; the replicas' counters
// must balance when a subtest ends.
func TestMbedTLS(t *testing.T) {
	bin := mbedtlsBin(t)
	t.Run("mbedtls-client", func(t *testing.T) {
		for _, mode := range mbedtlsModes {
			t.Run(mode, func(t *testing.T) {
				for _, sc := range mbedtlsScenarios {
					t.Run(sc.name, func(t *testing.T) { sc.run(t, bin, mode) })
				}
			})
		}
		programs := mbedtlsPrograms(t.TempDir())
		for _, ppv2 := range []bool{true, false} {
			mode := map[bool]string{true: "ppv2-cidproxy", false: "transparent-cidproxy"}[ppv2]
			t.Run(mode, func(t *testing.T) {
				for _, sc := range mbedtlsProgramScenarios {
					t.Run(sc.name, func(t *testing.T) { sc.run(t, bin, programs(t), ppv2) })
				}
			})
		}
	})
	t.Run("pion-client", func(t *testing.T) {
		t.Run("transparent", func(t *testing.T) {
			t.Run("mbedtls-server-echo-rebinding", func(t *testing.T) { pionToMbedTLS(t, bin) })
		})
	})
}

var mbedtlsScenarios = []struct {
	name string
	run  func(t *testing.T, bin, mode string)
}{
	{"handshake-echo", mbedtlsEcho},
	{"ssl_client2", mbedtlsSSLClient2},
	{"nat-rebinding", mbedtlsRebinding},
	{"drain-then-rebinding", mbedtlsDrain},
	{"second-replica", mbedtlsSecondReplica},
	{"no-cid", mbedtlsNoCID},
	{"cid-length-longer", func(t *testing.T, bin, mode string) { mbedtlsCIDLength(t, bin, mode, cidroute.DefaultDTLSCIDLen+1) }},
	{"cid-length-shorter", func(t *testing.T, bin, mode string) { mbedtlsCIDLength(t, bin, mode, cidroute.DefaultDTLSCIDLen-2) }},
}

// noStrays: no backend got a record it had no session for.
func noStrays(t *testing.T, tr *mbedtlsTier) {
	t.Helper()
	for ord := range tr.bs {
		assert.Zero(t, tr.strays(ord), "backend %d got records for no session of its own", ord)
	}
}

// mbedtlsEcho: a handshake in each AEAD suite; the server's CID (its first
// byte the ordinal) is what the client's records carry, and the backend
// it names answers.
func mbedtlsEcho(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	for i, suite := range []string{suiteCCM8, suiteGCM} {
		c := startMbedTLSClient(t, bin, tr.rs[i%2].addr, suite)
		require.Len(t, c.peerCID, cidroute.DefaultDTLSCIDLen, "the server issued a CID of the service's length")
		for k := range 3 {
			require.Equal(t, c.ordinal(), c.mustAsk(t, fmt.Sprint("echo ", k)), "%s: the backend the CID names answers", suite)
		}
		if mode == "transparent" {
			start := tr.srvs[c.ordinal()].lines("START ")
			require.NotEmpty(t, start)
			assert.Contains(t, start[len(start)-1], fmt.Sprintf("cid=%x peer_cid=- suite=%s", c.peerCID, suite))
		}
		t.Logf("%s: CID %x, backend %d", suite, c.peerCID, c.ordinal())
	}
	noStrays(t, tr)
	f := forward(tr.rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
}

// mbedtlsSSLClient2: Mbed TLS's own test client, one request with CID.
func mbedtlsSSLClient2(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	ctx, cancel := context.WithTimeout(t.Context(), transparentWait)
	defer cancel()
	via := tr.rs[0].addr
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "ssl_client2"), "server_addr="+via.Addr().String(),
		"server_port="+strconv.Itoa(int(via.Port())), "dtls=1", "psk="+mbedtlsPSK, "psk_identity=ssl_client2",
		"force_ciphersuite="+suiteCCM8, "cid=1").CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := regexp.MustCompile(`\(initial handshake\) Peer CID \(length (\d+) Bytes\): ([0-9a-f]{2})`).FindSubmatch(out)
	require.NotNil(t, m, "no CID negotiated:\n%s", out)
	require.Equal(t, strconv.Itoa(cidroute.DefaultDTLSCIDLen), string(m[1]))
	ord, err := strconv.ParseInt(string(m[2]), 16, 0)
	require.NoError(t, err)
	require.Contains(t, string(out), fmt.Sprintf("%d|GET / HTTP/1.0", ord), "the backend its CID names answered:\n%s", out)
	noStrays(t, tr)
}

// mbedtlsRebinding: the client's NAT gives it a new source port twice in
// the middle of the session; the backend that issued the CID keeps the
// one session, which follows the client.
func mbedtlsRebinding(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	c := startMbedTLSClient(t, bin, tr.rs[0].addr, suiteCCM8)
	owner := c.mustAsk(t, "before")
	require.Equal(t, c.ordinal(), owner)
	ports := map[string]bool{c.relay.up.Local().String(): true}
	for k := range 2 {
		require.NoError(t, c.relay.up.Rebind(tr.rs[0].addr))
		ports[c.relay.up.Local().String()] = true
		ord, sends := c.ask(t, fmt.Sprint("after rebinding ", k+1))
		require.Equal(t, owner, ord, "rebinding %d: answered by the session's backend", k+1)
		t.Logf("rebinding %d: %d send(s)", k+1, sends)
	}
	require.Len(t, ports, 3, "three source ports")
	n, moves := tr.sessions(owner)
	assert.Equal(t, 1, n, "one session: the rebinding started none")
	assert.Equal(t, 2, moves, "the session moved with each rebinding")
	other, _ := tr.sessions(1 - owner)
	assert.Zero(t, other)
	noStrays(t, tr)
	f := forward(tr.rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
}

// mbedtlsDrain: the session's backend is marked draining between the
// handshake and a rebinding; the session stays on it, a new client goes
// to the other backend.
func mbedtlsDrain(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	c := startMbedTLSClient(t, bin, tr.rs[0].addr, suiteCCM8)
	owner := c.ordinal()
	require.Equal(t, owner, c.mustAsk(t, "before draining"))
	tr.drain(t, owner)
	require.NoError(t, c.relay.up.Rebind(tr.rs[1].addr))
	require.Equal(t, owner, c.mustAsk(t, "draining, rebound to the other replica"), "a draining backend keeps its sessions")
	for i := range 3 {
		nc := startMbedTLSClient(t, bin, tr.rs[i%2].addr, suiteCCM8)
		assert.Equal(t, 1-owner, nc.ordinal(), "new client %d: not to the draining backend", i)
		assert.Equal(t, 1-owner, nc.mustAsk(t, "new"))
	}
	n, moves := tr.sessions(owner)
	assert.Equal(t, 1, n, "the draining backend took no new session")
	assert.Equal(t, 1, moves)
	noStrays(t, tr)
}

// mbedtlsSecondReplica: the load balancer sends the same client address to
// the other replica, which has never seen it: the CID routes it.
func mbedtlsSecondReplica(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	c := startMbedTLSClient(t, bin, tr.rs[0].addr, suiteGCM)
	owner := c.mustAsk(t, "via replica A")
	before := forward(tr.rs[1:])
	c.relay.up.Retarget(tr.rs[1].addr)
	require.Equal(t, owner, c.mustAsk(t, "via replica B"))
	require.Equal(t, owner, c.mustAsk(t, "via replica B again"))
	after := forward(tr.rs[1:])
	assert.GreaterOrEqual(t, after.Forwarded-before.Forwarded, uint64(2), "replica B forwarded the session's records")
	n, moves := tr.sessions(owner)
	assert.Equal(t, 1, n)
	// PPv2: the measured proxy changed. Transparent: replica B's upstream
	// socket is a new source for the backend.
	assert.Equal(t, 1, moves)
	if mode == "ppv2" {
		s := tr.echo[owner].Sessions()[0]
		assert.Same(t, tr.rs[0], replicaOf(tr.rs, s.First.Proxy))
		assert.Same(t, tr.rs[1], replicaOf(tr.rs, s.Last.Proxy))
		assert.Equal(t, s.First.Client, s.Last.Client, "the client address did not change")
	}
	noStrays(t, tr)
}

// mbedtlsNoCID: a client that negotiates no CID is routed by HRW over its
// address, as any new session; a rebinding then loses its session, which
// the backend that gets the orphaned record counts, and nothing else
// breaks.
func mbedtlsNoCID(t *testing.T, bin, mode string) {
	tr := startMbedTLSTier(t, bin, mode, cidroute.DefaultDTLSCIDLen)
	c := startMbedTLSClient(t, bin, tr.rs[0].addr, suiteCCM8, "-cid", "0", "-wait", "300", "-tries", "2")
	require.Nil(t, c.peerCID, "no CID negotiated")
	want := tr.hrw(t, c.relay.up.Local())
	require.Equal(t, want, c.mustAsk(t, "no cid"), "HRW's backend for the client address")
	require.Equal(t, want, c.mustAsk(t, "no cid again"))

	require.NoError(t, c.relay.up.Rebind(tr.rs[0].addr))
	next := tr.hrw(t, c.relay.up.Local())
	ord, _ := c.ask(t, "after rebinding")
	assert.Equal(t, -1, ord, "without a CID the session does not survive a new address")
	assert.Positive(t, tr.strays(next), "the record went, as a new flow, to HRW's backend for the new address, %d, which had no session for it", next)
	f := forward(tr.rs)
	assert.Zero(t, f.DroppedTotal(), "the proxies forwarded everything: %v", dropList(&f))
}

// mbedtlsFlight5Short is Mbed TLS's flight 5 (ClientKeyExchange,
// ChangeCipherSpec, and the Finished in a tls12_cid record) to a server
// that issued the 6-byte CID 00ef443dd9c9, captured by cidclient's relay.
// Both Mbed TLS and pion (RFC 9325) make the AEAD explicit nonce
// epoch||sequence_number, so read with an 8-byte CID the record's length
// is the epoch, 1: the record "fits", and dtls.MismatchedCID must see that
// a one-octet fragment is no ciphertext (it called the datagram malformed
// until it did).
const mbedtlsFlight5Short = "16fefd0000000000000002001510000009000200000000000900076d626564746c73" + // ClientKeyExchange (PSK identity "mbedtls")
	"14fefd0000000000000003000101" + // ChangeCipherSpec
	"19fefd0001000000000000" + "00ef443dd9c9" + "0030" + // tls12_cid, epoch 1, CID, length 48
	"0001000000000000" + "c72c111f32f5d5618458530162ba81824206977292ffdbadebe59ad50308ef79ee98d2b19cd72251"

// mbedtlsCIDLength: the backends issue CIDs of cidLen bytes to a service
// that expects cidroute.DefaultDTLSCIDLen. The client's flight with the
// first tls12_cid record is dropped as cid_length by the replica, and no
// backend gets a record it cannot place: the handshake fails instead of
// being misrouted. One byte longer than the service's length is always
// told apart (the misread length field is the CID's last byte and the
// high byte of the true length, ≥ 256 or 0); shorter by the misread
// length, the epoch, which leaves no room for a ciphertext
// (mbedtlsFlight5Short).
func mbedtlsCIDLength(t *testing.T, bin, mode string, cidLen int) {
	require.NotEqual(t, cidroute.DefaultDTLSCIDLen, cidLen)
	if cidLen < cidroute.DefaultDTLSCIDLen {
		b, err := hex.DecodeString(mbedtlsFlight5Short)
		require.NoError(t, err)
		_, err = dtls.Classify(b, 6)
		require.NoError(t, err, "the vector is flight 5 with a 6-byte CID")
		cid, ok := dtls.MismatchedCID(b, cidroute.DefaultDTLSCIDLen)
		require.True(t, ok, "flight 5 with a 6-byte CID, read with %d, is a CID length mismatch", cidroute.DefaultDTLSCIDLen)
		require.Len(t, cid, 6)
	}
	tr := startMbedTLSTier(t, bin, mode, cidLen)
	c := startMbedTLSClientNoWait(t, bin, tr.rs[0].addr, suiteCCM8, "-handshake-max", "2000")
	line := c.waitFor(t, "HANDSHAKE")
	require.Contains(t, line, "HANDSHAKE FAILED", "the handshake cannot finish through a service of another CID length")
	hrw := tr.hrw(t, c.relay.up.Local())

	f := forward(tr.rs)
	t.Logf("forward: received %d, forwarded %d, dropped %v", f.Received, f.Forwarded, dropList(&f))
	assert.Positive(t, f.Dropped[cidroute.CIDLength], "the flight carrying the Finished (a tls12_cid record) is dropped as %s", cidroute.CIDLength)
	assert.Equal(t, f.Dropped[cidroute.CIDLength], f.DroppedTotal(), "and for no other reason")
	assert.Positive(t, f.Forwarded, "the ClientHellos went through")
	noStrays(t, tr)
	for ord := range tr.bs {
		n, _ := tr.sessions(ord)
		assert.Zero(t, n, "backend %d: no session completed", ord)
	}
	if mode == "transparent" {
		assert.Empty(t, tr.srvs[1-hrw].lines("RECV "), "the backend HRW did not pick got nothing")
		for _, l := range tr.srvs[hrw].lines("RECV ") {
			assert.True(t, strings.HasSuffix(l, "type=22"), "backend %d got only handshake flights: %s", hrw, l)
		}
	} else {
		_, dm := tr.echo[1-hrw].Stats()
		assert.Zero(t, dm.NewSessions, "the backend HRW did not pick got nothing")
	}
}

// pionToMbedTLS: pion/dtls v3 clients (CCM-8 and GCM) through two
// transparent replicas to two Mbed TLS cidservers: the pion client puts
// the Mbed TLS server's CID in its records, the server's ordinal is its
// first byte, and after each client moves to a new source port on the
// other replica its server follows it (MOVED) without a second session.
func pionToMbedTLS(t *testing.T, bin string) {
	var srvs []*mbedtlsServer
	for ord := range uint8(2) {
		srvs = append(srvs, startMbedTLSServer(t, bin, ord, cidroute.DefaultDTLSCIDLen))
	}
	rs := startTransparent(t, 2, public, transparentBackends(srvs[0].addr, srvs[1].addr))

	const clients = 6
	perBackend := map[int]int{}
	for i := range clients {
		suite := pion.TLS_PSK_WITH_AES_128_CCM_8
		if i%2 == 1 {
			suite = pion.TLS_PSK_WITH_AES_128_GCM_SHA256
		}
		sock, err := cidroutetest.ListenRebind(rs[i%2].addr, net.UDPAddrFromAddrPort(public))
		require.NoError(t, err)
		sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
		cfg := dtlsecho.PSKClientConfig(testPSK, fmt.Sprint("pion ", i))
		cfg.CipherSuites = []pion.CipherSuiteID{suite}
		conn, err := pion.Client(sock, net.UDPAddrFromAddrPort(public), cfg)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), transparentWait)
		require.NoError(t, conn.HandshakeContext(ctx), "client %d (%v)", i, suite)
		cancel()
		c := &transparentPionClient{sock: sock, conn: conn}
		owner, _ := c.ask(t, fmt.Sprintf("pion %d first", i))
		require.Len(t, sock.CID(), cidroute.DefaultDTLSCIDLen)
		require.Equal(t, int(sock.CID()[0]), owner, "client %d: answered by the server its CID names", i)
		require.NoError(t, sock.Rebind(rs[(i+1)%2].addr))
		ord, sends := c.ask(t, fmt.Sprintf("pion %d moved", i))
		require.Equal(t, owner, ord, "client %d after the move", i)
		perBackend[owner]++
		t.Logf("client %d (%v): CID %x, backend %d, %d send(s) after the move", i, suite, sock.CID(), owner, sends)
		// The server names the same CID and suite.
		name := strings.ReplaceAll(strings.TrimPrefix(suite.String(), "TLS_"), "_", "-")
		assert.Contains(t, srvs[owner].out.String(), fmt.Sprintf("cid=%x peer_cid=- suite=TLS-%s", sock.CID(), name))
	}
	for ord, s := range srvs {
		require.Eventually(t, func() bool { return len(s.lines("MOVED ")) == perBackend[ord] }, transparentWait, 10*time.Millisecond,
			"server %d: each session moved once; output:\n%s", ord, s.out.String())
		assert.Len(t, s.lines("START "), perBackend[ord], "server %d: one session per client", ord)
		assert.Empty(t, s.lines("DROP "), "server %d", ord)
	}
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
}
