package ppv2_test

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"net/netip"
	"strings"
	"testing"

	"github.com/cidroute/cidroute/ppv2"
)

// hx decodes hex with spaces and "|" as separators; "SIG" stands for the
// 12-byte signature.
func hx(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.ReplaceAll(s, "SIG", "0d0a0d0a000d0a515549540a")
	s = strings.NewReplacer(" ", "", "|", "", "\n", "", "\t", "").Replace(s)
	b, err := hex.DecodeString(s)
	noErr(t, err)
	return b
}

// crc32c is the reference checksum, computed bit by bit from the
// Castagnoli polynomial, independently of hash/crc32 and the package.
func crc32c(b []byte) uint32 {
	c := ^uint32(0)
	for _, x := range b {
		c ^= uint32(x)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0x82f63b78
			} else {
				c >>= 1
			}
		}
	}
	return ^c
}

// withCRC fills the 4-byte checksum at off of hdr using the reference CRC.
func withCRC(hdr []byte, off int) []byte {
	clear(hdr[off : off+4])
	binary.BigEndian.PutUint32(hdr[off:], crc32c(hdr))
	return hdr
}

func TestReferenceCRC(t *testing.T) {
	equal(t, uint32(0xe3069283), crc32c([]byte("123456789"))) // the CRC-32C check value
	equal(t, crc32.Checksum([]byte("123456789"), crc32.MakeTable(crc32.Castagnoli)), crc32c([]byte("123456789")))
}

var (
	cli4 = netip.MustParseAddrPort("192.0.2.1:51000")
	svc4 = netip.MustParseAddrPort("198.51.100.7:5684")
	cli6 = netip.MustParseAddrPort("[2001:db8::1]:4433")
	svc6 = netip.MustParseAddrPort("[2001:db8::7]:443")
)

const (
	v4block = "c0000201 c6336407 c738 1634"
	v6block = "20010db8000000000000000000000001 20010db8000000000000000000000007 1151 01bb"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    ppv2.Header
		off     int
		wantTLV string // hex of the TLV area
	}{
		{"v4", "SIG 21 12 000c" + v4block + "| 16fefd", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, 28, ""},
		{"v4 no payload", "SIG 21 12 000c" + v4block, ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, 28, ""},
		{"v6", "SIG 21 22 0024" + v6block + "| c0", ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6}, 52, ""},
		{"v6 mapped is unmapped", "SIG 21 22 0024 00000000000000000000ffffc0000201 20010db8000000000000000000000007 c738 01bb",
			ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc6}, 52, ""},
		{"length covers TLVs exactly", "SIG 21 12 0015" + v4block + "| e0 0003 616263 | 04 0000", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, 37, "e00003616263 040000"},
		{"TLVs then payload", "SIG 21 12 0012" + v4block + "| 05 0003 616263 | 17fefd", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, 34, "050003616263"},
		{"local unspec", "SIG 20 00 0000 | 16fefd", ppv2.Header{Command: ppv2.Local}, 16, ""},
		{"local unspec TLVs", "SIG 20 00 0004 | 04 0001 00", ppv2.Header{Command: ppv2.Local}, 20, "04000100"},
		{"local v4 block skipped", "SIG 20 12 0010" + v4block + "| 04 0001 00", ppv2.Header{Command: ppv2.Local}, 32, "04000100"},
		{"local stream, block discarded", "SIG 20 11 0005 0102030405", ppv2.Header{Command: ppv2.Local}, 21, ""},
		{"local unix", "SIG 20 32 00d8" + strings.Repeat("00", 216), ppv2.Header{Command: ppv2.Local}, 232, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := hx(t, tt.in)
			h, off, err := ppv2.Parse(b)
			noErr(t, err)
			equal(t, tt.want.Command, h.Command)
			equal(t, tt.want.Src, h.Src)
			equal(t, tt.want.Dst, h.Dst)
			equal(t, tt.off, off)
			equal(t, hx(t, tt.wantTLV), h.TLVs)
			if len(h.TLVs) > 0 {
				isTrue(t, &b[off-len(h.TLVs)] == &h.TLVs[0], "TLVs must be a view")
			}
		})
	}
}

func TestParseCRC(t *testing.T) {
	hdr := withCRC(hx(t, "SIG 21 12 0013"+v4block+"| 03 0004 00000000"), 31)
	dgram := append(hdr, "payload"...)
	h, off, err := ppv2.Parse(dgram)
	noErr(t, err)
	equal(t, 35, off)
	v, ok := h.TLV(ppv2.TypeCRC32C)
	isTrue(t, ok)
	equal(t, hdr[31:35], v)

	// Any flipped header bit is caught; the payload is not covered.
	for i := 12; i < len(hdr); i++ {
		if i >= 13 && i < 16 || i >= 28 && i < 31 {
			continue // family, length and TLV framing fail earlier, with other errors
		}
		bad := append([]byte(nil), dgram...)
		bad[i] ^= 0x01
		_, _, err := ppv2.Parse(bad)
		errIs(t, err, ppv2.ErrChecksum, "byte %d", i)
	}
	dgram[len(dgram)-1] ^= 0xff
	_, _, err = ppv2.Parse(dgram)
	noErr(t, err)

	// LOCAL headers can carry a CRC too.
	local := withCRC(hx(t, "SIG 20 00 0007 03 0004 00000000"), 19)
	_, _, err = ppv2.Parse(local)
	noErr(t, err)
	local[19]++
	_, _, err = ppv2.Parse(local)
	errIs(t, err, ppv2.ErrChecksum)
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"empty", "", ppv2.ErrTruncated},
		{"signature prefix", "0d0a0d", ppv2.ErrTruncated},
		{"signature, no more", "SIG", ppv2.ErrTruncated},
		{"15 bytes", "SIG 21 12 00", ppv2.ErrTruncated},
		{"DTLS record", "16 fefd 0000 000000000000 0010", ppv2.ErrNoSignature},
		{"short non-signature", "0d0a0d0b", ppv2.ErrNoSignature},
		{"v1 text", hex.EncodeToString([]byte("PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n")), ppv2.ErrNoSignature},
		{"version 1", "SIG 11 12 000c" + v4block, ppv2.ErrVersion},
		{"version 3", "SIG 31 12 000c" + v4block, ppv2.ErrVersion},
		{"command 2", "SIG 22 12 000c" + v4block, ppv2.ErrCommand},
		{"command f", "SIG 2f 12 000c" + v4block, ppv2.ErrCommand},
		{"TCP4", "SIG 21 11 000c" + v4block, ppv2.ErrStream},
		{"TCP6", "SIG 21 21 0024" + v6block, ppv2.ErrStream},
		{"unix dgram", "SIG 21 32 00d8" + strings.Repeat("00", 216), ppv2.ErrFamily},
		{"unix stream", "SIG 21 31 00d8" + strings.Repeat("00", 216), ppv2.ErrFamily},
		{"proxy unspec", "SIG 21 00 0000", ppv2.ErrFamily},
		{"proxy inet transport 0", "SIG 21 10 000c" + v4block, ppv2.ErrFamily},
		{"proxy inet transport 3", "SIG 21 13 000c" + v4block, ppv2.ErrFamily},
		{"proxy family 4", "SIG 21 42 000c" + v4block, ppv2.ErrFamily},
		{"local undefined family", "SIG 20 13 0000", ppv2.ErrFamily},
		{"length past datagram", "SIG 21 12 000d" + v4block, ppv2.ErrTruncated},
		{"length past datagram, v6", "SIG 21 22 0024" + v4block, ppv2.ErrTruncated},
		{"length 65535", "SIG 21 12 ffff" + v4block, ppv2.ErrTruncated},
		{"v4 block short", "SIG 21 12 0008" + v4block, ppv2.ErrFamily},
		{"v6 block short", "SIG 21 22 000c" + v4block, ppv2.ErrFamily},
		{"v4 length 0", "SIG 21 12 0000", ppv2.ErrFamily},
		{"TLV head cut", "SIG 21 12 000e" + v4block + "| 0400", ppv2.ErrTLV},
		{"TLV value past header", "SIG 21 12 0010" + v4block + "| 04 0002 00 | 00", ppv2.ErrTLV},
		{"TLV in local past header", "SIG 20 00 0003 04 0001 | 00", ppv2.ErrTLV},
		{"CRC length 3", "SIG 21 12 0012" + v4block + "| 03 0003 000000", ppv2.ErrTLV},
		{"CRC length 5", "SIG 21 12 0014" + v4block + "| 03 0005 0000000000", ppv2.ErrTLV},
		{"CRC wrong", "SIG 21 12 0013" + v4block + "| 03 0004 00000000", ppv2.ErrChecksum},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, off, err := ppv2.Parse(hx(t, tt.in))
			errIs(t, err, tt.want)
			equal(t, 0, off)
			equal(t, ppv2.Command(0), h.Command)
			isTrue(t, h.TLVs == nil)
		})
	}

	t.Run("duplicate CRC", func(t *testing.T) {
		b := hx(t, "SIG 21 12 001a"+v4block+"| 03 0004 00000000 | 03 0004 00000000")
		_, _, err := ppv2.Parse(b)
		errIs(t, err, ppv2.ErrTLV)
	})
}

func TestSniff(t *testing.T) {
	isTrue(t, ppv2.Sniff([]byte(ppv2.Signature)))
	isTrue(t, ppv2.Sniff(hx(t, "SIG 21 12 000c"+v4block)))
	isTrue(t, !ppv2.Sniff(nil))
	isTrue(t, !ppv2.Sniff([]byte(ppv2.Signature[:11])))
	isTrue(t, !ppv2.Sniff(hx(t, "0d0a0d0a000d0a515549540b 21 12")))
	isTrue(t, !ppv2.Sniff([]byte("\x16\xfe\xfd")))
	equal(t, 12, len(ppv2.Signature))
}

func TestAppendHeader(t *testing.T) {
	tests := []struct {
		name string
		h    ppv2.Header
		want string
		back ppv2.Header // what Parse returns
	}{
		{"v4", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}, "SIG 21 12 000c" + v4block,
			ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}},
		{"v6", ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6}, "SIG 21 22 0024" + v6block,
			ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6}},
		{"mapped both is v4", ppv2.Header{Command: ppv2.Proxy,
			Src: netip.MustParseAddrPort("[::ffff:192.0.2.1]:51000"), Dst: netip.MustParseAddrPort("[::ffff:198.51.100.7]:5684")},
			"SIG 21 12 000c" + v4block, ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}},
		{"mapped and v4 is v4", ppv2.Header{Command: ppv2.Proxy,
			Src: netip.MustParseAddrPort("[::ffff:192.0.2.1]:51000"), Dst: svc4},
			"SIG 21 12 000c" + v4block, ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4}},
		{"v4 src, v6 dst", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc6},
			"SIG 21 22 0024 00000000000000000000ffffc0000201 20010db8000000000000000000000007 c738 01bb",
			ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc6}},
		{"v6 src, v4 dst", ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc4},
			"SIG 21 22 0024 20010db8000000000000000000000001 00000000000000000000ffffc6336407 1151 1634",
			ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc4}},
		{"zone dropped", ppv2.Header{Command: ppv2.Proxy, Src: netip.MustParseAddrPort("[fe80::1%eth0]:1"), Dst: netip.MustParseAddrPort("[fe80::2%eth0]:2")},
			"SIG 21 22 0024 fe800000000000000000000000000001 fe800000000000000000000000000002 0001 0002",
			ppv2.Header{Command: ppv2.Proxy, Src: netip.MustParseAddrPort("[fe80::1]:1"), Dst: netip.MustParseAddrPort("[fe80::2]:2")}},
		{"v4 TLVs", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: hx(t, "e0 0003 616263")},
			"SIG 21 12 0012" + v4block + "| e0 0003 616263",
			ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: hx(t, "e0 0003 616263")}},
		{"local", ppv2.Header{Command: ppv2.Local}, "SIG 20 00 0000", ppv2.Header{Command: ppv2.Local}},
		{"local ignores addresses", ppv2.Header{Command: ppv2.Local, Src: cli4, Dst: svc6}, "SIG 20 00 0000", ppv2.Header{Command: ppv2.Local}},
		{"local TLVs", ppv2.Header{Command: ppv2.Local, TLVs: hx(t, "04 0000")}, "SIG 20 00 0003 04 0000",
			ppv2.Header{Command: ppv2.Local, TLVs: hx(t, "04 0000")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("keep")
			b, err := ppv2.AppendHeader(prefix, tt.h)
			noErr(t, err)
			equal(t, "keep", string(b[:4]))
			want := hx(t, tt.want)
			equal(t, want, b[4:])

			h, off, err := ppv2.Parse(b[4:])
			noErr(t, err)
			equal(t, len(want), off)
			equal(t, tt.back.Command, h.Command)
			equal(t, tt.back.Src, h.Src)
			equal(t, tt.back.Dst, h.Dst)
			equal(t, string(tt.back.TLVs), string(h.TLVs))

			if tt.h.Command == ppv2.Proxy && len(tt.h.TLVs) == 0 {
				p, err := ppv2.AppendProxy([]byte("keep"), tt.h.Src, tt.h.Dst)
				noErr(t, err)
				equal(t, b, p)
			}
		})
	}
}

func TestAppendHeaderCRC(t *testing.T) {
	h := ppv2.Header{Command: ppv2.Proxy, Src: cli6, Dst: svc6, TLVs: hx(t, "05 0002 6869")}
	b, err := ppv2.AppendHeaderCRC([]byte("prefix"), h)
	noErr(t, err)
	hdr := b[6:]
	want := withCRC(hx(t, "SIG 21 22 0030"+v6block+"| 05 0002 6869 | 03 0004 00000000"), 52+5+3)
	equal(t, want, hdr, "checksum covers the header only, not what dst held")

	got, _, err := ppv2.Parse(hdr)
	noErr(t, err)
	equal(t, hdr[52:], []byte(got.TLVs))

	// Re-encoding a parsed header with a CRC TLV keeps one CRC TLV and the
	// same bytes, with either encoder.
	again, err := ppv2.AppendHeader(nil, got)
	noErr(t, err)
	equal(t, hdr, again)
	again, err = ppv2.AppendHeaderCRC(nil, got)
	noErr(t, err)
	equal(t, hdr, again)

	// A CRC TLV in h.TLVs with a stale value is filled in.
	h.TLVs = hx(t, "03 0004 deadbeef | 05 0002 6869")
	b, err = ppv2.AppendHeader(nil, h)
	noErr(t, err)
	equal(t, withCRC(hx(t, "SIG 21 22 0030"+v6block+"| 03 0004 00000000 | 05 0002 6869"), 55), b)

	// LOCAL with CRC.
	b, err = ppv2.AppendHeaderCRC(nil, ppv2.Header{Command: ppv2.Local})
	noErr(t, err)
	equal(t, withCRC(hx(t, "SIG 20 00 0007 03 0004 00000000"), 19), b)
	_, _, err = ppv2.Parse(b)
	noErr(t, err)
}

func TestAppendHeaderErrors(t *testing.T) {
	tests := []struct {
		name string
		h    ppv2.Header
		want error
	}{
		{"no src", ppv2.Header{Command: ppv2.Proxy, Dst: svc4}, ppv2.ErrFamily},
		{"no dst", ppv2.Header{Command: ppv2.Proxy, Src: cli4}, ppv2.ErrFamily},
		{"command 2", ppv2.Header{Command: 2, Src: cli4, Dst: svc4}, ppv2.ErrCommand},
		{"stray byte", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: []byte{4}}, ppv2.ErrTLV},
		{"TLV overrun", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: hx(t, "04 0002 00")}, ppv2.ErrTLV},
		{"CRC length 2", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: hx(t, "03 0002 0000")}, ppv2.ErrTLV},
		{"two CRCs", ppv2.Header{Command: ppv2.Local, TLVs: hx(t, "03 0004 00000000 03 0004 00000000")}, ppv2.ErrTLV},
		{"too long", ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: bigTLV(t, 0xffff-12-3+1)}, ppv2.ErrTLV},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("x")
			b, err := ppv2.AppendHeader(dst, tt.h)
			errIs(t, err, tt.want)
			equal(t, "x", string(b), "dst comes back unchanged")
			_, err = ppv2.AppendHeaderCRC(nil, tt.h)
			errIs(t, err, tt.want)
			if tt.h.Command == ppv2.Proxy && len(tt.h.TLVs) == 0 {
				b, err := ppv2.AppendProxy(dst, tt.h.Src, tt.h.Dst)
				errIs(t, err, tt.want)
				equal(t, "x", string(b), "dst comes back unchanged")
			}
		})
	}
}

// bigTLV is one TLV area of n value bytes (type 0xe0).
func bigTLV(t testing.TB, n int) []byte {
	b, err := ppv2.AppendTLV(nil, 0xe0, make([]byte, n))
	noErr(t, err)
	return b
}

func TestMaxLength(t *testing.T) {
	// The largest TLV area that fits the 16-bit length, with and without CRC.
	h := ppv2.Header{Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: bigTLV(t, 0xffff-12-3)}
	b, err := ppv2.AppendHeader(nil, h)
	noErr(t, err)
	equal(t, 16+0xffff, len(b))
	got, off, err := ppv2.Parse(b)
	noErr(t, err)
	equal(t, len(b), off)
	equal(t, h.TLVs, []byte(got.TLVs))

	_, err = ppv2.AppendHeaderCRC(nil, h)
	errIs(t, err, ppv2.ErrTLV)
	h.TLVs = bigTLV(t, 0xffff-12-3-7)
	b, err = ppv2.AppendHeaderCRC(nil, h)
	noErr(t, err)
	_, _, err = ppv2.Parse(b)
	noErr(t, err)
}

func TestTLV(t *testing.T) {
	var tlvs []byte
	for _, tv := range []struct {
		typ uint8
		v   string
	}{{0xe0, "one"}, {ppv2.TypeNoop, ""}, {ppv2.TypeALPN, "coap"}, {0xe0, "two"}} {
		var err error
		tlvs, err = ppv2.AppendTLV(tlvs, tv.typ, []byte(tv.v))
		noErr(t, err)
	}
	h := ppv2.Header{TLVs: tlvs}
	v, ok := h.TLV(0xe0)
	isTrue(t, ok)
	equal(t, "one", string(v))
	equal(t, len(v), cap(v), "a view must not let appends overwrite the next TLV")
	v, ok = h.TLV(ppv2.TypeALPN)
	isTrue(t, ok)
	equal(t, "coap", string(v))
	v, ok = h.TLV(ppv2.TypeNoop)
	isTrue(t, ok)
	equal(t, 0, len(v))
	_, ok = h.TLV(ppv2.TypeAuthority)
	isTrue(t, !ok)

	// A malformed area (only possible when built by hand) ends the walk.
	h.TLVs = hx(t, "e0 0005 00")
	_, ok = h.TLV(0xe0)
	isTrue(t, !ok)

	_, err := ppv2.AppendTLV(nil, 0xe0, make([]byte, 0x10000))
	errIs(t, err, ppv2.ErrTLV)
}

func TestCommandString(t *testing.T) {
	equal(t, "LOCAL", ppv2.Local.String())
	equal(t, "PROXY", ppv2.Proxy.String())
	equal(t, "Command(7)", ppv2.Command(7).String())
}

func TestAllocs(t *testing.T) {
	buf := make([]byte, 0, 256)
	tlvs := hx(t, "05 0004 01020304")
	hdrs := map[string]ppv2.Header{
		"v4":      {Command: ppv2.Proxy, Src: cli4, Dst: svc4},
		"v6":      {Command: ppv2.Proxy, Src: cli6, Dst: svc6},
		"mixed":   {Command: ppv2.Proxy, Src: cli4, Dst: svc6},
		"v4 TLVs": {Command: ppv2.Proxy, Src: cli4, Dst: svc4, TLVs: tlvs},
		"local":   {Command: ppv2.Local},
	}
	for name, h := range hdrs {
		dgram, err := ppv2.AppendHeaderCRC(nil, h)
		noErr(t, err)
		plain, err := ppv2.AppendHeader(nil, h)
		noErr(t, err)
		allocs := map[string]func(){
			"AppendHeader":    func() { buf, _ = ppv2.AppendHeader(buf[:0], h) },
			"AppendHeaderCRC": func() { buf, _ = ppv2.AppendHeaderCRC(buf[:0], h) },
			"AppendProxy":     func() { buf, _ = ppv2.AppendProxy(buf[:0], h.Src, h.Dst) },
			"Parse":           func() { _, _, _ = ppv2.Parse(plain) },
			"Parse CRC":       func() { _, _, _ = ppv2.Parse(dgram) },
			"TLV":             func() { _, _ = h.TLV(5) },
		}
		for fn, f := range allocs {
			if n := testing.AllocsPerRun(100, f); n != 0 {
				t.Errorf("%s %s: %v allocs/op", fn, name, n)
			}
		}
	}
	// Errors come from package-level values: rejecting costs nothing either.
	for _, bad := range []string{
		"", "SIG 21", "16fefd00000000000000000000000010", "SIG 11 12 000c", "SIG 2f 12 000c", "SIG 21 11 000c" + v4block,
		"SIG 21 32 0000", "SIG 21 12 00ff", "SIG 21 12 0008" + v4block, "SIG 21 12 000e" + v4block + "0400",
		"SIG 21 12 0013" + v4block + "03 0004 00000000",
	} {
		b := hx(t, bad)
		if n := testing.AllocsPerRun(100, func() { _, _, _ = ppv2.Parse(b) }); n != 0 {
			t.Errorf("Parse(%s): %v allocs/op", bad, n)
		}
	}
}
