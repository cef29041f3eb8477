package dtls

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestMismatchedCID: a flight whose Finished carries a 6-byte CID, read
// with 8 (and one with 8, read with 6), is a CID length mismatch with the
// CID as it is; broken datagrams and those that classify are not.
func TestMismatchedCID(t *testing.T) {
	cid6 := []byte{3, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5}
	cid8 := []byte{3, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7}
	flight := func(cid []byte) []byte {
		return datagram(
			Record{Type: Handshake, Version: VersionDTLS12, Seq: 1, Fragment: []byte{byte(HandshakeClientKeyExchange), 0, 0, 1, 0}},
			Record{Type: ChangeCipherSpec, Version: VersionDTLS12, Seq: 2, Fragment: []byte{1}},
			Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid, Fragment: []byte("encrypted finished, 40 bytes or so......")},
		)
	}
	for _, tc := range []struct {
		name   string
		b      []byte
		cidLen int
		want   []byte
	}{
		{"6 read as 8", flight(cid6), 8, cid6},
		{"8 read as 6", flight(cid8), 6, cid8},
		{"6 read as 20", flight(cid6), 20, cid6},
		// As pion and Mbed TLS send it: the fragment starts with the
		// explicit nonce, epoch 1 then the sequence number, so read with
		// 8 the "length" is 1 and the record seems to fit.
		{"6 read as 8, explicit nonce first", nonceFlight(cid6), 8, cid6},
	} {
		_, err := Classify(tc.b, tc.cidLen)
		isTrue(t, err != nil, tc.name, ": classifies")
		cid, ok := MismatchedCID(tc.b, tc.cidLen)
		isTrue(t, ok, tc.name)
		eq(t, tc.want, cid, tc.name)
	}

	_, ok := MismatchedCID(nonceFlight(cid8), 8)
	isTrue(t, !ok, "an explicit nonce first, the service's length")

	good := flight(cid8)
	_, ok = MismatchedCID(good, 8)
	isTrue(t, !ok, "a datagram that classifies")
	truncated := good[:len(good)-3]
	_, ok = MismatchedCID(truncated, 8)
	isTrue(t, !ok, "a truncated CID record of the right length")
	badFirst := append([]byte{0x99}, good[1:]...)
	_, ok = MismatchedCID(badFirst, 8)
	isTrue(t, !ok, "broken before the CID record")
	twoCIDs := datagram(Record{Type: TLS12CID, Version: VersionDTLS12, CID: cid8, Fragment: []byte("ciphertext of sixteen or more")},
		Record{Type: TLS12CID, Version: VersionDTLS12, CID: cid6, Fragment: []byte("ciphertext of sixteen or more")})
	_, ok = MismatchedCID(twoCIDs, 8)
	isTrue(t, !ok, "a CID record of the service's length came first")
	_, ok = MismatchedCID(good, 0)
	isTrue(t, !ok, "invalid cidLen")

	// Random CID records are rarely taken for a mismatch.
	r := rand.New(rand.NewPCG(1, 2))
	hits := 0
	for range 10000 {
		b := make([]byte, 20+r.IntN(200))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[0], b[1], b[2] = byte(TLS12CID), 0xfe, 0xfd
		if _, ok := MismatchedCID(b, 8); ok {
			hits++
		}
	}
	t.Logf("%d of 10000 random CID records taken for a mismatch", hits)
	isTrue(t, hits < 50, hits, " of 10000 random CID records taken for a mismatch")

	// And random DTLS 1.3 records with a CID and a length.
	hits = 0
	for range 10000 {
		b := make([]byte, 20+r.IntN(200))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[0] = 0x34 | b[0]&0x0b // 001 1 S 1 EE
		if _, ok := MismatchedCID(b, 8); ok {
			hits++
		}
	}
	t.Logf("%d of 10000 random unified headers taken for a mismatch", hits)
	isTrue(t, hits < 50, hits, " of 10000 random unified headers taken for a mismatch")
}

func TestMismatchedCIDNoAllocs(t *testing.T) {
	b := datagram(Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: make([]byte, 6), Fragment: make([]byte, 64)})
	if n := testing.AllocsPerRun(100, func() { MismatchedCID(b, 8) }); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

// nonceFlight is a client's second flight whose Finished, in a
// tls12_cid record, starts as AES-GCM's and AES-CCM's do: an explicit
// nonce of epoch 1 and sequence number 0, then ciphertext and tag.
func nonceFlight(cid []byte) []byte {
	finished := append([]byte{0, 1, 0, 0, 0, 0, 0, 0}, bytes.Repeat([]byte{0xc7}, 32)...)
	return datagram(
		Record{Type: Handshake, Version: VersionDTLS12, Seq: 1, Fragment: []byte{byte(HandshakeClientKeyExchange), 0, 0, 1, 0}},
		Record{Type: ChangeCipherSpec, Version: VersionDTLS12, Seq: 2, Fragment: []byte{1}},
		Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid, Fragment: finished},
	)
}
