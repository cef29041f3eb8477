// Package dtlsrec builds DTLS 1.2 records by hand for examples and tests:
// records with the shape a proxy classifies (a ClientHello, a tls12_cid
// record carrying a connection ID), with meaningless contents. Nothing here
// is a real handshake or real ciphertext.
package dtlsrec

import "encoding/binary"

// Record header fields (RFC 6347 §4.1, RFC 9146 §4).
const (
	typeHandshake = 22
	typeCID       = 25 // tls12_cid
	versionMajor  = 0xfe
	versionDTLS12 = 0xfd
	clientHello   = 1
)

// AppendClientHello appends an epoch-0 handshake record whose fragment
// starts like a ClientHello (msg_type 1, a 24-bit length, message_seq,
// fragment offset and length), followed by body.
func AppendClientHello(dst []byte, seq uint64, body []byte) []byte {
	frag := 12 + len(body)
	dst = appendHeader(dst, typeHandshake, 0, seq, nil, frag)
	dst = append(dst, clientHello)
	dst = append24(dst, len(body))
	dst = append(dst, 0, 0) // message_seq
	dst = append24(dst, 0)  // fragment_offset
	dst = append24(dst, len(body))
	return append(dst, body...)
}

// AppendCIDRecord appends a tls12_cid record of epoch 1 carrying cid, with
// payload standing in for the encrypted inner plaintext.
func AppendCIDRecord(dst []byte, seq uint64, cid, payload []byte) []byte {
	dst = appendHeader(dst, typeCID, 1, seq, cid, len(payload))
	return append(dst, payload...)
}

func appendHeader(dst []byte, typ byte, epoch uint16, seq uint64, cid []byte, n int) []byte {
	dst = append(dst, typ, versionMajor, versionDTLS12)
	dst = binary.BigEndian.AppendUint16(dst, epoch)
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	dst = append(dst, s[2:]...) // 48-bit sequence number
	dst = append(dst, cid...)
	return binary.BigEndian.AppendUint16(dst, uint16(n))
}

func append24(dst []byte, n int) []byte {
	return append(dst, byte(n>>16), byte(n>>8), byte(n))
}
