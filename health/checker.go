package health

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cidroute/cidroute/registry"
)

// Target is what a Checker probes and marks: *registry.Registry. The
// marks are set through the registry.Marks the checker takes when it
// starts and releases when it stops, so that none outlives it.
type Target interface {
	// Snapshot lists the backends to probe, each round.
	Snapshot() *registry.Snapshot
	// TakeMarks takes the registry's one handle for health marks, down
	// those of down at once (see registry.Registry.TakeMarks).
	TakeMarks(down []registry.Backend) *registry.Marks
}

var _ Target = (*registry.Registry)(nil)

// Config configures a Checker. Zero values mean the defaults; Protocol is
// required.
type Config struct {
	ProbeConfig
	// Service names the service in logs.
	Service string
	// Interval between the starts of two rounds (0 = 2 s).
	Interval time.Duration
	// Jitter is the largest random part taken off each interval (0 =
	// Interval/5, negative = none), so that replicas drift apart.
	Jitter time.Duration
	// Timeout of one probe (0 = 1 s); at most Interval.
	Timeout time.Duration
	// Fall is the number of failed probes in a row that take a backend
	// down (0 = 3), Rise the number of successes in a row that bring it
	// up again (0 = 2).
	Fall, Rise int
	// Logger receives the state changes (nil = slog.Default()).
	Logger *slog.Logger
	// Probe, when set, probes instead of ProbeAnswer with ProbeConfig
	// (which still names the protocol): for example
	// piondtls.DataProbe, a full handshake and one echo, which fails a
	// backend that answers hellos but drops its sessions' data.
	Probe ProbeFunc
}

// A ProbeFunc probes the backend at addr until ctx is done, as
// ProbeAnswer does: a valid answer's round-trip time and Match, or an
// error wrapping ErrTimeout, ErrRefused or ErrBadAnswer.
type ProbeFunc func(ctx context.Context, addr netip.AddrPort) (time.Duration, Match, error)

// Defaults of Config.
const (
	DefaultInterval = 2 * time.Second // Config.Interval
	DefaultTimeout  = time.Second     // Config.Timeout
	DefaultFall     = 3               // Config.Fall
	DefaultRise     = 2               // Config.Rise
	// MinInterval bounds how often a backend is probed.
	MinInterval = 10 * time.Millisecond
)

// WithDefaults returns cfg with the defaults filled in, or an error
// wrapping ErrConfig, as New checks it.
func (cfg Config) WithDefaults() (Config, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(DefaultTimeout, cfg.Interval)
	}
	switch {
	case cfg.Jitter == 0:
		cfg.Jitter = cfg.Interval / 5
	case cfg.Jitter < 0:
		cfg.Jitter = 0
	}
	if cfg.Fall == 0 {
		cfg.Fall = DefaultFall
	}
	if cfg.Rise == 0 {
		cfg.Rise = DefaultRise
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case cfg.Interval < MinInterval:
		return cfg, fmt.Errorf("%w: interval %v: want at least %v", ErrConfig, cfg.Interval, MinInterval)
	case cfg.Timeout < 0 || cfg.Timeout > cfg.Interval:
		return cfg, fmt.Errorf("%w: timeout %v: want more than 0 and at most the interval %v", ErrConfig, cfg.Timeout, cfg.Interval)
	case cfg.Jitter >= cfg.Interval:
		return cfg, fmt.Errorf("%w: jitter %v: want less than the interval %v", ErrConfig, cfg.Jitter, cfg.Interval)
	case cfg.Fall < 1 || cfg.Rise < 1 || cfg.Fall > 100 || cfg.Rise > 100:
		return cfg, fmt.Errorf("%w: fall %d, rise %d: want 1 to 100", ErrConfig, cfg.Fall, cfg.Rise)
	}
	return cfg, cfg.validate()
}

// A Checker probes the backends of one Target (one service's registry)
// and marks them down and up. Its methods are safe for concurrent use.
type Checker struct {
	cfg    Config
	target Target
	log    *slog.Logger
	probe  func(context.Context, netip.AddrPort, ProbeConfig) (time.Duration, Match, error) // ProbeAnswer; tests replace it

	mu       sync.Mutex
	marks    *registry.Marks    // while Run runs; nil before and after
	inherit  []registry.Backend // marked down when Run starts (Inherit)
	backends map[key]*backendState
	rtt      Histogram
	rounds   atomic.Uint64 // rounds applied, for tests
}

// key identifies a backend: a new address is a new backend.
type key struct {
	ordinal uint8
	addr    netip.AddrPort
}

type backendState struct {
	down      bool
	confirmed bool // has answered since the checker met it
	tied      bool // has given an answer Tied to its probe: Untied ones fail from now on
	streak    int  // successes (down) or failures (up) in a row
	results   [NumResults]uint64
	since     time.Time // of the last change of state
	lastErr   error
	lastRTT   time.Duration
}

// New returns a Checker of target; Run starts it.
func New(target Target, cfg Config) (*Checker, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	c := &Checker{cfg: cfg, target: target, probe: ProbeAnswer, backends: map[key]*backendState{},
		log: cfg.Logger.With("service", cfg.Service, "protocol", cfg.Protocol.String())}
	if f := cfg.Probe; f != nil {
		c.probe = func(ctx context.Context, a netip.AddrPort, _ ProbeConfig) (time.Duration, Match, error) {
			return f(ctx, a)
		}
	}
	return c, nil
}

// Run probes until ctx is done, then returns nil. Its marks live as long
// as it runs: it takes the target's marks when it starts (retiring those
// of any other checker of the target, and marking down what Inherit
// handed it), and when it returns every mark it set is lifted, whatever
// the backend's state.
func (c *Checker) Run(ctx context.Context) error {
	c.begin()
	defer c.end()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		start := time.Now()
		c.round(ctx)
		wait := c.cfg.Interval
		if c.cfg.Jitter > 0 {
			wait -= rand.N(c.cfg.Jitter)
		}
		t.Reset(wait - time.Since(start))
	}
}

func (c *Checker) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marks = c.target.TakeMarks(c.inherit)
}

func (c *Checker) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.marks.Release()
	c.marks = nil
}

// Inherit hands the checker down marks of a checker it replaces (one of a
// previous process, in a restart handover, or of the configuration before
// a reload): those backends start down, as not yet seen answering, and
// come up when the checker's own probes say so. Call it before Run, or
// while Run runs (the marks then apply at once).
func (c *Checker) Inherit(down []registry.Backend) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inherit = slices.Clone(down)
	for _, b := range down {
		if st := c.backends[key{b.Ordinal, b.Addr}]; st != nil { // met already: down, as if never seen answering
			st.down, st.confirmed, st.streak, st.since = true, false, 0, time.Now()
		}
		if c.marks != nil {
			c.marks.SetDown(b.Ordinal, b.Addr, true)
		}
	}
}

// Down returns the backends the checker holds down (with those Inherit
// gave it that it has not probed yet), to hand to a checker that
// replaces it.
func (c *Checker) Down() []registry.Backend {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []registry.Backend
	for k, b := range c.backends {
		if b.down {
			out = append(out, registry.Backend{Ordinal: k.ordinal, Addr: k.addr})
		}
	}
	for _, b := range c.inherit {
		if _, met := c.backends[key{b.Ordinal, b.Addr}]; !met {
			out = append(out, registry.Backend{Ordinal: b.Ordinal, Addr: b.Addr})
		}
	}
	slices.SortFunc(out, func(a, b registry.Backend) int { return int(a.Ordinal) - int(b.Ordinal) })
	return out
}

// round probes every candidate once, in parallel, and applies the results.
func (c *Checker) round(ctx context.Context) {
	snap := c.target.Snapshot()
	var cands []key
	c.mu.Lock()
	for k := range c.backends { // forget backends the source dropped or moved
		if b, ok := snap.Backend(k.ordinal); !ok || b.Addr != k.addr {
			delete(c.backends, k)
		}
	}
	c.mu.Unlock()
	for _, b := range snap.Backends() {
		// Ready ones, and ready ones this checker marked down; draining
		// backends answer no probes by contract, gone ones serve nothing.
		if b.State == registry.Ready || snap.Down(b.Ordinal) {
			cands = append(cands, key{b.Ordinal, b.Addr})
		}
	}
	type outcome struct {
		rtt   time.Duration
		match Match
		err   error
	}
	out := make([]outcome, len(cands))
	var wg sync.WaitGroup
	for i, k := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
			defer cancel()
			out[i].rtt, out[i].match, out[i].err = c.probe(pctx, k.addr, c.cfg.ProbeConfig)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // probes cut by the stop prove nothing
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range cands {
		c.apply(k, snap, out[i].rtt, out[i].match, out[i].err)
	}
	c.rounds.Add(1)
}

// apply counts one probe's result and moves the backend's state. The
// caller holds mu.
func (c *Checker) apply(k key, snap *registry.Snapshot, rtt time.Duration, m Match, err error) {
	b := c.backends[k]
	if b == nil {
		// A backend the checker meets starts as the registry has it: up,
		// or down when a previous checker marked it so.
		b = &backendState{down: snap.Down(k.ordinal), since: time.Now()}
		c.backends[k] = b
	}
	switch {
	case err != nil:
	case m == Tied:
		b.tied = true
	case b.tied:
		// Its stack ties its answers to the probes: an untied one is
		// someone else's, sent from its address (a frozen backend kept
		// up by forged answers).
		err = fmt.Errorf("%w: an answer not tied to the probe, from a backend whose answers were", ErrBadAnswer)
	}
	r := ResultOf(err)
	b.results[r]++
	b.lastErr = err
	if r == OK {
		b.lastRTT = rtt
		c.rtt.observe(rtt)
	}
	switch {
	case !b.down && r == OK:
		b.confirmed, b.streak = true, 0
	case !b.down:
		b.streak++
		if n := b.streak; n >= c.cfg.Fall || !b.confirmed {
			c.set(k, b, true)
			c.log.Warn("backend down: no new sessions until it answers probes again; its CID sessions keep their route",
				"ordinal", k.ordinal, "addr", k.addr, "failures", n, "first_probe", !b.confirmed,
				"result", r.String(), "err", err)
		}
	case r == OK:
		b.streak++
		if b.streak >= c.cfg.Rise {
			c.set(k, b, false)
			b.confirmed = true
			c.log.Info("backend up: takes new sessions again", "ordinal", k.ordinal, "addr", k.addr,
				"successes", c.cfg.Rise, "rtt", rtt)
		}
	default:
		b.streak = 0
	}
	// Keep the registry in step (a mark it dropped, a SetDown that raced
	// with an update) without logging again.
	if snap.Down(k.ordinal) != b.down {
		c.mark(k, b.down)
	}
}

func (c *Checker) set(k key, b *backendState, down bool) {
	b.down, b.streak, b.since = down, 0, time.Now()
	c.mark(k, down)
}

// mark sets the registry's mark; nothing outside Run.
func (c *Checker) mark(k key, down bool) {
	if c.marks != nil {
		c.marks.SetDown(k.ordinal, k.addr, down)
	}
}

// BackendStatus is one probed backend's state.
type BackendStatus struct {
	Ordinal uint8          // the backend's ordinal in the registry
	Addr    netip.AddrPort // the address probed
	// Up is the checker's verdict; Since is when it last changed (or
	// when the checker met the backend).
	Up    bool
	Since time.Time // see Up
	// Results counts the probes by result.
	Results [NumResults]uint64
	// LastRTT is the round-trip time of the last answered probe; LastErr
	// the last probe's error (nil after a success).
	LastRTT time.Duration
	LastErr error // see LastRTT
}

// Stats is a point-in-time view of a Checker.
type Stats struct {
	Backends []BackendStatus // by ordinal
	// RTT is the histogram of answered probes' round-trip times.
	RTT Histogram
}

// Stats returns the checker's view of its backends.
func (c *Checker) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Stats{RTT: c.rtt}
	for k, b := range c.backends {
		st.Backends = append(st.Backends, BackendStatus{Ordinal: k.ordinal, Addr: k.addr, Up: !b.down, Since: b.since,
			Results: b.results, LastRTT: b.lastRTT, LastErr: b.lastErr})
	}
	slices.SortFunc(st.Backends, func(a, b BackendStatus) int { return int(a.Ordinal) - int(b.Ordinal) })
	return st
}

// RTTBuckets are the upper bounds, in seconds, of the Histogram's buckets.
var RTTBuckets = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Histogram counts round-trip times in RTTBuckets, cumulatively as
// Prometheus histograms are: Buckets[i] counts the times at most
// RTTBuckets[i]; Count counts them all, Sum adds them up (seconds).
type Histogram struct {
	Buckets [len(RTTBuckets)]uint64 // cumulative counts, by RTTBuckets' upper bounds
	Count   uint64                  // every answered probe
	Sum     float64                 // seconds
}

func (h *Histogram) observe(d time.Duration) {
	s := d.Seconds()
	for i, ub := range RTTBuckets {
		if s <= ub {
			h.Buckets[i]++
		}
	}
	h.Count++
	h.Sum += s
}
