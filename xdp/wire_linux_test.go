package xdp

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"

	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	cidpion "github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/ppv2/backend"
	cidquic "github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo"
	"github.com/cidroute/cidroute/registry"
)

var (
	vipDTLS = netip.MustParseAddrPort("198.51.100.80:5684")
	vipQUIC = netip.MustParseAddrPort("198.51.100.80:443")
	psk     = []byte("cidroute xdp wire test")
)

// wire is the topology with backends, two proxy replicas and the fast
// path on replica A.
type wire struct {
	*topo
	regD, regQ *registry.Registry
	pipeA      *cidroute.Pipeline
	pipeB      *cidroute.Pipeline
	accel      *Accel
	dA, qA     netip.AddrPort // replica A (XDP) listen addresses
	dB, qB     netip.AddrPort // replica B (sockets only)
}

func selfSigned(t testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"cidroute.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// listenUDP opens a UDP socket in ns.
func listenUDP(t testing.TB, ns *netns, a netip.AddrPort) *net.UDPConn {
	t.Helper()
	var u *net.UDPConn
	ns.do(t, func() {
		var err error
		if u, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(a)); err != nil {
			t.Fatal(err)
		}
	})
	return u
}

func backendConn(t testing.TB, ns *netns, a netip.AddrPort, p backend.Protocol) *backend.Conn {
	t.Helper()
	c, err := backend.New(listenUDP(t, ns, a), backend.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("203.0.113.1/32")},
		Direct:         backend.DirectNoHandshake, Protocol: p})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echo replies "ORD:" + the message, so the client sees which backend
// answered.
func echo(ord uint8, rw io.ReadWriter) {
	buf := make([]byte, 2048)
	for {
		n, err := rw.Read(buf)
		if err != nil {
			return
		}
		if _, err := rw.Write(append([]byte(strconv.Itoa(int(ord))+":"), buf[:n]...)); err != nil {
			return
		}
	}
}

func newWire(t *testing.T) *wire {
	w := &wire{topo: newTopo(t)}
	var dtlsBs, quicBs []registry.Backend
	cert := selfSigned(t)
	for ord := range uint8(3) {
		// DTLS: pion with ordinal-first CIDs behind the PPv2 adapter.
		da := netip.AddrPortFrom(backendAddr(ord), 5684)
		gen, err := cidpion.Generator(ord, 8)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := cidpion.Listen(backendConn(t, w.backend, da, backend.DTLS), &piondtls.Config{
			PSK: func([]byte) ([]byte, error) { return psk, nil }, PSKIdentityHint: []byte("xdp"),
			CipherSuites:          []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
			ConnectionIDGenerator: gen, ExtendedMasterSecret: piondtls.RequireExtendedMasterSecret})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); echo(ord, c) }()
			}
		}()
		dtlsBs = append(dtlsBs, registry.Backend{Ordinal: ord, Addr: da})

		// QUIC: quic-go with QUIC-LB CIDs behind the PPv2 adapter.
		qa := netip.AddrPortFrom(backendAddr(ord), 4433)
		qgen, err := quicgo.NewGenerator(cidquic.LB{}, ord)
		if err != nil {
			t.Fatal(err)
		}
		tr := &quic.Transport{Conn: backendConn(t, w.backend, qa, backend.QUIC), ConnectionIDGenerator: qgen}
		t.Cleanup(func() { tr.Close() })
		ql, err := tr.Listen(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"xdp-echo"}}, &quic.Config{})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ql.Accept(context.Background())
				if err != nil {
					return
				}
				go func() {
					for {
						s, err := c.AcceptStream(context.Background())
						if err != nil {
							return
						}
						go echo(ord, s)
					}
				}()
			}
		}()
		quicBs = append(quicBs, registry.Backend{Ordinal: ord, Addr: qa})
	}
	var err error
	if w.regD, err = registry.New(registry.Config{Service: "d", Seed: 42}); err != nil {
		t.Fatal(err)
	}
	if w.regQ, err = registry.New(registry.Config{Service: "q", Seed: 42}); err != nil {
		t.Fatal(err)
	}
	if err := w.regD.Update(dtlsBs); err != nil {
		t.Fatal(err)
	}
	if err := w.regQ.Update(quicBs); err != nil {
		t.Fatal(err)
	}
	w.dA, w.qA = netip.AddrPortFrom(proxyFront, 5684), netip.AddrPortFrom(proxyFront, 443)
	w.dB, w.qB = netip.AddrPortFrom(proxyFront, 5685), netip.AddrPortFrom(proxyFront, 444)
	services := func(d, q netip.AddrPort) []cidroute.Service {
		return []cidroute.Service{
			{Name: "d", Listen: d, Workers: 1, RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: vipDTLS, Backends: w.regD}},
			{Name: "q", Listen: q, Workers: 1, RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC, PublicAddr: vipQUIC, Backends: w.regQ}},
		}
	}
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.proxy.do(t, func() {
		sa := services(w.dA, w.qA)
		if w.pipeA, err = cidroute.New(cidroute.Config{Services: sa, Logger: log}); err != nil {
			t.Fatal(err)
		}
		if w.pipeB, err = cidroute.New(cidroute.Config{Services: services(w.dB, w.qB), Logger: log}); err != nil {
			t.Fatal(err)
		}
		if w.accel, err = Accelerate(w.pipeA, sa, 0, []string{"pc", "pb"}, log); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.proxy.do(t, func() { w.accel.Close() }) })
		for _, a := range w.accel.prog.links {
			if a.mode != Native {
				t.Errorf("%s: attached in %s mode, want native (veth supports it)", a.ifname, a.mode)
			}
		}
	})
	for _, p := range []*cidroute.Pipeline{w.pipeA, w.pipeB} {
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() { p.Close(); <-done })
	}
	goIn(t, w.proxy, ctx, func(ctx context.Context) { w.accel.Run(ctx) })
	return w
}

// clientSocket opens a socket in the client namespace.
func (w *wire) clientSocket(t testing.TB) func() (*net.UDPConn, error) {
	return func() (*net.UDPConn, error) { return listenUDP(t, w.client, netip.AddrPortFrom(clientAddr, 0)), nil }
}

// rebindConn is a client socket in the client namespace that can change
// its port (a NAT rebinding) and the replica it sends to, while the DTLS
// or QUIC stack above believes it talks to the public address throughout.
func rebindConn(t testing.TB, listen func() (*net.UDPConn, error), remote, via netip.AddrPort) *cidroutetest.RebindConn {
	c, err := cidroutetest.ListenRebindFunc(listen, via, net.UDPAddrFromAddrPort(remote))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundTrip writes msg and reads the reply, returning the answering
// backend's ordinal.
func roundTrip(t testing.TB, rw io.ReadWriter, setDeadline func(time.Time) error, msg string) int {
	t.Helper()
	var last error
	buf := make([]byte, 2048)
	for range 5 { // datagrams may be lost while a route settles: retry
		if _, err := rw.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		setDeadline(time.Now().Add(2 * time.Second))
		n, err := rw.Read(buf)
		if err != nil {
			last = err
			continue
		}
		ord, rest, ok := bytes.Cut(buf[:n], []byte(":"))
		if !ok || string(rest) != msg {
			t.Fatalf("reply %q to %q", buf[:n], msg)
		}
		o, _ := strconv.Atoi(string(ord))
		return o
	}
	t.Fatalf("no reply to %q: %v", msg, last)
	return -1
}

type dtlsSession struct {
	sock *cidroutetest.RebindConn
	conn *piondtls.Conn
	ord  int
}

func (w *wire) dialDTLS(t *testing.T, via netip.AddrPort) *dtlsSession {
	t.Helper()
	sock := rebindConn(t, w.clientSocket(t), vipDTLS, via)
	conn, err := piondtls.Client(sock, net.UDPAddrFromAddrPort(vipDTLS), &piondtls.Config{
		PSK: func([]byte) ([]byte, error) { return psk, nil }, PSKIdentityHint: []byte("xdp"),
		CipherSuites:          []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
		ConnectionIDGenerator: piondtls.OnlySendCIDGenerator(), ExtendedMasterSecret: piondtls.RequireExtendedMasterSecret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatalf("DTLS handshake via %v: %v", via, err)
	}
	t.Cleanup(func() { conn.Close() })
	s := &dtlsSession{sock: sock, conn: conn}
	s.ord = roundTrip(t, conn, conn.SetReadDeadline, "hello")
	return s
}

type quicSession struct {
	sock   *cidroutetest.RebindConn
	stream *quic.Stream
	ord    int
}

func (w *wire) dialQUIC(t *testing.T, via netip.AddrPort) *quicSession {
	t.Helper()
	sock := rebindConn(t, w.clientSocket(t), vipQUIC, via)
	tr := &quic.Transport{Conn: sock}
	t.Cleanup(func() { tr.Close(); sock.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(vipQUIC),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"xdp-echo"}}, &quic.Config{})
	if err != nil {
		t.Fatalf("QUIC handshake via %v: %v", via, err)
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &quicSession{sock: sock, stream: st}
	s.ord = roundTrip(t, st, st.SetReadDeadline, "hello")
	return s
}

// TestWire runs real pion/dtls and quic-go sessions through the XDP
// program on veth interfaces: handshakes, rebinding to a new port and to
// the sockets-only replica, a drain, and the counters of both paths.
func TestWire(t *testing.T) {
	w := newWire(t)
	const n = 6
	var ds []*dtlsSession
	var qs []*quicSession
	for range n {
		ds = append(ds, w.dialDTLS(t, w.dA))
		qs = append(qs, w.dialQUIC(t, w.qA))
	}
	for i, s := range ds {
		for r := range 3 {
			if o := roundTrip(t, s.conn, s.conn.SetReadDeadline, fmt.Sprintf("dtls %d %d", i, r)); o != s.ord {
				t.Fatalf("dtls session %d moved from backend %d to %d", i, s.ord, o)
			}
		}
	}
	xdpDecided(t, w, "after the handshakes")

	// Rebinding: a new client port, and replica B (sockets only), which
	// must route the CIDs the same way; then back to A from yet another
	// port.
	for _, via := range []struct{ d, q netip.AddrPort }{{w.dB, w.qB}, {w.dA, w.qA}} {
		for i, s := range ds {
			if err := s.sock.Rebind(via.d); err != nil {
				t.Fatal(err)
			}
			if o := roundTrip(t, s.conn, s.conn.SetReadDeadline, fmt.Sprintf("dtls rebound %d", i)); o != s.ord {
				t.Fatalf("dtls session %d via %v after rebinding: backend %d, was %d", i, via.d, o, s.ord)
			}
		}
		for i, s := range qs {
			if err := s.sock.Rebind(via.q); err != nil {
				t.Fatal(err)
			}
			if o := roundTrip(t, s.stream, s.stream.SetReadDeadline, fmt.Sprintf("quic rebound %d", i)); o != s.ord {
				t.Fatalf("quic session %d via %v after rebinding: backend %d, was %d", i, via.q, o, s.ord)
			}
		}
	}

	// Replica agreement for new sessions: the same client port through A
	// (XDP) and B (sockets) hashes to the same backend.
	for i := range 4 {
		u, _ := w.clientSocket(t)()
		port := u.LocalAddr().(*net.UDPAddr).Port
		u.Close()
		var ords [2]int
		for j, via := range []netip.AddrPort{w.dA, w.dB} {
			fixed := func() (*net.UDPConn, error) {
				return listenUDP(t, w.client, netip.AddrPortFrom(clientAddr, uint16(port))), nil
			}
			sock := rebindConn(t, fixed, vipDTLS, via)
			conn, err := piondtls.Client(sock, net.UDPAddrFromAddrPort(vipDTLS), &piondtls.Config{
				PSK: func([]byte) ([]byte, error) { return psk, nil }, PSKIdentityHint: []byte("xdp"),
				CipherSuites:          []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
				ConnectionIDGenerator: piondtls.OnlySendCIDGenerator(), ExtendedMasterSecret: piondtls.RequireExtendedMasterSecret})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			if err := conn.HandshakeContext(ctx); err != nil {
				t.Fatalf("agreement %d via %v: %v", i, via, err)
			}
			cancel()
			ords[j] = roundTrip(t, conn, conn.SetReadDeadline, "which")
			conn.Close()
		}
		if ords[0] != ords[1] {
			t.Fatalf("client port %d: replica A (XDP) chose backend %d, replica B (sockets) %d", port, ords[0], ords[1])
		}
	}

	// Drain the backend of the first sessions: they go on; new sessions
	// avoid it.
	drained := ds[0].ord
	bs := w.regD.Snapshot().Backends()
	next := make([]registry.Backend, len(bs))
	copy(next, bs)
	next[drained].State = registry.Draining
	if err := w.regD.Update(next); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * DefaultPoll) // the program's next snapshot
	for i, s := range ds {
		if s.ord != drained {
			continue
		}
		if o := roundTrip(t, s.conn, s.conn.SetReadDeadline, fmt.Sprintf("draining %d", i)); o != drained {
			t.Fatalf("session %d on the draining backend moved to %d", i, o)
		}
	}
	for i := range n {
		if s := w.dialDTLS(t, w.dA); s.ord == drained {
			t.Fatalf("new session %d went to the draining backend %d", i, drained)
		}
	}
	xdpDecided(t, w, "at the end")
}

// xdpDecided checks that the program carried traffic in both directions
// and dropped none of it, and that each path's counters balance.
func xdpDecided(t *testing.T, w *wire, when string) {
	t.Helper()
	st, err := w.accel.prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	var fwd, rev uint64
	for _, s := range st {
		for _, c := range []Counters{s.Forward, s.Reverse} {
			if c.DroppedTotal() != 0 {
				t.Errorf("%s: %s: the program dropped %v", when, s.Name, c.Dropped)
			}
			if !c.Balanced() {
				t.Errorf("%s: %s: unbalanced %+v", when, s.Name, c)
			}
		}
		fwd += s.Forward.Forwarded
		rev += s.Reverse.Forwarded
		t.Logf("%s: xdp %s: forward %d (%d up), reverse %d (%d up)", when, s.Name,
			s.Forward.Forwarded, s.Forward.Passed, s.Reverse.Forwarded, s.Reverse.Passed)
	}
	for _, s := range w.pipeA.Stats() {
		t.Logf("%s: socket %s: forward %d, reverse %d", when, s.Name, s.Forward.Forwarded, s.Reverse.Forwarded)
	}
	if fwd == 0 || rev == 0 {
		t.Fatalf("%s: the program forwarded %d and relayed %d datagrams: the sockets did all the work", when, fwd, rev)
	}
}
