package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// Benchmark shape: 10,000 client addresses (each its own 127.2.x.y source
// on one of a few wildcard-bound client sockets, set per datagram with
// IP_PKTINFO, so the clients cost no descriptors), two echo backends, one
// worker, DTLS tls12_cid records of 100 bytes.
const (
	benchClients = 10000
	benchSockets = 4
	benchSize    = 100
	benchBatch   = 32
	benchWindow  = 1024 // datagrams in flight in the closed loop
)

// BenchmarkTransparentSessions compares the proxy's two modes in one run,
// at benchClients concurrent client addresses:
//
//   - state: what the established sessions cost, per client address: Go
//     heap (heap-B/session), goroutine stacks (stack-B/session), resident
//     memory (rss-B/session), kernel slab memory (slab-B/session: socket,
//     file and inode objects; machine-wide, so other processes add noise),
//     goroutines/session and fds/session. PPv2 mode keeps no per-client
//     state, so these are about 0 there;
//   - throughput: an op is one client datagram echoed back through the
//     proxy (a closed loop of benchWindow in flight, rotating over every
//     client address); datagrams/s counts what the proxy forwarded in both
//     directions, so one op is two.
//
// Client, backends and proxy share this process and the machine's cores,
// so the figures compare the modes rather than measure the proxy alone.
// The state figures of the first run in a process (-count 1) are the cold
// ones; later runs reuse goroutine descriptors (about 450 bytes each) that
// the first one left behind.
//
//	go test -run '^$' -bench BenchmarkTransparentSessions -benchtime 2s ./examples/e2e/
func BenchmarkTransparentSessions(b *testing.B) {
	if testing.Short() {
		b.Skip("opens 10,000 client addresses and as many sockets; not in -short")
	}
	transparentRaiseNoFile(b, 25000)
	for _, transparent := range []bool{false, true} {
		name := "mode=ppv2"
		if transparent {
			name = "mode=transparent"
		}
		b.Run(name+"/clients="+strconv.Itoa(benchClients), func(b *testing.B) {
			benchTransparentMode(b, transparent)
		})
	}
}

func benchTransparentMode(b *testing.B, transparent bool) {
	var backends []registry.Backend
	for ord := range uint8(2) {
		e := startTransparentBenchEcho(b, !transparent)
		backends = append(backends, registry.Backend{Ordinal: ord, Addr: e})
	}
	reg, err := registry.New(registry.Config{Service: "bench", Seed: hrwSeed, Logger: quiet()})
	require.NoError(b, err)
	b.Cleanup(reg.Close)
	require.NoError(b, reg.Update(backends))
	p, err := cidroute.New(cidroute.Config{
		Services: []cidroute.Service{{Name: "bench", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
			RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg, Transparent: transparent},
			RecvBuffer:   4 << 20, SendBuffer: 4 << 20}},
		Logger: quiet(),
	})
	require.NoError(b, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	b.Cleanup(func() {
		p.Close()
		require.NoError(b, <-errc)
	})
	proxy, _ := p.Addr("bench")
	ld := newTransparentLoad(b, proxy)

	before := transparentSample()
	ld.establish(b)
	after := transparentSample()
	sessions := 0
	for _, s := range p.Stats() {
		sessions += s.Sessions
	}
	if transparent {
		require.Equal(b, benchClients, sessions, "one session per client address")
	}
	b.ReportAllocs()
	fwd0 := transparentForwarded(p)
	ld.begin()
	start := time.Now()
	next := 0
	for b.Loop() {
		ld.push(next)
		if next++; next == benchClients {
			next = 0
		}
	}
	ld.flush()
	ld.drain()
	elapsed := time.Since(start)
	fwd := transparentForwarded(p) - fwd0
	b.ReportMetric(float64(fwd)/elapsed.Seconds(), "datagrams/s")
	b.ReportMetric(float64(ld.received.Load()-ld.base)/float64(ld.sent), "replies/op")
	per := func(d float64) float64 { return d / benchClients }
	b.ReportMetric(per(float64(after.heap)-float64(before.heap)), "heap-B/session")
	b.ReportMetric(per(float64(after.stack)-float64(before.stack)), "stack-B/session")
	b.ReportMetric(per(float64(after.rss)-float64(before.rss)), "rss-B/session")
	b.ReportMetric(per(float64(after.slab)-float64(before.slab)), "slab-B/session")
	b.ReportMetric(per(float64(after.goroutines-before.goroutines)), "goroutines/session")
	b.ReportMetric(per(float64(after.fds-before.fds)), "fds/session")

	for _, s := range p.Stats() {
		if s.Forward.DroppedTotal()+s.Reverse.DroppedTotal() > 0 {
			b.Logf("proxy drops: forward %v, reverse %v", dropList(&s.Forward), dropList(&s.Reverse))
		}
	}
}

// transparentForwarded sums what the proxy forwarded both ways.
func transparentForwarded(p *cidroute.Pipeline) uint64 {
	var n uint64
	for _, s := range p.Stats() {
		n += s.Forward.Forwarded + s.Reverse.Forwarded
	}
	return n
}

// transparentUsage is the process's footprint at one moment, after a GC.
type transparentUsage struct {
	heap, stack, rss, slab uint64
	goroutines, fds        int
}

func transparentSample() transparentUsage {
	// GC and hand freed pages back, so that RSS does not count memory an
	// earlier run freed (later runs in one process still reuse the
	// runtime's goroutine descriptors: the first run is the cold figure).
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := transparentUsage{heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		f := bytes.Fields(b)
		if len(f) > 1 {
			pages, _ := strconv.ParseUint(string(f[1]), 10, 64)
			u.rss = pages * uint64(os.Getpagesize())
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		u.fds = len(ents)
	}
	u.slab = transparentSlab()
	return u
}

// transparentSlab returns the bytes of every kernel slab cache's active
// objects (0 when /proc/slabinfo is unreadable).
func transparentSlab() uint64 {
	f, err := os.Open("/proc/slabinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := bytes.Fields(sc.Bytes())
		if len(fs) < 4 || fs[0][0] == '#' {
			continue
		}
		active, err1 := strconv.ParseUint(string(fs[1]), 10, 64)
		size, err2 := strconv.ParseUint(string(fs[3]), 10, 64)
		if err1 == nil && err2 == nil {
			total += active * size
		}
	}
	return total
}

// transparentRaiseNoFile lifts the soft descriptor limit to want, or to
// the hard limit when want is above it and the process may not raise that.
func transparentRaiseNoFile(b *testing.B, want uint64) {
	var lim syscall.Rlimit
	require.NoError(b, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur >= want {
		return
	}
	old := lim
	lim.Cur = want
	if lim.Max < want {
		lim.Max = want
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
			lim.Cur, lim.Max = old.Max, old.Max
		}
	}
	if lim != old {
		require.NoError(b, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	}
	b.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	need := uint64(benchClients + 1000)
	if lim.Cur < need {
		b.Skipf("RLIMIT_NOFILE %d is below the %d descriptors transparent mode needs here", lim.Cur, need)
	}
}

// startTransparentBenchEcho starts a batched echo backend on loopback. In
// PPv2 mode it answers behind the reverse header (source = service,
// destination = client); otherwise it echoes the datagram as it is.
func startTransparentBenchEcho(b *testing.B, pp bool) netip.AddrPort {
	return testecho.Start(b, testecho.Config{PPv2: pp, Batch: benchBatch, Buffer: 4 << 20}).Addr()
}

// transparentLoad is benchClients client addresses spread over
// benchSockets wildcard-bound sockets. Each datagram carries its client's
// index, which the echo keeps, so replies name who was answered.
type transparentLoad struct {
	proxy    netip.AddrPort
	socks    []*udpio.Conn
	conns    []*net.UDPConn
	srcs     []netip.Addr
	tmpl     [][]byte
	out      [][]udpio.Message // pending batch per socket
	bufs     [][]byte
	answered []atomic.Bool
	received atomic.Uint64
	wake     chan struct{}
	// the current phase: replies before it, datagrams sent, written off
	base, sent, lost uint64
	wg               sync.WaitGroup
}

func newTransparentLoad(b testing.TB, proxy netip.AddrPort) *transparentLoad {
	ld := &transparentLoad{proxy: proxy, answered: make([]atomic.Bool, benchClients), wake: make(chan struct{}, 1)}
	codec := dtls.OrdinalFirst{}
	for i := range benchClients {
		k := i + 1
		ld.srcs = append(ld.srcs, netip.AddrFrom4([4]byte{127, 2, byte(k >> 8), byte(k)}))
		// An established-session record: tls12_cid naming backend i%2.
		cid, err := codec.AppendCID(nil, uint8(i%2))
		require.NoError(b, err)
		payload := binary.BigEndian.AppendUint32(make([]byte, 0, benchSize), uint32(i))
		payload = payload[:benchSize-dtls.HeaderLen-len(cid)]
		rec, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 1, CID: cid, Fragment: payload})
		require.NoError(b, err)
		ld.tmpl = append(ld.tmpl, rec)
	}
	for range benchSockets {
		g, err := udpio.ListenGroup("udp4", "0.0.0.0:0", 1, udpio.ListenConfig{RecvBuffer: 4 << 20, SendBuffer: 4 << 20})
		require.NoError(b, err)
		io, err := udpio.NewConn(g[0], benchBatch)
		require.NoError(b, err)
		ld.conns, ld.socks = append(ld.conns, g[0]), append(ld.socks, io)
		ld.out = append(ld.out, make([]udpio.Message, 0, benchBatch))
		ld.bufs = append(ld.bufs, make([]byte, benchBatch*benchSize))
	}
	for _, io := range ld.socks {
		ld.wg.Go(func() { ld.receive(io) })
	}
	b.Cleanup(func() {
		for _, c := range ld.conns {
			c.Close()
		}
		ld.wg.Wait()
	})
	return ld
}

func (ld *transparentLoad) receive(io *udpio.Conn) {
	in := make([]udpio.Message, benchBatch)
	for i := range in {
		in[i].Buf = make([]byte, 2048)
	}
	for {
		n, err := io.ReadBatch(in)
		if err != nil {
			return
		}
		for _, m := range in[:n] {
			// The client index follows the 21-byte record header.
			if m.Err == nil && m.N >= 25 {
				if i := binary.BigEndian.Uint32(m.Buf[21:25]); i < benchClients {
					ld.answered[i].Store(true)
				}
			}
		}
		ld.received.Add(uint64(n))
		select {
		case ld.wake <- struct{}{}:
		default:
		}
	}
}

// send queues client i's datagram, sending its socket's batch when full.
func (ld *transparentLoad) send(i int) {
	s := i % benchSockets
	out := ld.out[s]
	j := len(out)
	buf := ld.bufs[s][j*benchSize : (j+1)*benchSize]
	copy(buf, ld.tmpl[i])
	out = append(out, udpio.Message{Buf: buf, Addr: ld.proxy, Local: ld.srcs[i]})
	if len(out) == benchBatch {
		ld.socks[s].WriteBatch(out)
		out = out[:0]
	}
	ld.out[s] = out
}

func (ld *transparentLoad) flush() {
	for s, out := range ld.out {
		if len(out) > 0 {
			ld.socks[s].WriteBatch(out)
			ld.out[s] = out[:0]
		}
	}
}

// establish sends one datagram per client until every client has had an
// answer, so that every client address holds a session.
func (ld *transparentLoad) establish(b testing.TB) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ld.begin()
		missing := 0
		for i := range benchClients {
			if !ld.answered[i].Load() {
				missing++
				ld.push(i)
			}
		}
		ld.flush()
		if missing == 0 {
			return
		}
		ld.drain()
		if time.Now().After(deadline) {
			b.Fatalf("%d clients still unanswered", missing)
		}
	}
}

// begin starts counting a phase's datagrams and replies.
func (ld *transparentLoad) begin() {
	ld.base, ld.sent, ld.lost = ld.received.Load(), 0, 0
}

// push sends client i's datagram, keeping at most benchWindow in flight:
// after 50 ms without a reply, what is out counts as lost.
func (ld *transparentLoad) push(i int) {
	ld.send(i)
	ld.sent++
	for {
		got := ld.received.Load() - ld.base
		if ld.sent <= got+ld.lost+benchWindow {
			return
		}
		select {
		case <-ld.wake:
		case <-time.After(50 * time.Millisecond):
			ld.lost = ld.sent - got
		}
	}
}

// drain waits until the phase's replies have arrived, or 200 ms pass
// without one.
func (ld *transparentLoad) drain() {
	for ld.received.Load()-ld.base < ld.sent {
		select {
		case <-ld.wake:
		case <-time.After(200 * time.Millisecond):
			return
		}
	}
}
