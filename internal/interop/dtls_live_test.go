package interop

// Live captures from real peers on loopback: a pion/dtls v3 session with
// connection IDs, and OpenSSL's s_client ClientHello. With -update they
// rewrite the golden datagrams in dtls/testdata/, so that dtls's own table
// tests run without any peer; `go test -update ./dtls` then rewrites its fuzz
// seed corpora from them.

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/pion/dtls/v3/pkg/crypto/selfsign"
	"github.com/pion/dtls/v3/pkg/protocol/extension"
	"github.com/pion/dtls/v3/pkg/protocol/handshake"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
)

const (
	liveOrdinal = 7 // the pion server's ordinal
	liveCIDLen  = 8
)

// capture wraps the client's socket and keeps a copy of every datagram in
// both directions, in order.
type capture struct {
	net.PacketConn
	mu  sync.Mutex
	log []captured
}

type captured struct {
	fromClient bool
	b          []byte
}

func (c *capture) add(fromClient bool, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, captured{fromClient, bytes.Clone(b)})
}

func (c *capture) WriteTo(b []byte, addr net.Addr) (int, error) {
	c.add(true, b)
	return c.PacketConn.WriteTo(b, addr)
}

func (c *capture) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.PacketConn.ReadFrom(b)
	if n > 0 {
		c.add(false, b[:n])
	}
	return n, addr, err
}

func (c *capture) datagrams() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]captured(nil), c.log...)
}

// pionSession runs one pion/dtls v3 handshake on loopback: the server issues
// ordinal-first CIDs for liveOrdinal, the client only sends CIDs. The client
// writes "ping", the server answers "pong", then the client closes.
func pionSession(t *testing.T) (dgrams []captured, issued [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // hang guard, not a timing assertion
	defer cancel()

	cert, err := selfsign.GenerateSelfSigned()
	noErr(t, err)
	newCID, err := dtls.OrdinalFirst{Length: liveCIDLen}.Generator(liveOrdinal)
	noErr(t, err)
	var genMu sync.Mutex
	gen := func() []byte { // remembers what it issued
		cid := newCID()
		genMu.Lock()
		defer genMu.Unlock()
		issued = append(issued, cid)
		return cid
	}

	ln, err := piondtls.ListenWithOptions("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)},
		piondtls.WithCertificates(cert),
		piondtls.WithConnectionIDGenerator(gen))
	noErr(t, err)
	defer ln.Close()

	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		sc := c.(*piondtls.Conn)
		if err := sc.HandshakeContext(ctx); err != nil {
			done <- err
			return
		}
		buf := make([]byte, 64)
		n, err := sc.Read(buf)
		if err == nil && string(buf[:n]) != "ping" {
			err = fmt.Errorf("server read %q", buf[:n])
		}
		if err == nil {
			_, err = sc.Write([]byte("pong"))
		}
		done <- err
		// Wait for the client's close_notify so that it is captured.
		_, _ = sc.Read(buf)
	}()

	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	noErr(t, err)
	capt := &capture{PacketConn: udp}
	client, err := piondtls.ClientWithOptions(capt, ln.Addr(),
		piondtls.WithInsecureSkipVerify(true),
		piondtls.WithConnectionIDGenerator(piondtls.OnlySendCIDGenerator()))
	noErr(t, err)
	noErr(t, client.HandshakeContext(ctx))
	_, err = client.Write([]byte("ping"))
	noErr(t, err)
	buf := make([]byte, 64)
	n, err := client.Read(buf)
	noErr(t, err)
	eq(t, "pong", string(buf[:n]))

	select {
	case err = <-done:
		noErr(t, err)
	case <-ctx.Done():
		t.Fatal("server did not finish")
	}
	noErr(t, client.Close())
	udp.Close()
	genMu.Lock()
	defer genMu.Unlock()
	return capt.datagrams(), issued
}

// serverHelloCID returns the connection_id extension of the ServerHello in
// a server datagram, parsed with pion's handshake package.
func serverHelloCID(b []byte) ([]byte, bool) {
	for rest := b; len(rest) > 0; {
		r, n, err := dtls.ParseRecord(rest, liveCIDLen)
		if err != nil {
			return nil, false
		}
		rest = rest[n:]
		var h handshake.Header
		if r.Type != dtls.Handshake || h.Unmarshal(r.Fragment) != nil || h.Type != handshake.TypeServerHello {
			continue
		}
		var sh handshake.MessageServerHello
		if sh.Unmarshal(r.Fragment[handshake.HeaderLength:]) != nil {
			return nil, false
		}
		for _, e := range sh.Extensions {
			if c, ok := e.(*extension.ConnectionID); ok {
				return c.CID, true
			}
		}
	}
	return nil, false
}

func TestLivePion(t *testing.T) {
	dgrams, issued := pionSession(t)

	// The CID the server announced in its ServerHello, read with pion's
	// handshake parser, is one our generator made and carries the ordinal.
	var serverCID []byte
	for _, d := range dgrams {
		if cid, ok := serverHelloCID(d.b); ok && !d.fromClient {
			serverCID = cid
			break
		}
	}
	isTrue(t, slices.ContainsFunc(issued, func(c []byte) bool { return bytes.Equal(c, serverCID) }),
		"ServerHello CID % x not issued by the generator (%d issued)", serverCID, len(issued))
	ord, ok := dtls.OrdinalFirst{Length: liveCIDLen}.Ordinal(serverCID)
	isTrue(t, ok)
	eq(t, uint8(liveOrdinal), ord, "the server's CID carries its ordinal")

	golden := map[string][]byte{}
	keep := func(name string, b []byte) {
		if _, dup := golden[name]; !dup {
			golden[name] = b
		}
	}
	established := false // has the client sent a CID record yet?
	clientHellos, cidDatagrams := 0, 0
	for i, d := range dgrams {
		c, err := dtls.Classify(d.b, liveCIDLen)
		noErr(t, err, "datagram %d (from client: %v): % x", i, d.fromClient, d.b)
		checkAgainstPion(t, d.b, liveCIDLen, c, err)
		if !d.fromClient {
			// The client offered a zero-length CID: the server sends no CID
			// records.
			eq(t, dtls.KindNew, c.Kind, "server datagram %d", i)
			if cid, ok := serverHelloCID(d.b); ok {
				eq(t, serverCID, cid, "ServerHello connection_id")
				keep("pion_server_hello.hex", d.b)
			}
			continue
		}
		if c.ClientHello {
			clientHellos++
			eq(t, dtls.KindNew, c.Kind)
			keep(fmt.Sprintf("pion_clienthello_%d.hex", clientHellos), d.b)
			continue
		}
		if c.Kind == dtls.KindEstablished {
			eq(t, serverCID, c.CID, "datagram %d", i)
			first, _, err := dtls.ParseRecord(d.b, liveCIDLen)
			noErr(t, err)
			if first.Type == dtls.Handshake && first.Epoch == 0 {
				// Flight 5 (or its retransmission): ClientKeyExchange,
				// ChangeCipherSpec, then Finished as the only CID record.
				eq(t, 3, c.Records)
				eq(t, uint8(16), first.Fragment[0], "client_key_exchange")
				keep("pion_flight5.hex", d.b)
			} else {
				// Then "ping" and close_notify, one CID record each.
				isTrue(t, established, "CID record before flight 5")
				eq(t, 1, c.Records)
				eq(t, dtls.TLS12CID, first.Type)
				cidDatagrams++
				switch cidDatagrams {
				case 1:
					keep("pion_appdata.hex", d.b)
				case 2:
					keep("pion_close_notify.hex", d.b)
				}
			}
			established = true
			continue
		}
		isTrue(t, !established, "client datagram %d without CID after flight 5", i)
	}
	isTrue(t, clientHellos >= 2, "ClientHello and ClientHello with cookie")
	isTrue(t, established)
	isTrue(t, golden["pion_server_hello.hex"] != nil, "pion_server_hello.hex")
	isTrue(t, golden["pion_flight5.hex"] != nil, "pion_flight5.hex")

	if *update {
		for name, b := range golden {
			writeHex(t, name, fmt.Sprintf("captured by TestLivePion -update: pion/dtls v3.1.15, cidLen %d, server ordinal %d", liveCIDLen, liveOrdinal), b, liveCIDLen)
		}
	}
}

// TestLiveOpenSSL captures the first ClientHello of `openssl s_client
// -dtls1_2`: OpenSSL sends it with record version fe ff (DTLS 1.0).
func TestLiveOpenSSL(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	b := opensslClientHello(t, openssl)

	r, _, err := dtls.ParseRecord(b, liveCIDLen)
	noErr(t, err)
	eq(t, dtls.VersionDTLS10, r.Version)
	c, err := dtls.Classify(b, liveCIDLen)
	noErr(t, err)
	eq(t, dtls.Class{Kind: dtls.KindNew, ClientHello: true, Records: 1}, c)
	checkAgainstPion(t, b, liveCIDLen, c, err)

	if *update {
		out, _ := exec.Command(openssl, "version").Output()
		writeHex(t, "openssl_clienthello.hex", "captured by TestLiveOpenSSL -update: openssl s_client -dtls1_2, "+string(bytes.TrimSpace(out)), b, liveCIDLen)
	}
}

func opensslClientHello(t *testing.T, openssl string) []byte {
	t.Helper()
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	noErr(t, err)
	defer ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-dtls1_2", "-connect", ln.LocalAddr().String())
	stdin, err := cmd.StdinPipe() // kept open: s_client would quit on EOF
	noErr(t, err)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	noErr(t, cmd.Start())
	defer func() {
		cancel() // kills s_client
		stdin.Close()
		_ = cmd.Wait()
	}()

	noErr(t, ln.SetReadDeadline(time.Now().Add(60*time.Second))) // hang guard
	buf := make([]byte, 65536)
	n, _, err := ln.ReadFromUDP(buf)
	if err != nil {
		cancel()
		_ = cmd.Wait()
		t.Fatalf("no datagram from s_client: %v; its output: %s", err, out.String())
	}
	return buf[:n]
}
