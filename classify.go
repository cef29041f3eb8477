package cidroute

import (
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

// Kind is what a classifier says about how a datagram is routed.
type Kind uint8

const (
	// KindNew: no connection ID the server chose is known to be in the
	// datagram. Route it by hashing (a DTLS ClientHello, a QUIC Initial or
	// 0-RTT packet), unless ID is a server CID that decodes to a serving
	// ordinal.
	KindNew Kind = iota + 1
	// KindEstablished: the datagram carries a CID the server chose (a DTLS
	// tls12_cid record or DTLS 1.3 unified header with a CID, a QUIC short
	// header or Handshake packet). Route it by the ordinal in ID, never by
	// hashing.
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

// A Class is a classifier's verdict on one datagram. ID is a view into the
// datagram and valid only while its buffer is.
type Class struct {
	// Kind says how to route the datagram: by hashing or by its CID.
	Kind Kind
	// ID is the connection ID to route by: the CID of an established
	// session, or for KindNew the QUIC DCID (decoded when it has the
	// server CID length, else hashed). nil for a DTLS KindNew datagram,
	// which is hashed by client and service address.
	ID []byte
	// Handshake marks a datagram that starts a new handshake anywhere in
	// it (a DTLS ClientHello in any record, a QUIC Initial in any coalesced
	// packet), whatever its Kind: it counts against the handshake limit.
	Handshake bool
	// ZeroRTT marks a datagram that carries QUIC 0-RTT data in any packet:
	// it counts against the 0-RTT limit. Together, Handshake and ZeroRTT
	// are what dtls.StartsSession and quic.StartsSession define.
	ZeroRTT bool
}

// A Classifier reads a datagram's routing class. It must not allocate or
// retain b, and must be safe for concurrent use. An error means the
// datagram is malformed and is dropped, except ErrDTLS13NoCID, which
// drops it as DTLS13NoCID.
type Classifier interface {
	// Classify returns b's class, or an error when b is malformed.
	Classify(b []byte) (Class, error)
}

// ClassifierFunc adapts a function to a Classifier.
type ClassifierFunc func(b []byte) (Class, error)

// Classify calls f(b).
func (f ClassifierFunc) Classify(b []byte) (Class, error) { return f(b) }

// DTLSClassifier classifies DTLS datagrams whose CID records carry CIDs
// of CIDLen bytes: DTLS 1.2 tls12_cid records (RFC 9146) and DTLS 1.3
// unified headers with the C bit (RFC 9147), which route alike.
type DTLSClassifier struct {
	CIDLen int // the server CID length: tls12_cid records and unified headers carry no length
	// RequireDTLS13CID rejects with ErrDTLS13NoCID a datagram with DTLS
	// 1.3 ciphertext records none of which carries a CID, unless it opens
	// a session (its ClientHello's 0-RTT records cannot carry the CID the
	// server has not yet given). Without it such a datagram is new, hashed
	// by client address like DTLS 1.2 records of a session without CIDs.
	RequireDTLS13CID bool
}

// Classify implements Classifier with dtls.Classify.
func (c DTLSClassifier) Classify(b []byte) (Class, error) {
	var cl Class
	err := classifyDTLS(b, c.CIDLen, c.RequireDTLS13CID, &cl)
	return cl, err
}

// QUICClassifier classifies QUIC datagrams whose server CIDs are CIDLen
// bytes long.
type QUICClassifier struct {
	CIDLen int // the server CID length: short headers carry no length
}

// Classify implements Classifier with quic.Classify.
func (c QUICClassifier) Classify(b []byte) (Class, error) {
	var cl Class
	err := classifyQUIC(b, c.CIDLen, &cl)
	return cl, err
}

// classifyDTLS and classifyQUIC fill *c in place: the Router calls them
// directly, since a Class returned by value through an interface costs as
// much as the parse.
func classifyDTLS(b []byte, cidLen int, requireCID13 bool, c *Class) error {
	d, err := dtls.Classify(b, cidLen)
	if err != nil {
		return err
	}
	if requireCID13 && d.Kind == dtls.KindNew && d.Unified && !d.ClientHello {
		return ErrDTLS13NoCID
	}
	// Field by field: a composite literal is built aside and copied.
	c.Kind, c.ID, c.Handshake, c.ZeroRTT = KindNew, nil, d.StartsSession(), false
	if d.Kind == dtls.KindEstablished {
		c.Kind, c.ID = KindEstablished, d.CID
	}
	return nil
}

func classifyQUIC(b []byte, cidLen int, c *Class) error {
	q, err := quic.Classify(b, cidLen)
	if err != nil {
		return err
	}
	if q.Type == quic.UnknownVersion && len(b) < quic.MinInitialDatagram {
		// A version the proxy does not know starts a handshake the backend
		// answers with Version Negotiation, which servers send only for
		// datagrams that could carry an Initial (RFC 9000 §6.1, §14.1).
		return quic.ErrInitialSize
	}
	c.Kind, c.ID, c.Handshake, c.ZeroRTT = KindNew, q.DCID, q.StartsHandshake(), q.ZeroRTT
	if q.Kind == quic.KindEstablished {
		c.Kind = KindEstablished
	}
	return nil
}

var (
	_ Classifier = DTLSClassifier{}
	_ Classifier = QUICClassifier{}
	_ Classifier = ClassifierFunc(nil)
	_ CIDCodec   = dtls.OrdinalFirst{}
	_ CIDCodec   = quic.LB{}
)
