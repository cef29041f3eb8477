package hrw

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"

	"github.com/cespare/xxhash/v2"
)

const (
	// BucketBits is log2 of the number of buckets in a Table.
	BucketBits = 13
	// Buckets is the number of buckets in a Table. A key's bucket is the top
	// BucketBits bits of its hash.
	Buckets = 1 << BucketBits
	// MaxOrdinal is the largest valid ordinal; 255 is reserved.
	MaxOrdinal = 254
	// AddrLen is the length of one address serialized by AppendAddr.
	AddrLen = 18

	gTabBits = 10
	gTabLen  = 1<<gTabBits + 2

	// ln2Fix is round(ln 2 · 2^57).
	ln2Fix = 99893036290645747

	// XXH64 primes.
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime5 uint64 = 2870177450012600261
)

var (
	// ErrReservedOrdinal reports a candidate with ordinal 255.
	ErrReservedOrdinal = errors.New("hrw: ordinal 255 is reserved")
	// ErrDuplicateOrdinal reports two candidates with the same ordinal.
	ErrDuplicateOrdinal = errors.New("hrw: duplicate ordinal")
	// ErrTooManyCandidates reports more candidates than there are ordinals.
	ErrTooManyCandidates = errors.New("hrw: too many candidates")
)

// A Candidate is one backend that keys may be assigned to.
type Candidate struct {
	Ordinal uint8  // 0–254; 255 is reserved
	Weight  uint32 // relative share of keys; 0 = never chosen
}

// A Table maps keys to candidates by weighted rendezvous hashing, through a
// precomputed table of Buckets buckets. It is immutable after New and safe
// for concurrent use.
type Table struct {
	seed  uint64
	n     int
	owner [Buckets]uint8
}

// New builds the bucket table for seed and cands. Candidates with weight 0
// are accepted and never chosen. The order of cands does not matter. It
// returns an error wrapping ErrReservedOrdinal, ErrDuplicateOrdinal or
// ErrTooManyCandidates for invalid input. cands is not retained.
func New(seed uint64, cands []Candidate) (*Table, error) {
	if len(cands) > MaxOrdinal+1 {
		return nil, fmt.Errorf("%d candidates: %w", len(cands), ErrTooManyCandidates)
	}
	var seen [256]bool
	act := make([]active, 0, len(cands))
	for _, c := range cands {
		if c.Ordinal > MaxOrdinal {
			return nil, fmt.Errorf("candidate %d: %w", c.Ordinal, ErrReservedOrdinal)
		}
		if seen[c.Ordinal] {
			return nil, fmt.Errorf("candidate %d: %w", c.Ordinal, ErrDuplicateOrdinal)
		}
		seen[c.Ordinal] = true
		if c.Weight > 0 {
			act = append(act, newActive(c))
		}
	}
	slices.SortFunc(act, func(a, b active) int { return int(a.ord) - int(b.ord) })
	t := &Table{seed: seed, n: len(act)}
	t.fill(act)
	return t, nil
}

// fillBlock is how many buckets fill scores at a time; its state stays in
// L1 cache.
const fillBlock = 512

// slot is fill's state for one bucket.
type slot struct {
	hb   uint64 // XXH64 prefix, see bucketPrefix
	best uint64 // least score so far
}

// fill sets every bucket's owner to the candidate in act (sorted by ordinal)
// with the least score. Scanning candidates in ordinal order and replacing
// only on a strictly smaller score gives ties to the lower ordinal.
func (t *Table) fill(act []active) {
	var (
		slots [fillBlock]slot
		pass  [fillBlock]uint16 // buckets where a candidate passes prune
	)
	for b0 := 0; b0 < Buckets && len(act) > 0; b0 += fillBlock {
		for j := range slots {
			slots[j] = slot{hb: bucketPrefix(t.seed, uint32(b0+j)), best: 1<<64 - 1}
		}
		own := (*[fillBlock]uint8)(t.owner[b0 : b0+fillBlock])
		for i := range act {
			c := &act[i]
			n := prune(&slots, &pass, c.mix, c.r)
			for _, j := range pass[:n] {
				sl := &slots[j&(fillBlock-1)]
				if s, _ := bits.Mul64(negLog(finish(sl.hb, c.mix)), c.r); s < sl.best {
					sl.best, own[j&(fillBlock-1)] = s, c.ord
				}
			}
		}
	}
}

// Len returns the number of candidates with a weight above zero.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Pick returns the ordinal that key maps to. ok is false when the table has
// no candidate with a weight above zero. It does not allocate.
func (t *Table) Pick(key []byte) (ordinal uint8, ok bool) {
	if t == nil || t.n == 0 {
		return 0, false
	}
	var d xxhash.Digest
	d.ResetWithSeed(t.seed)
	d.Write(key)
	return t.owner[d.Sum64()>>(64-BucketBits)], true
}

// PickAddrs picks by the key AppendAddr(AppendAddr(nil, client), service).
// It does not allocate.
func (t *Table) PickAddrs(client, service netip.AddrPort) (uint8, bool) {
	var buf [2 * AddrLen]byte
	return t.Pick(AppendAddr(AppendAddr(buf[:0], client), service))
}

// AppendAddr appends the key serialization of a to dst: the address in its
// 16-byte IPv6 form (IPv4 as IPv4-mapped IPv6, zone dropped, the zero Addr
// as 16 zero bytes), then the port as 2 bytes big-endian.
func AppendAddr(dst []byte, a netip.AddrPort) []byte {
	ip := a.Addr().As16()
	p := a.Port()
	return append(append(dst, ip[:]...), byte(p>>8), byte(p))
}

// prune stores in pass the buckets j where the candidate (mix, r) passes
// the lower bound hi64(((2^64-1-h)>>7) · r) < slots[j].best, h its hash
// there, and returns how many. The bound is below the score (-ln u ≥ 1-u)
// and most candidates fail it. This is the hot loop of New, kept apart and
// small so that its values stay in registers.
//
//go:noinline
func prune(slots *[fillBlock]slot, pass *[fillBlock]uint16, mix, r uint64) int {
	n := 0
	for j := range slots {
		sl := &slots[j]
		if lb, _ := bits.Mul64(^finish(sl.hb, mix)>>7, r); lb < sl.best {
			pass[n&(fillBlock-1)] = uint16(j)
			n++
		}
	}
	return n
}

// active is a candidate with weight > 0, prepared for scoring.
type active struct {
	ord uint8
	mix uint64 // ord · prime5, XXH64's step for the last input byte
	r   uint64 // floor((2^64-1) / weight)
}

func newActive(c Candidate) active {
	return active{ord: c.Ordinal, mix: uint64(c.Ordinal) * prime5, r: (1<<64 - 1) / uint64(c.Weight)}
}

// bucketPrefix returns XXH64's state, with seed, after the 4-byte chunk of
// the 5-byte input be32(bucket) || ordinal. finish completes it.
func bucketPrefix(seed uint64, bucket uint32) uint64 {
	h := seed + prime5 + 5
	h ^= uint64(bits.ReverseBytes32(bucket)) * prime1 // XXH64 reads little-endian
	return bits.RotateLeft64(h, 23)*prime2 + prime3
}

// finish completes XXH64 from bucketPrefix given the ordinal's mix value.
func finish(h, mix uint64) uint64 {
	h ^= mix
	h = bits.RotateLeft64(h, 11) * prime1
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// score returns the weighted score of hash h for a candidate with
// reciprocal weight r: hi64(negLog(h) · r) ≈ -ln(u)/weight · 2^57.
func score(h, r uint64) uint64 {
	s, _ := bits.Mul64(negLog(h), r)
	return s
}

// negLog returns -ln(u) in units of 2^-57 for the uniform variate encoded by
// h. With m = h|1, lz = leading zeros of m, d = 2^64 - (m<<lz) ∈ [1, 2^63]
// and y = d/2^64 ∈ (0, 1/2], u = 2^-lz · (1-y) and
//
//	-ln u = lz·ln2 + y·G(y),  G(y) = -ln(1-y)/y ∈ [1, 2ln2].
//
// G is linearly interpolated in gTab (step 2^-11 in y, 2^-32 fixed point).
// Computing y·G(y) rather than ln(1-y) keeps full relative precision for
// small y, where the winning scores are. Integer arithmetic only, so the
// result is the same on every architecture.
func negLog(h uint64) uint64 {
	m := h | 1
	lz := bits.LeadingZeros64(m)
	d := -(m << lz)
	j := d >> 53 // 0..1024
	f := (d >> 21) & (1<<32 - 1)
	g0, g1 := gTab[j], gTab[j+1] // G increases, so g1 ≥ g0
	g := g0 + (g1-g0)*f>>32
	hi, lo := bits.Mul64(d, g)
	return uint64(lz)*ln2Fix + (hi<<25 | lo>>39)
}
