package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/registry"
)

// startOrigMbedTLSServer runs internal/testpeers/mbedtls/cidserver,
// unmodified, in namespace ns on a (port 0: any): CIDs of the service's
// length, the first byte ord; it prints the source of every datagram.
func startOrigMbedTLSServer(t *testing.T, bin, ns string, ord uint8, a netip.AddrPort) *mbedtlsServer {
	t.Helper()
	p := startTransparentProc(t, fmt.Sprintf("cidserver %d", ord), "ip", "netns", "exec", ns, filepath.Join(bin, "cidserver"),
		"-listen", a.String(), "-ordinal", strconv.Itoa(int(ord)), "-cid-len", strconv.Itoa(cidroute.DefaultDTLSCIDLen),
		"-psk", mbedtlsPSK, "-ciphersuites", suiteCCM8+","+suiteGCM, "-trace", "1")
	line := p.waitFor(t, "LISTEN ")
	addr, err := netip.ParseAddrPort(strings.TrimPrefix(line, "LISTEN "))
	require.NoError(t, err, "LISTEN line %q", line)
	return &mbedtlsServer{transparentProc: p, ord: ord, addr: addr}
}

// origMbedTLSClient is cidclient in the client's namespace behind a relay
// there that stands for its NAT: the relay's upstream socket is the
// client's address as the proxy and the server see it, and it can move
// to a new port or (with from) a new address.
type origMbedTLSClient struct {
	*mbedtlsClient
	from netip.Addr // the address of the relay's next upstream socket
}

func (l *origLab) startMbedTLSClient(t *testing.T, bin string, from netip.Addr, via netip.AddrPort) *origMbedTLSClient {
	t.Helper()
	c := &origMbedTLSClient{from: from}
	var in *net.UDPConn
	inNS(t, l.client, func() {
		var err error
		in, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
	})
	listen := func() (u *net.UDPConn, err error) {
		inNS(t, l.client, func() {
			u, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c.from, 0)))
		})
		return u, err
	}
	up, err := cidroutetest.ListenRebindFunc(listen, via, nil)
	if err != nil {
		in.Close()
	}
	require.NoError(t, err)
	r := runMbedTLSRelay(t, in, up)
	p := startTransparentProc(t, "cidclient", "ip", "netns", "exec", l.client, filepath.Join(bin, "cidclient"),
		"-connect", r.addr().String(), "-psk", mbedtlsPSK, "-identity", "origsrc", "-ciphersuites", suiteCCM8)
	c.mbedtlsClient = &mbedtlsClient{transparentProc: p, relay: r, suite: suiteCCM8}
	c.waitHandshake(t)
	require.Len(t, c.peerCID, cidroute.DefaultDTLSCIDLen)
	return c
}

// local is the client's address as the proxy and the server see it.
func (c *origMbedTLSClient) local() string {
	a := c.relay.up.Local()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()).String()
}

// serverField returns the value of key= in a cidserver line.
func serverField(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// session returns the id of the session that issued cid, and the peer
// address it started with.
func (s *mbedtlsServer) session(t *testing.T, cid []byte) (id, peer string) {
	t.Helper()
	want := fmt.Sprintf("%x", cid)
	for _, line := range s.lines("START ") {
		if serverField(line, "cid") == want {
			return serverField(line, "session"), serverField(line, "peer")
		}
	}
	t.Fatalf("server %d started no session with CID %s; output:\n%s", s.ord, want, s.out.String())
	return "", ""
}

// peerNow is the peer address of session id's latest DATA line: where the
// server received its latest record from.
func (s *mbedtlsServer) peerNow(id string) string {
	data := s.lines("DATA session=" + id + " ")
	if len(data) == 0 {
		return ""
	}
	return serverField(data[len(data)-1], "peer")
}

// moves returns the addresses session id moved to, in order.
func (s *mbedtlsServer) moves(id string) []string {
	var to []string
	for _, line := range s.lines("MOVED session=" + id + " ") {
		to = append(to, serverField(line, "to"))
	}
	return to
}

// TestOrigSrcMbedTLS: Mbed TLS cidservers (internal/testpeers/mbedtls,
// an independent RFC 9146 implementation, unmodified) in the two backend
// namespaces behind two original-source replicas (one host, two listen
// ports, one public address), and Mbed TLS cidclients in the client's
// namespace behind a relay there that plays their NAT. Each server prints
// the peer of every session and record: it sees the clients' own
// addresses at the handshake; a client sent to the other replica from the
// same address keeps its session there; a NAT rebinding to a new port,
// then to a new address (back on the first replica), moves the session on
// the server that issued the CID, without a new handshake, and the server
// sees each new address; a backend that drains keeps its sessions (a
// rebinding included) and new ones go to the other. Every datagram either
// server received came from an address a client had. Both families.
func TestOrigSrcMbedTLS(t *testing.T) {
	bin := mbedtlsBin(t)
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 2)
	ip(t, "-n", l.client, "link", "set", "lo", "up") // the cidclients reach their relays on 127.0.0.1
	for _, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			var srvs []*mbedtlsServer
			var bs []registry.Backend
			for i := range 2 {
				l.routeBackend(f, i)
				s := startOrigMbedTLSServer(t, bin, l.backs[i], uint8(i), netip.AddrPortFrom(f.backend(i), 0))
				srvs = append(srvs, s)
				bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: s.addr, State: registry.Ready})
			}
			_, rs := startOrigPair(t, f, bs)

			// Clients until each backend owns at least one session.
			var cs []*origMbedTLSClient
			var owner, ids []int
			var sessionIDs []string
			per := map[int]int{}
			used := map[string]bool{} // every address a client had
			for i := 0; len(cs) < 4 || len(per) < 2; i++ {
				require.Less(t, i, 16, "HRW put 16 clients on one backend")
				c := l.startMbedTLSClient(t, bin, f.clients[0], rs[i%2].addr)
				ord := c.ordinal()
				require.Equal(t, ord, c.mustAsk(t, fmt.Sprintf("client %d first", i)), "client %d answered by the server its CID names", i)
				id, peer := srvs[ord].session(t, c.peerCID)
				assert.Equal(t, c.local(), peer, "client %d: the address server %d saw at the handshake", i, ord)
				assert.Equal(t, c.local(), srvs[ord].peerNow(id), "client %d: the address of its first record", i)
				used[c.local()] = true
				cs, owner, ids, sessionIDs = append(cs, c), append(owner, ord), append(ids, i), append(sessionIDs, id)
				per[ord]++
			}
			t.Logf("%d clients, sessions per backend: %v", len(cs), per)

			// The load balancer picks the other replica for the same
			// address: its CID routes it, the server sees no move.
			for i, c := range cs {
				c.relay.up.Retarget(rs[(ids[i]+1)%2].addr)
				for k := range 2 {
					require.Equal(t, owner[i], c.mustAsk(t, fmt.Sprintf("client %d via the other replica %d", i, k)))
				}
				assert.Equal(t, c.local(), srvs[owner[i]].peerNow(sessionIDs[i]))
				assert.Empty(t, srvs[owner[i]].moves(sessionIDs[i]), "client %d: the same address, no move", i)
			}
			// NAT rebindings: a new port on that replica, then a new
			// address on the first one.
			for round, move := range []string{"a new port", "a new address"} {
				for i, c := range cs {
					target := c.relay.up.Target()
					if round == 1 {
						c.from, target = f.clients[1], rs[ids[i]%2].addr
					}
					old := c.local()
					require.NoError(t, c.relay.up.Rebind(target))
					require.NotEqual(t, old, c.local())
					used[c.local()] = true
					require.Equal(t, owner[i], c.mustAsk(t, fmt.Sprintf("client %d after %s", i, move)), "client %d after %s", i, move)
					s := srvs[owner[i]]
					assert.Equal(t, c.local(), s.peerNow(sessionIDs[i]), "client %d after %s: the address server %d sees", i, move, s.ord)
					assert.Len(t, s.moves(sessionIDs[i]), round+1, "client %d: the session moved", i)
				}
			}
			// No new handshake anywhere: one session per client.
			for _, s := range srvs {
				assert.Len(t, s.lines("START "), per[int(s.ord)], "server %d: no client started a second session", s.ord)
				assert.Empty(t, s.lines("DROP "), "server %d: no record for no session", s.ord)
			}
			for i, c := range cs {
				assert.Equal(t, 1, strings.Count(c.out.String(), "HANDSHAKE"), "client %d: one handshake", i)
			}

			// The first client's backend drains: its sessions go on, a
			// rebinding included; new clients go to the other.
			drained := owner[0]
			dbs := append([]registry.Backend(nil), bs...)
			dbs[drained].State = registry.Draining
			setBackends(t, rs, dbs)
			for i, c := range cs {
				if owner[i] == drained {
					require.NoError(t, c.relay.up.Rebind(c.relay.up.Target()))
					used[c.local()] = true
				}
				require.Equal(t, owner[i], c.mustAsk(t, fmt.Sprintf("client %d while %d drains", i, drained)))
				assert.Equal(t, c.local(), srvs[owner[i]].peerNow(sessionIDs[i]), "client %d while %d drains", i, drained)
			}
			for i := range 3 {
				c := l.startMbedTLSClient(t, bin, f.clients[0], rs[i%2].addr)
				used[c.local()] = true
				require.Equal(t, 1-drained, c.ordinal(), "new client %d: not to the draining backend", i)
				require.Equal(t, 1-drained, c.mustAsk(t, fmt.Sprintf("new client %d", i)))
				_, peer := srvs[1-drained].session(t, c.peerCID)
				assert.Equal(t, c.local(), peer, "new client %d: the address its server saw", i)
			}
			assert.Len(t, srvs[drained].lines("START "), per[drained], "the draining backend took no new session")
			// Every datagram, handshakes included, came from an address a
			// client had.
			for _, s := range srvs {
				recv := s.lines("RECV ")
				require.NotEmpty(t, recv)
				for _, line := range recv {
					assert.True(t, used[serverField(line, "from")], "server %d: %q is from none of the clients' addresses", s.ord, line)
				}
			}
			fw := forward(rs)
			assert.Zero(t, fw.DroppedTotal(), "no forward drops: %v", dropList(&fw))
		})
	}
}
