package cidroute

import (
	"errors"
	"iter"
	"syscall"
)

// A Reason says why a datagram was dropped. The zero Reason means it was
// forwarded.
type Reason uint8

// Drop reasons. Every dropped datagram is counted under exactly one.
const (
	Forwarded       Reason = iota // not a drop
	Malformed                     // the classifier rejected the datagram, or a reply had no payload
	UnknownOrdinal                // CID ordinal reserved (255) or not in the registry
	NotServing                    // CID ordinal names a backend that is gone
	NoReadyBackend                // a new session, and no backend is ready
	StaleRegistry                 // a new session while the registry is stale
	RateLimited                   // an admission limit refused it
	UntrustedSender               // reverse: the physical sender is not a backend
	BadProxyHeader                // reverse: no, invalid or foreign PPv2 header
	BadDestination                // reverse: the client address is not a valid unicast peer of the service, or one of the proxy's own
	SendError                     // the kernel refused to send it
	SessionLimit                  // transparent mode: the session table is full
	Unroutable                    // forward: a QUIC-LB CID no configuration decodes, and RouterConfig.Unroutable is UnroutableDrop
	OwnAddress                    // forward: the chosen backend is one of the proxy's own addresses (a loop)
	TooBig                        // larger than Config.MaxDatagram (PPv2 header not counted), or the kernel refused to send it as too big (EMSGSIZE)
	CIDLength                     // forward: a CID of another length than the service's (see ErrCIDLength): the backends and the proxy disagree on it
	DTLS13NoCID                   // forward: valid DTLS 1.3 records the service cannot route by CID (see ErrDTLS13NoCID): none carries one where RouterConfig.RequireDTLS13CID asks for it, or the only one is too short for the service's CID length

	// NumReasons is the number of Reasons, Forwarded included: the size
	// of Counters.Dropped.
	NumReasons = iota
)

var reasonNames = [NumReasons]string{
	Forwarded:       "",
	Malformed:       "malformed",
	UnknownOrdinal:  "unknown_ordinal",
	NotServing:      "not_serving",
	NoReadyBackend:  "no_ready_backend",
	StaleRegistry:   "stale_registry",
	RateLimited:     "rate_limited",
	UntrustedSender: "untrusted_sender",
	BadProxyHeader:  "bad_proxy_header",
	BadDestination:  "bad_destination",
	SendError:       "send_error",
	SessionLimit:    "session_limit",
	Unroutable:      "unroutable",
	OwnAddress:      "own_address",
	TooBig:          "too_big",
	CIDLength:       "cid_length",
	DTLS13NoCID:     "dtls13_no_cid",
}

// String returns the reason's metric label ("" for Forwarded).
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "invalid"
}

// A ReasonSet is a set of drop reasons.
type ReasonSet uint32

// The drop reasons each direction can count: a metrics exporter lists them
// from the start, at zero, so that a new reason cannot go missing from it.
const (
	// ForwardDrops are the reasons of the client → backend direction.
	ForwardDrops ReasonSet = 1<<Malformed | 1<<UnknownOrdinal | 1<<NotServing | 1<<Unroutable |
		1<<NoReadyBackend | 1<<StaleRegistry | 1<<RateLimited | 1<<OwnAddress | 1<<SessionLimit | 1<<SendError | 1<<TooBig | 1<<CIDLength |
		1<<DTLS13NoCID
	// ReverseDrops are the reasons of the backend → client direction.
	ReverseDrops ReasonSet = 1<<Malformed | 1<<UntrustedSender | 1<<BadProxyHeader | 1<<BadDestination | 1<<SendError | 1<<TooBig
)

// sendReason is the drop reason of a datagram the kernel refused to send.
func sendReason(err error) Reason {
	if errors.Is(err, syscall.EMSGSIZE) {
		return TooBig
	}
	return SendError
}

// Has reports whether r is in s.
func (s ReasonSet) Has(r Reason) bool { return r < NumReasons && s&(1<<r) != 0 }

// All yields the reasons of s in ascending order.
func (s ReasonSet) All() iter.Seq[Reason] {
	return func(yield func(Reason) bool) {
		for r := Reason(1); r < NumReasons; r++ {
			if s.Has(r) && !yield(r) {
				return
			}
		}
	}
}
