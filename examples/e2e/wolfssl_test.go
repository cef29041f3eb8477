package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/registry"

	"github.com/cidroute/cidroute/internal/testtool"
)

// wolfSSL's DTLS 1.3 peers (internal/testpeers/wolfssl): a client and a
// server that share no code with pion or with cidroute, built from
// Debian's wolfssl 5.5.4 source. The server's CIDs are 8 bytes with its
// ordinal first, the layout cidroute reads by default.

const wolfsslBuild = "internal/testpeers/wolfssl/build.sh"

const (
	wolfsslCIDLen       = 8 // the servers' CIDs (cidserver -l), cidroute's default
	wolfsslClientCIDLen = 4 // the clients' CIDs (cidclient -l)
)

// wolfsslPeers returns the directory build.sh installs into for the
// current sources. The test skips (fails under CIDROUTE_REQUIRE_TOOLS=1)
// when that build is missing: building wolfSSL takes minutes, which a
// test run should not spend unasked.
func wolfsslPeers(t *testing.T) string {
	t.Helper()
	script := filepath.Join("..", "..", wolfsslBuild)
	out, err := exec.Command("bash", script, "--dir").Output()
	require.NoError(t, err, "%s --dir", script)
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "complete")); err != nil {
		msg := fmt.Sprintf("wolfSSL test peers not built at %s: run bash %s", dir, wolfsslBuild)
		if testtool.Required() {
			t.Fatalf("%s (CIDROUTE_REQUIRE_TOOLS=1)", msg)
		}
		t.Skipf("%s (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)", msg)
	}
	return dir
}

// wolfsslCert writes a fresh self-signed P-256 certificate and its key:
// the ones in wolfSSL's source expired in 2025. The client trusts the
// certificate itself.
func wolfsslCert(t *testing.T) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cidroute wolfssl e2e"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(k)
	require.NoError(t, err)
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return cert, key
}

// wolfsslServer is one cidserver process: a DTLS 1.3 echo server that
// answers m with "<ordinal>|m" and prints a line per event.
type wolfsslServer struct {
	*transparentProc
	ord  uint8
	addr netip.AddrPort
}

func startWolfSSLServer(t *testing.T, dir, cert, key string, ord uint8) *wolfsslServer {
	t.Helper()
	p := startTransparentProc(t, fmt.Sprintf("cidserver %d", ord), filepath.Join(dir, "bin", "cidserver"),
		"-c", cert, "-k", key, "-o", strconv.Itoa(int(ord)), "-l", strconv.Itoa(wolfsslCIDLen))
	line := p.waitFor(t, "LISTEN ")
	addr, err := netip.ParseAddrPort(strings.TrimSpace(strings.TrimPrefix(line, "LISTEN")))
	require.NoError(t, err, "LISTEN line %q", line)
	return &wolfsslServer{transparentProc: p, ord: ord, addr: addr}
}

// count returns how many output lines contain substr.
func (p *transparentProc) count(substr string) int {
	n := 0
	for line := range strings.Lines(p.out.String()) {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// wolfsslClient is one cidclient process behind its own relay: the client
// keeps its socket, the relay plays the NAT in front of it.
type wolfsslClient struct {
	*transparentProc
	relay *wolfsslRelay
	cid   []byte // the server's CID, which the client writes into records
}

// dialWolfSSL starts a relay from upstream (port 0: the kernel picks) to
// via and a client behind it, and waits for the handshake.
func dialWolfSSL(t *testing.T, dir, ca, name string, via, upstream netip.AddrPort) *wolfsslClient {
	t.Helper()
	return dialWolfSSLArgs(t, dir, ca, name, via, upstream, "-l", strconv.Itoa(wolfsslClientCIDLen))
}

// dialWolfSSLArgs is dialWolfSSL with cidclient's CID flags: "-l n" for a
// CID of n bytes towards the client, "-n" for no connection_id extension.
func dialWolfSSLArgs(t *testing.T, dir, ca, name string, via, upstream netip.AddrPort, cidArgs ...string) *wolfsslClient {
	t.Helper()
	r := startWolfSSLRelay(t, via, upstream)
	p := startTransparentProc(t, name, filepath.Join(dir, "bin", "cidclient"),
		append([]string{"-s", r.front.LocalAddr().String(), "-A", ca}, cidArgs...)...)
	line := p.waitFor(t, "HANDSHAKE ")
	require.Contains(t, line, "version=DTLSv1.3", "%s", name)
	var cid []byte
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, "cid_tx="); ok && v != "-" {
			var err error
			cid, err = hex.DecodeString(v)
			require.NoError(t, err, "%s: %q", name, line)
		}
	}
	if !slices.Contains(cidArgs, "-n") {
		require.Len(t, cid, wolfsslCIDLen, "%s: the server's CID (%q)", name, line)
	}
	return &wolfsslClient{transparentProc: p, relay: r, cid: cid}
}

// ask sends msg and returns the ordinal that echoed it. A lost echo is a
// failure: nothing is lost on loopback, and the server moves a session to
// a record's new source before it answers.
func (c *wolfsslClient) ask(t *testing.T, msg string) int {
	t.Helper()
	c.send(t, msg)
	line := c.waitFor(t, "|"+msg)
	v, _, _ := strings.Cut(strings.TrimPrefix(line, "RECV data="), "|")
	ord, err := strconv.Atoi(v)
	require.NoError(t, err, "%s: %q", c.name, line)
	return ord
}

// wolfsslRelay forwards datagrams between a client and a proxy replica
// from an upstream socket it can replace, as a NAT that rebinds does, and
// keeps every datagram for the vectors.
type wolfsslRelay struct {
	front *net.UDPConn
	wg    sync.WaitGroup

	mu     sync.Mutex
	client netip.AddrPort
	up     *net.UDPConn
	target netip.AddrPort
	phase  string
	log    []wolfsslDatagram
}

type wolfsslDatagram struct {
	phase    string
	toServer bool
	b        []byte
}

func startWolfSSLRelay(t *testing.T, target, upstream netip.AddrPort) *wolfsslRelay {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	r := &wolfsslRelay{front: front, phase: "handshake"}
	require.NoError(t, r.rebind(target, upstream))
	r.wg.Go(r.fromClient)
	t.Cleanup(func() {
		front.Close()
		r.mu.Lock()
		r.up.Close()
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// rebind replaces the upstream socket with one bound to upstream and
// sends to target from now on. The old socket closes: what the proxy
// still sends to it is lost, as at a NAT that dropped the mapping.
func (r *wolfsslRelay) rebind(target, upstream netip.AddrPort) error {
	up, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(upstream))
	if err != nil {
		return err
	}
	r.mu.Lock()
	old := r.up
	r.up, r.target = up, target
	r.mu.Unlock()
	if old != nil {
		old.Close()
	}
	r.wg.Go(func() { r.fromServer(up) })
	return nil
}

func (r *wolfsslRelay) upstream() netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.up.LocalAddr().(*net.UDPAddr).AddrPort()
}

// datagrams returns what the relay has passed so far.
func (r *wolfsslRelay) datagrams() []wolfsslDatagram {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *wolfsslRelay) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.mu.Unlock()
}

func (r *wolfsslRelay) record(toServer bool, b []byte) {
	r.mu.Lock()
	r.log = append(r.log, wolfsslDatagram{phase: r.phase, toServer: toServer, b: append([]byte(nil), b...)})
	r.mu.Unlock()
}

func (r *wolfsslRelay) fromClient() {
	buf := make([]byte, 65536)
	for {
		n, from, err := r.front.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		r.record(true, buf[:n])
		r.mu.Lock()
		r.client = from
		up, target := r.up, r.target
		r.mu.Unlock()
		up.WriteToUDPAddrPort(buf[:n], target)
	}
}

func (r *wolfsslRelay) fromServer(up *net.UDPConn) {
	buf := make([]byte, 65536)
	for {
		n, _, err := up.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // an ICMP error from an earlier send
		}
		r.record(false, buf[:n])
		r.mu.Lock()
		client := r.client
		r.mu.Unlock()
		r.front.WriteToUDPAddrPort(buf[:n], client)
	}
}

// wolfsslTier is two cidservers (ordinals 0 and 1) behind two
// transparent replicas that share the public address.
type wolfsslTier struct {
	dir, cert string
	srvs      []*wolfsslServer
	rs        []*replica
	bs        []registry.Backend
}

func startWolfSSLTier(t *testing.T, dir string) *wolfsslTier {
	t.Helper()
	cert, key := wolfsslCert(t)
	w := &wolfsslTier{dir: dir, cert: cert}
	var addrs []netip.AddrPort
	for ord := range uint8(2) {
		s := startWolfSSLServer(t, dir, cert, key, ord)
		w.srvs, addrs = append(w.srvs, s), append(addrs, s.addr)
	}
	w.bs = transparentBackends(addrs...)
	w.rs = startTransparent(t, 2, public, w.bs)
	return w
}

// upstreamFor returns a free loopback address (host 127.0.3.x) from which
// a new session lands on backend ord by HRW.
func (w *wolfsslTier) upstreamFor(t *testing.T, ord int) netip.AddrPort {
	t.Helper()
	for host := byte(10); host < 250; host++ {
		a := transparentFreePort(t, netip.AddrFrom4([4]byte{127, 0, 3, host}))
		if b, ok := w.rs[0].reg.Snapshot().PickNewAddrs(a, public); ok && int(b.Ordinal) == ord {
			return a
		}
	}
	t.Fatalf("HRW never chose backend %d", ord)
	return netip.AddrPort{}
}

// checkHandshakes asserts that each server completed exactly the
// handshakes it was given: a client that lost its session would
// handshake again (on whichever backend HRW picks).
func (w *wolfsslTier) checkHandshakes(t *testing.T, want ...int) {
	t.Helper()
	for i, s := range w.srvs {
		assert.Equal(t, want[i], s.count("HANDSHAKE "), "handshakes on server %d:\n%s", i, s.out.String())
		assert.Zero(t, s.count("ERROR "), "server %d:\n%s", i, s.out.String())
	}
}

// TestInteropWolfSSL: wolfSSL's DTLS 1.3 client and server with
// connection IDs through cidproxy in transparent mode. The subtests name
// peer/mode/scenario.
func TestInteropWolfSSL(t *testing.T) {
	dir := wolfsslPeers(t)
	// handshake: a client per backend; each handshake lands on the backend
	// HRW names for the client's address, the server's CID carries that
	// ordinal, and messages sent over time come back from it.
	t.Run("wolfssl-dtls13/transparent/handshake-echo", func(t *testing.T) {
		w := startWolfSSLTier(t, dir)
		for ord := range 2 {
			c := dialWolfSSL(t, w.dir, w.cert, fmt.Sprintf("cidclient %d", ord), w.rs[ord].addr, w.upstreamFor(t, ord))
			assert.Equal(t, ord, int(c.cid[0]), "the CID names the server HRW chose")
			for i := range 3 {
				c.relay.setPhase(fmt.Sprintf("data %d", i))
				assert.Equal(t, ord, c.ask(t, fmt.Sprintf("client %d message %d", ord, i)))
				time.Sleep(50 * time.Millisecond)
			}
			c.relay.setPhase("close")
			require.NoError(t, c.stdin.Close())
			c.waitFor(t, "BYE")
			w.srvs[ord].waitFor(t, "CLOSED ")
			maybeWriteWolfSSLVectors(t, w.dir, c, ord)
		}
		w.checkHandshakes(t, 1, 1)
	})

	// rebinding: mid-session the client's NAT gives it a new source port
	// towards the same replica. The replica sees a new client address,
	// routes its CID records by the ordinal, and the server follows the
	// session to the replica's new upstream socket.
	t.Run("wolfssl-dtls13/transparent/nat-rebinding", func(t *testing.T) {
		w := startWolfSSLTier(t, dir)
		for ord := range 2 {
			c := dialWolfSSL(t, w.dir, w.cert, fmt.Sprintf("cidclient %d", ord), w.rs[0].addr, w.upstreamFor(t, ord))
			require.Equal(t, ord, c.ask(t, "before"))
			for i := range 2 {
				old := c.relay.upstream()
				// A new port on an address HRW would give the other backend:
				// only the CID can bring the record home.
				require.NoError(t, c.relay.rebind(w.rs[0].addr, w.upstreamFor(t, 1-ord)))
				require.NotEqual(t, old, c.relay.upstream())
				assert.Equal(t, ord, c.ask(t, fmt.Sprintf("after rebinding %d", i)), "client %d", ord)
				w.srvs[ord].waitForNth(t, "MOVED ", i+1)
			}
		}
		w.checkHandshakes(t, 1, 1)
		assert.Equal(t, 6, w.rs[0].sessions(), "a transparent session per client address")
	})

	// draining: the owning backend drains between the handshake and the
	// rebinding. Its session keeps routing to it; a new client goes to the
	// other backend.
	t.Run("wolfssl-dtls13/transparent/owner-draining", func(t *testing.T) {
		w := startWolfSSLTier(t, dir)
		c := dialWolfSSL(t, w.dir, w.cert, "cidclient", w.rs[0].addr, w.upstreamFor(t, 0))
		require.Equal(t, 0, c.ask(t, "before draining"))
		// An address from which a new session would land on backend 0
		// while it is ready.
		toZero := w.upstreamFor(t, 0)

		bs := append([]registry.Backend(nil), w.bs...)
		bs[0].State = registry.Draining
		setBackends(t, w.rs, bs)
		require.NoError(t, c.relay.rebind(w.rs[0].addr, w.upstreamFor(t, 1)))
		assert.Equal(t, 0, c.ask(t, "draining, after rebinding"), "the draining owner keeps its session")
		w.srvs[0].waitFor(t, "MOVED ")

		// A new session must not go to a draining backend.
		fresh := dialWolfSSL(t, w.dir, w.cert, "cidclient new", w.rs[1].addr, toZero)
		assert.Equal(t, 1, int(fresh.cid[0]), "a new session lands on the ready backend")
		assert.Equal(t, 1, fresh.ask(t, "new session"))
		w.checkHandshakes(t, 1, 1)
	})

	// no CID: a client that offers no connection_id extension, so its
	// unified headers carry none (C clear). The replicas route them as
	// they route a ClientHello, by the client's address, to the backend
	// HRW chose for the handshake; nothing is dropped.
	t.Run("wolfssl-dtls13/transparent/no-cid", func(t *testing.T) {
		w := startWolfSSLTier(t, dir)
		for ord := range 2 {
			c := dialWolfSSLArgs(t, dir, w.cert, fmt.Sprintf("cidclient %d", ord), w.rs[ord].addr, w.upstreamFor(t, ord), "-n")
			require.Nil(t, c.cid, "no CID negotiated")
			for i := range 2 {
				c.relay.setPhase(fmt.Sprintf("data %d", i))
				assert.Equal(t, ord, c.ask(t, fmt.Sprintf("client %d message %d", ord, i)))
			}
			c.relay.setPhase("close")
			require.NoError(t, c.stdin.Close())
			c.waitFor(t, "BYE")
			w.srvs[ord].waitFor(t, "CLOSED ")
			unified := 0
			for _, d := range c.relay.datagrams() {
				if d.toServer && d.b[0]&0xe0 == 0x20 {
					unified++
					assert.Zero(t, d.b[0]&0x10, "a unified header with the C bit: %x", d.b)
				}
			}
			assert.NotZero(t, unified, "the client sent DTLS 1.3 records")
			maybeWriteWolfSSLVectors(t, dir, c, ord)
		}
		w.checkHandshakes(t, 1, 1)
		for _, r := range w.rs {
			f := forward([]*replica{r})
			assert.Zero(t, f.DroppedTotal(), "replica %s: %v", r.name, dropList(&f))
		}
	})

	// second replica: the client's path moves to the other replica (a load
	// balancer that rehashed), from a new port. The second replica has
	// never seen the session and routes it by the CID alone.
	t.Run("wolfssl-dtls13/transparent/second-replica", func(t *testing.T) {
		w := startWolfSSLTier(t, dir)
		for ord := range 2 {
			c := dialWolfSSL(t, w.dir, w.cert, fmt.Sprintf("cidclient %d", ord), w.rs[0].addr, w.upstreamFor(t, ord))
			require.Equal(t, ord, c.ask(t, "via replica A"))
			require.NoError(t, c.relay.rebind(w.rs[1].addr, w.upstreamFor(t, 1-ord)))
			assert.Equal(t, ord, c.ask(t, "via replica B"), "client %d", ord)
			w.srvs[ord].waitFor(t, "MOVED ")
			assert.Equal(t, ord, c.ask(t, "via replica B again"), "client %d", ord)
		}
		w.checkHandshakes(t, 1, 1)
		assert.Equal(t, 2, w.rs[0].sessions(), "replica A: the handshakes")
		assert.Equal(t, 2, w.rs[1].sessions(), "replica B: the moved sessions")
	})
}

// wolfsslVectors, when set, is where the handshake-echo subtest writes
// the datagrams of its ordinal-1 client as dtls test vectors (NAME.hex +
// NAME.expect, dtls/testdata/README.md):
//
//	go test -run TestInteropWolfSSL/wolfssl-dtls13/transparent/handshake ./examples/e2e \
//	    -wolfssl-vectors=$PWD/dtls/testdata/wolfssl
var wolfsslVectors = flag.String("wolfssl-vectors", "", "write the captured wolfSSL datagrams as dtls test vectors into this directory")

// wolfsslRecord is one record as RFC 9147 §4 lays it out, read here
// independently of package dtls so that the vectors' expectations are not
// the classifier's own output.
type wolfsslRecord struct {
	unified        bool
	flags          byte   // unified: 001CSLEE
	ctype          byte   // DTLS 1.2-style: the content type
	epoch          uint16 // DTLS 1.2-style: the epoch; unified: the EE bits
	cid            []byte // unified with C set
	seqLen, length int
	hsType         int // plaintext handshake: msg_type; else -1
}

// walkWolfSSL splits a datagram into records. cidLen is the length of
// the CIDs that the datagram's receiver issued.
func walkWolfSSL(b []byte, cidLen int) ([]wolfsslRecord, error) {
	var recs []wolfsslRecord
	for len(b) > 0 {
		r := wolfsslRecord{hsType: -1}
		if b[0]&0xe0 == 0x20 {
			r.unified, r.flags, r.epoch = true, b[0], uint16(b[0]&3)
			i := 1
			if b[0]&0x10 != 0 {
				if len(b) < i+cidLen {
					return nil, fmt.Errorf("CID truncated")
				}
				r.cid, i = b[i:i+cidLen], i+cidLen
			}
			r.seqLen = 1
			if b[0]&0x08 != 0 {
				r.seqLen = 2
			}
			i += r.seqLen
			if b[0]&0x04 != 0 {
				if len(b) < i+2 {
					return nil, fmt.Errorf("length truncated")
				}
				r.length, i = int(b[i])<<8|int(b[i+1]), i+2
			} else {
				r.length = len(b) - i
			}
			if len(b) < i+r.length {
				return nil, fmt.Errorf("record truncated")
			}
			b = b[i+r.length:]
		} else {
			if len(b) < 13 {
				return nil, fmt.Errorf("header truncated")
			}
			r.ctype, r.epoch = b[0], uint16(b[3])<<8|uint16(b[4])
			r.seqLen, r.length = 6, int(b[11])<<8|int(b[12])
			if len(b) < 13+r.length {
				return nil, fmt.Errorf("record truncated")
			}
			if r.ctype == 22 && r.epoch == 0 && r.length > 0 {
				r.hsType = int(b[13])
			}
			b = b[13+r.length:]
		}
		recs = append(recs, r)
	}
	return recs, nil
}

func (r wolfsslRecord) String() string {
	if r.unified {
		cid := "no CID"
		if r.cid != nil {
			cid = "CID " + hex.EncodeToString(r.cid)
		}
		l := fmt.Sprintf("length %d", r.length)
		if r.flags&0x04 == 0 {
			l = fmt.Sprintf("no length (%d bytes to the end)", r.length)
		}
		return fmt.Sprintf("unified header 0x%02x: %s, %d-bit sequence number, %s, epoch bits %d", r.flags, cid, 8*r.seqLen, l, r.epoch)
	}
	names := map[byte]string{20: "change_cipher_spec", 21: "alert", 22: "handshake", 23: "application_data", 26: "ack"}
	s := fmt.Sprintf("DTLS 1.2-style header: %s, epoch %d, length %d", names[r.ctype], r.epoch, r.length)
	if r.hsType >= 0 {
		hs := map[int]string{1: "ClientHello", 2: "ServerHello (or HelloRetryRequest)"}[r.hsType]
		if hs == "" {
			hs = fmt.Sprintf("type %d", r.hsType)
		}
		s += ", " + hs
	}
	return s
}

// hrrRandom is the ServerHello.random that makes it a HelloRetryRequest
// (RFC 8446 §4.1.3): SHA-256 of "HelloRetryRequest".
const hrrRandom = "cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c"

// wolfsslLabel names a datagram by its first record: what a reader of
// the wire can tell without keys.
func wolfsslLabel(b []byte, r wolfsslRecord) string {
	switch {
	case r.hsType == 1:
		return "clienthello"
	case r.hsType == 2 && len(b) >= 13+12+2+32 && hex.EncodeToString(b[13+12+2:13+12+2+32]) == hrrRandom:
		return "hrr"
	case r.hsType == 2:
		return "serverhello"
	case r.unified:
		return fmt.Sprintf("epoch%d", r.epoch)
	}
	return fmt.Sprintf("type%d", r.ctype)
}

// wolfsslVector is one datagram to write with what it is.
type wolfsslVector struct {
	name, note string
	toServer   bool
	b          []byte
}

// maybeWriteWolfSSLVectors writes c's datagrams when -wolfssl-vectors is
// set and ord is 1, and a few derived from them in the header forms
// wolfSSL 5.5.4 never sends (8-bit sequence number, no length, two
// records in a datagram). The expectations follow from RFC 9147 and the
// routing rules, read by walkWolfSSL: a ClientHello opens a session; a
// unified-header record with the receiver's CID is an established
// session's, routed by the ordinal in its first byte.
func maybeWriteWolfSSLVectors(t *testing.T, dir string, c *wolfsslClient, ord int) {
	t.Helper()
	if *wolfsslVectors == "" || ord != 1 {
		return
	}
	v, err := os.ReadFile(filepath.Join(dir, "VERSION"))
	require.NoError(t, err)
	version := strings.TrimSpace(string(v))
	require.NoError(t, os.MkdirAll(*wolfsslVectors, 0o755))
	log := c.relay.datagrams()

	// A client without CIDs: its datagrams, classified with the service's
	// CID length, and neither the server's (nothing to classify them by)
	// nor derived forms.
	nocid := c.cid == nil
	prefix := ""
	if nocid {
		prefix = "nocid_"
	}
	var vs []wolfsslVector
	var finished, appdata []byte
	n := map[string]int{}
	for _, d := range log {
		side, cidLen := "client", wolfsslCIDLen
		if !d.toServer {
			if nocid {
				continue
			}
			side, cidLen = "server", wolfsslClientCIDLen
		}
		recs, err := walkWolfSSL(d.b, cidLen)
		require.NoError(t, err, "%x", d.b)
		phase := strings.ReplaceAll(d.phase, " ", "")
		n[side+phase]++
		label := wolfsslLabel(d.b, recs[0])
		note := fmt.Sprintf("%s phase, datagram %d of this direction", d.phase, n[side+phase])
		switch {
		case d.toServer && d.phase == "handshake" && label == "epoch2":
			note += ": the client's Finished, its only epoch-2 message (no client certificate)"
			finished = d.b
		case d.toServer && d.phase == "data 0":
			note += ": application data"
			appdata = d.b
		case !d.toServer && d.phase == "handshake" && label == "epoch2":
			note += ": one message of EncryptedExtensions, Certificate, CertificateVerify, Finished (in that order)"
		case !d.toServer && d.phase == "handshake" && label == "epoch3":
			note += ": the ACK of the client's Finished (inner plaintext 19 bytes: one record number)"
		case d.phase == "close":
			note += ": close_notify"
		}
		vs = append(vs, wolfsslVector{name: fmt.Sprintf("%s%s_%s_%d_%s", prefix, side, phase, n[side+phase], label), note: note, toServer: d.toServer, b: d.b})
	}
	require.NotNil(t, finished, "no client Finished captured")
	require.NotNil(t, appdata, "no client application data captured")
	if nocid {
		writeWolfSSLVectors(t, version, ord, vs, true)
		return
	}

	// Derived forms: the same record with the header shortened as RFC 9147
	// §4 allows. Only the header changes (the ciphertext cannot be
	// decrypted any more, which routing never needs).
	cidEnd := 1 + wolfsslCIDLen
	seq8 := append([]byte{appdata[0] &^ 0x08}, appdata[1:cidEnd]...)
	seq8 = append(append(seq8, appdata[cidEnd+1]), appdata[cidEnd+2:]...)
	noLen := append([]byte{appdata[0] &^ 0x04}, appdata[1:cidEnd+2]...)
	noLen = append(noLen, appdata[cidEnd+4:]...)
	both := append([]byte{appdata[0] &^ 0x0c}, appdata[1:cidEnd]...)
	both = append(append(both, appdata[cidEnd+1]), appdata[cidEnd+4:]...)
	derived := "derived from client_data0_1_epoch3 (wolfSSL 5.5.4 always sets S and L): "
	vs = append(vs,
		wolfsslVector{name: "derived_seq8_length", note: derived + "8-bit sequence number (its low byte), length kept", toServer: true, b: seq8},
		wolfsslVector{name: "derived_seq16_nolength", note: derived + "length field removed: the record runs to the datagram's end", toServer: true, b: noLen},
		wolfsslVector{name: "derived_seq8_nolength", note: derived + "8-bit sequence number and no length: RFC 9147's shortest header with a CID", toServer: true, b: both},
		wolfsslVector{name: "derived_finished_appdata", note: "derived: the client's Finished and its first application data record in one datagram (wolfSSL sends one record per datagram)", toServer: true, b: append(append([]byte(nil), finished...), appdata...)},
	)

	writeWolfSSLVectors(t, version, ord, vs, false)
}

// writeWolfSSLVectors writes each vector as NAME.hex with NAME.expect.
// nocid: the session negotiated no CIDs.
func writeWolfSSLVectors(t *testing.T, version string, ord int, vs []wolfsslVector, nocid bool) {
	t.Helper()
	date := time.Now().UTC().Format(time.DateOnly)
	for _, v := range vs {
		cidLen, from, whose := wolfsslCIDLen, "client -> server", "server's"
		if !v.toServer {
			cidLen, from, whose = wolfsslClientCIDLen, "server -> client", "client's"
		}
		recs, err := walkWolfSSL(v.b, cidLen)
		require.NoError(t, err, "%s: %x", v.name, v.b)

		var h strings.Builder
		fmt.Fprintf(&h, "# %s (Debian's source; internal/testpeers/wolfssl) DTLS 1.3, %s,\n", version, from)
		cids := fmt.Sprintf("The %s CIDs are %d bytes", whose, cidLen)
		if nocid {
			cids = fmt.Sprintf("No CIDs (cidclient -n); classified with the service's CID length, %d", cidLen)
		}
		fmt.Fprintf(&h, "# %s.\n# %s; server ordinal %d.\n", v.note, cids, ord)
		for i, r := range recs {
			fmt.Fprintf(&h, "# record %d: %v\n", i+1, r)
		}
		fmt.Fprintf(&h, "# written by examples/e2e TestInteropWolfSSL -wolfssl-vectors from its relay's capture, %s\n", date)
		for b := v.b; len(b) > 0; {
			k := min(len(b), 32)
			fmt.Fprintf(&h, "%x\n", b[:k])
			b = b[k:]
		}

		var e strings.Builder
		fmt.Fprintf(&e, "cid_len: %d\n", cidLen)
		if !v.toServer {
			e.WriteString("direction: server\n")
		}
		hello, unified := false, false
		var cid []byte
		for _, r := range recs {
			hello = hello || r.hsType == 1
			unified = unified || r.unified
			if cid == nil && r.cid != nil {
				cid = r.cid
			}
		}
		if cid != nil {
			e.WriteString("kind: established\n")
			if v.toServer {
				fmt.Fprintf(&e, "ordinal: %d\n", cid[0])
			}
			fmt.Fprintf(&e, "cid: %x\n", cid)
		} else {
			e.WriteString("kind: new\n")
		}
		fmt.Fprintf(&e, "records: %d\nclient_hello: %t\nunified: %t\n", len(recs), hello, unified)
		require.NoError(t, os.WriteFile(filepath.Join(*wolfsslVectors, v.name+".hex"), []byte(h.String()), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(*wolfsslVectors, v.name+".expect"), []byte(e.String()), 0o644))
	}
	t.Logf("wrote %d vectors into %s", len(vs), *wolfsslVectors)
}
