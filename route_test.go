package cidroute

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

var (
	svcAddr = netip.MustParseAddrPort("192.0.2.1:5684")
	client1 = netip.MustParseAddrPort("198.51.100.7:40000")
)

func dtlsRouter(t testing.TB, reg Backends) *Router {
	t.Helper()
	r, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg})
	require.NoError(t, err)
	return r
}

func quicRouter(t testing.TB, reg Backends) *Router {
	t.Helper()
	r, err := NewRouter(RouterConfig{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg})
	require.NoError(t, err)
	return r
}

func threeBackends(t testing.TB) *registry.Registry {
	return newRegistry(t, 7,
		backend(0, "10.0.0.10:5684", registry.Ready),
		backend(1, "10.0.0.11:5684", registry.Draining),
		backend(2, "10.0.0.12:5684", registry.Gone),
		backend(3, "10.0.0.13:5684", registry.Ready),
	)
}

// TestRouteTable walks the routing table of docs/design.md row by row.
func TestRouteTable(t *testing.T) {
	reg := threeBackends(t)
	dr, qr := dtlsRouter(t, reg), quicRouter(t, reg)
	qrHash, err := NewRouter(RouterConfig{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg, Unroutable: UnroutableHash})
	require.NoError(t, err)
	dc, qc := dr.Codec(), qr.Codec()
	otherRotation := ordinalCID(t, qc, 0)
	otherRotation[0] = 0x20 | otherRotation[0]&0x1f
	reserved := ordinalCID(t, dc, 0)
	reserved[0] = 255
	qReserved := ordinalCID(t, qc, 0)
	qReserved[1] = 255
	unroutable := ordinalCID(t, qc, 0)
	unroutable[0] |= 0xe0
	ready := []uint8{0, 3}

	for _, tc := range []struct {
		name   string
		r      *Router
		b      []byte
		reason Reason
		ord    int // -1: any ready backend (HRW)
	}{
		{"dtls cid ready", dr, dtlsCIDRecord(ordinalCID(t, dc, 0), 1, []byte("x")), Forwarded, 0},
		{"dtls cid draining keeps its session", dr, dtlsCIDRecord(ordinalCID(t, dc, 1), 1, []byte("x")), Forwarded, 1},
		{"dtls cid gone", dr, dtlsCIDRecord(ordinalCID(t, dc, 2), 1, []byte("x")), NotServing, 0},
		{"dtls cid unknown ordinal", dr, dtlsCIDRecord(ordinalCID(t, dc, 9), 1, []byte("x")), UnknownOrdinal, 0},
		{"dtls cid reserved ordinal", dr, dtlsCIDRecord(reserved, 1, []byte("x")), UnknownOrdinal, 0},
		{"dtls flight 5: cid record after plain ones", dr, append(append(dtlsClientHello(1)[:0:0], dtlsClientHello(1)...), dtlsCIDRecord(ordinalCID(t, dc, 3), 1, []byte("fin"))...), Forwarded, 3},
		{"dtls client hello", dr, dtlsClientHello(1), Forwarded, -1},
		{"dtls garbage", dr, []byte{1, 2, 3}, Malformed, 0},
		{"dtls truncated cid record", dr, dtlsCIDRecord(ordinalCID(t, dc, 0), 1, []byte("xyz"))[:20], Malformed, 0},
		{"quic short ready", qr, quicShort(ordinalCID(t, qc, 3)), Forwarded, 3},
		{"quic short draining", qr, quicShort(ordinalCID(t, qc, 1)), Forwarded, 1},
		{"quic short gone", qr, quicShort(ordinalCID(t, qc, 2)), NotServing, 0},
		{"quic short unknown", qr, quicShort(ordinalCID(t, qc, 200)), UnknownOrdinal, 0},
		{"quic short reserved", qr, quicShort(qReserved), UnknownOrdinal, 0},
		{"quic short unroutable: hash the client", qrHash, quicShort(unroutable), Forwarded, -1},
		{"quic short unroutable: dropped by default", qr, quicShort(unroutable), Unroutable, 0},
		{"quic short of another config rotation: dropped by default", qr, quicShort(otherRotation), Unroutable, 0},
		{"quic handshake unroutable: dropped by default", qr, quicLong(2, unroutable, []byte{1}, 0), Unroutable, 0},
		{"quic handshake", qr, quicLong(2, ordinalCID(t, qc, 0), []byte{1, 2, 3, 4, 5, 6, 7, 8}, 0), Forwarded, 0},
		{"quic initial, client dcid", qr, quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200), Forwarded, -1},
		{"quic initial, server cid", qr, quicLong(0, ordinalCID(t, qc, 1), nil, 1200), Forwarded, 1},
		{"quic initial, server-length cid of gone ordinal: hashed", qr, quicLong(0, ordinalCID(t, qc, 2), nil, 1200), Forwarded, -1},
		{"quic 0-rtt", qr, quicLong(1, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 0), Forwarded, -1},
		{"quic initial too small", qr, quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 0), Malformed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, hdr := route(tc.r, make([]byte, 0, 64), tc.b, client1)
			require.Equal(t, tc.reason, d.Reason, "err %v", d.Err)
			if tc.reason != Forwarded {
				assert.Empty(t, hdr)
				return
			}
			switch tc.ord {
			case -1:
				assert.Contains(t, ready, d.Ordinal, "new sessions go to ready backends only")
			default:
				assert.Equal(t, uint8(tc.ord), d.Ordinal)
			}
			b, ok := reg.Snapshot().Backend(d.Ordinal)
			require.True(t, ok)
			assert.Equal(t, b.Addr, d.Backend)
			h, off, err := ppv2.Parse(hdr)
			require.NoError(t, err)
			assert.Equal(t, len(hdr), off)
			assert.Equal(t, client1, h.Src)
			assert.Equal(t, svcAddr, h.Dst)
		})
	}
}

// TestRouteCIDLength: a server CID of another length than the service's
// is its own drop reason wherever the wire tells it, with the CID as it
// came; broken datagrams stay malformed.
func TestRouteCIDLength(t *testing.T) {
	reg := threeBackends(t)
	dr, qr := dtlsRouter(t, reg), quicRouter(t, reg)
	cid6 := []byte{0, 1, 2, 3, 4, 5}
	cid20 := ordinalCID(t, quic.LB{Length: 20}, 0)
	flight := append(append([]byte(nil), dtlsClientHello(1)...), dtlsCIDRecord(cid6, 1, []byte("finished, encrypted"))...)
	for _, tc := range []struct {
		name   string
		r      *Router
		b      []byte
		reason Reason
		id     []byte
	}{
		{"quic handshake, 6-byte dcid", qr, quicLong(2, cid6, []byte{1}, 0), CIDLength, cid6},
		{"quic handshake, 20-byte dcid", qr, quicLong(2, cid20, []byte{1}, 0), CIDLength, cid20},
		{"quic handshake + short header, 6-byte dcid", qr, append(quicLong(2, cid6, []byte{1}, 0), quicShort(cid6)...), CIDLength, cid6},
		{"quic initial, 6-byte dcid: too short, not a server cid", qr, quicLong(0, cid6, nil, 1200), Forwarded, nil},
		{"dtls cid record of 6 on an 8-byte service", dr, dtlsCIDRecord(cid6, 1, []byte("app data")), CIDLength, cid6},
		{"dtls flight 5 of 6 on an 8-byte service", dr, flight, CIDLength, cid6},
		{"dtls truncated cid record", dr, dtlsCIDRecord(ordinalCID(t, dr.Codec(), 0), 1, []byte("xyz"))[:20], Malformed, nil},
		{"quic garbage long header", qr, []byte{0xe0, 0, 0, 0, 1, 30}, Malformed, nil},
	} {
		d, _ := route(tc.r, make([]byte, 0, 64), tc.b, client1)
		require.Equal(t, tc.reason, d.Reason, "%s: err %v", tc.name, d.Err)
		if tc.reason == CIDLength {
			assert.ErrorIs(t, d.Err, ErrCIDLength, tc.name)
			assert.Equal(t, tc.id, d.Class.ID, tc.name)
		}
	}
	assert.True(t, ForwardDrops.Has(CIDLength))
	assert.Equal(t, "cid_length", CIDLength.String())
}

func TestRouteNewSessions(t *testing.T) {
	t.Run("stale registry refuses new sessions only", func(t *testing.T) {
		reg := &staleBackends{threeBackends(t)}
		dr := dtlsRouter(t, reg)
		d, _ := route(dr, nil, dtlsClientHello(1), client1)
		assert.Equal(t, StaleRegistry, d.Reason)
		d, _ = route(dr, nil, dtlsCIDRecord(ordinalCID(t, dr.Codec(), 1), 1, []byte("x")), client1)
		assert.Equal(t, Forwarded, d.Reason)
		qr := quicRouter(t, reg)
		d, _ = route(qr, nil, quicLong(0, []byte{9, 9, 9, 9, 9, 9, 9, 9}, nil, 1200), client1)
		assert.Equal(t, StaleRegistry, d.Reason)
		d, _ = route(qr, nil, quicShort(ordinalCID(t, qr.Codec(), 0)), client1)
		assert.Equal(t, Forwarded, d.Reason)
	})
	t.Run("no ready backend", func(t *testing.T) {
		reg := newRegistry(t, 1, backend(0, "10.0.0.1:1", registry.Draining))
		d, _ := route(dtlsRouter(t, reg), nil, dtlsClientHello(1), client1)
		assert.Equal(t, NoReadyBackend, d.Reason)
	})
	t.Run("same client, same backend; the key is client and service", func(t *testing.T) {
		reg := newRegistry(t, 3)
		var bs []registry.Backend
		for i := range 16 {
			bs = append(bs, backend(uint8(i), fmt.Sprintf("10.0.0.%d:5684", i+1), registry.Ready))
		}
		require.NoError(t, reg.Update(bs))
		dr := dtlsRouter(t, reg)
		seen := map[uint8]bool{}
		for port := range uint16(200) {
			c := netip.AddrPortFrom(client1.Addr(), 30000+port)
			d1, _ := route(dr, nil, dtlsClientHello(1), c)
			d2, _ := route(dr, nil, dtlsClientHello(2), c) // the cookie round of the same handshake
			require.Equal(t, d1.Ordinal, d2.Ordinal)
			b, _ := reg.Snapshot().PickNewAddrs(c, svcAddr)
			require.Equal(t, b.Ordinal, d1.Ordinal)
			seen[d1.Ordinal] = true
		}
		assert.Greater(t, len(seen), 10, "200 clients spread over 16 backends")
	})
	t.Run("all Initials of one attempt agree", func(t *testing.T) {
		reg := threeBackends(t)
		qr := quicRouter(t, reg)
		dcid := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4}
		d1, _ := route(qr, nil, quicLong(0, dcid, []byte{1}, 1200), client1)
		d2, _ := route(qr, nil, quicLong(0, dcid, []byte{1}, 1300), netip.MustParseAddrPort("203.0.113.9:1"))
		d3, _ := route(qr, nil, quicLong(1, dcid, []byte{1}, 0), client1)
		assert.Equal(t, d1.Ordinal, d2.Ordinal)
		assert.Equal(t, d1.Ordinal, d3.Ordinal)
	})
}

// TestReplicasAgree: two routers built independently from equal registries
// make the same choice for every datagram.
func TestReplicasAgree(t *testing.T) {
	mk := func() *Router { return dtlsRouter(t, threeBackends(t)) }
	a, b := mk(), mk()
	for i := range 5000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), uint16(i))
		da, _ := route(a, nil, dtlsClientHello(byte(i)), c)
		db, _ := route(b, nil, dtlsClientHello(byte(i)), c)
		require.Equal(t, da, db)
	}
}

func TestRouterConfig(t *testing.T) {
	reg := threeBackends(t)
	for _, cfg := range []RouterConfig{
		{Protocol: DTLS, PublicAddr: svcAddr},
		{Protocol: DTLS, Backends: reg},
		{PublicAddr: svcAddr, Backends: reg},
		{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, CIDLen: 1000},
		{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg, CIDLen: 40},
		{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, Codec: dtls.OrdinalFirst{Length: 8}, CIDLen: 6},
	} {
		_, err := NewRouter(cfg)
		assert.ErrorIs(t, err, ErrConfig, "%+v", cfg)
	}
	r, err := NewRouter(RouterConfig{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg, Codec: dtls.OrdinalFirst{Length: 6}})
	require.NoError(t, err)
	d, _ := route(r, nil, quicShort(ordinalCID(t, r.Codec(), 3)), client1)
	assert.Equal(t, uint8(3), d.Ordinal, "a QUIC service may use the ordinal-first codec shorter than a client's DCID")
}

// TestQUICServerCIDLen: a QUIC service whose server CIDs a client's random
// first DCID can pass for is refused, saying why.
func TestQUICServerCIDLen(t *testing.T) {
	reg := threeBackends(t)
	for name, cfg := range map[string]RouterConfig{
		"QUIC-LB of 8":        {CIDLen: 8},
		"ordinal-first of 8":  {Codec: dtls.OrdinalFirst{}},
		"ordinal-first of 12": {Codec: dtls.OrdinalFirst{Length: 12}},
	} {
		cfg.Protocol, cfg.PublicAddr, cfg.Backends = QUIC, svcAddr, reg
		_, err := NewRouter(cfg)
		assert.ErrorIs(t, err, ErrConfig, name)
		assert.ErrorIs(t, err, quic.ErrServerCIDLen, name)
	}
	for _, n := range []int{6, 7, 9, 12, 20} {
		_, err := NewRouter(RouterConfig{Protocol: QUIC, PublicAddr: svcAddr, Backends: reg, CIDLen: n})
		assert.NoError(t, err, "QUIC-LB of %d", n)
	}
	_, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, CIDLen: 8})
	assert.NoError(t, err, "DTLS has no client DCID")
}

func TestCustomClassifier(t *testing.T) {
	reg := threeBackends(t)
	errBad := errors.New("not mine")
	r, err := NewRouter(RouterConfig{PublicAddr: svcAddr, Backends: reg, Codec: dtls.OrdinalFirst{},
		Classifier: ClassifierFunc(func(b []byte) (Class, error) {
			if len(b) < 9 || b[0] != 'C' {
				return Class{}, errBad
			}
			return Class{Kind: KindEstablished, ID: b[1:9]}, nil
		})})
	require.NoError(t, err)
	d, _ := route(r, nil, append([]byte{'C'}, ordinalCID(t, r.Codec(), 3)...), client1)
	assert.Equal(t, uint8(3), d.Ordinal)
	d, _ = route(r, nil, []byte("x"), client1)
	assert.Equal(t, Malformed, d.Reason)
	assert.ErrorIs(t, d.Err, errBad)
}

func TestRouteNoAllocs(t *testing.T) {
	reg := threeBackends(t)
	dr, qr := dtlsRouter(t, reg), quicRouter(t, reg)
	hdr := make([]byte, 0, 64)
	for name, tc := range map[string]struct {
		r *Router
		b []byte
	}{
		"dtls cid":                         {dr, dtlsCIDRecord(ordinalCID(t, dr.Codec(), 0), 1, make([]byte, 100))},
		"client hello":                     {dr, dtlsClientHello(1)},
		"quic short":                       {qr, quicShort(ordinalCID(t, qr.Codec(), 3))},
		"quic initial":                     {qr, quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200)},
		"malformed":                        {dr, []byte{25, 0xfe}},
		"dtls cid of another length":       {dr, dtlsCIDRecord([]byte{1, 2, 3, 4, 5, 6}, 1, make([]byte, 100))},
		"quic handshake of another length": {qr, append(quicLong(2, []byte{1, 2, 3, 4, 5, 6}, []byte{1}, 0), quicShort(make([]byte, 6))...)},
	} {
		if n := testing.AllocsPerRun(200, func() { route(tc.r, hdr, tc.b, client1) }); n != 0 {
			t.Errorf("%s: %v allocs per Route", name, n)
		}
	}
}

// staleBackends is a registry whose source stopped confirming.
type staleBackends struct{ *registry.Registry }

func (staleBackends) Stale() bool { return true }

func BenchmarkRoute(b *testing.B) {
	reg := threeBackends(b)
	dr, qr := dtlsRouter(b, reg), quicRouter(b, reg)
	for _, bc := range []struct {
		name string
		r    *Router
		d    []byte
	}{
		{"dtls-cid", dr, dtlsCIDRecord(ordinalCID(b, dr.Codec(), 0), 1, make([]byte, 100))},
		{"dtls-clienthello", dr, dtlsClientHello(1)},
		{"quic-short", qr, quicShort(ordinalCID(b, qr.Codec(), 3))},
		{"quic-initial", qr, quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			hdr := make([]byte, 0, 64)
			v := bc.r.View(nil) // once per batch, as the worker takes it
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

// TestQUICUnknownVersion: a long header of a version the proxy does not
// know starts a handshake (the backend answers with Version Negotiation):
// it counts against the handshake limit, and under 1200 bytes, which no
// server answers, it is malformed.
func TestQUICUnknownVersion(t *testing.T) {
	pkt := func(size int) []byte {
		b := []byte{0xc0, 0x1a, 0x2a, 0x3a, 0x4a, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0}
		return append(b, make([]byte, size-len(b))...)
	}
	cls := QUICClassifier{CIDLen: DefaultQUICCIDLen}
	c, err := cls.Classify(pkt(1200))
	require.NoError(t, err)
	assert.Equal(t, Class{Kind: KindNew, ID: []byte{1, 2, 3, 4, 5, 6, 7, 8}, Handshake: true}, c)
	_, err = cls.Classify(pkt(100))
	assert.ErrorIs(t, err, quic.ErrInitialSize)
}

// BenchmarkReverse is the reverse rule on a good reply and on a stranger's.
func BenchmarkReverse(b *testing.B) {
	reg := threeBackends(b)
	r := dtlsRouter(b, reg)
	own := NewOwnAddrs([]netip.AddrPort{svcAddr, netip.MustParseAddrPort("0.0.0.0:40001")}, []netip.Addr{svcAddr.Addr()})
	good, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: svcAddr, Dst: client1})
	require.NoError(b, err)
	good = append(good, make([]byte, 100)...)
	for _, bc := range []struct {
		name string
		from netip.AddrPort
		want Reason
	}{
		{"relayed", netip.MustParseAddrPort("10.0.0.10:5684"), Forwarded},
		{"stranger", netip.MustParseAddrPort("203.0.113.9:5684"), UntrustedSender},
	} {
		b.Run(bc.name, func(b *testing.B) {
			v := r.View(own)
			b.ReportAllocs()
			reportCPU(b, func() {
				if rep := r.Reverse(good, bc.from, Session{}, &v); rep.Reason != bc.want {
					b.Fatal(rep.Reason)
				}
			})
		})
	}
}

// TestReverseRule walks the reverse rule's checks in order, with PPv2 and
// in transparent mode.
func TestReverseRule(t *testing.T) {
	reg := threeBackends(t)
	lo := netip.MustParseAddrPort("127.0.0.1:5684")
	ppR := dtlsRouter(t, reg)
	loR, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: lo, Backends: reg})
	require.NoError(t, err)
	wildR, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: netip.MustParseAddrPort("0.0.0.0:5684"), Backends: reg})
	require.NoError(t, err)
	trR, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg, Transparent: true})
	require.NoError(t, err)
	own := NewOwnAddrs([]netip.AddrPort{svcAddr, netip.MustParseAddrPort("0.0.0.0:40000")},
		[]netip.Addr{svcAddr.Addr(), netip.MustParseAddr("192.0.2.255")})
	ready := netip.MustParseAddrPort("10.0.0.10:5684")
	draining := netip.MustParseAddrPort("10.0.0.11:5684")
	gone := netip.MustParseAddrPort("10.0.0.12:5684")
	reply := func(src, dst string, payload string) []byte {
		b, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)})
		require.NoError(t, err)
		return append(b, payload...)
	}
	local, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Local})
	pub := svcAddr.String()
	for _, tc := range []struct {
		name   string
		r      *Router
		b      []byte
		from   netip.AddrPort
		sess   Session
		reason Reason
		client string
		local  string
	}{
		{"relayed", ppR, reply(pub, "198.51.100.7:40000", "x"), ready, Session{}, Forwarded, "198.51.100.7:40000", ""},
		{"from a draining backend", ppR, reply(pub, "198.51.100.7:40000", "x"), draining, Session{}, Forwarded, "198.51.100.7:40000", ""},
		{"mapped client", ppR, reply(pub, "[::ffff:198.51.100.7]:40000", "x"), ready, Session{}, Forwarded, "198.51.100.7:40000", ""},
		{"from a gone backend", ppR, reply(pub, "198.51.100.7:40000", "x"), gone, Session{}, UntrustedSender, "", ""},
		{"from a stranger", ppR, reply(pub, "198.51.100.7:40000", "x"), client1, Session{}, UntrustedSender, "", ""},
		{"no header", ppR, []byte("payload"), ready, Session{}, BadProxyHeader, "", ""},
		{"LOCAL header", ppR, append(local, 'x'), ready, Session{}, BadProxyHeader, "", ""},
		{"another source", ppR, reply("192.0.2.1:5685", "198.51.100.7:40000", "x"), ready, Session{}, BadProxyHeader, "", ""},
		{"multicast", ppR, reply(pub, "224.0.0.1:5000", "x"), ready, Session{}, BadDestination, "", ""},
		{"broadcast", ppR, reply(pub, "255.255.255.255:5000", "x"), ready, Session{}, BadDestination, "", ""},
		{"subnet broadcast of the host", ppR, reply(pub, "192.0.2.255:40000", "x"), ready, Session{}, BadDestination, "", ""},
		{"unspecified", ppR, reply(pub, "0.0.0.0:5000", "x"), ready, Session{}, BadDestination, "", ""},
		{"port 0", ppR, reply(pub, "198.51.100.7:0", "x"), ready, Session{}, BadDestination, "", ""},
		{"loopback", ppR, reply(pub, "127.0.0.1:5000", "x"), ready, Session{}, BadDestination, "", ""},
		{"IPv6 client of an IPv4 service", ppR, reply(pub, "[2001:db8::1]:5000", "x"), ready, Session{}, BadDestination, "", ""},
		{"the service itself", ppR, reply(pub, pub, "x"), ready, Session{}, BadDestination, "", ""},
		{"an own socket", ppR, reply(pub, "192.0.2.1:40000", "x"), ready, Session{}, BadDestination, "", ""},
		{"no payload", ppR, reply(pub, "198.51.100.7:40000", ""), ready, Session{}, Malformed, "", ""},
		{"loopback service, loopback client", loR, reply(lo.String(), "127.0.0.1:5000", "x"), ready, Session{}, Forwarded, "127.0.0.1:5000", ""},
		{"wildcard service: leave from the named address", wildR, reply("192.0.2.7:5684", "198.51.100.7:40000", "x"), ready, Session{}, Forwarded, "198.51.100.7:40000", "192.0.2.7"},
		{"wildcard service, wrong port", wildR, reply("192.0.2.7:5685", "198.51.100.7:40000", "x"), ready, Session{}, BadProxyHeader, "", ""},
		{"transparent", trR, []byte("payload x"), ready, Session{Client: client1}, Forwarded, client1.String(), ""},
		{"transparent, measured loopback client", trR, []byte("payload x"), ready, Session{Client: netip.MustParseAddrPort("127.0.0.1:9")}, Forwarded, "127.0.0.1:9", ""},
		{"transparent, backend left", trR, []byte("payload"), gone, Session{Client: client1}, UntrustedSender, "", ""},
		{"transparent, no session", trR, []byte("payload"), ready, Session{}, BadDestination, "", ""},
		{"transparent, empty", trR, []byte{}, ready, Session{Client: client1}, Malformed, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.r.View(own)
			rep := tc.r.Reverse(tc.b, tc.from, tc.sess, &v)
			require.Equal(t, tc.reason, rep.Reason)
			if tc.reason != Forwarded {
				return
			}
			assert.Equal(t, tc.client, rep.Client.String())
			if tc.local == "" {
				assert.False(t, rep.Local.IsValid())
			} else {
				assert.Equal(t, tc.local, rep.Local.String())
			}
			assert.Equal(t, "x", string(rep.Payload[len(rep.Payload)-1:]), "payload is the datagram's tail")
		})
	}
	v := ppR.View(own)
	b := reply(pub, "198.51.100.7:40000", "x")
	if n := testing.AllocsPerRun(100, func() { ppR.Reverse(b, ready, Session{}, &v) }); n != 0 {
		t.Fatalf("Reverse allocates %v", n)
	}
}

// TestForwardGuards: the forward rule's own-address guard, the admission
// of session starts behind established content, and ForwardAt's headroom.
func TestForwardGuards(t *testing.T) {
	reg := newRegistry(t, 1,
		backend(0, "10.0.0.10:5684", registry.Ready),
		backend(1, svcAddr.String(), registry.Ready),  // the public address
		backend(2, "10.0.0.12:40000", registry.Ready), // an own socket: wildcard port 40000, a host address
	)
	r := dtlsRouter(t, reg)
	own := NewOwnAddrs([]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:40000")}, []netip.Addr{netip.MustParseAddr("10.0.0.12")})
	v := r.View(own)
	for ord, want := range []Reason{Forwarded, OwnAddress, OwnAddress} {
		d, _ := r.Forward(nil, dtlsCIDRecord(ordinalCID(t, r.Codec(), uint8(ord)), 1, []byte("x")), client1, netip.Addr{}, &v)
		assert.Equal(t, want, d.Reason, "ordinal %d", ord)
		assert.Equal(t, reg.Snapshot().Backends()[ord].Addr, d.Backend, "the backend, refused or not")
	}

	// A ClientHello behind a live CID record is routed by the CID and
	// counted as a handshake.
	mixed := append(dtlsCIDRecord(ordinalCID(t, r.Codec(), 0), 1, []byte("x")), dtlsClientHello(1)...)
	d, _ := r.Forward(nil, mixed, client1, netip.Addr{}, &v)
	require.Equal(t, Forwarded, d.Reason)
	assert.Equal(t, KindEstablished, d.Class.Kind)
	assert.True(t, d.Class.Handshake)
	spent := v
	spent.Admission = spentAdmission()
	d, _ = r.Forward(nil, mixed, client1, netip.Addr{}, &spent)
	assert.Equal(t, RateLimited, d.Reason)
	d, _ = r.Forward(nil, dtlsCIDRecord(ordinalCID(t, r.Codec(), 0), 1, []byte("x")), client1, netip.Addr{}, &spent)
	assert.Equal(t, Forwarded, d.Reason, "a CID record alone is no session start")

	// ForwardAt: the header lands right in front of the datagram.
	rec := dtlsCIDRecord(ordinalCID(t, r.Codec(), 0), 1, []byte("x"))
	buf := append(make([]byte, 40), rec...)
	d, out := r.ForwardAt(buf, 40, client1, netip.Addr{}, &v)
	require.Equal(t, Forwarded, d.Reason)
	require.Len(t, out, ppv2.HeaderLen4+len(rec))
	assert.Equal(t, &buf[40-ppv2.HeaderLen4], &out[0])
	h, off, err := ppv2.Parse(out)
	require.NoError(t, err)
	assert.Equal(t, client1, h.Src)
	assert.Equal(t, rec, out[off:])
	d, out = r.ForwardAt(append(make([]byte, 10), rec...), 10, client1, netip.Addr{}, &v)
	assert.Equal(t, Malformed, d.Reason)
	assert.ErrorIs(t, d.Err, ErrHeadroom)
	assert.Nil(t, out)
	if n := testing.AllocsPerRun(100, func() { r.ForwardAt(buf, 40, client1, netip.Addr{}, &v) }); n != 0 {
		t.Fatalf("ForwardAt allocates %v", n)
	}
}
