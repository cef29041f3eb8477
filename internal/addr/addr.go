// Package addr reads a netip.Addr's 16-byte form as two words, and unmaps
// addresses, for the core packages.
//
// As16 returns an array, and copying that array out of the inlined call
// reloads its two 8-byte stores as one 16-byte load, which defeats store
// forwarding: on amd64 that stall costs more than hashing or encoding the
// address. netip has no integer accessor, so Words reads the words netip
// keeps (its unexported uint128) directly, once a start-up check has
// confirmed that the layout is the one expected; otherwise it falls back to
// As16. Either way the result is As16's, which the tests hold it to on every
// architecture CI runs.
//
// The direct read is one of the tricks issue 18 measures end to end: the
// purego build tag (xxhash's convention) compiles the portable As16 path
// only, with no unsafe, and CI runs the tests both ways. measured end to end (bash bench/tricks.sh e2e 4, 2026-12-01, load 3-4: cidproxy's CPU per datagram under ../shared/bench against the build without it; noise about ±1.7 %): it
// saves 1.3 % at 100k/s, 0.7 % at 50k/s, 0.8 % at 25k/s: kept, at the 1 %
// line.
package addr

import (
	"encoding/binary"
	"net/netip"
)

// slow is Words by As16, the portable path.
func slow(a netip.Addr) (hi, lo uint64) {
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
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
