package cidroute

// A Reason says why a datagram was dropped. The zero Reason means it was
// forwarded.
type Reason uint8

// Drop reasons. Every dropped datagram is counted under exactly one.
const (
	Forwarded       Reason = iota // not a drop
	Malformed                     // the classifier rejected the datagram
	UnknownOrdinal                // CID ordinal reserved (255) or not in the registry
	NotServing                    // CID ordinal names a backend that is gone
	NoReadyBackend                // a new session, and no backend is ready
	StaleRegistry                 // a new session while the registry is stale
	RateLimited                   // an admission limit refused it
	UntrustedSender               // reverse: the physical sender is not a backend
	BadProxyHeader                // reverse: no, invalid or foreign PPv2 header
	BadDestination                // reverse: the client address is not a valid unicast peer
	SendError                     // the kernel refused to send it
	SessionLimit                  // transparent mode: the session table is full

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
}

// String returns the reason's metric label ("" for Forwarded).
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "invalid"
}
