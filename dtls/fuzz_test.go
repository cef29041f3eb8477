package dtls

import (
	"bytes"
	"errors"
	"testing"
)

// Seeds: testdata/fuzz/FuzzParseRecord and testdata/fuzz/FuzzClassify hold
// the captured datagrams and the synthetic cases (rewritten by -update).

var sentinels = []error{ErrTooShort, ErrTruncated, ErrContentType, ErrVersion, ErrDTLS13, ErrEmptyRecord, ErrCIDLength}

func isSentinel(err error) bool {
	for _, s := range sentinels {
		if err == s {
			return true
		}
	}
	return false
}

func FuzzParseRecord(f *testing.F) {
	f.Add(datagram(cidRecord), byte(8))
	f.Add(datagram(u13(0x3e, cid8, 0x0102, ct16)), byte(8))
	f.Add(datagram(u13(0x31, cid8, 7, ct16)), byte(8))
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		cidLen := int(cidLen8)
		r, n, err := ParseRecord(b, cidLen)
		if err != nil {
			if !isSentinel(err) || n != 0 || r.Fragment != nil || r.CID != nil {
				t.Fatalf("err=%v n=%d r=%+v", err, n, r)
			}
			return
		}
		min := HeaderLen
		if r.Unified != 0 {
			min = unifiedHeaderLen(r.Unified)
			if r.Unified != b[0] || r.Type != 0 || r.Version != 0 || r.Epoch > 3 || r.Seq >= 1<<16 {
				t.Fatalf("unified header %#02x read as %+v", b[0], r)
			}
			if r.Unified&UnifiedLength == 0 && n != len(b) {
				t.Fatalf("a record without length ends at %d of %d", n, len(b))
			}
		}
		if n <= min || n > len(b) || len(r.Fragment) == 0 {
			t.Fatalf("n=%d len=%d fragment=%d", n, len(b), len(r.Fragment))
		}
		if hasCID := r.Type == TLS12CID || r.Unified&UnifiedCID != 0; hasCID != (len(r.CID) == cidLen) || hasCID != (r.CID != nil) {
			t.Fatalf("type %v, unified %#02x with CID of %d bytes, cidLen %d", r.Type, r.Unified, len(r.CID), cidLen)
		}
		// Views into b, ending where the record ends.
		if &r.Fragment[len(r.Fragment)-1] != &b[n-1] {
			t.Fatal("fragment is not a view of b")
		}
		if got := appendRecord(nil, r); !bytes.Equal(got, b[:n]) {
			t.Fatalf("round trip:\n got % x\nwant % x", got, b[:n])
		}
	})
}

func FuzzClassify(f *testing.F) {
	f.Add(flight5, byte(8))
	f.Add(datagram(hello13, u13(0x2d, nil, 0, ct16)), byte(8))
	f.Add(datagram(u13(0x3e, cid8, 0, ct16), u13(0x32, cid8, 1, ct16)), byte(8))
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		cidLen := int(cidLen8)
		c, err := Classify(b, cidLen)
		checkAgainstWalk(t, b, cidLen, c, err)
		if _, ok := HelloSeq(b, cidLen); ok && (err != nil || !c.ClientHello) {
			t.Fatalf("HelloSeq found a ClientHello where Classify says %+v, %v", c, err)
		}
		// A CID is routed only when all of it is in the datagram, at the
		// service's length.
		if c.CID != nil && (len(c.CID) != cidLen || !within(c.CID, b)) {
			t.Fatalf("CID % x of %d bytes, cidLen %d, not a whole view of the datagram", c.CID, len(c.CID), cidLen)
		}
		// The drop path's two verdicts are for datagrams Classify
		// rejects, and exclude each other.
		mcid, mismatched := MismatchedCID(b, cidLen)
		short := ShortCID(b, cidLen)
		if err == nil && (mismatched || short) || mismatched && short {
			t.Fatalf("Classify %v, MismatchedCID %v, ShortCID %v", err, mismatched, short)
		}
		if mismatched && (len(mcid) == cidLen || !within(mcid, b)) {
			t.Fatalf("MismatchedCID % x, cidLen %d", mcid, cidLen)
		}
	})
}

// checkAgainstWalk recomputes Classify's answer with a plain ParseRecord
// loop.
func checkAgainstWalk(t *testing.T, b []byte, cidLen int, c Class, err error) {
	t.Helper()
	var want Class
	var werr error
	for rest := b; ; {
		if len(rest) == 0 {
			if want.Records == 0 {
				_, _, werr = ParseRecord(rest, cidLen) // ErrCIDLength or ErrTooShort
			}
			break
		}
		r, n, perr := ParseRecord(rest, cidLen)
		if perr != nil {
			werr = perr
			if errors.Is(perr, ErrTooShort) && want.Records > 0 {
				werr = ErrTruncated
			}
			break
		}
		want.ClientHello = want.ClientHello || r.Type == Handshake && r.Epoch == 0 && r.Fragment[0] == 1
		if (r.Type == TLS12CID || r.Unified&UnifiedCID != 0) && want.CID == nil {
			want.CID = r.CID
		}
		want.Unified = want.Unified || r.Unified != 0
		want.Records++
		rest = rest[n:]
	}
	switch {
	case werr != nil:
		want = Class{Records: want.Records} // Unified too is only for a valid datagram
		if errors.Is(werr, ErrCIDLength) {
			want.Records = 0
		}
	case want.CID != nil:
		want.Kind = KindEstablished
	default:
		want.Kind = KindNew
	}
	if err != werr || c.Kind != want.Kind || c.Records != want.Records || c.ClientHello != want.ClientHello || c.Unified != want.Unified ||
		!bytes.Equal(c.CID, want.CID) || (c.CID != nil && &c.CID[0] != &want.CID[0]) {
		t.Fatalf("Classify = %+v, %v; walk = %+v, %v", c, err, want, werr)
	}
	if (err == nil) == (c.Kind == KindInvalid) {
		t.Fatalf("kind %v with err %v", c.Kind, err)
	}
	if StartsSession(b, cidLen) != (err == nil && c.ClientHello) {
		t.Fatalf("StartsSession disagrees with Classify (%+v, %v)", c, err)
	}
}
