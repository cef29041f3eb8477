package cidroute

import (
	"bufio"
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
)

// dtls13Record is a DTLS 1.3 ciphertext record with unified header f
// (001CSLEE): cid is written when f has the C bit.
func dtls13Record(f byte, cid []byte, seq uint64, sealed []byte) []byte {
	if f&dtls.UnifiedCID == 0 {
		cid = nil
	}
	return must(dtls.AppendRecord(nil, dtls.Record{Unified: f, Epoch: uint16(f & dtls.UnifiedEpoch), Seq: seq, CID: cid, Fragment: sealed}))
}

func join(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// sealed16 stands in for the shortest DTLS 1.3 ciphertext (RFC 9147 §4.2.3).
var sealed16 = []byte("0123456789abcdef")

// TestRouteDTLS13 walks SPEC.md's routing table for DTLS 1.3: unified
// headers with a CID go where the ordinal says, exactly as tls12_cid
// records do, with the plaintext and the encrypted codec; without a CID
// they are hashed like DTLS 1.2 records without one (or dropped as
// dtls13_no_cid when the service requires a CID); valid DTLS 1.3 is never
// malformed.
func TestRouteDTLS13(t *testing.T) {
	reg := threeBackends(t)
	plain := dtlsRouter(t, reg)
	enc, _ := encRouters(t, reg)
	strict, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, RequireDTLS13CID: true})
	require.NoError(t, err)
	hello := dtlsClientHello(1)
	helloPick, _ := route(plain, nil, hello, client1)
	require.Equal(t, Forwarded, helloPick.Reason)

	for _, r := range []*Router{plain, enc, strict} {
		c := r.Codec()
		for _, tc := range []struct {
			name   string
			b      []byte
			reason Reason
			ord    int // -1: the backend the client's ClientHello went to (HRW)
		}{
			{"full header, ready", dtls13Record(0x3f, ordinalCID(t, c, 0), 0x0102, sealed16), Forwarded, 0},
			{"8-bit seq, no length, draining", dtls13Record(0x33, ordinalCID(t, c, 1), 7, sealed16), Forwarded, 1},
			{"gone", dtls13Record(0x3e, ordinalCID(t, c, 2), 0, sealed16), NotServing, 0},
			{"unknown ordinal", dtls13Record(0x3e, ordinalCID(t, c, 9), 0, sealed16), UnknownOrdinal, 0},
			{"finished and ack", join(dtls13Record(0x3e, ordinalCID(t, c, 3), 0, sealed16), dtls13Record(0x32, ordinalCID(t, c, 3), 1, sealed16)), Forwarded, 3},
			{"no cid, then cid", join(dtls13Record(0x2e, nil, 0, sealed16), dtls13Record(0x3e, ordinalCID(t, c, 3), 1, sealed16)), Forwarded, 3},
			{"clienthello, plaintext", hello, Forwarded, -1},
			{"clienthello and 0-rtt without cid", join(hello, dtls13Record(0x2d, nil, 0, sealed16)), Forwarded, -1},
			{"plaintext ack", must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.ACK, Fragment: make([]byte, 18)})), Forwarded, -1},
			{"cid cut", dtls13Record(0x3e, ordinalCID(t, c, 0), 0, sealed16)[:5], Malformed, 0},
		} {
			d, hdr := route(r, make([]byte, 0, 64), tc.b, client1)
			require.Equal(t, tc.reason, d.Reason, "%s: err %v", tc.name, d.Err)
			if tc.reason != Forwarded {
				continue
			}
			switch tc.ord {
			case -1:
				assert.Equal(t, KindNew, d.Class.Kind, tc.name)
				assert.Equal(t, helloPick.Ordinal, d.Ordinal, "%s: hashed by client address like the ClientHello", tc.name)
			default:
				assert.Equal(t, KindEstablished, d.Class.Kind, tc.name)
				assert.Equal(t, uint8(tc.ord), d.Ordinal, tc.name)
			}
			h, _, err := ppv2.Parse(hdr)
			require.NoError(t, err)
			assert.Equal(t, client1, h.Src)
		}

		// The same CID in a tls12_cid record and a unified header: one
		// decode, one backend.
		for ord := range uint8(4) {
			cid := ordinalCID(t, c, ord)
			d12, _ := route(r, nil, dtlsCIDRecord(cid, 1, sealed16), client1)
			d13, _ := route(r, nil, dtls13Record(0x3c, cid, 1, sealed16), client1)
			assert.Equal(t, d12.Reason, d13.Reason, "ordinal %d", ord)
			assert.Equal(t, d12.Ordinal, d13.Ordinal, "ordinal %d", ord)
			assert.Equal(t, d12.Backend, d13.Backend, "ordinal %d", ord)
		}
	}

	// Without a CID: hashed like a ClientHello, unless the service
	// requires one.
	noCID := join(dtls13Record(0x2f, nil, 0x1234, sealed16), dtls13Record(0x2b, nil, 0x1235, sealed16))
	d, _ := route(plain, nil, noCID, client1)
	require.Equal(t, Forwarded, d.Reason, "err %v", d.Err)
	assert.Equal(t, helloPick.Ordinal, d.Ordinal)
	d, hdr := route(strict, make([]byte, 0, 64), noCID, client1)
	require.Equal(t, DTLS13NoCID, d.Reason)
	assert.ErrorIs(t, d.Err, ErrDTLS13NoCID)
	assert.Empty(t, hdr)
	assert.Equal(t, "dtls13_no_cid", DTLS13NoCID.String())
	assert.True(t, ForwardDrops.Has(DTLS13NoCID))
	assert.False(t, ReverseDrops.Has(DTLS13NoCID))

	_, err = NewRouter(RouterConfig{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg, RequireDTLS13CID: true})
	assert.ErrorIs(t, err, ErrConfig, "DTLS only")
	_, err = NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, RequireDTLS13CID: true, Classifier: DTLSClassifier{CIDLen: 8}})
	assert.ErrorIs(t, err, ErrConfig, "the built-in classifier only: a custom one decides for itself")
}

// TestRouteDTLS13CIDLength: a unified header with length tells a CID of
// another length (cid_length), one without length cannot; a record too
// short for the service's long CIDs but well-formed with a shorter one is
// dtls13_no_cid, never malformed.
func TestRouteDTLS13CIDLength(t *testing.T) {
	reg := threeBackends(t)
	dr := dtlsRouter(t, reg)
	long, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, CIDLen: 20})
	require.NoError(t, err)
	cid6 := []byte{0, 1, 2, 3, 4, 5}
	for _, tc := range []struct {
		name   string
		r      *Router
		b      []byte
		reason Reason
		id     []byte
	}{
		{"with length, 6 on an 8-byte service", dr, dtls13Record(0x3c, cid6, 1, sealed16), CIDLength, cid6},
		{"with length, behind a clienthello", dr, join(dtlsClientHello(1), dtls13Record(0x3e, cid6, 1, sealed16)), CIDLength, cid6},
		// 1 + 3 + 1 + 16 bytes: 21, under the 22 of a 20-byte CID's header.
		{"without length, a 3-byte cid, too short for 20", long, dtls13Record(0x30, cid6[:3], 1, sealed16), DTLS13NoCID, nil},
		{"without length, too short even for a 1-byte cid", long, dtls13Record(0x30, cid6, 1, sealed16[:4]), Malformed, nil},
		{"without length, long enough for 20: read with 20", long, dtls13Record(0x30, cid6, 1, sealed16), Forwarded, nil},
		{"without length on an 8-byte service: read with 8", dr, dtls13Record(0x30, ordinalCID(t, dr.Codec(), 3), 1, sealed16), Forwarded, nil},
	} {
		d, _ := route(tc.r, nil, tc.b, client1)
		require.Equal(t, tc.reason, d.Reason, "%s: err %v", tc.name, d.Err)
		switch tc.reason {
		case CIDLength:
			assert.ErrorIs(t, d.Err, ErrCIDLength, tc.name)
			assert.Equal(t, tc.id, d.Class.ID, tc.name)
		case DTLS13NoCID:
			assert.ErrorIs(t, d.Err, ErrDTLS13NoCID, tc.name)
		}
	}
}

// TestDTLS13Routes routes the client-direction vectors of
// dtls/testdata/rfc9147 and dtls/testdata/wolfssl (their format:
// dtls/testdata/README.md) through a router whose registry holds every
// ordinal 0–254: an established one goes to the backend its ordinal
// names, a new one where the same client's ClientHello goes, an invalid
// one is malformed, and none of the valid ones is.
func TestDTLS13Routes(t *testing.T) {
	var bs []registry.Backend
	for o := range 255 {
		bs = append(bs, backend(uint8(o), "10.1."+strconv.Itoa(o)+".1:5684", registry.Ready))
	}
	reg := newRegistry(t, 7, bs...)
	routers := map[int]*Router{}
	n := 0
	for _, dir := range []string{"rfc9147", "wolfssl"} {
		files, err := filepath.Glob(filepath.Join("dtls", "testdata", dir, "*.expect"))
		require.NoError(t, err)
		for _, f := range files {
			exp := readExpect(t, f)
			if exp["direction"] == "server" {
				continue
			}
			cidLen, err := strconv.Atoi(exp["cid_len"])
			require.NoError(t, err, f)
			r := routers[cidLen]
			if r == nil {
				r, err = NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, CIDLen: cidLen})
				require.NoError(t, err, f)
				routers[cidLen] = r
			}
			b := testtool.ReadHex(t, strings.TrimSuffix(f, ".expect")+".hex")
			d, _ := route(r, nil, b, client1)
			switch exp["kind"] {
			case "invalid":
				assert.Contains(t, []Reason{Malformed, CIDLength, DTLS13NoCID}, d.Reason, f)
			case "established":
				require.Equal(t, Forwarded, d.Reason, "%s: %v", f, d.Err)
				if o, ok := exp["ordinal"]; ok {
					assert.Equal(t, o, strconv.Itoa(int(d.Ordinal)), f)
				}
			case "new":
				require.Equal(t, Forwarded, d.Reason, "%s: %v", f, d.Err)
				hello, _ := route(r, nil, dtlsClientHello(1), client1)
				assert.Equal(t, hello.Ordinal, d.Ordinal, "%s: hashed by client address", f)
			default:
				t.Fatalf("%s: kind %q", f, exp["kind"])
			}
			n++
		}
	}
	require.NotZero(t, n, "no vectors under dtls/testdata/rfc9147")
}

// readExpect reads a vector's sidecar: key: value lines (the dtls package's
// TestVectors checks them in full).
func readExpect(t testing.TB, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	require.NoError(t, sc.Err())
	return m
}

// TestRouteDTLS13NoAllocs: DTLS 1.3 costs no allocation on any path, the
// drops included.
func TestRouteDTLS13NoAllocs(t *testing.T) {
	reg := threeBackends(t)
	dr := dtlsRouter(t, reg)
	strict, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, RequireDTLS13CID: true})
	require.NoError(t, err)
	long, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, CIDLen: 20})
	require.NoError(t, err)
	cid := ordinalCID(t, dr.Codec(), 0)
	hdr := make([]byte, 0, 64)
	for name, tc := range map[string]struct {
		r      *Router
		b      []byte
		reason Reason
	}{
		"cid":                   {dr, dtls13Record(0x3e, cid, 1, make([]byte, 100)), Forwarded},
		"finished and ack":      {dr, join(dtls13Record(0x3e, cid, 1, sealed16), dtls13Record(0x32, cid, 2, sealed16)), Forwarded},
		"no cid":                {dr, dtls13Record(0x2f, nil, 1, make([]byte, 100)), Forwarded},
		"no cid, required":      {strict, dtls13Record(0x2f, nil, 1, make([]byte, 100)), DTLS13NoCID},
		"too short for 20":      {long, dtls13Record(0x30, []byte{1, 2, 3}, 1, sealed16), DTLS13NoCID},
		"cid of another length": {dr, dtls13Record(0x3c, []byte{1, 2, 3, 4, 5, 6}, 1, sealed16), CIDLength},
		"malformed unified":     {dr, []byte{0x3c, 1, 2}, Malformed},
	} {
		d, _ := route(tc.r, hdr, tc.b, client1)
		require.Equal(t, tc.reason, d.Reason, name)
		if n := testing.AllocsPerRun(200, func() { route(tc.r, hdr, tc.b, client1) }); n != 0 {
			t.Errorf("%s: %v allocs per Route", name, n)
		}
	}
}

// BenchmarkRouteDTLS13 routes DTLS 1.3 datagrams beside their DTLS 1.2
// counterparts, in one run: the forward rule's cost per datagram.
func BenchmarkRouteDTLS13(b *testing.B) {
	reg := threeBackends(b)
	dr := dtlsRouter(b, reg)
	cid := ordinalCID(b, dr.Codec(), 0)
	payload := make([]byte, 100)
	for _, bc := range []struct {
		name string
		d    []byte
	}{
		{"dtls12-cid", dtlsCIDRecord(cid, 1, payload)},
		{"dtls13-cid", dtls13Record(0x3e, cid, 1, payload)},
		{"dtls13-cid-seq8-nolength", dtls13Record(0x30, cid, 1, payload)},
		{"dtls12-appdata-nocid", must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.ApplicationData, Epoch: 1, Seq: 1, Fragment: payload}))},
		{"dtls13-nocid", dtls13Record(0x2f, nil, 1, payload)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			hdr := make([]byte, 0, 64)
			v := dr.View(nil)
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.d)))
			for b.Loop() {
				if d, _ := dr.Forward(hdr, bc.d, client1, netip.Addr{}, &v); d.Reason != Forwarded {
					b.Fatal(d.Reason)
				}
			}
		})
	}
}

// TestPipelineDTLS13: through a running pipeline with two echo backends,
// a datagram of unified headers with a CID reaches the backend its ordinal
// names, from any client address, and one without CID, where the service
// requires it, is counted as dtls13_no_cid.
func TestPipelineDTLS13(t *testing.T) {
	e0, e1 := startEcho(t, 0), startEcho(t, 1)
	tp := startProxy(t, DTLS, []registry.Backend{{Ordinal: 0, Addr: e0.Addr()}, {Ordinal: 1, Addr: e1.Addr()}},
		func(s *Service) { s.RequireDTLS13CID = true })
	codec := tp.router().Codec()
	for _, ord := range []uint8{0, 1} {
		cid := ordinalCID(t, codec, ord)
		flight := join(dtls13Record(0x3e, cid, 0, sealed16), dtls13Record(0x32, cid, 1, sealed16))
		for range 2 {
			assert.Equal(t, int(ord), newClient(t).ask(tp.addr(), flight), "a new client address each time")
		}
	}
	c := newClient(t)
	assert.Equal(t, -1, c.ask(tp.addr(), dtls13Record(0x2f, nil, 1, sealed16)))
	assert.Equal(t, -1, c.ask(tp.addr(), dtls13Record(0x20, nil, 2, sealed16)))
	s := tp.settled(t, func(s ServiceStats) bool { return s.Forward.Dropped[DTLS13NoCID] == 2 })
	assert.Equal(t, uint64(4), s.Forward.Forwarded)
	assert.Zero(t, s.Forward.Dropped[Malformed])
}
