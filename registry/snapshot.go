package registry

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cidroute/cidroute/hrw"
)

// noIndex marks an ordinal without a backend in Snapshot.byOrd.
const noIndex = 0xff

// A Snapshot is one published view of a service's backends. It is immutable
// and safe for concurrent use; every method is O(1) and allocates nothing.
// The *Backend values it returns point into the snapshot and must not be
// modified.
type Snapshot struct {
	version uint64
	list    []Backend       // sorted by ordinal, normalized
	byOrd   [256]uint8      // ordinal → index into list, noIndex if absent
	pick    *hrw.Table      // over the ready backends; nil when there are none
	ready   []hrw.Candidate // what pick was built from, sorted by ordinal
	addrs   addrTable       // serving backends by address
	counts  [Gone + 1]int   // backends by state, as routed (a down backend counts as draining)
	ramping int             // ready backends in slow start
	down    [4]uint64       // ordinals marked down by a health checker (Marks.SetDown)
	ndown   int
}

// newSnapshot builds a snapshot from a validated, normalized list; it takes
// ownership of bs. A ready backend whose ordinal is in down is published as
// draining: it takes no new sessions and keeps its CID routes. The HRW table dominates the cost (milliseconds for
// hundreds of backends), so it is taken over from prev when the ready
// backends and their weights are the same, as they are when only draining
// or gone backends, addresses, or nothing at all changed.
//
// With slow start on (slow > 0), a ready backend whose ReadySince is less
// than slow before now counts with a part of its weight (rampPermille);
// next is then the earliest time that part changes, when the registry
// publishes again. The snapshot depends only on bs, down and now's step,
// never on when or in what order updates arrived.
func newSnapshot(version, seed uint64, bs []Backend, down map[uint8]netip.AddrPort, prev *Snapshot, slow time.Duration, now time.Time) (s *Snapshot, next time.Time, err error) {
	slices.SortFunc(bs, func(a, b Backend) int { return int(a.Ordinal) - int(b.Ordinal) })
	s = &Snapshot{version: version, list: bs}
	for i := range s.byOrd {
		s.byOrd[i] = noIndex
	}
	var cands []hrw.Candidate
	serving := 0
	for i := range bs {
		b := &bs[i]
		if a, ok := down[b.Ordinal]; ok && a == b.Addr && b.State == Ready {
			b.State = Draining
			s.down[b.Ordinal/64] |= 1 << (b.Ordinal % 64)
			s.ndown++
		}
		s.byOrd[b.Ordinal] = uint8(i)
		s.counts[b.State]++
		if b.State.Serving() {
			serving++
		}
		if b.State == Ready {
			c := hrw.Candidate{Ordinal: b.Ordinal, Weight: b.Weight}
			if p, at := rampPermille(b.ReadySince, now, slow); p < 1000 {
				c.Permille = p
				s.ramping++
				if next.IsZero() || at.Before(next) {
					next = at
				}
			}
			cands = append(cands, c)
		}
	}
	s.ready = cands
	switch {
	case len(cands) == 0:
	case prev != nil && slices.Equal(prev.ready, cands):
		s.pick = prev.pick
	default:
		t, err := hrw.New(seed, cands)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("building the hrw table: %w", err)
		}
		s.pick = t
	}
	s.addrs = newAddrTable(bs, serving)
	return s, next, nil
}

// SlowStartSteps is the number of equal steps of a slow start: a backend
// counts with 10% of its weight for the first tenth of Config.SlowStart
// after its ReadySince, 20% for the second, and so on to 100% for the
// last tenth and after.
const SlowStartSteps = 10

// rampPermille returns the thousandths of its weight that a backend ready
// since since counts with at now under a slow start of d, and when that
// changes next (zero when it no longer will). The step is a function of
// the wall-clock time alone, so replicas whose clocks agree choose alike
// except within their clock difference of a step's start. A ReadySince in
// the future (a clock behind the source's) counts as the first step.
func rampPermille(since, now time.Time, d time.Duration) (permille uint16, next time.Time) {
	if d <= 0 || since.IsZero() {
		return 1000, time.Time{}
	}
	step := d / SlowStartSteps
	k := int64(0)
	if e := now.Sub(since); e > 0 {
		k = int64(e / step)
	}
	if k >= SlowStartSteps-1 {
		return 1000, time.Time{}
	}
	return uint16((k + 1) * 1000 / SlowStartSteps), since.Add(time.Duration(k+1) * step)
}

// Version counts the snapshots the registry has published: 0 is the empty
// snapshot a new registry starts with, and every accepted Update, every
// health change (Marks.SetDown) and every slow-start step adds one.
func (s *Snapshot) Version() uint64 { return s.version }

// Backends returns all backends of the snapshot, gone ones included, sorted
// by ordinal, in their routing state: a backend its source calls ready but
// a health checker marked down is listed as draining (see Down). The slice is the snapshot's own: read it, never modify it
// (slices.Clone it to get a copy).
func (s *Snapshot) Backends() []Backend { return s.list[:len(s.list):len(s.list)] }

// Len returns the number of backends in the snapshot, in any state.
func (s *Snapshot) Len() int { return len(s.list) }

// Down reports whether the backend with the given ordinal is ready by its
// source but marked down by a health checker (Marks.SetDown), so that
// it is routed as draining.
func (s *Snapshot) Down(ordinal uint8) bool { return s.down[ordinal/64]&(1<<(ordinal%64)) != 0 }

// CountDown returns the number of backends marked down (see Down); Count
// counts them as draining.
func (s *Snapshot) CountDown() int { return s.ndown }

// Count returns the number of backends in state st as routed: a backend
// marked down counts as draining.
func (s *Snapshot) Count(st State) int {
	if st > Gone {
		return 0
	}
	return s.counts[st]
}

// Backend returns the backend with the given ordinal in any state; ok is
// false when the snapshot has none (always for 255).
func (s *Snapshot) Backend(ordinal uint8) (b *Backend, ok bool) {
	i := s.byOrd[ordinal]
	if i == noIndex {
		return nil, false
	}
	return &s.list[i], true
}

// Serving returns the backend with the given ordinal if it serves
// established sessions (ready or draining). This is the lookup for a
// datagram whose CID names its backend: when ok is false the datagram is
// dropped, never re-hashed.
func (s *Snapshot) Serving(ordinal uint8) (b *Backend, ok bool) {
	i := s.byOrd[ordinal]
	if i == noIndex {
		return nil, false
	}
	b = &s.list[i]
	return b, b.State != Gone
}

// PickNew chooses the backend for a new session by weighted rendezvous
// hashing of key over the ready backends (see package hrw for the key
// format). ok is false when no backend is ready.
func (s *Snapshot) PickNew(key []byte) (b *Backend, ok bool) {
	if s.pick == nil {
		return nil, false
	}
	o, ok := s.pick.Pick(key)
	if !ok {
		return nil, false
	}
	return s.Backend(o)
}

// PickNewAddrs is PickNew with the key made of the client and service
// addresses (hrw.Table.PickAddrs), for DTLS datagrams without a CID.
func (s *Snapshot) PickNewAddrs(client, service netip.AddrPort) (b *Backend, ok bool) {
	if s.pick == nil {
		return nil, false
	}
	o, ok := s.pick.PickAddrs(client, service)
	if !ok {
		return nil, false
	}
	return s.Backend(o)
}

// Permille returns the thousandths of its weight that the backend with
// the given ordinal counts with for new sessions: below 1000 while it is
// in slow start (Config.SlowStart), 1000 for any other ready backend, 0
// for one that is not ready.
func (s *Snapshot) Permille(ordinal uint8) uint16 {
	for _, c := range s.ready {
		if c.Ordinal == ordinal {
			if c.Permille == 0 {
				return 1000
			}
			return c.Permille
		}
	}
	return 0
}

// SlowStarting returns the number of ready backends in slow start.
func (s *Snapshot) SlowStarting() int { return s.ramping }

// Table returns the HRW table that PickNew and PickNewAddrs use, over the
// ready backends; nil when none is ready. It is shared, immutable, and for
// code that must pick exactly as the snapshot does outside Go (the XDP
// fast path).
func (s *Snapshot) Table() *hrw.Table { return s.pick }

// IsBackend reports whether addr, the physical sender of a reply, is a ready
// or draining backend of the service: a draining backend still answers its
// established sessions. A gone backend is not one, because its address may
// already belong to something else. IPv4-mapped addresses match their IPv4
// form.
func (s *Snapshot) IsBackend(addr netip.AddrPort) bool {
	return s.addrs.find(s.list, addr) != noIndex
}

// BackendByAddr returns the ready or draining backend at addr, under the
// same rules as IsBackend.
func (s *Snapshot) BackendByAddr(addr netip.AddrPort) (b *Backend, ok bool) {
	i := s.addrs.find(s.list, addr)
	if i == noIndex {
		return nil, false
	}
	return &s.list[i], true
}
