package dtls

import "testing"

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
// OpenSSL's first ClientHello, and pion's flight 5 (3 records).
func BenchmarkClassify(b *testing.B) {
	b.Run("cid-record", func(b *testing.B) { benchClassify(b, readHex(b, "pion_appdata.hex")) })
	b.Run("clienthello", func(b *testing.B) { benchClassify(b, readHex(b, "openssl_clienthello.hex")) })
	b.Run("flight5", func(b *testing.B) { benchClassify(b, readHex(b, "pion_flight5.hex")) })
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
	d := readHex(b, "pion_appdata.hex")
	b.ReportAllocs()
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		if _, _, err := ParseRecord(d, liveCIDLen); err != nil {
			b.Fatal(err)
		}
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
	if n := testing.AllocsPerRun(100, func() {
		for _, d := range ds {
			_, _ = Classify(d, liveCIDLen)
			_, _, _ = ParseRecord(d, liveCIDLen)
		}
	}); n != 0 {
		t.Fatalf("Classify/ParseRecord: %v allocs", n)
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
