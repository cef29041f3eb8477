package quic

import (
	"bytes"
	"testing"
)

// FuzzLBEncrypted: for any key, nonce length and nonce, every ordinal
// encodes to a CID that decodes back to it; decoding arbitrary bytes never
// panics, and a CID it accepts is one the codec could have issued (the
// encryption is a permutation: re-encrypting the decrypted octets gives
// the CID back).
func FuzzLBEncrypted(f *testing.F) {
	f.Add(draftKey[:], uint8(LBEncryptedDefaultNonceLen), uint8(1), false, []byte("nonce-of-10"), []byte{})
	f.Add(draftKey[:], uint8(LBSinglePassNonceLen), uint8(0), true, []byte{}, []byte{0x10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Fuzz(func(t *testing.T, key []byte, nonceLen, config uint8, self bool, nonce, cid []byte) {
		var k [16]byte
		copy(k[:], key)
		nl := LBMinNonceLen + int(nonceLen)%(LBMaxNonceLen-LBMinNonceLen+1)
		id := config % LBUnroutable
		c, err := NewLBEncrypted(LBEncryptedConfig{NonceLen: nl, SelfEncodeLength: self, Keys: []LBKey{{id, k}}, Active: id})
		if err != nil {
			t.Fatal(err)
		}
		ci := c.set.Load().byID[id]
		if ord, ok := c.Ordinal(cid); ok {
			if len(cid) != c.Len() || cid[0]>>5 != id || (self && int(cid[0]&0x1f) != c.Len()-1) {
				t.Fatalf("decoded %x", cid)
			}
			pt := make([]byte, ci.n)
			ci.decrypt(pt, cid[1:])
			again := make([]byte, ci.n)
			ci.encrypt(again, pt)
			if pt[0] != ord || !bytes.Equal(again, cid[1:]) {
				t.Fatalf("%x: plaintext %x (ordinal %d) encrypts to %x", cid, pt, ord, again)
			}
		}
		buf := make([]byte, c.Len())
		for ord := range 255 {
			buf[0] = byte(ord) // random low bits
			for i := range buf[2:] {
				if i < len(nonce) {
					buf[2+i] = nonce[i]
				} else {
					buf[2+i] = 0
				}
			}
			c.encode(buf, ci, id, uint8(ord))
			if got, ok := c.Ordinal(buf); !ok || got != uint8(ord) {
				t.Fatalf("ordinal %d, nonce %x: %x decodes to %d, %v", ord, nonce, buf, got, ok)
			}
		}
	})
}

// FuzzLBCipher: every server ID and nonce length the draft allows (the
// draft's test vectors use 3 to 10 octets of server ID) decrypts what it
// encrypts, and finds the server ID with three passes or four.
func FuzzLBCipher(f *testing.F) {
	f.Add(draftKey[:], uint8(3), uint8(4), []byte{0xed, 0x79, 0x3a, 0xee, 0x08, 0x0d, 0xbf})
	f.Add(draftKey[:], uint8(10), uint8(5), []byte{0xed, 0x79, 0x3a, 0x51, 0xd4, 0x9b, 0x8f, 0x5f, 0xab, 0x65, 0xee, 0x08, 0x0d, 0xbf, 0x48})
	f.Fuzz(func(t *testing.T, key []byte, sidLen, nonceLen uint8, pt []byte) {
		c, ok := newLBCipher(key, int(sidLen), int(nonceLen))
		if !ok {
			if len(key) == 16 && sidLen >= 1 && nonceLen >= 4 && int(sidLen)+int(nonceLen) <= 19 {
				t.Fatalf("%d+%d refused", sidLen, nonceLen)
			}
			return
		}
		p := make([]byte, c.n)
		copy(p, pt)
		ct, back, sid := make([]byte, c.n), make([]byte, c.n), make([]byte, c.sidLen)
		c.encrypt(ct, p)
		c.decrypt(back, ct)
		c.serverID(sid, ct)
		if !bytes.Equal(back, p) || !bytes.Equal(sid, p[:c.sidLen]) || c.firstOctet(ct) != p[0] {
			t.Fatalf("%d+%d: %x → %x → %x, server ID %x", sidLen, nonceLen, p, ct, back, sid)
		}
	})
}
