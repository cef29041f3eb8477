// Package addr reads a netip.Addr's 16-byte form as two words.
//
// As16 returns an array, and copying that array out of the inlined call
// reloads its two 8-byte stores as one 16-byte load, which defeats store
// forwarding: on amd64 that stall costs more than hashing or encoding the
// address. netip has no integer accessor, so Words reads the words netip
// keeps (its unexported uint128) directly, once a start-up check has
// confirmed that the layout is the one expected; otherwise it falls back to
// As16. Either way the result is As16's, which the tests hold it to on every
// architecture CI runs.
package addr

import (
	"encoding/binary"
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

func slow(a netip.Addr) (hi, lo uint64) {
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
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

// probes are addresses whose words differ in every byte between them.
func probes() []netip.Addr {
	return []netip.Addr{
		{},
		netip.AddrFrom4([4]byte{192, 0, 2, 1}),
		netip.AddrFrom4([4]byte{255, 254, 253, 252}),
		netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}),
		netip.AddrFrom16([16]byte{0xfe, 0x80, 15: 1}).WithZone("eth0"),
		netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}),
	}
}

// Unmap returns a with an IPv4-mapped IPv6 address in its IPv4 form, the
// form sockets (udpio), the registry and PPv2 decoding report.
func Unmap(a netip.AddrPort) netip.AddrPort {
	if a.Addr().Is4In6() {
		return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	}
	return a
}
