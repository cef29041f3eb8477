package registry

import (
	"math/bits"
	"net/netip"

	"github.com/cidroute/cidroute/internal/addr"
)

// addrTable finds a backend by address: open addressing with linear probing
// over a power-of-two array of indexes into the snapshot's list, kept at most
// a quarter full. The keys are the service's own backends, not attacker
// input, so a fixed multiplicative hash is enough: a sender can probe the
// table but cannot lengthen its chains. Measured against a
// map[netip.AddrPort]uint8 in BenchmarkIsBackend; see the notes.
type addrTable struct {
	slots []uint8 // index into the list, noIndex when empty
	shift uint    // 64 - log2(len(slots))
}

// newAddrTable indexes the n serving backends of bs. Even an empty table
// has slots, so that find needs no emptiness check.
func newAddrTable(bs []Backend, n int) addrTable {
	size := 8
	for size < 4*n {
		size <<= 1
	}
	t := addrTable{slots: make([]uint8, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range t.slots {
		t.slots[i] = noIndex
	}
	mask := size - 1
	for i, b := range bs {
		if !b.State.Serving() {
			continue
		}
		h := t.home(b.Addr)
		for t.slots[h] != noIndex {
			h = (h + 1) & mask
		}
		t.slots[h] = uint8(i)
	}
	return t
}

// home returns the first slot to probe for ap: a multiplicative hash of the
// 16-byte form and the port (not the zone: addresses that differ only by
// zone share a chain and are told apart by ==). The 16-byte form of an
// IPv4 address and of its IPv4-mapped twin are the same, so both start at
// the same slot.
func (t *addrTable) home(ap netip.AddrPort) int {
	hi, lo := addr.Words(ap.Addr())
	p := uint64(ap.Port())
	x := lo ^ p ^ p<<48 + hi*0xff51afd7ed558ccd
	return int(x * 0x9e3779b97f4a7c15 >> t.shift)
}

// find returns the index in list of the serving backend at ap, or noIndex.
func (t *addrTable) find(list []Backend, ap netip.AddrPort) uint8 {
	mask := len(t.slots) - 1
	h := t.home(ap)
	if a := ap.Addr(); a.Is4In6() {
		ap = netip.AddrPortFrom(a.Unmap(), ap.Port())
	}
	for {
		i := t.slots[h]
		if i == noIndex || list[i].Addr == ap {
			return i
		}
		h = (h + 1) & mask
	}
}
