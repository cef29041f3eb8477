package edge

import (
	"fmt"
	"net/netip"
	"time"
)

// A Reason says why the session moved to another edge.
type Reason uint8

// Switch reasons.
const (
	// Better: a candidate beat the current edge by the thresholds in
	// Streak rounds in a row.
	Better Reason = iota + 1
	// Failing: the current edge failed its probe in Streak rounds in a row
	// while a candidate answered. The session may still be working, but a
	// handshake through the edge does not, so a reconnect would not.
	Failing
	// Unreachable: the dialer saw the session go silent through the current
	// edge (Failover).
	Unreachable
	// Removed: the current edge left the address set.
	Removed

	numReasons = iota + 1
)

var reasonNames = [numReasons]string{
	Better:      "better",
	Failing:     "failing",
	Unreachable: "unreachable",
	Removed:     "removed",
}

// String returns the reason's log and metric label.
func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// A Switch moves the session from one edge to another.
type Switch struct {
	From, To netip.AddrPort // the current edge and the new one
	Reason   Reason         // why the session moves
	// FromRTT and ToRTT are the round-trip times of the last round
	// (FromRTT is zero when the current edge failed its probe, ToRTT when
	// the target was not probed, as in a failover).
	FromRTT, ToRTT time.Duration
}

// An EventKind says what an Event reports.
type EventKind uint8

// Event kinds, and the Event fields each sets.
const (
	EventResolved     EventKind = iota + 1 // Addrs: the resolver's answer, in its order (Err: it failed, Addrs is the last known set)
	EventSkipped                           // Addrs: fewer than two candidates, nothing probed
	EventDiscarded                         // Ranking: a stored ranking whose address set differs from Addrs
	EventProbe                             // Addr, Sample or Err: one probe
	EventRanked                            // Ranking: the ranking after a measurement
	EventFallback                          // Addrs: every probe failed; the resolver's order is used
	EventCycle                             // Switch (nil: none due): a watch round ended
	EventScheduled                         // Delay: the next watch round
	EventSwitch                            // Switch: the session moved
	EventSwitchFailed                      // Switch, Err: moving the session failed; it stays
	EventStoreError                        // Err: the Store could not load or save
)

var kindNames = [...]string{
	EventResolved:     "resolved",
	EventSkipped:      "skipped",
	EventDiscarded:    "discarded",
	EventProbe:        "probe",
	EventRanked:       "ranked",
	EventFallback:     "fallback",
	EventCycle:        "cycle",
	EventScheduled:    "scheduled",
	EventSwitch:       "switch",
	EventSwitchFailed: "switch_failed",
	EventStoreError:   "store_error",
}

// String returns the kind's log label, such as "switch_failed".
func (k EventKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// An Event is something a Chooser did. Its slices and pointers are the
// receiver's to keep.
type Event struct {
	Kind    EventKind        // what happened; it says which fields below are set
	Time    time.Time        // when, by the Chooser's Clock
	Addrs   []netip.AddrPort // the candidate set
	Addr    netip.AddrPort   // the probed edge
	Sample  Sample           // a successful probe's measurement
	Err     error            // what failed
	Ranking *Ranking         // a new or discarded ranking
	Switch  *Switch          // a move, due or made
	Delay   time.Duration    // until the next watch round
}

// Stats counts what a Chooser did since it was created.
type Stats struct {
	Resolves, ResolveErrors uint64             // resolver calls, and those that failed
	Measures                uint64             // full measurements of the set
	Cycles                  uint64             // watch rounds
	Probes, ProbeErrors     uint64             // probes sent, and those that failed
	Skipped                 uint64             // rounds with fewer than two candidates
	Fallbacks               uint64             // every probe failed: resolver order
	Discarded               uint64             // rankings dropped for a changed address set
	Switches                [numReasons]uint64 // by Reason
	SwitchErrors            uint64             // moves that failed (EventSwitchFailed)
	StoreErrors             uint64             // Store loads and saves that failed
}

// SwitchesTotal is Σ Switches.
func (s *Stats) SwitchesTotal() uint64 {
	var t uint64
	for _, n := range s.Switches {
		t += n
	}
	return t
}
