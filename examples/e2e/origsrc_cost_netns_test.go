package e2e

import (
	"context"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"

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
