package dtls_test

import (
	"fmt"

	"github.com/cidroute/cidroute/dtls"
)

func ExampleAppendRecord() {
	// A ClientHello record as a client's first flight starts (DTLS 1.0
	// record version), then a tls12_cid record of backend 7's session.
	hello := dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte{0xfe, 0xfd})
	b, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10, Fragment: hello})
	if err != nil {
		panic(err)
	}
	b, err = dtls.AppendRecord(b, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 5,
		CID: []byte{7, 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 1}, Fragment: []byte{0xde, 0xad, 0xbe, 0xef}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("% x\n", b[:27])
	c, _ := dtls.Classify(b, 8)
	fmt.Println(c.Kind, c.Records, c.CID[0], dtls.StartsSession(b, 8))
	// Output:
	// 16 fe ff 00 00 00 00 00 00 00 00 00 0e 01 00 00 02 00 00 00 00 00 00 00 02 fe fd
	// established 2 7 true
}
