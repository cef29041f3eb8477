package quic

import (
	"crypto/rand"
	"fmt"
	"slices"
	"sync/atomic"
)

// Nonce lengths of the encrypted codec. The CID is the first octet, the
// 1-octet server ID and the nonce: 6 to 20 octets.
const (
	// LBEncryptedDefaultNonceLen makes 12-octet CIDs, the length of the
	// plaintext codec's default, encrypted in four passes.
	LBEncryptedDefaultNonceLen = 10
	// LBSinglePassNonceLen makes server ID + nonce one AES block: 17-octet
	// CIDs, encrypted in one pass.
	LBSinglePassNonceLen = lbBlockLen - 1
	LBMinNonceLen        = lbMinNonceLen         // 4: 6-octet CIDs
	LBMaxNonceLen        = lbMaxPlaintextLen - 1 // 18: 20-octet CIDs
)

// LBKey is one configuration of an LBEncrypted codec: a config rotation
// codepoint (0–6) and its AES-128 key. Its String method hides the key,
// so that printing a configuration never logs it.
type LBKey struct {
	ConfigID uint8    // the CID's first three bits select it
	Key      [16]byte // shared by every proxy and backend of the service
}

// String returns the config ID only.
func (k LBKey) String() string { return fmt.Sprintf("QUIC-LB config %d (key hidden)", k.ConfigID) }

// GoString is String, for %#v.
func (k LBKey) GoString() string { return k.String() }

// LBEncryptedConfig configures an LBEncrypted codec.
type LBEncryptedConfig struct {
	// NonceLen is the nonce length in octets, LBMinNonceLen (4) to
	// LBMaxNonceLen (18); 0 means LBEncryptedDefaultNonceLen (10). The
	// CID is 2+NonceLen octets; LBSinglePassNonceLen (15) selects the
	// single-pass algorithm, every other length the four-pass one. It is
	// fixed for the codec's life: a QUIC short header does not carry its
	// CID's length, so every configuration of a service shares it.
	NonceLen int
	// SelfEncodeLength writes the CID length less one into the low 5 bits
	// of the first octet (draft §3.3) instead of random bits; decoding
	// then also requires it.
	SelfEncodeLength bool
	// Keys are the configurations the codec decodes, by config ID.
	Keys []LBKey
	// Active is the config ID whose key AppendCID encrypts with; it must
	// be one of Keys.
	Active uint8
}

// LBEncrypted is the QUIC-LB encrypted connection ID codec
// (draft-ietf-quic-load-balancers-21 §5) with a 1-octet server ID that is
// the backend ordinal:
//
//	octet 0:    config rotation (3 bits) | CID length-1 or random (5 bits)
//	octets 1..: AES-128-ECB(server ID = ordinal || nonce): one block when
//	            the nonce is 15 octets (single pass), else the draft's
//	            four-pass Feistel network
//
// It holds several configurations at once, for key rotation: Ordinal
// decodes a CID with the key of the config ID in its first octet, and
// AppendCID encrypts with the active one. SetKeys replaces the set
// atomically, so a proxy can add a configuration before the backends
// encode with it, and retire the old one after the longest session has
// moved on (see SetKeys). A CID whose config ID has no key, or is 0b111,
// is not routable (ok=false), as the draft's §4.1 says.
//
// What it protects: without the key, an observer cannot read which
// backend a CID names (nor, therefore, count backends or link a
// connection's CIDs by their server ID), and an attacker cannot write a
// CID that names a chosen backend. What it does not: any CID with a
// configured config ID decodes to some ordinal, so random CIDs still reach
// random backends, spread evenly (backends must still drop packets of
// connections they do not know), and the first octet's config rotation
// bits, and the length when SelfEncodeLength is set, stay in the clear.
// Because no octet carries the ordinal in the clear, OrdinalOffset is -1:
// kernel steering (udpio.AttachSteering) cannot use this codec.
//
// The nonce is random (crypto/rand). The draft forbids reusing a nonce
// under one key: with an n-octet nonce a backend can expect a repeat after
// about 2^(4n) CIDs, so rotate keys well before that (2^40 CIDs with the
// default 10 octets, but only 2^16 with 4).
//
// Ordinal does not allocate; AppendCID allocates only when dst lacks
// capacity. An LBEncrypted is safe for concurrent use, including SetKeys,
// and satisfies cidroute.CIDCodec. Use it through a pointer from
// NewLBEncrypted.
type LBEncrypted struct {
	n          int // CID length
	selfEncode bool
	set        atomic.Pointer[lbKeySet]
}

// lbKeySet is an immutable set of configurations: byID[config rotation]
// is that configuration's cipher or nil; byID[7] is always nil.
type lbKeySet struct {
	byID   [8]*lbCipher
	active uint8
}

// NewLBEncrypted validates cfg and returns its codec, with every key
// expanded once.
func NewLBEncrypted(cfg LBEncryptedConfig) (*LBEncrypted, error) {
	nonce := cfg.NonceLen
	if nonce == 0 {
		nonce = LBEncryptedDefaultNonceLen
	}
	if nonce < LBMinNonceLen || nonce > LBMaxNonceLen {
		return nil, fmt.Errorf("%w: nonce length %d outside %d..%d", ErrLBConfig, nonce, LBMinNonceLen, LBMaxNonceLen)
	}
	c := &LBEncrypted{n: 2 + nonce, selfEncode: cfg.SelfEncodeLength}
	if err := c.SetKeys(cfg.Keys, cfg.Active); err != nil {
		return nil, err
	}
	return c, nil
}

// SetKeys replaces the codec's configurations with keys, and the one
// AppendCID uses with active. Datagrams being decoded meanwhile use the
// old set or the new one, never a mix. On error nothing changes.
//
// A rotation from config 1 to config 2 without breaking a session, as the
// draft's §3.1 orders it:
//  1. proxies: SetKeys({1, 2}, 1): they decode both;
//  2. backends: SetKeys({1, 2}, 2): new CIDs, and the NEW_CONNECTION_ID
//     CIDs of running connections, use config 2; CIDs already issued with
//     config 1 stay valid;
//  3. after the longest session lifetime (or once every client has moved
//     to a config-2 CID), proxies and backends: SetKeys({2}, 2). A CID of
//     config 1 is now unroutable.
func (c *LBEncrypted) SetKeys(keys []LBKey, active uint8) error {
	if c.n == 0 {
		return fmt.Errorf("%w: LBEncrypted not made by NewLBEncrypted", ErrLBConfig)
	}
	if len(keys) == 0 {
		return fmt.Errorf("%w: no keys", ErrLBConfig)
	}
	s := &lbKeySet{active: active}
	for _, k := range keys {
		if k.ConfigID >= LBUnroutable {
			return fmt.Errorf("%w: config ID %d outside 0..6", ErrLBConfig, k.ConfigID)
		}
		if s.byID[k.ConfigID] != nil {
			return fmt.Errorf("%w: config ID %d given twice", ErrLBConfig, k.ConfigID)
		}
		ci, ok := newLBCipher(k.Key[:], 1, c.n-2)
		if !ok {
			return fmt.Errorf("%w: config ID %d: cannot use the key", ErrLBConfig, k.ConfigID)
		}
		s.byID[k.ConfigID] = ci
	}
	if active >= LBUnroutable || s.byID[active] == nil {
		return fmt.Errorf("%w: active config ID %d has no key", ErrLBConfig, active)
	}
	c.set.Store(s)
	return nil
}

// ConfigIDs returns the config IDs the codec decodes, in increasing order.
func (c *LBEncrypted) ConfigIDs() []uint8 {
	var ids []uint8
	if s := c.set.Load(); s != nil {
		for id, ci := range s.byID {
			if ci != nil {
				ids = append(ids, uint8(id))
			}
		}
	}
	return ids
}

// Active returns the config ID AppendCID encrypts with.
func (c *LBEncrypted) Active() uint8 {
	if s := c.set.Load(); s != nil {
		return s.active
	}
	return LBUnroutable
}

// Len returns the CID length, 2 + the nonce length.
func (c *LBEncrypted) Len() int { return c.n }

// SinglePass reports whether CIDs are encrypted in one AES pass (a
// 15-octet nonce) rather than four.
func (c *LBEncrypted) SinglePass() bool { return c.n-1 == lbBlockLen }

// OrdinalOffset returns -1: no octet of the CID holds the ordinal in the
// clear.
func (c *LBEncrypted) OrdinalOffset() int { return -1 }

// String describes the codec without its keys.
func (c *LBEncrypted) String() string {
	mode := "four-pass"
	if c.SinglePass() {
		mode = "single-pass"
	}
	return fmt.Sprintf("QUIC-LB encrypted, %d octets (%s), configs %v, active %d", c.n, mode, c.ConfigIDs(), c.Active())
}

// AppendCID appends a fresh CID carrying ordinal, encrypted with the active
// configuration, to dst. It allocates only when dst lacks capacity.
func (c *LBEncrypted) AppendCID(dst []byte, ordinal uint8) ([]byte, error) {
	s := c.set.Load()
	if s == nil {
		return dst, fmt.Errorf("%w: no keys", ErrLBConfig)
	}
	if ordinal == 255 {
		return dst, ErrReservedOrdinal
	}
	start := len(dst)
	dst = slices.Grow(dst, c.n)[:start+c.n]
	cid := dst[start:]
	rand.Read(cid) // never fails (crypto/rand, Go 1.24+); cid[1] is overwritten
	c.encode(cid, s.byID[s.active], s.active, ordinal)
	return dst, nil
}

// encode turns cid (first octet random, nonce in cid[2:]) into the CID
// that carries ordinal under configuration ci with config ID id.
func (c *LBEncrypted) encode(cid []byte, ci *lbCipher, id, ordinal uint8) {
	low := cid[0] & 0x1f
	if c.selfEncode {
		low = byte(c.n - 1)
	}
	cid[0] = id<<5 | low
	cid[1] = ordinal
	ci.encrypt(cid[1:], cid[1:])
}

// Ordinal decrypts the ordinal from a CID. ok is false when the CID is not
// routable (draft §4.1): its length is not Len(), its config ID has no key
// or is 0b111, or SelfEncodeLength is set and the low 5 bits are not
// Len()-1. Any other CID decodes to some ordinal, 255 included (which the
// router treats as reserved). Single pass costs one AES decryption, four
// pass three AES encryptions. Ordinal does not allocate.
func (c *LBEncrypted) Ordinal(cid []byte) (uint8, bool) {
	s := c.set.Load()
	if s == nil || len(cid) != c.n {
		return 0, false
	}
	ci := s.byID[cid[0]>>5]
	if ci == nil || (c.selfEncode && int(cid[0]&0x1f) != c.n-1) {
		return 0, false
	}
	return ci.firstOctet(cid[1:]), true
}
