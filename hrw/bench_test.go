package hrw

import (
	"fmt"
	"net/netip"
	"testing"
)

// mixedCands returns n candidates with ordinals 0..n-1 and weights 1..4.
func mixedCands(n int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{Ordinal: uint8(i), Weight: uint32(1 + i%4)}
	}
	return cs
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{3, 32, 254} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			t, err := New(42, mixedCands(n))
			if err != nil {
				b.Fatal(err)
			}
			// Keys are read from a buffer written beforehand, as a
			// datagram is: bytes stored just before the hash reads them by
			// words would measure a store-forwarding stall instead.
			const n = 2 * AddrLen
			keys := make([]byte, 4096*n)
			for i := range keys {
				keys[i] = byte(i*7919 + i>>8)
			}
			b.SetBytes(n)
			b.ReportAllocs()
			off := 0
			for b.Loop() {
				t.Pick(keys[off : off+n])
				if off += n; off == len(keys) {
					off = 0
				}
			}
		})
	}
}

func BenchmarkPickAddrs(b *testing.B) {
	t, err := New(42, mixedCands(32))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, client, service string }{
		{"v4", "198.51.100.7:40000", "192.0.2.5:5684"},
		{"v6", "[2001:db8:1::7]:40000", "[2001:db8::5]:5684"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := netip.MustParseAddrPort(bc.client)
			s := netip.MustParseAddrPort(bc.service)
			b.ReportAllocs()
			for b.Loop() {
				t.PickAddrs(c, s)
			}
		})
	}
}

func BenchmarkNew(b *testing.B) {
	for _, n := range []int{3, 32, 254} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			cs := mixedCands(n)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(42, cs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNewSlowStart: a table with one candidate in slow start costs
// what one without does (the weights are scaled, the merge is the same).
func BenchmarkNewSlowStart(b *testing.B) {
	for _, n := range []int{3, 32, 254} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			cands := mixedCands(n)
			cands[n-1].Permille = 100
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(42, cands); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
