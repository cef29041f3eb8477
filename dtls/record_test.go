package dtls

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

var (
	cid8  = unhex("07 a1 b2 c3 d4 e5 f6 01")
	cid8b = unhex("02 00 00 00 00 00 00 02")
	// handshake fragments: msg_type(1) length(3) message_seq(2)
	// fragment_offset(3) fragment_length(3) body
	clientHelloFrag = unhex("01 000002 0000 000000 000002 fefd")
	hvrFrag         = unhex("03 000002 0000 000000 000002 fefd")
	ckeFrag         = unhex("10 000002 0002 000000 000002 0041")
	sealed          = unhex("0123456789abcdef0123456789abcdef 00112233") // stands in for ciphertext

	clientHello = Record{Type: Handshake, Version: VersionDTLS10, Fragment: clientHelloFrag}
	cidRecord   = Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, Seq: 5, CID: cid8, Fragment: sealed}
	flight5     = datagram(
		Record{Type: Handshake, Version: VersionDTLS12, Seq: 2, Fragment: ckeFrag},
		Record{Type: ChangeCipherSpec, Version: VersionDTLS12, Seq: 3, Fragment: []byte{1}},
		Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid8, Fragment: sealed},
	)
)

type classifyCase struct {
	name   string
	in     []byte
	cidLen int
	want   Class
	err    error
}

var classifyCases = []classifyCase{
	{"clienthello-fe-ff", datagram(clientHello), 8, Class{Kind: KindNew, ClientHello: true, Records: 1}, nil},
	{"cid-record", datagram(cidRecord), 8, Class{Kind: KindEstablished, CID: cid8, Records: 1}, nil},
	{"flight5", flight5, 8, Class{Kind: KindEstablished, CID: cid8, Records: 3}, nil},
	{"cid-first-then-alert", datagram(cidRecord, Record{Type: Alert, Version: VersionDTLS12, Fragment: []byte{1, 0}}), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2}, nil},
	{"two-cids-first-wins", datagram(cidRecord, Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid8b, Fragment: sealed}), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2}, nil},
	{"clienthello-then-cid", datagram(clientHello, cidRecord), 8, Class{Kind: KindEstablished, CID: cid8, ClientHello: true, Records: 2}, nil},
	// A ClientHello anywhere counts (issue 15): behind a CID record, or
	// behind an alert.
	{"cid-then-clienthello", datagram(cidRecord, clientHello), 8, Class{Kind: KindEstablished, CID: cid8, ClientHello: true, Records: 2}, nil},
	{"alert-then-clienthello", datagram(Record{Type: Alert, Version: VersionDTLS12, Fragment: []byte{1, 0}}, clientHello), 8,
		Class{Kind: KindNew, ClientHello: true, Records: 2}, nil},
	{"flight5-then-clienthello", append(append([]byte(nil), flight5...), datagram(clientHello)...), 8,
		Class{Kind: KindEstablished, CID: cid8, ClientHello: true, Records: 4}, nil},
	{"hello-verify-request", datagram(Record{Type: Handshake, Version: VersionDTLS12, Fragment: hvrFrag}), 8, Class{Kind: KindNew, Records: 1}, nil},
	{"clienthello-epoch1-is-not", datagram(Record{Type: Handshake, Version: VersionDTLS12, Epoch: 1, Fragment: clientHelloFrag}), 8, Class{Kind: KindNew, Records: 1}, nil},
	{"appdata-no-cid", datagram(Record{Type: ApplicationData, Version: VersionDTLS12, Epoch: 1, Seq: 1<<48 - 1, Fragment: sealed}), 8, Class{Kind: KindNew, Records: 1}, nil},
	{"cidlen-1", datagram(Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: []byte{9}, Fragment: []byte{0}}), 1,
		Class{Kind: KindEstablished, CID: []byte{9}, Records: 1}, nil},
	{"cidlen-255", datagram(Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: bytes.Repeat([]byte{3}, 255), Fragment: []byte{0}}), 255,
		Class{Kind: KindEstablished, CID: bytes.Repeat([]byte{3}, 255), Records: 1}, nil},

	{"empty", nil, 8, Class{}, ErrTooShort},
	{"one-byte", []byte{22}, 8, Class{}, ErrTooShort},
	{"header-minus-one", datagram(clientHello)[:12], 8, Class{}, ErrTooShort},
	{"type-0", append([]byte{0}, datagram(clientHello)[1:]...), 8, Class{}, ErrContentType},
	{"type-24-heartbeat", append([]byte{24}, datagram(clientHello)[1:]...), 8, Class{}, ErrContentType},
	{"type-24-heartbeat-after-ack", append(datagram(ack), append([]byte{24}, datagram(clientHello)[1:]...)...), 8, Class{Records: 1}, ErrContentType},
	{"type-255", []byte{255}, 8, Class{}, ErrContentType},
	{"tls-not-dtls", unhex("16 0301 000a 01000006 0303 00000000 00"), 8, Class{}, ErrVersion},
	{"version-fefc", datagram(Record{Type: Handshake, Version: 0xfefc, Fragment: clientHelloFrag}), 8, Class{}, ErrVersion},
	{"version-0000", datagram(Record{Type: TLS12CID, Version: 0, CID: cid8, Fragment: sealed}), 8, Class{}, ErrVersion},
	{"dtls13-one-byte", []byte{0x3f}, 8, Class{}, ErrTooShort},
	{"length-past-end", datagram(clientHello)[:HeaderLen+3], 8, Class{}, ErrTruncated},
	{"cid-cut", datagram(cidRecord)[:HeaderLen+2], 8, Class{}, ErrTruncated},
	{"cid-header-only", datagram(cidRecord)[:HeaderLen], 8, Class{}, ErrTruncated},
	{"cid-longer-than-configured", datagram(cidRecord), 12, Class{}, ErrTruncated},
	{"flight5-cid-cut", flight5[:len(flight5)-1], 8, Class{Records: 2}, ErrTruncated},
	{"clienthello-then-broken-cid", append(datagram(clientHello), datagram(cidRecord)[:20]...), 8, Class{Records: 1}, ErrTruncated},
	{"trailing-byte", append(datagram(clientHello), 22), 8, Class{Records: 1}, ErrTruncated},
	{"trailing-header", append(datagram(clientHello), datagram(clientHello)[:HeaderLen]...), 8, Class{Records: 1}, ErrTruncated},
	{"trailing-zero", append(datagram(clientHello), 0), 8, Class{Records: 1}, ErrContentType},
	{"empty-fragment", datagram(Record{Type: ApplicationData, Version: VersionDTLS12, Epoch: 1}), 8, Class{}, ErrEmptyRecord},
	{"empty-cid-fragment", datagram(cidRecord, Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid8}), 8, Class{Records: 1}, ErrEmptyRecord},
	{"cidlen-0", datagram(clientHello), 0, Class{}, ErrCIDLength},
	{"cidlen-256", datagram(clientHello), 256, Class{}, ErrCIDLength},
	{"cidlen-negative", datagram(clientHello), -1, Class{}, ErrCIDLength},
}

func TestClassify(t *testing.T) {
	for _, tc := range classifyCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Classify(tc.in, tc.cidLen)
			eq(t, tc.err, err) // sentinels come back unwrapped
			eq(t, tc.want, c)
		})
	}
}

func TestClassifyCIDIsView(t *testing.T) {
	b := datagram(clientHello, cidRecord)
	c, err := Classify(b, 8)
	noErr(t, err)
	isTrue(t, &b[len(datagram(clientHello))+11] == &c.CID[0])
	eq(t, len(cid8), cap(c.CID), "capacity is clipped to the CID")
}

func TestParseRecord(t *testing.T) {
	b := append(datagram(Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 0xabcd, Seq: 0x0102030405ff, CID: cid8, Fragment: sealed}), 0x16)
	r, n, err := ParseRecord(b, 8)
	noErr(t, err)
	eq(t, len(b)-1, n)
	eq(t, Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 0xabcd, Seq: 0x0102030405ff, CID: cid8, Fragment: sealed}, r)
	isTrue(t, &b[11] == &r.CID[0])
	isTrue(t, &b[HeaderLen+8] == &r.Fragment[0])
	eq(t, len(sealed), cap(r.Fragment), "capacity is clipped: appending cannot overwrite the next record")

	r, n, err = ParseRecord(datagram(clientHello), 8)
	noErr(t, err)
	eq(t, HeaderLen+len(clientHelloFrag), n)
	isTrue(t, r.CID == nil)

	for _, tc := range classifyCases {
		if tc.err == nil || tc.want.Records > 0 {
			continue
		}
		r, n, err := ParseRecord(tc.in, tc.cidLen)
		eq(t, tc.err, err, tc.name)
		isTrue(t, n == 0, tc.name)
		eq(t, Record{}, r, tc.name)
	}
}

func TestContentTypeAndKindStrings(t *testing.T) {
	eq(t, "tls12_cid", TLS12CID.String())
	eq(t, "unknown", ContentType(24).String())
	eq(t, "established", KindEstablished.String())
	eq(t, "invalid", Kind(0).String())
}

// TestRoundTripRandom builds random valid datagrams, classifies them, and
// walks them back into the records they were built from.
func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	types := []ContentType{ChangeCipherSpec, Alert, Handshake, ApplicationData, TLS12CID}
	var err error
	for range 2000 {
		cidLen := 1 + rng.IntN(MaxCIDLen)
		if rng.IntN(2) == 0 {
			cidLen = 1 + rng.IntN(20)
		}
		var rs []Record
		var firstCID []byte
		for range 1 + rng.IntN(5) {
			r := Record{
				Type:     types[rng.IntN(len(types))],
				Version:  []uint16{VersionDTLS10, VersionDTLS12}[rng.IntN(2)],
				Epoch:    uint16(rng.Uint32()),
				Seq:      rng.Uint64() >> 16,
				Fragment: make([]byte, 1+rng.IntN(300)),
			}
			for i := range r.Fragment {
				r.Fragment[i] = byte(rng.Uint32())
			}
			if r.Type == TLS12CID {
				r.CID = make([]byte, cidLen)
				for i := range r.CID {
					r.CID[i] = byte(rng.Uint32())
				}
				if firstCID == nil {
					firstCID = r.CID
				}
			}
			rs = append(rs, r)
		}
		b := datagram(rs...)
		var enc []byte
		for _, r := range rs {
			enc, err = AppendRecord(enc, r)
			noErr(t, err)
		}
		eq(t, b, enc, "AppendRecord writes what the reference encoder does")

		c, err := Classify(b, cidLen)
		noErr(t, err)
		eq(t, len(rs), c.Records)
		eq(t, firstCID, c.CID)
		eq(t, firstCID != nil, c.Kind == KindEstablished)

		for i, want := range rs {
			r, n, err := ParseRecord(b, cidLen)
			noErr(t, err)
			eq(t, want, r, "record %d", i)
			b = b[n:]
		}
		eq(t, 0, len(b))
	}
}

func TestAppendRecordErrors(t *testing.T) {
	dst := []byte{9}
	for _, tc := range []struct {
		r   Record
		err error
	}{
		{Record{Type: 24, Fragment: []byte{1}}, ErrContentType},
		{Record{Type: Handshake, Version: 0xfefc, Fragment: []byte{1}}, ErrVersion},
		{Record{Type: Handshake}, ErrEmptyRecord},
		{Record{Type: TLS12CID, Fragment: []byte{1}}, ErrCIDLength},
		{Record{Type: TLS12CID, CID: make([]byte, 256), Fragment: []byte{1}}, ErrCIDLength},
		{Record{Type: Alert, CID: cid8, Fragment: []byte{1}}, ErrFieldRange},
		{Record{Type: Alert, Seq: 1 << 48, Fragment: []byte{1}}, ErrFieldRange},
		{Record{Type: ApplicationData, Fragment: make([]byte, 1<<16)}, ErrFieldRange},
	} {
		out, err := AppendRecord(dst, tc.r)
		errIs(t, err, tc.err, "%+v", tc.r)
		eq(t, []byte{9}, out, "dst unchanged")
	}
	// A zero version is DTLS 1.2.
	b, err := AppendRecord(nil, Record{Type: Alert, Fragment: []byte{1, 0}})
	noErr(t, err)
	r, _, err := ParseRecord(b, 8)
	noErr(t, err)
	eq(t, VersionDTLS12, r.Version)
}

func TestAppendHandshake(t *testing.T) {
	eq(t, clientHelloFrag, AppendHandshake(nil, HandshakeClientHello, 0, []byte{0xfe, 0xfd}))
	eq(t, ckeFrag, AppendHandshake(nil, HandshakeClientKeyExchange, 2, []byte{0, 0x41}))
	hello, err := AppendRecord(nil, Record{Type: Handshake, Version: VersionDTLS10,
		Fragment: AppendHandshake(nil, HandshakeClientHello, 0, []byte("body"))})
	noErr(t, err)
	isTrue(t, StartsSession(hello, 8))
	c, err := Classify(hello, 8)
	noErr(t, err)
	eq(t, Class{Kind: KindNew, ClientHello: true, Records: 1}, c)
}

func TestHelloSeq(t *testing.T) {
	hello := func(seq uint16, body string) Record {
		return Record{Type: Handshake, Version: VersionDTLS12, Fragment: AppendHandshake(nil, HandshakeClientHello, seq, []byte(body))}
	}
	for _, tc := range []struct {
		name string
		in   []byte
		seq  uint16
		ok   bool
	}{
		{"pion's first hello", readHex(t, "pion_clienthello_1.hex"), 0, true},
		{"pion's hello with the cookie", readHex(t, "pion_clienthello_2.hex"), 1, true},
		{"OpenSSL's first hello", readHex(t, "openssl_clienthello.hex"), 0, true},
		{"no hello", flight5, 0, false},
		{"a header too short for message_seq", datagram(Record{Type: Handshake, Version: VersionDTLS12, Fragment: clientHelloFrag[:11]}), 0, false},
		{"hello in epoch 1", datagram(Record{Type: Handshake, Version: VersionDTLS12, Epoch: 1, Fragment: AppendHandshake(nil, HandshakeClientHello, 0, nil)}), 0, false},
		{"the first hello fragment counts", datagram(cidRecord, hello(3, "a"), hello(0, "b")), 3, true},
		{"a broken record after the hello", append(datagram(hello(0, "a")), 22, 0xfe), 0, false},
	} {
		seq, ok := HelloSeq(tc.in, liveCIDLen)
		eq(t, tc.ok, ok, tc.name)
		eq(t, tc.seq, seq, tc.name)
	}
	_, ok := HelloSeq(readHex(t, "pion_clienthello_1.hex"), MaxCIDLen+1)
	isTrue(t, !ok, "CID length out of range")
	_, ok = HelloSeq(nil, 8)
	isTrue(t, !ok, "empty")
}
