//go:build purego

package addr

import "net/netip"

// direct is false: the purego build reads addresses through As16 only.
const direct = false

// Words returns a's 16-byte form (As16: IPv4 as IPv4-mapped IPv6, zone
// dropped, the zero Addr as zeros) as two big-endian words.
func Words(a netip.Addr) (hi, lo uint64) { return slow(a) }
