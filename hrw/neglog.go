package hrw

import "math/bits"

// negLog returns -ln(u) in units of 2^-57 for the uniform variate u encoded
// by h (the package doc has the exact definition). With m = h|1, z its
// leading zeros, d = 2^64 - (m<<z) ∈ [1, 2^63] and y = d/2^64 ∈ (0, 1/2],
// u = 2^-z · (1-y) and
//
//	-ln u = z·ln2 + y·G(y),  G(y) = -ln(1-y)/y ∈ [1, 2ln2],
//
// with G interpolated linearly in gTab (steps of 2^-11 in y, 2^-32 fixed
// point). The y·G(y) form keeps the relative precision for small y, where
// ln(1-y) would cancel. Integer arithmetic only.
func negLog(h uint64) uint64 {
	m := h | 1
	z := bits.LeadingZeros64(m)
	d := -(m << z)
	// Interpolate at d-1 so that the index stays below 1024 (d ≤ 2^63).
	i := (d - 1) >> 53 & (1<<gTabBits - 1)
	g := gTab[i] + (gTab[i+1]-gTab[i])*uint64(uint32((d-1)>>21))>>32
	hi, lo := bits.Mul64(d, g)
	return uint64(z)*ln2Fix + (hi<<25 | lo>>39)
}
