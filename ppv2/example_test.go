package ppv2_test

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cidroute/cidroute/ppv2"
)

func ExampleAppendHeader() {
	h := ppv2.Header{
		Command: ppv2.Proxy,
		Src:     netip.MustParseAddrPort("192.0.2.1:51000"),   // the client
		Dst:     netip.MustParseAddrPort("198.51.100.7:5684"), // the service
	}
	var buf [ppv2.HeaderLen6]byte // room for either family: no allocation
	b, err := ppv2.AppendHeader(buf[:0], h)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(b))
	fmt.Printf("% x\n", b[:12])
	fmt.Printf("% x\n", b[12:16])
	fmt.Printf("% x\n", b[16:])
	// Output:
	// 28
	// 0d 0a 0d 0a 00 0d 0a 51 55 49 54 0a
	// 21 12 00 0c
	// c0 00 02 01 c6 33 64 07 c7 38 16 34
}

func ExampleAppendHeader_mixedFamilies() {
	// An IPv4 client behind an IPv6 service address: both go out as IPv6,
	// the IPv4 side as ::ffff:a.b.c.d.
	h := ppv2.Header{
		Command: ppv2.Proxy,
		Src:     netip.MustParseAddrPort("192.0.2.1:51000"),
		Dst:     netip.MustParseAddrPort("[2001:db8::7]:443"),
	}
	b, _ := ppv2.AppendHeader(nil, h)
	fmt.Println(len(b))
	fmt.Printf("% x\n", b[12:16])
	fmt.Printf("% x\n", b[16:32])
	fmt.Printf("% x\n", b[32:48])
	fmt.Printf("% x\n", b[48:52])
	// Output:
	// 52
	// 21 22 00 24
	// 00 00 00 00 00 00 00 00 00 00 ff ff c0 00 02 01
	// 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 07
	// c7 38 01 bb
}

func ExampleAppendHeaderCRC() {
	h := ppv2.Header{
		Command: ppv2.Proxy,
		Src:     netip.MustParseAddrPort("192.0.2.1:51000"),
		Dst:     netip.MustParseAddrPort("198.51.100.7:5684"),
	}
	b, _ := ppv2.AppendHeaderCRC(nil, h)
	fmt.Println(len(b))
	fmt.Printf("% x\n", b[12:16])
	fmt.Printf("% x\n", b[28:])
	// Output:
	// 35
	// 21 12 00 13
	// 03 00 04 b5 39 cc 51
}

func ExampleParse() {
	// A datagram as a proxy forwards it: header, then the client's payload.
	dgram, _ := ppv2.AppendHeader(nil, ppv2.Header{
		Command: ppv2.Proxy,
		Src:     netip.MustParseAddrPort("192.0.2.1:51000"),
		Dst:     netip.MustParseAddrPort("198.51.100.7:5684"),
	})
	dgram = append(dgram, "payload"...)

	h, off, err := ppv2.Parse(dgram)
	if err != nil {
		panic(err)
	}
	fmt.Println(h.Command, h.Src, h.Dst, off, string(dgram[off:]))

	_, _, err = ppv2.Parse(dgram[:20])
	fmt.Println(errors.Is(err, ppv2.ErrTruncated))
	// Output:
	// PROXY 192.0.2.1:51000 198.51.100.7:5684 28 payload
	// true
}

func ExampleSniff() {
	// Sniff, don't require: datagrams without the signature came directly.
	for _, dgram := range [][]byte{
		[]byte(ppv2.Signature + "\x21\x12\x00\x0c..."),
		{0x16, 0xfe, 0xfd}, // a DTLS 1.2 handshake record
	} {
		fmt.Println(ppv2.Sniff(dgram))
	}
	// Output:
	// true
	// false
}

func ExampleHeader_TLV() {
	tlvs, _ := ppv2.AppendTLV(nil, ppv2.TypeUniqueID, []byte("conn-42"))
	dgram, _ := ppv2.AppendHeaderCRC(nil, ppv2.Header{
		Command: ppv2.Proxy,
		Src:     netip.MustParseAddrPort("[2001:db8::1]:4433"),
		Dst:     netip.MustParseAddrPort("[2001:db8::7]:443"),
		TLVs:    tlvs,
	})
	h, _, err := ppv2.Parse(dgram) // verifies the CRC32C TLV
	if err != nil {
		panic(err)
	}
	id, ok := h.TLV(ppv2.TypeUniqueID)
	fmt.Println(string(id), ok)
	// Output:
	// conn-42 true
}
