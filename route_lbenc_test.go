package cidroute

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/quic"
)

var _ CIDCodec = (*quic.LBEncrypted)(nil)

// encRouters are a DTLS and a QUIC router whose codec is the encrypted
// QUIC-LB one (four pass for DTLS's 8 octets, single pass for QUIC's 17),
// decoding configs 1 and 2.
func encRouters(t testing.TB, reg Backends) (dtlsR, quicR *Router) {
	t.Helper()
	keys := []quic.LBKey{{ConfigID: 1, Key: [16]byte{1}}, {ConfigID: 2, Key: [16]byte{2}}}
	for _, p := range []struct {
		proto Protocol
		nonce int
		r     **Router
	}{{DTLS, 6, &dtlsR}, {QUIC, quic.LBSinglePassNonceLen, &quicR}} {
		c, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{NonceLen: p.nonce, Keys: keys, Active: 2})
		require.NoError(t, err)
		*p.r, err = NewRouter(RouterConfig{Protocol: p.proto, PublicAddr: svcAddr, Backends: reg, Codec: c})
		require.NoError(t, err)
	}
	return dtlsR, quicR
}

// TestRouteEncrypted: established sessions route by the encrypted CID's
// ordinal like plaintext ones (draining served, gone dropped), and a CID
// of a config the codec has no key for is unroutable.
func TestRouteEncrypted(t *testing.T) {
	reg := threeBackends(t)
	dr, qr := encRouters(t, reg)
	for _, r := range []*Router{dr, qr} {
		wrap := func(cid []byte) []byte { return quicShort(cid) }
		if r == dr {
			wrap = func(cid []byte) []byte { return dtlsCIDRecord(cid, 1, make([]byte, 40)) }
		}
		for _, tc := range []struct {
			ord    uint8
			reason Reason
		}{{0, Forwarded}, {1, Forwarded}, {2, NotServing}, {3, Forwarded}, {9, UnknownOrdinal}} {
			cid := ordinalCID(t, r.Codec(), tc.ord)
			v := r.View(nil)
			d, _ := r.Forward(nil, wrap(cid), client1, netip.Addr{}, &v)
			assert.Equal(t, tc.reason, d.Reason, "%v ordinal %d", r.Codec(), tc.ord)
			if tc.reason == Forwarded {
				assert.Equal(t, tc.ord, d.Ordinal)
			}
		}
		// Config 3 has no key: whatever the router does with an
		// unroutable CID, the codec says so.
		cid := ordinalCID(t, r.Codec(), 3)
		cid[0] = 3<<5 | cid[0]&0x1f
		_, ok := r.Codec().Ordinal(cid)
		assert.False(t, ok)
	}
	hdr := make([]byte, 0, 64)
	for _, r := range []*Router{dr, qr} {
		d := quicShort(ordinalCID(t, r.Codec(), 3))
		if r == dr {
			d = dtlsCIDRecord(ordinalCID(t, r.Codec(), 3), 1, make([]byte, 100))
		}
		v := r.View(nil)
		if n := testing.AllocsPerRun(200, func() { r.Forward(hdr, d, client1, netip.Addr{}, &v) }); n != 0 {
			t.Errorf("%v: %v allocs per Route", r.Codec(), n)
		}
	}
}

// BenchmarkRouteEncrypted is BenchmarkRoute's established rows with
// encrypted CIDs: the difference is the decode.
func BenchmarkRouteEncrypted(b *testing.B) {
	dr, qr := encRouters(b, threeBackends(b))
	for _, bc := range []struct {
		name string
		r    *Router
		d    []byte
	}{
		{"dtls-cid-fourpass", dr, dtlsCIDRecord(ordinalCID(b, dr.Codec(), 0), 1, make([]byte, 100))},
		{"quic-short-singlepass", qr, quicShort(ordinalCID(b, qr.Codec(), 3))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			hdr := make([]byte, 0, 64)
			v := bc.r.View(nil)
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.d)))
			reportCPU(b, func() {
				if d, _ := bc.r.Forward(hdr, bc.d, client1, netip.Addr{}, &v); d.Reason != Forwarded {
					b.Fatal(d.Reason)
				}
			})
		})
	}
}
