package quic

import (
	"errors"
	"fmt"
)

// MinInitialDCIDLen is the shortest DCID a client may give its first
// Initial packet, random (RFC 9000 §7.2). Most clients use exactly this
// length (Chromium among them); quic-go picks 8 to 20 at random.
const MinInitialDCIDLen = 8

// ErrServerCIDLen is wrapped by CheckServerCIDLen's error.
var ErrServerCIDLen = errors.New("quic: server CID length a client's random DCID has")

// CheckServerCIDLen returns nil when n octets is a usable server CID
// length for a QUIC service, and otherwise an error wrapping
// ErrServerCIDLen (or ErrCIDLength outside 1..MaxCIDLen). The one length
// refused is MinInitialDCIDLen, 8.
//
// Why: an Initial or 0-RTT packet whose DCID has the server length is
// routed to the backend its ordinal names, because after the server's
// first Initial a client addresses the rest of its Initials (and after a
// Retry all of them) to the server's CID. A client's first, random DCID
// of that length decodes too, whenever it looks like a CID of a serving
// backend, and is then routed by its random bytes instead of by HRW: past
// the weights, and onto draining backends. At 8 octets that is most
// clients' first DCID; at 12 (the QUIC-LB default) only quic-go's 1 in 13,
// of which the QUIC-LB codec decodes 1 in 8 (the config rotation bits).
// Lengths below 8 never collide. A codec that decodes nearly every
// string of its length (the ordinal-first codec) should stay below 8.
func CheckServerCIDLen(n int) error {
	switch {
	case n < 1 || n > MaxCIDLen:
		return fmt.Errorf("server CID length %d not in 1..%d: %w", n, MaxCIDLen, ErrCIDLength)
	case n == MinInitialDCIDLen:
		return fmt.Errorf("%w: %d octets, the length most clients give their first, random DCID; new sessions would go by its bytes, not by HRW (use 12, the default, or fewer than 8)", ErrServerCIDLen, n)
	}
	return nil
}
