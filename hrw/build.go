package hrw

import "math/bits"

// tauShift converts negLog's 2^-57 units to the 2^-40 units of arrival
// times, which leaves room to add up millions of points.
const tauShift = 17

// A stream is one candidate's sequence of points, in the order of their
// arrival times; see the package doc.
type stream struct {
	ord uint8
	w   uint64
	mix uint64 // ord · prime5, XXH64's step for the last input byte
	k   uint32 // index of the current point
	h   uint64 // its hash
	tau uint64 // its arrival time, 2^-40 units, saturating
}

func (s *stream) start(seed uint64) {
	s.mix = uint64(s.ord) * prime5
	s.k = 0
	s.h = finish(pointPrefix(seed, 0), s.mix)
	s.tau = negLog(s.h<<BucketBits) >> tauShift
}

// fill sets every bucket's owner. Each bucket's owner is the candidate
// whose stream reaches it with the least tau/w; fill merges the streams
// under a rising bound theta on tau/w, so that it visits about
// Buckets·ln(Buckets) points whatever the number of candidates, and stops
// once every bucket's best score is within the bound (later points score
// above it).
func (t *Table) fill(act []stream) {
	var (
		wOf [256]uint64 // weight by ordinal; 255 marks an empty bucket
		sum uint64
	)
	wOf[255] = 1
	for i := range act {
		wOf[act[i].ord] = act[i].w
		sum += act[i].w
		act[i].start(t.seed)
	}
	best := make([]uint64, Buckets) // arrival time of each bucket's owner
	for j := range best {
		best[j], t.owner[j] = 1<<64-1, 255
	}
	// A bucket's best tau/w is exponential with mean unit = Buckets/Σw (in
	// tau units), so the largest of the Buckets of them is about
	// unit·(ln Buckets + 0.58) = unit·10.3. Start just below and creep up
	// in half units; the schedule changes only the speed, not the result.
	unit := max(uint64(Buckets)<<40/sum, 2)
	theta := 10 * unit
	for {
		for i := range act {
			t.run(&act[i], best, &wOf, theta)
		}
		if theta == 1<<64-1 || t.settled(best, &wOf, theta) {
			return
		}
		next, carry := bits.Add64(theta, unit/2, 0)
		if carry != 0 {
			next = 1<<64 - 1
		}
		theta = next
	}
}

// run consumes the points of s with tau/w ≤ theta.
func (t *Table) run(s *stream, best []uint64, wOf *[256]uint64, theta uint64) {
	hi, limit := bits.Mul64(theta, s.w)
	if hi != 0 {
		limit = 1<<64 - 1
	}
	var (
		own         = &t.owner
		bst         = (*[Buckets]uint64)(best)
		seed        = t.seed
		mix, w, ord = s.mix, s.w, s.ord
		k, h, tau   = s.k, s.h, s.tau
	)
	for tau <= limit {
		j := h >> (64 - BucketBits)
		o := own[j]
		// Does tau/w beat bst[j]/w(o)? Exact in 128 bits; ties go to the
		// lower ordinal.
		h1, l1 := bits.Mul64(tau, wOf[o])
		h2, l2 := bits.Mul64(bst[j], w)
		if h1 < h2 || h1 == h2 && (l1 < l2 || l1 == l2 && ord < o) {
			bst[j], own[j] = tau, ord
		}
		if tau == 1<<64-1 {
			break
		}
		k++
		h = finish(pointPrefix(seed, k), mix)
		// negLog(h << BucketBits), inlined by hand: this is the hot loop.
		m := h<<BucketBits | 1
		z := bits.LeadingZeros64(m)
		d := -(m << z)
		i := (d - 1) >> 53 & (1<<gTabBits - 1)
		g := gTab[i] + (gTab[i+1]-gTab[i])*uint64(uint32((d-1)>>21))>>32
		gh, gl := bits.Mul64(d, g)
		var carry uint64
		tau, carry = bits.Add64(tau, (uint64(z)*ln2Fix+(gh<<25|gl>>39))>>tauShift, 0)
		if carry != 0 {
			tau = 1<<64 - 1
		}
	}
	s.k, s.h, s.tau = k, h, tau
}

// settled reports whether every bucket's best score is at most theta.
func (t *Table) settled(best []uint64, wOf *[256]uint64, theta uint64) bool {
	for j, b := range best {
		hi, lo := bits.Mul64(theta, wOf[t.owner[j]])
		if hi == 0 && b > lo {
			return false
		}
	}
	return true
}

// pointPrefix returns XXH64's state, with seed, after the 4-byte chunk of
// the 5-byte input be32(k) || ordinal. finish completes it.
func pointPrefix(seed uint64, k uint32) uint64 {
	h := seed + prime5 + 5
	h ^= uint64(bits.ReverseBytes32(k)) * prime1 // XXH64 reads little-endian
	return bits.RotateLeft64(h, 23)*prime2 + prime3
}

// finish completes XXH64 from pointPrefix given the ordinal's mix value.
func finish(h, mix uint64) uint64 {
	h ^= mix
	return avalanche(bits.RotateLeft64(h, 11) * prime1)
}
