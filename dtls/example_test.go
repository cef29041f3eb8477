package dtls_test

import (
	"encoding/hex"
	"fmt"

	"github.com/cidroute/cidroute/dtls"
)

func ExampleClassify() {
	// A client's tls12_cid record: type 25, version fe fd, epoch 1,
	// sequence 5, an 8-byte CID issued by backend 7, length 4, ciphertext.
	b, _ := hex.DecodeString("19fefd0001000000000005" + "07a1b2c3d4e5f601" + "0004" + "deadbeef")
	const cidLen = 8

	c, err := dtls.Classify(b, cidLen)
	if err != nil {
		fmt.Println("drop:", err)
		return
	}
	ordinal, _ := dtls.OrdinalFirst{Length: cidLen}.Ordinal(c.CID)
	fmt.Println(c.Kind, c.Records, ordinal)

	_, err = dtls.Classify(b[:20], cidLen)
	fmt.Println(err)
	// Output:
	// established 1 7
	// dtls: truncated record
}

func ExampleClassify_dtls13() {
	// A DTLS 1.3 client's datagram: its Finished under a unified header
	// 0x3e (001CSLEE: C=1, S=1, L=1, epoch bits 2) with the 8-byte CID of
	// backend 7, sequence 0, length 4; then an ACK under 0x32 (C=1, 8-bit
	// sequence number, no length: it runs to the end of the datagram).
	b, _ := hex.DecodeString("3e" + "07a1b2c3d4e5f601" + "0000" + "0004" + "deadbeef" +
		"32" + "07a1b2c3d4e5f601" + "01" + "cafe")
	const cidLen = 8

	c, err := dtls.Classify(b, cidLen)
	if err != nil {
		fmt.Println("drop:", err)
		return
	}
	ordinal, _ := dtls.OrdinalFirst{Length: cidLen}.Ordinal(c.CID)
	fmt.Println(c.Kind, c.Records, c.Unified, ordinal)
	// Output: established 2 true 7
}

func ExampleOrdinalFirst_Generator() {
	gen, err := dtls.OrdinalFirst{}.Generator(3) // this backend is ds-3
	if err != nil {
		panic(err)
	}
	// Give gen to a pion/dtls v3 server as its ConnectionIDGenerator
	// (dtls.WithConnectionIDGenerator(gen) in pion's options API): every
	// CID it issues then carries its ordinal in byte 0.
	cid := gen()
	fmt.Println(len(cid), cid[0])
	// Output: 8 3
}
