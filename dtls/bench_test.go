package dtls

import (
	"strings"
	"testing"
)

func benchClassify(b *testing.B, d []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		if _, err := Classify(d, liveCIDLen); err != nil {
			b.Fatal(err)
		}
	}
}

// Real datagrams from testdata: a client's CID record (application data),
// OpenSSL's first ClientHello, and pion's flight 5 (3 records); beside
// them, in the same run, DTLS 1.3 (RFC 9147 vectors): a unified header
// with CID, the 8-bit sequence number without length, Finished and ACK,
// the minimal header without CID, a ClientHello with 0-RTT, and a CID
// record of DTLS 1.2's size (the dtls12-cid-100 / dtls13-cid-100 pair
// differs in the header only).
func BenchmarkClassify(b *testing.B) {
	b.Run("cid-record", func(b *testing.B) { benchClassify(b, readHex(b, "pion_appdata.hex")) })
	b.Run("clienthello", func(b *testing.B) { benchClassify(b, readHex(b, "openssl_clienthello.hex")) })
	b.Run("flight5", func(b *testing.B) { benchClassify(b, readHex(b, "pion_flight5.hex")) })
	b.Run("dtls13-cid", func(b *testing.B) { benchClassify(b, readHex(b, "rfc9147/full.hex")) })
	b.Run("dtls13-cid-seq8-nolength", func(b *testing.B) { benchClassify(b, readHex(b, "rfc9147/cid_seq8_nolength.hex")) })
	b.Run("dtls13-finished-ack", func(b *testing.B) { benchClassify(b, readHex(b, "rfc9147/finished_ack.hex")) })
	b.Run("dtls13-minimal", func(b *testing.B) { benchClassify(b, readHex(b, "rfc9147/minimal.hex")) })
	b.Run("dtls13-clienthello-0rtt", func(b *testing.B) { benchClassify(b, readHex(b, "rfc9147/clienthello_0rtt.hex")) })
	b.Run("dtls12-cid-100", func(b *testing.B) {
		benchClassify(b, datagram(Record{Type: TLS12CID, Version: VersionDTLS12, Epoch: 1, CID: cid8, Fragment: make([]byte, 100)}))
	})
	b.Run("dtls13-cid-100", func(b *testing.B) { benchClassify(b, datagram(u13(0x3e, cid8, 1, make([]byte, 100)))) })
	b.Run("dtls13-truncated", func(b *testing.B) {
		d := readHex(b, "rfc9147/full.hex")
		d = d[:len(d)-1]
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Classify(d, liveCIDLen); err != ErrTruncated {
				b.Fatal(err)
			}
		}
	})
	b.Run("truncated", func(b *testing.B) { // the error path, for floods of garbage
		d := readHex(b, "pion_appdata.hex")
		d = d[:len(d)-1]
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Classify(d, liveCIDLen); err != ErrTruncated {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkParseRecord(b *testing.B) {
	for _, f := range []string{"pion_appdata.hex", "rfc9147/full.hex"} {
		b.Run(strings.TrimSuffix(f, ".hex"), func(b *testing.B) {
			d := readHex(b, f)
			b.ReportAllocs()
			b.SetBytes(int64(len(d)))
			for b.Loop() {
				if _, _, err := ParseRecord(d, liveCIDLen); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOrdinalFirst(b *testing.B) {
	c := OrdinalFirst{}
	b.Run("Ordinal", func(b *testing.B) {
		cid := cid8
		b.ReportAllocs()
		for b.Loop() {
			if o, _ := c.Ordinal(cid); o != 7 {
				b.Fatal(o)
			}
		}
	})
	b.Run("AppendCID", func(b *testing.B) {
		buf := make([]byte, 0, 8)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.AppendCID(buf, 7); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestAllocs(t *testing.T) {
	var ds [][]byte
	for _, g := range goldens {
		ds = append(ds, readHex(t, g.file))
	}
	for _, tc := range classifyCases {
		ds = append(ds, tc.in) // errors too: garbage must not allocate
	}
	for _, v := range readVectors(t) {
		ds = append(ds, v.b)
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, d := range ds {
			_, _ = Classify(d, liveCIDLen)
			_, _, _ = ParseRecord(d, liveCIDLen)
			_, _ = MismatchedCID(d, liveCIDLen)
			_ = ShortCID(d, 20)
		}
	}); n != 0 {
		t.Fatalf("Classify/ParseRecord/MismatchedCID/ShortCID: %v allocs", n)
	}
	c := OrdinalFirst{}
	buf := make([]byte, 0, 8)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = c.Ordinal(cid8)
		_, _ = c.AppendCID(buf, 7)
	}); n != 0 {
		t.Fatalf("OrdinalFirst: %v allocs", n)
	}
	rec := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = AppendRecord(rec, cidRecord)
		_ = StartsSession(flight5, 8)
		_, _ = HelloSeq(ds[0], liveCIDLen)
	}); n != 0 {
		t.Fatalf("AppendRecord/StartsSession/HelloSeq: %v allocs", n)
	}
}
