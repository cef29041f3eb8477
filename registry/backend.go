package registry

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Errors wrapped by [Validate], [Registry.Update] and [DecodeBackends].
// Test for them with errors.Is.
var (
	ErrReservedOrdinal  = errors.New("registry: ordinal 255 is reserved")    // 255 marks CIDs no backend issued
	ErrInvalidOrdinal   = errors.New("registry: ordinal out of range 0-254") // a JSON ordinal outside 0-254
	ErrDuplicateOrdinal = errors.New("registry: duplicate ordinal")          // two backends would own the same CIDs
	ErrDuplicateAddr    = errors.New("registry: duplicate address")          // two ordinals at one address
	ErrInvalidAddr      = errors.New("registry: invalid address")            // not a unicast IP address and port
	ErrUnspecifiedAddr  = errors.New("registry: unspecified address")        // 0.0.0.0 or ::, nowhere to send to
	ErrZeroPort         = errors.New("registry: zero port")                  // port 0, nowhere to send to
	// ErrZeroWeight: a JSON backend says "weight": 0. In Go a zero Weight
	// is the default 1; a file can say the default by leaving the key out,
	// so an explicit 0 can only be meant as "no new sessions", which is
	// what "state": "draining" says.
	ErrZeroWeight   = errors.New("registry: zero weight")
	ErrInvalidState = errors.New("registry: invalid state")                                       // not ready, draining or gone
	ErrEmptyList    = errors.New("registry: empty backend list (mark the backends gone instead)") // usually a source's mistake, so refused
	ErrDecode       = errors.New("registry: bad backend list")                                    // malformed JSON, or a key of the wrong type
)

// ErrConfig is wrapped by the errors of an invalid Config (New, NewStatic).
var ErrConfig = errors.New("registry: invalid configuration")

// MaxOrdinal is the highest ordinal a backend may have; 255 is reserved.
const MaxOrdinal = 254

// State is a backend's readiness.
type State uint8

const (
	// Ready backends take new sessions and serve established ones. It is
	// the zero value.
	Ready State = iota
	// Draining backends serve their established sessions but take no new
	// ones (Kubernetes: serving and terminating).
	Draining
	// Gone backends serve nothing: datagrams for their CIDs are dropped.
	Gone
)

var stateNames = [...]string{Ready: "ready", Draining: "draining", Gone: "gone"}

// String returns "ready", "draining" or "gone" (or "State(n)" for an invalid
// value).
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Serving reports whether a backend in this state still serves established
// sessions (ready or draining).
func (s State) Serving() bool { return s == Ready || s == Draining }

// ParseState parses "ready", "draining" or "gone" (exactly, lower case).
func ParseState(s string) (State, error) {
	for i, n := range stateNames {
		if s == n {
			return State(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrInvalidState, s)
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if int(s) >= len(stateNames) {
		return nil, fmt.Errorf("%w: %d", ErrInvalidState, uint8(s))
	}
	return []byte(stateNames[s]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Backend is one server of a service.
type Backend struct {
	// Ordinal is the value the backend writes into its connection IDs,
	// 0–254 (a StatefulSet pod's index).
	Ordinal uint8
	// Addr is where the proxy sends the backend's datagrams, and the
	// physical source its replies must come from. An IPv4-mapped IPv6
	// address is stored in its IPv4 form.
	Addr netip.AddrPort
	// Weight is the backend's relative share of new sessions. 0 means 1,
	// the default, as it does for hrw.Candidate: a weight never says "no
	// new sessions", the Draining state does. A snapshot holds the
	// effective weight. (The JSON form refuses an explicit 0: see
	// ErrZeroWeight.)
	Weight uint32
	// State is Ready (the zero value), Draining or Gone.
	State State
	// ReadySince is when the backend became ready, as its source records
	// it (a Kubernetes Pod's Ready condition, a file's "ready_since"), so
	// that every proxy replica reads the same time. With the registry's
	// Config.SlowStart it ramps the backend's share of new sessions from
	// then on; the zero time means "long ago": no ramp. A registry holds
	// it in UTC.
	ReadySince time.Time
}

// String formats b as {ordinal address weight state}, with the
// ReadySince time (RFC 3339) after the state when it is set.
func (b Backend) String() string {
	if b.ReadySince.IsZero() {
		return fmt.Sprintf("{%d %v %d %v}", b.Ordinal, b.Addr, b.Weight, b.State)
	}
	return fmt.Sprintf("{%d %v %d %v %s}", b.Ordinal, b.Addr, b.Weight, b.State, b.ReadySince.Format(time.RFC3339Nano))
}

// normalize returns b with the defaults applied: weight 0 → 1 and an
// IPv4-mapped address unmapped, so that ::ffff:10.0.0.1 and 10.0.0.1 are the
// same backend whichever socket family measured the sender.
func (b Backend) normalize() Backend {
	if b.Weight == 0 {
		b.Weight = 1
	}
	if b.Addr.Addr().Is4In6() {
		b.Addr = netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
	}
	b.ReadySince = b.ReadySince.UTC() // and no monotonic reading: == compares instants
	return b
}

// check validates one backend on its own.
func (b Backend) check() error {
	a := b.Addr.Addr()
	switch {
	case b.Ordinal > MaxOrdinal:
		return ErrReservedOrdinal
	case !a.IsValid():
		return ErrInvalidAddr
	case a.IsUnspecified():
		return ErrUnspecifiedAddr
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%w: not unicast", ErrInvalidAddr)
	case b.Addr.Port() == 0:
		return ErrZeroPort
	case b.State > Gone:
		return fmt.Errorf("%w: %d", ErrInvalidState, uint8(b.State))
	}
	return nil
}

// Validate checks a whole backend list the way [Registry.Update] does: the
// list must not be empty, every backend needs an ordinal 0–254, a valid unicast address that is not
// unspecified, a non-zero port and a known state; no two backends may share
// an ordinal or an address (IPv4-mapped addresses count as IPv4), whatever
// their states. The error wraps one of the Err* sentinels and names the
// offending entry.
//
// An empty list is refused ([ErrEmptyList]) from every source alike: it
// is what a truncated file or a broken source produces, and publishing it
// would turn every live session's datagrams into unknown ordinals. A list
// whose backends are all gone says "nothing serves" on purpose.
func Validate(bs []Backend) error {
	_, err := validate(bs)
	return err
}

// validate checks bs and returns a normalized copy.
func validate(bs []Backend) ([]Backend, error) {
	if len(bs) == 0 {
		return nil, ErrEmptyList
	}
	out := make([]Backend, len(bs))
	var ords [256]int // index+1 of the backend holding each ordinal
	addrs := make(map[netip.AddrPort]int, len(bs))
	for i, b := range bs {
		b = b.normalize()
		if err := b.check(); err != nil {
			return nil, entryError(i, b, err)
		}
		if j := ords[b.Ordinal]; j != 0 {
			return nil, fmt.Errorf("%s: %w with backends[%d]", entryName(i, b), ErrDuplicateOrdinal, j-1)
		}
		ords[b.Ordinal] = i + 1
		if j, ok := addrs[b.Addr]; ok {
			return nil, fmt.Errorf("%s: %w with backends[%d]", entryName(i, b), ErrDuplicateAddr, j)
		}
		addrs[b.Addr] = i
		out[i] = b
	}
	return out, nil
}

func entryName(i int, b Backend) string {
	return fmt.Sprintf("backends[%d] (ordinal %d, %v)", i, b.Ordinal, b.Addr)
}

func entryError(i int, b Backend, err error) error {
	return fmt.Errorf("%s: %w", entryName(i, b), err)
}
