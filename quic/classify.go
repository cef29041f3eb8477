package quic

import "bytes"

// Kind says how a datagram is routed.
type Kind uint8

const (
	// KindNew: the first packet is an Initial or 0-RTT packet (or a long
	// header of a version this package does not know). Route it to the
	// backend its DCID names when the DCID is a server CID that decodes to
	// a serving ordinal, else by hashing the DCID, which every Initial and
	// 0-RTT packet of one connection attempt shares.
	KindNew Kind = iota + 1
	// KindEstablished: the first packet is a short header or Handshake
	// packet, whose DCID the server chose: route by the ordinal in it.
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

// Class is what Classify found in a datagram. DCID is a view into the
// datagram, valid only while its buffer is.
type Class struct {
	Kind    Kind       // how to route the datagram: by hashing or by CID
	Type    PacketType // type of the first packet
	DCID    []byte     // DCID of the first packet, shared by all packets
	Version uint32     // version of the first packet; 0 for a short header
	Initial bool       // some packet of the datagram is an Initial packet
	ZeroRTT bool       // some packet of the datagram is a 0-RTT packet
	Packets int        // packets walked, padding not counted
	Padding int        // trailing zero bytes after the last packet
}

// StartsHandshake reports whether the datagram opens a connection attempt
// at a server, wherever the packet sits in the coalesced walk: an Initial
// packet, or a long header of a version this package does not know (the
// server answers it with Version Negotiation, RFC 9000 §6.1).
func (c Class) StartsHandshake() bool { return c.Initial || c.Type == UnknownVersion }

// StartsSession reports whether the datagram carries anything that opens
// a session at a server: StartsHandshake, or a 0-RTT packet (early data a
// server accepts before the handshake completes). This is the one
// definition that a proxy's admission limits and a backend's
// direct-datagram policy share.
//
// Mixed datagrams: RFC 9000 §12.2 only recommends coalescing in order of
// increasing encryption level and tells receivers to process every packet
// of a datagram on its own, so a Handshake packet followed by an Initial
// or 0-RTT packet of the same DCID is valid; the server acts on the later
// packets too, so they count here whatever the first packet is.
func (c Class) StartsSession() bool { return c.StartsHandshake() || c.ZeroRTT }

// StartsSession reports whether datagram b, from a client of a server
// whose CIDs are serverCIDLen bytes long, opens a session: Classify
// accepts it and Class.StartsSession says so. A datagram Classify rejects
// still counts when a packet that parses before the fault is an Initial or
// 0-RTT packet (or names an unknown version): a server processes the
// packets of a datagram one by one (RFC 9000 §12.2) and may act on it. It
// does not allocate.
func StartsSession(b []byte, serverCIDLen int) bool {
	c, err := Classify(b, serverCIDLen)
	if err == nil {
		return c.StartsSession()
	}
	for off := 0; off < len(b); {
		typ, _, _, n, err := scan(b[off:], serverCIDLen)
		if err != nil {
			return false
		}
		if typ == Initial || typ == ZeroRTT || typ == UnknownVersion {
			return true
		}
		off += n
	}
	return false
}

// Classify walks the coalesced packets of a client datagram (RFC 9000
// §12.2) and says how to route it. Short header DCIDs are serverCIDLen
// bytes long. The first packet decides the kind (RFC 9000 §12.2 lets a
// receiver route by it); every later packet must carry the same DCID, and
// Initial and ZeroRTT report packets anywhere in the walk. A long header of an unknown version is parsed by the
// invariants only and is classified KindNew with its DCID: the backend
// answers it with Version Negotiation.
//
// Bytes after the last long-header packet that are all zero are taken as
// padding, not as a packet: some clients pad Initial datagrams that way
// beyond the packet, and servers ignore them. Any other trailing bytes must
// form a valid packet with the same DCID.
//
// Errors: ErrServerOnly for Version Negotiation and Retry, ErrDCIDMismatch,
// ErrInitialSize for a v1/v2 Initial in a datagram under 1200 bytes, and the
// errors of ParseHeader. On error the Class is zero.
//
// Classify does not allocate.
func Classify(b []byte, serverCIDLen int) (Class, error) {
	if len(b) > 0 && !IsLong(b[0]) {
		// Most datagrams: one short header packet. Same checks as
		// ParseHeader, without building a Header.
		if uint(serverCIDLen) > MaxCIDLen {
			return Class{}, ErrCIDLength
		}
		if len(b) < 1+serverCIDLen+20 {
			return Class{}, ErrTooShort
		}
		return Class{Kind: KindEstablished, Type: Short, DCID: b[1 : 1+serverCIDLen], Packets: 1}, nil
	}
	typ, version, dcid, n, err := scan(b, serverCIDLen)
	if err != nil {
		return Class{}, err
	}
	c := Class{Type: typ, DCID: dcid, Version: version}
	switch typ {
	case Initial, ZeroRTT, UnknownVersion:
		c.Kind = KindNew
	case Handshake, Short:
		c.Kind = KindEstablished
	default:
		return Class{}, ErrServerOnly
	}
	off := 0
	for {
		c.Packets++
		switch typ {
		case Initial:
			c.Initial = true
		case ZeroRTT:
			c.ZeroRTT = true
		case Retry, VersionNegotiation:
			return Class{}, ErrServerOnly
		}
		off += n
		if off >= len(b) {
			break
		}
		rest := b[off:]
		if allZero(rest) {
			c.Padding = len(rest)
			break
		}
		if typ, _, dcid, n, err = scan(rest, serverCIDLen); err != nil {
			return Class{}, err
		}
		if !bytes.Equal(dcid, c.DCID) {
			return Class{}, ErrDCIDMismatch
		}
	}
	if c.Initial && len(b) < MinInitialDatagram {
		return Class{}, ErrInitialSize
	}
	return c, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
