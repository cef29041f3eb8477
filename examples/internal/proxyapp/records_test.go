package proxyapp

import "github.com/cidroute/cidroute/dtls"

// helloRecord is a DTLS record holding a ClientHello whose body is body.
func helloRecord(seq uint64, body []byte) []byte {
	return must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Seq: seq,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, body)}))
}

// cidRecord is a tls12_cid record of epoch 1 carrying cid, with payload
// standing in for the ciphertext.
func cidRecord(seq uint64, cid, payload []byte) []byte {
	return must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: seq, CID: cid, Fragment: payload}))
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
