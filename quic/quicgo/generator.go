package quicgo

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute/dtls"
	cidquic "github.com/cidroute/cidroute/quic"
)

// Codec is the part of cidroute.CIDCodec that a Generator uses; every
// cidroute.CIDCodec satisfies it. It is declared here so that a quic-go
// backend importing this package does not compile the proxy's Pipeline.
type Codec interface {
	// Len is the length of the CIDs the codec writes.
	Len() int
	// AppendCID appends a fresh CID that carries ordinal.
	AppendCID(dst []byte, ordinal uint8) ([]byte, error)
	// Ordinal reads the ordinal back; ok is false when cid carries none.
	Ordinal(cid []byte) (ordinal uint8, ok bool)
}

var (
	_ Codec = cidquic.LB{}
	_ Codec = (*cidquic.LBEncrypted)(nil)
)

// ErrCodec is returned when a codec cannot serve as a quic-go CID
// generator: its CIDs do not fit QUIC, a client's random DCID can pass for
// them (quic.ErrServerCIDLen, wrapped too), or they do not decode back.
var ErrCodec = errors.New("quicgo: unusable CID codec")

// ErrReservedOrdinal is returned by NewGenerator for ordinal 255, which no
// backend may have. It is quic.ErrReservedOrdinal.
var ErrReservedOrdinal = cidquic.ErrReservedOrdinal

// Generator issues connection IDs that carry one backend's ordinal. It is
// safe for concurrent use if its codec is (built-in codecs are).
//
// With the encrypted QUIC-LB codec (*quic.LBEncrypted) the ordinal is
// hidden from observers, and a key rotation needs no new Generator: after
// the codec's SetKeys switches the active configuration, every new CID,
// including the NEW_CONNECTION_ID CIDs of running connections, uses it,
// while CIDs issued before stay valid as long as the proxies keep the old
// configuration.
type Generator struct {
	codec   Codec
	ordinal uint8
	n       int
}

var _ quic.ConnectionIDGenerator = (*Generator)(nil)

// NewGenerator returns a Generator for the backend with the given ordinal.
// A nil codec means the QUIC default, quic.LB{} (QUIC-LB plaintext, 12
// octets). The ordinal must not be the reserved 255 (ErrReservedOrdinal).
// The codec (else ErrCodec) must have a length a QUIC proxy routes by, as
// cidroute.NewRouter requires (quic.CheckServerCIDLen: 1..20 but not 8,
// and the ordinal-first codec only below 8), and a trial CID must have
// that length and decode back to the ordinal.
func NewGenerator(codec Codec, ordinal uint8) (*Generator, error) {
	if codec == nil {
		codec = cidquic.LB{}
	}
	if ordinal == 255 {
		return nil, fmt.Errorf("quicgo: generator for ordinal 255: %w", ErrReservedOrdinal)
	}
	n := codec.Len()
	if err := cidquic.CheckServerCIDLen(n); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCodec, err)
	}
	if _, ok := codec.(dtls.OrdinalFirst); ok && n >= cidquic.MinInitialDCIDLen {
		return nil, fmt.Errorf("%w: the ordinal-first codec of %d octets: it decodes nearly every client DCID of that length (use QUIC-LB, or fewer than %d octets): %w",
			ErrCodec, n, cidquic.MinInitialDCIDLen, cidquic.ErrServerCIDLen)
	}
	var buf [cidquic.MaxCIDLen]byte
	cid, err := codec.AppendCID(buf[:0], ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCodec, err)
	}
	if len(cid) != n {
		return nil, fmt.Errorf("%w: AppendCID wrote %d bytes, Len is %d", ErrCodec, len(cid), n)
	}
	if got, ok := codec.Ordinal(cid); !ok || got != ordinal {
		return nil, fmt.Errorf("%w: trial CID %x decodes to %d (ok=%v), want %d", ErrCodec, cid, got, ok, ordinal)
	}
	return &Generator{codec: codec, ordinal: ordinal, n: n}, nil
}

// GenerateConnectionID returns a fresh CID carrying the ordinal.
func (g *Generator) GenerateConnectionID() (quic.ConnectionID, error) {
	var buf [cidquic.MaxCIDLen]byte
	cid, err := g.codec.AppendCID(buf[:0], g.ordinal)
	if err != nil {
		return quic.ConnectionID{}, err
	}
	if len(cid) != g.n {
		return quic.ConnectionID{}, fmt.Errorf("%w: AppendCID wrote %d bytes, Len is %d", ErrCodec, len(cid), g.n)
	}
	return quic.ConnectionIDFromBytes(cid), nil
}

// ConnectionIDLen returns the codec's fixed CID length.
func (g *Generator) ConnectionIDLen() int { return g.n }

// Ordinal returns the ordinal the Generator writes.
func (g *Generator) Ordinal() uint8 { return g.ordinal }
