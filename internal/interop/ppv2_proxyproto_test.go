package interop

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/pires/go-proxyproto"

	"github.com/cidroute/cidroute/ppv2"
)

// Interop with an independent implementation, github.com/pires/go-proxyproto:
// what one side encodes, the other decodes, byte for byte.

type tlv struct {
	typ uint8
	val string
}

type interopCase struct {
	name     string
	cmd      ppv2.Command
	src, dst netip.AddrPort
	tlvs     []tlv
	crc      bool
	proto    proxyproto.AddressFamilyAndProtocol
}

func interopCases() []interopCase {
	some := []tlv{{ppv2.TypeALPN, "coap"}, {0xe0, "\x00\x01\x02"}, {ppv2.TypeUniqueID, "conn-42"}}
	return []interopCase{
		{name: "v4", cmd: ppv2.Proxy, src: cli4, dst: svc4, proto: proxyproto.UDPv4},
		{name: "v6", cmd: ppv2.Proxy, src: cli6, dst: svc6, proto: proxyproto.UDPv6},
		{name: "v4 to v6", cmd: ppv2.Proxy, src: cli4, dst: svc6, proto: proxyproto.UDPv6},
		{name: "v6 to v4", cmd: ppv2.Proxy, src: cli6, dst: svc4, proto: proxyproto.UDPv6},
		{name: "v4 TLVs", cmd: ppv2.Proxy, src: cli4, dst: svc4, tlvs: some, proto: proxyproto.UDPv4},
		{name: "v6 TLVs", cmd: ppv2.Proxy, src: cli6, dst: svc6, tlvs: some, proto: proxyproto.UDPv6},
		{name: "v4 CRC", cmd: ppv2.Proxy, src: cli4, dst: svc4, crc: true, proto: proxyproto.UDPv4},
		{name: "v6 TLVs CRC", cmd: ppv2.Proxy, src: cli6, dst: svc6, tlvs: some, crc: true, proto: proxyproto.UDPv6},
		{name: "local", cmd: ppv2.Local, proto: proxyproto.UNSPEC},
		{name: "local TLVs CRC", cmd: ppv2.Local, tlvs: some[:1], crc: true, proto: proxyproto.UNSPEC},
	}
}

func (c interopCase) ours(t *testing.T) ppv2.Header {
	h := ppv2.Header{Command: c.cmd, Src: c.src, Dst: c.dst}
	for _, x := range c.tlvs {
		var err error
		h.TLVs, err = ppv2.AppendTLV(h.TLVs, x.typ, []byte(x.val))
		noErr(t, err)
	}
	return h
}

// theirs builds the same header with go-proxyproto; with crc it appends a
// CRC32C TLV and fills it with the reference CRC, as go-proxyproto has no
// checksum helper of its own.
func (c interopCase) theirs(t *testing.T) []byte {
	var h *proxyproto.Header
	if c.cmd == ppv2.Local {
		h = proxyproto.HeaderProxyFromAddrs(2, nil, nil)
	} else {
		h = proxyproto.HeaderProxyFromAddrs(2, net.UDPAddrFromAddrPort(c.src), net.UDPAddrFromAddrPort(c.dst))
	}
	var list []proxyproto.TLV
	for _, x := range c.tlvs {
		list = append(list, proxyproto.TLV{Type: proxyproto.PP2Type(x.typ), Value: []byte(x.val)})
	}
	if c.crc {
		list = append(list, proxyproto.TLV{Type: proxyproto.PP2_TYPE_CRC32C, Value: make([]byte, 4)})
	}
	noErr(t, h.SetTLVs(list))
	b, err := h.Format()
	noErr(t, err)
	if c.crc {
		b = withCRC(b, len(b)-4)
	}
	return b
}

func udpAddrPort(t *testing.T, a net.Addr) netip.AddrPort {
	u, ok := a.(*net.UDPAddr)
	if !ok {
		t.Fatalf("address %v (%T) is not UDP", a, a)
	}
	ap := u.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func TestInteropOursToTheirs(t *testing.T) {
	payload := []byte("\x16\xfe\xfd payload")
	for _, c := range interopCases() {
		t.Run(c.name, func(t *testing.T) {
			enc := ppv2.AppendHeader
			if c.crc {
				enc = ppv2.AppendHeaderCRC
			}
			hdr, err := enc(nil, c.ours(t))
			noErr(t, err)
			dgram := append(bytes.Clone(hdr), payload...)

			th, rest, err := proxyproto.ParseUDPDatagram(dgram)
			noErr(t, err)
			equal(t, payload, rest)
			equal(t, byte(2), th.Version)
			equal(t, c.proto, th.TransportProtocol)
			if c.cmd == ppv2.Proxy {
				equal(t, proxyproto.PROXY, th.Command)
				equal(t, c.src, udpAddrPort(t, th.SourceAddr))
				equal(t, c.dst, udpAddrPort(t, th.DestinationAddr))
			} else {
				equal(t, proxyproto.LOCAL, th.Command)
			}

			got, err := th.TLVs()
			noErr(t, err)
			want := len(c.tlvs)
			if c.crc {
				want++
			}
			equal(t, want, len(got))
			for i, x := range c.tlvs {
				equal(t, proxyproto.PP2Type(x.typ), got[i].Type)
				equal(t, []byte(x.val), got[i].Value)
			}
			if c.crc {
				last := got[len(got)-1]
				equal(t, proxyproto.PP2_TYPE_CRC32C, last.Type)
				zeroed := bytes.Clone(hdr)
				clear(zeroed[len(zeroed)-4:])
				equal(t, crc32c(zeroed), binary.BigEndian.Uint32(last.Value), "CRC32C by the reference")
			}

			// Their encoder reproduces our bytes exactly.
			again, err := th.Format()
			noErr(t, err)
			equal(t, hdr, again)

			// And the stream reader agrees.
			r := bufio.NewReader(bytes.NewReader(dgram))
			th2, err := proxyproto.Read(r)
			noErr(t, err)
			isTrue(t, th.EqualsTo(th2))
			rest, _ = io.ReadAll(r)
			equal(t, payload, rest)
		})
	}
}

func TestInteropTheirsToOurs(t *testing.T) {
	payload := []byte("\x40\x00 payload")
	for _, c := range interopCases() {
		t.Run(c.name, func(t *testing.T) {
			hdr := c.theirs(t)
			dgram := append(bytes.Clone(hdr), payload...)

			isTrue(t, ppv2.Sniff(dgram))
			h, off, err := ppv2.Parse(dgram)
			noErr(t, err)
			equal(t, len(hdr), off)
			equal(t, payload, dgram[off:])
			equal(t, c.cmd, h.Command)
			if c.cmd == ppv2.Proxy {
				equal(t, c.src, h.Src)
				equal(t, c.dst, h.Dst)
			} else {
				equal(t, netip.AddrPort{}, h.Src)
				equal(t, netip.AddrPort{}, h.Dst)
			}
			for _, x := range c.tlvs {
				v, ok := h.TLV(x.typ)
				isTrue(t, ok, "TLV %#x", x.typ)
				equal(t, []byte(x.val), v)
			}
			_, ok := h.TLV(ppv2.TypeCRC32C)
			equal(t, c.crc, ok)

			// Our encoder reproduces their bytes exactly.
			enc := ppv2.AppendHeader
			if c.crc {
				enc = ppv2.AppendHeaderCRC
			}
			ours, err := enc(nil, c.ours(t))
			noErr(t, err)
			equal(t, hdr, ours)

			if c.crc {
				dgram[len(hdr)-1] ^= 0x80
				_, _, err = ppv2.Parse(dgram)
				errIs(t, err, ppv2.ErrChecksum)
			}
		})
	}
}

// Headers go-proxyproto writes for other transports are refused with the
// errors a UDP receiver needs.
func TestInteropTheirsRejected(t *testing.T) {
	tcp := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(cli4), net.TCPAddrFromAddrPort(svc4))
	tcp6 := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(cli6), net.TCPAddrFromAddrPort(svc6))
	unix := proxyproto.HeaderProxyFromAddrs(2,
		&net.UnixAddr{Net: "unixgram", Name: "/run/a"}, &net.UnixAddr{Net: "unixgram", Name: "/run/b"})
	v1 := proxyproto.HeaderProxyFromAddrs(1, net.TCPAddrFromAddrPort(cli4), net.TCPAddrFromAddrPort(svc4))
	for _, tc := range []struct {
		name string
		h    *proxyproto.Header
		want error
	}{
		{"TCPv4", tcp, ppv2.ErrStream},
		{"TCPv6", tcp6, ppv2.ErrStream},
		{"unixgram", unix, ppv2.ErrFamily},
		{"v1 text", v1, ppv2.ErrNoSignature},
	} {
		b, err := tc.h.Format()
		noErr(t, err)
		_, _, err = ppv2.Parse(b)
		errIs(t, err, tc.want, tc.name)
	}
}

// FuzzParseProxyproto: go-proxyproto accepts what ppv2.Parse accepts (up to
// its own 4096-byte limit) and reads the same addresses, TLVs and payload.
// Seeds: ppv2's FuzzParse corpus.
func FuzzParseProxyproto(f *testing.F) {
	for _, v := range corpus(f, filepath.Join(ppv2Testdata, "fuzz", "FuzzParse")) {
		f.Add(v[0].([]byte))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, off, err := ppv2.Parse(b)
		if err != nil {
			return
		}
		// Differential: go-proxyproto accepts what we accept (up to its
		// own 4096-byte limit) and reads the same addresses and payload.
		if off-16 > int(proxyproto.MaxV2HeaderSize) {
			return
		}
		th, rest, err := proxyproto.ParseUDPDatagram(b)
		if err != nil {
			t.Fatalf("go-proxyproto rejects what we accept: %v", err)
		}
		if !bytes.Equal(rest, b[off:]) {
			t.Fatalf("payload: go-proxyproto %d bytes, ours %d", len(rest), len(b)-off)
		}
		if h.Command == ppv2.Proxy {
			if th.Command != proxyproto.PROXY || udpAddrPort(t, th.SourceAddr) != h.Src || udpAddrPort(t, th.DestinationAddr) != h.Dst {
				t.Fatalf("go-proxyproto reads %v %v -> %v, ours %v -> %v", th.Command, th.SourceAddr, th.DestinationAddr, h.Src, h.Dst)
			}
		} else if th.Command != proxyproto.LOCAL {
			t.Fatalf("go-proxyproto reads %v, ours LOCAL", th.Command)
		}
		theirs, err := th.TLVs()
		if err != nil {
			t.Fatalf("go-proxyproto TLVs: %v", err)
		}
		var ours []proxyproto.TLV
		for tl := h.TLVs; len(tl) > 0; {
			l := int(binary.BigEndian.Uint16(tl[1:]))
			ours = append(ours, proxyproto.TLV{Type: proxyproto.PP2Type(tl[0]), Value: tl[3 : 3+l]})
			tl = tl[3+l:]
		}
		if len(ours) != len(theirs) {
			t.Fatalf("%d TLVs, go-proxyproto %d", len(ours), len(theirs))
		}
		for i := range ours {
			if ours[i].Type != theirs[i].Type || ours[i].Type != proxyproto.PP2_TYPE_NOOP && !bytes.Equal(ours[i].Value, theirs[i].Value) {
				t.Fatalf("TLV %d: ours %v % x, go-proxyproto %v % x", i, ours[i].Type, ours[i].Value, theirs[i].Type, theirs[i].Value)
			}
		}

		// And it reads our re-encoding of the header the same way.
		enc, err := ppv2.AppendHeader(nil, h)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", h, err)
		}
		if len(enc)-16 > int(proxyproto.MaxV2HeaderSize) {
			return
		}
		th2, rest2, err := proxyproto.ParseUDPDatagram(append(enc, b[off:]...))
		if err != nil || !bytes.Equal(rest2, b[off:]) {
			t.Fatalf("go-proxyproto on our encoding % x: %v", enc, err)
		}
		if h.Command == ppv2.Proxy && (udpAddrPort(t, th2.SourceAddr) != h.Src || udpAddrPort(t, th2.DestinationAddr) != h.Dst) {
			t.Fatalf("go-proxyproto reads our encoding as %v -> %v, want %v -> %v", th2.SourceAddr, th2.DestinationAddr, h.Src, h.Dst)
		}
	})
}
