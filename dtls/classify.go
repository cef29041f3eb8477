package dtls

// Kind is the routing class of a datagram.
type Kind uint8

const (
	// KindInvalid is the zero Kind, returned with every error, so that a
	// Class whose error was ignored never reads as a new handshake.
	KindInvalid Kind = iota
	// KindNew: no record has a CID (a ClientHello, other handshake or
	// alert records, or a session without CIDs). Route by hashing.
	KindNew
	// KindEstablished: at least one tls12_cid record. Route by its CID.
	KindEstablished
)

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
	Kind Kind
	// CID is the CID of the first tls12_cid record, a view into the
	// datagram, valid only while it is (KindEstablished only). Later CID
	// records are validated as records but their CIDs are not compared: a
	// peer sends one connection's records per datagram.
	CID []byte
	// ClientHello reports that the first record is an epoch-0 handshake
	// record whose fragment starts with msg_type client_hello (1). It
	// describes the first record whatever the Kind, and is set for every
	// fragment of a fragmented ClientHello, since each one is a piece of a
	// new handshake.
	ClientHello bool
	// Records is the number of records walked. With an error it is the
	// number of valid records before the one that failed, which is the
	// failing record's index.
	Records int
}

// Classify walks every record of the datagram b and reports its routing
// class. cidLen is the service's configured CID length (MinCIDLen to
// MaxCIDLen). It fails when any record is malformed, when bytes follow the
// last whole record, or on a DTLS 1.3 unified header; a datagram with a
// broken record is never reported as new, even if an earlier record was a
// valid ClientHello. It does not allocate.
func Classify(b []byte, cidLen int) (Class, error) {
	if cidLen < MinCIDLen || cidLen > MaxCIDLen {
		return Class{}, ErrCIDLength
	}
	if len(b) == 0 {
		return Class{}, ErrTooShort
	}
	// The same checks as parseRecord, without building a Record; on any
	// failure parseRecord runs again to pick the error, so that both always
	// agree (FuzzClassify checks it).
	first := b
	var cid []byte
	records := 0
	for len(b) > 0 {
		if len(b) < HeaderLen || (uint16(b[1])<<8|uint16(b[2]))|2 != VersionDTLS10 { // fe fd or fe ff
			return classifyError(b, cidLen, records)
		}
		h := HeaderLen
		switch t := ContentType(b[0]); {
		case t == TLS12CID:
			h += cidLen
			if len(b) < h {
				return classifyError(b, cidLen, records)
			}
			if cid == nil {
				cid = b[11 : h-2 : h-2]
			}
		case t < ChangeCipherSpec || t > ApplicationData:
			return classifyError(b, cidLen, records)
		}
		lb := b[h-2 : h]
		l := int(lb[0])<<8 | int(lb[1])
		if l == 0 || l > len(b)-h {
			return classifyError(b, cidLen, records)
		}
		records++
		b = b[h+l:]
	}
	// The first record is a whole one: as a handshake record it has a
	// 13-byte header and at least one fragment byte, the msg_type.
	clientHello := len(first) > HeaderLen && first[0] == byte(Handshake) && first[3]|first[4] == 0 && first[HeaderLen] == 1
	if cid == nil {
		return Class{Kind: KindNew, ClientHello: clientHello, Records: records}, nil
	}
	return Class{Kind: KindEstablished, CID: cid, ClientHello: clientHello, Records: records}, nil
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
