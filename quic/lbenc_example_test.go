package quic_test

import (
	"encoding/hex"
	"fmt"

	"github.com/cidroute/cidroute/quic"
)

func ExampleLBEncrypted() {
	key, _ := hex.DecodeString("8f95f09245765f80256934e50c66207f")
	k := quic.LBKey{ConfigID: 3}
	copy(k.Key[:], key)
	// The backend and the proxies build the codec from the same keys.
	c, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{SelfEncodeLength: true, Keys: []quic.LBKey{k}, Active: 3})
	if err != nil {
		panic(err)
	}
	fmt.Println(c)

	// A backend issues CIDs carrying its ordinal; the octets hide it.
	cid, _ := c.AppendCID(nil, 130)
	fmt.Printf("first octet %#x, %d octets\n", cid[0], len(cid))

	// The proxies decode them, and one that backend 0 issued.
	ord, ok := c.Ordinal(cid)
	fmt.Println(ord, ok)
	other, _ := hex.DecodeString("6bef92874c3947bf31cac2c6")
	fmt.Println(c.Ordinal(other))

	// Kernel steering cannot read an encrypted ordinal.
	fmt.Println(c.OrdinalOffset())
	// Output:
	// QUIC-LB encrypted, 12 octets (four-pass), configs [3], active 3
	// first octet 0x6b, 12 octets
	// 130 true
	// 0 true
	// -1
}
