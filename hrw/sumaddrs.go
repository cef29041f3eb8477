//go:build !cidroute_plain_hrw

package hrw

import (
	"math/bits"
	"net/netip"

	"github.com/cidroute/cidroute/internal/addr"
)

// sumAddrs is sum64(AppendAddr(AppendAddr(nil, c), s), seed) with the
// 36-byte key's XXH64 lanes made from the addresses' words: building the
// key bytewise and loading it back by words stalls on store forwarding.
// One of the tricks issue 18 measures (bash bench/tricks.sh e2e 4,
// 2026-12-01, load 3-4, noise about ±1.7 %): end to end it saves -0.3 %
// at 100k/s, -0.3 % at 50k/s, -1.6 % at 25k/s, nothing measurable; it
// stays for the routing step's 60 ns target (see dispatch.go), which the
// cidroute_plain_hrw build of sumaddrs_plain.go misses with the plain
// dispatch.
func sumAddrs(c, s netip.AddrPort, seed uint64) uint64 {
	c0, c1 := lanes(c.Addr())
	s0, s1 := lanes(s.Addr())
	cp := uint64(bits.ReverseBytes16(c.Port()))
	sp := uint64(bits.ReverseBytes16(s.Port()))

	v1 := round(seed+prime1+prime2, c0)
	v2 := round(seed+prime2, c1)
	v3 := round(seed, cp|s0<<16)
	v4 := round(seed-prime1, s0>>48|s1<<16)
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = mergeRound(h, v1)
	h = mergeRound(h, v2)
	h = mergeRound(h, v3)
	h = mergeRound(h, v4)
	h += 2 * AddrLen
	h ^= (s1>>48 | sp<<16) * prime1
	h = bits.RotateLeft64(h, 23)*prime2 + prime3
	return avalanche(h)
}

// lanes returns a's 16-byte form (AppendAddr) as two little-endian words.
func lanes(a netip.Addr) (uint64, uint64) {
	hi, lo := addr.Words(a)
	return bits.ReverseBytes64(hi), bits.ReverseBytes64(lo)
}
