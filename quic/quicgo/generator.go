package quicgo

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	cidquic "github.com/cidroute/cidroute/quic"
)

// Codec is the part of cidroute.CIDCodec that a Generator uses; every
// cidroute.CIDCodec satisfies it. It is declared here so that a quic-go
// backend importing this package does not compile the proxy's Pipeline.
type Codec interface {
	Len() int
	AppendCID(dst []byte, ordinal uint8) ([]byte, error)
	Ordinal(cid []byte) (ordinal uint8, ok bool)
}

var (
	_ Codec = cidquic.LB{}
	_ Codec = (*cidquic.LBEncrypted)(nil)
)

// ErrCodec is returned when a codec cannot serve as a quic-go CID generator.
var ErrCodec = errors.New("quicgo: unusable CID codec")

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
// octets). It checks that the codec's length fits QUIC (1..20), that the
// ordinal is not the reserved 255, and that a trial CID has the codec's
// length and decodes back to the ordinal.
func NewGenerator(codec Codec, ordinal uint8) (*Generator, error) {
	if codec == nil {
		codec = cidquic.LB{}
	}
	if ordinal == 255 {
		return nil, fmt.Errorf("%w: ordinal 255 is reserved", ErrCodec)
	}
	n := codec.Len()
	if n < 1 || n > cidquic.MaxCIDLen {
		return nil, fmt.Errorf("%w: length %d outside 1..%d", ErrCodec, n, cidquic.MaxCIDLen)
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
