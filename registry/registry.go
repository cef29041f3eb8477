package registry

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Registry. The zero value is valid: no name, seed 0,
// freshness off, slog.Default().
type Config struct {
	// Service names the service in logs and errors.
	Service string
	// Seed is the HRW seed. Every proxy replica of the service must use
	// the same one, or replicas choose different backends for new sessions.
	Seed uint64
	// MaxAge is the freshness limit: when the source has not called Update
	// or Confirm for longer, the registry is stale. 0 turns freshness off;
	// otherwise it must be at least MinMaxAge.
	MaxAge time.Duration
	// Logger receives the stale and recovered transitions. nil means
	// slog.Default().
	Logger *slog.Logger
	// SlowStart, when set, ramps the share of new sessions of a backend
	// that became ready less than SlowStart ago (by its ReadySince, which
	// its source records) in SlowStartSteps equal steps, from 10% of its
	// weight to all of it. It is 0 (off) or MinSlowStart to MaxSlowStart.
	// The steps begin at ReadySince plus whole tenths of SlowStart,
	// instants of wall-clock time, so replicas fed the same backends
	// choose alike whenever and in whatever order the updates reached
	// them; they differ only for as long as their clocks differ after
	// each step begins, and then only in keys moving to the new backend.
	// Sessions routed by their CID are never affected.
	SlowStart time.Duration

	now func() time.Time // tests inject a fake clock
}

// Registry holds the current Snapshot of one service's backends. Its methods
// are safe for concurrent use; Snapshot and Stale are a single atomic load
// each, for the packet path.
type Registry struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	cur   atomic.Pointer[Snapshot]
	stale atomic.Bool

	updates       atomic.Uint64
	rejections    atomic.Uint64
	confirmations atomic.Uint64

	mu        sync.Mutex               // serializes publishing and the state below
	src       []Backend                // the source's last accepted list, normalized
	down      map[uint8]netip.AddrPort // ordinal → address marked down by the owner's Marks
	owner     uint64                   // generation of the live Marks; 0: none, and down is empty
	gens      uint64                   // generations handed out
	confirmed time.Time                // last Update or Confirm
	timer     *time.Timer
	ramp      *time.Timer // publishes the next slow-start step
	closed    bool
}

var _ Updater = (*Registry)(nil)

// MinMaxAge is the smallest freshness limit New accepts: the sources
// confirm at most once a millisecond, so a shorter limit would only make a
// registry flap between stale and fresh (and log each flap).
const MinMaxAge = time.Millisecond

// Limits of Config.SlowStart. A step lasts a tenth of it, at least 1 s,
// far above the clock difference of replicas synchronized by NTP
// (milliseconds), which is how long two replicas may disagree after a
// step begins.
const (
	MinSlowStart = 10 * time.Second // the shortest ramp: steps of 1 s
	MaxSlowStart = time.Hour        // the longest ramp
)

// New returns a registry holding an empty snapshot (version 0). With
// cfg.MaxAge set, the freshness clock starts now: a source must Update or
// Confirm within MaxAge. Call Close to stop the freshness timer.
func New(cfg Config) (*Registry, error) {
	if cfg.MaxAge < 0 || (cfg.MaxAge > 0 && cfg.MaxAge < MinMaxAge) {
		return nil, fmt.Errorf("registry %q: MaxAge %v: want 0 (off) or at least %v: %w", cfg.Service, cfg.MaxAge, MinMaxAge, ErrConfig)
	}
	if cfg.SlowStart != 0 && (cfg.SlowStart < MinSlowStart || cfg.SlowStart > MaxSlowStart) {
		return nil, fmt.Errorf("registry %q: SlowStart %v: want 0 (off) or %v to %v: %w", cfg.Service, cfg.SlowStart, MinSlowStart, MaxSlowStart, ErrConfig)
	}
	r := &Registry{cfg: cfg, log: cfg.Logger, now: cfg.now}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.log = r.log.With("service", cfg.Service)
	if r.now == nil {
		r.now = time.Now
	}
	empty, _, err := newSnapshot(0, cfg.Seed, nil, nil, nil, 0, time.Time{})
	if err != nil {
		return nil, err
	}
	r.cur.Store(empty)
	r.mu.Lock() // the timer may fire before AfterFunc returns
	defer r.mu.Unlock()
	r.confirmed = r.now()
	if cfg.MaxAge > 0 {
		r.timer = time.AfterFunc(cfg.MaxAge, r.checkFreshness)
	}
	return r, nil
}

// NewStatic returns a registry that holds bs, for a fixed backend list in
// one call: New, then Update. The list is validated as Update does (the
// error wraps one of the Err* sentinels). cfg.MaxAge must be 0, since no
// source confirms a list that never changes; a registry that should also
// follow a file or a watch takes New and a Source instead. Close it when
// done, as any Registry.
func NewStatic(cfg Config, bs []Backend) (*Registry, error) {
	if cfg.MaxAge != 0 {
		return nil, fmt.Errorf("registry %q: MaxAge %v for a static list, which nothing confirms: want 0: %w", cfg.Service, cfg.MaxAge, ErrConfig)
	}
	r, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Update(bs); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Snapshot returns the current snapshot; never nil. Hold on to it for the
// whole handling of one datagram (or batch) so that every answer comes from
// the same view.
func (r *Registry) Snapshot() *Snapshot { return r.cur.Load() }

// Stale reports whether the source has failed to confirm the snapshot within
// MaxAge; always false with freshness off. It is one atomic load: callers
// check it for new-session datagrams only and refuse them while it is true;
// established (CID) sessions are routed regardless.
func (r *Registry) Stale() bool { return r.stale.Load() }

// MaxAge returns the configured freshness limit (0 = off). Sources that
// have nothing new to say use it to pace their confirmations.
func (r *Registry) MaxAge() time.Duration { return r.cfg.MaxAge }

// Update validates bs as a whole (see Validate), builds a snapshot from it
// and publishes it atomically; the registry keeps no reference to bs. An
// accepted update also counts as a confirmation. A rejected one changes
// nothing, neither the snapshot nor the freshness clock, counts a
// rejection and returns an error wrapping one of the Err* sentinels.
func (r *Registry) Update(bs []Backend) error {
	norm, err := validate(bs)
	if err != nil {
		r.rejections.Add(1)
		return fmt.Errorf("registry %q: %w", r.cfg.Service, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// A down mark outlives an update only while its backend keeps its
	// address: a new address is a new backend, which starts up.
	var down map[uint8]netip.AddrPort
	for o, a := range r.down {
		if slices.ContainsFunc(norm, func(b Backend) bool { return b.Ordinal == o && b.Addr == a }) {
			if down == nil {
				down = map[uint8]netip.AddrPort{}
			}
			down[o] = a
		}
	}
	if err := r.publishLocked(norm, down); err != nil {
		r.rejections.Add(1)
		return fmt.Errorf("registry %q: %w", r.cfg.Service, err)
	}
	r.updates.Add(1)
	r.confirmLocked()
	return nil
}

// publishLocked builds the snapshot of the source list src with the down
// marks applied and publishes it. The caller holds mu.
func (r *Registry) publishLocked(src []Backend, down map[uint8]netip.AddrPort) error {
	prev := r.cur.Load()
	now := r.now()
	s, next, err := newSnapshot(prev.version+1, r.cfg.Seed, slices.Clone(src), down, prev, r.cfg.SlowStart, now)
	if err != nil {
		return err
	}
	r.src, r.down = src, down
	r.cur.Store(s)
	r.scheduleRampLocked(now, next)
	return nil
}

// scheduleRampLocked arms the slow-start timer for next (none when zero).
func (r *Registry) scheduleRampLocked(now, next time.Time) {
	if r.ramp != nil {
		r.ramp.Stop()
		r.ramp = nil
	}
	if next.IsZero() || r.closed {
		return
	}
	r.ramp = time.AfterFunc(max(next.Sub(now), 0), r.rampStep)
}

// rampStep publishes the snapshot of the slow-start step that just
// began. A timer that fires early (the clock was stepped) publishes the
// same step again and rearms itself.
func (r *Registry) rampStep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.src == nil {
		return
	}
	if err := r.publishLocked(r.src, r.down); err != nil {
		r.log.Error("publishing a slow-start step", "err", err) // cannot fail: the list was valid
	}
}

// Marks is the set of down marks of one health checker in a registry.
// The registry has at most one live Marks: TakeMarks hands out a new one
// and retires the previous, whose marks go with it, and Release retires
// it. The marks exist only while their Marks is live, so that no mark can
// outlive the checker that set it: a checker that stops or is replaced
// takes every mark it set away, whatever its backend's state. Its methods
// are safe for concurrent use; on a retired Marks they do nothing.
type Marks struct {
	r   *Registry
	gen uint64
}

// TakeMarks makes a new Marks the registry's only one, starting with the
// backends of down marked down (marks a previous checker handed over, as
// in a restart handover): those the current list has at the same address,
// or all of them while no list has been published yet, so that marks
// taken before the source's first list apply to it. The previous Marks is
// retired, and its marks lifted in the same snapshot.
func (r *Registry) TakeMarks(down []Backend) *Marks {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gens++
	r.owner = r.gens
	next := map[uint8]netip.AddrPort{}
	listed := r.cur.Load().version > 0
	for _, b := range down {
		a := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
		if !listed || slices.ContainsFunc(r.src, func(s Backend) bool { return s.Ordinal == b.Ordinal && s.Addr == a }) {
			next[b.Ordinal] = a
		}
	}
	r.setMarksLocked(next, "taking marks")
	return &Marks{r: r, gen: r.owner}
}

// Release retires m and lifts every mark it set, in every state: ready,
// draining or gone by its source. It is idempotent.
func (m *Marks) Release() {
	r := m.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owner != m.gen {
		return
	}
	r.owner = 0
	r.setMarksLocked(nil, "releasing marks")
}

// Live reports whether m is still the registry's Marks.
func (m *Marks) Live() bool {
	m.r.mu.Lock()
	defer m.r.mu.Unlock()
	return m.r.owner == m.gen
}

// setMarksLocked replaces the marks, publishing when the routing changes.
func (r *Registry) setMarksLocked(next map[uint8]netip.AddrPort, what string) {
	if len(next) == 0 {
		next = nil
	}
	if !r.marksRoute(r.down) && !r.marksRoute(next) {
		r.down = next
		return
	}
	if err := r.publishLocked(r.src, next); err != nil {
		r.log.Error(what, "err", err) // cannot fail: a subset of a valid list
	}
}

// marksRoute reports whether any mark of down applies to a ready backend.
func (r *Registry) marksRoute(down map[uint8]netip.AddrPort) bool {
	for _, b := range r.src {
		if a, ok := down[b.Ordinal]; ok && a == b.Addr && b.State == Ready {
			return true
		}
	}
	return false
}

// SetDown marks the backend with the given ordinal and address down (down
// true) or up again, as a health checker decides. A backend its source
// calls ready and that is marked down is published as draining: it takes
// no new sessions and keeps serving its CID sessions, whose routes never
// depend on health. The mark applies to that address only and goes away
// when the source drops the backend or moves it to another address, or
// when m is retired. The marks are this registry's own: each proxy
// replica probes on its own, so replicas may disagree for a while about
// which backends are down, and then differ only in where they place new
// sessions (HRW moves only the down backend's keys), never in where a
// CID's datagrams go.
//
// SetDown publishes a new snapshot when the routing changes, and reports
// whether it did. A backend the current list does not have (the source
// changed it meanwhile) is left alone, and so is everything once m is
// retired.
func (m *Marks) SetDown(ordinal uint8, addr netip.AddrPort, down bool) bool {
	r := m.r
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owner != m.gen {
		return false
	}
	i := slices.IndexFunc(r.src, func(b Backend) bool { return b.Ordinal == ordinal && b.Addr == addr })
	if i < 0 {
		return false
	}
	a, marked := r.down[ordinal]
	if marked == down && (!down || a == addr) {
		return false
	}
	next := make(map[uint8]netip.AddrPort, len(r.down)+1)
	for o, a := range r.down {
		next[o] = a
	}
	if down {
		next[ordinal] = addr
	} else {
		delete(next, ordinal)
	}
	if r.src[i].State != Ready { // no routing change: keep the mark quietly
		r.down = next
		return false
	}
	// newSnapshot fails only on a new set of ready backends, whose HRW
	// table it builds; that cannot fail for a subset of a valid list.
	if err := r.publishLocked(r.src, next); err != nil {
		r.log.Error("publishing a health change", "ordinal", ordinal, "addr", addr, "down", down, "err", err)
		return false
	}
	return true
}

// Reject counts an update that its source could not even turn into a
// backend list (a file that cannot be read or decoded), as Update counts
// the lists it refuses, so that every rejected update shows in Stats.
// Nothing else changes: not the snapshot, not the freshness clock.
func (r *Registry) Reject() { r.rejections.Add(1) }

// Confirm tells the registry that its source still stands by the current
// snapshot. It refreshes the freshness clock and clears the stale flag.
func (r *Registry) Confirm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.confirmations.Add(1)
	r.confirmLocked()
}

func (r *Registry) confirmLocked() {
	r.confirmed = r.now()
	if r.stale.Load() {
		r.stale.Store(false)
		r.log.Info("registry fresh again", "version", r.cur.Load().version)
		// The timer stopped when the registry went stale; restart it.
		if !r.closed && r.timer != nil {
			r.timer.Reset(r.cfg.MaxAge)
		}
	}
}

// checkFreshness runs on the timer: it marks the registry stale when the
// last confirmation is MaxAge old, and otherwise rearms itself for the
// moment it will be. While stale the timer stays stopped; the next
// confirmation restarts it.
func (r *Registry) checkFreshness() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.stale.Load() || r.cfg.MaxAge == 0 {
		return
	}
	age := r.now().Sub(r.confirmed)
	if age < r.cfg.MaxAge {
		r.timer.Reset(r.cfg.MaxAge - age)
		return
	}
	r.stale.Store(true)
	r.log.Warn("registry stale: refusing new sessions until the source confirms",
		"age", age, "max_age", r.cfg.MaxAge, "version", r.cur.Load().version)
}

// Close stops the freshness timer; Stale keeps its last value. Updates and
// lookups keep working. Close is idempotent; once it returns, the timer does
// nothing more.
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.ramp != nil {
		r.ramp.Stop()
	}
}

// Stats is a point-in-time summary of a registry.
type Stats struct {
	Service string // Config.Service
	// Version of the current snapshot.
	Version uint64
	// Updates accepted, updates rejected (by Update or Reject), and
	// Confirm calls.
	Updates, Rejections, Confirmations uint64
	// LastConfirmed is the time of the last accepted Update or Confirm (or
	// of New); Age is how long ago that was.
	LastConfirmed time.Time
	Age           time.Duration // see LastConfirmed
	Stale         bool          // not confirmed within the freshness limit: new sessions are refused
	// Backends of the current snapshot by state: Ready by the source and
	// up; Draining by the source; Down: ready by the source, marked down by
	// a health checker (routed as draining); Gone.
	Ready, Draining, Down, Gone int
	// SlowStarting counts the ready backends in slow start (Config.SlowStart).
	SlowStarting int
}

// Stats returns the registry's counters and the current snapshot's shape.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	confirmed := r.confirmed
	r.mu.Unlock()
	s := r.cur.Load()
	return Stats{
		Service:       r.cfg.Service,
		Version:       s.version,
		Updates:       r.updates.Load(),
		Rejections:    r.rejections.Load(),
		Confirmations: r.confirmations.Load(),
		LastConfirmed: confirmed,
		Age:           r.now().Sub(confirmed),
		Stale:         r.stale.Load(),
		Ready:         s.counts[Ready],
		Draining:      s.counts[Draining] - s.ndown,
		Down:          s.ndown,
		Gone:          s.counts[Gone],
		SlowStarting:  s.ramping,
	}
}
