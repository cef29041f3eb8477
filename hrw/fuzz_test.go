package hrw

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzPick builds a table from arbitrary candidates (5 bytes each: ordinal,
// then weight big-endian) and checks that New rejects exactly the invalid
// sets with the right error, and that Pick returns a candidate (weight 0
// counting as 1) — for small sets, the one the reference from the package
// doc computes.
func FuzzPick(f *testing.F) {
	f.Fuzz(func(t *testing.T, seed uint64, raw []byte, key []byte) {
		var cands []Candidate
		for ; len(raw) >= 5; raw = raw[5:] {
			cands = append(cands, Candidate{Ordinal: raw[0], Weight: binary.BigEndian.Uint32(raw[1:])})
		}
		var (
			seen          [256]bool
			dup, reserved bool
		)
		for _, c := range cands {
			dup = dup || seen[c.Ordinal]
			reserved = reserved || c.Ordinal == 255
			seen[c.Ordinal] = true
		}
		tb, err := New(seed, cands)
		switch {
		case len(cands) > 255:
			if !errors.Is(err, ErrTooManyCandidates) {
				t.Fatalf("%d candidates: err = %v", len(cands), err)
			}
			return
		case reserved || dup:
			if !errors.Is(err, ErrReservedOrdinal) && !errors.Is(err, ErrDuplicateOrdinal) {
				t.Fatalf("reserved %v dup %v: err = %v", reserved, dup, err)
			}
			return
		case err != nil:
			t.Fatalf("valid set %v: %v", cands, err)
		}
		if tb.Len() != len(cands) {
			t.Fatalf("Len = %d, want %d", tb.Len(), len(cands))
		}
		o, ok := tb.Pick(key)
		if len(cands) <= 16 { // the reference walks ~Buckets points per candidate
			want, wantOK := refOwner(seed, refBucket(seed, key), cands)
			if ok != wantOK || o != want {
				t.Fatalf("Pick = %d %v, reference %d %v", o, ok, want, wantOK)
			}
		}
		if ok && !seen[o] {
			t.Fatalf("picked %d, not a candidate", o)
		}
		if ok != (len(cands) > 0) {
			t.Fatalf("ok = %v with %d candidates", ok, len(cands))
		}
	})
}
