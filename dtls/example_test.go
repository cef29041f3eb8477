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
