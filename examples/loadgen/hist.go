package main

import "math/bits"

// histogram counts round-trip times in nanoseconds in log-linear buckets:
// exact below 128 ns, then 64 buckets per power of two, so a reported
// quantile is within 1/64 (1.6 %) of the true value. Recording does not
// allocate; a histogram is about 30 KB and owned by one goroutine.
type histogram struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      int64
	min, max int64
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	// One past the largest index, that of a value with 63 significant
	// bits: e = 63-7, then v>>e < 128.
	histBuckets = (63-histSubBits-1)*histSub + 2*histSub
)

// histIndex maps v ≥ 0 to its bucket: e is the number of low bits dropped
// so that v>>e keeps 7 significant bits (64..127); below 128, e is 0.
func histIndex(v int64) int {
	e := bits.Len64(uint64(v)) - (histSubBits + 1)
	if e < 0 {
		e = 0
	}
	return e*histSub + int(v>>e)
}

// histBounds returns the smallest value of bucket i and the bucket's width.
func histBounds(i int) (low, width int64) {
	if i < 2*histSub {
		return int64(i), 1
	}
	e := i/histSub - 1
	m := i - e*histSub
	return int64(m) << e, 1 << e
}

func (h *histogram) record(v int64) {
	if v < 0 {
		v = 0 // a clock step; never index out of range
	}
	h.counts[histIndex(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
}

func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// quantile returns the nearest-rank q-quantile (0 < q ≤ 1): the value of
// the ceil(q·n)-th smallest sample, as the midpoint of its bucket clamped
// to the recorded minimum and maximum. It returns 0 for an empty histogram.
func (h *histogram) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.9999999) // ceil without float surprises at exact products
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, w := histBounds(i)
			return min(max(low+(w-1)/2, h.min), h.max)
		}
	}
	return h.max
}

func (h *histogram) mean() float64 {
	if h.n == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.n)
}
