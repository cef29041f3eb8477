package e2e

// Original-source mode (cidroute.Service.OriginalSource) in network
// namespaces: the test's own namespace (inNetns) is the proxy's, so that
// the session sockets the pipeline opens at run time, from any thread,
// live there; the client and each backend have a namespace of their own,
// joined by veth pairs. The backends route their clients through the
// proxy, and the proxy delivers the datagrams arriving from them locally
// (docs/original-source.md): a backend sees the client's address.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// origFamily is one address family's addresses of the lab: the proxy's
// address toward the client (the service's), the client's two addresses,
// and backend i's and the proxy's on backend i's link.
type origFamily struct {
	name    string
	ip      []string // ip(8)'s family flag
	proxy   netip.Addr
	clients [2]netip.Addr
	backend func(i int) netip.Addr
	gateway func(i int) netip.Addr // the proxy's end of backend i's link
	bits    string
	all     string // the local route's prefix
}

var (
	origV4 = origFamily{name: "v4", ip: []string{"-4"}, proxy: netip.MustParseAddr("10.80.0.1"),
		clients: [2]netip.Addr{netip.MustParseAddr("10.80.0.2"), netip.MustParseAddr("10.80.0.3")},
		backend: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 81, byte(i), 2}) },
		gateway: func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 81, byte(i), 1}) },
		bits:    "/24", all: "0.0.0.0/0"}
	origV6 = origFamily{name: "v6", ip: []string{"-6"}, proxy: netip.MustParseAddr("fd80::1"),
		clients: [2]netip.Addr{netip.MustParseAddr("fd80::2"), netip.MustParseAddr("fd80::3")},
		backend: func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd81:%d::2", i)) },
		gateway: func(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd81:%d::1", i)) },
		bits:    "/64", all: "::/0"}
)

// origLab is the namespaces and links; the proxy's namespace is the
// process's.
type origLab struct {
	t      *testing.T
	prefix string
	client string   // the client's namespace
	backs  []string // the backends' namespaces
}

// newOrigLab builds the client's namespace and n backends', both
// families on every link. The return routes are left to the test
// (routeBackend).
func newOrigLab(t *testing.T, n int) *origLab {
	l := &origLab{t: t, prefix: fmt.Sprintf("cro%d", os.Getpid())}
	sysctl(t, "", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	ip(t, "link", "set", "lo", "up")
	l.client = l.netns("c")
	ip(t, "link", "add", "cl", "type", "veth", "peer", "name", "px", "netns", l.client)
	ip(t, "link", "set", "cl", "up")
	ip(t, "-n", l.client, "link", "set", "px", "up")
	for _, f := range []origFamily{origV4, origV6} {
		ip(t, "addr", "add", f.proxy.String()+f.bits, "dev", "cl", "nodad")
		for _, c := range f.clients {
			ip(t, "-n", l.client, "addr", "add", c.String()+f.bits, "dev", "px", "nodad")
		}
		ip(t, append(f.ip, "-n", l.client, "route", "add", "default", "via", f.proxy.String())...)
	}
	for i := range n {
		ns := l.netns(fmt.Sprint("b", i))
		l.backs = append(l.backs, ns)
		dev := fmt.Sprint("b", i)
		ip(t, "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", ns)
		ip(t, "link", "set", dev, "up")
		ip(t, "-n", ns, "link", "set", "eth0", "up")
		ip(t, "-n", ns, "link", "set", "lo", "up")
		for _, f := range []origFamily{origV4, origV6} {
			ip(t, "addr", "add", f.gateway(i).String()+f.bits, "dev", dev, "nodad")
			ip(t, "-n", ns, "addr", "add", f.backend(i).String()+f.bits, "dev", "eth0", "nodad")
			// The backend's clients are behind the proxy.
			ip(t, append(f.ip, "-n", ns, "route", "add", "default", "via", f.gateway(i).String())...)
		}
	}
	return l
}

// netns creates a namespace, deleted when the test ends, with DAD off so
// that IPv6 addresses work at once.
func (l *origLab) netns(suffix string) string {
	name := l.prefix + suffix
	ip(l.t, "netns", "add", name)
	l.t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	sysctl(l.t, name, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	return name
}

// routeBackend adds the proxy's return route for backend i's datagrams:
// the rule the start-up check's error names, and the local route of
// table 100 (added once; `ip route replace` is idempotent).
func (l *origLab) routeBackend(f origFamily, i int) {
	ip(l.t, append(f.ip, "rule", "add", "from", f.backend(i).String(), "iif", fmt.Sprint("b", i), "ipproto", "udp", "lookup", "100")...)
	ip(l.t, append(f.ip, "route", "replace", "local", f.all, "dev", "lo", "table", "100")...)
}

func sysctl(t *testing.T, ns string, kv ...string) {
	t.Helper()
	args := append([]string{"-qw"}, kv...)
	cmd := exec.Command("sysctl", args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, "sysctl"}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "sysctl %v: %s", kv, out)
}

// A peerLog is a plain UDP server, unmodified by anything of cidroute's:
// it answers each datagram with the peer address it came from, and logs
// that address.
type peerLog struct {
	name string
	conn *net.UDPConn
	mu   sync.Mutex
	seen []netip.AddrPort
}

// startPeerLog listens on a (in namespace ns).
func startPeerLog(t *testing.T, ns, name string, a netip.AddrPort) *peerLog {
	t.Helper()
	p := &peerLog{name: name}
	inNS(t, ns, func() {
		var err error
		p.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		require.NoError(t, err)
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := p.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			p.mu.Lock()
			p.seen = append(p.seen, from)
			p.mu.Unlock()
			// The reply carries the datagram's first 3 bytes (a DTLS
			// record's type and version) so that the client's check of it
			// is a real check.
			p.conn.WriteToUDPAddrPort(fmt.Appendf(buf[:0:0], "%s saw %v len %d", name, from, n), from)
		}
	}()
	t.Cleanup(func() { p.conn.Close(); <-done })
	return p
}

func (p *peerLog) addr() netip.AddrPort { return p.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// peers returns the peers in the order they first appeared (a datagram
// sent again after a lost reply appears once).
func (p *peerLog) peers() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []netip.AddrPort
	for _, a := range p.seen {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// startOrigPair starts replicas A and B of f's proxy in front of bs, on
// ports 5684 and 5685 of the proxy's address; both give the first as the
// public address, which clients send to.
func startOrigPair(t *testing.T, f origFamily, bs []registry.Backend) (pub netip.AddrPort, rs []*replica) {
	t.Helper()
	pub = netip.AddrPortFrom(f.proxy, 5684)
	for i, listen := range []netip.AddrPort{pub, netip.AddrPortFrom(f.proxy, 5685)} {
		r, err := startOrigProxy(t, string(rune('A'+i)), listen, pub, bs)
		require.NoError(t, err)
		rs = append(rs, r)
	}
	return pub, rs
}

// startOrigProxy runs a replica of one DTLS service in original-source
// mode on listen (with public as its public address; zero: listen), in
// the process's namespace, in front of bs; mod adjusts the service.
func startOrigProxy(t *testing.T, name string, listen, public netip.AddrPort, bs []registry.Backend, mod ...func(*cidroute.Service)) (*replica, error) {
	t.Helper()
	reg, err := registry.New(registry.Config{Service: "svc", Seed: hrwSeed, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	require.NoError(t, reg.Update(bs))
	sc := cidroute.Service{
		Name: "svc", Listen: listen, Workers: 2,
		RouterConfig:   cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg, Transparent: true, PublicAddr: public},
		OriginalSource: true,
	}
	for _, m := range mod {
		m(&sc)
	}
	p, err := cidroute.New(cidroute.Config{Logger: quiet(), Services: []cidroute.Service{sc}})
	if err != nil {
		return nil, err
	}
	r := &replica{name: name, pipe: p, reg: reg}
	r.addr, _ = p.Addr("svc")
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
		checkCounters(t, r)
	})
	return r, nil
}

// origClient opens a client socket on a (port 0: any) in the client's
// namespace.
func (l *origLab) origClient(a netip.Addr) *net.UDPConn {
	var c *net.UDPConn
	inNS(l.t, l.client, func() {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		require.NoError(l.t, err)
	})
	l.t.Cleanup(func() { c.Close() })
	return c
}

// origAsk sends b from c to the service and returns the reply, which must
// come from the service's address.
func origAsk(t *testing.T, c *net.UDPConn, svc netip.AddrPort, b []byte) string {
	t.Helper()
	buf := make([]byte, 65536)
	for try := 0; try < 5; try++ {
		_, err := c.WriteToUDPAddrPort(b, svc)
		require.NoError(t, err)
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			continue
		}
		require.Equal(t, svc, netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), "the reply's source")
		return string(buf[:n])
	}
	t.Fatalf("no reply from %v to %v", svc, c.LocalAddr())
	return ""
}

func localOf(c *net.UDPConn) netip.AddrPort {
	a := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// TestOrigSrcPeerAddress: an unmodified UDP server behind an
// original-source replica sees each client's own address and port; after
// the client rebinds (a new port, then a new address, as a NAT does) it
// sees the new one, and the CID keeps the session on its backend. Both
// families.
func TestOrigSrcPeerAddress(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 2)
	for _, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			var logs []*peerLog
			var bs []registry.Backend
			for i := range 2 {
				l.routeBackend(f, i)
				p := startPeerLog(t, l.backs[i], fmt.Sprint("b", i), netip.AddrPortFrom(f.backend(i), 7000))
				logs = append(logs, p)
				bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: p.addr(), State: registry.Ready})
			}
			r, err := startOrigProxy(t, "A", netip.AddrPortFrom(f.proxy, 5684), netip.AddrPort{}, bs)
			require.NoError(t, err)

			// Each ordinal's records reach its backend, which sees the
			// client's address and port.
			c := l.origClient(f.clients[0])
			for ord := range 2 {
				got := origAsk(t, c, r.addr, transparentRecord(t, uint8(ord), 100))
				assert.Equal(t, fmt.Sprintf("b%d saw %v len 100", ord, localOf(c)), got)
			}
			// A NAT rebinding: a new port, then a new address.
			c2 := l.origClient(f.clients[0])
			c3 := l.origClient(f.clients[1])
			for _, c := range []*net.UDPConn{c2, c3} {
				got := origAsk(t, c, r.addr, transparentRecord(t, 0, 100))
				assert.Equal(t, fmt.Sprintf("b0 saw %v len 100", localOf(c)), got)
			}
			assert.Equal(t, []netip.AddrPort{localOf(c), localOf(c2), localOf(c3)}, logs[0].peers(), "backend 0's peers")
			assert.Equal(t, []netip.AddrPort{localOf(c)}, logs[1].peers(), "backend 1's peers")
			assert.Equal(t, 4, r.sessions(), "a session per flow: two backends of one client, two rebinds")

			// The old address still talks: both its sessions live on until
			// idle.
			got := origAsk(t, c, r.addr, transparentRecord(t, 1, 50))
			assert.Equal(t, fmt.Sprintf("b1 saw %v len 50", localOf(c)), got)
		})
	}
}

// TestOrigSrcNoReturnRoute: without the proxy's policy routing the
// backends' replies would be forwarded to the client (or dropped) instead
// of reaching the session sockets; New refuses to start, naming the
// commands. A backend that joins later without a route gets no sessions:
// its datagrams are dropped as send_error, and once its route is added
// they flow.
func TestOrigSrcNoReturnRoute(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 2)
	for _, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			b0 := startPeerLog(t, l.backs[0], "b0", netip.AddrPortFrom(f.backend(0), 7000))
			b1 := startPeerLog(t, l.backs[1], "b1", netip.AddrPortFrom(f.backend(1), 7000))
			listen := netip.AddrPortFrom(f.proxy, 5684)
			_, err := startOrigProxy(t, "A", listen, netip.AddrPort{}, transparentBackends(b0.addr()))
			require.ErrorIs(t, err, cidroute.ErrOriginalSource)
			t.Logf("New without the routes: %v", err)
			assert.Contains(t, err.Error(), "rule add from "+f.backend(0).String()+" iif b0")
			assert.Contains(t, err.Error(), "route add local "+f.all+" dev lo table 100")

			// The rule without the local route is no better.
			ip(t, append(f.ip, "rule", "add", "from", f.backend(0).String(), "iif", "b0", "ipproto", "udp", "lookup", "100")...)
			_, err = startOrigProxy(t, "A", listen, netip.AddrPort{}, transparentBackends(b0.addr()))
			require.ErrorIs(t, err, cidroute.ErrOriginalSource)
			ip(t, append(f.ip, "route", "replace", "local", f.all, "dev", "lo", "table", "100")...)
			r, err := startOrigProxy(t, "A", listen, netip.AddrPort{}, transparentBackends(b0.addr()))
			require.NoError(t, err)

			// Backend 1 joins, its route missing.
			setBackends(t, []*replica{r}, transparentBackends(b0.addr(), b1.addr()))
			c := l.origClient(f.clients[0])
			rec := transparentRecord(t, 1, 100)
			for range 3 {
				_, err := c.WriteToUDPAddrPort(rec, r.addr)
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return forward([]*replica{r}).Dropped[cidroute.SendError] == 3 }, 5*time.Second, 10*time.Millisecond)
			assert.Empty(t, b1.peers())
			assert.Zero(t, r.sessions())

			ip(t, append(f.ip, "rule", "add", "from", f.backend(1).String(), "iif", "b1", "ipproto", "udp", "lookup", "100")...)
			time.Sleep(1100 * time.Millisecond) // a failed check is trusted for a second
			got := origAsk(t, c, r.addr, rec)
			assert.Equal(t, fmt.Sprintf("b1 saw %v len 100", localOf(c)), got)
		})
	}
}

// writeOrigConfig writes a cidproxy configuration of one DTLS service on
// listen in front of bs, in original-source mode or (orig false)
// transparent mode, and returns its path.
func writeOrigConfig(t *testing.T, listen netip.AddrPort, orig bool, bs []registry.Backend) string {
	t.Helper()
	var list []string
	for _, b := range bs {
		list = append(list, fmt.Sprintf(`{"ordinal": %d, "address": %q}`, b.Ordinal, b.Addr.String()))
	}
	cfg := fmt.Sprintf(`{"hrw_seed": %d, "log_level": "info", "services": [{"name": "coaps", "protocol": "dtls", "listen": %q,
  "workers": 1, "proxy_protocol": false, "original_source": %v, "backends": [%s]}]}`, hrwSeed, listen.String(), orig, strings.Join(list, ", "))
	path := filepath.Join(t.TempDir(), "cidproxy.json")
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

// TestOrigSrcCidproxy: cidproxy, configured with "original_source": true,
// forwards with the client's address (the configuration key reaches the
// pipeline); without the return route it refuses to start and says why.
func TestOrigSrcCidproxy(t *testing.T) {
	if !inNetns(t) {
		return
	}
	bin := buildProxies(t).v1
	l := newOrigLab(t, 1)
	f := origV4
	b0 := startPeerLog(t, l.backs[0], "b0", netip.AddrPortFrom(f.backend(0), 7000))
	listen := netip.AddrPortFrom(f.proxy, 5684)
	cfg := writeOrigConfig(t, listen, true, transparentBackends(b0.addr()))

	p := startCidproxy(t, "cidproxy without routes", bin, "", "-config", cfg)
	err := p.waitExit(t, 30*time.Second)
	require.Error(t, err)
	require.Contains(t, p.logs.String(), "would not be delivered to the proxy")
	require.Contains(t, p.logs.String(), "ip rule add from 10.81.0.2 iif b0 ipproto udp lookup 100")

	l.routeBackend(f, 0)
	p = startCidproxy(t, "cidproxy", bin, "", "-config", cfg)
	c := l.origClient(f.clients[0])
	got := origAsk(t, c, listen, transparentRecord(t, 0, 100))
	require.Equal(t, fmt.Sprintf("b0 saw %v len 100", localOf(c)), got)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.waitExit(t, 30*time.Second))
}

// TestOrigSrcHandover: a restart handover in original-source mode. A
// successor joins the running replica's socket group and the old one
// drains: the client's next datagrams reach the successor, which opens a
// session socket on the same client address and port (the old one's
// still relays until it ends), and every datagram is answered, the
// backend seeing the client's address throughout. Both families.
func TestOrigSrcHandover(t *testing.T) {
	if !inNetns(t) {
		return
	}
	l := newOrigLab(t, 1)
	for _, f := range []origFamily{origV4, origV6} {
		t.Run(f.name, func(t *testing.T) {
			l.routeBackend(f, 0)
			b0 := startPeerLog(t, l.backs[0], "b0", netip.AddrPortFrom(f.backend(0), 7000))
			bs := transparentBackends(b0.addr())
			listen := netip.AddrPortFrom(f.proxy, 5684)
			old, err := startOrigProxy(t, "old", listen, netip.AddrPort{}, bs, func(s *cidroute.Service) { s.Workers = 1 })
			require.NoError(t, err)
			c := l.origClient(f.clients[0])
			want := fmt.Sprintf("b0 saw %v len 100", localOf(c))
			require.Equal(t, want, origAsk(t, c, listen, transparentRecord(t, 0, 100)))

			next, err := startOrigProxy(t, "next", listen, netip.AddrPort{}, bs, func(s *cidroute.Service) { s.Workers = 1; s.JoinExisting = true })
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			drained := make(chan error, 1)
			go func() { drained <- old.pipe.Drain(ctx) }()
			for i := range 20 {
				require.Equal(t, want, origAsk(t, c, listen, transparentRecord(t, 0, 100)), "datagram %d during the drain", i)
				time.Sleep(50 * time.Millisecond)
			}
			require.NoError(t, <-drained)
			for i := range 5 {
				require.Equal(t, want, origAsk(t, c, listen, transparentRecord(t, 0, 100)), "datagram %d after the drain", i)
			}
			assert.Equal(t, 1, next.sessions())
			for _, p := range b0.peers() {
				require.Equal(t, localOf(c), p)
			}
		})
	}
}
