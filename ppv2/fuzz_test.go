package ppv2_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/cidroute/cidroute/ppv2"
)

var sentinels = []error{
	ppv2.ErrNoSignature, ppv2.ErrVersion, ppv2.ErrCommand, ppv2.ErrFamily,
	ppv2.ErrTruncated, ppv2.ErrTLV, ppv2.ErrChecksum, ppv2.ErrStream,
}

func oneSentinel(t *testing.T, err error) {
	t.Helper()
	n := 0
	for _, s := range sentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("error %v wraps %d sentinels, want 1", err, n)
	}
}

// FuzzParse: arbitrary bytes never panic; errors are typed; what parses
// re-encodes to something that parses to the same fields (and to the same
// bytes when the input was in canonical form). internal/interop runs the
// same corpus against go-proxyproto.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		h, off, err := ppv2.Parse(b)
		if err != nil {
			oneSentinel(t, err)
			if len(b) >= len(ppv2.Signature) && errors.Is(err, ppv2.ErrNoSignature) == ppv2.Sniff(b) {
				t.Fatalf("Sniff=%v but Parse: %v", ppv2.Sniff(b), err)
			}
			return
		}
		if !ppv2.Sniff(b) || off < 16 || off > len(b) {
			t.Fatalf("Sniff=%v, payload offset %d of %d", ppv2.Sniff(b), off, len(b))
		}
		if n := len(h.TLVs); n > 0 && &h.TLVs[n-1] != &b[off-1] {
			t.Fatal("TLVs are not a view ending at the payload offset")
		}

		enc, err := ppv2.AppendHeader(nil, h)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", h, err)
		}
		h2, off2, err := ppv2.Parse(enc)
		if err != nil {
			t.Fatalf("re-parsing % x: %v", enc, err)
		}
		if off2 != len(enc) || h2.Command != h.Command || h2.Src != h.Src || h2.Dst != h.Dst || !bytes.Equal(h2.TLVs, h.TLVs) {
			t.Fatalf("round trip changed the header:\n%+v\n%+v", h, h2)
		}
		canonical := h.Command == ppv2.Local && b[13] == 0x00 ||
			h.Command == ppv2.Proxy && b[13] == 0x12 ||
			h.Command == ppv2.Proxy && b[13] == 0x22 && !(h.Src.Addr().Is4() && h.Dst.Addr().Is4())
		if canonical && !bytes.Equal(enc, b[:off]) {
			t.Fatalf("canonical header re-encoded differently:\n% x\n% x", b[:off], enc)
		}
	})
}

// fuzzAddr makes an address from 4 or 16 leading bytes, or none.
func fuzzAddr(b []byte, port uint16) netip.AddrPort {
	switch {
	case len(b) >= 16:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b)), port)
	case len(b) >= 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b)), port)
	}
	return netip.AddrPort{}
}

// refTLVs walks a TLV area independently of the package: whether it is
// well-formed for encoding, and the offset of a CRC32C value (or -1).
func refTLVs(t []byte) (ok bool, crcAt int) {
	crcAt = -1
	for i := 0; i < len(t); {
		if i+3 > len(t) {
			return false, -1
		}
		l := int(t[i+1])<<8 | int(t[i+2])
		if i+3+l > len(t) {
			return false, -1
		}
		if t[i] == 0x03 {
			if l != 4 || crcAt >= 0 {
				return false, -1
			}
			crcAt = i + 3
		}
		i += 3 + l
	}
	return true, crcAt
}

// FuzzRoundTrip: decode(encode(x)) == x for arbitrary addresses, ports, TLV
// areas and payloads, up to the documented canonical form (unmapped, no
// zone, zero addresses for LOCAL); encoding fails only when it must;
// go-proxyproto reads the same.
func FuzzRoundTrip(f *testing.F) {
	f.Fuzz(func(t *testing.T, local bool, src []byte, sport uint16, dst []byte, dport uint16, tlvs []byte, crc bool, payload []byte) {
		h := ppv2.Header{Command: ppv2.Proxy, Src: fuzzAddr(src, sport), Dst: fuzzAddr(dst, dport), TLVs: tlvs}
		if local {
			h.Command = ppv2.Local
		}
		wellFormed, crcAt := refTLVs(tlvs)
		addCRC := crc && crcAt < 0
		al := 0
		if !local {
			al = 36
			if h.Src.Addr().Unmap().Is4() && h.Dst.Addr().Unmap().Is4() {
				al = 12
			}
		}
		size := al + len(tlvs)
		if addCRC {
			size += 7
		}

		enc := ppv2.AppendHeader
		if crc {
			enc = ppv2.AppendHeaderCRC
		}
		prefix := []byte("prefix")
		out, err := enc(prefix, h)
		switch {
		case !local && (!h.Src.IsValid() || !h.Dst.IsValid()):
			errIs(t, err, ppv2.ErrFamily)
			return
		case !wellFormed || size > 0xffff:
			errIs(t, err, ppv2.ErrTLV)
			return
		case err != nil:
			t.Fatalf("encoding %+v: %v", h, err)
		}
		if string(out[:len(prefix)]) != "prefix" {
			t.Fatal("dst prefix overwritten")
		}
		hdr := out[len(prefix):]
		if len(hdr) != 16+size {
			t.Fatalf("header is %d bytes, want %d", len(hdr), 16+size)
		}
		dgram := append(bytes.Clone(hdr), payload...)

		got, off, err := ppv2.Parse(dgram)
		if err != nil {
			t.Fatalf("parsing our own % x: %v", hdr, err)
		}
		want := h
		if local {
			want.Src, want.Dst = netip.AddrPort{}, netip.AddrPort{}
		} else {
			want.Src = netip.AddrPortFrom(h.Src.Addr().Unmap().WithZone(""), h.Src.Port())
			want.Dst = netip.AddrPortFrom(h.Dst.Addr().Unmap().WithZone(""), h.Dst.Port())
		}
		if off != len(hdr) || !bytes.Equal(dgram[off:], payload) {
			t.Fatalf("payload offset %d, header %d", off, len(hdr))
		}
		if got.Command != want.Command || got.Src != want.Src || got.Dst != want.Dst {
			t.Fatalf("got %v %v %v, want %v %v %v", got.Command, got.Src, got.Dst, want.Command, want.Src, want.Dst)
		}

		// TLVs come back verbatim, except the checksum filled in or appended.
		wantTLVs := bytes.Clone(tlvs)
		if addCRC {
			wantTLVs = append(wantTLVs, 0x03, 0, 4, 0, 0, 0, 0)
			crcAt = len(tlvs) + 3
		}
		gotTLVs := bytes.Clone(got.TLVs)
		if crcAt >= 0 {
			zeroed := bytes.Clone(hdr)
			clear(zeroed[16+al+crcAt:][:4])
			if c := binary.BigEndian.Uint32(gotTLVs[crcAt:]); c != crc32c(zeroed) {
				t.Fatalf("CRC32C %08x, reference %08x", c, crc32c(zeroed))
			}
			clear(gotTLVs[crcAt:][:4])
			clear(wantTLVs[crcAt:][:4])
		}
		if !bytes.Equal(gotTLVs, wantTLVs) {
			t.Fatalf("TLVs\n got % x\nwant % x", gotTLVs, wantTLVs)
		}
	})
}
