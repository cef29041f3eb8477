package dtls

import (
	"errors"
	"fmt"
)

// ContentType is the first byte of a DTLS record.
type ContentType uint8

// The content types a record with the DTLS 1.2 header (DTLSPlaintext in
// RFC 9147's terms) may carry. TLS12CID (RFC 9146) is an encrypted record
// with a connection ID in its header; ACK (RFC 9147 §7) is DTLS 1.3's,
// in plaintext only during the handshake (later its type is encrypted
// under a unified header).
const (
	ChangeCipherSpec ContentType = 20 // change_cipher_spec
	Alert            ContentType = 21 // alert
	Handshake        ContentType = 22 // handshake: a ClientHello starts a session
	ApplicationData  ContentType = 23 // application_data, of a session without CIDs
	TLS12CID         ContentType = 25 // tls12_cid: encrypted, with the CID the proxy routes by
	ACK              ContentType = 26 // ack: DTLS 1.3
)

// String returns the type's name in RFC 5246/9146/9147 spelling, such as
// "tls12_cid", or "unknown".
func (t ContentType) String() string {
	switch t {
	case ChangeCipherSpec:
		return "change_cipher_spec"
	case Alert:
		return "alert"
	case Handshake:
		return "handshake"
	case ApplicationData:
		return "application_data"
	case TLS12CID:
		return "tls12_cid"
	case ACK:
		return "ack"
	}
	return "unknown"
}

// Record versions on the wire. Both are accepted on every record: many
// clients (OpenSSL among them) send their first ClientHello as DTLS 1.0.
// DTLS 1.3 writes fe fd on its plaintext records too (legacy_record_version,
// RFC 9147 §4) and no version at all in the unified header.
const (
	VersionDTLS10 uint16 = 0xfeff // DTLS 1.0, fe ff
	VersionDTLS12 uint16 = 0xfefd // DTLS 1.2, fe fd
)

// Header and CID sizes.
const (
	// HeaderLen is the size of a record header without a CID:
	// type(1) version(2) epoch(2) sequence(6) length(2).
	HeaderLen = 13
	// MinCIDLen and MaxCIDLen bound the cidLen argument of ParseRecord and
	// Classify. RFC 9146 encodes a CID with a one-byte length, hence 255; a
	// zero-length CID means the peer sends no tls12_cid records, which
	// leaves nothing to route by.
	MinCIDLen = 1
	MaxCIDLen = 255 // see MinCIDLen
)

// The first octet of a DTLS 1.3 ciphertext record, its unified header
// (RFC 9147 §4), is 001CSLEE. After it come the CID (when C is set, of the
// configured length, as for TLS12CID), the low 8 or 16 bits of the
// sequence number (S), and a 16-bit length (when L is set; without it the
// record runs to the end of the datagram, so it can only be the last).
const (
	UnifiedFixedMask byte = 0xe0 // the three fixed bits, 001
	UnifiedFixed     byte = 0x20 // their value: see IsUnified
	UnifiedCID       byte = 0x10 // C: a CID follows the first octet
	UnifiedSeq16     byte = 0x08 // S: a 16-bit sequence number, else 8 bits
	UnifiedLength    byte = 0x04 // L: a 16-bit length follows the sequence number
	UnifiedEpoch     byte = 0x03 // EE: the epoch's two low bits
)

// IsUnified reports whether b0, a record's first octet, starts a DTLS 1.3
// unified header (001xxxxx). No content type falls in 0x20–0x3f, so it
// never reads a DTLS 1.2 record as one.
func IsUnified(b0 byte) bool { return b0&UnifiedFixedMask == UnifiedFixed }

// unifiedHeaderLen is the size of a unified header without its CID.
func unifiedHeaderLen(b0 byte) int {
	return 2 + int(b0>>3&1) + int(b0>>1&2) // flags, seq 8 (+8 with S), +16 with L
}

// The errors ParseRecord and Classify return. They are returned as they
// are, not wrapped, so that the error path does not allocate.
var (
	// ErrTooShort: the datagram is empty or shorter than a record header.
	ErrTooShort = errors.New("dtls: datagram shorter than a record header")
	// ErrTruncated: a record's CID or declared length runs past the end of
	// the datagram, or bytes after the last whole record do not form one.
	ErrTruncated = errors.New("dtls: truncated record")
	// ErrContentType: a first octet that is neither a content type
	// (20–23, 25, 26) nor a unified header (0x20–0x3f).
	ErrContentType = errors.New("dtls: unsupported content type")
	// ErrVersion: a record version other than fe fd and fe ff.
	ErrVersion = errors.New("dtls: unsupported record version")
	// ErrDTLS13 was returned for a DTLS 1.3 unified header, which
	// ParseRecord and Classify now read.
	//
	// Deprecated: nothing returns it.
	ErrDTLS13 = errors.New("dtls: DTLS 1.3 unified header not supported")
	// ErrEmptyRecord: a record whose declared length is 0, or a unified
	// header without length that ends the datagram. DTLS never sends one:
	// handshake, alert and change_cipher_spec fragments must not be empty
	// (RFC 5246 section 6.2.1), and application_data, tls12_cid and DTLS
	// 1.3 ciphertext records are encrypted, so they hold at least a MAC or
	// AEAD tag.
	ErrEmptyRecord = errors.New("dtls: record with empty fragment")
	// ErrCIDLength: the configured CID length is outside MinCIDLen..MaxCIDLen,
	// or a codec's Length is outside its range.
	ErrCIDLength = errors.New("dtls: invalid CID length")
	// ErrFieldRange: AppendRecord was given a field that does not fit its
	// place on the wire (a sequence number above 48 bits, a fragment
	// longer than 65535 bytes, a CID on a record type without one).
	ErrFieldRange = errors.New("dtls: record field out of range")
)

// HandshakeType is the msg_type of a handshake message, the first byte of
// every handshake fragment (RFC 6347 §4.2.2).
type HandshakeType uint8

// The handshake messages this package names.
const (
	HandshakeClientHello        HandshakeType = 1  // starts a session: the admission limits count it
	HandshakeServerHello        HandshakeType = 2  // a health probe's good answer
	HandshakeHelloVerifyRequest HandshakeType = 3  // a health probe's good answer, from a server with cookies
	HandshakeClientKeyExchange  HandshakeType = 16 // client_key_exchange
	HandshakeFinished           HandshakeType = 20 // finished
)

// Record is one parsed DTLS record. CID and Fragment are views into the
// buffer given to ParseRecord, valid only while that buffer is.
//
// A DTLS 1.3 ciphertext record (Unified set) has no content type and no
// version on the wire: Type and Version are 0, Epoch is the header's two
// epoch bits, Seq its 8 or 16 sequence-number bits, CID set when the C bit
// is.
type Record struct {
	Type    ContentType // TLS12CID records carry a CID; 0 when Unified is set
	Version uint16      // VersionDTLS12 or VersionDTLS10; 0 when Unified is set
	Epoch   uint16      // 0 for the plaintext handshake, then one per key change
	Seq     uint64      // 48 bits on the wire (8 or 16 in a unified header)
	CID     []byte      // nil unless Type is TLS12CID or Unified has the C bit
	// Fragment is the record's payload: plaintext in epoch 0, ciphertext
	// after (for TLS12CID it is the encrypted DTLSInnerPlaintext, for a
	// unified header DTLS 1.3's encrypted_record).
	Fragment []byte
	// Unified is the first octet of a DTLS 1.3 unified header (001CSLEE,
	// see IsUnified), 0 for a record with the DTLS 1.2 header.
	Unified byte
}

// ParseRecord parses the record at the start of b. A TLS12CID record carries
// a CID of cidLen bytes right after the sequence number, a DTLS 1.3 unified
// header with the C bit one right after its first octet. n is the number
// of bytes the record takes, so the next record starts at b[n:]; a unified
// header without length takes the rest of b. It does not allocate.
//
// cidLen is validated on every call, whether or not the record has a CID,
// so that a misconfigured length fails on the first datagram.
func ParseRecord(b []byte, cidLen int) (r Record, n int, err error) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen {
		return Record{}, 0, ErrCIDLength
	}
	return parseRecord(b, cidLen)
}

// parseRecord is ParseRecord without the cidLen check, which Classify does
// once per datagram.
func parseRecord(b []byte, cidLen int) (Record, int, error) {
	if len(b) == 0 {
		return Record{}, 0, ErrTooShort
	}
	if IsUnified(b[0]) {
		return parseUnified(b, cidLen)
	}
	t := ContentType(b[0])
	if !validType(t) {
		return Record{}, 0, ErrContentType
	}
	if len(b) < HeaderLen {
		return Record{}, 0, ErrTooShort
	}
	v := uint16(b[1])<<8 | uint16(b[2])
	if v != VersionDTLS12 && v != VersionDTLS10 {
		return Record{}, 0, ErrVersion
	}
	h := HeaderLen
	var cid []byte
	if t == TLS12CID {
		h += cidLen
		if len(b) < h {
			return Record{}, 0, ErrTruncated
		}
		cid = b[11 : h-2 : h-2]
	}
	l := int(b[h-2])<<8 | int(b[h-1])
	if l == 0 {
		return Record{}, 0, ErrEmptyRecord
	}
	if l > len(b)-h {
		return Record{}, 0, ErrTruncated
	}
	n := h + l
	return Record{
		Type:    t,
		Version: v,
		Epoch:   uint16(b[3])<<8 | uint16(b[4]),
		Seq: uint64(b[5])<<40 | uint64(b[6])<<32 | uint64(b[7])<<24 |
			uint64(b[8])<<16 | uint64(b[9])<<8 | uint64(b[10]),
		CID:      cid,
		Fragment: b[h:n:n],
	}, n, nil
}

// parseUnified is parseRecord for a DTLS 1.3 unified header. Its errors
// mirror the DTLS 1.2 header's: ErrTooShort when b cannot hold the header
// without CID, ErrTruncated when the CID or the declared length does not
// fit.
func parseUnified(b []byte, cidLen int) (Record, int, error) {
	f := b[0]
	h := unifiedHeaderLen(f)
	if len(b) < h {
		return Record{}, 0, ErrTooShort
	}
	s := 1 // the sequence number's offset
	var cid []byte
	if f&UnifiedCID != 0 {
		h += cidLen
		if len(b) < h {
			return Record{}, 0, ErrTruncated
		}
		s += cidLen
		cid = b[1:s:s]
	}
	seq := uint64(b[s])
	if f&UnifiedSeq16 != 0 {
		seq = seq<<8 | uint64(b[s+1])
	}
	l := len(b) - h
	if f&UnifiedLength != 0 {
		l = int(b[h-2])<<8 | int(b[h-1])
		if l > len(b)-h && l != 0 {
			return Record{}, 0, ErrTruncated
		}
	}
	if l == 0 {
		return Record{}, 0, ErrEmptyRecord
	}
	n := h + l
	return Record{Epoch: uint16(f & UnifiedEpoch), Seq: seq, CID: cid, Fragment: b[h:n:n], Unified: f}, n, nil
}

func validType(t ContentType) bool {
	return t >= ChangeCipherSpec && t <= ApplicationData || t == TLS12CID || t == ACK
}

// AppendRecord appends r as one record to dst: the header (with r.CID
// right after the sequence number when r.Type is TLS12CID) and
// r.Fragment, whose length the header takes. A zero Version means
// VersionDTLS12. It is ParseRecord's inverse, for tests, load generators
// and anything else that writes records; it does not encrypt. Errors:
// ErrContentType, ErrVersion, ErrEmptyRecord, ErrCIDLength (a TLS12CID
// record without a CID of MinCIDLen..MaxCIDLen bytes) and ErrFieldRange;
// dst then comes back unchanged. It does not allocate when dst has room.
//
// A record with Unified set is written with that unified header: r.CID
// when its C bit is set, r.Seq in 8 or 16 bits (S), the length when L is
// set. Type and Version must be 0 and Epoch the header's epoch bits. A
// record without L runs to the end of the datagram: append nothing after
// it.
func AppendRecord(dst []byte, r Record) ([]byte, error) {
	if r.Unified != 0 {
		return appendUnified(dst, r)
	}
	if r.Version == 0 {
		r.Version = VersionDTLS12
	}
	switch {
	case !validType(r.Type):
		return dst, ErrContentType
	case r.Version != VersionDTLS12 && r.Version != VersionDTLS10:
		return dst, ErrVersion
	case len(r.Fragment) == 0:
		return dst, ErrEmptyRecord
	case r.Type == TLS12CID && (len(r.CID) < MinCIDLen || len(r.CID) > MaxCIDLen):
		return dst, ErrCIDLength
	case r.Type != TLS12CID && len(r.CID) != 0:
		return dst, fmt.Errorf("%w: a CID on a %v record", ErrFieldRange, r.Type)
	case r.Seq >= 1<<48:
		return dst, fmt.Errorf("%w: sequence number %d above 48 bits", ErrFieldRange, r.Seq)
	case len(r.Fragment) > 0xffff:
		return dst, fmt.Errorf("%w: fragment of %d bytes", ErrFieldRange, len(r.Fragment))
	}
	dst = append(dst, byte(r.Type), byte(r.Version>>8), byte(r.Version), byte(r.Epoch>>8), byte(r.Epoch),
		byte(r.Seq>>40), byte(r.Seq>>32), byte(r.Seq>>24), byte(r.Seq>>16), byte(r.Seq>>8), byte(r.Seq))
	dst = append(dst, r.CID...)
	dst = append(dst, byte(len(r.Fragment)>>8), byte(len(r.Fragment)))
	return append(dst, r.Fragment...), nil
}

// appendUnified is AppendRecord for a DTLS 1.3 unified header.
func appendUnified(dst []byte, r Record) ([]byte, error) {
	f := r.Unified
	seqBits := 8
	if f&UnifiedSeq16 != 0 {
		seqBits = 16
	}
	switch {
	case !IsUnified(f):
		return dst, fmt.Errorf("%w: unified header %#02x is not 001CSLEE", ErrFieldRange, f)
	case r.Type != 0 || r.Version != 0:
		return dst, fmt.Errorf("%w: a type or version on a unified header", ErrFieldRange)
	case len(r.Fragment) == 0:
		return dst, ErrEmptyRecord
	case f&UnifiedCID != 0 && (len(r.CID) < MinCIDLen || len(r.CID) > MaxCIDLen):
		return dst, ErrCIDLength
	case f&UnifiedCID == 0 && len(r.CID) != 0:
		return dst, fmt.Errorf("%w: a CID on a unified header without the C bit", ErrFieldRange)
	case r.Epoch != uint16(f&UnifiedEpoch):
		return dst, fmt.Errorf("%w: epoch %d on a unified header with epoch bits %d", ErrFieldRange, r.Epoch, f&UnifiedEpoch)
	case r.Seq >= 1<<seqBits:
		return dst, fmt.Errorf("%w: sequence number %d above %d bits", ErrFieldRange, r.Seq, seqBits)
	case len(r.Fragment) > 0xffff:
		return dst, fmt.Errorf("%w: fragment of %d bytes", ErrFieldRange, len(r.Fragment))
	}
	dst = append(dst, f)
	dst = append(dst, r.CID...)
	if seqBits == 16 {
		dst = append(dst, byte(r.Seq>>8))
	}
	dst = append(dst, byte(r.Seq))
	if f&UnifiedLength != 0 {
		dst = append(dst, byte(len(r.Fragment)>>8), byte(len(r.Fragment)))
	}
	return append(dst, r.Fragment...), nil
}

// AppendHandshake appends an unfragmented handshake message to dst, as it
// goes into a Handshake record's fragment: msg_type, the 24-bit length,
// message_seq, fragment_offset 0 and fragment_length = length, then body
// (RFC 6347 §4.2.2). body must be shorter than 2^24 bytes. It does not
// allocate when dst has room.
func AppendHandshake(dst []byte, t HandshakeType, messageSeq uint16, body []byte) []byte {
	n := len(body)
	dst = append(dst, byte(t), byte(n>>16), byte(n>>8), byte(n), byte(messageSeq>>8), byte(messageSeq),
		0, 0, 0, byte(n>>16), byte(n>>8), byte(n))
	return append(dst, body...)
}
