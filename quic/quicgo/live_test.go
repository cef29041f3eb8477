package quicgo

// End-to-end test with real quic-go peers on loopback: the server issues
// CIDs through a Generator, a recording wrapper around its socket keeps
// every datagram, and the test checks them on the wire. With -update it
// also refreshes the golden datagrams in ../testdata that package quic's
// table tests classify.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	cidquic "github.com/cidroute/cidroute/quic"
)

var update = flag.Bool("update", false, "rewrite the golden datagrams in ../testdata from live quic-go peers")

const (
	testOrdinal = 3
	testCIDLen  = 12 // cidquic.LB{} default
)

// datagram is one UDP payload as the server's socket saw it.
type datagram struct {
	in   bool // client → server
	peer string
	b    []byte
}

// recConn records every datagram the server reads and writes. quic-go uses
// plain ReadFrom/WriteTo on it (no GSO or GRO), so one record is one
// datagram on the wire.
type recConn struct {
	net.PacketConn
	mu  sync.Mutex
	all []datagram
}

func (c *recConn) ReadFrom(p []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(p)
	if err == nil {
		c.add(datagram{in: true, peer: addr.String(), b: append([]byte(nil), p[:n]...)})
	}
	return n, addr, err
}

func (c *recConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	c.add(datagram{peer: addr.String(), b: append([]byte(nil), p...)})
	return c.PacketConn.WriteTo(p, addr)
}

func (c *recConn) add(d datagram) {
	c.mu.Lock()
	c.all = append(c.all, d)
	c.mu.Unlock()
}

func (c *recConn) snapshot() []datagram {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]datagram(nil), c.all...)
}

func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		NextProtos:   []string{"cidroute-test"},
	}
	client = &tls.Config{
		RootCAs:            pool,
		ServerName:         "localhost",
		NextProtos:         []string{"cidroute-test"},
		ClientSessionCache: tls.NewLRUClientSessionCache(4),
		// A post-quantum key share makes the ClientHello larger than one
		// datagram, so the first flight spans two Initial datagrams.
		CurvePreferences: []tls.CurveID{tls.X25519MLKEM768},
	}
	return server, client
}

// echo serves every stream of every connection by copying it back.
func echo(ctx context.Context, ln *quic.EarlyListener) {
	for {
		conn, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		go func() {
			for {
				s, err := conn.AcceptStream(ctx)
				if err != nil {
					return
				}
				go func() {
					_, _ = io.Copy(s, s)
					_ = s.Close()
				}()
			}
		}()
	}
}

// session dials the server from its own socket, runs rounds of 1 KiB echo
// messages on one stream and closes. With early, the stream opens and the
// first message is written before the handshake, so that a resumed session
// carries it as 0-RTT. It returns the client's
// address and whether 0-RTT was used.
func session(t *testing.T, ctx context.Context, srv net.Addr, tlsConf *tls.Config, rounds int, early bool) (string, bool) {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	conn, err := tr.DialEarly(ctx, srv, tlsConf, &quic.Config{})
	must(t, err)
	if !early {
		select {
		case <-conn.HandshakeComplete():
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	s, err := conn.OpenStream()
	must(t, err)
	msg := bytes.Repeat([]byte("cidroute"), 128)
	got := make([]byte, len(msg))
	for i := range rounds {
		msg[0] = byte(i)
		_, err = s.Write(msg)
		must(t, err)
		_, err = io.ReadFull(s, got)
		must(t, err)
		if !bytes.Equal(msg, got) {
			t.Fatalf("echo round %d: got %q", i, got)
		}
	}
	<-conn.HandshakeComplete()
	used0RTT := conn.ConnectionState().Used0RTT
	must(t, s.Close())
	must(t, conn.CloseWithError(0, ""))
	return udp.LocalAddr().String(), used0RTT
}

func TestLiveQuicGo(t *testing.T) {
	// The recording wrapper is not a *net.UDPConn; quic-go would warn that
	// it cannot size the socket buffers.
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	if *update && raceDetector {
		t.Fatal("-update needs the 0-RTT session: run it without -race")
	}
	gen, err := NewGenerator(cidquic.LB{}, testOrdinal)
	must(t, err)
	codec := cidquic.LB{}

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	must(t, err)
	rec := &recConn{PacketConn: pc}
	str := &quic.Transport{Conn: rec, ConnectionIDGenerator: gen}
	defer str.Close()
	serverTLS, clientTLS := testTLS(t)
	ln, err := str.ListenEarly(serverTLS, &quic.Config{Allow0RTT: true})
	must(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go echo(ctx, ln)

	// Session 1: full handshake, enough rounds for the client to move to a
	// CID from the server's NEW_CONNECTION_ID frames; it also brings the
	// session ticket for session 2.
	first, _ := session(t, ctx, ln.Addr(), clientTLS, 40, false)
	// Session 2: resumed, the first message goes out as 0-RTT. quic-go
	// v0.65.0 reads the peer's transport parameters without synchronising
	// when a stream opens during the handshake
	// (github.com/quic-go/quic-go/issues/4303); the race detector would
	// flag it, so under -race the session resumes without 0-RTT.
	second, used0RTT := session(t, ctx, ln.Addr(), clientTLS, 4, !raceDetector)
	if !used0RTT && !raceDetector {
		t.Fatal("second session did not use 0-RTT")
	}

	all := rec.snapshot()
	var (
		golden    = map[string][]byte{}
		origDCID  = map[string][]byte{} // the client's random DCID, per client
		serverCID = map[string][]byte{} // SCID of the server's first Initial, per client
		used      = map[string]bool{}   // server CIDs session 1's client sent to
		nInitial  int                   // session 1 datagrams with the random DCID
	)
	for i, d := range all {
		if !d.in {
			scid := checkServerDatagram(t, codec, i, d.b)
			if serverCID[d.peer] == nil && scid != nil {
				serverCID[d.peer] = append([]byte(nil), scid...)
			}
			continue
		}
		c, err := cidquic.Classify(d.b, testCIDLen)
		if err != nil {
			t.Fatalf("client datagram %d (%d bytes): %v\n%x", i, len(d.b), err, d.b)
		}
		if testing.Verbose() {
			t.Logf("client %s: %v, %d packets, Initial %v, 0-RTT %v, DCID %x", d.peer, c.Type, c.Packets, c.Initial, c.ZeroRTT, c.DCID)
		}
		if origDCID[d.peer] == nil {
			origDCID[d.peer] = append([]byte(nil), c.DCID...)
		}
		random := bytes.Equal(c.DCID, origDCID[d.peer])
		if random {
			// Until the server's Initial arrives, only Initial and 0-RTT
			// packets, all with the client's random DCID.
			if c.Kind != cidquic.KindNew {
				t.Fatalf("datagram %d: %v with the client's random DCID", i, c.Type)
			}
		} else if ord, ok := codec.Ordinal(c.DCID); !ok || ord != testOrdinal {
			t.Fatalf("datagram %d: %v DCID %x decodes to %d, %v", i, c.Type, c.DCID, ord, ok)
		}

		name := ""
		switch {
		case d.peer == first && random:
			nInitial++
			name = fmt.Sprintf("quicgo_initial_%d", nInitial)
		case d.peer == first && c.Initial && c.Packets > 1:
			name = "quicgo_initial_coalesced"
		case c.Type == cidquic.Handshake:
			name = "quicgo_handshake"
		case d.peer == first && c.Type == cidquic.Short:
			name = "quicgo_short"
		case d.peer == second && c.Initial && c.ZeroRTT:
			name = "quicgo_initial_0rtt"
		case d.peer == second && random && c.Type == cidquic.ZeroRTT:
			name = "quicgo_0rtt"
		}
		if name != "" && golden[name] == nil {
			golden[name] = d.b
		}
		if d.peer == first && !random {
			used[string(c.DCID)] = true
		}
	}

	// The client moved on from the server's handshake CID to CIDs from
	// NEW_CONNECTION_ID frames (quic-go does so at handshake completion),
	// and those carry the ordinal too (checked above).
	delete(used, string(serverCID[first]))
	if len(used) == 0 {
		t.Fatalf("client never used a NEW_CONNECTION_ID CID (server CID %x)", serverCID[first])
	}
	if *update {
		// How quic-go packs its datagrams depends on timing; the goldens
		// need all of these.
		for _, n := range []string{"quicgo_initial_1", "quicgo_initial_2", "quicgo_initial_coalesced", "quicgo_handshake", "quicgo_short", "quicgo_initial_0rtt", "quicgo_0rtt"} {
			if golden[n] == nil {
				t.Fatalf("no %s datagram captured; run again", n)
			}
		}
	}
	t.Logf("%d datagrams; session 1: %d Initial datagrams with DCID %x, handshake CID %x, then %d NEW_CONNECTION_ID CIDs",
		len(all), nInitial, origDCID[first], serverCID[first], len(used))

	if *update {
		for name, b := range golden {
			writeHex(t, filepath.Join("..", "testdata", name+".hex"), name, b)
		}
	}
}

// checkServerDatagram checks that every long-header packet the server sent
// has an SCID that carries the ordinal, and returns the SCID of its Initial
// packet, if any.
func checkServerDatagram(t *testing.T, codec cidquic.LB, i int, b []byte) (initialSCID []byte) {
	t.Helper()
	for off := 0; off < len(b); {
		h, err := cidquic.ParseHeader(b[off:], 0)
		if err != nil {
			t.Fatalf("server datagram %d at %d: %v", i, off, err)
		}
		if h.Type == cidquic.Short {
			break
		}
		if ord, ok := codec.Ordinal(h.SCID); !ok || ord != testOrdinal {
			t.Fatalf("server datagram %d: %v SCID %x decodes to %d, %v", i, h.Type, h.SCID, ord, ok)
		}
		if h.Type == cidquic.Initial && initialSCID == nil {
			initialSCID = h.SCID
		}
		off += h.Len
	}
	return initialSCID
}

func writeHex(t *testing.T, path, name string, b []byte) {
	t.Helper()
	var sb strings.Builder
	fmt.Fprintf(&sb, "# %s: %d-byte client datagram captured from quic-go %s on loopback\n", name, len(b), quicGoVersion)
	fmt.Fprintf(&sb, "# server CIDs: cidquic.LB{} (12 octets), ordinal %d. Refresh: go test ./quic/quicgo -run TestLiveQuicGo -update\n", testOrdinal)
	for len(b) > 0 {
		n := min(32, len(b))
		sb.WriteString(hex.EncodeToString(b[:n]))
		sb.WriteByte('\n')
		b = b[n:]
	}
	must(t, os.WriteFile(path, []byte(sb.String()), 0o644))
}

const quicGoVersion = "v0.65.0"

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
