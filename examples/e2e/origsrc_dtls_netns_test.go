package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/internal/testtool"
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
			pub, rs := startOrigPair(t, f, bs)

			// At least 12 clients, and more until HRW has given each backend
			// a session (12 land on one backend by chance 2 in 4096 runs,
			// 64 in 2 in 2^64).
			var cs []*origPionClient
			var owner []int
			per := map[int]int{}
			for i := 0; i < 12 || len(per) < 2 && i < 64; i++ {
				c := l.dialPion(t, f.clients[0], rs[i%2].addr, pub)
				cs = append(cs, c)
				o, _ := c.ask(t, fmt.Sprintf("client %d first", i))
				require.Equal(t, o, int(c.sock.CID()[0]), "client %d answered by the server its CID names", i)
				owner = append(owner, o)
				per[o]++
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

// A wireLog records the sources of the UDP datagrams that arrive on an
// interface for one port, as the server on that port receives them: a
// packet socket on the backend's link, for servers that log no peer
// (openssl s_server).
type wireLog struct {
	mu   sync.Mutex
	seen map[netip.AddrPort]bool
}

func watchWire(t *testing.T, ns, dev string, port uint16) *wireLog {
	t.Helper()
	w := &wireLog{seen: map[netip.AddrPort]bool{}}
	proto := int(binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_ALL)))
	var fd int
	inNS(t, ns, func() {
		ifi, err := net.InterfaceByName(dev)
		require.NoError(t, err)
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
		require.NoError(t, err)
		require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index}))
	})
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000}))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for !stop.Load() {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if src, dport, ok := udpSource(buf[:n]); ok && dport == port {
				w.mu.Lock()
				w.seen[src] = true
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { stop.Store(true); <-done; unix.Close(fd) })
	return w
}

// udpSource parses an IP packet (no extension headers) carrying UDP.
func udpSource(p []byte) (src netip.AddrPort, dport uint16, ok bool) {
	if len(p) < 1 {
		return
	}
	var a netip.Addr
	var udp []byte
	switch p[0] >> 4 {
	case 4:
		ihl := int(p[0]&15) * 4
		if len(p) < ihl+8 || p[9] != unix.IPPROTO_UDP {
			return
		}
		a, udp = netip.AddrFrom4([4]byte(p[12:16])), p[ihl:]
	case 6:
		if len(p) < 48 || p[6] != unix.IPPROTO_UDP {
			return
		}
		a, udp = netip.AddrFrom16([16]byte(p[8:24])), p[40:]
	default:
		return
	}
	return netip.AddrPortFrom(a, binary.BigEndian.Uint16(udp)), binary.BigEndian.Uint16(udp[2:]), true
}

func (w *wireLog) saw(a netip.AddrPort) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[a]
}

func (w *wireLog) sources() []netip.AddrPort {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []netip.AddrPort
	for a := range w.seen {
		out = append(out, a)
	}
	return out
}

// TestOrigSrcOpenSSL: OpenSSL's DTLS 1.2 client and server, neither of
// which knows PROXY protocol or connection IDs, complete a certificate
// handshake through an original-source replica and exchange lines both
// ways; every datagram the server receives comes from the client's own
// address and port. Both families.
func TestOrigSrcOpenSSL(t *testing.T) {
	openssl := testtool.Look(t, "openssl", "openssl")
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 1)
	dir := t.TempDir()
	key, cert := filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem")
	out, err := exec.Command(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-subj", "/CN=x", "-days", "1", "-keyout", key, "-out", cert).CombinedOutput()
	require.NoError(t, err, "openssl req: %s", out)
	for n, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			l.routeBackend(f, 0)
			backend := netip.AddrPortFrom(f.backend(0), 5684)
			wire := watchWire(t, l.backs[0], "eth0", backend.Port())
			srv := startTransparentProc(t, "s_server", "ip", "netns", "exec", l.backs[0], openssl, "s_server", "-dtls1_2",
				"-accept", backend.String(), "-cert", cert, "-key", key)
			srv.waitFor(t, "ACCEPT")
			r, err := startOrigProxy(t, "A", netip.AddrPortFrom(f.proxy, 5684), netip.AddrPort{}, transparentBackends(backend))
			require.NoError(t, err)

			bind := netip.AddrPortFrom(f.clients[0], uint16(41000+n))
			cli := startTransparentProc(t, "s_client", "ip", "netns", "exec", l.client, openssl, "s_client", "-dtls1_2",
				"-quiet", "-no_ign_eof", "-connect", r.addr.String(), "-bind", bind.String())
			up := transparentLine("client", n)
			cli.send(t, up)
			srv.waitFor(t, up)
			down := transparentLine("server", n)
			srv.send(t, down)
			cli.waitFor(t, down)
			require.NoError(t, cli.stdin.Close())
			cli.waitExit(t)
			srv.waitFor(t, "DONE") // the close_notify arrived
			assert.Equal(t, []netip.AddrPort{bind}, wire.sources(), "the sources s_server received from")
			assert.Equal(t, 1, r.sessions())
		})
	}
}

// TestOrigSrcTwoHosts: two original-source replicas on two hosts (the
// test's namespace and a cidproxy process in one of its own), each on its
// own link to a backend that both reach at one address. The backend
// returns each flow through the replica it came from: conntrack marks a
// flow by the link its first datagram arrived on, and the mark picks the
// route of its replies (docs/original-source.md, Several replicas). A
// pion/dtls v3 client handshakes through replica A, then rebinds to a new
// address and reaches replica B: the server keeps the session (no new
// handshake), sees the new address, and its replies reach the client
// through B. Without the marks they would go to A, which holds no socket
// for the new address, and the client would get nothing.
func TestOrigSrcTwoHosts(t *testing.T) {
	nft := testtool.Look(t, "nftables", "nft")
	if !inNetns(t) {
		return
	}
	bin := buildProxies(t).v1
	l := newOrigLab(t, 1)
	back, hostB := l.backs[0], l.netns("pb")
	shared := netip.MustParseAddr("10.78.0.1") // the backend, as both replicas reach it
	ip(t, "-n", back, "addr", "add", shared.String()+"/32", "dev", "lo")
	// Host A (this namespace) reaches it on link b0.
	ip(t, "route", "add", shared.String()+"/32", "via", "10.81.0.2")
	ip(t, "rule", "add", "from", shared.String(), "iif", "b0", "ipproto", "udp", "lookup", "100")
	ip(t, "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
	// Host B: a link to the client, one to the backend, the same rules.
	ip(t, "-n", hostB, "link", "set", "lo", "up")
	ip(t, "-n", hostB, "link", "add", "cl", "type", "veth", "peer", "name", "px2", "netns", l.client)
	ip(t, "-n", hostB, "addr", "add", "10.82.0.1/24", "dev", "cl")
	ip(t, "-n", hostB, "link", "set", "cl", "up")
	ip(t, "-n", l.client, "addr", "add", "10.82.0.2/24", "dev", "px2")
	ip(t, "-n", l.client, "link", "set", "px2", "up")
	ip(t, "-n", hostB, "link", "add", "b0", "type", "veth", "peer", "name", "eth1", "netns", back)
	ip(t, "-n", hostB, "addr", "add", "10.83.0.1/24", "dev", "b0")
	ip(t, "-n", hostB, "link", "set", "b0", "up")
	ip(t, "-n", back, "addr", "add", "10.83.0.2/24", "dev", "eth1")
	ip(t, "-n", back, "link", "set", "eth1", "up")
	ip(t, "-n", hostB, "route", "add", shared.String()+"/32", "via", "10.83.0.2")
	ip(t, "-n", hostB, "rule", "add", "from", shared.String(), "iif", "b0", "ipproto", "udp", "lookup", "100")
	ip(t, "-n", hostB, "route", "replace", "local", "0.0.0.0/0", "dev", "lo", "table", "100")
	// The backend: a flow's replies leave on the link it arrived on.
	sysctl(t, back, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.eth0.rp_filter=0", "net.ipv4.conf.eth1.rp_filter=0")
	ruleset := `table ip origsrc {
	chain pre { type filter hook prerouting priority mangle; ct state new iifname "eth0" ct mark set 1; ct state new iifname "eth1" ct mark set 2; }
	chain out { type route hook output priority mangle; meta mark set ct mark; }
}`
	cmd := exec.Command("ip", "netns", "exec", back, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "nft: %s", out)
	for mark, gw := range map[string]string{"1": "10.81.0.1", "2": "10.83.0.1"} {
		ip(t, "-n", back, "rule", "add", "fwmark", mark, "lookup", mark)
		ip(t, "-n", back, "route", "add", "default", "via", gw, "table", mark)
	}

	srv := startOrigPion(t, back, 0, netip.AddrPortFrom(shared, 0))
	bs := transparentBackends(srv.addr)
	a, err := startOrigProxy(t, "A", netip.AddrPortFrom(origV4.proxy, 5684), netip.AddrPort{}, bs)
	require.NoError(t, err)
	viaB := netip.MustParseAddrPort("10.82.0.1:5684")
	b := startCidproxy(t, "B", "ip", "", "netns", "exec", hostB, bin, "-config", writeOrigConfig(t, viaB, true, bs))
	b.waitLog(t, "service started", 30*time.Second)

	pub := netip.AddrPortFrom(origV4.proxy, 5684)
	const clients = 4
	var cs []*origPionClient
	for i := range clients {
		c := l.dialPion(t, origV4.clients[0], a.addr, pub)
		ord, _ := c.ask(t, fmt.Sprintf("client %d via A", i))
		require.Equal(t, 0, ord)
		cs = append(cs, c)
	}
	for i, c := range cs {
		c.from = netip.MustParseAddr("10.82.0.2")
		require.NoError(t, c.sock.Rebind(viaB))
		ord, _ := c.ask(t, fmt.Sprintf("client %d via B", i))
		require.Equal(t, 0, ord)
	}
	require.Len(t, srv.view(), clients, "no new handshake")
	for i, c := range cs {
		want := c.sock.Local().String()
		require.Eventually(t, func() bool {
			return slices.ContainsFunc(srv.view(), func(v transparentPionView) bool { return v.now == want })
		}, transparentWait, 10*time.Millisecond, "client %d: the server sees %v", i, want)
	}
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, b.waitExit(t, 30*time.Second))
	require.Contains(t, b.logs.String(), "final counters")
}
