package cidroute

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
)

// fuzzBackends turns bytes into a valid backend list: each 3-byte group is
// (ordinal, state, weight); repeated ordinals and 255 are skipped, and each
// ordinal gets its own address.
func fuzzBackends(b []byte) []registry.Backend {
	var bs []registry.Backend
	seen := map[uint8]bool{}
	for ; len(b) >= 3; b = b[3:] {
		ord := b[0]
		if ord == 255 || seen[ord] {
			continue
		}
		seen[ord] = true
		bs = append(bs, registry.Backend{
			Ordinal: ord,
			Addr:    netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, ord, 1}), 5684),
			State:   registry.State(b[1] % 3),
			Weight:  uint32(b[2]%8) + 1,
		})
	}
	return bs
}

// fuzzRegistries caches one registry per backend list: building the HRW
// table is most of an exec's cost otherwise.
var fuzzRegistries = map[string]*registry.Registry{}

func fuzzRegistry(t *testing.T, regBytes []byte) *registry.Registry {
	bs := fuzzBackends(regBytes)
	key := fmt.Sprint(bs)
	if r, ok := fuzzRegistries[key]; ok {
		return r
	}
	r, err := registry.New(registry.Config{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Update(bs); len(bs) > 0 && err != nil { // empty: refused, the registry stays empty
		t.Fatalf("valid list refused: %v", err)
	}
	if len(fuzzRegistries) > 4096 {
		for k, old := range fuzzRegistries {
			old.Close()
			delete(fuzzRegistries, k)
		}
	}
	fuzzRegistries[key] = r
	return r
}

// FuzzRoute runs the forward rule on an arbitrary datagram against an
// arbitrary registry snapshot and checks the invariants docs/design.md
// promises:
// never forward to a backend outside the snapshot or one that is gone; a
// CID datagram goes to its ordinal, never to a hash; a hashed (new) session
// goes to a ready backend; a forwarded datagram's header names the client;
// never to one of the proxy's own addresses; and anything that starts a
// session is admission-limited: with the handshake and 0-RTT budgets spent,
// no datagram that starts a session is forwarded.
func FuzzRoute(f *testing.F) {
	cid3 := []byte{3, 1, 2, 3, 4, 5, 6, 7}
	f.Add(dtlsCIDRecord(cid3, 1, []byte("x")), []byte{3, 0, 1, 4, 1, 1}, uint16(4000), false)
	f.Add(dtlsClientHello(1), []byte{3, 0, 1, 4, 0, 2}, uint16(4000), false)
	f.Add(dtlsCIDRecord([]byte{255, 1, 2, 3, 4, 5, 6, 7}, 1, []byte("x")), []byte{3, 2, 1}, uint16(1), false)
	f.Add(quicShort([]byte{0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), []byte{9, 0, 1}, uint16(2), true)
	f.Add(quicShort([]byte{0xe0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), []byte{9, 0, 1, 4, 0, 1}, uint16(2), true)
	f.Add(quicLong(0, []byte{1, 2, 3, 4, 5, 6, 7, 8}, nil, 1200), []byte{1, 0, 1, 2, 1, 1}, uint16(3), true)
	f.Add(quicLong(0, []byte{0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, nil, 1200), []byte{2, 1, 1}, uint16(3), true)
	f.Add(quicLong(2, []byte{0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, []byte{1}, 0), []byte{2, 2, 1}, uint16(3), true)
	// A Handshake packet whose DCID is not of the service's length: no
	// server CID, so dropped (unknown_ordinal), never hashed.
	f.Add(quicLong(2, []byte{2, 1, 2, 3, 4, 5, 6, 7}, []byte{1}, 0), []byte{2, 0, 1}, uint16(3), true)
	// Session starts behind established content (issue 15).
	f.Add(append(dtlsCIDRecord(cid3, 1, []byte("x")), dtlsClientHello(1)...), []byte{3, 0, 1}, uint16(4), false)
	scid := []byte{0, 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	f.Add(append(quicLong(2, scid, []byte{1}, 0), quicLong(0, scid, []byte{1}, 1200)...), []byte{2, 0, 1}, uint16(5), true)
	f.Add(append(quicLong(2, scid, []byte{1}, 0), quicLong(1, scid, []byte{1}, 0)...), []byte{2, 0, 1}, uint16(5), true)
	// Ordinal 7's backend (10.0.7.1:5684) is one of the proxy's own
	// addresses.
	f.Add(dtlsCIDRecord([]byte{7, 1, 2, 3, 4, 5, 6, 7}, 1, []byte("x")), []byte{7, 0, 1}, uint16(6), false)
	own := NewOwnAddrs([]netip.AddrPort{netip.MustParseAddrPort("10.0.7.1:5684"), netip.MustParseAddrPort("0.0.0.0:5684")},
		[]netip.Addr{netip.MustParseAddr("10.0.9.1")})
	f.Fuzz(func(t *testing.T, b, regBytes []byte, port uint16, isQUIC bool) {
		reg := fuzzRegistry(t, regBytes)
		proto := DTLS
		if isQUIC {
			proto = QUIC
		}
		r, err := NewRouter(RouterConfig{Protocol: proto, PublicAddr: svcAddr, Backends: reg})
		if err != nil {
			t.Fatal(err)
		}
		// The same stages hidden behind wrappers take the interface path
		// rather than the built-in one: the decision must not differ.
		slow, err := NewRouter(RouterConfig{
			PublicAddr: svcAddr, Backends: reg,
			Classifier: ClassifierFunc(r.cls.Classify),
			Codec:      opaqueCodec{r.codec},
			Encoder:    opaqueEncoder{r.enc},
		})
		if err != nil {
			t.Fatal(err)
		}
		client := netip.AddrPortFrom(client1.Addr(), port)
		v := r.View(own)
		d, hdr := r.Forward(nil, b, client, netip.Addr{}, &v)
		if sd, shdr := slow.Forward(nil, b, client, netip.Addr{}, &v); sd.Reason != d.Reason || sd.Backend != d.Backend ||
			sd.Ordinal != d.Ordinal || !equalClass(sd.Class, d.Class) || !bytes.Equal(shdr, hdr) {
			t.Fatalf("built-in stages: %+v %x; through interfaces: %+v %x", d, hdr, sd, shdr)
		}
		c, cerr := r.cls.Classify(b)
		if (cerr != nil) != (d.Reason == Malformed) {
			t.Fatalf("classifier error %v but reason %v", cerr, d.Reason)
		}
		starts := proto.StartsSession(b, r.codec.Len())
		if cerr == nil && starts != (c.Handshake || c.ZeroRTT) {
			t.Fatalf("starts a session: %v, but Class %+v", starts, c)
		}
		// With the handshake and 0-RTT budgets spent, a datagram that
		// starts a session never passes.
		spent := View{Snapshot: v.Snapshot, Own: own, Admission: spentAdmission(), Now: 0}
		if ld, _ := r.Forward(nil, b, client, netip.Addr{}, &spent); starts && ld.Reason == Forwarded {
			t.Fatalf("a datagram that starts a session passed spent limits: %+v", c)
		} else if cerr == nil && !starts && ld.Reason != d.Reason {
			t.Fatalf("limits on session starts changed the verdict on a datagram that starts none: %v, %v", ld.Reason, d.Reason)
		}
		if d.Reason != Forwarded {
			if len(hdr) != 0 {
				t.Fatalf("dropped (%v) with a header", d.Reason)
			}
			return
		}
		if own.Contains(d.Backend) || d.Backend == svcAddr {
			t.Fatalf("forwarded to %v, one of the proxy's own addresses", d.Backend)
		}
		snap := reg.Snapshot()
		be, ok := snap.Backend(d.Ordinal)
		if !ok || be.Addr != d.Backend || be.State == registry.Gone {
			t.Fatalf("forwarded to %v (ordinal %d), not a serving backend of the snapshot", d.Backend, d.Ordinal)
		}
		ord, routable := r.codec.Ordinal(c.ID)
		switch {
		case c.Kind == KindEstablished:
			// Never by hash: to the ordinal its CID carries. The default
			// drops a CID the codec marks unroutable.
			switch {
			case len(c.ID) != r.codec.Len():
				t.Fatalf("CID datagram with a %d-byte CID (the service's are %d) forwarded to %d", len(c.ID), r.codec.Len(), d.Ordinal)
			case !routable:
				t.Fatalf("unroutable CID datagram forwarded to %d", d.Ordinal)
			case d.Ordinal != ord:
				t.Fatalf("CID datagram of ordinal %d went to %d", ord, d.Ordinal)
			}
		case c.Kind == KindNew && len(c.ID) == r.codec.Len() && routable && d.Ordinal == ord:
			// a server CID in an Initial: its own (serving) backend
		default:
			if be.State != registry.Ready {
				t.Fatalf("hashed datagram sent to a %v backend", be.State)
			}
		}
		h, off, err := ppv2.Parse(append(hdr, b...))
		if err != nil || off != len(hdr) || h.Src != client || h.Dst != svcAddr {
			t.Fatalf("header %x: %+v %d %v", hdr, h, off, err)
		}
	})
}

// spentAdmission returns limits of 1 handshake and 1 0-RTT datagram per
// second whose budgets are spent at time 0.
func spentAdmission() *Admission {
	a := NewAdmission(Limits{HandshakePPS: 1, ZeroRTTPPS: 1}, 1)
	a.Admit(Class{Handshake: true, ZeroRTT: true}, client1, 0)
	return a
}

type opaqueCodec struct{ CIDCodec }

type opaqueEncoder struct{ Encoder }

func equalClass(a, b Class) bool {
	return a.Kind == b.Kind && bytes.Equal(a.ID, b.ID) && a.Handshake == b.Handshake && a.ZeroRTT == b.ZeroRTT
}

// FuzzReply checks the reverse rule on arbitrary replies from an arbitrary
// sender: nothing is relayed unless the sender is a backend, the header's
// source is the service and the destination a valid client, never one of
// the process's own addresses (its sockets, and a wildcard-bound socket's
// port on any address of the host); the payload is the datagram after the
// header, and not empty.
func FuzzReply(f *testing.F) {
	good, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: svcAddr, Dst: client1})
	f.Add(append(good, "hi"...), []byte{1, 0, 1}, uint8(1))
	f.Add(append(good, "hi"...), []byte{1, 0, 1}, uint8(2))
	f.Add(good, []byte{1, 0, 1}, uint8(1)) // no payload
	bad, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: svcAddr, Dst: netip.MustParseAddrPort("224.0.0.1:1")})
	f.Add(bad, []byte{1, 1, 1}, uint8(1))
	f.Add([]byte("no header"), []byte{1, 0, 1}, uint8(1))
	for _, dst := range []string{"198.51.100.7:7000", "203.0.113.5:7000", "198.51.100.9:4000", "[2001:db8::1]:443"} {
		h, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: svcAddr, Dst: netip.MustParseAddrPort(dst)})
		f.Add(append(h, "x"...), []byte{1, 0, 1}, uint8(1))
	}
	own := NewOwnAddrs([]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:7000"), netip.MustParseAddrPort("198.51.100.9:4000")},
		[]netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("203.0.113.5")})
	f.Fuzz(func(t *testing.T, b, regBytes []byte, sender uint8) {
		reg := fuzzRegistry(t, regBytes)
		r, err := NewRouter(RouterConfig{Protocol: DTLS, PublicAddr: svcAddr, Backends: reg})
		if err != nil {
			t.Fatal(err)
		}
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, sender, 1}), 5684)
		v := r.View(own)
		rep := r.Reverse(b, from, Session{}, &v)
		if rep.Reason != Forwarded {
			return
		}
		if !v.Snapshot.IsBackend(from) {
			t.Fatalf("relayed a reply from %v, not a backend", from)
		}
		h, off, err := ppv2.Parse(b)
		if err != nil || h.Src != svcAddr || off != len(b)-len(rep.Payload) {
			t.Fatalf("relayed a reply whose header is %+v, %v", h, err)
		}
		ip := rep.Client.Addr()
		if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() || ip == limitedBroadcast ||
			rep.Client.Port() == 0 || rep.Client == svcAddr || !ip.Is4() || own.Contains(rep.Client) {
			t.Fatalf("relayed to %v", rep.Client)
		}
		if len(rep.Payload) == 0 || !bytes.HasSuffix(b, rep.Payload) || !ppv2.Sniff(b) || rep.Local.IsValid() {
			t.Fatalf("payload is not the datagram's non-empty tail")
		}
	})
}
