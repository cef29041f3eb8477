package hrw

import (
	"errors"
	"fmt"
	"net/netip"
)

const (
	// BucketBits is log2 of the number of buckets in a Table. It is part of
	// the mapping: changing it moves keys.
	BucketBits = 14
	// Buckets is the number of buckets in a Table. A key's bucket is the top
	// BucketBits bits of its hash.
	Buckets = 1 << BucketBits
	// MaxOrdinal is the largest valid ordinal; 255 is reserved.
	MaxOrdinal = 254
	// AddrLen is the length of one address serialized by AppendAddr.
	AddrLen = 18

	gTabBits = 10
	gTabLen  = 1<<gTabBits + 1

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
	// ErrPermille reports a Candidate.Permille above 1000.
	ErrPermille = errors.New("hrw: permille above 1000")
)

// A Candidate is one backend that keys may be assigned to.
type Candidate struct {
	Ordinal uint8 // 0–254; 255 is reserved
	// Weight is the candidate's relative share of keys. 0 means 1, the
	// default, as a registry.Backend's weight 0 does: no weight means "no
	// new sessions"; leave such a candidate out (a draining backend).
	Weight uint32
	// Permille, from 1 to 999, makes the candidate count with that many
	// thousandths of its Weight, as a backend in slow start does; 0 and
	// 1000 mean all of it. Every score stays exact (the weights are
	// scaled by 1000, not divided), so raising a candidate's Permille
	// moves keys only to it, as raising its Weight does, and a table
	// whose candidates all count fully is the one New builds without
	// Permille.
	Permille uint16
}

// A Table maps keys to candidates by weighted rendezvous hashing, through a
// precomputed table of Buckets buckets. It is immutable after New and safe
// for concurrent use.
type Table struct {
	seed  uint64
	n     int
	owner [Buckets]uint8
}

// New builds the bucket table for seed and cands. A candidate with weight 0
// has weight 1. The order of cands does not matter. It
// returns an error wrapping ErrReservedOrdinal, ErrDuplicateOrdinal or
// ErrTooManyCandidates for invalid input. cands is not retained.
func New(seed uint64, cands []Candidate) (*Table, error) {
	if len(cands) > MaxOrdinal+1 {
		return nil, fmt.Errorf("%d candidates: %w", len(cands), ErrTooManyCandidates)
	}
	var seen [256]bool
	act := make([]stream, 0, len(cands))
	partial := false
	for _, c := range cands {
		if c.Ordinal > MaxOrdinal {
			return nil, fmt.Errorf("candidate %d: %w", c.Ordinal, ErrReservedOrdinal)
		}
		if seen[c.Ordinal] {
			return nil, fmt.Errorf("candidate %d: %w", c.Ordinal, ErrDuplicateOrdinal)
		}
		if c.Permille > 1000 {
			return nil, fmt.Errorf("candidate %d: %d: %w", c.Ordinal, c.Permille, ErrPermille)
		}
		seen[c.Ordinal] = true
		partial = partial || c.Permille != 0 && c.Permille != 1000
		act = append(act, stream{ord: c.Ordinal, w: uint64(max(c.Weight, 1))})
	}
	if partial {
		// Scores compare as tau_a·w_b < tau_b·w_a in 128 bits, so scaling
		// every weight by 1000 changes no owner; weights stay below 2^42.
		for i, c := range cands {
			p := uint64(c.Permille)
			if p == 0 {
				p = 1000
			}
			act[i].w *= p
		}
	}
	t := &Table{seed: seed, n: len(act)}
	if len(act) > 0 {
		t.fill(act)
	}
	return t, nil
}

// Len returns the number of candidates.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Seed returns the seed the table hashes keys with.
func (t *Table) Seed() uint64 { return t.seed }

// Owners copies the bucket table into dst: keys whose XXH64 with Seed
// has the top BucketBits bits j map to ordinal dst[j], as Pick computes it
// (when Len is 0, Pick picks nothing and dst means nothing). It is for programs that pick outside
// Go, such as the XDP fast path (module cidroute/xdp), and stay
// bit-identical with Pick by hashing the same way.
func (t *Table) Owners(dst *[Buckets]uint8) { *dst = t.owner }

// Pick returns the ordinal that key maps to. ok is false when the table has
// no candidate. It does not allocate.
func (t *Table) Pick(key []byte) (ordinal uint8, ok bool) {
	if t == nil || t.n == 0 {
		return 0, false
	}
	return t.owner[sum64(key, t.seed)>>(64-BucketBits)], true
}

// PickAddrs picks by the key AppendAddr(AppendAddr(nil, client), service).
// It does not allocate.
func (t *Table) PickAddrs(client, service netip.AddrPort) (uint8, bool) {
	if t == nil || t.n == 0 {
		return 0, false
	}
	return t.owner[sumAddrs(client, service, t.seed)>>(64-BucketBits)], true
}

// AppendAddr appends the key serialization of a to dst: the address in its
// 16-byte IPv6 form (IPv4 as IPv4-mapped IPv6, zone dropped, the zero Addr
// as 16 zero bytes), then the port as 2 bytes big-endian.
func AppendAddr(dst []byte, a netip.AddrPort) []byte {
	ip := a.Addr().As16()
	p := a.Port()
	return append(append(dst, ip[:]...), byte(p>>8), byte(p))
}
