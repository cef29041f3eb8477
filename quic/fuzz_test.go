package quic

import (
	"bytes"
	"testing"
)

// Seeds live in testdata/fuzz/<Name>/ (captured datagrams and RFC vectors);
// go test runs them. Longer runs, one target or all of them:
//
//	go test -run '^$' -fuzz '^FuzzClassify$' -fuzztime 10m ./quic
//	bash .ci/fuzz 10m ./quic

func FuzzParseHeader(f *testing.F) {
	f.Add([]byte{0x41, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(8))
	f.Fuzz(func(t *testing.T, b []byte, cidLen uint8) {
		h, err := ParseHeader(b, int(cidLen))
		if err != nil {
			return
		}
		if h.Len <= 0 || h.Len > len(b) {
			t.Fatalf("Len %d of %d", h.Len, len(b))
		}
		checkViews(t, b[:h.Len], h.DCID, h.SCID, h.Token)
		switch h.Type {
		case Initial, ZeroRTT, Handshake, Retry:
			if h.Version != Version1 && h.Version != Version2 {
				t.Fatalf("%v with version %#x", h.Type, h.Version)
			}
			if len(h.DCID) > MaxCIDLen || len(h.SCID) > MaxCIDLen {
				t.Fatal("v1/v2 CID over 20 bytes")
			}
		case Short:
			if IsLong(b[0]) || len(h.DCID) != int(cidLen) || h.Len != len(b) {
				t.Fatalf("short: %+v", h)
			}
		case VersionNegotiation, UnknownVersion:
			if h.Len != len(b) {
				t.Fatal("invariants-only packet does not run to the end")
			}
		default:
			t.Fatalf("type %v", h.Type)
		}
		// The packet alone parses the same.
		h2, err := ParseHeader(b[:h.Len], int(cidLen))
		if err != nil || h2.Type != h.Type || h2.Len != h.Len || !bytes.Equal(h2.DCID, h.DCID) {
			t.Fatalf("re-parse of the packet alone: %+v, %v", h2, err)
		}
	})
}

func FuzzClassify(f *testing.F) {
	f.Add([]byte{0x41, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(8))
	f.Fuzz(func(t *testing.T, b []byte, cidLen uint8) {
		c, err := Classify(b, int(cidLen))
		if err != nil {
			// Rejected: it starts a session exactly when a packet that
			// parses before the fault would.
			starts := false
			for off := 0; off < len(b) && !starts; {
				h, herr := ParseHeader(b[off:], int(cidLen))
				if herr != nil {
					break
				}
				starts = h.Type == Initial || h.Type == ZeroRTT || h.Type == UnknownVersion
				off += h.Len
			}
			if StartsSession(b, int(cidLen)) != starts {
				t.Fatalf("rejected datagram (%v): StartsSession %v, re-walk %v", err, !starts, starts)
			}
			return
		}
		checkViews(t, b, c.DCID)
		if c.Packets < 1 || c.Padding < 0 {
			t.Fatalf("%+v", c)
		}
		if c.Initial && len(b) < MinInitialDatagram {
			t.Fatal("Initial in a small datagram")
		}
		// Walk it again with ParseHeader: every packet parses, shares the
		// DCID, and packets plus padding cover the datagram.
		off, n := 0, 0
		var initial, zeroRTT bool
		for off < len(b)-c.Padding {
			h, err := ParseHeader(b[off:], int(cidLen))
			if err != nil {
				t.Fatalf("packet %d at %d: %v", n, off, err)
			}
			if n == 0 && h.Type != c.Type {
				t.Fatalf("first type %v, Class says %v", h.Type, c.Type)
			}
			if !bytes.Equal(h.DCID, c.DCID) {
				t.Fatal("DCIDs differ")
			}
			initial = initial || h.Type == Initial
			zeroRTT = zeroRTT || h.Type == ZeroRTT
			off += h.Len
			n++
		}
		if off != len(b)-c.Padding || n != c.Packets || initial != c.Initial || zeroRTT != c.ZeroRTT {
			t.Fatalf("re-walk: %d packets to %d, Class %+v", n, off, c)
		}
		if starts := initial || zeroRTT || c.Type == UnknownVersion; starts != c.StartsSession() || starts != StartsSession(b, int(cidLen)) {
			t.Fatalf("a packet that starts a session: %v, Class.StartsSession %v, StartsSession %v", starts, c.StartsSession(), StartsSession(b, int(cidLen)))
		}
		if !allZero(b[off:]) {
			t.Fatal("padding not zero")
		}
		want := KindEstablished
		if c.Type == Initial || c.Type == ZeroRTT || c.Type == UnknownVersion {
			want = KindNew
		}
		if c.Kind != want {
			t.Fatalf("kind %v for %v", c.Kind, c.Type)
		}
	})
}

func FuzzLB(f *testing.F) {
	f.Add(uint8(3), 12, uint8(0), false, []byte{0x03, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add(uint8(254), 20, uint8(6), true, []byte{0xd3, 254})
	f.Fuzz(func(t *testing.T, ordinal uint8, length int, config uint8, self bool, cid []byte) {
		l := LB{Length: length, ConfigID: config, SelfEncodeLength: self}
		// Decoding arbitrary bytes never panics and only succeeds for CIDs of
		// the configured shape.
		if ord, ok := l.Ordinal(cid); ok {
			if len(cid) != l.Len() || cid[0]>>5 != config || ord != cid[1] {
				t.Fatalf("%+v decoded %x", l, cid)
			}
		}
		out, err := l.AppendCID(nil, ordinal)
		if err != nil {
			if l.Validate() == nil && ordinal != 255 {
				t.Fatalf("%+v: %v", l, err)
			}
			return
		}
		got, ok := l.Ordinal(out)
		if !ok || got != ordinal || len(out) != l.Len() {
			t.Fatalf("%+v: %x decodes to %d, %v", l, out, got, ok)
		}
	})
}
