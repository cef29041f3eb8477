package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
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

// transparentPionServer is a stock pion/dtls v3 listener on a plain UDP
// socket, no PPv2 adapter: the kind of backend transparent mode is for.
// Its only cidroute part is the connection ID generator, which writes its
// ordinal into byte 0; pion itself then tells sessions apart by CID and
// moves a session to the source of its latest authenticated record (RFC
// 9146 §6). It answers m with "<ordinal>|m".
type transparentPionServer struct {
	ord  uint8
	ln   net.Listener
	addr netip.AddrPort
	wg   sync.WaitGroup

	mu       sync.Mutex
	conns    []net.Conn
	sessions []*transparentPionSession
}

// transparentPionSession is what a server saw of one session.
type transparentPionSession struct {
	conn  *pion.Conn
	first string          // the peer at the handshake
	seen  map[string]bool // peers seen around reads and writes
}

func startTransparentPion(t *testing.T, ord uint8) *transparentPionServer {
	t.Helper()
	gen, err := dtls.OrdinalFirst{}.Generator(ord)
	require.NoError(t, err)
	ln, err := pion.ListenWithOptions("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)},
		pion.WithPSK(func([]byte) ([]byte, error) { return testPSK, nil }),
		pion.WithPSKIdentityHint([]byte("cidroute")),
		pion.WithCipherSuites(pion.TLS_PSK_WITH_AES_128_CCM_8),
		pion.WithExtendedMasterSecret(pion.RequestExtendedMasterSecret),
		pion.WithConnectionIDGenerator(gen))
	require.NoError(t, err)
	s := &transparentPionServer{ord: ord, ln: ln, addr: ln.Addr().(*net.UDPAddr).AddrPort()}
	s.wg.Go(s.accept)
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *transparentPionServer) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Go(func() { s.serve(c.(*pion.Conn)) })
	}
}

func (s *transparentPionServer) serve(c *pion.Conn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), transparentWait)
	err := c.HandshakeContext(ctx)
	cancel()
	if err != nil {
		return
	}
	ss := &transparentPionSession{conn: c, first: c.RemoteAddr().String(), seen: map[string]bool{}}
	s.mu.Lock()
	s.sessions = append(s.sessions, ss)
	s.mu.Unlock()
	// pion moves a session after handing its record over, so the peer is
	// sampled on both sides of the echo.
	see := func() {
		s.mu.Lock()
		ss.seen[c.RemoteAddr().String()] = true
		s.mu.Unlock()
	}
	buf := make([]byte, 2048)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		see()
		if _, err := c.Write(append(fmt.Appendf(nil, "%d|", s.ord), buf[:n]...)); err != nil {
			return
		}
		see()
	}
}

// transparentPionView is a snapshot of one session.
type transparentPionView struct {
	first, now string
	seen       int
}

func (s *transparentPionServer) view() []transparentPionView {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]transparentPionView, len(s.sessions))
	for i, ss := range s.sessions {
		out[i] = transparentPionView{first: ss.first, now: ss.conn.RemoteAddr().String(), seen: len(ss.seen)}
	}
	return out
}

// transparentPionClient is a pion/dtls v3 client with CID support on a
// socket that can rebind; it believes it talks to the public address.
type transparentPionClient struct {
	sock *cidroutetest.RebindConn
	conn *pion.Conn
}

func dialTransparentPion(t *testing.T, via netip.AddrPort) (*transparentPionClient, error) {
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	if err != nil {
		return nil, err
	}
	sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
	c, err := pion.Client(sock, net.UDPAddrFromAddrPort(public), dtlsecho.PSKClientConfig(testPSK, "transparent"))
	if err != nil {
		sock.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(t.Context(), transparentWait)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake via %v: %w", via, err)
	}
	return &transparentPionClient{sock: sock, conn: c}, nil
}

// ask sends msg and waits for the echo, sending again after a silence:
// the first record after a move can be answered at the session's old
// address (pion hands a record to the application before it moves the
// session), and that answer goes to the client's closed old socket.
// It returns the answering ordinal and how many sends it took.
func (c *transparentPionClient) ask(t *testing.T, msg string) (ord, sends int) {
	t.Helper()
	buf := make([]byte, 2048)
	for sends = 1; sends <= 5; sends++ {
		_, err := c.conn.Write([]byte(msg))
		require.NoError(t, err)
		c.conn.SetReadDeadline(time.Now().Add(replyWait))
		n, err := c.conn.Read(buf)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			continue
		}
		require.NoError(t, err)
		return answeredBy(t, string(buf[:n]), msg), sends
	}
	t.Fatalf("no echo of %q after 5 sends", msg)
	return -1, 0
}

// TestTransparentPionRebinding: pion/dtls v3 clients with connection IDs
// through two transparent replicas to three stock pion servers. Each
// client handshakes through one replica, then moves to a new source port
// on the other replica, then to another new port on that same replica (a
// NAT rebinding). Every move gives it a new upstream socket, so its server
// sees a new source each time, and the CID keeps the session on the
// server that issued it: no server ever sees a second session from a
// client.
func TestTransparentPionRebinding(t *testing.T) {
	const clients = 30
	var srvs []*transparentPionServer
	var addrs []netip.AddrPort
	for ord := range uint8(3) {
		s := startTransparentPion(t, ord)
		srvs, addrs = append(srvs, s), append(addrs, s.addr)
	}
	rs := startTransparent(t, 2, public, transparentBackends(addrs...))

	cs := make([]*transparentPionClient, clients)
	t.Cleanup(func() {
		for _, c := range cs {
			if c != nil {
				c.conn.Close()
			}
		}
	})
	require.NoError(t, within(clients, 10, func(i int) error {
		c, err := dialTransparentPion(t, rs[i%2].addr)
		cs[i] = c
		return err
	}))

	owner := make([]int, clients)
	perBackend := map[int]int{}
	for i, c := range cs {
		msg := fmt.Sprintf("client %d first", i)
		owner[i], _ = c.ask(t, msg)
		cid := c.sock.CID()
		require.Len(t, cid, cidroute.DefaultDTLSCIDLen, "client %d sent tls12_cid records", i)
		require.Equal(t, int(cid[0]), owner[i], "client %d answered by the server its CID names", i)
		perBackend[owner[i]]++
	}
	t.Logf("sessions per backend: %v", perBackend)
	assert.Len(t, perBackend, 3, "HRW spread the handshakes")

	resends := 0
	for round, move := range []string{"other replica", "same replica"} {
		for i, c := range cs {
			target := c.sock.Target()
			if round == 0 {
				target = rs[(i+1)%2].addr
			}
			old := c.sock.Local()
			require.NoError(t, c.sock.Rebind(target))
			require.NotEqual(t, old, c.sock.Local())
			ord, sends := c.ask(t, fmt.Sprintf("client %d after move %d", i, round+1))
			require.Equal(t, owner[i], ord, "client %d after moving to the %s", i, move)
			resends += sends - 1
		}
	}
	t.Logf("records sent again after a move: %d of %d", resends, 2*clients)

	// Every server kept one session per client, now at a source (an
	// upstream socket) other than the one it started from.
	seen := map[int]int{}
	for _, s := range srvs {
		require.Len(t, s.view(), perBackend[int(s.ord)], "server %d: no client started a second session", s.ord)
		require.Eventually(t, func() bool {
			for _, v := range s.view() {
				if v.now == v.first {
					return false
				}
			}
			return true
		}, transparentWait, 10*time.Millisecond, "server %d: every session moved to a new source", s.ord)
		for _, v := range s.view() {
			seen[v.seen]++
		}
	}
	t.Logf("sessions by number of sources their server answered: %v", seen)
	// Each client address holds one session on the replica it used. The
	// kernel may hand a closed socket's port to a client's next socket,
	// which then reuses that address's session: allow a couple.
	got := rs[0].sessions() + rs[1].sessions()
	assert.LessOrEqual(t, got, 3*clients)
	assert.GreaterOrEqual(t, got, 3*clients-2)
}
