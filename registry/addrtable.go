package registry

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
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

// newAddrTable indexes the n serving backends of bs.
func newAddrTable(bs []Backend, n int) addrTable {
	if n == 0 {
		return addrTable{}
	}
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
		h := int(hashAddr(b.Addr) >> t.shift)
		for t.slots[h] != noIndex {
			h = (h + 1) & mask
		}
		t.slots[h] = uint8(i)
	}
	return t
}

// hashAddr mixes the 16-byte address and the port (not the zone: addresses
// that differ only by zone share a chain and are told apart by ==). Only
// the top bits are used.
func hashAddr(ap netip.AddrPort) uint64 {
	a := ap.Addr().As16()
	hi := binary.BigEndian.Uint64(a[:8])
	lo := binary.BigEndian.Uint64(a[8:])
	p := uint64(ap.Port())
	x := lo ^ p ^ p<<48 + hi*0xff51afd7ed558ccd
	return x * 0x9e3779b97f4a7c15
}

// find returns the index in list of the serving backend at ap, or noIndex.
func (t *addrTable) find(list []Backend, ap netip.AddrPort) uint8 {
	if len(t.slots) == 0 {
		return noIndex
	}
	if a := ap.Addr(); a.Is4In6() {
		ap = netip.AddrPortFrom(a.Unmap(), ap.Port())
	}
	mask := len(t.slots) - 1
	for h := int(hashAddr(ap) >> t.shift); ; h = (h + 1) & mask {
		i := t.slots[h]
		if i == noIndex || list[i].Addr == ap {
			return i
		}
	}
}
