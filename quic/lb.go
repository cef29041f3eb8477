package quic

import (
	"crypto/rand"
	"errors"
	"fmt"
)

// Errors of the QUIC-LB codec.
var (
	// ErrLBConfig: an LB whose fields are out of range.
	ErrLBConfig = errors.New("quic: invalid QUIC-LB configuration")
	// ErrReservedOrdinal: ordinal 255, which is never issued.
	ErrReservedOrdinal = errors.New("quic: ordinal 255 is reserved")
)

// Limits of the LB codec: a first octet, a 1-octet server ID and a nonce of
// 4 or more octets, within QUIC v1's 20-octet CID limit.
const (
	LBDefaultLen = 12        // the zero LB's length
	LBMinLen     = 1 + 1 + 4 // first octet, server ID, 4-octet nonce
	LBMaxLen     = MaxCIDLen // 20
	// LBUnroutable is the config rotation codepoint 0b111 of CIDs that no
	// load balancer can decode (draft-ietf-quic-load-balancers-21 §3.1).
	LBUnroutable = 7
)

// LB is the QUIC-LB plaintext connection ID codec
// (draft-ietf-quic-load-balancers-21 §5, without a key), with a 1-octet
// server ID that is the backend ordinal:
//
//	octet 0:    config rotation (3 bits) | CID length-1 or random (5 bits)
//	octet 1:    server ID = ordinal
//	octets 2..: nonce, random from crypto/rand
//
// The zero value is the QUIC default: 12 octets, config rotation 0, random
// low bits. LB is a value type, safe for concurrent use, and satisfies
// cidroute.CIDCodec.
type LB struct {
	// Length is the CID length in octets, 6..20; 0 means 12. Keep it
	// different from 8 so a server CID is not confused with the 8-byte
	// random DCIDs many clients start with.
	Length int
	// ConfigID is the config rotation codepoint 0..6 written into, and
	// required of, every CID.
	ConfigID uint8
	// SelfEncodeLength writes Length-1 into the low 5 bits of the first
	// octet (draft §3.3) instead of random bits; decoding then also
	// requires it.
	SelfEncodeLength bool
}

// Len returns the CID length.
func (l LB) Len() int {
	if l.Length == 0 {
		return LBDefaultLen
	}
	return l.Length
}

// OrdinalOffset returns 1, the offset of the server ID octet.
func (LB) OrdinalOffset() int { return 1 }

// Validate reports whether the configuration is usable.
func (l LB) Validate() error {
	if n := l.Len(); n < LBMinLen || n > LBMaxLen {
		return fmt.Errorf("%w: length %d outside %d..%d", ErrLBConfig, n, LBMinLen, LBMaxLen)
	}
	if l.ConfigID >= LBUnroutable {
		return fmt.Errorf("%w: config rotation %d outside 0..6", ErrLBConfig, l.ConfigID)
	}
	return nil
}

func (l LB) valid() bool {
	n := l.Len()
	return n >= LBMinLen && n <= LBMaxLen && l.ConfigID < LBUnroutable
}

// AppendCID appends a fresh CID carrying ordinal to dst. It allocates only
// when dst lacks capacity.
func (l LB) AppendCID(dst []byte, ordinal uint8) ([]byte, error) {
	if err := l.Validate(); err != nil {
		return dst, err
	}
	if ordinal == 255 {
		return dst, ErrReservedOrdinal
	}
	n := l.Len()
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	cid := dst[start:]
	if _, err := rand.Read(cid); err != nil {
		return dst[:start], fmt.Errorf("quic: reading random nonce: %w", err)
	}
	low := cid[0] & 0x1f
	if l.SelfEncodeLength {
		low = byte(n - 1)
	}
	cid[0] = l.ConfigID<<5 | low
	cid[1] = ordinal
	return dst, nil
}

// Ordinal decodes the ordinal from a CID. ok is false when the CID is not
// routable by this configuration, as the draft's §4.1 defines it:
//   - its config rotation is 0b111 (the server had no configuration), or any
//     codepoint other than ConfigID (a configuration this balancer does not
//     have) — the draft treats both alike, and the router then falls back
//     to hashing the client address;
//   - its length is not Len();
//   - SelfEncodeLength is set and the low 5 bits are not Len()-1 (the
//     draft's optional consistency check);
//   - the configuration itself is invalid.
//
// A decoded 255 is returned with ok=true; the router treats it as reserved.
// Ordinal does not allocate.
func (l LB) Ordinal(cid []byte) (uint8, bool) {
	if !l.valid() {
		return 0, false
	}
	sid, ok := lbServerID(cid, l.ConfigID, 1, l.Len()-2, l.SelfEncodeLength)
	if !ok {
		return 0, false
	}
	return sid[0], true
}

// lbServerID extracts the server ID of a plaintext QUIC-LB CID for a
// configuration with the given config rotation, server ID and nonce
// lengths. It returns a view into cid. The public codec uses sidLen 1; the
// draft's test vectors use other lengths.
func lbServerID(cid []byte, configID uint8, sidLen, nonceLen int, selfEncode bool) ([]byte, bool) {
	if len(cid) == 0 || len(cid) != 1+sidLen+nonceLen {
		return nil, false
	}
	cr := cid[0] >> 5
	if cr == LBUnroutable || cr != configID {
		return nil, false
	}
	if selfEncode && int(cid[0]&0x1f) != len(cid)-1 {
		return nil, false
	}
	return cid[1 : 1+sidLen], true
}
