package cidroute

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// Datagram builders for the routing tests. The dtls and quic packages test
// their parsers against captured datagrams; here the shapes only need to be
// valid enough to classify.

// dtlsCIDRecord is a tls12_cid record (RFC 9146) carrying cid.
func dtlsCIDRecord(cid []byte, seq uint64, payload []byte) []byte {
	b := []byte{25, 0xfe, 0xfd, 0, 1}
	b = append(b, byte(seq>>40), byte(seq>>32), byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq))
	b = append(b, cid...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	return append(b, payload...)
}

// dtlsClientHello is an epoch-0 handshake record starting a ClientHello,
// with the record version OpenSSL uses for its first flight.
func dtlsClientHello(random byte) []byte {
	body := make([]byte, 60)
	body[0] = random
	hs := []byte{1, 0, 0, byte(len(body)), 0, 0, 0, 0, 0, 0, 0, byte(len(body))}
	hs = append(hs, body...)
	b := []byte{22, 0xfe, 0xff, 0, 0, 0, 0, 0, 0, 0, 0}
	b = binary.BigEndian.AppendUint16(b, uint16(len(hs)))
	return append(b, hs...)
}

// quicShort is a 1-RTT packet to dcid.
func quicShort(dcid []byte) []byte {
	b := append([]byte{0x40}, dcid...)
	return append(b, make([]byte, 40)...)
}

// quicLong is a v1 long-header packet of type t (0 Initial, 1 0-RTT,
// 2 Handshake), padded with zeros to pad bytes when t is Initial.
func quicLong(t byte, dcid, scid []byte, pad int) []byte {
	b := []byte{0xc0 | t<<4}
	b = binary.BigEndian.AppendUint32(b, quic.Version1)
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	if t == 0 {
		b = append(b, 0) // token length
	}
	payload := 64
	if len(b)+2+payload < pad {
		payload = pad - len(b) - 2
	}
	b = binary.BigEndian.AppendUint16(b, 0x4000|uint16(payload))
	return append(b, make([]byte, payload)...)
}

func ordinalCID(t testing.TB, c CIDCodec, ord uint8) []byte {
	t.Helper()
	cid, err := c.AppendCID(nil, ord)
	require.NoError(t, err)
	return cid
}

func newRegistry(t testing.TB, seed uint64, bs ...registry.Backend) *registry.Registry {
	t.Helper()
	r, err := registry.New(registry.Config{Service: "test", Seed: seed})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	if len(bs) > 0 { // a new registry is empty; Update refuses an empty list
		require.NoError(t, r.Update(bs))
	}
	return r
}

func backend(ord uint8, addr string, st registry.State) registry.Backend {
	return registry.Backend{Ordinal: ord, Addr: netip.MustParseAddrPort(addr), Weight: 1, State: st}
}
