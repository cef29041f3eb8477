package xdp

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The forwarding benchmark's load generator and sink run as separate
// processes (this test binary with XDPBENCH_ROLE set, under ip netns
// exec), so that the proxy's CPU is this process's own.
func TestMain(m *testing.M) {
	switch os.Getenv("XDPBENCH_ROLE") {
	case "send":
		benchSender()
		return
	case "sink":
		benchSink()
		return
	}
	os.Exit(m.Run())
}

const benchPort = 5684

// benchSender is the load generator: frameSender, or socketSender when
// XDPBENCH_SENDER is "socket".
func benchSender() {
	if os.Getenv("XDPBENCH_SENDER") == "socket" {
		socketSender()
		return
	}
	frameSender()
}

// socketSender sends DTLS tls12_cid datagrams (ordinals 0-2 in turn, the
// send time in the fragment) to XDPBENCH_TARGET from XDPBENCH_SOCKETS
// sockets for XDPBENCH_SECONDS, at XDPBENCH_RATE datagrams/s (0 = as
// fast as sendmmsg goes), and prints how many it sent. With XDPBENCH_JUNK
// = n, n more sockets send junk flat out beside them (CID records of
// ordinal 9, which no backend has, and random bytes that start no DTLS
// record, in turn), and it prints how many of those too.
func socketSender() {
	target := netip.MustParseAddrPort(os.Getenv("XDPBENCH_TARGET"))
	rate, _ := strconv.Atoi(os.Getenv("XDPBENCH_RATE"))
	secs, _ := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64)
	socks, _ := strconv.Atoi(os.Getenv("XDPBENCH_SOCKETS"))
	junk, _ := strconv.Atoi(os.Getenv("XDPBENCH_JUNK"))
	socks = max(socks, 1)
	const batch = 32
	var sent, junked atomic.Uint64
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var wg sync.WaitGroup
	for s := range socks + junk {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := net.ListenUDP("udp4", nil)
			if err != nil {
				panic(err)
			}
			c, err := udpio.NewConn(u, batch)
			if err != nil {
				panic(err)
			}
			ms := make([]udpio.Message, batch)
			for i := range ms {
				ms[i].Buf = dtlsCIDRecord(8, byte(i%3), 64)
				ms[i].Addr = target
			}
			per := time.Duration(0)
			count := &sent
			if s >= socks { // a junk sender
				count = &junked
				for i := range ms {
					if i%2 == 0 {
						ms[i].Buf[11] = 9 // the ordinal
					} else {
						for k := range ms[i].Buf {
							ms[i].Buf[k] = byte(rand.Uint32())
						}
						ms[i].Buf[0] %= 20
					}
				}
			} else if rate > 0 {
				per = time.Duration(float64(time.Second) * batch * float64(socks) / float64(rate))
			}
			next := time.Now().Add(time.Duration(s) * per / time.Duration(socks))
			for time.Now().Before(end) {
				if per > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(per)
				}
				if count == &sent {
					now := uint64(monoNow())
					for i := range ms {
						binary.BigEndian.PutUint64(ms[i].Buf[21:], now)
					}
				}
				n, _ := c.WriteBatch(ms)
				count.Add(uint64(n))
			}
		}()
	}
	wg.Wait()
	fmt.Println(sent.Load())
	if junk > 0 {
		fmt.Println(junked.Load())
	}
}

// sinkReport is what the sink prints: datagrams received and the one-way
// latency percentiles from the sender's clock to the backend socket.
type sinkReport struct {
	Received     uint64
	P50us, P99us float64
	Samples      int
}

// benchSink counts the datagrams arriving at the three backend addresses
// until SIGTERM and prints a sinkReport.
func benchSink() {
	var got atomic.Uint64
	var mu sync.Mutex
	var lat []int64
	for o := range uint8(3) {
		u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(backendAddr(o), benchPort)))
		if err != nil {
			panic(err)
		}
		u.SetReadBuffer(8 << 20)
		c, err := udpio.NewConn(u, 64)
		if err != nil {
			panic(err)
		}
		go func() {
			ms := make([]udpio.Message, 64)
			for i := range ms {
				ms[i].Buf = make([]byte, 2048)
			}
			var mine []int64
			for {
				n, err := c.ReadBatch(ms)
				if err != nil {
					return
				}
				now := monoNow()
				got.Add(uint64(n))
				for _, m := range ms[:n] {
					// PPv2 (28) + record header and CID (21) + timestamp.
					if m.N >= 28+21+8 {
						mine = append(mine, now-int64(binary.BigEndian.Uint64(m.Buf[28+21:])))
					}
				}
				if len(mine) > 4096 {
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
					mine = mine[:0]
				}
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	fmt.Fprintln(os.Stderr, "ready")
	<-sig
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	r := sinkReport{Received: got.Load(), Samples: len(lat)}
	if len(lat) > 0 {
		r.P50us = float64(lat[len(lat)/2]) / 1e3
		r.P99us = float64(lat[len(lat)*99/100]) / 1e3
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// threadSeconds is a task's time on a CPU (/proc/PID/schedstat, from the
// scheduler's clock, not sampled ticks) and how many times it was
// switched in.
func threadSeconds(t testing.TB, pid int) (float64, uint64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b)) // run time, wait time, timeslices
	ns, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	runs, _ := strconv.ParseUint(f[2], 10, 64)
	return float64(ns) / 1e9, runs
}

func processSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func childSeconds(c *exec.Cmd) float64 {
	if c.ProcessState == nil {
		return 0
	}
	return (c.ProcessState.UserTime() + c.ProcessState.SystemTime()).Seconds()
}

// napiPollers lists the threaded-NAPI kernel threads of devices named
// dev ("napi/<dev>-<napi id>", in any namespace).
func napiPollers(t testing.TB, dev string) map[int]bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.HasPrefix(string(c), "napi/"+dev+"-") {
			pids[pid] = true
		}
	}
	return pids
}

// napiThread makes dev's NAPI poller (veth has one while GRO is on or an
// XDP program is attached) a kernel thread of its own and returns its pid:
// that thread's CPU time is the device's whole receive processing, the XDP
// program with its redirects or the stack up to the socket, and nothing
// else. In softirq it would be charged to whatever task ran it (the
// sender, mostly: a veth peer's transmit schedules it; this kernel has no
// IRQ_TIME_ACCOUNTING), or counted machine-wide with every tenant's.
func napiThread(t testing.TB, ns *netns, dev string) int {
	t.Helper()
	before := napiPollers(t, dev)
	run(t, "ip", "netns", "exec", ns.name, "sh", "-c", "echo 1 > /sys/class/net/"+dev+"/threaded")
	var pids []int
	for pid := range napiPollers(t, dev) {
		if !before[pid] {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("threaded NAPI on %s: new poller threads %v, want one", dev, pids)
	}
	return pids[0]
}

// linkStats are a device's packet counters (ip -s -j link).
type linkStats struct{ rx, tx, txDropped uint64 }

func readLinkStats(t testing.TB, ns *netns, dev string) linkStats {
	out, err := exec.Command("ip", "-n", ns.name, "-s", "-j", "link", "show", "dev", dev).Output()
	if err != nil {
		t.Fatalf("ip -s link show %s: %v", dev, err)
	}
	type dir struct{ Packets, Dropped uint64 }
	var l []struct {
		Stats64 struct{ Rx, Tx dir }
	}
	if err := json.Unmarshal(out, &l); err != nil || len(l) != 1 {
		t.Fatalf("ip -s -j link show %s: %q: %v", dev, out, err)
	}
	st := l[0].Stats64
	return linkStats{st.Rx.Packets, st.Tx.Packets, st.Tx.Dropped}
}

// benchResult is one run of one path. CPU times are in seconds.
type benchResult struct {
	path            string
	rate            int
	sent, delivered uint64
	junk            uint64 // the junk senders' datagrams
	ringDropped     uint64 // dropped by veth before the proxy saw them: pc's receive ring was full
	received        uint64 // frames pc's NAPI took in
	forwarded       uint64 // datagrams the proxy put on pb (sent or dropped by veth)
	seconds         float64
	procCPU         float64 // the proxy process (the Go pipeline)
	napiCPU         float64 // the proxy's ingress veth's NAPI thread
	napiRuns        uint64  // times the NAPI thread was switched in
	sinkNapiCPU     float64 // the backends' veth NAPI thread (the sink's receive)
	senderCPU       float64
	sinkCPU         float64
	p50us, p99us    float64
	progNs          float64 // the XDP program's mean run time per frame
	progFrames      uint64
}

// proxyCPU is the proxy's CPU time: its process and its receive NAPI
// thread.
func (r benchResult) proxyCPU() float64 { return r.procCPU + r.napiCPU }

// perCPUSecond counts what the proxy forwarded, not what the sink took
// in: at saturation the sink, starved like everyone on a shared machine,
// drops what the proxy did forward.
func (r benchResult) perCPUSecond() float64 { return float64(r.forwarded) / r.proxyCPU() }

// BenchmarkForwardPath compares the XDP path with the socket path on the
// same veth topology: a sender process in the client namespace, a sink
// process in the backend namespace, the proxy (this process) between
// them. Each sub-benchmark is one fixed-length run (use -benchtime 1x),
// the four cases interleaved for XDPBENCH_ROUNDS rounds (default 3); it
// reports datagrams forwarded per proxy CPU-second, the proxy's CPU being
// this process's time and that of the proxy's ingress veth's NAPI thread
// (see napiThread), and the one-way p50/p99 latency at the sink. At the
// end it prints the README's table. XDPBENCH_SECONDS (default 4) sets
// the length of a run and XDPBENCH_RATE the paced rate (default 50000).
func BenchmarkForwardPath(b *testing.B) {
	secs := 4.0
	if s, err := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64); err == nil {
		secs = s
	}
	rate := 50000
	if r, err := strconv.Atoi(os.Getenv("XDPBENCH_RATE")); err == nil {
		rate = r
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("XDPBENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	load0 := loadAvg()
	bt := newBenchTopo(b)
	cases := []struct {
		name string
		xdp  bool
		rate int
	}{{"socket/saturation", false, 0}, {"xdp/saturation", true, 0}, {"socket/paced", false, rate}, {"xdp/paced", true, rate}}
	res := make([][]benchResult, len(cases))
	for range rounds {
		for i, c := range cases {
			b.Run(c.name, func(b *testing.B) {
				r := bt.run(b, c.xdp, c.rate, secs, 0)
				res[i] = append(res[i], r)
				b.ReportMetric(r.perCPUSecond(), "dgrams/cpu-s")
				b.ReportMetric(float64(r.received)/r.seconds, "in/s")
				b.ReportMetric(float64(r.forwarded)/r.seconds, "fwd/s")
				b.ReportMetric(float64(r.delivered)/r.seconds, "delivered/s")
				b.ReportMetric(r.procCPU/r.seconds, "proc-cpus")
				b.ReportMetric(r.napiCPU/r.seconds, "napi-cpus")
				b.ReportMetric(float64(r.napiRuns)/r.seconds, "napi-runs/s")
				b.ReportMetric(r.p50us, "p50-µs")
				b.ReportMetric(r.p99us, "p99-µs")
				if r.progNs > 0 {
					b.ReportMetric(r.progNs, "prog-ns/frame")
				}
			})
		}
	}
	if b.Failed() || len(res[0]) < rounds {
		return
	}
	// The log of a benchmark with sub-benchmarks is not shown.
	fmt.Printf("load average before %s, after %s; %d rounds of %g s; medians:\n%s", load0, loadAvg(), rounds, secs, benchTable(res))
}

// BenchmarkJunkFlood measures what a junk flood does to legitimate
// traffic on each path: two sockets send junk flat out (CID records of an
// ordinal no backend has, random bytes), beside two that send legitimate
// CID records at XDPBENCH_RATE (default 20000/s), for XDPBENCH_SECONDS
// (default 3) per run, XDPBENCH_ROUNDS rounds (default 3) alternating the
// socket path and the XDP path. It reports the legitimate loss (what the
// sink did not get of what was sent) and prints a table at the end.
func BenchmarkJunkFlood(b *testing.B) {
	secs, rate, rounds := 3.0, 20000, 3
	if s, err := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64); err == nil {
		secs = s
	}
	if r, err := strconv.Atoi(os.Getenv("XDPBENCH_RATE")); err == nil {
		rate = r
	}
	if r, err := strconv.Atoi(os.Getenv("XDPBENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	load0 := loadAvg()
	bt := newBenchTopo(b)
	// On 2 CPUs a sender flat out takes one: without pinning it shares
	// it with pc's NAPI thread, whose ring then overflows before any
	// program or socket sees the frames (measured: 27 % of everything
	// offered dropped there, legitimate frames as much as junk). Pinned
	// apart, the receive side has a CPU as it would behind a NIC.
	bt.senderCPU = "0"
	run(b, "taskset", "-pc", "1", strconv.Itoa(bt.napi))
	var tbl strings.Builder
	tbl.WriteString("| path | junk offered /s | legitimate offered /s | legitimate delivered /s | legitimate loss | dropped at the receive ring, all /s | proxy CPU/s: process + NAPI | legitimate one-way p50 / p99 |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for range rounds {
		for _, withXDP := range []bool{false, true} {
			name := "socket"
			if withXDP {
				name = "xdp"
			}
			b.Run(name, func(b *testing.B) {
				r := bt.run(b, withXDP, rate, secs, 2)
				loss := 1 - float64(r.delivered)/float64(max(r.sent, 1))
				b.ReportMetric(100*loss, "legit-loss-%")
				b.ReportMetric(float64(r.junk)/r.seconds, "junk/s")
				b.ReportMetric(r.proxyCPU()/r.seconds, "proxy-cpus")
				fmt.Fprintf(&tbl, "| %s | %.0f | %.0f | %.0f | %.2f %% | %.0f | %.3f + %.3f | %.2f ms / %.2f ms |\n", r.path,
					float64(r.junk)/r.seconds, float64(r.sent)/r.seconds, float64(r.delivered)/r.seconds, 100*loss, float64(r.ringDropped)/r.seconds,
					r.procCPU/r.seconds, r.napiCPU/r.seconds, r.p50us/1e3, r.p99us/1e3)
			})
		}
	}
	fmt.Printf("load average before %s, after %s; %d rounds of %g s:\n%s", load0, loadAvg(), rounds, secs, tbl.String())
}

// benchTable is the README's table. A row is the median round by dgrams
// per proxy CPU-second; the ratio is the median (and range) of the XDP
// run's over the socket run's of the same round; the p99 of every round
// follows the table.
func benchTable(res [][]benchResult) string {
	var sb, p99 strings.Builder
	sb.WriteString("| path | offered | into proxy /s | forwarded /s | delivered /s | proxy CPU/s: process + NAPI thread | proxy µs per dgram | dgrams per proxy CPU-s | XDP ÷ socket | one-way p50 / p99 | sink CPU/s: process + NAPI | sender CPU/s |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, rs := range res {
		byEff := slices.Clone(rs)
		slices.SortFunc(byEff, func(a, b benchResult) int { return cmp.Compare(a.perCPUSecond(), b.perCPUSecond()) })
		r := byEff[len(byEff)/2]
		offered := "saturation"
		if r.rate > 0 {
			offered = fmt.Sprintf("%d/s", r.rate)
		}
		ratio := "—"
		if r.path == "xdp" && i > 0 {
			sock := res[i-1]
			var v []float64
			for k := range min(len(rs), len(sock)) {
				v = append(v, rs[k].perCPUSecond()/sock[k].perCPUSecond())
			}
			slices.Sort(v)
			ratio = fmt.Sprintf("**%.1f×** (%.1f–%.1f)", v[len(v)/2], v[0], v[len(v)-1])
		}
		fmt.Fprintf(&sb, "| %s | %s | %.0f | %.0f | %.0f | %.3f + %.3f | %.2f | %.0f | %s | %.2f ms / %.2f ms | %.3f + %.3f | %.3f |\n",
			r.path, offered, float64(r.received)/r.seconds, float64(r.forwarded)/r.seconds, float64(r.delivered)/r.seconds,
			r.procCPU/r.seconds, r.napiCPU/r.seconds, r.proxyCPU()/float64(max(r.forwarded, 1))*1e6, r.perCPUSecond(),
			ratio, r.p50us/1e3, r.p99us/1e3, r.sinkCPU/r.seconds, r.sinkNapiCPU/r.seconds, r.senderCPU/r.seconds)
		fmt.Fprintf(&p99, "%s %s p99 by round:", r.path, offered)
		for _, r := range rs {
			fmt.Fprintf(&p99, " %.2f ms", r.p99us/1e3)
		}
		p99.WriteString("\n")
	}
	return sb.String() + p99.String()
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type benchTopo struct {
	*topo
	pipe     *cidroute.Pipeline
	services []cidroute.Service
	log      *slog.Logger
	// The NAPI threads of pc (the proxy's receive from clients) and bv
	// (the sink's receive).
	napi, sinkNapi int
	// senderCPU, when set, pins the sender (taskset -c): the junk
	// benchmark keeps it off the CPU of pc's NAPI thread.
	senderCPU string
}

func newBenchTopo(b *testing.B) *benchTopo {
	bt := &benchTopo{topo: newTopo(b), log: slog.New(slog.DiscardHandler)}
	reg, err := registry.New(registry.Config{Service: "bench", Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	var bs []registry.Backend
	for o := range uint8(3) {
		bs = append(bs, registry.Backend{Ordinal: o, Addr: netip.AddrPortFrom(backendAddr(o), benchPort)})
		bt.proxy.ip(b, "neigh replace "+backendAddr(o).String()+" lladdr "+ifaceMAC(b, bt.backend, "bv").String()+" dev pb nud permanent")
	}
	bt.proxy.ip(b, "neigh replace "+clientAddr.String()+" lladdr "+ifaceMAC(b, bt.client, "cv").String()+" dev pc nud permanent")
	// pc receives through NAPI on both paths, the stack's receive in pc's
	// thread as the program is: GRO on gives pc a poller without XDP, and
	// with TSO off on cv (as attaching XDP to pc makes it) veth hands it
	// the socket sender's UDP. bv has NAPI from its pass program.
	bt.client.do(b, func() { ethtoolSet(b, "cv", ethtoolSTSO, 0) })
	bt.proxy.do(b, func() { ethtoolSet(b, "pc", ethtoolSGRO, 1) })
	bt.napi = napiThread(b, bt.proxy, "pc")
	bt.sinkNapi = napiThread(b, bt.backend, "bv")
	if err := reg.Update(bs); err != nil {
		b.Fatal(err)
	}
	bt.services = []cidroute.Service{{Name: "bench", Listen: netip.AddrPortFrom(proxyFront, benchPort), Workers: 2,
		RecvBuffer: 8 << 20, SendBuffer: 8 << 20,
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg}}}
	bt.proxy.do(b, func() {
		if bt.pipe, err = cidroute.New(cidroute.Config{Services: bt.services, Logger: bt.log}); err != nil {
			b.Fatal(err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bt.pipe.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return bt
}

func ifaceMAC(t testing.TB, ns *netns, name string) net.HardwareAddr {
	var mac net.HardwareAddr
	ns.do(t, func() {
		i, err := net.InterfaceByName(name)
		if err != nil {
			t.Fatal(err)
		}
		mac = i.HardwareAddr
	})
	return mac
}

// role starts this binary as the sender or the sink in ns.
func role(t testing.TB, ns *netns, name string, env ...string) *exec.Cmd {
	cmd := exec.Command("ip", "netns", "exec", ns.name, os.Args[0])
	cmd.Env = append(os.Environ(), append([]string{"XDPBENCH_ROLE=" + name}, env...)...)
	return cmd
}

// run is one run of the sender through the proxy, with XDP or not. With
// junk > 0 the sender is the socket sender with junk more sockets
// flooding junk flat out beside its paced load.
func (bt *benchTopo) run(b *testing.B, withXDP bool, rate int, secs float64, junk int) benchResult {
	socketSend := junk > 0 || os.Getenv("XDPBENCH_SENDER") == "socket"
	var accel *Accel
	if withXDP {
		bt.proxy.do(b, func() {
			var err error
			if accel, err = Accelerate(bt.pipe, bt.services, 0, []string{"pc", "pb"}, bt.log); err != nil {
				b.Fatal(err)
			}
		})
		defer bt.proxy.do(b, func() { accel.Close() })
		// The program's own run time (kernel.bpf_stats_enabled while this
		// is open): the part of the softirq time that is XDP's.
		st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
	}
	if !withXDP && !socketSend {
		// Frames redirected into cv reach pc only through an XDP program.
		var l link.Link
		bt.proxy.do(b, func() { l = passLink(b, "pc") })
		defer l.Close()
	}
	sink := role(b, bt.backend, "sink")
	var sinkOut strings.Builder
	sink.Stdout = &sinkOut
	ready, err := sink.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := sink.Start(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 6)
	ready.Read(buf) // "ready"
	sender := role(b, bt.client, "send", "XDPBENCH_TARGET="+netip.AddrPortFrom(proxyFront, benchPort).String(),
		"XDPBENCH_IF=cv", "XDPBENCH_DSTMAC="+ifaceMAC(b, bt.proxy, "pc").String(),
		fmt.Sprintf("XDPBENCH_RATE=%d", rate), fmt.Sprintf("XDPBENCH_SECONDS=%g", secs), "XDPBENCH_SOCKETS=2",
		fmt.Sprintf("XDPBENCH_JUNK=%d", junk))
	if bt.senderCPU != "" {
		sender.Args = append([]string{"ip", "netns", "exec", bt.client.name, "taskset", "-c", bt.senderCPU}, sender.Args[4:]...)
		sender.Path, _ = exec.LookPath("ip")
	}
	if junk > 0 {
		sender.Env = append(sender.Env, "XDPBENCH_SENDER=socket")
	}
	b.ResetTimer()
	pc0, pb0 := readLinkStats(b, bt.proxy, "pc"), readLinkStats(b, bt.proxy, "pb")
	cv0 := readLinkStats(b, bt.client, "cv")
	n0, runs0 := threadSeconds(b, bt.napi)
	sn0, _ := threadSeconds(b, bt.sinkNapi)
	start, p0 := time.Now(), processSeconds()
	out, err := sender.Output()
	if err != nil {
		b.Fatalf("sender: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the last datagrams in flight
	r := benchResult{path: "socket", rate: rate, seconds: time.Since(start).Seconds(), procCPU: processSeconds() - p0}
	n1, runs1 := threadSeconds(b, bt.napi)
	sn1, _ := threadSeconds(b, bt.sinkNapi)
	r.napiCPU, r.napiRuns, r.sinkNapiCPU = n1-n0, runs1-runs0, sn1-sn0
	pc1, pb1 := readLinkStats(b, bt.proxy, "pc"), readLinkStats(b, bt.proxy, "pb")
	r.received, r.forwarded = pc1.rx-pc0.rx, pb1.tx+pb1.txDropped-pb0.tx-pb0.txDropped
	r.ringDropped = readLinkStats(b, bt.client, "cv").txDropped - cv0.txDropped
	b.StopTimer()
	sink.Process.Signal(syscall.SIGTERM)
	sink.Wait()
	r.senderCPU, r.sinkCPU = childSeconds(sender), childSeconds(sink)
	var rep sinkReport
	if err := json.Unmarshal([]byte(sinkOut.String()), &rep); err != nil {
		b.Fatalf("sink said %q: %v", sinkOut.String(), err)
	}
	counts := strings.Fields(string(out))
	r.sent, _ = strconv.ParseUint(counts[0], 10, 64)
	if len(counts) > 1 {
		r.junk, _ = strconv.ParseUint(counts[1], 10, 64)
	}
	r.delivered, r.p50us, r.p99us = rep.Received, rep.P50us, rep.P99us
	if withXDP {
		r.path = "xdp"
		st, _ := accel.prog.Stats()
		b.Logf("xdp forwarded %d, handed up %d", st[0].Forward.Forwarded, st[0].Forward.Passed)
		if ps, err := accel.prog.objs.Cidroute.Stats(); err == nil && ps.RunCount > 0 {
			r.progNs = float64(ps.Runtime.Nanoseconds()) / float64(ps.RunCount)
			r.progFrames = ps.RunCount
		}
		// The program runs inside pc's NAPI thread: less thread time than
		// program time means the thread is not where the work is.
		if prog := r.progNs * float64(r.progFrames) / 1e9; r.napiCPU < prog {
			b.Fatalf("pc's NAPI thread ran %.3f s, the program alone %.3f s", r.napiCPU, prog)
		}
	}
	// A receive costs more than 100 ns a datagram: less means the
	// datagrams went around pc's thread (the per-CPU backlog, softirq).
	if r.napiCPU < float64(r.received)*100e-9 {
		b.Fatalf("pc's NAPI thread ran %.3f s for %d datagrams", r.napiCPU, r.received)
	}
	return r
}
