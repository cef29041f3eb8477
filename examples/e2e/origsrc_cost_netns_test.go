package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// origCostEnv picks the mode TestOrigSrcSessionCost measures.
const origCostEnv = "CIDROUTE_ORIGSRC_COST"

// TestOrigSrcSessionCost measures what an idle session costs in
// original-source mode against transparent mode, in the namespaces of the
// other original-source tests: BenchmarkTransparentSessions's 10,000
// client addresses (an AnyIP prefix in the client's namespace, set per
// datagram with IP_PKTINFO), each sending one tls12_cid record and getting
// its echo, then the process's heap, stacks, RSS, descriptors and the
// kernel's slab memory per session. One mode per run, so that each figure
// is a cold process's (docs/original-source.md):
//
//	CIDROUTE_ORIGSRC_COST=original_source go test -run TestOrigSrcSessionCost -v ./e2e/
//	CIDROUTE_ORIGSRC_COST=transparent go test -run TestOrigSrcSessionCost -v ./e2e/
func TestOrigSrcSessionCost(t *testing.T) {
	mode := os.Getenv(origCostEnv)
	if mode != "transparent" && mode != "original_source" {
		t.Skipf("a measurement, not a check: set %s=original_source or transparent", origCostEnv)
	}
	if !inNetns(t) {
		return
	}
	raiseNoFile(t, benchClients+2000)
	l := newOrigLab(t, 2)
	f := origV4
	// The clients' addresses: an AnyIP prefix of the client's namespace.
	ip(t, "-n", l.client, "route", "add", "local", "10.90.0.0/16", "dev", "lo")
	ip(t, "route", "add", "10.90.0.0/16", "via", f.clients[0].String())
	var bs []registry.Backend
	for i := range 2 {
		l.routeBackend(f, i)
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: startOrigEcho(t, l.backs[i], netip.AddrPortFrom(f.backend(i), 7000)), State: registry.Ready})
	}
	reg, err := registry.New(registry.Config{Service: "cost", Seed: hrwSeed, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	require.NoError(t, reg.Update(bs))
	p, err := cidroute.New(cidroute.Config{Logger: quiet(), Services: []cidroute.Service{{
		Name: "cost", Listen: netip.AddrPortFrom(f.proxy, 5684), Workers: 1,
		RouterConfig:   cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg, Transparent: true},
		OriginalSource: mode == "original_source",
		RecvBuffer:     4 << 20, SendBuffer: 4 << 20,
	}}})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
	})
	proxy, _ := p.Addr("cost")

	var ld *transparentLoad
	inNS(t, l.client, func() { ld = newTransparentLoad(t, proxy) })
	for i := range ld.srcs {
		k := i + 1
		ld.srcs[i] = netip.AddrFrom4([4]byte{10, 90, byte(k >> 8), byte(k)})
	}
	before := transparentSample()
	ld.establish(t)
	after := transparentSample()
	sessions := 0
	for _, s := range p.Stats() {
		sessions += s.Sessions
	}
	require.Equal(t, benchClients, sessions)
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / benchClients }
	t.Logf("mode=%s clients=%d: heap %.0f B/session, stack %.0f B/session, rss %.0f B/session, slab %.0f B/session, goroutines %.2f/session, fds %.2f/session (GOMAXPROCS %d)",
		mode, benchClients, per(after.heap, before.heap), per(after.stack, before.stack), per(after.rss, before.rss),
		per(after.slab, before.slab), float64(after.goroutines-before.goroutines)/benchClients, float64(after.fds-before.fds)/benchClients, runtime.GOMAXPROCS(0))
}

// startOrigEcho echoes every datagram it receives on a (in namespace ns)
// unchanged, one at a time.
func startOrigEcho(t *testing.T, ns string, a netip.AddrPort) netip.AddrPort {
	t.Helper()
	var c *net.UDPConn
	inNS(t, ns, func() {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		require.NoError(t, err)
		require.NoError(t, c.SetReadBuffer(4<<20))
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// raiseNoFile lifts the descriptor limit to want (root may).
func raiseNoFile(t *testing.T, want uint64) {
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	old := lim
	if lim.Cur >= want {
		return
	}
	lim.Cur, lim.Max = want, max(lim.Max, want)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// TestOrigSrcCPU measures cidproxy's CPU per datagram in original-source
// mode against transparent mode, on the shared benchmark's terms where
// the namespaces allow (its loadgen and sinks are loopback-only): cidproxy
// as a process of its own with one worker, 64 client sockets sending
// DTLS tls12_cid records of 121 bytes at a fixed rate for 3 s, echo
// backends, and CPU per datagram = the process's CPU time (schedstat of all
// its threads) / (2 × replies). The modes alternate, three times each; the
// load side shares the machine's CPUs with the proxy.
//
//	CIDROUTE_ORIGSRC_COST=cpu go test -count=1 -run TestOrigSrcCPU -v ./e2e/
func TestOrigSrcCPU(t *testing.T) {
	if os.Getenv(origCostEnv) != "cpu" {
		t.Skipf("a measurement, not a check: set %s=cpu", origCostEnv)
	}
	if !inNetns(t) {
		return
	}
	bin := buildProxies(t).v1
	l := newOrigLab(t, 2)
	f := origV4
	var bs []registry.Backend
	for i := range 2 {
		l.routeBackend(f, i)
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: startOrigEcho(t, l.backs[i], netip.AddrPortFrom(f.backend(i), 7000)), State: registry.Ready})
	}
	listen := netip.AddrPortFrom(f.proxy, 5684)
	var socks []*net.UDPConn
	for range 64 {
		socks = append(socks, l.origClient(f.clients[0]))
	}
	for _, rate := range []int{25000, 50000} {
		for rep := range 3 {
			for _, orig := range []bool{false, true} {
				mode := "transparent"
				if orig {
					mode = "original_source"
				}
				p := startCidproxy(t, mode, bin, "", "-config", writeOrigConfig(t, listen, orig, bs))
				cpu, replies, sent := origCPURun(t, p.cmd.Process.Pid, socks, listen, rate, 3*time.Second)
				t.Logf("rate=%d rep=%d mode=%s: sent %d, replies %d (loss %.2f%%), CPU %.0f ns/datagram",
					rate, rep, mode, sent, replies, 100*float64(sent-replies)/float64(sent), float64(cpu)/float64(2*replies))
				require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
				require.NoError(t, p.waitExit(t, 30*time.Second))
			}
		}
	}
}

// origCPURun sends rate datagrams/s for d from socks to the proxy (pid),
// after a warm-up that opens every session, and returns the process's CPU
// nanoseconds over the run, the replies and the datagrams sent.
func origCPURun(t *testing.T, pid int, socks []*net.UDPConn, proxy netip.AddrPort, rate int, d time.Duration) (cpu int64, replies, sent uint64) {
	t.Helper()
	recs := [][]byte{transparentRecord(t, 0, 121), transparentRecord(t, 1, 121)}
	var got atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range socks {
		wg.Go(func() {
			buf := make([]byte, 2048)
			for {
				s.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				if _, _, err := s.ReadFromUDPAddrPort(buf); err == nil {
					got.Add(1)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	// Warm-up: every socket's session is open, the proxy answers.
	require.Eventually(t, func() bool {
		for i, s := range socks {
			s.WriteToUDPAddrPort(recs[i%2], proxy)
		}
		time.Sleep(50 * time.Millisecond)
		return got.Load() >= uint64(len(socks))
	}, 20*time.Second, 100*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	base, cpu0 := got.Load(), schedCPU(t, pid)
	start := time.Now()
	for tick := time.Now(); time.Since(start) < d; tick = tick.Add(time.Millisecond) {
		due := uint64(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			i := int(sent) % len(socks)
			socks[i].WriteToUDPAddrPort(recs[i%2], proxy)
		}
		time.Sleep(time.Until(tick.Add(time.Millisecond)))
	}
	time.Sleep(300 * time.Millisecond) // the last replies
	return schedCPU(t, pid) - cpu0, got.Load() - base, sent
}

// schedCPU sums the on-CPU nanoseconds of every thread of pid.
func schedCPU(t *testing.T, pid int) int64 {
	t.Helper()
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	require.NoError(t, err)
	var sum int64
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, d.Name()))
		if err != nil {
			continue // a thread that ended
		}
		var ns int64
		fmt.Sscan(string(b), &ns)
		sum += ns
	}
	return sum
}
