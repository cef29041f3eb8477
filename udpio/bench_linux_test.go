//go:build linux

package udpio

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The benchmarks compare the batch API with ReadFromUDPAddrPort and
// WriteToUDPAddrPort one datagram at a time, in the same run. One op is one
// datagram. Besides wall time they report CPU time per datagram
// (user + system, including the softirq work the kernel runs on the
// thread): of the reader's or writer's own thread (CLOCK_THREAD_CPUTIME_ID;
// the benchmark goroutine is locked to it) for the one-sided benchmarks, of
// the whole process (CLOCK_PROCESS_CPUTIME_ID) for the echo.
//
//	go test -run '^$' -bench . -benchtime 200000x -count 3 ./udpio

const benchPayload = 200 // a typical CoAP-over-DTLS datagram

var benchModes = []int{0, 1, 8, 32, 64} // 0: one at a time

func modeName(batch int) string {
	if batch == 0 {
		return "single"
	}
	return fmt.Sprintf("batch-%d", batch)
}

// cpuTime reads a CPU clock. The clock_gettime CPU clocks are exact at the
// call; getrusage(RUSAGE_THREAD) is not: it omits the running thread's time
// since its last scheduler tick (4 ms at HZ=250), which undercounted the
// sub-millisecond chunks measured here by up to 10×.
func cpuTime(clock int32) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

func reportCPU(b *testing.B, cpu time.Duration, start time.Time) {
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/pkt")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pkt/s")
}

type benchPair struct {
	rc, sc *net.UDPConn
	r, s   *Conn // batch 64, for the unmeasured side
	dst    netip.AddrPort
	out    []Message
	in     []Message
}

func newBenchPair(b *testing.B) *benchPair {
	p := &benchPair{
		rc: listen(b, "udp4", "127.0.0.1:0", ListenConfig{RecvBuffer: 8 << 20}),
		sc: listen(b, "udp4", "127.0.0.1:0", ListenConfig{SendBuffer: 1 << 20}),
	}
	p.r, p.s = newConn(b, p.rc, 64), newConn(b, p.sc, 64)
	p.dst = addrOf(p.rc)
	p.out, p.in = make([]Message, 64), make([]Message, 64)
	for i := range p.out {
		p.out[i] = Message{Buf: make([]byte, benchPayload), Addr: p.dst}
		p.in[i].Buf = make([]byte, 2048)
	}
	return p
}

// chunk is how many datagrams the unmeasured side queues or drains at a
// time: well within the 8 MiB receive buffer.
const chunk = 1024

// fill queues chunk datagrams at the receiver, unmeasured.
func (p *benchPair) fill(b *testing.B) {
	for sent := 0; sent < chunk; sent += 64 {
		if _, err := p.s.WriteBatch(p.out); err != nil {
			b.Fatal(err)
		}
	}
}

// drain reads n datagrams, unmeasured.
func (p *benchPair) drain(b *testing.B, n int) {
	for n > 0 {
		k, err := p.r.ReadBatch(p.in[:min(n, 64)])
		if err != nil {
			b.Fatal(err)
		}
		n -= k
	}
}

// BenchmarkRead measures the receive side: datagrams are queued while the
// timer and the CPU clock are stopped, then read.
func BenchmarkRead(b *testing.B) {
	for _, batch := range benchModes {
		b.Run(modeName(batch), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p := newBenchPair(b)
			c := newConn(b, p.rc, max(batch, 1))
			ms := make([]Message, max(batch, 1))
			for i := range ms {
				ms[i].Buf = make([]byte, 2048)
			}
			buf := ms[0].Buf
			b.SetBytes(benchPayload)
			b.ReportAllocs()
			p.fill(b)
			queued, have, next := chunk, 0, 0
			var cpu time.Duration
			start := time.Now()
			cpu0 := cpuTime(unix.CLOCK_THREAD_CPUTIME_ID)
			for b.Loop() {
				if next == have {
					if queued == 0 {
						cpu += cpuTime(unix.CLOCK_THREAD_CPUTIME_ID) - cpu0
						b.StopTimer()
						p.fill(b)
						queued = chunk
						b.StartTimer()
						cpu0 = cpuTime(unix.CLOCK_THREAD_CPUTIME_ID)
					}
					var err error
					if batch == 0 {
						_, _, err = p.rc.ReadFromUDPAddrPort(buf)
						have = 1
					} else {
						have, err = c.ReadBatch(ms[:min(batch, queued)])
					}
					if err != nil {
						b.Fatal(err)
					}
					queued -= have
					next = 0
				}
				next++
			}
			cpu += cpuTime(unix.CLOCK_THREAD_CPUTIME_ID) - cpu0
			reportCPU(b, cpu, start)
			p.drain(b, queued)
		})
	}
}

// BenchmarkWrite measures the send side, which on loopback includes
// delivery into the receiving socket (the sender's thread runs it). The
// receiver is drained while the timer and the CPU clock are stopped.
func BenchmarkWrite(b *testing.B) {
	for _, batch := range benchModes {
		b.Run(modeName(batch), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p := newBenchPair(b)
			c := newConn(b, p.sc, max(batch, 1))
			ms := p.out[:max(batch, 1)]
			b.SetBytes(benchPayload)
			b.ReportAllocs()
			inFlight, have, next := 0, 0, 0
			var cpu time.Duration
			start := time.Now()
			cpu0 := cpuTime(unix.CLOCK_THREAD_CPUTIME_ID)
			for b.Loop() {
				if next == have {
					if inFlight >= chunk {
						cpu += cpuTime(unix.CLOCK_THREAD_CPUTIME_ID) - cpu0
						b.StopTimer()
						p.drain(b, inFlight)
						inFlight = 0
						b.StartTimer()
						cpu0 = cpuTime(unix.CLOCK_THREAD_CPUTIME_ID)
					}
					var err error
					if batch == 0 {
						_, err = p.sc.WriteToUDPAddrPort(ms[0].Buf, p.dst)
						have = 1
					} else {
						have, err = c.WriteBatch(ms)
					}
					if err != nil {
						b.Fatal(err)
					}
					inFlight += have
					next = 0
				}
				next++
			}
			cpu += cpuTime(unix.CLOCK_THREAD_CPUTIME_ID) - cpu0
			reportCPU(b, cpu, start)
			p.drain(b, inFlight)
		})
	}
}

// BenchmarkEcho sends datagrams through a loopback echo server with a
// window of 64 in flight; client and server use the same API. cpu-ns/pkt
// is the whole process's CPU per echoed datagram (two sends, two
// receives).
func BenchmarkEcho(b *testing.B) {
	const window = 64
	for _, batch := range benchModes {
		b.Run(modeName(batch), func(b *testing.B) {
			p := newBenchPair(b)
			srv, cli := p.rc, p.sc
			go echoServer(srv, batch)() // buffers allocated before the clock starts
			c := newConn(b, cli, max(batch, 1))
			out := make([]Message, window)
			in := make([]Message, max(batch, 1))
			for i := range out {
				out[i] = Message{Buf: make([]byte, benchPayload), Addr: p.dst}
			}
			for i := range in {
				in[i].Buf = make([]byte, 2048)
			}
			send := func(n int) {
				if batch == 0 {
					for range n {
						if _, err := cli.WriteToUDPAddrPort(out[0].Buf, p.dst); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				if _, err := c.WriteBatch(out[:n]); err != nil {
					b.Fatal(err)
				}
			}
			cli.SetReadDeadline(time.Now().Add(time.Minute)) // a lost datagram fails, not hangs
			b.SetBytes(benchPayload)
			b.ReportAllocs()
			send(window)
			have, next, reads := 0, 0, 0
			start := time.Now()
			cpu0 := cpuTime(unix.CLOCK_PROCESS_CPUTIME_ID)
			for b.Loop() {
				if next == have {
					var err error
					if batch == 0 {
						_, _, err = cli.ReadFromUDPAddrPort(in[0].Buf)
						have = 1
					} else {
						have, err = c.ReadBatch(in)
					}
					if err != nil {
						b.Fatal(err)
					}
					send(have)
					next = 0
					reads++
				}
				next++
			}
			reportCPU(b, cpuTime(unix.CLOCK_PROCESS_CPUTIME_ID)-cpu0, start)
			b.ReportMetric(float64(b.N)/float64(reads), "pkt/read") // client side
		})
	}
}

// echoServer prepares a server that returns every datagram to its source
// until srv is closed.
func echoServer(srv *net.UDPConn, batch int) func() {
	buf := make([]byte, 2048)
	if batch == 0 {
		return func() {
			for {
				n, from, err := srv.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				srv.WriteToUDPAddrPort(buf[:n], from)
			}
		}
	}
	c, _ := NewConn(srv, batch)
	in, out := make([]Message, batch), make([]Message, batch)
	for i := range in {
		in[i].Buf = make([]byte, 2048)
	}
	return func() {
		for {
			n, err := c.ReadBatch(in)
			if err != nil {
				return
			}
			for i, m := range in[:n] {
				out[i] = Message{Buf: m.Buf[:m.N], Addr: m.Addr}
			}
			if _, err := c.WriteBatch(out[:n]); err != nil {
				return
			}
		}
	}
}
