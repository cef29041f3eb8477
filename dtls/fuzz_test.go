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
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		cidLen := int(cidLen8)
		r, n, err := ParseRecord(b, cidLen)
		if err != nil {
			if !isSentinel(err) || n != 0 || r.Fragment != nil || r.CID != nil {
				t.Fatalf("err=%v n=%d r=%+v", err, n, r)
			}
			return
		}
		if n <= HeaderLen || n > len(b) || len(r.Fragment) == 0 {
			t.Fatalf("n=%d len=%d fragment=%d", n, len(b), len(r.Fragment))
		}
		if (r.Type == TLS12CID) != (len(r.CID) == cidLen) {
			t.Fatalf("type %v with CID of %d bytes, cidLen %d", r.Type, len(r.CID), cidLen)
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
	f.Fuzz(func(t *testing.T, b []byte, cidLen8 byte) {
		cidLen := int(cidLen8)
		c, err := Classify(b, cidLen)
		checkAgainstWalk(t, b, cidLen, c, err)
		if _, ok := HelloSeq(b, cidLen); ok && (err != nil || !c.ClientHello) {
			t.Fatalf("HelloSeq found a ClientHello where Classify says %+v, %v", c, err)
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
		if r.Type == TLS12CID && want.CID == nil {
			want.CID = r.CID
		}
		want.Records++
		rest = rest[n:]
	}
	switch {
	case werr != nil:
		want = Class{Records: want.Records}
		if errors.Is(werr, ErrCIDLength) {
			want.Records = 0
		}
	case want.CID != nil:
		want.Kind = KindEstablished
	default:
		want.Kind = KindNew
	}
	if err != werr || c.Kind != want.Kind || c.Records != want.Records || c.ClientHello != want.ClientHello ||
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
