package quic_test

import (
	"fmt"

	"github.com/cidroute/cidroute/quic"
)

// A proxy classifies each client datagram and routes established sessions
// by the ordinal in the server's CID.
func ExampleClassify() {
	codec := quic.LB{} // 12-octet QUIC-LB plaintext CIDs, config rotation 0

	// A backend with ordinal 4 issued this CID (normally random after the
	// ordinal octet).
	cid := []byte{0x0b, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	pkt := append([]byte{0x40}, cid...)    // short header
	pkt = append(pkt, make([]byte, 24)...) // packet number, payload, tag

	c, err := quic.Classify(pkt, codec.Len())
	if err != nil {
		fmt.Println("drop:", err)
		return
	}
	ord, ok := codec.Ordinal(c.DCID)
	fmt.Println(c.Kind, c.Type, ord, ok)

	// A Retry never comes from a client.
	_, err = quic.Classify([]byte{0xf0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, codec.Len())
	fmt.Println(err)
	// Output:
	// established Short 4 true
	// quic: server-only packet type from client
}

// A backend writes its ordinal into every CID it issues.
func ExampleLB_AppendCID() {
	codec := quic.LB{ConfigID: 2, SelfEncodeLength: true}
	cid, err := codec.AppendCID(nil, 7)
	if err != nil {
		panic(err)
	}
	ord, ok := codec.Ordinal(cid)
	fmt.Printf("len %d, first octet %#02x, ordinal %d %v\n", len(cid), cid[0], ord, ok)

	// 0b111 in the config rotation bits: not routable, hash the client
	// address instead.
	cid[0] = 0xe0 | cid[0]&0x1f
	_, ok = codec.Ordinal(cid)
	fmt.Println(ok)
	// Output:
	// len 12, first octet 0x4b, ordinal 7 true
	// false
}

func ExampleParseHeader() {
	// RFC 9001 A.4's Retry packet.
	b := []byte{0xff, 0, 0, 0, 1, 0, 8, 0xf0, 0x67, 0xa5, 0x50, 0x2a, 0x42, 0x62, 0xb5,
		't', 'o', 'k', 'e', 'n', 0x04, 0xa2, 0x65, 0xba, 0x2e, 0xff, 0x4d, 0x82, 0x90, 0x58, 0xfb, 0x3f, 0x0f, 0x24, 0x96, 0xba}
	h, err := quic.ParseHeader(b, 0)
	fmt.Printf("%v %#x scid=%x token=%q len=%d %v\n", h.Type, h.Version, h.SCID, h.Token, h.Len, err)
	// Output: Retry 0x1 scid=f067a5502a4262b5 token="token" len=36 <nil>
}

// ParseHeader walks the coalesced packets of a datagram one at a time: each
// Header says its packet's type, version and DCID, and Len is where the next
// packet starts. (Classify does the same walk and sums it up.)
func ExampleParseHeader_coalesced() {
	dcid := []byte{0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08}
	long := func(first byte, token bool) []byte {
		p := append([]byte{first, 0, 0, 0, 1, byte(len(dcid))}, dcid...)
		p = append(p, 0) // SCID length 0
		if token {
			p = append(p, 0) // Initial: token length 0
		}
		p = append(p, 0x40, 20) // Length 20: packet number and sealed payload
		return append(p, make([]byte, 20)...)
	}
	b := append(long(0xc0, true), long(0xd0, false)...) // v1 Initial, then 0-RTT

	for len(b) > 0 {
		h, err := quic.ParseHeader(b, 12)
		if err != nil {
			fmt.Println("drop:", err)
			return
		}
		fmt.Printf("%v %#x dcid=%x len=%d\n", h.Type, h.Version, h.DCID, h.Len)
		b = b[h.Len:]
	}
	// Output:
	// Initial 0x1 dcid=8394c8f03e515708 len=38
	// 0-RTT 0x1 dcid=8394c8f03e515708 len=37
}
