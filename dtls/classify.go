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
	// datagram (KindEstablished only). Later CID records are validated as
	// records but their CIDs are not compared: a peer sends one
	// connection's records per datagram.
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
	var c Class
	for len(b) > 0 {
		r, n, err := parseRecord(b, cidLen)
		if err != nil {
			if err == ErrTooShort && c.Records > 0 {
				err = ErrTruncated // trailing bytes after a whole record
			}
			return Class{Records: c.Records}, err
		}
		if c.Records == 0 {
			c.ClientHello = r.Type == Handshake && r.Epoch == 0 && r.Fragment[0] == 1
		}
		if r.Type == TLS12CID && c.CID == nil {
			c.CID = r.CID
		}
		c.Records++
		b = b[n:]
	}
	switch {
	case c.Records == 0:
		return Class{}, ErrTooShort
	case c.CID != nil:
		c.Kind = KindEstablished
	default:
		c.Kind = KindNew
	}
	return c, nil
}
