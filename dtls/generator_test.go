package dtls_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

// TestGeneratorEncrypted: the pion generator takes the encrypted QUIC-LB
// codec: fresh CIDs of its length that decode to the ordinal, with no
// octet carrying the ordinal in the clear, and rotation followed.
func TestGeneratorEncrypted(t *testing.T) {
	k1, k2 := quic.LBKey{ConfigID: 1, Key: [16]byte{1}}, quic.LBKey{ConfigID: 2, Key: [16]byte{2}}
	c, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{NonceLen: 6, Keys: []quic.LBKey{k1}, Active: 1})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := dtls.Generator(c, 9)
	if err != nil {
		t.Fatal(err)
	}
	clear := 0
	seen := map[string]bool{}
	for range 1000 {
		cid := gen()
		if ord, ok := c.Ordinal(cid); len(cid) != 8 || !ok || ord != 9 || cid[0]>>5 != 1 {
			t.Fatalf("%x: %d, %v", cid, ord, ok)
		}
		if seen[string(cid)] {
			t.Fatalf("%x issued twice", cid)
		}
		seen[string(cid)] = true
		if cid[0] == 9 || cid[1] == 9 {
			clear++
		}
	}
	if clear > 30 { // about 1000 * 2/256 = 8 by chance
		t.Fatalf("the ordinal shows in octet 0 or 1 of %d CIDs in 1000", clear)
	}
	a, b := gen(), gen()
	a[1] ^= 0xff
	if bytes.Equal(a, b) {
		t.Fatal("each call returns its own slice")
	}
	if err := c.SetKeys([]quic.LBKey{k1, k2}, 2); err != nil {
		t.Fatal(err)
	}
	if cid := gen(); cid[0]>>5 != 2 {
		t.Fatalf("after rotation: %x", cid)
	}
}

// brokenCodec returns CIDs that decode to another ordinal, or fails once
// told to.
type brokenCodec struct {
	dtls.OrdinalFirst
	shift uint8
	fail  *bool
}

func (b brokenCodec) AppendCID(dst []byte, ord uint8) ([]byte, error) {
	if b.fail != nil && *b.fail {
		return dst, errors.New("broken")
	}
	return b.OrdinalFirst.AppendCID(dst, ord+b.shift)
}

func TestGeneratorChecks(t *testing.T) {
	if _, err := dtls.Generator(brokenCodec{shift: 1}, 3); !errors.Is(err, dtls.ErrCodec) {
		t.Fatalf("a codec that does not round-trip: %v", err)
	}
	if _, err := dtls.Generator(dtls.OrdinalFirst{}, dtls.ReservedOrdinal); !errors.Is(err, dtls.ErrReservedOrdinal) {
		t.Fatal(err)
	}
	if _, err := dtls.Generator(dtls.OrdinalFirst{Length: 300}, 1); !errors.Is(err, dtls.ErrCIDLength) {
		t.Fatal(err)
	}
	fail := false
	gen, err := dtls.Generator(brokenCodec{fail: &fail}, 3)
	if err != nil {
		t.Fatal(err)
	}
	fail = true
	if cid := gen(); cid != nil {
		t.Fatalf("a failing codec gave %x, want nil (no CID)", cid)
	}
}
