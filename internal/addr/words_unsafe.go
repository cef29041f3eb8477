//go:build !purego

package addr

import (
	"net/netip"
	"unsafe"
)

// direct reports that a netip.Addr starts with its address as two uint64s,
// high word first, as in Go 1.18 through at least 1.26.
var direct = layoutOK()

// Words returns a's 16-byte form (As16: IPv4 as IPv4-mapped IPv6, zone
// dropped, the zero Addr as zeros) as two big-endian words.
func Words(a netip.Addr) (hi, lo uint64) {
	if direct {
		w := (*[2]uint64)(unsafe.Pointer(&a))
		return w[0], w[1]
	}
	return slow(a)
}

func layoutOK() bool {
	if unsafe.Sizeof(netip.Addr{}) < 16 || unsafe.Alignof(netip.Addr{}) < unsafe.Alignof(uint64(0)) {
		return false
	}
	for _, a := range probes() {
		w := (*[2]uint64)(unsafe.Pointer(&a))
		if hi, lo := slow(a); w[0] != hi || w[1] != lo {
			return false
		}
	}
	return true
}
