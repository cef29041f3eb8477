package hrw

import (
	"encoding/binary"
	"math/bits"
	"net/netip"

	"github.com/cidroute/cidroute/internal/addr"
)

// sumAddrs is sum64 of the 36-byte key AppendAddr(AppendAddr(nil, c), s).
// The key is stored as the little-endian words XXH64 loads, not byte by
// byte: a word loaded over several narrower stores misses store forwarding,
// and that stall cost more than the hash (PickAddrs 37 ns with the key
// built by AppendAddr, 15 ns so).
func sumAddrs(c, s netip.AddrPort, seed uint64) uint64 {
	c0, c1 := lanes(c.Addr())
	s0, s1 := lanes(s.Addr())
	cp := uint64(bits.ReverseBytes16(c.Port()))
	sp := uint64(bits.ReverseBytes16(s.Port()))
	var k [2*AddrLen + 4]byte
	le := binary.LittleEndian
	le.PutUint64(k[0:], c0)
	le.PutUint64(k[8:], c1)
	le.PutUint64(k[16:], cp|s0<<16)
	le.PutUint64(k[24:], s0>>48|s1<<16)
	le.PutUint64(k[32:], s1>>48|sp<<16)
	return sum64(k[:2*AddrLen], seed)
}

// lanes returns a's 16-byte form (AppendAddr) as two little-endian words.
func lanes(a netip.Addr) (uint64, uint64) {
	hi, lo := addr.Words(a)
	return bits.ReverseBytes64(hi), bits.ReverseBytes64(lo)
}
