package xdp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
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

// benchSender sends DTLS tls12_cid datagrams (ordinals 0-2 in turn, the
// send time in the fragment) to XDPBENCH_TARGET from XDPBENCH_SOCKETS
// sockets for XDPBENCH_SECONDS, at XDPBENCH_RATE datagrams/s (0 = as
// fast as sendmmsg goes), and prints how many it sent.
func benchSender() {
	target := netip.MustParseAddrPort(os.Getenv("XDPBENCH_TARGET"))
	rate, _ := strconv.Atoi(os.Getenv("XDPBENCH_RATE"))
	secs, _ := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64)
	socks, _ := strconv.Atoi(os.Getenv("XDPBENCH_SOCKETS"))
	socks = max(socks, 1)
	const batch = 32
	var sent atomic.Uint64
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var wg sync.WaitGroup
	for s := range socks {
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
			if rate > 0 {
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
				now := uint64(time.Now().UnixNano())
				for i := range ms {
					binary.BigEndian.PutUint64(ms[i].Buf[21:], now)
				}
				n, _ := c.WriteBatch(ms)
				sent.Add(uint64(n))
			}
		}()
	}
	wg.Wait()
	fmt.Println(sent.Load())
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
				now := time.Now().UnixNano()
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

// cpuTicks reads the machine's softirq and irq time from /proc/stat, in
// seconds.
func softirqSeconds(t testing.TB) float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq
	irq, _ := strconv.ParseFloat(f[6], 64)
	soft, _ := strconv.ParseFloat(f[7], 64)
	return (irq + soft) / 100 // USER_HZ
}

func processSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// benchResult is one run of one path.
type benchResult struct {
	path             string
	rate             int
	sent, delivered  uint64
	seconds          float64
	procCPU, softCPU float64
	p50us, p99us     float64
	progNs           float64 // the XDP program's mean run time per frame
}

func (r benchResult) perCPUSecond() float64 { return float64(r.delivered) / (r.procCPU + r.softCPU) }

// BenchmarkForwardPath compares the XDP path with the socket path on the
// same veth topology: a sender process in the client namespace, a sink
// process in the backend namespace, the proxy (this process) between
// them. Each sub-benchmark is one fixed-length run (use -benchtime 1x);
// it reports datagrams delivered per proxy CPU-second, counting this
// process's user and system time and the machine's irq and softirq time
// (where XDP and the kernel's receive path run), and the one-way p50/p99
// latency at the sink. XDPBENCH_SECONDS (default 5) sets the length and
// XDPBENCH_RATE the paced rate of the latency runs (default 50000).
func BenchmarkForwardPath(b *testing.B) {
	secs := 5.0
	if s, err := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64); err == nil {
		secs = s
	}
	rate := 50000
	if r, err := strconv.Atoi(os.Getenv("XDPBENCH_RATE")); err == nil {
		rate = r
	}
	bt := newBenchTopo(b)
	for _, c := range []struct {
		name string
		xdp  bool
		rate int
	}{{"socket/saturation", false, 0}, {"xdp/saturation", true, 0}, {"socket/paced", false, rate}, {"xdp/paced", true, rate}} {
		b.Run(c.name, func(b *testing.B) {
			r := bt.run(b, c.xdp, c.rate, secs)
			b.ReportMetric(r.perCPUSecond(), "dgrams/cpu-s")
			b.ReportMetric(float64(r.delivered)/r.seconds, "dgrams/s")
			b.ReportMetric(r.procCPU/r.seconds, "proc-cpus")
			b.ReportMetric(r.softCPU/r.seconds, "softirq-cpus")
			b.ReportMetric(r.p50us, "p50-µs")
			b.ReportMetric(r.p99us, "p99-µs")
			b.ReportMetric(float64(r.sent-r.delivered)/float64(max(r.sent, 1)), "lost")
			if r.progNs > 0 {
				b.ReportMetric(r.progNs, "prog-ns/frame")
			}
		})
	}
}

type benchTopo struct {
	*topo
	pipe     *cidroute.Pipeline
	services []cidroute.Service
	log      *slog.Logger
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

func (bt *benchTopo) run(b *testing.B, withXDP bool, rate int, secs float64) benchResult {
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
		fmt.Sprintf("XDPBENCH_RATE=%d", rate), fmt.Sprintf("XDPBENCH_SECONDS=%g", secs), "XDPBENCH_SOCKETS=2")
	b.ResetTimer()
	start, p0, s0 := time.Now(), processSeconds(), softirqSeconds(b)
	out, err := sender.Output()
	if err != nil {
		b.Fatalf("sender: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the last datagrams in flight
	r := benchResult{rate: rate, seconds: time.Since(start).Seconds(), procCPU: processSeconds() - p0, softCPU: softirqSeconds(b) - s0}
	b.StopTimer()
	sink.Process.Signal(syscall.SIGTERM)
	sink.Wait()
	var rep sinkReport
	if err := json.Unmarshal([]byte(sinkOut.String()), &rep); err != nil {
		b.Fatalf("sink said %q: %v", sinkOut.String(), err)
	}
	r.sent, _ = strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	r.delivered, r.p50us, r.p99us = rep.Received, rep.P50us, rep.P99us
	if withXDP {
		r.path = "xdp"
		st, _ := accel.prog.Stats()
		b.Logf("xdp forwarded %d, handed up %d", st[0].Forward.Forwarded, st[0].Forward.Passed)
		if ps, err := accel.prog.objs.Cidroute.Stats(); err == nil && ps.RunCount > 0 {
			r.progNs = float64(ps.Runtime.Nanoseconds()) / float64(ps.RunCount)
		}
	}
	return r
}
