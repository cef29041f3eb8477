package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Config configures a Chooser. Resolve and Probe are required; the zero
// value of every other field means its default.
type Config struct {
	// Resolve returns the candidates (see LookupHost, Static).
	Resolve ResolveFunc
	// Probe is a full handshake through one edge.
	Probe ProbeFunc
	// ProbeTimeout is each probe's own budget (0 = 5 s). Probes run in
	// parallel, so a measurement takes at most this long.
	ProbeTimeout time.Duration
	// Interval is the period of watch rounds while the session is not on
	// the best edge, with full jitter: each wait is uniform in
	// [0, Interval), so that a fleet's probes do not synchronize (0 = 5
	// minutes).
	Interval time.Duration
	// MaxAge is the age at which a ranking is measured again in full (0 =
	// 1 hour).
	MaxAge time.Duration
	// MinGain and MinGainPercent are the two thresholds a candidate must
	// both beat the current edge's round-trip time by (0 = 20 ms, 25 %).
	MinGain        time.Duration
	MinGainPercent int // see MinGain
	// Streak is the number of rounds in a row a candidate must win (0 = 2):
	// one good probe may be an edge that has just restarted.
	Streak int
	// Store persists the ranking (nil: memory only).
	Store Store
	// Clock schedules watch rounds and stamps rankings (nil: the system
	// clock).
	Clock Clock
	// Rand draws the jitter (nil: math/rand/v2's global source).
	Rand *rand.Rand
	// Logger receives switches, fallbacks and store errors at Info and
	// Warn, probes at Debug (nil: slog.Default()).
	Logger *slog.Logger
	// OnEvent, when set, receives every Event, synchronously, possibly
	// from several goroutines at once. It must not call the Chooser.
	OnEvent func(Event)
}

// Sentinel errors; test with errors.Is.
var (
	// ErrConfig is wrapped when a Config cannot work.
	ErrConfig = errors.New("edge: invalid configuration")
	// ErrNoEdge is wrapped when there is no address to use, or none
	// connected.
	ErrNoEdge = errors.New("edge: no edge address")
	// ErrInUse is returned by Connect while the Chooser follows a session:
	// Release it first.
	ErrInUse = errors.New("edge: the chooser's session is still open")
)

// A SwitchFunc moves the session to sw.To. An error leaves it where it is.
type SwitchFunc func(ctx context.Context, sw Switch) error

// A Chooser ranks a service's edges and decides when the session should
// move. Its methods are safe for concurrent use.
type Chooser struct {
	cfg   Config
	log   *slog.Logger
	clock Clock

	swMu    sync.Mutex // held while a switch is applied
	storeMu sync.Mutex // serializes Store calls

	mu     sync.Mutex
	loaded bool
	addrs  []netip.AddrPort // the last resolver answer, in its order
	rank   *Ranking         // nil: none valid for addrs
	cur    netip.AddrPort   // the session's edge
	busy   bool             // a Connect is under way
	streak map[netip.AddrPort]int
	stats  Stats
}

// New validates cfg and returns a Chooser. It does no I/O.
func New(cfg Config) (*Chooser, error) {
	if cfg.Resolve == nil || cfg.Probe == nil {
		return nil, fmt.Errorf("Resolve and Probe are required: %w", ErrConfig)
	}
	if cfg.ProbeTimeout < 0 || cfg.Interval < 0 || cfg.MaxAge < 0 || cfg.MinGain < 0 ||
		cfg.MinGainPercent < 0 || cfg.MinGainPercent > 100 || cfg.Streak < 0 {
		return nil, fmt.Errorf("negative duration, count or percentage: %w", ErrConfig)
	}
	setDefault(&cfg.ProbeTimeout, 5*time.Second)
	setDefault(&cfg.Interval, 5*time.Minute)
	setDefault(&cfg.MaxAge, time.Hour)
	setDefault(&cfg.MinGain, 20*time.Millisecond)
	setDefault(&cfg.MinGainPercent, 25)
	setDefault(&cfg.Streak, 2)
	c := &Chooser{cfg: cfg, log: cfg.Logger, clock: cfg.Clock}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.clock == nil {
		c.clock = systemClock{}
	}
	return c, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Order returns the addresses to try, best first: the ranking's order when
// there is one for the current address set (the stored one after a
// restart), else it measures every candidate first; the resolver's order
// when there are fewer than two candidates or every probe failed. It
// returns an error wrapping ErrNoEdge only when there is no address at all.
func (c *Chooser) Order(ctx context.Context) ([]netip.AddrPort, error) {
	addrs := c.resolve(ctx)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolving the edges: %w", ErrNoEdge)
	}
	c.mu.Lock()
	evs := c.syncLocked(addrs)
	if len(addrs) < 2 {
		c.stats.Skipped++
		evs = append(evs, c.event(Event{Kind: EventSkipped, Addrs: slices.Clone(addrs)}))
		c.mu.Unlock()
		c.emit(evs...)
		return addrs, nil
	}
	if c.rank != nil && c.rank.Any() {
		order := c.rank.Order()
		c.mu.Unlock()
		c.emit(evs...)
		return order, nil
	}
	c.mu.Unlock()
	c.emit(evs...)

	res := c.probe(ctx, addrs)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.update(addrs, res, true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rank != nil && c.rank.Any() {
		return c.rank.Order(), nil
	}
	return addrs, nil
}

// Connect is a dial: it calls fn with each address of Order, in order,
// until one succeeds (fn connects through the edge and keeps the
// connection), then Uses that address and returns it. It returns an error
// wrapping ErrNoEdge and every attempt's error when none succeeded, and
// ErrInUse while a session is in use (see Release).
func (c *Chooser) Connect(ctx context.Context, fn func(ctx context.Context, addr netip.AddrPort) error) (netip.AddrPort, error) {
	c.mu.Lock()
	if c.busy || c.cur.IsValid() {
		c.mu.Unlock()
		return netip.AddrPort{}, ErrInUse
	}
	c.busy = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
	}()
	order, err := c.Order(ctx)
	if err != nil {
		return netip.AddrPort{}, err
	}
	errs := []error{ErrNoEdge}
	for _, a := range order {
		err := fn(ctx, a)
		if err == nil {
			c.Use(a)
			return a, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return netip.AddrPort{}, fmt.Errorf("no edge connected: %w", errors.Join(errs...))
}

// Use tells the Chooser that the session now runs through addr (after a
// dial of the caller's own), and starts its streaks over.
func (c *Chooser) Use(addr netip.AddrPort) {
	c.mu.Lock()
	c.cur = addr
	c.streak = nil
	c.mu.Unlock()
}

// Release tells the Chooser that the session ended: it follows none until
// the next Connect or Use. The ranking stays.
func (c *Chooser) Release() { c.Use(netip.AddrPort{}) }

// Current returns the edge set by Use or the last switch.
func (c *Chooser) Current() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// Ranking returns a copy of the current ranking, or nil.
func (c *Chooser) Ranking() *Ranking {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rank.clone()
}

// Stats returns a snapshot of the counters.
func (c *Chooser) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Cycle runs one watch round: it resolves the name, probes what the round
// needs (everything when the ranking is missing, of another address set or
// MaxAge old; else the current edge, those ranked above it and those that
// failed), updates the ranking and the streaks, and returns the switch
// that is due, or nil. It does not apply the switch (Step does).
func (c *Chooser) Cycle(ctx context.Context) *Switch {
	addrs := c.resolve(ctx)
	c.mu.Lock()
	c.stats.Cycles++
	evs := c.syncLocked(addrs)
	cur := c.cur
	if !cur.IsValid() || len(addrs) == 0 {
		evs = append(evs, c.event(Event{Kind: EventCycle}))
		c.mu.Unlock()
		c.emit(evs...)
		return nil
	}
	if len(addrs) < 2 {
		c.stats.Skipped++
		evs = append(evs, c.event(Event{Kind: EventSkipped, Addrs: slices.Clone(addrs)}))
		var sw *Switch
		if addrs[0] != cur {
			sw = &Switch{From: cur, To: addrs[0], Reason: Removed}
		}
		evs = append(evs, c.event(Event{Kind: EventCycle, Switch: sw}))
		c.mu.Unlock()
		c.emit(evs...)
		return sw
	}
	full := c.rank == nil || !c.rank.Any() || c.clock.Now().Sub(c.rank.Measured) >= c.cfg.MaxAge
	targets := addrs
	if !full {
		targets = c.watchedLocked(cur)
	}
	c.mu.Unlock()
	c.emit(evs...)

	res := c.probe(ctx, targets)
	if ctx.Err() != nil {
		return nil // stopping: the probes were cut short, not failed
	}
	c.update(addrs, res, full)

	c.mu.Lock()
	sw := c.decideLocked(cur, addrs, res)
	ev := c.event(Event{Kind: EventCycle, Switch: sw})
	c.mu.Unlock()
	c.emit(ev)
	return sw
}

// watchedLocked returns what a partial round probes: the current edge,
// those ranked above it, and those whose last probe failed.
func (c *Chooser) watchedLocked(cur netip.AddrPort) []netip.AddrPort {
	out := []netip.AddrPort{cur}
	above := true
	for _, e := range c.rank.Entries {
		if e.Addr == cur {
			above = false
			continue
		}
		if above || !e.OK {
			out = append(out, e.Addr)
		}
	}
	return out
}

// decideLocked updates the streaks from a round's results and returns the
// switch that is due.
func (c *Chooser) decideLocked(cur netip.AddrPort, addrs []netip.AddrPort, res map[netip.AddrPort]result) *Switch {
	if c.cur != cur {
		return nil // the session moved during the round (Failover)
	}
	if !slices.Contains(addrs, cur) {
		to := addrs[0]
		if c.rank != nil && c.rank.Any() {
			to = c.rank.Entries[0].Addr
		}
		return &Switch{From: cur, To: to, Reason: Removed, ToRTT: res[to].s.RTT}
	}
	now, ok := res[cur]
	if !ok {
		return nil
	}
	old := c.streak
	c.streak = map[netip.AddrPort]int{}
	var best netip.AddrPort
	for a, r := range res {
		if a == cur || r.err != nil {
			continue
		}
		if now.err == nil && !better(r.s.RTT, now.s.RTT, c.cfg.MinGain, c.cfg.MinGainPercent) {
			continue
		}
		c.streak[a] = old[a] + 1
		if c.streak[a] >= c.cfg.Streak && (!best.IsValid() || r.s.RTT < res[best].s.RTT) {
			best = a
		}
	}
	if !best.IsValid() {
		return nil
	}
	sw := &Switch{From: cur, To: best, Reason: Better, FromRTT: now.s.RTT, ToRTT: res[best].s.RTT}
	if now.err != nil {
		sw.Reason, sw.FromRTT = Failing, 0
	}
	return sw
}

// Step runs one watch round and applies the switch that is due through
// fn. It returns the switch applied, or nil, and fn's error.
func (c *Chooser) Step(ctx context.Context, fn SwitchFunc) (*Switch, error) {
	sw := c.Cycle(ctx)
	if sw == nil {
		return nil, nil
	}
	c.swMu.Lock()
	defer c.swMu.Unlock()
	if c.Current() != sw.From {
		return nil, nil // a failover moved the session meanwhile
	}
	if err := c.apply(ctx, *sw, fn); err != nil {
		return nil, err
	}
	return sw, nil
}

// Run runs watch rounds until ctx ends, waiting NextDelay before each, and
// applies the switches that are due through fn. A failed switch is logged
// and counted; the session stays and the next round decides anew. It
// returns ctx's error.
func (c *Chooser) Run(ctx context.Context, fn SwitchFunc) error {
	for {
		d := c.NextDelay()
		c.emit(c.event(Event{Kind: EventScheduled, Delay: d}))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.clock.After(d):
		}
		c.Step(ctx, fn)
	}
}

// NextDelay returns how long to wait before the next watch round: uniform
// in [0, Interval) (full jitter); when the session is settled on the best
// edge with nothing pending, that comes after the ranking's remaining
// time to MaxAge.
func (c *Chooser) NextDelay() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.jitterLocked()
	if c.settledLocked() {
		d += max(0, c.rank.Measured.Add(c.cfg.MaxAge).Sub(c.clock.Now()))
	}
	return d
}

func (c *Chooser) jitterLocked() time.Duration {
	if c.cfg.Rand != nil {
		return time.Duration(c.cfg.Rand.Int64N(int64(c.cfg.Interval)))
	}
	return time.Duration(rand.Int64N(int64(c.cfg.Interval)))
}

// settledLocked: on the best edge, no candidate on a streak, no failed
// entry to watch for.
func (c *Chooser) settledLocked() bool {
	if c.rank == nil || !c.rank.Any() || c.rank.Entries[0].Addr != c.cur || len(c.streak) > 0 {
		return false
	}
	for _, e := range c.rank.Entries {
		if !e.OK {
			return false
		}
	}
	return true
}

// Failover moves the session off from, which the caller found unreachable:
// the edge is marked failed in the ranking, and the others are tried
// through fn in ranking order (the resolver's, without a ranking) until
// one succeeds. Nothing is probed first, so a failover costs no handshake.
// It does nothing when the session is no longer on from.
func (c *Chooser) Failover(ctx context.Context, from netip.AddrPort, fn SwitchFunc) (Switch, error) {
	c.swMu.Lock()
	defer c.swMu.Unlock()
	c.mu.Lock()
	if c.cur != from {
		c.mu.Unlock()
		return Switch{}, nil
	}
	order := slices.Clone(c.addrs)
	var snap *Ranking
	if c.rank != nil {
		if i := c.rank.index(from); i >= 0 {
			e := &c.rank.Entries[i]
			e.OK, e.Err, e.At = false, "unreachable", c.clock.Now()
			c.rank.sort()
		}
		if c.rank.Any() {
			order = c.rank.Order()
			snap = c.rank.clone()
		}
	}
	c.mu.Unlock()
	c.save(snap)

	var errs []error
	for _, to := range order {
		if to == from {
			continue
		}
		sw := Switch{From: from, To: to, Reason: Unreachable}
		if snap != nil {
			if i := snap.index(to); i >= 0 && snap.Entries[i].OK {
				sw.ToRTT = snap.Entries[i].Sample.RTT
			}
		}
		err := c.apply(ctx, sw, fn)
		if err == nil {
			return sw, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return Switch{}, fmt.Errorf("failing over from %v: %w", from, errors.Join(append([]error{ErrNoEdge}, errs...)...))
}

// apply moves the session through fn; the caller holds swMu.
func (c *Chooser) apply(ctx context.Context, sw Switch, fn SwitchFunc) error {
	err := fn(ctx, sw)
	c.mu.Lock()
	c.streak = nil
	if err != nil {
		c.stats.SwitchErrors++
	} else {
		c.cur = sw.To
		c.stats.Switches[sw.Reason]++
	}
	c.mu.Unlock()
	attrs := []any{"from", sw.From, "to", sw.To, "reason", sw.Reason.String()}
	if sw.FromRTT > 0 {
		attrs = append(attrs, "from_rtt", sw.FromRTT)
	}
	if sw.ToRTT > 0 {
		attrs = append(attrs, "to_rtt", sw.ToRTT)
	}
	if err != nil {
		c.log.Warn("edge switch failed, staying", append(attrs, "err", err)...)
		c.emit(c.event(Event{Kind: EventSwitchFailed, Switch: &sw, Err: err}))
		return err
	}
	c.log.Info("edge switch", attrs...)
	c.emit(c.event(Event{Kind: EventSwitch, Switch: &sw}))
	return nil
}

// resolve asks the resolver; when it fails or answers nothing, the last
// known set (or the stored ranking's) stands in.
func (c *Chooser) resolve(ctx context.Context) []netip.AddrPort {
	got, err := c.cfg.Resolve(ctx)
	var uniq []netip.AddrPort
	for _, a := range got {
		a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
		if a.IsValid() && !slices.Contains(uniq, a) {
			uniq = append(uniq, a)
		}
	}
	c.mu.Lock()
	c.stats.Resolves++
	evs := c.loadLocked()
	if err == nil && len(uniq) == 0 {
		err = errors.New("no addresses")
	}
	if err != nil {
		c.stats.ResolveErrors++
		if len(c.addrs) == 0 && c.rank != nil {
			c.addrs = slices.Clone(c.rank.Set)
		}
		uniq = slices.Clone(c.addrs)
		c.log.Warn("resolving the edges failed, using the last known set", "err", err, "addrs", uniq)
	} else {
		c.addrs = slices.Clone(uniq)
	}
	evs = append(evs, c.event(Event{Kind: EventResolved, Addrs: slices.Clone(uniq), Err: err}))
	c.mu.Unlock()
	c.emit(evs...)
	return uniq
}

// loadLocked reads the Store once.
func (c *Chooser) loadLocked() []Event {
	if c.loaded || c.cfg.Store == nil {
		c.loaded = true
		return nil
	}
	c.loaded = true
	c.storeMu.Lock()
	r, err := c.cfg.Store.Load()
	c.storeMu.Unlock()
	if err != nil {
		c.stats.StoreErrors++
		c.log.Warn("loading the edge ranking failed, measuring anew", "err", err)
		return []Event{c.event(Event{Kind: EventStoreError, Err: err})}
	}
	if r != nil && c.rank == nil {
		c.rank = r
	}
	return nil
}

// syncLocked discards a ranking that belongs to another address set.
func (c *Chooser) syncLocked(addrs []netip.AddrPort) []Event {
	if c.rank == nil || len(addrs) == 0 || c.rank.valid(setOf(addrs)) {
		return nil
	}
	old := c.rank
	c.rank = nil
	c.streak = nil
	c.stats.Discarded++
	c.log.Info("edge address set changed, ranking discarded", "was", old.Set, "now", addrs)
	return []Event{c.event(Event{Kind: EventDiscarded, Addrs: slices.Clone(addrs), Ranking: old})}
}

var errNotProbed = errors.New("not probed")

type result struct {
	s   Sample
	err error
	at  time.Time
}

// probe runs Probe on every target in parallel, each with its own timeout.
func (c *Chooser) probe(ctx context.Context, targets []netip.AddrPort) map[netip.AddrPort]result {
	rs := make([]result, len(targets))
	var wg sync.WaitGroup
	for i, a := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
			defer cancel()
			s, err := c.cfg.Probe(pctx, a)
			if err == nil && s.RTT <= 0 {
				err = fmt.Errorf("probe of %v measured no round-trip time", a)
			}
			rs[i] = result{s: s, err: err}
		}()
	}
	wg.Wait()
	out := make(map[netip.AddrPort]result, len(targets))
	now := c.clock.Now()
	evs := make([]Event, 0, len(targets))
	c.mu.Lock()
	for i, a := range targets {
		rs[i].at = now
		out[a] = rs[i]
		c.stats.Probes++
		if rs[i].err != nil {
			c.stats.ProbeErrors++
		}
		evs = append(evs, c.event(Event{Kind: EventProbe, Addr: a, Sample: rs[i].s, Err: rs[i].err}))
	}
	c.mu.Unlock()
	for i, a := range targets {
		if rs[i].err != nil {
			c.log.Debug("edge probe failed", "edge", a, "err", rs[i].err)
		} else {
			c.log.Debug("edge probe", "edge", a, "rtt", rs[i].s.RTT, "handshake", rs[i].s.Handshake)
		}
	}
	c.emit(evs...)
	return out
}

// update folds a round's results into the ranking (a new one after a full
// measurement) and persists it, unless every probe failed.
func (c *Chooser) update(addrs []netip.AddrPort, res map[netip.AddrPort]result, full bool) {
	c.mu.Lock()
	if full || c.rank == nil {
		r := &Ranking{Set: setOf(addrs), Measured: c.clock.Now()}
		for _, a := range addrs {
			x, ok := res[a]
			if !ok {
				x = result{err: errNotProbed, at: r.Measured}
			}
			r.Entries = append(r.Entries, entry(a, x, Entry{}))
		}
		c.rank = r
		c.stats.Measures++
	} else {
		for i, e := range c.rank.Entries {
			if r, ok := res[e.Addr]; ok {
				c.rank.Entries[i] = entry(e.Addr, r, e)
			}
		}
	}
	c.rank.sort()
	snap := c.rank.clone()
	evs := []Event{c.event(Event{Kind: EventRanked, Ranking: snap.clone()})}
	if !snap.Any() {
		c.stats.Fallbacks++
		evs = append(evs, c.event(Event{Kind: EventFallback, Addrs: slices.Clone(addrs)}))
	}
	c.mu.Unlock()
	c.emit(evs...)
	if !snap.Any() {
		c.log.Warn("every edge probe failed, using the resolver's order", "addrs", addrs)
		return
	}
	b, _ := snap.Best()
	c.log.Debug("edges ranked", "best", b.Addr, "rtt", b.Sample.RTT, "order", snap.Order())
	c.save(snap)
}

func entry(a netip.AddrPort, r result, prev Entry) Entry {
	e := Entry{Addr: a, OK: r.err == nil, At: r.at, Sample: prev.Sample}
	if r.err != nil {
		e.Err = r.err.Error()
	} else {
		e.Sample = r.s
	}
	return e
}

func (c *Chooser) save(r *Ranking) {
	if c.cfg.Store == nil || r == nil {
		return
	}
	c.storeMu.Lock()
	err := c.cfg.Store.Save(r)
	c.storeMu.Unlock()
	if err != nil {
		c.mu.Lock()
		c.stats.StoreErrors++
		ev := c.event(Event{Kind: EventStoreError, Err: err})
		c.mu.Unlock()
		c.log.Warn("saving the edge ranking failed", "err", err)
		c.emit(ev)
	}
}

func (c *Chooser) event(e Event) Event {
	e.Time = c.clock.Now()
	return e
}

func (c *Chooser) emit(evs ...Event) {
	if c.cfg.OnEvent == nil {
		return
	}
	for _, e := range evs {
		c.cfg.OnEvent(e)
	}
}
