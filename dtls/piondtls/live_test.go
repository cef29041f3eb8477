package piondtls

// Real peers on loopback: pion/dtls v3 servers behind backend.Conn and
// piondtls, two cidroute.Pipeline replicas in front, pion/dtls v3 clients
// with connection IDs that rebind to a new socket and a new replica
// mid-session.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

var publicAddr = netip.MustParseAddrPort("127.0.0.1:5684")

func pskConfig() *pion.Config {
	return &pion.Config{
		PSK:             func([]byte) ([]byte, error) { return []byte("cidroute-test-psk"), nil },
		PSKIdentityHint: []byte("cidroute"),
		CipherSuites:    []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8},
	}
}

// server is one pion backend: it answers every message m with
// "<ordinal>|m" and, on "push", sends an extra unsolicited "push"
// afterwards; it records the sessions' remote addresses.
type server struct {
	ord   uint8
	bc    *backend.Conn
	pl    *PacketListener
	ln    net.Listener
	mu    sync.Mutex
	seen  []backend.Addr // RemoteAddr at each message
	conns []net.Conn
	wg    sync.WaitGroup
}

func startServer(t *testing.T, ord uint8) *server {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Direct:         backend.DirectNoHandshake,
		Protocol:       backend.DTLS,
	})
	require.NoError(t, err)
	gen, err := Generator(ord, 0)
	require.NoError(t, err)
	cfg := pskConfig()
	cfg.ConnectionIDGenerator = gen
	pl, err := NewPacketListener(bc, Config{CIDLen: 8})
	require.NoError(t, err)
	ln, err := pion.NewListener(pl, cfg)
	require.NoError(t, err)
	s := &server{ord: ord, bc: bc, pl: pl, ln: ln}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns { // a client's close_notify may be lost at shutdown
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		bc.Close()
	})
	return s
}

func (s *server) addr() netip.AddrPort { return s.bc.LocalAddr().(*net.UDPAddr).AddrPort() }

func (s *server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			buf := make([]byte, 2048)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				msg := string(buf[:n])
				before := *c.RemoteAddr().(*backend.Addr)
				if _, err := fmt.Fprintf(c, "%d|%s", s.ord, msg); err != nil {
					return
				}
				// Before and after the reply: pion hands a record's data
				// to Read before it moves the remote address.
				after := *c.RemoteAddr().(*backend.Addr)
				s.mu.Lock()
				s.seen = append(s.seen, before, after)
				s.mu.Unlock()
				if msg == "push" {
					if _, err := c.Write([]byte("push")); err != nil {
						return
					}
				}
			}
		}()
	}
}

func (s *server) seenAddrs() []backend.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]backend.Addr(nil), s.seen...)
}

// startProxy starts one cidroute replica in front of backends.
func startProxy(t *testing.T, bs []registry.Backend) netip.AddrPort {
	t.Helper()
	addr := cidroutetest.Start(t, 42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: publicAddr}}, bs...).Addr
	return addr
}

// switchConn is a client socket that can be replaced mid-session (a NAT
// rebinding) and pointed at another proxy replica. pion sees one remote
// address throughout.
type switchConn struct {
	mu     sync.Mutex
	conn   *net.UDPConn
	target netip.AddrPort
	remote net.Addr
}

func newSwitchConn(t *testing.T, target netip.AddrPort) *switchConn {
	c := &switchConn{target: target, remote: net.UDPAddrFromAddrPort(target)}
	c.rebind(t, target)
	t.Cleanup(func() { c.Close() })
	return c
}

// rebind moves to a fresh socket sending to target.
func (c *switchConn) rebind(t *testing.T, target netip.AddrPort) {
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	c.mu.Lock()
	old := c.conn
	c.conn, c.target = u, target
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// retarget keeps the socket and sends to target from now on, as when the
// load balancer re-hashes the client to another replica.
func (c *switchConn) retarget(target netip.AddrPort) {
	c.mu.Lock()
	c.target = target
	c.mu.Unlock()
}

func (c *switchConn) local() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

func (c *switchConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		c.mu.Lock()
		u := c.conn
		c.mu.Unlock()
		n, _, err := u.ReadFromUDPAddrPort(b)
		if err != nil {
			c.mu.Lock()
			swapped := c.conn != u
			c.mu.Unlock()
			if swapped {
				continue
			}
			return 0, nil, err
		}
		return n, c.remote, nil
	}
}

func (c *switchConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	u, to := c.conn, c.target
	c.mu.Unlock()
	return u.WriteToUDPAddrPort(b, to)
}

func (c *switchConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Close()
}

func (c *switchConn) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(c.local()) }

func (c *switchConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.SetDeadline(t)
}

func (c *switchConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.SetReadDeadline(t)
}

func (c *switchConn) SetWriteDeadline(t time.Time) error { return nil }

// dial runs a pion client with CID through sc.
func dial(t *testing.T, ctx context.Context, sc *switchConn) *pion.Conn {
	t.Helper()
	cfg := pskConfig()
	cfg.PSKIdentityHint = []byte("client")
	cfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
	c, err := pion.Client(sc, sc.remote, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.HandshakeContext(ctx))
	return c
}

// ask sends msg and returns the reply "<ordinal>|msg", retrying a few
// times and skipping answers to earlier retries. Loopback does not lose
// datagrams, but right after a rebind pion may answer on the old path: it
// hands a record's data to Read before it moves the session's remote
// address, so a quick reply can still leave for the old one.
func ask(t *testing.T, c *pion.Conn, msg string) string {
	t.Helper()
	buf := make([]byte, 2048)
	for range 5 {
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		for {
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			require.NoError(t, err)
			if got := string(buf[:n]); strings.HasSuffix(got, "|"+msg) {
				return got
			}
		}
	}
	t.Fatalf("no reply to %q", msg)
	return ""
}

func TestPionBehindPipeline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard
	defer cancel()
	srvs := []*server{startServer(t, 0), startServer(t, 1), startServer(t, 2)}
	var bs []registry.Backend
	for _, s := range srvs {
		bs = append(bs, registry.Backend{Ordinal: s.ord, Addr: s.addr(), Weight: 1, State: registry.Ready})
	}
	replicas := []netip.AddrPort{startProxy(t, bs), startProxy(t, bs)}

	const clients = 6
	for i := range clients {
		sc := newSwitchConn(t, replicas[i%2])
		first := sc.local()
		c := dial(t, ctx, sc)
		before := ask(t, c, fmt.Sprintf("hello %d", i))
		ord, _, ok := strings.Cut(before, "|")
		require.True(t, ok, before)
		srv := srvs[ord[0]-'0']

		// Rebind: new socket, other replica, same DTLS session.
		sc.rebind(t, replicas[(i+1)%2])
		moved := sc.local()
		require.NotEqual(t, first, moved)
		after := ask(t, c, fmt.Sprintf("again %d", i))
		assert.Equal(t, ord+"|"+fmt.Sprintf("again %d", i), after, "same backend after rebind")

		// The session's route moved with it: claimed client and measured
		// proxy are the new ones.
		// (The server records after its reply, so wait for it.)
		require.Eventually(t, func() bool {
			var sawFirst, sawMoved bool
			for _, a := range srv.seenAddrs() {
				sawFirst = sawFirst || a.Client == first
				sawMoved = sawMoved || a.Client == moved
			}
			return sawFirst && sawMoved
		}, 5*time.Second, time.Millisecond, "server saw %v; want %v and %v", srv.seenAddrs(), first, moved)
		for _, a := range srv.seenAddrs() {
			assert.True(t, a.Proxied(), "every datagram came through a proxy")
			assert.Equal(t, publicAddr, a.Service)
		}
		r, ok := srv.bc.Route(moved)
		require.True(t, ok, "route committed for the new address")
		assert.Equal(t, moved, r.Client)
		_, ok = srv.bc.Route(first)
		assert.False(t, ok, "old address no longer routes")

		// A server-initiated message (sent after the reply) reaches the
		// client on its new socket.
		assert.Equal(t, ord+"|push", ask(t, c, "push"))
		buf := make([]byte, 64)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
		n, err := c.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "push", string(buf[:n]))
	}
	var sessions int
	for _, s := range srvs {
		st := s.pl.Stats()
		sessions += int(st.NewSessions)
		bst := s.bc.Stats()
		assert.Zero(t, bst.AcceptedDirect, "no direct datagrams")
		assert.Zero(t, bst.DroppedUntrusted+bst.DroppedBadHeader)
	}
	assert.Equal(t, clients, sessions, "one session per client, none re-created by the rebind")
}

// A replica dies under pion sessions whose client address does not change
// (the load balancer re-hashes the client to another replica): the next
// message is answered at the first try, through the new replica. With a
// CID, pion moves the session's peer on the record's authenticated
// tls12_cid (RFC 9146 §6) and the session's PacketConn sends through the
// newest proxy even in the moment before pion has moved it; without a CID
// pion never moves it, and the session's PacketConn alone keeps the replies
// on a live replica.
func TestPionReplicaDies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // hang guard
	defer cancel()
	srv := startServer(t, 0)
	bs := []registry.Backend{{Ordinal: 0, Addr: srv.addr(), Weight: 1, State: registry.Ready}}
	svc := cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: publicAddr}}
	for _, withCID := range []bool{true, false} {
		t.Run(fmt.Sprintf("cid=%v", withCID), func(t *testing.T) {
			pxA := cidroutetest.Start(t, 42, svc, bs...)
			pipeA, a := pxA.Pipeline, pxA.Addr
			pxB := cidroutetest.Start(t, 42, svc, bs...)
			pipeB, b := pxB.Pipeline, pxB.Addr
			sc := newSwitchConn(t, a)
			cfg := pskConfig()
			cfg.PSKIdentityHint = []byte("client")
			if withCID {
				cfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
			}
			c, err := pion.Client(sc, sc.remote, cfg)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.HandshakeContext(ctx))
			assert.Equal(t, "0|one", askOnce(t, c, "one"))

			require.NoError(t, pipeA.Close())
			sc.retarget(b)
			for i := range 3 {
				msg := fmt.Sprintf("after %d", i)
				assert.Equal(t, "0|"+msg, askOnce(t, c, msg), "answered through B at the first try")
			}
			ups, ok := pipeB.UpstreamAddrs("svc")
			require.True(t, ok)
			upB := ups[0].Port()
			r, ok := srv.bc.Route(sc.local())
			require.True(t, ok)
			assert.Equal(t, sc.local(), r.Client, "same client address")
			assert.Equal(t, upB, r.Proxy.Port(), "replies, and server-initiated messages, go through B")
			if withCID {
				seen := srv.seenAddrs()
				assert.Equal(t, upB, seen[len(seen)-1].Proxy.Port(), "pion moved the session's peer")
			}
		})
	}
}

// askOnce sends msg once and returns the reply, or "" after a second.
func askOnce(t *testing.T, c *pion.Conn, msg string) string {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}
