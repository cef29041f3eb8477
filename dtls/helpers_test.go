package dtls

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

var update = flag.Bool("update", false, "rewrite the fuzz seed corpora from testdata/*.hex and the table cases")

// appendRecord is the reference encoder the tests build records with. It
// writes r.CID only for TLS12CID records and unified headers with the C
// bit, and takes the length from r.Fragment.
func appendRecord(dst []byte, r Record) []byte {
	if f := r.Unified; f != 0 {
		// RFC 9147 §4: 001CSLEE, CID (C), sequence number 8 or 16 bits (S),
		// length (L), encrypted_record.
		dst = append(dst, f)
		if f&0x10 != 0 {
			dst = append(dst, r.CID...)
		}
		if f&0x08 != 0 {
			dst = append(dst, byte(r.Seq>>8))
		}
		dst = append(dst, byte(r.Seq))
		if f&0x04 != 0 {
			dst = append(dst, byte(len(r.Fragment)>>8), byte(len(r.Fragment)))
		}
		return append(dst, r.Fragment...)
	}
	dst = append(dst, byte(r.Type), byte(r.Version>>8), byte(r.Version), byte(r.Epoch>>8), byte(r.Epoch))
	for s := 40; s >= 0; s -= 8 {
		dst = append(dst, byte(r.Seq>>s))
	}
	if r.Type == TLS12CID {
		dst = append(dst, r.CID...)
	}
	dst = append(dst, byte(len(r.Fragment)>>8), byte(len(r.Fragment)))
	return append(dst, r.Fragment...)
}

// datagram joins records built by appendRecord.
func datagram(rs ...Record) []byte {
	var b []byte
	for _, r := range rs {
		b = appendRecord(b, r)
	}
	return b
}

func unhex(s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		panic(err)
	}
	return b
}

// readHex reads a golden datagram: hex digits with any white space, and
// comment lines starting with '#'.
func readHex(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("%v (capture it with: cd internal/interop && go test -run Live -update)", err)
	}
	return testtool.Hex(t, string(raw))
}

// writeSeed writes one seed of the fuzz corpus of target in Go's corpus
// file format. Both targets take (datagram, cidLen).
func writeSeed(t testing.TB, target, name string, b []byte, cidLen uint8) {
	t.Helper()
	dir := filepath.Join("testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nbyte(%d)\n", b, cidLen)
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Assertion helpers, all fatal. testify's assert package needs a module
// (go.yaml.in/yaml/v3) that the shared go.sum lacks, and go.mod is not this
// package's to change.

func msgOf(msg []any) string {
	if len(msg) == 0 {
		return ""
	}
	if f, ok := msg[0].(string); ok {
		return ": " + fmt.Sprintf(f, msg[1:]...)
	}
	return ": " + fmt.Sprint(msg...)
}

func noErr(t testing.TB, err error, msg ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error %v%s", err, msgOf(msg))
	}
}

func errIs(t testing.TB, err, target error, msg ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v%s", err, target, msgOf(msg))
	}
}

// eq compares with reflect.DeepEqual; byte slices compare by content.
func eq(t testing.TB, want, got any, msg ...any) {
	t.Helper()
	if w, ok := want.([]byte); ok {
		if g, ok := got.([]byte); ok && bytes.Equal(w, g) {
			return
		}
	} else if reflect.DeepEqual(want, got) {
		return
	}
	t.Fatalf("got  %+v\nwant %+v%s", got, want, msgOf(msg))
}

func isTrue(t testing.TB, cond bool, msg ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("condition failed%s", msgOf(msg))
	}
}
