package quic

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

const goldenOrdinal = 3 // the quicgo_* captures used LB{} with ordinal 3

type classWant struct {
	kind    Kind
	typ     PacketType
	version uint32
	initial bool
	zeroRTT bool
	packets int // 0: not checked (depends on how quic-go packed it)
	padding int
	dcid    []byte // nil: not checked
	ordinal bool   // DCID must decode to goldenOrdinal with LB{}
}

func checkClass(t *testing.T, c Class, w classWant) {
	t.Helper()
	if c.Kind != w.kind || c.Type != w.typ || c.Version != w.version || c.Initial != w.initial || c.ZeroRTT != w.zeroRTT ||
		c.Padding != w.padding || (w.packets != 0 && c.Packets != w.packets) {
		t.Fatalf("Classify = {Kind %v Type %v Version %#x Initial %v ZeroRTT %v Packets %d Padding %d}, want %+v",
			c.Kind, c.Type, c.Version, c.Initial, c.ZeroRTT, c.Packets, c.Padding, w)
	}
	if w.dcid != nil && !bytes.Equal(c.DCID, w.dcid) {
		t.Fatalf("DCID = %x, want %x", c.DCID, w.dcid)
	}
	if w.ordinal {
		if ord, ok := (LB{}).Ordinal(c.DCID); !ok || ord != goldenOrdinal {
			t.Fatalf("DCID %x decodes to %d, %v", c.DCID, ord, ok)
		}
	}
}

// Real datagrams: the RFC vectors and quic-go captures in testdata.
func TestClassifyGolden(t *testing.T) {
	rfcDCID := testtool.Hex(t, "8394c8f03e515708")
	initial1 := readHex(t, "quicgo_initial_1")
	first, err := ParseHeader(initial1, 12)
	if err != nil {
		t.Fatal(err)
	}
	clientDCID := first.DCID

	tests := []struct {
		file    string
		cidLen  int
		want    classWant
		wantErr error
	}{
		{file: "rfc9001_client_initial", cidLen: 12, want: classWant{KindNew, Initial, Version1, true, false, 1, 0, rfcDCID, false}},
		{file: "rfc9369_client_initial", cidLen: 12, want: classWant{KindNew, Initial, Version2, true, false, 1, 0, rfcDCID, false}},
		{file: "rfc9001_chacha20_short", cidLen: 0, want: classWant{KindEstablished, Short, 0, false, false, 1, 0, []byte{}, false}},
		// Server-sent packets are not routed from clients.
		{file: "rfc9001_retry", cidLen: 12, wantErr: ErrServerOnly},
		{file: "rfc9369_retry", cidLen: 12, wantErr: ErrServerOnly},
		// A server Initial is a valid packet but too small a datagram for a
		// client Initial.
		{file: "rfc9001_server_initial", cidLen: 12, wantErr: ErrInitialSize},
		{file: "rfc9369_server_initial", cidLen: 12, wantErr: ErrInitialSize},

		// quic-go v0.65.0 client, post-quantum ClientHello in two Initial
		// datagrams that share the client's random DCID.
		{file: "quicgo_initial_1", cidLen: 12, want: classWant{KindNew, Initial, Version1, true, false, 1, 0, clientDCID, false}},
		{file: "quicgo_initial_2", cidLen: 12, want: classWant{KindNew, Initial, Version1, true, false, 1, 0, clientDCID, false}},
		// Initial ACK + Handshake (Finished) + 1-RTT, already to a server CID.
		{file: "quicgo_initial_coalesced", cidLen: 12, want: classWant{KindNew, Initial, Version1, true, false, 3, 0, nil, true}},
		{file: "quicgo_handshake", cidLen: 12, want: classWant{KindEstablished, Handshake, Version1, false, false, 0, 0, nil, true}},
		{file: "quicgo_short", cidLen: 12, want: classWant{KindEstablished, Short, 0, false, false, 1, 0, nil, true}},
		// Resumed session: Initial and 0-RTT coalesced, then 0-RTT alone,
		// both to the client's random DCID.
		{file: "quicgo_initial_0rtt", cidLen: 12, want: classWant{KindNew, Initial, Version1, true, true, 2, 0, nil, false}},
		{file: "quicgo_0rtt", cidLen: 12, want: classWant{KindNew, ZeroRTT, Version1, false, true, 1, 0, nil, false}},
		// The short packet read with the wrong CID length still parses (the
		// length is not on the wire) but gives a different DCID.
		{file: "quicgo_short", cidLen: 8, want: classWant{KindEstablished, Short, 0, false, false, 1, 0, nil, false}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b := readHex(t, tt.file)
			c, err := Classify(b, tt.cidLen)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if c.Kind != 0 || c.DCID != nil || c.Packets != 0 {
					t.Fatalf("Class not zero on error: %+v", c)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkClass(t, c, tt.want)
		})
	}

	// The Initial+0-RTT datagram and the lone 0-RTT datagram belong to one
	// connection attempt: same DCID, so hashing sends them to one backend.
	a, _ := Classify(readHex(t, "quicgo_initial_0rtt"), 12)
	z, _ := Classify(readHex(t, "quicgo_0rtt"), 12)
	if !bytes.Equal(a.DCID, z.DCID) {
		t.Fatalf("0-RTT DCID %x differs from Initial's %x", z.DCID, a.DCID)
	}
}

func TestClassifySynthetic(t *testing.T) {
	dcid := seq(12, 0x10)
	other := seq(12, 0x30)
	scid := seq(8, 0x50)
	pad := func(b []byte, n int) []byte { return append(b, make([]byte, n-len(b))...) }
	v1Initial := func(payload int) []byte { return long(0xc0, Version1, dcid, scid, nil, true, payload) }
	v1ZeroRTT := long(0xd0, Version1, dcid, scid, nil, false, 100)
	v1Handshake := long(0xe0, Version1, dcid, scid, nil, false, 60)
	v2Initial := long(0xd0, Version2, dcid, scid, []byte("tok"), true, 1200)
	v2ZeroRTT := long(0xe0, Version2, dcid, scid, nil, false, 40)
	v2Handshake := long(0xf0, Version2, dcid, scid, nil, false, 40)
	oneRTT := short(dcid, 30)
	unknown := long(0xc0, 0x1a2a3a4a, bytes.Repeat([]byte{7}, 255), bytes.Repeat([]byte{8}, 255), nil, false, -1)
	unknown = append(unknown, make([]byte, 900)...)

	tests := []struct {
		name    string
		b       []byte
		want    classWant
		wantErr error
	}{
		{"v1 Initial", v1Initial(1200), classWant{KindNew, Initial, Version1, true, false, 1, 0, dcid, false}, nil},
		{"v1 Initial+0-RTT", cat(v1Initial(1100), v1ZeroRTT), classWant{KindNew, Initial, Version1, true, true, 2, 0, dcid, false}, nil},
		{"v1 0-RTT alone", v1ZeroRTT, classWant{KindNew, ZeroRTT, Version1, false, true, 1, 0, dcid, false}, nil},
		{"v1 Initial+Handshake+short", cat(v1Initial(1100), v1Handshake, oneRTT), classWant{KindNew, Initial, Version1, true, false, 3, 0, dcid, false}, nil},
		{"v1 Handshake+short", cat(v1Handshake, oneRTT), classWant{KindEstablished, Handshake, Version1, false, false, 2, 0, dcid, false}, nil},
		{"v1 Handshake then Initial", pad(cat(v1Handshake, v1Initial(100)), 1200), classWant{KindEstablished, Handshake, Version1, true, false, 2, 1200 - len(v1Handshake) - len(v1Initial(100)), dcid, false}, nil},
		{"v2 Initial", v2Initial, classWant{KindNew, Initial, Version2, true, false, 1, 0, dcid, false}, nil},
		{"v2 Initial+0-RTT", cat(v2Initial, v2ZeroRTT), classWant{KindNew, Initial, Version2, true, true, 2, 0, dcid, false}, nil},
		{"v2 Handshake", v2Handshake, classWant{KindEstablished, Handshake, Version2, false, false, 1, 0, dcid, false}, nil},
		{"short", oneRTT, classWant{KindEstablished, Short, 0, false, false, 1, 0, dcid, false}, nil},
		{"short greased fixed bit", append([]byte{0x01}, oneRTT[1:]...), classWant{KindEstablished, Short, 0, false, false, 1, 0, dcid, false}, nil},
		{"unknown version, 255-byte CIDs", unknown, classWant{KindNew, UnknownVersion, 0x1a2a3a4a, false, false, 1, 0, bytes.Repeat([]byte{7}, 255), false}, nil},
		{"Initial + zero padding", pad(v1Initial(600), 1252), classWant{KindNew, Initial, Version1, true, false, 1, 1252 - len(v1Initial(600)), dcid, false}, nil},
		{"Initial+0-RTT + zero padding", pad(cat(v1Initial(600), v1ZeroRTT), 1300), classWant{KindNew, Initial, Version1, true, true, 2, 1300 - 600 - len(v1ZeroRTT) - len(v1Initial(0)), dcid, false}, nil},

		{"empty", nil, classWant{}, ErrTooShort},
		{"Initial under 1200", v1Initial(1000), classWant{}, ErrInitialSize},
		{"v1 Version Negotiation", cat([]byte{0x80, 0, 0, 0, 0, 4, 1, 2, 3, 4, 0}, []byte{0, 0, 0, 1}), classWant{}, ErrServerOnly},
		{"v1 Retry", cat(long(0xf0, Version1, dcid, scid, nil, false, -1), []byte("token"), make([]byte, 16)), classWant{}, ErrServerOnly},
		{"v2 Retry", cat(long(0xc0, Version2, dcid, scid, nil, false, -1), make([]byte, 16)), classWant{}, ErrServerOnly},
		{"Retry after Initial", cat(v1Initial(1100), long(0xf0, Version1, dcid, scid, nil, false, -1), make([]byte, 16)), classWant{}, ErrServerOnly},
		{"coalesced DCID mismatch", cat(v1Initial(1100), long(0xd0, Version1, other, scid, nil, false, 100)), classWant{}, ErrDCIDMismatch},
		{"short after Handshake, other DCID", cat(v1Handshake, short(other, 30)), classWant{}, ErrDCIDMismatch},
		{"trailing junk", cat(v1Initial(1200), []byte{0, 0, 1}), classWant{}, ErrTooShort},
		{"trailing long header junk", cat(v1Initial(1200), []byte{0xc0, 0, 0}), classWant{}, ErrTruncated},
		{"v1 DCID of 21 bytes", long(0xc0, Version1, seq(21, 0), scid, nil, true, 1200), classWant{}, ErrCIDLength},
		{"v2 SCID of 21 bytes", long(0xe0, Version2, dcid, seq(21, 0), nil, false, 1200), classWant{}, ErrCIDLength},
		{"Length past the end", v1Initial(1200)[:1100], classWant{}, ErrTruncated},
		{"Length under 20", long(0xe0, Version1, dcid, scid, nil, false, 19), classWant{}, ErrTooShort},
		{"short without sample", short(dcid, 19), classWant{}, ErrTooShort},
		{"long header cut in the CIDs", v1Initial(1200)[:10], classWant{}, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Classify(tt.b, 12)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkClass(t, c, tt.want)
		})
	}
}

// TestStartsSession: an Initial or 0-RTT packet anywhere in the walk starts
// a session, whatever packet comes first (issue 15: a Handshake packet in
// front used to hide them from the proxy's limits).
func TestStartsSession(t *testing.T) {
	dcid, scid := seq(12, 0x10), seq(8, 0x50)
	pad := func(b []byte) []byte { return append(b, make([]byte, max(0, 1200-len(b)))...) }
	initial := long(0xc0, Version1, dcid, scid, nil, true, 100)
	zeroRTT := long(0xd0, Version1, dcid, scid, nil, false, 100)
	handshake := long(0xe0, Version1, dcid, scid, nil, false, 60)
	for _, tc := range []struct {
		name               string
		b                  []byte
		handshake, session bool
	}{
		{"Initial", pad(initial), true, true},
		{"0-RTT", zeroRTT, false, true},
		{"Handshake", handshake, false, false},
		{"short", short(dcid, 30), false, false},
		{"Handshake then Initial", pad(cat(handshake, initial)), true, true},
		{"Handshake then 0-RTT", cat(handshake, zeroRTT), false, true},
		{"Handshake then 0-RTT then short", cat(handshake, zeroRTT, short(dcid, 30)), false, true},
		{"unknown version", pad(long(0xc0, 0x1a2a3a4a, dcid, scid, nil, false, -1)), true, true},
		// Rejected by Classify (an Initial under 1200 bytes), but a server
		// that processes packets one by one might act on the Initial.
		{"small Initial", initial, false, true},
		{"Handshake then small Initial", cat(handshake, initial), false, true},
		{"Handshake then junk", cat(handshake, []byte{0xc0, 0, 0}), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Classify(tc.b, 12)
			if err == nil && (c.StartsHandshake() != tc.handshake || c.StartsSession() != tc.session) {
				t.Fatalf("StartsHandshake %v StartsSession %v, want %v %v", c.StartsHandshake(), c.StartsSession(), tc.handshake, tc.session)
			}
			if got := StartsSession(tc.b, 12); got != tc.session {
				t.Fatalf("StartsSession(b) = %v, want %v (Classify: %v)", got, tc.session, err)
			}
		})
	}
}

// Every prefix and every one-byte corruption of the real datagrams gives a
// result or an error, never a panic or a view outside the buffer.
func TestClassifyMutations(t *testing.T) {
	for _, name := range goldenFiles {
		b := readHex(t, name)
		for n := 0; n <= len(b); n++ {
			p := b[:n:n]
			if c, err := Classify(p, 12); err == nil {
				checkViews(t, p, c.DCID)
			}
		}
		m := append([]byte(nil), b...)
		for i := range min(len(m), 80) {
			for _, x := range []byte{0x00, 0xff, 0x40, 0x80} {
				old := m[i]
				m[i] = x
				if c, err := Classify(m, 12); err == nil {
					checkViews(t, m, c.DCID)
				}
				m[i] = old
			}
		}
	}
}

var goldenFiles = []string{
	"rfc9001_client_initial", "rfc9369_client_initial", "rfc9001_server_initial", "rfc9369_server_initial",
	"rfc9001_retry", "rfc9369_retry", "rfc9001_chacha20_short",
	"quicgo_initial_1", "quicgo_initial_2", "quicgo_initial_coalesced", "quicgo_handshake",
	"quicgo_short", "quicgo_initial_0rtt", "quicgo_0rtt",
}

// checkViews fails unless every view lies inside b's backing array.
func checkViews(t testing.TB, b []byte, views ...[]byte) {
	t.Helper()
	for _, v := range views {
		if len(v) == 0 {
			continue
		}
		if len(v) > len(b) || !overlaps(b, v) {
			t.Fatalf("view of %d bytes not inside the %d-byte buffer", len(v), len(b))
		}
	}
}

func overlaps(b, v []byte) bool {
	for i := 0; i+len(v) <= len(b); i++ {
		if &b[i] == &v[0] {
			return true
		}
	}
	return false
}
