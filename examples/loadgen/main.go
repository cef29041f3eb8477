package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

// maxDatagram is the largest datagram loadgen sends or receives.
const maxDatagram = 9000

// config is loadgen's flags, validated.
type config struct {
	target      netip.AddrPort
	allowRemote bool
	pattern     []shape
	mix         string
	shapes      shapeConfig
	ordinals    []uint8
	clients     int
	sockets     int
	rate        uint64 // datagrams per second over all sockets; 0 = flat out
	window      int    // flat out: datagrams in flight per socket
	open        bool   // flat out without a window: send whatever comes back
	batch       int
	warmup      time.Duration
	duration    time.Duration // measured window, after warmup
	drain       time.Duration
	recvBuffer  int
	watchPID    int
	metricsURL  string
	jsonOut     bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	target := fs.String("target", "127.0.0.1:5684", "`ip:port` to send to (loopback only unless -allow-remote)")
	fs.BoolVar(&c.allowRemote, "allow-remote", false, "allow a target that is not a loopback address")
	fs.StringVar(&c.mix, "mix", "dtls-cid", "datagram shapes and weights: `dtls-cid=N,dtls-hello=N,quic-short=N`")
	fs.IntVar(&c.shapes.size, "size", 121, "datagram size in bytes, headers and the 24-byte stamp included")
	fs.IntVar(&c.shapes.dtlsCIDLen, "cid-len", 8, "DTLS connection ID length (ordinal-first)")
	fs.IntVar(&c.shapes.quicCIDLen, "quic-cid-len", 12, "QUIC server connection ID length (QUIC-LB plaintext)")
	ords := fs.String("ordinals", "0", "backend ordinals the clients' CIDs carry, spread over clients: `0,1,2` or 0-2")
	fs.IntVar(&c.clients, "clients", 64, "distinct client addresses")
	fs.IntVar(&c.sockets, "sockets", 1, "client sockets; clients beyond this many get their own 127.1.x.y source address")
	rate := fs.Uint64("rate", 0, "offered datagrams per second over all clients; 0 sends flat out with -window in flight")
	fs.IntVar(&c.window, "window", 256, "flat out: datagrams in flight per socket")
	fs.BoolVar(&c.open, "open", false, "flat out in an open loop: every socket's sender sends as fast as it can, whatever comes back (-sockets senders in parallel)")
	fs.IntVar(&c.batch, "batch", udpio.DefaultBatch, "datagrams per sendmmsg/recvmmsg")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "sending before the measured window (not counted)")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "measured window; loadgen stops by itself after warmup+duration+drain")
	fs.DurationVar(&c.drain, "drain", 500*time.Millisecond, "longest wait for replies after the last send")
	fs.IntVar(&c.recvBuffer, "rcvbuf", 8<<20, "SO_RCVBUF/SO_SNDBUF of the client sockets in bytes")
	fs.IntVar(&c.watchPID, "watch-pid", 0, "forwarder `pid` whose CPU, RSS and fds to sample over the window")
	fs.StringVar(&c.metricsURL, "watch-allocs", "", "forwarder's `url` /debug/pprof/heap?debug=1 (or Prometheus /metrics): heap objects allocated over the window")
	fs.BoolVar(&c.jsonOut, "json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("loadgen: unexpected arguments %q", fs.Args())
	}
	c.rate = *rate
	ap, err := resolve(*target)
	if err != nil {
		return c, err
	}
	c.target = ap
	if err := c.validate(*ords); err != nil {
		return c, err
	}
	return c, nil
}

func resolve(s string) (netip.AddrPort, error) {
	ua, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("loadgen: target: %w", err)
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func (c *config) validate(ords string) error {
	if err := checkTarget(c.target, c.allowRemote); err != nil {
		return err
	}
	var err error
	if c.pattern, err = parseMix(c.mix); err != nil {
		return err
	}
	if err := c.shapes.validate(c.pattern); err != nil {
		return err
	}
	if c.ordinals, err = parseOrdinals(ords); err != nil {
		return err
	}
	switch {
	case c.sockets < 1 || c.sockets > 1024:
		return fmt.Errorf("loadgen: -sockets %d: want 1..1024", c.sockets)
	case c.clients < c.sockets || c.clients > 1<<20:
		return fmt.Errorf("loadgen: -clients %d: want -sockets..%d", c.clients, 1<<20)
	case c.batch < 1 || c.batch > 1024:
		return fmt.Errorf("loadgen: -batch %d: want 1..1024", c.batch)
	case c.window < 1:
		return fmt.Errorf("loadgen: -window %d: want ≥ 1", c.window)
	case c.open && c.rate > 0:
		return errors.New("loadgen: -open sends flat out: leave -rate at 0 (with -rate the load is open loop already)")
	case c.warmup < 0 || c.duration <= 0 || c.drain < 0:
		return errors.New("loadgen: -warmup and -drain must be ≥ 0, -duration > 0")
	}
	if c.clients > c.sockets {
		if _, ok := clientSource(c.target.Addr(), c.clients-1, c.sockets); !ok {
			return errClientAddrs
		}
	}
	return nil
}

// A Result is one run's report; -json prints it.
type Result struct {
	Target     string  `json:"target"`
	Mix        string  `json:"mix"`
	Size       int     `json:"size"`
	Clients    int     `json:"clients"`
	Sockets    int     `json:"sockets"`
	Rate       uint64  `json:"rate"` // requested; 0 = flat out
	Open       bool    `json:"open"` // flat out in an open loop
	WindowSecs float64 `json:"window_s"`

	// Counted over the measured window: datagrams sent in it, and those
	// of them that came back before the drain ended.
	Sent       uint64  `json:"sent"`
	Received   uint64  `json:"received"`
	Lost       uint64  `json:"lost"`
	LossRatio  float64 `json:"loss_ratio"`
	OfferedPPS float64 `json:"offered_pps"`
	// ReceivedPPS is round trips per second: each one is two datagrams
	// through the forwarder.
	ReceivedPPS float64 `json:"received_pps"`
	SendErrors  uint64  `json:"send_errors"`
	Foreign     uint64  `json:"foreign"` // received datagrams without this run's stamp

	RTT RTT `json:"rtt_us"`

	Watch *Watch `json:"watch,omitempty"`
}

// RTT holds round-trip times in microseconds.
type RTT struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Watch is what the watched forwarder spent over the window.
type Watch struct {
	PID        int     `json:"pid"`
	UserSecs   float64 `json:"user_s"`
	SystemSecs float64 `json:"system_s"`
	RSSKB      int64   `json:"rss_kb"` // at the end of the window
	FDs        int     `json:"fds"`    // at the end of the window
	// Mallocs is heap objects allocated in the window (-watch-allocs),
	// -1 when not measured.
	Mallocs float64 `json:"mallocs"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(cmd(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// cmd is main without the process, for tests.
func cmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, err)
		return 2
	}
	// One P for the senders and one more that wakes for replies, even when
	// pinned to one CPU: a sender running flat out would otherwise keep the
	// receivers off the only P until the scheduler preempts it.
	if runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
	res, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if cfg.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(res)
	} else {
		res.print(stdout)
	}
	return 0
}

func (r *Result) print(w io.Writer) {
	rate := "flat out"
	if r.Open {
		rate = "flat out, open loop"
	}
	if r.Rate > 0 {
		rate = fmt.Sprintf("%d/s", r.Rate)
	}
	fmt.Fprintf(w, "target %s, %s, %d-byte datagrams (%s), %d clients on %d sockets, %.1fs window\n",
		r.Target, rate, r.Size, r.Mix, r.Clients, r.Sockets, r.WindowSecs)
	fmt.Fprintf(w, "offered %.0f/s, received %.0f/s, sent %d, received %d, lost %d (%.3f%%), send errors %d, foreign %d\n",
		r.OfferedPPS, r.ReceivedPPS, r.Sent, r.Received, r.Lost, 100*r.LossRatio, r.SendErrors, r.Foreign)
	fmt.Fprintf(w, "rtt µs: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f  mean %.1f\n",
		r.RTT.P50, r.RTT.P90, r.RTT.P99, r.RTT.P999, r.RTT.Max, r.RTT.Mean)
	if x := r.Watch; x != nil {
		fmt.Fprintf(w, "pid %d: user %.2fs system %.2fs, rss %d KiB, %d fds", x.PID, x.UserSecs, x.SystemSecs, x.RSSKB, x.FDs)
		if x.Mallocs >= 0 {
			fmt.Fprintf(w, ", %.0f heap objects", x.Mallocs)
		}
		fmt.Fprintln(w)
	}
}

// A client is one source address with its datagram templates.
type client struct {
	src  netip.Addr // zero: the socket's own address
	tmpl [numShapes][]byte
}

// A sock is one client socket: its sender, its receiver and their state.
type sock struct {
	conn    *net.UDPConn
	io      *udpio.Conn
	clients []client

	// Sender side.
	out     []udpio.Message
	outBuf  []byte
	sent    uint64 // accepted by the kernel, whole run
	sentWin uint64
	sendErr uint64

	// Receiver side.
	in       []udpio.Message
	received atomic.Uint64 // stamped replies, whole run (read by the sender)
	recvWin  uint64
	foreign  uint64
	hist     *histogram
	wake     chan struct{} // a reply arrived (flat out waits on it)
}

// run sends for warmup+duration, waits for replies up to drain, and
// reports the measured window.
func run(ctx context.Context, cfg config) (*Result, error) {
	runID := rand.Uint32()
	socks, err := openSockets(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range socks {
			s.conn.Close()
		}
	}()
	w := &watcher{pid: cfg.watchPID, metricsURL: cfg.metricsURL}

	start := time.Now()
	clock := func() int64 { return int64(time.Since(start)) }
	warm, end := int64(cfg.warmup), int64(cfg.warmup+cfg.duration)

	var recvWG, sendWG sync.WaitGroup
	for _, s := range socks {
		recvWG.Go(func() { s.receive(runID, clock, warm, end) })
	}
	var perSock pacer
	if cfg.rate > 0 {
		perSock = pacer{rate: max(1, cfg.rate/uint64(len(socks)))}
	}
	for i, s := range socks {
		p := perSock
		if cfg.rate > 0 && i == 0 {
			p.rate += cfg.rate % uint64(len(socks)) // the remainder, so the sum is rate
		}
		sendWG.Go(func() { s.send(ctx, cfg, runID, p, clock, warm, end) })
	}

	// Sample the forwarder at the edges of the window.
	var werr error
	sleepUntil(ctx, start.Add(cfg.warmup))
	werr = w.begin()
	sleepUntil(ctx, start.Add(cfg.warmup+cfg.duration))
	if werr == nil {
		werr = w.finish()
	}
	sendWG.Wait()

	// Drain: stop as soon as every sent datagram came back.
	deadline := time.Now().Add(cfg.drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		missing := false
		for _, s := range socks {
			if s.received.Load() < s.sent {
				missing = true
			}
		}
		if !missing {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, s := range socks {
		s.conn.SetReadDeadline(time.Unix(1, 0))
	}
	recvWG.Wait()
	if werr != nil {
		return nil, werr
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	return report(cfg, socks, w), nil
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

func openSockets(cfg config) ([]*sock, error) {
	network, laddr := "udp4", "127.0.0.1:0"
	switch {
	case cfg.target.Addr().Is6():
		network, laddr = "udp6", "[::1]:0"
	case cfg.clients > cfg.sockets:
		laddr = "0.0.0.0:0" // replies come to every client's 127.1.x.y
	case !cfg.target.Addr().IsLoopback():
		laddr = "0.0.0.0:0"
	}
	if cfg.target.Addr().Is6() && !cfg.target.Addr().IsLoopback() {
		laddr = "[::]:0"
	}
	var socks []*sock
	fail := func(err error) ([]*sock, error) {
		for _, s := range socks {
			s.conn.Close()
		}
		return nil, err
	}
	for range cfg.sockets {
		g, err := udpio.ListenGroup(network, laddr, 1, udpio.ListenConfig{RecvBuffer: cfg.recvBuffer, SendBuffer: cfg.recvBuffer})
		if err != nil {
			return fail(err)
		}
		c, err := udpio.NewConn(g[0], cfg.batch)
		if err != nil {
			g[0].Close()
			return fail(err)
		}
		s := &sock{conn: g[0], io: c, hist: new(histogram), wake: make(chan struct{}, 1),
			out: make([]udpio.Message, cfg.batch), outBuf: make([]byte, cfg.batch*cfg.shapes.size),
			in: make([]udpio.Message, cfg.batch)}
		inBuf := make([]byte, cfg.batch*maxDatagram)
		for i := range s.in {
			s.in[i].Buf = inBuf[i*maxDatagram : (i+1)*maxDatagram : (i+1)*maxDatagram]
		}
		socks = append(socks, s)
	}
	for i := range cfg.clients {
		var cl client
		if cfg.clients > cfg.sockets {
			cl.src, _ = clientSource(cfg.target.Addr(), i, cfg.sockets)
		}
		ord := cfg.ordinals[i%len(cfg.ordinals)]
		for sh := range numShapes {
			t, err := cfg.shapes.template(sh, ord)
			if err != nil {
				return fail(err)
			}
			cl.tmpl[sh] = t
		}
		s := socks[i%len(socks)]
		s.clients = append(s.clients, cl)
	}
	return socks, nil
}

// send runs one socket's sender until the window ends: paced at p.rate,
// flat out with at most cfg.window datagrams in flight, or flat out
// whatever comes back (cfg.open).
func (s *sock) send(ctx context.Context, cfg config, run uint32, p pacer, clock func() int64, warm, end int64) {
	var seq uint64 // datagrams tried: the pacer's count
	next := 0      // next client
	var writtenOff uint64
	size := cfg.shapes.size
	for ctx.Err() == nil {
		now := clock()
		if now >= end {
			return
		}
		n := cfg.batch
		if p.rate > 0 {
			var wait time.Duration
			if n, wait = p.next(time.Duration(now), seq, cfg.batch); n == 0 {
				time.Sleep(min(wait, time.Duration(end-now)))
				continue
			}
		} else if !cfg.open {
			// Flat out, closed loop: wait for replies when the window is
			// full; after 50 ms without one, count what is out as lost.
			inflight := int(s.sent - s.received.Load() - writtenOff)
			if room := cfg.window - inflight; room < n {
				if room <= 0 {
					select {
					case <-s.wake:
					case <-time.After(50 * time.Millisecond):
						writtenOff = s.sent - s.received.Load()
					}
					continue
				}
				n = room
			}
		}
		for j := range n {
			cl := &s.clients[next]
			if next++; next == len(s.clients) {
				next = 0
			}
			t := cl.tmpl[cfg.pattern[seq%uint64(len(cfg.pattern))]]
			b := s.outBuf[j*size : j*size+len(t)]
			copy(b, t)
			putStamp(b, run, seq, now)
			seq++
			s.out[j] = udpio.Message{Buf: b, Addr: cfg.target, Local: cl.src}
		}
		if _, err := s.io.WriteBatch(s.out[:n]); err != nil {
			return // socket closed
		}
		for j := range n {
			if s.out[j].Err != nil {
				s.sendErr++
				continue
			}
			s.sent++
			if now >= warm {
				s.sentWin++
			}
		}
	}
}

// receive counts replies until the read deadline ends it.
func (s *sock) receive(run uint32, clock func() int64, warm, end int64) {
	for {
		n, err := s.io.ReadBatch(s.in)
		if err != nil {
			return
		}
		now := clock()
		ok := 0
		for i := range n {
			m := &s.in[i]
			_, sent, good := readStamp(m.Buf[:m.N], run)
			if !good || m.Err != nil {
				s.foreign++
				continue
			}
			ok++
			if sent >= warm && sent < end {
				s.recvWin++
				s.hist.record(now - sent)
			}
		}
		s.received.Add(uint64(ok))
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func report(cfg config, socks []*sock, w *watcher) *Result {
	r := &Result{Target: cfg.target.String(), Mix: cfg.mix, Size: cfg.shapes.size, Clients: cfg.clients,
		Sockets: cfg.sockets, Rate: cfg.rate, Open: cfg.open, WindowSecs: cfg.duration.Seconds()}
	var h histogram
	for _, s := range socks {
		r.Sent += s.sentWin
		r.Received += s.recvWin
		r.SendErrors += s.sendErr
		r.Foreign += s.foreign
		h.merge(s.hist)
	}
	if r.Sent > r.Received {
		r.Lost = r.Sent - r.Received
	}
	if r.Sent > 0 {
		r.LossRatio = float64(r.Lost) / float64(r.Sent)
	}
	r.OfferedPPS = float64(r.Sent) / r.WindowSecs
	r.ReceivedPPS = float64(r.Received) / r.WindowSecs
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	r.RTT = RTT{P50: us(h.quantile(0.5)), P90: us(h.quantile(0.9)), P99: us(h.quantile(0.99)),
		P999: us(h.quantile(0.999)), Max: us(h.max), Mean: h.mean() / 1e3}
	if w.haveProc || w.haveAlloc {
		x := &Watch{PID: w.pid, Mallocs: -1}
		if w.haveProc {
			x.UserSecs = (w.end.user - w.start.user).Seconds()
			x.SystemSecs = (w.end.system - w.start.system).Seconds()
			x.RSSKB, x.FDs = w.end.rssKB, w.end.fds
		}
		if w.haveAlloc {
			x.Mallocs = w.mallocs()
		}
		r.Watch = x
	}
	return r
}
