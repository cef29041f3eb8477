package quic

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

// draft-ietf-quic-load-balancers-21, Appendix B "Load Balancer Test
// Vectors". "In all cases, the server is configured to encode the CID
// length."
//
// B.1 (unencrypted) row 2 is printed as
//
//	1 350d28b420 3487d970b 20a350d28b4203487d970b
//
// which is not well-formed: the nonce has 9 hex digits and the CID does not
// start with a valid first octet for config 1 and length 11 (0x2a). It
// reads as octets printed without zero padding: first octet "20"|"a"
// (0x20|0x0a), nonce 34 87 d9 70 "b" (0x0b). The row below is that reading;
// the first row is used as printed.
var draftPlaintext = []struct {
	cr         uint8
	sid, nonce string
	cid        string
}{
	{0, "c4605e", "4504cc4f", "07c4605e4504cc4f"},
	{1, "350d28b420", "3487d9700b", "2a350d28b4203487d9700b"},
}

func TestLBDraftVectors(t *testing.T) {
	for _, v := range draftPlaintext {
		cid, sid, nonce := testtool.Hex(t, v.cid), testtool.Hex(t, v.sid), testtool.Hex(t, v.nonce)
		if len(cid) != 1+len(sid)+len(nonce) || !bytes.Equal(cid[1:], cat(sid, nonce)) {
			t.Fatalf("%s: not first octet || sid || nonce", v.cid)
		}
		if cid[0]>>5 != v.cr || int(cid[0]&0x1f) != len(cid)-1 {
			t.Fatalf("%s: first octet %#x: config %d, length %d", v.cid, cid[0], cid[0]>>5, cid[0]&0x1f)
		}
		got, ok := lbServerID(cid, v.cr, len(sid), len(nonce), true)
		if !ok || !bytes.Equal(got, sid) {
			t.Fatalf("%s: server ID %x, %v; want %s", v.cid, got, ok, v.sid)
		}
		// Another configuration does not decode it.
		if _, ok := lbServerID(cid, v.cr+1, len(sid), len(nonce), true); ok {
			t.Fatalf("%s decoded with config %d", v.cid, v.cr+1)
		}
		if _, ok := lbServerID(cid, v.cr, len(sid), len(nonce)+1, true); ok {
			t.Fatalf("%s decoded with the wrong length", v.cid)
		}
	}
	// The printed form of row 2 fails the self-encoded length check, which
	// is how the reading above was found.
	if _, ok := lbServerID(testtool.Hex(t, "20a350d28b4203487d970b"), 1, 5, 5, true); ok {
		t.Fatal("malformed draft row decoded")
	}
}

func TestLBRoundTrip(t *testing.T) {
	for _, l := range []LB{{}, {Length: 6}, {Length: 8, ConfigID: 6}, {Length: 20, ConfigID: 3, SelfEncodeLength: true}, {ConfigID: 1, SelfEncodeLength: true}} {
		seen := map[string]bool{}
		for ord := range 255 {
			cid, err := l.AppendCID(nil, uint8(ord))
			if err != nil {
				t.Fatal(err)
			}
			if len(cid) != l.Len() || cid[0]>>5 != l.ConfigID || cid[l.OrdinalOffset()] != uint8(ord) {
				t.Fatalf("%+v: %x", l, cid)
			}
			if l.SelfEncodeLength && int(cid[0]&0x1f) != l.Len()-1 {
				t.Fatalf("%+v: length bits in %x", l, cid)
			}
			got, ok := l.Ordinal(cid)
			if !ok || got != uint8(ord) {
				t.Fatalf("%+v: Ordinal(%x) = %d, %v", l, cid, got, ok)
			}
			if seen[string(cid[2:])] {
				t.Fatalf("%+v: nonce repeated", l)
			}
			seen[string(cid[2:])] = true
		}
	}
	// AppendCID appends.
	b, err := LB{}.AppendCID([]byte("xy"), 9)
	if err != nil || len(b) != 14 || string(b[:2]) != "xy" || b[3] != 9 {
		t.Fatalf("%x %v", b, err)
	}
}

func TestLBErrors(t *testing.T) {
	for _, l := range []LB{{Length: 5}, {Length: 21}, {Length: -1}, {ConfigID: 7}, {ConfigID: 200}} {
		if _, err := l.AppendCID(nil, 1); !errors.Is(err, ErrLBConfig) {
			t.Errorf("%+v: %v", l, err)
		}
		if l.Validate() == nil {
			t.Errorf("%+v validates", l)
		}
		if _, ok := l.Ordinal(make([]byte, 12)); ok {
			t.Errorf("%+v decodes", l)
		}
	}
	dst := []byte("keep")
	if b, err := (LB{}).AppendCID(dst, 255); !errors.Is(err, ErrReservedOrdinal) || string(b) != "keep" {
		t.Fatalf("ordinal 255: %q %v", b, err)
	}
}

func TestLBOrdinalUnroutable(t *testing.T) {
	cid := func(b0 byte, n int) []byte { c := seq(n, 0x20); c[0] = b0; c[1] = 42; return c }
	tests := []struct {
		name string
		l    LB
		cid  []byte
		ok   bool
	}{
		{"config 0", LB{}, cid(0x1f, 12), true},
		{"config 0b111 is unroutable", LB{}, cid(0xe0, 12), false},
		{"other config is unroutable", LB{}, cid(0x20, 12), false},
		{"configured 5", LB{ConfigID: 5}, cid(0xa3, 12), true},
		{"configured 5, CID says 0", LB{ConfigID: 5}, cid(0x03, 12), false},
		{"too short", LB{}, cid(0x00, 11), false},
		{"too long", LB{}, cid(0x00, 13), false},
		{"empty", LB{}, nil, false},
		{"one octet", LB{}, []byte{0}, false},
		{"self-encoded length matches", LB{SelfEncodeLength: true}, cid(0x0b, 12), true},
		{"self-encoded length wrong", LB{SelfEncodeLength: true}, cid(0x0c, 12), false},
		{"random low bits ignored", LB{}, cid(0x0c, 12), true},
	}
	for _, tt := range tests {
		ord, ok := tt.l.Ordinal(tt.cid)
		if ok != tt.ok || (ok && ord != 42) {
			t.Errorf("%s: Ordinal(%x) = %d, %v", tt.name, tt.cid, ord, ok)
		}
	}
	// 255 decodes; the router treats it as reserved.
	if ord, ok := (LB{}).Ordinal(cid(0, 12)[:1:1]); ok {
		t.Fatal(ord)
	}
	c := cid(0, 12)
	c[1] = 255
	if ord, ok := (LB{}).Ordinal(c); !ok || ord != 255 {
		t.Fatalf("255: %d %v", ord, ok)
	}
}

func TestCheckServerCIDLen(t *testing.T) {
	for n := -1; n <= MaxCIDLen+1; n++ {
		err := CheckServerCIDLen(n)
		switch {
		case n < 1 || n > MaxCIDLen:
			if !errors.Is(err, ErrCIDLength) {
				t.Errorf("%d: %v", n, err)
			}
		case n == MinInitialDCIDLen:
			if !errors.Is(err, ErrServerCIDLen) {
				t.Errorf("%d: %v", n, err)
			}
		case err != nil:
			t.Errorf("%d: %v", n, err)
		}
	}
	if CheckServerCIDLen(LBDefaultLen) != nil {
		t.Error("the default length is refused")
	}
}
