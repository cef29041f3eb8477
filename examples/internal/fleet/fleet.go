// Package fleet runs an LwM2M-shaped fleet through cidroute: LwM2M
// registration servers (package lwm2m) behind cidproxy replicas
// (package proxyapp, in this process), and simulated devices, each a
// pion/dtls v3 session with a connection ID carrying CoAP (go-coap v3),
// that register, update at a fraction of their lifetime, answer the
// server's observation with confirmable notifications, and sleep in
// queue mode, waking on a new source port (a NAT rebinding) with the same
// DTLS session. Disruptions (a rolling restart of the servers or of the
// proxies, a proxy replica killed) run in the middle, and the Result
// counts what the devices and the servers saw.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"

	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/examples/internal/lwm2m"
)

// Disruption names what happens in the middle of a run.
type Disruption string

// The disruptions.
const (
	None          Disruption = ""
	ServerRestart Disruption = "server-restart" // every server in turn: drain, stop, start again
	ServerKill    Disruption = "server-kill"    // every server in turn: killed (no close_notify), started again
	ProxyRestart  Disruption = "proxy-restart"  // every proxy replica in turn: a new instance takes its sockets over
	ProxyKill     Disruption = "proxy-kill"     // one proxy replica stops; the load balancer notices after LBDetect
)

// Config configures a run. The zero value of a field means its default.
type Config struct {
	Devices  int           // 0 = 100
	Servers  int           // LwM2M server replicas (0 = 3)
	Proxies  int           // cidproxy replicas (0 = 2)
	Duration time.Duration // of the run after the last device started (0 = 2 minutes)
	// Lifetime is the registrations' lifetime (0 = 60 s), and
	// UpdateFraction the part of it after which a device updates (0 =
	// 0.5): a device wakes every Lifetime×UpdateFraction.
	Lifetime       time.Duration
	UpdateFraction float64
	// NoRebind keeps a device's source port across sleeps (default: a
	// new port, and so possibly another proxy replica, on every wake).
	NoRebind bool
	// RebindOnSleep moves a device to its new port when it falls asleep
	// instead of when it wakes: whatever the server sends while it sleeps
	// (a drain's close_notify) goes to the old mapping and is lost, as for
	// a device whose radio is off.
	RebindOnSleep bool
	// Ramp is the rate at which devices start (0 = 200 a second).
	Ramp float64
	// ACKTimeout and MaxRetransmit are CoAP's transmission parameters
	// for devices and servers (0 = RFC 7252's 2 s and 4).
	ACKTimeout    time.Duration
	MaxRetransmit int
	// HandshakeTimeout bounds one DTLS handshake (0 = 15 s).
	HandshakeTimeout time.Duration
	// RouteIdle is the servers' PPv2 route lifetime (0 = the adapter's
	// default, 5 minutes).
	RouteIdle time.Duration
	// Disruption happens DisruptAt into the run (0 = a third of
	// Duration); DrainTimeout is a restarted server's drain (0 = 2 s),
	// Pause the time between two replicas' restarts (0 = 5 s), LBDetect
	// how long the load balancer takes to see a killed replica (0 = 2 s).
	Disruption   Disruption
	DisruptAt    time.Duration
	DrainTimeout time.Duration
	Pause        time.Duration
	LBDetect     time.Duration
	// Progress, when set, receives a line every ProgressEvery (0 = 5 s).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Log receives the proxies' warnings (nil: discarded).
	Log io.Writer

	// Connect, when set, are the addresses of proxy replicas already
	// running (with their servers): the run starts only the devices, and
	// takes the servers' counters from ServerStats (lwm2m-server's -http
	// /stats URLs). No disruption then.
	Connect     []netip.AddrPort
	ServerStats []string
	// RSSPIDs are processes whose resident memory is sampled before the
	// devices start and when the run ends, for Result.RSS (Linux).
	RSSPIDs []int
}

func (c *Config) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Devices, 100)
	def(&c.Servers, 3)
	def(&c.Proxies, 2)
	def(&c.MaxRetransmit, 4)
	defd(&c.Duration, 2*time.Minute)
	defd(&c.Lifetime, time.Minute)
	defd(&c.ACKTimeout, 2*time.Second)
	defd(&c.HandshakeTimeout, 15*time.Second)
	defd(&c.DrainTimeout, 2*time.Second)
	defd(&c.Pause, 5*time.Second)
	defd(&c.LBDetect, 2*time.Second)
	defd(&c.ProgressEvery, 5*time.Second)
	defd(&c.DisruptAt, c.Duration/3)
	if c.UpdateFraction == 0 {
		c.UpdateFraction = 0.5
	}
	if c.Ramp == 0 {
		c.Ramp = 200
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	switch {
	case c.Devices < 1 || c.Servers < 1 || c.Servers > 255 || c.Proxies < 1:
		return fmt.Errorf("fleet: %d devices, %d servers, %d proxies: want at least one of each (at most 255 servers)", c.Devices, c.Servers, c.Proxies)
	case c.UpdateFraction <= 0 || c.UpdateFraction >= 1:
		return fmt.Errorf("fleet: update fraction %v: want between 0 and 1", c.UpdateFraction)
	case c.Lifetime < 2*time.Second || c.Lifetime%time.Second != 0:
		return fmt.Errorf("fleet: lifetime %v: want whole seconds, at least 2", c.Lifetime)
	case len(c.Connect) > 0 && c.Disruption != None:
		return errors.New("fleet: disruptions need the servers and proxies this process starts, not -connect")
	case c.Disruption == ProxyKill && c.Proxies < 2:
		return errors.New("fleet: killing a proxy replica needs at least two")
	case c.Disruption != None && c.Disruption != ServerRestart && c.Disruption != ServerKill && c.Disruption != ProxyRestart && c.Disruption != ProxyKill:
		return fmt.Errorf("fleet: unknown disruption %q", c.Disruption)
	}
	return nil
}

// counters are what the devices count, together.
type counters struct {
	registered      atomic.Int64  // devices registered now
	firstRegs       atomic.Uint64 // devices whose first registration succeeded
	regs, regFailed atomic.Uint64 // registrations answered 2.01, and not
	handshakes      atomic.Uint64 // completed
	hsFailed        atomic.Uint64 // handshakes that failed (timed out or refused)
	updates         atomic.Uint64 // answered 2.04
	updNotFound     atomic.Uint64 // answered 4.04: the server lost the registration
	updFailed       atomic.Uint64 // not answered: the session is gone
	closedByServer  atomic.Uint64 // sessions the server ended (close_notify)
	wakes           atomic.Uint64 // wakes on a new source port
	survived        atomic.Uint64 // of which updated in the same session
	notifSent       atomic.Uint64
	notifAcked      atomic.Uint64
	notifLost       atomic.Uint64 // not acknowledged within the exchange lifetime
	notObserved     atomic.Uint64 // wakes without an observation to notify
	sent, received  atomic.Uint64 // datagrams
	recoveries      atomic.Uint64
	// datagrams by DTLS content type (byte 0): 20 CCS, 21 alert, 22
	// handshake, 23 application data, 25 tls12_cid
	sentType, recvType [32]atomic.Uint64

	mu       sync.Mutex
	rtts     []time.Duration // update round trips
	regRTTs  []time.Duration
	recovery []time.Duration // from the first failed exchange to the registration again
}

func (c *counters) add(list *[]time.Duration, d time.Duration) {
	c.mu.Lock()
	*list = append(*list, d)
	c.mu.Unlock()
}

// A Result is what a run measured.
type Result struct {
	Config    Config
	Started   time.Duration // until every device had started
	Elapsed   time.Duration
	Devices   int
	Disrupted []string // what the disruption did, when
	Servers   []lwm2m.Stats

	FirstRegistered, Registrations, RegFailed uint64
	Registered                                int64
	Handshakes, HandshakesFailed              uint64
	Updates, UpdNotFound, UpdFailed           uint64
	ClosedByServer                            uint64
	Wakes, Survived                           uint64
	NotifSent, NotifAcked, NotifLost          uint64
	NotObserved                               uint64
	Sent, Received                            uint64
	UpdateRTT, RegisterRTT, Recovery          []time.Duration // sorted
	RSS                                       []RSS
}

// RSS is the resident memory of one process (Config.RSSPIDs) before the
// devices started and at the end of the run.
type RSS struct {
	PID           int
	Name          string
	Before, After int64 // bytes
}

// Run starts the topology and the devices, runs cfg.Duration after the
// last device started, and returns what happened.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	var top *topology
	var err error
	if len(cfg.Connect) > 0 {
		top = externalTopology(&cfg)
	} else if top, err = startTopology(&cfg); err != nil {
		return nil, err
	}
	defer top.close()
	rssBefore := sampleRSS(cfg.RSSPIDs)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	c := &counters{}
	runner := periodic.New(runCtx.Done(), 200*time.Millisecond)
	begin := time.Now()
	period := time.Duration(float64(cfg.Lifetime) * cfg.UpdateFraction)
	rampEnd := time.Duration(float64(cfg.Devices) / cfg.Ramp * float64(time.Second))
	end := begin.Add(rampEnd + cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Devices {
		d := &device{id: i, cfg: &cfg, top: top, c: c, runner: runner, period: period,
			start: begin.Add(time.Duration(float64(i) / cfg.Ramp * float64(time.Second)))}
		wg.Go(func() { d.run(runCtx, end) })
	}
	res := &Result{Config: cfg, Devices: cfg.Devices, Started: rampEnd}

	var dwg sync.WaitGroup
	if cfg.Disruption != None {
		at := begin.Add(rampEnd + cfg.DisruptAt)
		dwg.Go(func() { res.Disrupted = disrupt(runCtx, &cfg, top, at, begin) })
	}
	if cfg.Progress != nil {
		dwg.Go(func() { progress(runCtx, &cfg, c, top, begin, end) })
	}
	select {
	case <-time.After(time.Until(end)):
	case <-ctx.Done():
	}
	res.Servers = top.serverStats() // before the devices close their sessions
	res.RSS = rssDelta(cfg.RSSPIDs, rssBefore, sampleRSS(cfg.RSSPIDs))
	stop()
	wg.Wait()
	dwg.Wait()
	res.Elapsed = time.Since(begin)
	c.fill(res)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

func (c *counters) fill(r *Result) {
	r.FirstRegistered, r.Registrations, r.RegFailed = c.firstRegs.Load(), c.regs.Load(), c.regFailed.Load()
	r.Registered = c.registered.Load()
	r.Handshakes, r.HandshakesFailed = c.handshakes.Load(), c.hsFailed.Load()
	r.Updates, r.UpdNotFound, r.UpdFailed = c.updates.Load(), c.updNotFound.Load(), c.updFailed.Load()
	r.ClosedByServer = c.closedByServer.Load()
	r.Wakes, r.Survived = c.wakes.Load(), c.survived.Load()
	r.NotifSent, r.NotifAcked, r.NotifLost, r.NotObserved = c.notifSent.Load(), c.notifAcked.Load(), c.notifLost.Load(), c.notObserved.Load()
	r.Sent, r.Received = c.sent.Load(), c.received.Load()
	c.mu.Lock()
	r.UpdateRTT, r.RegisterRTT, r.Recovery = slices.Clone(c.rtts), slices.Clone(c.regRTTs), slices.Clone(c.recovery)
	c.mu.Unlock()
	slices.Sort(r.UpdateRTT)
	slices.Sort(r.RegisterRTT)
	slices.Sort(r.Recovery)
}

// disrupt runs cfg.Disruption at at, and returns what it did.
func disrupt(ctx context.Context, cfg *Config, t *topology, at, begin time.Time) []string {
	var log []string
	note := func(f string, a ...any) {
		log = append(log, fmt.Sprintf("%6.1fs ", time.Since(begin).Seconds())+fmt.Sprintf(f, a...))
	}
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if !wait(time.Until(at)) {
		return log
	}
	switch cfg.Disruption {
	case ServerRestart, ServerKill:
		for i, s := range t.servers {
			if i > 0 && !wait(cfg.Pause) {
				return log
			}
			if cfg.Disruption == ServerKill {
				note("server %d: killed", s.ordinal)
				s.stop(-1)
			} else {
				note("server %d: drain (%v), stop", s.ordinal, cfg.DrainTimeout)
				s.stop(cfg.DrainTimeout)
			}
			if err := s.start(); err != nil {
				note("server %d: restart failed: %v", s.ordinal, err)
				return log
			}
			note("server %d: started again", s.ordinal)
			if !wait(probeWait) {
				return log
			}
		}
	case ProxyRestart:
		for i, p := range t.proxies {
			if i > 0 && !wait(cfg.Pause) {
				return log
			}
			note("proxy %d: new instance, handover", i)
			if err := p.restart(); err != nil {
				note("proxy %d: %v", i, err)
				return log
			}
			note("proxy %d: handed over", i)
		}
	case ProxyKill:
		p := t.proxies[len(t.proxies)-1]
		note("proxy %d: killed", len(t.proxies)-1)
		p.kill()
		if !wait(cfg.LBDetect) {
			return log
		}
		t.lb.remove(p.addr)
		note("load balancer: proxy %d out", len(t.proxies)-1)
	}
	return log
}

func progress(ctx context.Context, cfg *Config, c *counters, t *topology, begin, end time.Time) {
	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	var lastSent, lastRecv uint64
	last := begin
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s, r := c.sent.Load(), c.received.Load()
			rate := float64(s+r-lastSent-lastRecv) / now.Sub(last).Seconds()
			lastSent, lastRecv, last = s, r, now
			fmt.Fprintf(cfg.Progress, "%5.0fs/%.0fs  registered %d/%d  updates %d (4.04 %d, unanswered %d)  notifications %d/%d  handshakes %d (failed %d)  %.0f datagrams/s\n",
				now.Sub(begin).Seconds(), end.Sub(begin).Seconds(), c.registered.Load(), cfg.Devices,
				c.updates.Load(), c.updNotFound.Load(), c.updFailed.Load(), c.notifAcked.Load(), c.notifSent.Load(),
				c.handshakes.Load(), c.hsFailed.Load(), rate)
			if os.Getenv("FLEET_DEBUG") != "" {
				fmt.Fprintf(cfg.Progress, "  sent by type: alert %d handshake %d appdata %d cid %d; received: alert %d handshake %d appdata %d cid %d\n",
					c.sentType[21].Load(), c.sentType[22].Load(), c.sentType[23].Load(), c.sentType[25].Load(),
					c.recvType[21].Load(), c.recvType[22].Load(), c.recvType[23].Load(), c.recvType[25].Load())
			}
		}
	}
}

// A device is one simulated LwM2M client.
type device struct {
	id     int
	cfg    *Config
	top    *topology
	c      *counters
	runner periodic.Func
	period time.Duration
	start  time.Time

	sock *natConn
	dev  *lwm2m.Device
	reg  bool // registered now
	ever bool // registered once
}

func (d *device) run(ctx context.Context, end time.Time) {
	defer d.close()
	if !sleepUntil(ctx, d.start) {
		return
	}
	var failedAt time.Time // the first exchange that failed, until registered again
	first := true
	for ctx.Err() == nil {
		if d.dev == nil || !d.reg {
			if failedAt.IsZero() && d.ever {
				failedAt = time.Now()
			}
			if !d.connectAndRegister(ctx) {
				if !sleepUntil(ctx, time.Now().Add(time.Second+rand.N(time.Second))) {
					return
				}
				continue
			}
			if !failedAt.IsZero() {
				d.c.add(&d.c.recovery, time.Since(failedAt))
				d.c.recoveries.Add(1)
				failedAt = time.Time{}
			}
			// The server observes the device after registering it.
			select {
			case <-d.dev.Observed():
				d.notify(ctx)
			case <-time.After(d.dev.ExchangeLifetime()):
			case <-ctx.Done():
				return
			}
		}
		// Queue mode: asleep until the next update is due. The first
		// sleep is shortened at random, so that a fleet started in a few
		// seconds spreads its updates over the period.
		nap := d.period
		if first {
			nap = d.period/2 + rand.N(d.period/2)
			first = false
		}
		asleepRebound := false
		if !d.cfg.NoRebind && d.cfg.RebindOnSleep {
			asleepRebound = d.sock.rebind() == nil
		}
		if !sleepUntil(ctx, time.Now().Add(nap)) {
			return
		}
		select {
		case <-d.dev.Done(): // the server ended the session while the device slept
			d.c.closedByServer.Add(1)
			d.lost()
			failedAt = time.Now()
			continue
		default:
		}
		rebound := asleepRebound
		if !d.cfg.NoRebind && !d.cfg.RebindOnSleep {
			if err := d.sock.rebind(); err != nil {
				continue
			}
			rebound = true
		}
		t0 := time.Now()
		err := d.dev.Update(ctx)
		if rebound && ctx.Err() == nil {
			d.c.wakes.Add(1)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			d.c.updates.Add(1)
			d.c.add(&d.c.rtts, time.Since(t0))
			if rebound {
				d.c.survived.Add(1)
			}
			d.notify(ctx)
		case errors.Is(err, lwm2m.ErrNotFound):
			d.c.updNotFound.Add(1)
			failedAt = t0
			d.reg = false
			d.c.registered.Add(-1)
			// The session works: register on it again.
			if d.register(ctx) {
				d.c.add(&d.c.recovery, time.Since(failedAt))
				d.c.recoveries.Add(1)
				failedAt = time.Time{}
			}
		default:
			d.c.updFailed.Add(1)
			failedAt = t0
			d.lost()
		}
	}
}

// lost ends a session that no longer works.
func (d *device) lost() {
	if d.reg {
		d.c.registered.Add(-1)
	}
	d.reg = false
	d.close()
}

func (d *device) close() {
	if d.dev != nil {
		d.dev.Close()
		d.dev = nil
	} else if d.sock != nil {
		d.sock.Close()
	}
	d.sock = nil
}

func (d *device) notify(ctx context.Context) {
	d.c.notifSent.Add(1)
	err := d.dev.Notify(ctx)
	switch {
	case err == nil:
		d.c.notifAcked.Add(1)
	case errors.Is(err, lwm2m.ErrNotObserved):
		d.c.notifSent.Add(^uint64(0))
		d.c.notObserved.Add(1)
	case ctx.Err() == nil:
		d.c.notifLost.Add(1)
	default:
		d.c.notifSent.Add(^uint64(0))
	}
}

// connectAndRegister opens a new socket and session and registers.
func (d *device) connectAndRegister(ctx context.Context) bool {
	d.close()
	sock, err := newNATConn(d.top, d.c)
	if err != nil {
		return false
	}
	d.sock = sock
	ep := fmt.Sprintf("fleet-%05d", d.id)
	pc, err := pion.Client(sock, net.UDPAddrFromAddrPort(d.top.public), lwm2m.ClientConfig(psk, ep))
	if err != nil {
		return false
	}
	hctx, cancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	err = pc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		pc.Close()
		if ctx.Err() == nil {
			d.c.hsFailed.Add(1)
		}
		return false
	}
	d.c.handshakes.Add(1)
	d.dev = lwm2m.NewDevice(pc, lwm2m.DeviceConfig{Endpoint: ep, Lifetime: d.cfg.Lifetime,
		ACKTimeout: d.cfg.ACKTimeout, MaxRetransmit: d.cfg.MaxRetransmit, Runner: d.runner})
	return d.register(ctx)
}

func (d *device) register(ctx context.Context) bool {
	t0 := time.Now()
	if err := d.dev.Register(ctx); err != nil {
		if ctx.Err() == nil {
			d.c.regFailed.Add(1)
		}
		return false
	}
	d.c.regs.Add(1)
	d.c.add(&d.c.regRTTs, time.Since(t0))
	if !d.ever {
		d.c.firstRegs.Add(1)
		d.ever = true
	}
	d.reg = true
	d.c.registered.Add(1)
	return true
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// natConn is a device's socket behind a NAT: a RebindConn (a new source
// port on every rebind, the same session on top) whose datagrams go to
// the proxy replica the load balancer picks for its current address, and
// which counts datagrams.
type natConn struct {
	*cidroutetest.RebindConn
	top *topology
	c   *counters
}

func newNATConn(t *topology, c *counters) (*natConn, error) {
	rc, err := cidroutetest.ListenRebind(t.lb.pick(netip.AddrPort{}), net.UDPAddrFromAddrPort(t.public))
	if err != nil {
		return nil, err
	}
	n := &natConn{RebindConn: rc, top: t, c: c}
	rc.Retarget(t.lb.pick(rc.Local()))
	return n, nil
}

func (n *natConn) rebind() error {
	if err := n.Rebind(n.Target()); err != nil {
		return err
	}
	n.Retarget(n.top.lb.pick(n.Local()))
	return nil
}

func (n *natConn) ReadFrom(b []byte) (int, net.Addr, error) {
	k, a, err := n.RebindConn.ReadFrom(b)
	if err == nil {
		n.c.received.Add(1)
		if k > 0 {
			n.c.recvType[b[0]%32].Add(1)
		}
	}
	return k, a, err
}

func (n *natConn) WriteTo(b []byte, a net.Addr) (int, error) {
	// The load balancer's choice for this address, which changes when it
	// takes a replica out.
	if to := n.top.lb.pick(n.Local()); to != n.Target() {
		n.Retarget(to)
	}
	n.c.sent.Add(1)
	if len(b) > 0 {
		n.c.sentType[b[0]%32].Add(1)
	}
	return n.RebindConn.WriteTo(b, a)
}
