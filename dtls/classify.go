package dtls

import "bytes"

// Kind is the routing class of a datagram.
type Kind uint8

const (
	// KindInvalid is the zero Kind, returned with every error, so that a
	// Class whose error was ignored never reads as a new handshake.
	KindInvalid Kind = iota
	// KindNew: no record has a CID (a ClientHello, other handshake or
	// alert records, or a session without CIDs). Route by hashing.
	KindNew
	// KindEstablished: at least one tls12_cid record, or DTLS 1.3 record
	// whose unified header has the C bit. Route by its CID.
	KindEstablished
)

// String returns "new", "established", or "invalid" for any other value.
func (k Kind) String() string {
	switch k {
	case KindNew:
		return "new"
	case KindEstablished:
		return "established"
	}
	return "invalid"
}

// Class is what Classify found in a datagram.
type Class struct {
	// Kind says how to route the datagram: by hashing or by CID.
	Kind Kind
	// CID is the CID of the first record that carries one (tls12_cid, or
	// a unified header with the C bit), a view into the datagram, valid
	// only while it is (KindEstablished only). Later CID records are
	// validated as records but their CIDs are not compared: a peer sends
	// one connection's records per datagram (RFC 9147 §4 tells a receiver
	// to discard the rest of a datagram whose CIDs differ).
	CID []byte
	// ClientHello reports that some record of the datagram is an epoch-0
	// handshake record whose fragment starts with msg_type client_hello
	// (1), whatever the Kind: a ClientHello behind or before a tls12_cid
	// record still opens a session at the server. It is set for every
	// fragment of a fragmented ClientHello, since each one is a piece of a
	// new handshake. See StartsSession.
	ClientHello bool
	// Records is the number of records walked. With an error it is the
	// number of valid records before the one that failed, which is the
	// failing record's index.
	Records int
	// Unified reports that some record has a DTLS 1.3 unified header (an
	// encrypted DTLS 1.3 record), with or without a CID.
	Unified bool
}

// StartsSession reports whether the datagram opens a session at a server:
// it carries a ClientHello (see Class.ClientHello), wherever it sits among
// the records. This is the one definition that a proxy's admission limits
// and a backend's direct-datagram policy share.
func (c Class) StartsSession() bool { return c.ClientHello }

// StartsSession reports whether datagram b, from a client of a service
// whose CIDs are cidLen bytes long, opens a session at a server: Classify
// accepts it and the Class says so. A datagram Classify rejects starts
// nothing: DTLS stacks (pion's among them) drop a datagram with a broken
// record whole. It does not allocate.
func StartsSession(b []byte, cidLen int) bool {
	c, err := Classify(b, cidLen)
	return err == nil && c.StartsSession()
}

// HelloSeq returns the message_seq of the first ClientHello fragment in
// datagram b whose 12-octet handshake header is whole; ok is false when b
// has none or a record of b is malformed. A handshake's first ClientHello
// is message 0, and the one that answers a HelloVerifyRequest with its
// cookie is message 1 (RFC 6347 §4.2.2). So a server that has no handshake
// with the client and gets a later one knows the handshake began at
// another server, which holds its state: behind a proxy tier, its cookie
// exchange straddled a change of the backends (see docs/design.md). It is
// for the path that opens a session, not the per-datagram one: it walks
// the records again. It does not allocate.
func HelloSeq(b []byte, cidLen int) (seq uint16, ok bool) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen || len(b) == 0 {
		return 0, false
	}
	for len(b) > 0 {
		r, n, err := parseRecord(b, cidLen)
		if err != nil {
			return 0, false
		}
		if f := r.Fragment; !ok && r.Type == Handshake && r.Epoch == 0 && len(f) >= 12 && f[0] == byte(HandshakeClientHello) {
			seq, ok = uint16(f[4])<<8|uint16(f[5]), true
		}
		b = b[n:]
	}
	return seq, ok
}

// isClientHello reports whether a whole record with the DTLS 1.2 header
// (of h bytes, at least one fragment byte) is an epoch-0 handshake record
// whose fragment starts a ClientHello.
func isClientHello(rec []byte, h int) bool {
	return rec[0] == byte(Handshake) && rec[3]|rec[4] == 0 && rec[h] == byte(HandshakeClientHello)
}

// classifyError returns the error of the record at the start of b, which
// follows records valid ones.
func classifyError(b []byte, cidLen, records int) (Class, error) {
	_, _, err := parseRecord(b, cidLen)
	if err == ErrTooShort && records > 0 {
		err = ErrTruncated // trailing bytes after a whole record
	}
	return Class{Records: records}, err
}

// MismatchedCID reports whether b, a datagram that Classify rejects with
// cidLen, is well-formed DTLS under another CID length: the walk fails at
// a record with a CID (tls12_cid, or a unified header with the C and L
// bits) that no other CID record precedes, and the datagram classifies
// from there with some length n ≠ cidLen (the shortest n from MinCIDLen
// up). cid is then that record's CID, n bytes, a view into b. The CID
// length is not on the wire, so this is the closest a proxy can come to
// telling a server that issues CIDs of another length apart from a broken
// datagram; a corrupt record that happens to parse under another length
// is reported too (17 of 10,000 random tls12_cid records in the
// package's test, 21 of 10,000 unified headers). A unified header without
// L says nothing of its CID's length: see ShortCID. It is for the drop
// path: it costs up to MaxCIDLen header checks where Classify costs one
// walk. It does not allocate.
func MismatchedCID(b []byte, cidLen int) (cid []byte, ok bool) {
	rest, ok := firstCIDRecord(b, cidLen)
	if !ok || IsUnified(rest[0]) && rest[0]&UnifiedLength == 0 {
		return nil, false
	}
	hl := HeaderLen // the header without its CID
	if IsUnified(rest[0]) {
		hl = unifiedHeaderLen(rest[0])
	}
	for n := MinCIDLen; n <= MaxCIDLen && hl+n <= len(rest); n++ {
		if _, _, err := parseRecord(rest, n); n == cidLen || err != nil {
			continue // the first record does not fit: no need to walk
		}
		// A DTLS 1.2 flight holds no DTLS 1.3 records, and a DTLS 1.3
		// peer that uses CIDs puts its one CID on every ciphertext record
		// (RFC 9147 §4, §9): without these, a random byte that starts a
		// unified header without length would make the rest of a random
		// datagram a record.
		c, err := Classify(rest, n)
		if err == nil && (!c.Unified || IsUnified(rest[0]) && oneCID(rest, c.CID)) {
			return c.CID, true
		}
	}
	return nil, false
}

// oneCID reports whether every unified header of datagram b, which
// classifies with len(cid), carries cid.
func oneCID(b, cid []byte) bool {
	for len(b) > 0 {
		r, n, err := parseRecord(b, len(cid))
		if err != nil || r.Unified != 0 && !bytes.Equal(r.CID, cid) {
			return false
		}
		b = b[n:]
	}
	return true
}

// ShortCID reports whether b, a datagram that Classify rejects with
// cidLen, fails only at its last record, a DTLS 1.3 unified header with
// the C bit and without L, that is too short for a CID of cidLen bytes
// and the 16 bytes of ciphertext RFC 9147 §4.2.3 requires, but holds them
// with a shorter CID: well-formed DTLS 1.3 from a peer whose CIDs are
// shorter than the service's, by how much the record cannot tell. As for
// MismatchedCID, no CID record may precede it. It is for the drop path.
// It does not allocate.
func ShortCID(b []byte, cidLen int) bool {
	rest, ok := firstCIDRecord(b, cidLen)
	if !ok || !IsUnified(rest[0]) || rest[0]&UnifiedLength != 0 {
		return false
	}
	h := unifiedHeaderLen(rest[0])
	return len(rest) < h+cidLen+minCiphertext13 && len(rest) >= h+MinCIDLen+minCiphertext13
}

// minCiphertext13 is the shortest DTLS 1.3 encrypted_record: record
// number encryption samples 16 bytes of it (RFC 9147 §4.2.3).
const minCiphertext13 = 16

// minCiphertext is the shortest fragment of a tls12_cid record: the
// 8-octet explicit nonce and 8-octet tag of AES-CCM-8, the least any
// suite adds (GCM 24, ChaCha20-Poly1305 16, CBC with its MAC more).
const minCiphertext = 16

// firstCIDRecord returns, for a datagram b that Classify rejects with
// cidLen, the rest of b from its first record with a CID when the walk
// fails there: the records before it are valid and carry no CID.
func firstCIDRecord(b []byte, cidLen int) (rest []byte, ok bool) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen {
		return nil, false
	}
	if _, err := Classify(b, cidLen); err == nil {
		return nil, false // the drop path asks; a datagram that routes is no mismatch
	}
	off := 0
	for off < len(b) && !hasCID(b[off]) {
		_, n, err := parseRecord(b[off:], cidLen)
		if err != nil {
			return nil, false // broken before any CID record
		}
		off += n
	}
	if off >= len(b) {
		return nil, false
	}
	// A CID record that fits with cidLen rules the mismatch out, unless
	// what fits is too short to be a ciphertext: a CID shorter than
	// cidLen makes the first two octets of the explicit nonce (the epoch,
	// in pion and Mbed TLS) read as the length.
	if r, _, err := parseRecord(b[off:], cidLen); err == nil && (r.Unified != 0 || len(r.Fragment) >= minCiphertext) {
		return nil, false // the CID record fits: the fault is elsewhere
	}
	return b[off:], true
}

// hasCID reports whether a record that starts with b0 carries a CID: a
// tls12_cid record, or a unified header with the C bit.
func hasCID(b0 byte) bool {
	return ContentType(b0) == TLS12CID || IsUnified(b0) && b0&UnifiedCID != 0
}
