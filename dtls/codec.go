package dtls

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
)

// ReservedOrdinal is never issued: a CID that decodes to it is dropped.
const ReservedOrdinal = 255

var (
	// ErrReservedOrdinal is returned when asked to encode ReservedOrdinal.
	ErrReservedOrdinal = errors.New("dtls: ordinal 255 is reserved")
	// ErrCodec is returned by Generator for a codec whose trial CID fails.
	ErrCodec = errors.New("dtls: unusable CID codec")
)

// OrdinalFirstDefaultLen is the CID length of the zero OrdinalFirst, the
// DTLS default.
const OrdinalFirstDefaultLen = 8

const (
	// One ordinal byte and at least four random bytes, as QUIC-LB asks of
	// its nonce: pion routes a listener's datagrams by CID, so two live
	// sessions of one backend must not draw the same CID.
	minOrdinalFirstLen = 5
)

// OrdinalFirst is the ordinal-first CID layout: byte 0 is the backend's
// ordinal (0–254), the remaining Length-1 bytes come from crypto/rand.
// Californium's multi-node CID generator uses the same layout.
//
// Length 0 means 8. Valid lengths are 5 to 255 (RFC 9146's limit); with
// QUIC, which caps CIDs at 20 bytes, use at most 20. The random part should
// be large enough that a backend's concurrent sessions do not collide
// (birthday bound: with the default 7 random bytes, some two of a million
// sessions collide with a probability of about 7e-6).
//
// OrdinalFirst satisfies cidroute.CIDCodec.
type OrdinalFirst struct {
	Length int // the CID length in bytes; 0 means 8
}

// Len returns the CID length, 8 for the zero value.
func (c OrdinalFirst) Len() int {
	if c.Length == 0 {
		return OrdinalFirstDefaultLen
	}
	return c.Length
}

// Validate reports whether Length is usable (ErrCIDLength otherwise).
func (c OrdinalFirst) Validate() error {
	if n := c.Len(); n < minOrdinalFirstLen || n > MaxCIDLen {
		return fmt.Errorf("ordinal-first length %d not in %d..%d: %w", n, minOrdinalFirstLen, MaxCIDLen, ErrCIDLength)
	}
	return nil
}

// AppendCID appends a fresh CID carrying ordinal to dst. It allocates only
// when dst lacks capacity.
func (c OrdinalFirst) AppendCID(dst []byte, ordinal uint8) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return dst, err
	}
	if ordinal == ReservedOrdinal {
		return dst, ErrReservedOrdinal
	}
	n := c.Len()
	dst = slices.Grow(dst, n)
	cid := dst[len(dst) : len(dst)+n]
	cid[0] = ordinal
	rand.Read(cid[1:]) // never fails (crypto/rand, Go 1.24+)
	return dst[:len(dst)+n], nil
}

// Ordinal returns byte 0 of cid. ok is always true: ordinal-first has no
// "not routable" marking. A cid whose length is not Len decodes to
// ReservedOrdinal, so the router drops it instead of guessing.
func (c OrdinalFirst) Ordinal(cid []byte) (ordinal uint8, ok bool) {
	if len(cid) != c.Len() || len(cid) == 0 {
		return ReservedOrdinal, true
	}
	return cid[0], true
}

// OrdinalOffset returns 0, the ordinal's byte offset in the CID.
func (OrdinalFirst) OrdinalOffset() int { return 0 }

// Generator returns a function that makes a new CID for ordinal on each
// call, in the form pion/dtls v3 wants for Config.ConnectionIDGenerator
// (and WithConnectionIDGenerator): every call returns a new slice, which
// the caller may keep. It is safe for concurrent use. It is
// Generator(c, ordinal).
func (c OrdinalFirst) Generator(ordinal uint8) (func() []byte, error) {
	return Generator(c, ordinal)
}

// Codec is the part of cidroute.CIDCodec that Generator uses; every
// cidroute.CIDCodec satisfies it (OrdinalFirst, quic.LB, quic.LBEncrypted).
// It is declared here so that this package imports nothing of cidroute.
type Codec interface {
	// Len is the length of the CIDs the codec writes.
	Len() int
	// AppendCID appends a fresh CID that carries ordinal.
	AppendCID(dst []byte, ordinal uint8) ([]byte, error)
	// Ordinal reads the ordinal back; ok is false when cid carries none.
	Ordinal(cid []byte) (ordinal uint8, ok bool)
}

var _ Codec = OrdinalFirst{}

// Generator returns a pion/dtls v3 ConnectionIDGenerator (a function that
// makes a new CID for ordinal with c on each call, a new slice each time)
// for any codec, such as the encrypted QUIC-LB one, quic.LBEncrypted: with
// it an observer of the DTLS records cannot read the backend's ordinal from
// the CID, nor write a CID that names a chosen backend. It first checks
// that c's length fits RFC 9146 (1..255), that ordinal is not the reserved
// 255, and that a trial CID has c's length and decodes back to ordinal.
//
// The built-in codecs cannot fail after that check (a codec whose keys
// change, as quic.LBEncrypted's do on rotation, keeps a valid active
// configuration). Should a codec fail anyway, the function returns nil,
// with which pion asks the peer for no CID: the session is then routed by
// client address, and does not survive an address change, but is never
// misrouted. It is safe for concurrent use if c is.
func Generator(c Codec, ordinal uint8) (func() []byte, error) {
	if ordinal == ReservedOrdinal {
		return nil, ErrReservedOrdinal
	}
	n := c.Len()
	if n < 1 || n > MaxCIDLen {
		return nil, fmt.Errorf("codec length %d not in 1..%d: %w", n, MaxCIDLen, ErrCIDLength)
	}
	cid, err := c.AppendCID(make([]byte, 0, n), ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: trial CID: %w", ErrCodec, err)
	}
	if got, ok := c.Ordinal(cid); len(cid) != n || !ok || got != ordinal {
		return nil, fmt.Errorf("%w: trial CID %x (%d bytes, codec length %d) decodes to %d (ok=%v), want %d",
			ErrCodec, cid, len(cid), n, got, ok, ordinal)
	}
	return func() []byte {
		cid, err := c.AppendCID(make([]byte, 0, n), ordinal)
		if err != nil || len(cid) != n {
			return nil
		}
		return cid
	}, nil
}
