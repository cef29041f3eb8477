package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/registry"
)

// startOrigPion starts transparentPionServer's stock pion/dtls v3 server
// on a (port 0: any) in namespace ns.
func startOrigPion(t *testing.T, ns string, ord uint8, a netip.AddrPort) *transparentPionServer {
	t.Helper()
	gen, err := dtls.OrdinalFirst{}.Generator(ord)
	require.NoError(t, err)
	var ln net.Listener
	inNS(t, ns, func() {
		ln, err = pion.ListenWithOptions("udp", net.UDPAddrFromAddrPort(a),
			pion.WithPSK(func([]byte) ([]byte, error) { return testPSK, nil }),
			pion.WithPSKIdentityHint([]byte("cidroute")),
			pion.WithCipherSuites(pion.TLS_PSK_WITH_AES_128_CCM_8),
			pion.WithExtendedMasterSecret(pion.RequestExtendedMasterSecret),
			pion.WithConnectionIDGenerator(gen))
		require.NoError(t, err)
	})
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

// origPionClient is a pion/dtls v3 client in the client's namespace whose
// socket can rebind, to a new port or (with from) a new address.
type origPionClient struct {
	*transparentPionClient
	from netip.Addr // the address of its next socket
}

func (l *origLab) dialPion(t *testing.T, from netip.Addr, via, public netip.AddrPort) *origPionClient {
	t.Helper()
	c := &origPionClient{from: from}
	listen := func() (u *net.UDPConn, err error) {
		inNS(t, l.client, func() {
			u, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.from, 0)))
		})
		return u, err
	}
	sock, err := cidroutetest.ListenRebindFunc(listen, via, net.UDPAddrFromAddrPort(public))
	require.NoError(t, err)
	sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
	conn, err := pion.Client(sock, net.UDPAddrFromAddrPort(public), dtlsecho.PSKClientConfig(testPSK, "origsrc"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), transparentWait)
	defer cancel()
	require.NoError(t, conn.HandshakeContext(ctx), "handshake via %v", via)
	c.transparentPionClient = &transparentPionClient{sock: sock, conn: conn}
	return c
}

// TestOrigSrcPion: stock pion/dtls v3 servers with connection IDs behind
// two original-source replicas (one host, two listen ports, one public
// address). Each server sees its clients' own addresses at the handshake;
// a client that moves to the other replica from a new port, then to a new
// address, keeps its session on the server that issued its CID, without
// a new handshake, and the server sees the new address. A backend that
// drains keeps its sessions and takes no new ones. Both families.
func TestOrigSrcPion(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 2)
	for _, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			var srvs []*transparentPionServer
			var bs []registry.Backend
			for i := range 2 {
				l.routeBackend(f, i)
				s := startOrigPion(t, l.backs[i], uint8(i), netip.AddrPortFrom(f.backend(i), 0))
				srvs = append(srvs, s)
				bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: s.addr, State: registry.Ready})
			}
			pub := netip.AddrPortFrom(f.proxy, 5684)
			a, err := startOrigProxy(t, "A", pub, pub, bs)
			require.NoError(t, err)
			b, err := startOrigProxy(t, "B", netip.AddrPortFrom(f.proxy, 5685), pub, bs)
			require.NoError(t, err)
			rs := []*replica{a, b}

			const clients = 8
			var cs []*origPionClient
			owner := make([]int, clients)
			per := map[int]int{}
			for i := range clients {
				c := l.dialPion(t, f.clients[0], rs[i%2].addr, pub)
				cs = append(cs, c)
				owner[i], _ = c.ask(t, fmt.Sprintf("client %d first", i))
				require.Equal(t, owner[i], int(c.sock.CID()[0]), "client %d answered by the server its CID names", i)
				per[owner[i]]++
			}
			t.Logf("sessions per backend: %v", per)
			require.Len(t, per, 2, "HRW spread the handshakes over both backends")
			// Each server saw the client's own address at the handshake.
			firsts := map[string]bool{}
			for _, s := range srvs {
				for _, v := range s.view() {
					firsts[v.first] = true
				}
			}
			for i, c := range cs {
				assert.True(t, firsts[c.sock.Local().String()], "client %d at %v: no server saw it", i, c.sock.Local())
			}

			for round, move := range []string{"the other replica, a new port", "the same replica, a new address"} {
				for i, c := range cs {
					target := c.sock.Target()
					if round == 0 {
						target = rs[(i+1)%2].addr
					} else {
						c.from = f.clients[1]
					}
					require.NoError(t, c.sock.Rebind(target))
					ord, _ := c.ask(t, fmt.Sprintf("client %d after move %d", i, round+1))
					require.Equal(t, owner[i], ord, "client %d after moving to %s", i, move)
				}
			}
			// One session per client on its server (no new handshake), now
			// at the client's current address.
			for _, s := range srvs {
				require.Len(t, s.view(), per[int(s.ord)], "server %d: no client started a second session", s.ord)
			}
			for i, c := range cs {
				want := c.sock.Local().String()
				require.Eventually(t, func() bool {
					for _, v := range srvs[owner[i]].view() {
						if v.now == want {
							return true
						}
					}
					return false
				}, transparentWait, 10*time.Millisecond, "client %d: its server sees %v", i, want)
			}

			// Backend 0 drains: its sessions go on, new ones go to 1.
			bs[0].State = registry.Draining
			setBackends(t, rs, bs)
			for i, c := range cs {
				ord, _ := c.ask(t, fmt.Sprintf("client %d while 0 drains", i))
				require.Equal(t, owner[i], ord)
			}
			for i := range 4 {
				c := l.dialPion(t, f.clients[0], rs[i%2].addr, pub)
				ord, _ := c.ask(t, fmt.Sprintf("new client %d", i))
				require.Equal(t, 1, ord, "a new session while backend 0 drains")
			}
		})
	}
}
