package dtls

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// DTLS 1.3 (RFC 9147) records: plaintext ones with the DTLS 1.2 header,
// ciphertext ones with the unified header 001CSLEE.
var (
	// A DTLS 1.3 ClientHello body (RFC 8446 §4.1.2 as RFC 9147 §5.3 keeps
	// it): legacy_version fe fd, random, empty legacy_session_id and
	// legacy_cookie, one cipher suite (TLS_AES_128_GCM_SHA256), the null
	// compression method, and supported_versions naming DTLS 1.3 (fe fc).
	hello13Body = unhex(`fefd
		000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
		00 00 0002 1301 01 00
		0007 002b 0003 02 fefc`)
	hello13 = Record{Type: Handshake, Version: VersionDTLS12, Fragment: AppendHandshake(nil, HandshakeClientHello, 0, hello13Body)}
	// An ACK (RFC 9147 §7) of record 0 of epoch 0, in plaintext:
	// record_numbers<16..2^16-1>, each an epoch and a sequence number of
	// 64 bits.
	ack = Record{Type: ACK, Version: VersionDTLS12, Seq: 1, Fragment: unhex("0010 0000000000000000 0000000000000000")}
	// ct16 stands in for the shortest encrypted_record RFC 9147 §4.2.3
	// allows (record number encryption samples 16 bytes).
	ct16 = unhex("00112233445566778899aabbccddeeff")
)

// u13 is a unified-header record with first octet f: the CID is written
// only when f has the C bit.
func u13(f byte, cid []byte, seq uint64, frag []byte) Record {
	if f&UnifiedCID == 0 {
		cid = nil
	}
	return Record{Unified: f, Epoch: uint16(f & UnifiedEpoch), Seq: seq, CID: cid, Fragment: frag}
}

// within reports whether view lies inside b.
func within(view, b []byte) bool {
	if len(view) == 0 {
		return true
	}
	for i := range b {
		if &b[i] == &view[0] {
			return i+len(view) <= len(b)
		}
	}
	return false
}

// join concatenates datagrams.
func join(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// dtls13Cases join classifyCases (and so the fuzz seeds, TestAllocs and
// TestParseRecord).
var dtls13Cases = []classifyCase{
	// 001CSLEE: C=0 S=1 L=1 EE=01, 16-bit seq, length 3.
	{"dtls13-unified", unhex("2d 0001 0003 aabbcc"), 8, Class{Kind: KindNew, Records: 1, Unified: true}, nil},
	{"dtls13-after-plaintext", join(datagram(Record{Type: Handshake, Version: VersionDTLS12, Fragment: ckeFrag}), unhex("2d 0001 0003 aabbcc")), 8,
		Class{Kind: KindNew, Records: 2, Unified: true}, nil},
	{"dtls13-cid-s16-l", datagram(u13(0x3e, cid8, 0x0102, ct16)), 8, Class{Kind: KindEstablished, CID: cid8, Records: 1, Unified: true}, nil},
	{"dtls13-cid-s8-nolength", datagram(u13(0x33, cid8, 7, ct16)), 8, Class{Kind: KindEstablished, CID: cid8, Records: 1, Unified: true}, nil},
	{"dtls13-minimal", datagram(u13(0x20, nil, 0, ct16)), 8, Class{Kind: KindNew, Records: 1, Unified: true}, nil},
	{"dtls13-clienthello", datagram(hello13), 8, Class{Kind: KindNew, ClientHello: true, Records: 1}, nil},
	// 0-RTT data (epoch 1) rides behind the ClientHello, before the
	// client knows the server's CID.
	{"dtls13-clienthello-0rtt", datagram(hello13, u13(0x2d, nil, 0, ct16), u13(0x29, nil, 1, ct16)), 8,
		Class{Kind: KindNew, ClientHello: true, Records: 3, Unified: true}, nil},
	{"dtls13-ack-plaintext", datagram(ack), 8, Class{Kind: KindNew, Records: 1}, nil},
	{"dtls13-ack-then-clienthello", datagram(ack, hello13), 8, Class{Kind: KindNew, ClientHello: true, Records: 2}, nil},
	// The client's Finished (epoch 2) with the server's CID, then an ACK
	// without length.
	{"dtls13-finished-ack", datagram(u13(0x3e, cid8, 0, ct16), u13(0x32, cid8, 1, ct16)), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2, Unified: true}, nil},
	{"dtls13-nocid-then-cid", datagram(u13(0x2e, nil, 0, ct16), u13(0x3e, cid8, 1, ct16)), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2, Unified: true}, nil},
	{"dtls13-two-cids-first-wins", datagram(u13(0x3f, cid8, 0, ct16), u13(0x3b, cid8b, 1, ct16)), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2, Unified: true}, nil},
	{"dtls12-cid-then-dtls13-cid", datagram(cidRecord, u13(0x3c, cid8b, 9, ct16)), 8,
		Class{Kind: KindEstablished, CID: cid8, Records: 2, Unified: true}, nil},
	{"dtls13-cidlen-1", datagram(u13(0x3c, []byte{4}, 0, []byte{1})), 1, Class{Kind: KindEstablished, CID: []byte{4}, Records: 1, Unified: true}, nil},
	{"dtls13-cidlen-255", datagram(u13(0x38, bytes.Repeat([]byte{5}, 255), 0, []byte{1})), 255,
		Class{Kind: KindEstablished, CID: bytes.Repeat([]byte{5}, 255), Records: 1, Unified: true}, nil},

	{"dtls13-empty-length", unhex("2c 0001 0000"), 8, Class{}, ErrEmptyRecord},
	{"dtls13-empty-nolength", unhex("28 0001"), 8, Class{}, ErrEmptyRecord},
	{"dtls13-header-cut", unhex("28 00"), 8, Class{}, ErrTooShort},
	{"dtls13-length-past-end", unhex("2c 0001 0005 aabb"), 8, Class{}, ErrTruncated},
	{"dtls13-cid-cut", unhex("3c 07a1b2c3"), 8, Class{}, ErrTruncated},
	{"dtls13-cid-header-cut", unhex("3c 07a1"), 8, Class{}, ErrTooShort},
	{"dtls13-cid-longer-than-configured", datagram(u13(0x3c, cid8, 0, sealed)), 12, Class{}, ErrTruncated},
	{"dtls13-cid-no-room-for-ciphertext", datagram(u13(0x30, cid8, 0, []byte{1}))[:10], 8, Class{}, ErrEmptyRecord},
	{"dtls13-trailing-header", join(datagram(u13(0x2c, nil, 0, ct16)), unhex("2c 00")), 8, Class{Records: 1}, ErrTruncated},
	{"dtls13-then-broken-plaintext", join(datagram(u13(0x3c, cid8, 0, ct16)), datagram(clientHello)[:12]), 8, Class{Records: 1}, ErrTruncated},
	{"dtls13-ack-version-0000", datagram(Record{Type: ACK, Version: 0, Fragment: ct16}), 8, Class{}, ErrVersion},
}

func init() { classifyCases = append(classifyCases, dtls13Cases...) }

// TestUnifiedEveryHeader builds a record for each of the 32 first octets
// 001CSLEE, alone and behind a ClientHello and a tls12_cid record, and
// checks what Classify and ParseRecord read from it whole and cut at
// every length: a cut record is an error, except where a record without
// length still holds a byte of ciphertext, and a CID is never reported
// unless all of it is in the datagram.
func TestUnifiedEveryHeader(t *testing.T) {
	const cidLen = 8
	for f := 0x20; f <= 0x3f; f++ {
		f := byte(f)
		hasCID, s16, hasLen := f&UnifiedCID != 0, f&UnifiedSeq16 != 0, f&UnifiedLength != 0
		seq := uint64(0xa5)
		if s16 {
			seq = 0xa5c3
		}
		rec := u13(f, cid8, seq, ct16)
		b := datagram(rec)
		fixed := 2 // the header without CID
		if s16 {
			fixed++
		}
		if hasLen {
			fixed += 2
		}
		h := fixed
		if hasCID {
			h += cidLen
		}
		eq(t, h+len(ct16), len(b), "%#02x: reference encoder", f)
		enc, err := AppendRecord(nil, rec)
		noErr(t, err, "%#02x", f)
		eq(t, b, enc, "%#02x: AppendRecord", f)

		r, n, err := ParseRecord(b, cidLen)
		noErr(t, err, "%#02x", f)
		eq(t, len(b), n, "%#02x", f)
		eq(t, rec, r, "%#02x", f)

		for _, prefix := range [][]byte{nil, datagram(hello13), datagram(cidRecord)} {
			d := join(prefix, b)
			c, err := Classify(d, cidLen)
			noErr(t, err, "%#02x behind %d bytes", f, len(prefix))
			want := Class{Kind: KindNew, Records: 1 + min(len(prefix), 1), Unified: true, ClientHello: len(prefix) > 0 && prefix[0] == byte(Handshake)}
			switch {
			case len(prefix) > 0 && prefix[0] == byte(TLS12CID):
				want.Kind, want.CID = KindEstablished, cid8 // the first CID routes
			case hasCID:
				want.Kind, want.CID = KindEstablished, cid8
			}
			eq(t, want, c, "%#02x behind %d bytes", f, len(prefix))

			for cut := len(prefix); cut < len(d); cut++ {
				c, err := Classify(d[:cut], cidLen)
				rest := cut - len(prefix)
				var werr error
				switch {
				case rest == 0:
					if cut == 0 {
						werr = ErrTooShort
					}
				case rest < fixed:
					werr = ErrTooShort
				case rest < h:
					werr = ErrTruncated
				case rest == h && !hasLen:
					werr = ErrEmptyRecord
				case hasLen:
					werr = ErrTruncated
				}
				if werr == ErrTooShort && len(prefix) > 0 {
					werr = ErrTruncated // bytes after a whole record
				}
				eq(t, werr, err, "%#02x behind %d bytes, cut at %d", f, len(prefix), cut)
				if err != nil {
					eq(t, KindInvalid, c.Kind)
					isTrue(t, c.CID == nil)
					continue
				}
				if c.Kind == KindEstablished {
					// Never a CID that is not whole in the datagram.
					eq(t, cidLen, len(c.CID))
					isTrue(t, within(c.CID, d[:cut]), "%#02x cut at %d: CID outside the datagram", f, cut)
				}
			}
		}
	}
}

// TestUnifiedRoundTripRandom mixes random DTLS 1.2 records and DTLS 1.3
// plaintext and ciphertext records in one datagram (a last record without
// length, half the time), and walks them back.
func TestUnifiedRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for range 2000 {
		cidLen := 1 + rng.IntN(20)
		if rng.IntN(4) == 0 {
			cidLen = 1 + rng.IntN(MaxCIDLen)
		}
		var rs []Record
		var firstCID []byte
		unified := false
		k := 1 + rng.IntN(5)
		for i := range k {
			var r Record
			switch rng.IntN(4) {
			case 0:
				r = Record{Type: []ContentType{ChangeCipherSpec, Alert, Handshake, ApplicationData, ACK}[rng.IntN(5)],
					Version: VersionDTLS12, Epoch: uint16(rng.Uint32()), Seq: rng.Uint64() >> 16, Fragment: randBytes(1 + rng.IntN(100))}
			case 1:
				r = Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: uint16(rng.Uint32()), Seq: rng.Uint64() >> 16,
					CID: randBytes(cidLen), Fragment: randBytes(1 + rng.IntN(100))}
			default:
				f := 0x20 | byte(rng.IntN(32)) | UnifiedLength
				if i == k-1 && rng.IntN(2) == 0 {
					f &^= UnifiedLength // only the last record may go without
				}
				seq := uint64(rng.IntN(256))
				if f&UnifiedSeq16 != 0 {
					seq = uint64(rng.IntN(1 << 16))
				}
				r = u13(f, randBytes(cidLen), seq, randBytes(1+rng.IntN(100)))
				unified = true
			}
			if r.CID != nil && firstCID == nil {
				firstCID = r.CID
			}
			rs = append(rs, r)
		}
		b := datagram(rs...)
		var enc []byte
		for _, r := range rs {
			var err error
			enc, err = AppendRecord(enc, r)
			noErr(t, err)
		}
		eq(t, b, enc, "AppendRecord writes what the reference encoder does")

		c, err := Classify(b, cidLen)
		noErr(t, err, "% x", b)
		eq(t, len(rs), c.Records)
		eq(t, firstCID, c.CID)
		eq(t, firstCID != nil, c.Kind == KindEstablished)
		eq(t, unified, c.Unified)
		for i, want := range rs {
			r, n, err := ParseRecord(b, cidLen)
			noErr(t, err)
			eq(t, want, r, "record %d", i)
			b = b[n:]
		}
		eq(t, 0, len(b))
	}
}

func TestAppendUnifiedErrors(t *testing.T) {
	dst := []byte{9}
	for _, tc := range []struct {
		r   Record
		err error
	}{
		{Record{Unified: 0x40, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2c, Type: ApplicationData, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2c, Version: VersionDTLS12, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2c}, ErrEmptyRecord},
		{Record{Unified: 0x3c, Fragment: ct16}, ErrCIDLength},
		{Record{Unified: 0x3c, CID: make([]byte, 256), Fragment: ct16}, ErrCIDLength},
		{Record{Unified: 0x2c, CID: cid8, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2d, Fragment: ct16}, ErrFieldRange}, // epoch bits 1, Epoch 0
		{Record{Unified: 0x24, Seq: 256, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2c, Seq: 1 << 16, Fragment: ct16}, ErrFieldRange},
		{Record{Unified: 0x2c, Fragment: make([]byte, 1<<16)}, ErrFieldRange},
	} {
		out, err := AppendRecord(dst, tc.r)
		errIs(t, err, tc.err, "%+v", tc.r)
		eq(t, []byte{9}, out, "dst unchanged")
	}
}

// TestUnifiedMismatchedCID: a unified header with a length field tells a
// CID of another length like a tls12_cid record does; one without says
// nothing of it, and ShortCID reports the one case that is still
// well-formed DTLS 1.3: too short for the service's CID.
func TestUnifiedMismatchedCID(t *testing.T) {
	cid4 := []byte{3, 0xa1, 0xa2, 0xa3}
	for _, tc := range []struct {
		name     string
		b        []byte
		cidLen   int
		mismatch []byte // MismatchedCID's CID, nil for none
		short    bool   // ShortCID
	}{
		{"with length: 4 read as 8", datagram(u13(0x3c, cid4, 1, ct16)), 8, cid4, false},
		{"with length behind a ClientHello: 8 read as 4", datagram(hello13, u13(0x3e, cid8, 1, ct16)), 4, cid8, false},
		// Without length, only a CID longer than 16 bytes leaves room for
		// a record that is too short for it and still holds 16 bytes of
		// ciphertext behind a shorter one.
		{"without length, too short for 20", datagram(u13(0x30, cid4, 1, ct16)), 20, nil, true},
		{"without length, too short for 20, 16 after a 1-byte CID", datagram(u13(0x30, []byte{3}, 1, ct16)), 20, nil, true},
		{"without length, 15 after a 1-byte CID", datagram(u13(0x30, []byte{3}, 1, ct16[:15])), 20, nil, false},
		{"without length, too short for 8", datagram(u13(0x30, cid4, 1, unhex("0011"))), 8, nil, false},
		{"behind a CID record", datagram(u13(0x3c, cid8, 1, ct16), u13(0x30, cid4, 1, unhex("00"))), 8, nil, false},
		{"no CID bit", unhex("2c 0001 0009 00"), 8, nil, false},
		{"broken before", join(unhex("16fefd00"), datagram(u13(0x30, cid4, 1, ct16))), 20, nil, false},
	} {
		_, err := Classify(tc.b, tc.cidLen)
		isTrue(t, err != nil, "%s: classifies", tc.name)
		mismatch, ok := MismatchedCID(tc.b, tc.cidLen)
		eq(t, tc.mismatch != nil, ok, tc.name)
		eq(t, tc.mismatch, mismatch, tc.name)
		eq(t, tc.short, ShortCID(tc.b, tc.cidLen), tc.name)
	}
	// Long enough for the service's CID: it is read with that length.
	c, err := Classify(datagram(u13(0x30, cid4, 1, ct16)), 8)
	noErr(t, err)
	eq(t, join(cid4, []byte{1}, ct16[:3]), c.CID)
	isTrue(t, !ShortCID(datagram(u13(0x30, cid4, 1, ct16)), 0), "CID length out of range")
}

func TestUnifiedHelpers(t *testing.T) {
	for b0 := range 256 {
		eq(t, b0 >= 0x20 && b0 <= 0x3f, IsUnified(byte(b0)), "%#02x", b0)
	}
	eq(t, "ack", ACK.String())
	for f := 0x20; f <= 0x3f; f++ {
		want := 2
		if f&0x08 != 0 {
			want++
		}
		if f&0x04 != 0 {
			want += 2
		}
		eq(t, want, unifiedHeaderLen(byte(f)), fmt.Sprintf("%#02x", f))
	}
}
