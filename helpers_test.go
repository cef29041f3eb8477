package cidroute

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// Datagram builders for the routing tests. The dtls and quic packages test
// their parsers against captured datagrams; here the shapes only need to be
// valid enough to classify.

// dtlsCIDRecord is a tls12_cid record (RFC 9146) carrying cid.
func dtlsCIDRecord(cid []byte, seq uint64, payload []byte) []byte {
	return must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: seq, CID: cid, Fragment: payload}))
}

// dtlsClientHello is an epoch-0 handshake record starting a ClientHello,
// with the record version OpenSSL uses for its first flight.
func dtlsClientHello(random byte) []byte {
	body := make([]byte, 60)
	body[0] = random
	return must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, body)}))
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
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

// route applies the forward rule against the router's current registry,
// with no own addresses and no admission limits.
func route(r *Router, hdr, b []byte, client netip.AddrPort) (Decision, []byte) {
	v := r.View(nil)
	return r.Forward(hdr, b, client, netip.Addr{}, &v)
}
