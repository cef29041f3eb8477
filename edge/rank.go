package edge

import (
	"cmp"
	"net/netip"
	"slices"
	"time"
)

// A Sample is what one probe measured through one edge.
type Sample struct {
	// RTT is the round-trip time the handshake saw, through the edge to a
	// backend and back: what the switch thresholds compare.
	RTT time.Duration `json:"rtt"`
	// Handshake is how long the whole handshake took (several round
	// trips), for the record.
	Handshake time.Duration `json:"handshake"`
}

// An Entry is one candidate's place in a Ranking.
type Entry struct {
	Addr   netip.AddrPort `json:"addr"`            // the candidate edge
	OK     bool           `json:"ok"`              // its last probe succeeded
	Sample Sample         `json:"sample,omitzero"` // the last successful probe's
	At     time.Time      `json:"at,omitzero"`     // when it was last probed
	Err    string         `json:"error,omitempty"` // why the last probe failed
}

// A Ranking orders an address set, best first: the candidates whose last
// probe succeeded by RTT, then the others in the resolver's order.
type Ranking struct {
	// Set is the address set the ranking was measured from, sorted. A
	// ranking is valid only for the same set.
	Set      []netip.AddrPort `json:"set"`
	Entries  []Entry          `json:"entries"`  // best first
	Measured time.Time        `json:"measured"` // the last full measurement
}

// Order returns the ranked addresses, best first.
func (r *Ranking) Order() []netip.AddrPort {
	out := make([]netip.AddrPort, len(r.Entries))
	for i, e := range r.Entries {
		out[i] = e.Addr
	}
	return out
}

// Best returns the first entry, if its probe succeeded.
func (r *Ranking) Best() (Entry, bool) {
	if len(r.Entries) == 0 || !r.Entries[0].OK {
		return Entry{}, false
	}
	return r.Entries[0], true
}

// Any reports whether some candidate's last probe succeeded.
func (r *Ranking) Any() bool {
	_, ok := r.Best()
	return ok
}

func (r *Ranking) index(a netip.AddrPort) int {
	return slices.IndexFunc(r.Entries, func(e Entry) bool { return e.Addr == a })
}

func (r *Ranking) clone() *Ranking {
	if r == nil {
		return nil
	}
	return &Ranking{Set: slices.Clone(r.Set), Entries: slices.Clone(r.Entries), Measured: r.Measured}
}

// sort orders the entries best first. It is stable, so the failed ones
// keep the resolver's order they were built in, and equal RTTs keep theirs.
func (r *Ranking) sort() {
	slices.SortStableFunc(r.Entries, func(a, b Entry) int {
		switch {
		case a.OK && !b.OK:
			return -1
		case !a.OK && b.OK:
			return 1
		case a.OK && b.OK:
			return cmp.Compare(a.Sample.RTT, b.Sample.RTT)
		}
		return 0
	})
}

// valid reports whether r can be used for the address set set (sorted).
func (r *Ranking) valid(set []netip.AddrPort) bool {
	if r == nil || !slices.Equal(r.Set, set) || len(r.Entries) != len(set) {
		return false
	}
	for _, e := range r.Entries {
		if _, found := slices.BinarySearchFunc(set, e.Addr, compareAddrPort); !found {
			return false
		}
	}
	return true
}

// setOf returns addrs sorted, without duplicates: the identity of an
// address set.
func setOf(addrs []netip.AddrPort) []netip.AddrPort {
	s := slices.Clone(addrs)
	slices.SortFunc(s, compareAddrPort)
	return slices.Compact(s)
}

func compareAddrPort(a, b netip.AddrPort) int { return a.Compare(b) }

// better reports whether a candidate with round-trip time cand beats the
// current edge's cur by at least minGain and at least pct percent of cur.
// Both must hold: the absolute gain alone would move 100 ms to 79 ms, the
// relative one alone 4 ms to 3 ms. Integer arithmetic, so it decides the
// same everywhere.
func better(cand, cur, minGain time.Duration, pct int) bool {
	gain := cur - cand
	return gain >= minGain && int64(gain)*100 >= int64(pct)*int64(cur)
}
