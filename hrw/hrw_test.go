package hrw

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"net/netip"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestBucketHashIsXXH64(t *testing.T) {
	for _, seed := range []uint64{0, 1, 0xdeadbeefcafebabe} {
		for _, j := range []uint32{0, 1, 255, 4095, Buckets - 1, 0x01020304} {
			for _, o := range []uint8{0, 1, 7, 254} {
				var b [5]byte
				binary.BigEndian.PutUint32(b[:], j)
				b[4] = o
				d := xxhash.NewWithSeed(seed)
				d.Write(b[:])
				if got, want := finish(pointPrefix(seed, j), uint64(o)*prime5), d.Sum64(); got != want {
					t.Fatalf("seed %x bucket %d ord %d: %#x, want %#x", seed, j, o, got, want)
				}
			}
		}
	}
}

func TestNegLogAccuracy(t *testing.T) {
	check := func(h uint64) {
		m := h | 1
		z := bits.LeadingZeros64(m)
		y := float64(-(m << z)) / (1 << 64) // u = 2^-z · (1-y)
		want := float64(z)*math.Ln2 - math.Log1p(-y)
		got := float64(negLog(h)) / (1 << 57)
		// Relative error 1e-6, or the fixed-point resolution 2^-57 where
		// y < 2^-37 (probability 2^-37).
		rel := math.Abs(got-want) / want
		if rel > 1e-6 && math.Abs(got-want) > 0x1p-56 {
			t.Fatalf("negLog(%#x) = %v, want %v (rel %g)", h, got, want, rel)
		}
		// The bounds bestOf prunes with.
		if lb := ^h >> 7; lb > negLog(h) {
			t.Fatalf("bound(%#x) = %d > negLog = %d", h, lb, negLog(h))
		}
	}
	for _, h := range []uint64{0, 1, 2, 3, 1 << 62, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64, math.MaxUint64 - 1<<20} {
		check(h)
	}
	x := uint64(0x9e3779b97f4a7c15)
	for range 200000 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		check(x)
		check(x >> (x & 63))
		check(^(x >> (x & 63)))
	}
}

func TestPickBasics(t *testing.T) {
	tb, err := New(1, nil)
	must(t, err)
	_, ok := tb.Pick([]byte("x"))
	if ok {
		t.Fatal("ok on empty table")
	}
	var nilT *Table
	_, ok = nilT.Pick(nil)
	if ok {
		t.Fatal("ok on empty table")
	}

	tb, err = New(1, []Candidate{{Ordinal: 9, Weight: 5}})
	must(t, err)
	if tb.Len() != 1 {
		t.Fatalf("Len = %d", tb.Len())
	}
	o, ok := tb.Pick([]byte("x"))
	if !ok || o != 9 {
		t.Fatalf("Pick = %d, %v; want 9, true", o, ok)
	}

	_, err = New(1, []Candidate{{Ordinal: 255, Weight: 1}})
	if !errors.Is(err, ErrReservedOrdinal) {
		t.Fatalf("err = %v, want ErrReservedOrdinal", err)
	}
	_, err = New(1, []Candidate{{Ordinal: 1, Weight: 1}, {Ordinal: 2, Weight: 1}, {Ordinal: 1, Weight: 0}})
	if !errors.Is(err, ErrDuplicateOrdinal) {
		t.Fatalf("err = %v, want ErrDuplicateOrdinal", err)
	}
	_, err = New(1, make([]Candidate, 256))
	if !errors.Is(err, ErrTooManyCandidates) {
		t.Fatalf("err = %v, want ErrTooManyCandidates", err)
	}
}

func TestAppendAddr(t *testing.T) {
	got := AppendAddr([]byte{0xaa}, netip.MustParseAddrPort("192.0.2.1:5684"))
	if want := []byte{0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1, 0x16, 0x34}; !bytes.Equal(got, want) {
		t.Fatalf("got % x, want % x", got, want)
	}
	got = AppendAddr(nil, netip.MustParseAddrPort("[2001:db8::1%eth0]:443"))
	if want := []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x01, 0xbb}; !bytes.Equal(got, want) {
		t.Fatalf("got % x, want % x", got, want)
	}
	if got := AppendAddr(nil, netip.AddrPort{}); !bytes.Equal(got, make([]byte, AddrLen)) {
		t.Fatalf("zero AddrPort: % x", got)
	}
}

func TestNoAllocs(t *testing.T) {
	tb, err := New(7, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 3}})
	must(t, err)
	key := []byte("0123456789abcdef0123456789abcdef0123")
	c := netip.MustParseAddrPort("198.51.100.7:40000")
	s := netip.MustParseAddrPort("[2001:db8::5]:5684")
	if n := testing.AllocsPerRun(100, func() { tb.Pick(key) }); n != 0 {
		t.Fatalf("Pick allocs = %v", n)
	}
	if n := testing.AllocsPerRun(100, func() { tb.PickAddrs(c, s) }); n != 0 {
		t.Fatalf("PickAddrs allocs = %v", n)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Owners and Seed are what an outside picker (the XDP program) needs: the
// bucket of XXH64(key, Seed()) in Owners must be Pick's answer.
func TestOwnersAgreeWithPick(t *testing.T) {
	tab, err := New(0x5eed, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 3, Weight: 2}, {Ordinal: 9, Weight: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if tab.Seed() != 0x5eed {
		t.Fatalf("Seed %#x", tab.Seed())
	}
	var own [Buckets]uint8
	tab.Owners(&own)
	key := make([]byte, 0, 40)
	for i := range 5000 {
		key = key[:0]
		for j := range i % 40 {
			key = append(key, byte(uint64(i+j)*0x9e3779b97f4a7c15>>56))
		}
		want, _ := tab.Pick(key)
		d := xxhash.NewWithSeed(tab.Seed())
		d.Write(key)
		if got := own[d.Sum64()>>(64-BucketBits)]; got != want {
			t.Fatalf("key %x: Owners says %d, Pick %d", key, got, want)
		}
	}
}

// TestZeroWeightIsOne: weight 0 is the default weight 1, as for
// registry.Backend, never "no new sessions".
func TestZeroWeightIsOne(t *testing.T) {
	zero, err := New(7, []Candidate{{Ordinal: 3}, {Ordinal: 4, Weight: 0}, {Ordinal: 9, Weight: 2}})
	must(t, err)
	one, err := New(7, []Candidate{{Ordinal: 3, Weight: 1}, {Ordinal: 4, Weight: 1}, {Ordinal: 9, Weight: 2}})
	must(t, err)
	if zero.owner != one.owner || zero.Len() != 3 {
		t.Fatalf("weight 0 is not weight 1 (Len %d)", zero.Len())
	}
	only, err := New(7, []Candidate{{Ordinal: 5}})
	must(t, err)
	if o, ok := only.Pick([]byte("x")); !ok || o != 5 {
		t.Fatalf("Pick = %d, %v; want 5, true", o, ok)
	}
}
