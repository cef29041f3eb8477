package quic

import (
	"encoding/binary"
	"errors"
)

// QUIC versions whose packet layout this package knows beyond the RFC 8999
// invariants.
const (
	Version1 uint32 = 0x00000001 // RFC 9000
	Version2 uint32 = 0x6b3343cf // RFC 9369
)

// MaxCIDLen is the longest connection ID QUIC v1 and v2 allow. Long headers
// of other versions may carry up to 255 bytes (RFC 8999).
const MaxCIDLen = 20

// MinInitialDatagram is the smallest UDP payload that may carry a client
// Initial packet (RFC 9000 §14.1); servers must discard smaller ones.
const MinInitialDatagram = 1200

// Errors returned by ParseHeader and Classify. They are returned as they
// are, not wrapped, so that the drop path allocates nothing; test them with
// errors.Is.
var (
	// ErrTooShort: the datagram is empty or too short to be a packet of
	// its kind (a short header packet needs its DCID plus the 20 bytes
	// header protection samples; a v1/v2 long header packet needs a Length
	// of at least 20).
	ErrTooShort = errors.New("quic: packet too short")
	// ErrTruncated: a length in the header (CID, token, Length) points past
	// the end of the datagram.
	ErrTruncated = errors.New("quic: truncated packet")
	// ErrCIDLength: a v1/v2 connection ID longer than 20 bytes.
	ErrCIDLength = errors.New("quic: connection ID too long")
	// ErrServerOnly: a Version Negotiation or Retry packet, which only
	// servers send.
	ErrServerOnly = errors.New("quic: server-only packet type from client")
	// ErrDCIDMismatch: coalesced packets with different destination
	// connection IDs (RFC 9000 §12.2 forbids senders to do this).
	ErrDCIDMismatch = errors.New("quic: coalesced packets with different DCIDs")
	// ErrInitialSize: a v1/v2 Initial packet in a datagram shorter than
	// 1200 bytes (RFC 9000 §14.1).
	ErrInitialSize = errors.New("quic: Initial in datagram under 1200 bytes")
)

// PacketType is the type of one QUIC packet.
type PacketType uint8

// Packet types. The zero value is not a valid type.
const (
	Initial            PacketType = iota + 1 // v1/v2 Initial
	ZeroRTT                                  // v1/v2 0-RTT
	Handshake                                // v1/v2 Handshake
	Retry                                    // v1/v2 Retry (server only)
	VersionNegotiation                       // version 0 (server only)
	Short                                    // short header (1-RTT)
	UnknownVersion                           // long header of a version other than 0, 1, 2
)

// String returns the type's name as RFC 9000 writes it, such as
// "Initial" or "0-RTT", or "Invalid".
func (t PacketType) String() string {
	switch t {
	case Initial:
		return "Initial"
	case ZeroRTT:
		return "0-RTT"
	case Handshake:
		return "Handshake"
	case Retry:
		return "Retry"
	case VersionNegotiation:
		return "VersionNegotiation"
	case Short:
		return "Short"
	case UnknownVersion:
		return "UnknownVersion"
	}
	return "Invalid"
}

// Long packet types by the two type bits of the first octet.
var (
	v1Types = [4]PacketType{Initial, ZeroRTT, Handshake, Retry}
	v2Types = [4]PacketType{Retry, Initial, ZeroRTT, Handshake} // RFC 9369 §3.2
)

// IsLong reports whether the first octet of a packet announces a long header.
func IsLong(b0 byte) bool { return b0&0x80 != 0 }

// Header is the parsed header of the first packet in b. DCID, SCID and Token
// are views into the buffer given to ParseHeader: they are valid only while
// that buffer is and must be copied to be kept.
type Header struct {
	Type    PacketType // the first packet's type
	Version uint32     // 0 for short headers and Version Negotiation
	DCID    []byte     // the destination CID: what a proxy routes by
	SCID    []byte     // nil for short headers
	Token   []byte     // Initial: the token (may be empty); Retry: the retry token
	// Len is the number of bytes of b this packet occupies. Packets that
	// carry no Length field (short header, Retry, Version Negotiation,
	// unknown versions) extend to the end of the datagram.
	Len int
}

// ParseHeader parses the header of the first packet in b. A short header
// packet's DCID is shortDCIDLen bytes, the server CID length of the
// service. Long headers of unknown versions are parsed by the RFC 8999
// invariants only. Version Negotiation and Retry packets parse without
// error; Classify is what rejects them from clients.
//
// ParseHeader does not allocate and does not check the fixed bit (RFC 9287
// lets peers grease it). It does not remove header protection, so reserved
// bits and packet numbers are not examined.
func ParseHeader(b []byte, shortDCIDLen int) (Header, error) {
	typ, version, dcid, n, err := scan(b, shortDCIDLen)
	if err != nil {
		return Header{}, err
	}
	h := Header{Type: typ, Version: version, DCID: dcid, Len: n}
	if typ == Short {
		return h, nil
	}
	// scan checked every bound used below.
	off := 6 + len(dcid)
	sl := int(b[off])
	h.SCID = b[off+1 : off+1+sl]
	off += 1 + sl
	switch typ {
	case Initial:
		tl, k := varint(b[off:])
		h.Token = b[off+k : off+k+int(tl)]
	case Retry:
		h.Token = b[off : n-16]
	}
	return h, nil
}

// scan parses the packet at the start of b just far enough to know its
// type, version, DCID and length. Classify walks datagrams with it;
// ParseHeader adds the SCID and token.
func scan(b []byte, shortDCIDLen int) (typ PacketType, version uint32, dcid []byte, n int, err error) {
	if len(b) == 0 {
		return 0, 0, nil, 0, ErrTooShort
	}
	if !IsLong(b[0]) {
		// Header protection samples 16 bytes starting 4 bytes after the
		// packet number offset (RFC 9001 §5.4.2), so a real 1-RTT packet
		// has at least 20 bytes after its DCID.
		if uint(shortDCIDLen) > MaxCIDLen {
			return 0, 0, nil, 0, ErrCIDLength
		}
		if len(b) < 1+shortDCIDLen+20 {
			return 0, 0, nil, 0, ErrTooShort
		}
		return Short, 0, b[1 : 1+shortDCIDLen], len(b), nil
	}

	// Invariants (RFC 8999 §5.1): first octet, version, DCID, SCID.
	if len(b) < 7 {
		return 0, 0, nil, 0, ErrTruncated
	}
	version = binary.BigEndian.Uint32(b[1:5])
	known := version == Version1 || version == Version2
	dl := int(b[5])
	if known && dl > MaxCIDLen {
		return 0, 0, nil, 0, ErrCIDLength
	}
	off := 6 + dl
	if len(b) < off+1 {
		return 0, 0, nil, 0, ErrTruncated
	}
	dcid = b[6:off]
	sl := int(b[off])
	if known && sl > MaxCIDLen {
		return 0, 0, nil, 0, ErrCIDLength
	}
	off += 1 + sl
	if len(b) < off {
		return 0, 0, nil, 0, ErrTruncated
	}

	switch version {
	case 0:
		return VersionNegotiation, 0, dcid, len(b), nil
	case Version1:
		typ = v1Types[b[0]>>4&3]
	case Version2:
		typ = v2Types[b[0]>>4&3]
	default:
		return UnknownVersion, version, dcid, len(b), nil
	}

	switch typ {
	case Retry:
		// Retry Token, then a 16-byte integrity tag (RFC 9001 §5.8).
		if len(b)-off < 16 {
			return 0, 0, nil, 0, ErrTruncated
		}
		return Retry, version, dcid, len(b), nil
	case Initial:
		tl, k := varint(b[off:])
		if k == 0 {
			return 0, 0, nil, 0, ErrTruncated
		}
		off += k
		if tl > uint64(len(b)-off) {
			return 0, 0, nil, 0, ErrTruncated
		}
		off += int(tl)
	}
	pl, k := varint(b[off:])
	if k == 0 {
		return 0, 0, nil, 0, ErrTruncated
	}
	off += k
	if pl > uint64(len(b)-off) {
		return 0, 0, nil, 0, ErrTruncated
	}
	// Packet number (1..4) + payload with a 16-byte AEAD tag; the header
	// protection sample needs 4+16 bytes (RFC 9001 §5.4.2).
	if pl < 20 {
		return 0, 0, nil, 0, ErrTooShort
	}
	return typ, version, dcid, off + int(pl), nil
}

// varint decodes a QUIC variable-length integer (RFC 9000 §16). n is 0 when
// b is too short.
func varint(b []byte) (v uint64, n int) {
	if len(b) == 0 {
		return 0, 0
	}
	n = 1 << (b[0] >> 6)
	if len(b) < n {
		return 0, 0
	}
	v = uint64(b[0] & 0x3f)
	for i := 1; i < n; i++ {
		v = v<<8 | uint64(b[i])
	}
	return v, n
}
