package quicgo

import (
	"errors"
	"testing"

	"github.com/cidroute/cidroute/dtls"
	cidquic "github.com/cidroute/cidroute/quic"
)

// badCodec lets a test break one promise of the codec contract.
type badCodec struct {
	n       int
	write   int
	decode  uint8
	failErr error
}

func (c badCodec) Len() int { return c.n }
func (c badCodec) AppendCID(dst []byte, ordinal uint8) ([]byte, error) {
	if c.failErr != nil {
		return dst, c.failErr
	}
	return append(dst, make([]byte, c.write)...), nil
}
func (c badCodec) Ordinal([]byte) (uint8, bool) { return c.decode, true }

func TestNewGenerator(t *testing.T) {
	g, err := NewGenerator(nil, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g.ConnectionIDLen() != 12 || g.Ordinal() != 5 {
		t.Fatalf("len %d ordinal %d", g.ConnectionIDLen(), g.Ordinal())
	}
	seen := map[string]bool{}
	for range 100 {
		id, err := g.GenerateConnectionID()
		if err != nil {
			t.Fatal(err)
		}
		if ord, ok := (cidquic.LB{}).Ordinal(id.Bytes()); !ok || ord != 5 || id.Len() != 12 {
			t.Fatalf("%x decodes to %d, %v", id.Bytes(), ord, ok)
		}
		if seen[string(id.Bytes())] {
			t.Fatal("repeated CID")
		}
		seen[string(id.Bytes())] = true
	}

	g, err = NewGenerator(cidquic.LB{Length: 20, ConfigID: 6, SelfEncodeLength: true}, 0)
	if err != nil || g.ConnectionIDLen() != 20 {
		t.Fatal(g, err)
	}

	for name, tc := range map[string]struct {
		codec   Codec
		ordinal uint8
	}{
		"bad LB config":        {cidquic.LB{ConfigID: 7}, 1},
		"LB too long":          {cidquic.LB{Length: 21}, 1},
		"length 0":             {badCodec{n: 0, write: 0, decode: 1}, 1},
		"length 21":            {badCodec{n: 21, write: 21, decode: 1}, 1},
		"writes the wrong len": {badCodec{n: 9, write: 10, decode: 1}, 1},
		"does not decode back": {badCodec{n: 9, write: 9, decode: 2}, 1},
		"AppendCID fails":      {badCodec{n: 9, failErr: errors.New("boom")}, 1},
		"LB of 8":              {cidquic.LB{Length: 8}, 1},
		"ordinal-first of 8":   {dtls.OrdinalFirst{}, 1},
		"ordinal-first of 12":  {dtls.OrdinalFirst{Length: 12}, 1},
	} {
		if _, err := NewGenerator(tc.codec, tc.ordinal); !errors.Is(err, ErrCodec) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, c := range []Codec{cidquic.LB{Length: 8}, dtls.OrdinalFirst{}, dtls.OrdinalFirst{Length: 12}} {
		if _, err := NewGenerator(c, 1); !errors.Is(err, cidquic.ErrServerCIDLen) {
			t.Errorf("%T of %d: %v is not quic.ErrServerCIDLen", c, c.Len(), err)
		}
	}
	if _, err := NewGenerator(dtls.OrdinalFirst{Length: 6}, 1); err != nil {
		t.Errorf("ordinal-first of 6: %v", err)
	}
	_, err = NewGenerator(cidquic.LB{}, 255)
	if !errors.Is(err, ErrReservedOrdinal) || !errors.Is(err, cidquic.ErrReservedOrdinal) || errors.Is(err, ErrCodec) {
		t.Errorf("ordinal 255: %v", err)
	}
}

// TestNewGeneratorEncrypted: quic-go's generator takes the encrypted
// codec, and follows its key rotation without being rebuilt.
func TestNewGeneratorEncrypted(t *testing.T) {
	k1, k2 := cidquic.LBKey{ConfigID: 1, Key: [16]byte{1}}, cidquic.LBKey{ConfigID: 2, Key: [16]byte{2}}
	for _, nonce := range []int{cidquic.LBEncryptedDefaultNonceLen, cidquic.LBSinglePassNonceLen} {
		c, err := cidquic.NewLBEncrypted(cidquic.LBEncryptedConfig{NonceLen: nonce, Keys: []cidquic.LBKey{k1}, Active: 1})
		if err != nil {
			t.Fatal(err)
		}
		g, err := NewGenerator(c, 200)
		if err != nil || g.ConnectionIDLen() != 2+nonce {
			t.Fatal(g, err)
		}
		check := func(config uint8) {
			t.Helper()
			id, err := g.GenerateConnectionID()
			if err != nil {
				t.Fatal(err)
			}
			b := id.Bytes()
			if ord, ok := c.Ordinal(b); !ok || ord != 200 || len(b) != 2+nonce || b[0]>>5 != config {
				t.Fatalf("%x decodes to %d, %v", b, ord, ok)
			}
		}
		check(1)
		if err := c.SetKeys([]cidquic.LBKey{k1, k2}, 2); err != nil {
			t.Fatal(err)
		}
		check(2)
	}
}
