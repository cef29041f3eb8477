package dtls

import (
	"path/filepath"
	"strings"
	"testing"
)

// The golden datagrams were captured from real peers by TestLivePion and
// TestLiveOpenSSL in internal/interop (go test -update there), which also
// hold every datagram here, cut or whole, to pion's parser; these tests
// need no peer.

const (
	liveOrdinal = 7 // the pion server's ordinal in the captures
	liveCIDLen  = 8
)

var goldens = []struct {
	file        string
	kind        Kind
	records     int
	clientHello bool
	version     uint16 // of the first record
}{
	{"openssl_clienthello.hex", KindNew, 1, true, VersionDTLS10},
	{"pion_clienthello_1.hex", KindNew, 1, true, VersionDTLS12},
	{"pion_clienthello_2.hex", KindNew, 1, true, VersionDTLS12}, // with the cookie
	{"pion_server_hello.hex", KindNew, 4, false, VersionDTLS12},
	{"pion_flight5.hex", KindEstablished, 3, false, VersionDTLS12},
	{"pion_appdata.hex", KindEstablished, 1, false, VersionDTLS12},
	{"pion_close_notify.hex", KindEstablished, 1, false, VersionDTLS12},
}

func TestGolden(t *testing.T) {
	codec := OrdinalFirst{Length: liveCIDLen}
	for _, g := range goldens {
		t.Run(g.file, func(t *testing.T) {
			b := readHex(t, g.file)
			c, err := Classify(b, liveCIDLen)
			noErr(t, err)
			eq(t, g.kind, c.Kind)
			eq(t, g.records, c.Records)
			eq(t, g.clientHello, c.ClientHello)
			if g.kind == KindEstablished {
				ord, ok := codec.Ordinal(c.CID)
				isTrue(t, ok)
				eq(t, uint8(liveOrdinal), ord)
			} else {
				isTrue(t, c.CID == nil)
			}
			r, _, err := ParseRecord(b, liveCIDLen)
			noErr(t, err)
			eq(t, g.version, r.Version)
		})
	}
}

// TestGoldenFlight5Layout checks the layout docs/design.md's routing rule
// is about:
// ClientKeyExchange and ChangeCipherSpec in epoch 0, then Finished as a
// tls12_cid record in epoch 1.
func TestGoldenFlight5Layout(t *testing.T) {
	b := readHex(t, "pion_flight5.hex")
	want := []struct {
		typ   ContentType
		epoch uint16
	}{{Handshake, 0}, {ChangeCipherSpec, 0}, {TLS12CID, 1}}
	for i, w := range want {
		r, n, err := ParseRecord(b, liveCIDLen)
		noErr(t, err, "record %d", i)
		eq(t, w.typ, r.Type, "record %d", i)
		eq(t, w.epoch, r.Epoch, "record %d", i)
		b = b[n:]
	}
	eq(t, 0, len(b))
}

// TestGoldenCorrupted damages every golden datagram in ways that must never
// yield "new": cutting it anywhere, and appending a partial record.
func TestGoldenCorrupted(t *testing.T) {
	for _, g := range goldens {
		b := readHex(t, g.file)
		for cut := range len(b) {
			c, err := Classify(b[:cut], liveCIDLen)
			if err == nil {
				// Only a cut at a record boundary leaves a valid datagram,
				// and then it has fewer records.
				isTrue(t, c.Records < g.records, "%s cut at %d", g.file, cut)
				continue
			}
			eq(t, KindInvalid, c.Kind)
		}
		for _, tail := range []string{"16", "16fefd", "19fefd000100000000000103"} {
			_, err := Classify(append(b[:len(b):len(b)], unhex(tail)...), liveCIDLen)
			errIs(t, err, ErrTruncated, "%s + %s", g.file, tail)
		}
	}
}

// writeSeeds rewrites the fuzz seed corpora from the golden datagrams, the
// synthetic cases of record_test.go and unified_test.go, and the vectors
// of vector_test.go.
func writeSeeds(t *testing.T) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.hex"))
	noErr(t, err)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".hex")
		b := readHex(t, filepath.Base(f))
		writeSeed(t, "FuzzClassify", name, b, liveCIDLen)
		r, n, err := ParseRecord(b, liveCIDLen)
		noErr(t, err)
		writeSeed(t, "FuzzParseRecord", name, b[:n], liveCIDLen)
		if r.Type == TLS12CID {
			writeSeed(t, "FuzzParseRecord", name+"_cidlen1", b[:n], 1)
		}
	}
	for _, tc := range classifyCases {
		writeSeed(t, "FuzzClassify", "synthetic_"+tc.name, tc.in, uint8(tc.cidLen))
		writeSeed(t, "FuzzParseRecord", "synthetic_"+tc.name, tc.in, uint8(tc.cidLen))
	}
	for _, v := range readVectors(t) {
		name := strings.ReplaceAll(v.name, "/", "_")
		writeSeed(t, "FuzzClassify", name, v.b, uint8(v.cidLen))
		writeSeed(t, "FuzzParseRecord", name, v.b, uint8(v.cidLen))
	}
}

// TestUpdateSeeds rewrites the fuzz seed corpora from the golden captures
// and the table cases when run with -update. internal/interop feeds the
// same corpora to pion.
func TestUpdateSeeds(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz")
	}
	writeSeeds(t)
}
