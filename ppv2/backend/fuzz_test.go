package backend

import (
	"net/netip"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
)

// FuzzInspect feeds arbitrary datagrams to the receive rules, from a
// trusted and an untrusted sender, under every direct policy. It checks
// that every datagram is counted exactly once and that an accepted proxied
// datagram reports exactly what ppv2.Parse reads.
func FuzzInspect(f *testing.F) {
	h, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client1, Dst: service})
	f.Add(append(h, "payload"...), uint8(0))
	local, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Local})
	f.Add(local, uint8(1))
	f.Add([]byte{}, uint8(2))
	for _, p := range []string{dtlsHello, dtlsAppData, quicInitial, quicShort} {
		f.Add(testtool.ReadHex(f, p), uint8(3))
		f.Add(append(append([]byte(nil), h...), testtool.ReadHex(f, p)...), uint8(4))
	}
	trusted := netip.MustParseAddrPort("10.1.2.3:4000")
	stranger := netip.MustParseAddrPort("203.0.113.9:4000")
	var conns []*Conn
	for _, cfg := range []Config{
		{},
		{Direct: DirectDrop, DropLocal: true},
		{Direct: DirectNoHandshake, Protocol: DTLS},
		{Direct: DirectNoHandshake, Protocol: QUIC},
	} {
		cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		conns = append(conns, newConn(f, cfg))
	}
	f.Fuzz(func(t *testing.T, b []byte, sel uint8) {
		c := conns[int(sel)%len(conns)]
		from := trusted
		if sel&0x80 != 0 {
			from = stranger
		}
		before := c.Stats()
		a, off, ok := c.inspect(b, from)
		after := c.Stats()
		if got := after.Accepted() + after.Dropped() - before.Accepted() - before.Dropped(); got != 1 {
			t.Fatalf("counted %d times", got)
		}
		if !ok {
			return
		}
		if off < 0 || off > len(b) {
			t.Fatalf("payload offset %d of %d", off, len(b))
		}
		if !ppv2.Sniff(b) {
			if off != 0 || a != (Addr{Client: from}) {
				t.Fatalf("direct: %+v at %d", a, off)
			}
			return
		}
		if from != trusted {
			t.Fatal("PPv2 accepted from an untrusted sender")
		}
		hdr, poff, err := ppv2.Parse(b)
		if err != nil || poff != off {
			t.Fatalf("accepted a header Parse rejects (%v) or offset %d != %d", err, off, poff)
		}
		switch hdr.Command {
		case ppv2.Local:
			if a != (Addr{Client: from, Local: true}) {
				t.Fatalf("LOCAL: %+v", a)
			}
		case ppv2.Proxy:
			if a != (Addr{Client: hdr.Src, Service: hdr.Dst, Proxy: from}) {
				t.Fatalf("PROXY: %+v vs %+v", a, hdr)
			}
			// The reply header for it encodes.
			if _, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: a.Service, Dst: a.Client}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
