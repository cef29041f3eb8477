package quicgo_test

// A quic-go server over ppv2/backend.Conn (with this package's generator)
// behind two cidroute.Pipeline replicas, and a quic-go client that migrates
// to a new local socket and another replica mid-stream. It lives here, in
// the quic-go adapter's module, so that the core module needs no quic-go.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo"
	"github.com/cidroute/cidroute/registry"
)

var quicPublic = netip.MustParseAddrPort("127.0.0.1:4433")

func tlsPair(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{"cidroute"}},
		&tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"cidroute"}}
}

type quicServer struct {
	ord uint8
	bc  *backend.Conn
	mu  sync.Mutex
	// remotes is the connection's RemoteAddr after each echoed message.
	remotes []backend.Addr
}

func startQUICServer(t *testing.T, ord uint8, tc *tls.Config) *quicServer {
	t.Helper()
	s := &quicServer{ord: ord}
	s.bc = serveQUIC(t, ord, tc, func(conn *quic.Conn, st *quic.Stream) {
		buf := make([]byte, 64)
		for {
			n, err := st.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.remotes = append(s.remotes, *conn.RemoteAddr().(*backend.Addr))
			s.mu.Unlock()
			if _, err := fmt.Fprintf(st, "%d|%s\n", s.ord, buf[:n]); err != nil {
				return
			}
		}
	})
	return s
}

// serveQUIC runs a quic-go server with ordinal ord over a backend.Conn
// that trusts loopback proxies, until the test ends: handle serves each
// stream of each connection.
func serveQUIC(t *testing.T, ord uint8, tc *tls.Config, handle func(*quic.Conn, *quic.Stream)) *backend.Conn {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Direct:         backend.DirectNoHandshake,
		Protocol:       backend.QUIC,
	})
	require.NoError(t, err)
	gen, err := quicgo.NewGenerator(nil, ord)
	require.NoError(t, err)
	tr := &quic.Transport{Conn: bc, ConnectionIDGenerator: gen}
	ln, err := tr.Listen(tc, &quic.Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				for {
					st, err := conn.AcceptStream(ctx)
					if err != nil {
						return
					}
					wg.Go(func() { handle(conn, st) })
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		ln.Close()
		tr.Close()
		wg.Wait()
		bc.Close()
	})
	return bc
}

func startQUICProxy(t *testing.T, bs []registry.Backend) netip.AddrPort {
	t.Helper()
	addr := cidroutetest.Start(t, 7, cidroute.Service{Name: "q", RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC, PublicAddr: quicPublic}}, bs...).Addr
	return addr
}

// redirectConn sends everything to another replica and reports replies as
// coming from the address the client dialed, as an anycast VIP would. It
// embeds net.PacketConn, not *net.UDPConn, so that quic-go cannot bypass
// WriteTo with WriteMsgUDP.
type redirectConn struct {
	net.PacketConn
	to   netip.AddrPort
	from net.Addr
}

func (c *redirectConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	return c.PacketConn.WriteTo(b, net.UDPAddrFromAddrPort(c.to))
}

func (c *redirectConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, _, err := c.PacketConn.ReadFrom(b)
	return n, c.from, err
}

// quic-go sizes the socket buffers through the adapter and so does not log
// its "Not a *net.UDPConn?" warning. quic-go warns once per process, so
// this test must run before any other quic-go Transport is made (it is the
// first in this file); run alone, or later, it passes without checking.
func TestQUICGoNoBufferWarning(t *testing.T) {
	var logged strings.Builder
	log.SetOutput(&logged)
	defer log.SetOutput(os.Stderr)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{})
	require.NoError(t, err)
	defer bc.Close()
	stc, _ := tlsPair(t)
	tr := &quic.Transport{Conn: bc}
	ln, err := tr.Listen(stc, nil)
	require.NoError(t, err)
	ln.Close()
	tr.Close()
	assert.NotContains(t, logged.String(), "buffer")
}

// plainConn hides *net.UDPConn's OOB methods from quic-go.
type plainConn struct{ net.PacketConn }

func TestQUICGoBehindPipeline(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")               // the client's wrapped socket
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard
	defer cancel()
	stc, ctc := tlsPair(t)
	srvs := []*quicServer{startQUICServer(t, 0, stc), startQUICServer(t, 1, stc)}
	var bs []registry.Backend
	for _, s := range srvs {
		bs = append(bs, registry.Backend{Ordinal: s.ord, Addr: s.bc.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1, State: registry.Ready})
	}
	a, b := startQUICProxy(t, bs), startQUICProxy(t, bs)

	u1, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	// quic-go v0.65.0 panics ("cannot use ECN with a basicConn") when a
	// connection that started on a *net.UDPConn migrates to a plain
	// net.PacketConn, so both client paths are plain PacketConns.
	tr1 := &quic.Transport{Conn: plainConn{u1}}
	defer tr1.Close()
	conn, err := tr1.Dial(ctx, net.UDPAddrFromAddrPort(a), ctc, &quic.Config{})
	require.NoError(t, err)
	defer conn.CloseWithError(0, "")
	st, err := conn.OpenStreamSync(ctx)
	require.NoError(t, err)
	rd := make([]byte, 64)
	echo := func(msg string) string {
		_, err := st.Write([]byte(msg))
		require.NoError(t, err)
		n, err := st.Read(rd)
		require.NoError(t, err)
		return string(rd[:n])
	}
	first := echo("one")
	ord := first[:1]
	srv := srvs[first[0]-'0']
	for i := range 10 { // long enough for the client to use the server's NEW_CONNECTION_ID CIDs
		assert.Equal(t, fmt.Sprintf("%s|r%d\n", ord, i), echo(fmt.Sprintf("r%d", i)))
	}

	// Migrate: new local socket, through the other replica.
	u2, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	tr2 := &quic.Transport{Conn: &redirectConn{PacketConn: u2, to: b, from: net.UDPAddrFromAddrPort(a)}}
	defer tr2.Close()
	path, err := conn.AddPath(tr2)
	require.NoError(t, err)
	require.NoError(t, path.Probe(ctx))
	require.NoError(t, path.Switch())
	moved := u2.LocalAddr().(*net.UDPAddr).AddrPort()
	for i := range 5 {
		assert.Equal(t, fmt.Sprintf("%s|m%d\n", ord, i), echo(fmt.Sprintf("m%d", i)), "same backend after migration")
	}

	srv.mu.Lock()
	last := srv.remotes[len(srv.remotes)-1]
	firstSeen := srv.remotes[0]
	srv.mu.Unlock()
	assert.Equal(t, u1.LocalAddr().(*net.UDPAddr).AddrPort(), firstSeen.Client, "claimed client before")
	assert.Equal(t, moved, last.Client, "claimed client after migration")
	assert.NotEqual(t, firstSeen.Proxy, last.Proxy, "measured proxy changed with the replica")
	assert.Equal(t, quicPublic, last.Service)
	r, ok := srv.bc.Route(moved)
	require.True(t, ok, "quic-go wrote to the validated path: committed")
	assert.Equal(t, last, r)
	s := srv.bc.Stats()
	assert.Zero(t, s.AcceptedDirect+s.DroppedUntrusted+s.DroppedBadHeader)
	assert.NotZero(t, s.AcceptedProxied)
}
