package e2e

// Real distance for the edge tests (edge_*_test.go): network namespaces
// for the edges and the backends, the test's own namespace as the
// client's, and a delayed link from the client to each edge.
//
// The links are a userspace netem: a TUN device at each end and a
// goroutine that holds every IP packet for half the link's round-trip
// time before it writes it into the other end. The kernels this project
// runs on in CI are built without sch_netem (CONFIG_NET_SCH_NETEM is not
// set and there are no loadable modules, so `tc qdisc add ... netem`
// fails with "Specified qdisc kind is unknown"); a TUN pair gives the same
// thing at layer 3 — real sockets and kernel stacks at both ends, every
// datagram delayed — and lets a test change a delay or cut a link while
// packets are in flight. The edge↔backend links are plain veth pairs.

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// netnsEnv marks the child process an edge test runs in.
const netnsEnv = "CIDROUTE_E2E_NETNS"

// inNetns runs the calling test again in a child process in a fresh
// network namespace (unshare --net), which is the client's: the edge
// dialers open sockets from any goroutine, and there they see only the
// lab's links, not the host's network. In the child it returns true and
// the test goes on; in the parent it reports the child's run and returns
// false. It needs root, ip, unshare and /dev/net/tun; without them it
// skips, or fails when CIDROUTE_REQUIRE_TOOLS=1.
func inNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(netnsEnv) == "1" {
		return true
	}
	unshare := testtool.Look(t, "util-linux", "unshare")
	testtool.Look(t, "iproute2", "ip")
	var why string
	if os.Geteuid() != 0 {
		why = "not root: network namespaces, veth and TUN devices need root"
	} else if _, err := os.Stat("/dev/net/tun"); err != nil {
		why = fmt.Sprintf("no TUN device (%v)", err)
	}
	if why != "" {
		if testtool.Required() {
			t.Fatalf("%s, and CIDROUTE_REQUIRE_TOOLS=1", why)
		}
		t.Skipf("%s (set CIDROUTE_REQUIRE_TOOLS=1 to fail instead)", why)
	}
	args := []string{"--net", "--", os.Args[0], "-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v"}
	if dl, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(dl).Round(time.Second).String())
	}
	cmd := exec.Command(unshare, args...)
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace of its own:\n%s", out)
	if bytes.Contains(out, []byte("--- SKIP: "+t.Name())) {
		t.Skip("skipped in the namespace")
	}
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: "+t.Name())
	return false
}

// ip runs ip(8) with args and fails the test on error.
func ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// inNS runs f on a thread moved into the named network namespace: the
// sockets f opens live there for good, whatever thread uses them later.
func inNS(t *testing.T, ns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	require.NoError(t, err)
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	require.NoError(t, err)
	defer target.Close()
	require.NoError(t, unix.Setns(int(target.Fd()), unix.CLONE_NEWNET))
	defer func() {
		// A thread that cannot go back must not be reused: leaving it
		// locked makes the runtime end it with the goroutine.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	f()
}

// A delayLine is a link between two TUN devices that delays each packet
// by half the round-trip time set, or drops it while the link is down.
type delayLine struct {
	oneWay atomic.Int64 // nanoseconds
	down   atomic.Bool
	ends   [2]*os.File
	wg     sync.WaitGroup
}

func newDelayLine(a, b *os.File, rtt time.Duration) *delayLine {
	l := &delayLine{ends: [2]*os.File{a, b}}
	l.setRTT(rtt)
	l.wg.Add(2)
	go l.carry(a, b)
	go l.carry(b, a)
	return l
}

func (l *delayLine) setRTT(d time.Duration) { l.oneWay.Store(int64(d / 2)) }
func (l *delayLine) setDown(down bool)      { l.down.Store(down) }

func (l *delayLine) carry(from, to *os.File) {
	defer l.wg.Done()
	type packet struct {
		b   []byte
		due time.Time
	}
	q := make(chan packet, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := range q {
			time.Sleep(time.Until(p.due))
			to.Write(p.b)
		}
	}()
	buf := make([]byte, 65536)
	for {
		n, err := from.Read(buf)
		if err != nil {
			break
		}
		if l.down.Load() {
			continue
		}
		select {
		case q <- packet{bytes.Clone(buf[:n]), time.Now().Add(time.Duration(l.oneWay.Load()))}:
		default: // a full queue drops, as a full qdisc does
		}
	}
	close(q)
	<-done
}

func (l *delayLine) close() {
	l.ends[0].Close()
	l.ends[1].Close()
	l.wg.Wait()
}

// openTUN creates the TUN device name (layer 3, no packet information
// header) in the thread's network namespace.
func openTUN(t *testing.T, name string) *os.File {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	ifr, err := unix.NewIfreq(name)
	require.NoError(t, err)
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		t.Fatalf("TUNSETIFF %s: %v", name, err)
	}
	return os.NewFile(uintptr(fd), name)
}

// The lab's addresses: the backends on the backend namespace's loopback;
// edge i at 10.77.i.2, reached by the client from 10.77.i.1; the edge's
// upstream side 10.79.i.2, the backend namespace's end of it 10.79.i.1.
var (
	labBackendAddr = netip.MustParseAddr("10.78.0.1")
	labProxies     = []netip.Prefix{netip.MustParsePrefix("10.79.0.0/16")}
)

const (
	labDTLSPort = 5684
	labQUICPort = 4433
)

// An edgeLab is the client's view of a service reached through edges at
// a distance: edges, each a cidroute replica in its own namespace serving
// a DTLS and a QUIC service, and pion and quic-go backends behind all of
// them.
type edgeLab struct {
	t      *testing.T
	prefix string
	dtls   []*dtlsecho.Server
	quic   []*quicecho.Server
	edges  []*labEdge
}

// A labEdge is one edge: its replica and its link to the client.
type labEdge struct {
	name     string
	ns       string
	dtlsAddr netip.AddrPort
	quicAddr netip.AddrPort
	link     *delayLine
	rep      *replica
	errc     chan error
	stopOnce sync.Once
}

// newEdgeLab builds the lab with one edge per round-trip time in rtts
// (named A, B, C...), two DTLS and two QUIC backends. Everything is torn
// down when the test ends.
func newEdgeLab(t *testing.T, rtts ...time.Duration) *edgeLab {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	l := &edgeLab{t: t, prefix: fmt.Sprintf("cre%d", os.Getpid())}
	back := l.netns("b")
	ip(t, "-n", back, "link", "set", "lo", "up")
	ip(t, "-n", back, "addr", "add", labBackendAddr.String()+"/32", "dev", "lo")

	var ticketKey [32]byte
	copy(ticketKey[:], "cidroute e2e shared ticket key!!")
	var dtlsBs, quicBs []registry.Backend
	inNS(t, back, func() {
		for ord := range uint8(2) {
			d, err := dtlsecho.Listen(dtlsecho.Config{Listen: netip.AddrPortFrom(labBackendAddr, 0), Ordinal: ord, PSK: testPSK,
				TrustedProxies: labProxies, Direct: backend.DirectNoHandshake, Prefix: fmt.Sprintf("%d|", ord)})
			require.NoError(t, err)
			t.Cleanup(func() { d.Close() })
			l.dtls = append(l.dtls, d)
			dtlsBs = append(dtlsBs, registry.Backend{Ordinal: ord, Addr: d.Addr()})
			q, err := quicecho.Listen(quicecho.Config{Listen: netip.AddrPortFrom(labBackendAddr, 0), Ordinal: ord,
				TrustedProxies: labProxies, Direct: backend.DirectNoHandshake, Allow0RTT: true, SessionTicketKey: &ticketKey})
			require.NoError(t, err)
			t.Cleanup(func() { q.Close() })
			l.quic = append(l.quic, q)
			quicBs = append(quicBs, registry.Backend{Ordinal: ord, Addr: q.Addr()})
		}
	})
	for i, rtt := range rtts {
		l.edges = append(l.edges, l.addEdge(i, rtt, back, dtlsBs, quicBs))
	}
	return l
}

// netns creates a network namespace named after the lab, deleted when
// the test ends.
func (l *edgeLab) netns(suffix string) string {
	name := l.prefix + suffix
	ip(l.t, "netns", "add", name)
	l.t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func (l *edgeLab) addEdge(i int, rtt time.Duration, back string, dtlsBs, quicBs []registry.Backend) *labEdge {
	t := l.t
	e := &labEdge{name: string(rune('A' + i)), ns: l.netns(fmt.Sprint("e", i)), errc: make(chan error, 1)}
	up, down := fmt.Sprintf("10.79.%d.", i), fmt.Sprintf("10.77.%d.", i)
	// To the backends: a veth pair.
	ip(t, "-n", e.ns, "link", "set", "lo", "up")
	ip(t, "-n", back, "link", "add", fmt.Sprint("b", i), "type", "veth", "peer", "name", "upstream", "netns", e.ns)
	ip(t, "-n", back, "addr", "add", up+"1/30", "dev", fmt.Sprint("b", i))
	ip(t, "-n", back, "link", "set", fmt.Sprint("b", i), "up")
	ip(t, "-n", e.ns, "addr", "add", up+"2/30", "dev", "upstream")
	ip(t, "-n", e.ns, "link", "set", "upstream", "up")
	ip(t, "-n", e.ns, "route", "add", labBackendAddr.String()+"/32", "via", up+"1")
	// To the client: the delayed TUN pair.
	client := openTUN(t, fmt.Sprint("e", i))
	var edgeEnd *os.File
	inNS(t, e.ns, func() { edgeEnd = openTUN(t, "cl") })
	ip(t, "addr", "add", down+"1/30", "dev", fmt.Sprint("e", i))
	ip(t, "link", "set", fmt.Sprint("e", i), "up")
	ip(t, "-n", e.ns, "addr", "add", down+"2/30", "dev", "cl")
	ip(t, "-n", e.ns, "link", "set", "cl", "up")
	e.link = newDelayLine(client, edgeEnd, rtt)
	t.Cleanup(e.link.close)

	edgeAddr := netip.MustParseAddr(down + "2")
	e.dtlsAddr = netip.AddrPortFrom(edgeAddr, labDTLSPort)
	e.quicAddr = netip.AddrPortFrom(edgeAddr, labQUICPort)
	dreg, err := registry.New(registry.Config{Service: "dtls", Seed: hrwSeed, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, dreg.Update(dtlsBs))
	qreg, err := registry.New(registry.Config{Service: "quic", Seed: hrwSeed, Logger: quiet()})
	require.NoError(t, err)
	require.NoError(t, qreg.Update(quicBs))
	t.Cleanup(func() { dreg.Close(); qreg.Close() })
	var p *cidroute.Pipeline
	inNS(t, e.ns, func() {
		p, err = cidroute.New(cidroute.Config{Logger: quiet(), Services: []cidroute.Service{
			{Name: "svc", Listen: e.dtlsAddr, Workers: 1, RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: dreg}},
			{Name: "quic", Listen: e.quicAddr, Workers: 1, RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC, Backends: qreg}},
		}})
		require.NoError(t, err)
	})
	e.rep = &replica{name: e.name, pipe: p, reg: dreg}
	go func() { e.errc <- p.Run(context.Background()) }()
	t.Cleanup(func() { e.stop(t) })
	return e
}

// stop ends the edge's replica (a dead edge) and checks its counters.
func (e *labEdge) stop(t *testing.T) {
	e.stopOnce.Do(func() {
		require.NoError(t, e.rep.pipe.Close())
		require.NoError(t, <-e.errc)
		checkCounters(t, e.rep)
	})
}

// dtlsAddrs returns the edges' DTLS addresses in the order of names (all
// edges, in lab order, when none is given).
func (l *edgeLab) dtlsAddrs(names ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range l.pick(names) {
		out = append(out, e.dtlsAddr)
	}
	return out
}

func (l *edgeLab) quicAddrs(names ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, e := range l.pick(names) {
		out = append(out, e.quicAddr)
	}
	return out
}

func (l *edgeLab) pick(names []string) []*labEdge {
	if len(names) == 0 {
		return l.edges
	}
	var out []*labEdge
	for _, n := range names {
		out = append(out, l.edge(n))
	}
	return out
}

func (l *edgeLab) edge(name string) *labEdge {
	for _, e := range l.edges {
		if e.name == name {
			return e
		}
	}
	l.t.Fatalf("no edge %s", name)
	return nil
}

// edgeOf names the edge at a (DTLS or QUIC address).
func (l *edgeLab) edgeOf(a netip.AddrPort) string {
	for _, e := range l.edges {
		if e.dtlsAddr == a || e.quicAddr == a {
			return e.name
		}
	}
	return a.String()
}

// linkOf names the edge whose link the client address a is on.
func (l *edgeLab) linkOf(a netip.AddrPort) string {
	for i, e := range l.edges {
		if a.Addr() == netip.AddrFrom4([4]byte{10, 77, byte(i), 1}) {
			return e.name
		}
	}
	return a.String()
}

// dtlsHandshakes counts the DTLS sessions the backends started, probes
// included.
func (l *edgeLab) dtlsHandshakes() uint64 {
	var n uint64
	for _, s := range l.dtls {
		_, dm := s.Stats()
		n += dm.NewSessions
	}
	return n
}
