package hrw

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// refTable computes the bucket owners straight from the package doc: it
// walks each candidate's stream, hashing with the xxhash package, until the
// stream has reached every bucket, then takes the least tau/w per bucket by
// exact 128-bit comparison, ties to the lower ordinal. It costs about
// Buckets·ln(Buckets) hashes per candidate, so tests use it for small sets.
func refTable(seed uint64, cands []Candidate) (owner [Buckets]uint8, ok bool) {
	best := make([]struct{ tau, w uint64 }, Buckets)
	first := make([]uint64, Buckets)
	for _, c := range cands {
		clear(first)
		var (
			left = Buckets
			tau  uint64
			buf  [5]byte
			d    xxhash.Digest
		)
		buf[4] = c.Ordinal
		for k := uint32(0); left > 0; k++ {
			binary.BigEndian.PutUint32(buf[:], k)
			d.ResetWithSeed(seed)
			d.Write(buf[:])
			h := d.Sum64()
			tau += negLog(h<<BucketBits) >> 17
			if j := h >> (64 - BucketBits); first[j] == 0 {
				first[j] = tau + 1 // 0 means not reached yet
				left--
			}
		}
		w := uint64(max(c.Weight, 1))
		for j := range best {
			f := first[j] - 1
			h1, l1 := bits.Mul64(f, best[j].w)
			h2, l2 := bits.Mul64(best[j].tau, w)
			if !ok || h1 < h2 || h1 == h2 && (l1 < l2 || l1 == l2 && c.Ordinal < owner[j]) {
				best[j].tau, best[j].w, owner[j] = f, w, c.Ordinal
			}
		}
		ok = true
	}
	return owner, ok
}

// refOwner is the owner of bucket j straight from the package doc: each
// candidate's stream is walked (hashing with the xxhash package) to its
// first point in j, about Buckets points per candidate.
func refOwner(seed uint64, j uint64, cands []Candidate) (owner uint8, ok bool) {
	var bestTau, bestW uint64
	for _, c := range cands {
		var (
			tau uint64
			buf [5]byte
			d   xxhash.Digest
		)
		buf[4] = c.Ordinal
		for k := uint32(0); ; k++ {
			binary.BigEndian.PutUint32(buf[:], k)
			d.ResetWithSeed(seed)
			d.Write(buf[:])
			h := d.Sum64()
			tau += negLog(h<<BucketBits) >> 17
			if h>>(64-BucketBits) == j {
				break
			}
		}
		w := uint64(max(c.Weight, 1))
		h1, l1 := bits.Mul64(tau, bestW)
		h2, l2 := bits.Mul64(bestTau, w)
		if !ok || h1 < h2 || h1 == h2 && (l1 < l2 || l1 == l2 && c.Ordinal < owner) {
			bestTau, bestW, owner, ok = tau, w, c.Ordinal, true
		}
	}
	return owner, ok
}

// refBucket is the bucket of key.
func refBucket(seed uint64, key []byte) uint64 {
	d := xxhash.NewWithSeed(seed)
	d.Write(key)
	return d.Sum64() >> (64 - BucketBits)
}

// refPick is Pick computed from the package doc, given refTable's result.
func refPick(seed uint64, key []byte, owner *[Buckets]uint8) uint8 {
	return owner[refBucket(seed, key)]
}

func mustNew(t testing.TB, seed uint64, cands []Candidate) *Table {
	t.Helper()
	tb, err := New(seed, cands)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// testKeys returns n distinct pseudo-random 16-byte keys.
func testKeys(n int) [][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([][]byte, n)
	for i := range keys {
		k := make([]byte, 16)
		binary.BigEndian.PutUint64(k, r.Uint64())
		binary.BigEndian.PutUint64(k[8:], uint64(i))
		keys[i] = k
	}
	return keys
}

func picks(t testing.TB, tb *Table, keys [][]byte) []uint8 {
	t.Helper()
	out := make([]uint8, len(keys))
	for i, k := range keys {
		o, ok := tb.Pick(k)
		if !ok {
			t.Fatalf("Pick(%x): not ok", k)
		}
		out[i] = o
	}
	return out
}

func TestTableMatchesReference(t *testing.T) {
	sets := []struct {
		seed  uint64
		cands []Candidate
	}{
		{0, []Candidate{{Ordinal: 0, Weight: 1}}},
		{1, []Candidate{{Ordinal: 2, Weight: 3}, {Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 2}}},
		{0xfeedface, []Candidate{{Ordinal: 7, Weight: 1}, {Ordinal: 200, Weight: math.MaxUint32}, {Ordinal: 3, Weight: 0}, {Ordinal: 254, Weight: 1000}}},
		{42, []Candidate{{Ordinal: 5, Weight: math.MaxUint32}, {Ordinal: 6, Weight: math.MaxUint32}, {Ordinal: 9, Weight: math.MaxUint32 - 1}}},
		{math.MaxUint64, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 1}, {Ordinal: 2, Weight: 1}, {Ordinal: 3, Weight: 1}, {Ordinal: 4, Weight: 1}}},
	}
	for i, s := range sets {
		tb := mustNew(t, s.seed, s.cands)
		want, _ := refTable(s.seed, s.cands)
		for j := range want {
			if got := tb.owner[j]; got != want[j] {
				t.Fatalf("set %d bucket %d: owner %d, want %d", i, j, got, want[j])
			}
		}
		for _, j := range []uint64{0, 1, Buckets / 3, Buckets - 1} {
			if got, _ := refOwner(s.seed, j, s.cands); got != want[j] {
				t.Fatalf("set %d bucket %d: refOwner %d, refTable %d", i, j, got, want[j])
			}
		}
		for _, k := range testKeys(200) {
			if got, _ := tb.Pick(k); got != refPick(s.seed, k, &want) {
				t.Fatalf("set %d: Pick(%x) = %d, want %d", i, k, got, refPick(s.seed, k, &want))
			}
		}
	}
}

func shares(p []uint8) map[uint8]float64 {
	m := map[uint8]float64{}
	for _, o := range p {
		m[o] += 1 / float64(len(p))
	}
	return m
}

func TestWeightShares(t *testing.T) {
	keys := testKeys(100000)
	for _, seed := range []uint64{0, 1, 0xabcdef} {
		tb := mustNew(t, seed, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 3}})
		sh := shares(picks(t, tb, keys))
		for o, want := range map[uint8]float64{0: 1. / 6, 1: 2. / 6, 2: 3. / 6} {
			if d := sh[o] - want; math.Abs(d) > 0.02 {
				t.Errorf("seed %d: ordinal %d share %.4f, want %.4f ± 0.02", seed, o, sh[o], want)
			}
		}
	}
	// Large weights behave like small ones: no cost and no bias per unit.
	tb := mustNew(t, 5, []Candidate{{Ordinal: 0, Weight: 1_000_000}, {Ordinal: 1, Weight: 2_000_000}, {Ordinal: 2, Weight: 3_000_000}})
	sh := shares(picks(t, tb, keys))
	if math.Abs(sh[2]-0.5) > 0.02 {
		t.Errorf("weights ×1e6: share of 2 = %.4f", sh[2])
	}
}

func TestRemoveMovesOnlyItsKeys(t *testing.T) {
	keys := testKeys(100000)
	cands := mixedCands(10)
	before := picks(t, mustNew(t, 8, cands), keys)
	for _, gone := range []int{0, 4, 9} {
		rest := append(append([]Candidate(nil), cands[:gone]...), cands[gone+1:]...)
		after := picks(t, mustNew(t, 8, rest), keys)
		moved := 0
		for i := range keys {
			switch {
			case before[i] == uint8(gone):
				if after[i] == uint8(gone) {
					t.Fatalf("key %d still on removed %d", i, gone)
				}
				moved++
			case after[i] != before[i]:
				t.Fatalf("key %d moved %d → %d though %d was removed", i, before[i], after[i], gone)
			}
		}
		if moved == 0 {
			t.Fatalf("no key was on %d", gone)
		}
	}
}

// TestAddMovesItsShare: adding a candidate moves keys only to it, and about
// w_new/Σw of them: within 1.5 percentage points over 100k keys (the bucket
// count alone gives a standard deviation of about 0.3 points).
func TestAddMovesItsShare(t *testing.T) {
	keys := testKeys(100000)
	for _, n := range []int{1, 4, 10, 40, 200} {
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{Ordinal: uint8(i), Weight: 1}
		}
		before := picks(t, mustNew(t, 11, cands), keys)
		added := uint8(n + 50)
		after := picks(t, mustNew(t, 11, append(cands, Candidate{Ordinal: added, Weight: 1})), keys)
		moved := 0
		for i := range keys {
			if after[i] != before[i] {
				if after[i] != added {
					t.Fatalf("N=%d: key %d moved %d → %d, not to the added %d", n, i, before[i], after[i], added)
				}
				moved++
			}
		}
		frac, want := float64(moved)/float64(len(keys)), 1/float64(n+1)
		if math.Abs(frac-want) > 0.015 {
			t.Errorf("N=%d: adding one moved %.4f of keys, want %.4f ± 0.015", n, frac, want)
		}
	}
}

func TestRaiseWeightMovesKeysToIt(t *testing.T) {
	keys := testKeys(20000)
	cands := mixedCands(8)
	before := picks(t, mustNew(t, 12, cands), keys)
	cands[3].Weight *= 3
	after := picks(t, mustNew(t, 12, cands), keys)
	for i := range keys {
		if after[i] != before[i] && after[i] != 3 {
			t.Fatalf("key %d moved %d → %d when only 3 got heavier", i, before[i], after[i])
		}
	}
}

func TestIndependentTablesAgree(t *testing.T) {
	keys := testKeys(100000)
	cands := mixedCands(254)
	a := mustNew(t, 77, cands)
	rev := make([]Candidate, 0, len(cands)+3)
	for i := len(cands) - 1; i >= 0; i-- {
		rev = append(rev, cands[i])
	}
	b := mustNew(t, 77, rev) // another object, candidates in another order
	if a == b || a.owner != b.owner {
		t.Fatal("tables differ")
	}
	pa, pb := picks(t, a, keys), picks(t, b, keys)
	for i := range keys {
		if pa[i] != pb[i] {
			t.Fatalf("key %d: %d vs %d", i, pa[i], pb[i])
		}
	}
}

func TestSeedChangesMapping(t *testing.T) {
	keys := testKeys(20000)
	cands := mixedCands(16)
	a := picks(t, mustNew(t, 1, cands), keys)
	b := picks(t, mustNew(t, 2, cands), keys)
	same := 0
	for i := range keys {
		if a[i] == b[i] {
			same++
		}
	}
	// Independent mappings agree on Σ share² ≈ 7 % of keys here.
	if f := float64(same) / float64(len(keys)); f > 0.15 {
		t.Fatalf("seeds 1 and 2 agree on %.3f of keys", f)
	}
}

func TestEveryCandidateGetsBuckets(t *testing.T) {
	tb := mustNew(t, 13, mixedCands(254))
	var count [256]int
	for _, o := range tb.owner {
		count[o]++
	}
	for o := range 254 {
		// Expected Buckets·w/Σw ≥ 8192/635 ≈ 13 for weight 1.
		if count[o] == 0 {
			t.Errorf("ordinal %d owns no bucket", o)
		}
	}
	if count[254] != 0 || count[255] != 0 {
		t.Fatal("absent ordinals own buckets")
	}
}

func TestConcurrentPick(t *testing.T) {
	tb := mustNew(t, 21, mixedCands(16))
	keys := testKeys(2000)
	want := picks(t, tb, keys)
	done := make(chan []uint8)
	for range 4 {
		go func() {
			got := make([]uint8, len(keys))
			for i, k := range keys {
				got[i], _ = tb.Pick(k)
			}
			done <- got
		}()
	}
	for range 4 {
		got := <-done
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("key %d: concurrent pick %d, want %d", i, got[i], want[i])
			}
		}
	}
}

// TestWeightClassShares: with 254 candidates of weights 1–4, each weight
// class gets its share of keys (within 1 percentage point) and the
// per-candidate shares stay near w/Σw.
func TestWeightClassShares(t *testing.T) {
	cands := mixedCands(254)
	tb := mustNew(t, 14, cands)
	keys := testKeys(100000)
	sh := shares(picks(t, tb, keys))
	var sum float64
	for _, c := range cands {
		sum += float64(c.Weight)
	}
	var class, want [5]float64
	worst := 0.0
	for _, c := range cands {
		class[c.Weight] += sh[c.Ordinal]
		want[c.Weight] += float64(c.Weight) / sum
		worst = max(worst, math.Abs(sh[c.Ordinal]*sum/float64(c.Weight)-1))
	}
	for w := 1; w <= 4; w++ {
		if math.Abs(class[w]-want[w]) > 0.01 {
			t.Errorf("weight %d: share %.4f, want %.4f ± 0.01", w, class[w], want[w])
		}
	}
	// 16384 buckets: a weight-1 candidate expects 26 buckets (σ ≈ 20 %), and
	// 100k keys add their own noise; 254 draws stay within about ±70 %.
	if worst > 0.8 {
		t.Errorf("a candidate's share is off by %.0f %% of its expectation", worst*100)
	}
	t.Logf("largest relative deviation of a candidate's key share: %.0f %%", worst*100)
}

func TestPickAddrsIsPickOfKey(t *testing.T) {
	tb := mustNew(t, 15, mixedCands(9))
	s := netip.MustParseAddrPort("[2001:db8::10]:4433")
	for i := range 1000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(i))
		want, _ := tb.Pick(AppendAddr(AppendAddr(nil, c), s))
		if got, _ := tb.PickAddrs(c, s); got != want {
			t.Fatalf("%v: PickAddrs %d, Pick %d", c, got, want)
		}
	}
}

// Permille is exact: a part of a weight is the same table as the weights
// in those proportions, counting fully is the table without Permille, and
// ramping a candidate up (10%, 50%, 100%) moves keys only to it, each step
// giving it about its share.
func TestPermille(t *testing.T) {
	keys := testKeys(100000)
	half := mustNew(t, 3, []Candidate{{Ordinal: 0, Weight: 3}, {Ordinal: 1, Weight: 2, Permille: 500}, {Ordinal: 2, Weight: 2}})
	whole := mustNew(t, 3, []Candidate{{Ordinal: 0, Weight: 6}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 4}})
	if half.owner != whole.owner {
		t.Fatal("Weight 2 at 500‰ beside 3 and 2 is not the table of 6, 2, 4")
	}
	full := mustNew(t, 3, []Candidate{{Ordinal: 0, Weight: 3, Permille: 1000}, {Ordinal: 1, Weight: 2, Permille: 1000}, {Ordinal: 2, Weight: 2}})
	plain := mustNew(t, 3, []Candidate{{Ordinal: 0, Weight: 3}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 2}})
	if full.owner != plain.owner {
		t.Fatal("1000‰ is not the plain table")
	}
	if _, err := New(3, []Candidate{{Ordinal: 0, Permille: 1001}}); !errors.Is(err, ErrPermille) {
		t.Fatalf("1001‰: %v", err)
	}

	cands := mixedCands(6)
	var prev []uint8
	for _, p := range []uint16{100, 500, 1000} {
		cands[5].Permille = p
		got := picks(t, mustNew(t, 4, cands), keys)
		var sum float64
		for _, c := range cands {
			w := float64(max(c.Weight, 1))
			if c.Ordinal == 5 {
				w *= float64(p) / 1000
			}
			sum += w
		}
		want := float64(max(cands[5].Weight, 1)) * float64(p) / 1000 / sum
		if sh := shares(got)[5]; math.Abs(sh-want) > 0.015 {
			t.Errorf("%d‰: share %.4f, want %.4f ± 0.015", p, sh, want)
		}
		for i := range prev {
			if got[i] != prev[i] && got[i] != 5 {
				t.Fatalf("%d‰: key %d moved %d → %d, not to the ramping 5", p, i, prev[i], got[i])
			}
		}
		prev = got
	}
}
