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
			key := make([]byte, 2*AddrLen)
			b.SetBytes(int64(len(key)))
			b.ReportAllocs()
			var i uint64
			for b.Loop() {
				i++
				key[0], key[1], key[2] = byte(i), byte(i>>8), byte(i>>16)
				t.Pick(key)
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
