package hrw

import (
	"net/netip"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func digest(b []byte, seed uint64) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	d.Write(b)
	return d.Sum64()
}

// TestSum64 compares sum64 with the xxhash package at every length that
// takes a different path (stripes, 8-, 4- and 1-byte tails) and for seeds
// that exercise the carries.
func TestSum64(t *testing.T) {
	b := make([]byte, 200)
	for i := range b {
		b[i] = byte(i*131 + 7)
	}
	for _, seed := range []uint64{0, 1, 42, 1<<63 + 5, ^uint64(0)} {
		for n := range len(b) + 1 {
			if got, want := sum64(b[:n], seed), digest(b[:n], seed); got != want {
				t.Fatalf("len %d seed %d: sum64 %016x, xxhash %016x", n, seed, got, want)
			}
		}
	}
	// XXH64 of the empty input with seed 0, from the reference
	// implementation.
	if got := sum64(nil, 0); got != 0xef46db3751d8e999 {
		t.Fatalf("XXH64(\"\", 0) = %016x", got)
	}
}

func FuzzSum64(f *testing.F) {
	f.Add([]byte("cidroute"), uint64(42))
	f.Add(make([]byte, 36), uint64(7))
	f.Add(make([]byte, 77), ^uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, seed uint64) {
		if got, want := sum64(b, seed), digest(b, seed); got != want {
			t.Fatalf("sum64 %016x, xxhash %016x", got, want)
		}
	})
}

func FuzzSumAddrs(f *testing.F) {
	f.Add([]byte{192, 0, 2, 1}, uint16(4000), []byte{0x20, 1, 0xd, 0xb8, 15: 5}, uint16(5684), uint64(42))
	f.Add([]byte{}, uint16(0), []byte{127, 0, 0, 1}, uint16(65535), ^uint64(0))
	f.Fuzz(func(t *testing.T, cip []byte, cport uint16, sip []byte, sport uint16, seed uint64) {
		c := netip.AddrPortFrom(fuzzAddr(cip), cport)
		s := netip.AddrPortFrom(fuzzAddr(sip), sport)
		key := AppendAddr(AppendAddr(nil, c), s)
		if got, want := sumAddrs(c, s, seed), digest(key, seed); got != want {
			t.Fatalf("%v %v: sumAddrs %016x, xxhash of the key %016x", c, s, got, want)
		}
	})
}

// fuzzAddr makes an IPv4 address of 4 bytes, IPv6 of 16, else the zero
// Addr.
func fuzzAddr(b []byte) netip.Addr {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b))
	case 16:
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.Addr{}
}
