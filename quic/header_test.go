package quic

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

func TestParseHeaderRFC(t *testing.T) {
	empty := []byte{}
	srvCID := testtool.Hex(t, "f067a5502a4262b5")
	tests := []struct {
		file  string
		typ   PacketType
		ver   uint32
		dcid  []byte
		scid  []byte
		token []byte
		len   int
	}{
		// 0x449e = Length 1182 in a 2-byte varint, after an 18-byte header.
		{"rfc9001_client_initial", Initial, Version1, testtool.Hex(t, "8394c8f03e515708"), empty, empty, 1200},
		{"rfc9369_client_initial", Initial, Version2, testtool.Hex(t, "8394c8f03e515708"), empty, empty, 1200},
		{"rfc9001_server_initial", Initial, Version1, empty, srvCID, empty, 135},
		{"rfc9369_server_initial", Initial, Version2, empty, srvCID, empty, 135},
		{"rfc9001_retry", Retry, Version1, empty, srvCID, []byte("token"), 36},
		{"rfc9369_retry", Retry, Version2, empty, srvCID, []byte("token"), 36},
		{"rfc9001_chacha20_short", Short, 0, empty, nil, nil, 21},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b := readHex(t, tt.file)
			h, err := ParseHeader(b, 0)
			if err != nil {
				t.Fatal(err)
			}
			if h.Type != tt.typ || h.Version != tt.ver || h.Len != tt.len || !bytes.Equal(h.DCID, tt.dcid) ||
				!bytes.Equal(h.SCID, tt.scid) || !bytes.Equal(h.Token, tt.token) || (tt.scid == nil) != (h.SCID == nil) {
				t.Fatalf("ParseHeader = %+v", h)
			}
			checkViews(t, b, h.DCID, h.SCID, h.Token)
		})
	}
}

// The two type bits mean different things in v1 and v2 (RFC 9369 §3.2).
func TestPacketTypeBits(t *testing.T) {
	want := map[uint32][4]PacketType{
		Version1: {Initial, ZeroRTT, Handshake, Retry},
		Version2: {Retry, Initial, ZeroRTT, Handshake},
	}
	for ver, types := range want {
		for bits, typ := range types {
			b := long(0xc0|byte(bits)<<4, ver, seq(8, 1), seq(4, 9), nil, typ == Initial, 1200)
			if typ == Retry {
				b = cat(long(0xc0|byte(bits)<<4, ver, seq(8, 1), seq(4, 9), nil, false, -1), make([]byte, 16))
			}
			h, err := ParseHeader(b, 8)
			if err != nil {
				t.Fatalf("version %#x bits %d: %v", ver, bits, err)
			}
			if h.Type != typ {
				t.Errorf("version %#x bits %d: type %v, want %v", ver, bits, h.Type, typ)
			}
		}
	}
}

func TestParseHeaderTokenAndVarints(t *testing.T) {
	tok := seq(300, 0)
	b := long(0xc0, Version1, seq(8, 1), seq(8, 1), tok, true, 1200)
	h, err := ParseHeader(b, 8)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Token, tok) || h.Len != len(b) {
		t.Fatalf("token %d bytes, Len %d of %d", len(h.Token), h.Len, len(b))
	}

	// 1-, 4- and 8-byte varints for Token Length and Length.
	hdr := []byte{0xc0, 0, 0, 0, 1, 1, 0xaa, 0}
	for _, tc := range []struct {
		tokLen, length []byte
		tok, pl        int
	}{
		{[]byte{0x02}, []byte{0x14}, 2, 20},
		{[]byte{0x80, 0, 0, 0x02}, []byte{0x80, 0, 0, 0x30}, 2, 48},
		{[]byte{0xc0, 0, 0, 0, 0, 0, 0, 0}, []byte{0xc0, 0, 0, 0, 0, 0, 0, 0x15}, 0, 21},
	} {
		b := cat(hdr, tc.tokLen, make([]byte, tc.tok), tc.length, make([]byte, tc.pl))
		h, err := ParseHeader(b, 0)
		if err != nil || len(h.Token) != tc.tok || h.Len != len(b) {
			t.Fatalf("%x: %+v, %v", b, h, err)
		}
	}
	// A huge 8-byte Length does not overflow into a valid packet.
	b = cat(hdr, []byte{0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, make([]byte, 40))
	if _, err := ParseHeader(b, 0); !errors.Is(err, ErrTruncated) {
		t.Fatalf("huge Length: %v", err)
	}
}

func TestParseHeaderErrors(t *testing.T) {
	tests := []struct {
		name   string
		b      []byte
		cidLen int
		want   error
	}{
		{"empty", nil, 8, ErrTooShort},
		{"short, CID cut", short(seq(8, 1), 0)[:5], 8, ErrTooShort},
		{"short, negative CID length", short(seq(8, 1), 30), -1, ErrCIDLength},
		{"short, CID length 21", short(seq(8, 1), 30), 21, ErrCIDLength},
		{"long, 6 bytes", []byte{0xc0, 0, 0, 0, 1, 0}, 8, ErrTruncated},
		{"long, no SCID length", []byte{0xc0, 0, 0, 0, 1, 2, 1, 2}, 8, ErrTruncated},
		{"long, SCID cut", []byte{0xc0, 0, 0, 0, 1, 0, 4, 1, 2}, 8, ErrTruncated},
		{"Initial, no token length", []byte{0xc0, 0, 0, 0, 1, 0, 0}, 8, ErrTruncated},
		{"Initial, token cut", []byte{0xc0, 0, 0, 0, 1, 0, 0, 5, 1}, 8, ErrTruncated},
		{"Initial, varint cut", []byte{0xc0, 0, 0, 0, 1, 0, 0, 0, 0x40}, 8, ErrTruncated},
		{"Handshake, no Length", []byte{0xe0, 0, 0, 0, 1, 0, 0}, 8, ErrTruncated},
		{"Retry without tag", cat([]byte{0xf0, 0, 0, 0, 1, 0, 0}, make([]byte, 15)), 8, ErrTruncated},
		{"v1 DCID 21", cat([]byte{0xc0, 0, 0, 0, 1, 21}, make([]byte, 100)), 8, ErrCIDLength},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseHeader(tt.b, tt.cidLen)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// Version Negotiation and unknown versions follow RFC 8999 only: CIDs up to
// 255 bytes, and the packet runs to the end of the datagram.
func TestParseHeaderInvariants(t *testing.T) {
	d, s := bytes.Repeat([]byte{1}, 255), bytes.Repeat([]byte{2}, 200)
	vn := cat([]byte{0x80, 0, 0, 0, 0, 255}, d, []byte{200}, s, []byte{0, 0, 0, 1, 0x6b, 0x33, 0x43, 0xcf})
	h, err := ParseHeader(vn, 8)
	if err != nil || h.Type != VersionNegotiation || !bytes.Equal(h.DCID, d) || !bytes.Equal(h.SCID, s) || h.Len != len(vn) {
		t.Fatalf("VN: %v %v", h.Type, err)
	}
	un := cat([]byte{0xff, 0xfa, 0xce, 0xb0, 0x0c, 255}, d, []byte{200}, s)
	h, err = ParseHeader(un, 8)
	if err != nil || h.Type != UnknownVersion || h.Version != 0xfaceb00c || !bytes.Equal(h.DCID, d) || h.Len != len(un) {
		t.Fatalf("unknown: %+v %v", h.Type, err)
	}
	if _, err := ParseHeader(un[:len(un)-1], 8); !errors.Is(err, ErrTruncated) {
		t.Fatalf("unknown version, SCID cut: %v", err)
	}
}

func TestIsLong(t *testing.T) {
	if !IsLong(0xc0) || !IsLong(0x80) || IsLong(0x40) || IsLong(0x00) {
		t.Fatal("IsLong")
	}
}

func TestStrings(t *testing.T) {
	for typ, s := range map[PacketType]string{Initial: "Initial", ZeroRTT: "0-RTT", Handshake: "Handshake", Retry: "Retry",
		VersionNegotiation: "VersionNegotiation", Short: "Short", UnknownVersion: "UnknownVersion", 0: "Invalid"} {
		if typ.String() != s {
			t.Errorf("%d: %q", typ, typ.String())
		}
	}
	if KindNew.String() != "new" || KindEstablished.String() != "established" || Kind(0).String() != "invalid" {
		t.Error("Kind.String")
	}
}
