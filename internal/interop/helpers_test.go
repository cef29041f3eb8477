package interop

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testtool"
)

var update = flag.Bool("update", false, "rewrite ../../dtls/testdata/*.hex from live captures (then run go test -update ./dtls for the fuzz seeds)")

// The core packages' test data, read in place.
var (
	dtlsTestdata = filepath.Join("..", "..", "dtls", "testdata")
	ppv2Testdata = filepath.Join("..", "..", "ppv2", "testdata")
)

// Addresses of the PPv2 cases (documentation ranges).
var (
	cli4 = netip.MustParseAddrPort("192.0.2.1:51000")
	svc4 = netip.MustParseAddrPort("198.51.100.7:5684")
	cli6 = netip.MustParseAddrPort("[2001:db8::1]:4433")
	svc6 = netip.MustParseAddrPort("[2001:db8::7]:443")
)

// corpus reads the seed corpus of a core package's fuzz target: one entry
// per file, each the file's values in order ([]byte and byte literals).
func corpus(t testing.TB, dir string) map[string][]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	noErr(t, err)
	if len(files) == 0 {
		t.Fatalf("no seeds in %s", dir)
	}
	out := map[string][]any{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		noErr(t, err)
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a corpus file", f)
		}
		var vals []any
		for _, l := range lines[1:] {
			vals = append(vals, corpusValue(t, f, l))
		}
		out[filepath.Base(f)] = vals
	}
	return out
}

func corpusValue(t testing.TB, file, l string) any {
	t.Helper()
	switch {
	case strings.HasPrefix(l, "[]byte(") && strings.HasSuffix(l, ")"):
		s, err := strconv.Unquote(l[len("[]byte(") : len(l)-1])
		noErr(t, err, "%s: %s", file, l)
		return []byte(s)
	case strings.HasPrefix(l, "byte(") && strings.HasSuffix(l, ")"):
		lit := l[len("byte(") : len(l)-1]
		if strings.HasPrefix(lit, "'") {
			r, _, _, err := strconv.UnquoteChar(lit[1:len(lit)-1], '\'')
			noErr(t, err, "%s: %s", file, l)
			return byte(r)
		}
		n, err := strconv.ParseUint(lit, 0, 8)
		noErr(t, err, "%s: %s", file, l)
		return byte(n)
	}
	t.Fatalf("%s: unsupported corpus line %q", file, l)
	return nil
}

func readHex(t testing.TB, name string) []byte {
	t.Helper()
	return testtool.ReadHex(t, filepath.Join(dtlsTestdata, name))
}

// writeHex writes a golden datagram into dtls/testdata with one record per
// line, so that a reader sees the record boundaries.
func writeHex(t testing.TB, name, comment string, b []byte, cidLen int) {
	t.Helper()
	var sb strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(comment, "\n"), "\n") {
		sb.WriteString("# " + line + "\n")
	}
	sb.WriteString("\n")
	for rest := b; len(rest) > 0; {
		n := len(rest)
		if _, m, err := dtls.ParseRecord(rest, cidLen); err == nil {
			n = m
		}
		sb.WriteString(hex.EncodeToString(rest[:n]) + "\n")
		rest = rest[n:]
	}
	noErr(t, os.WriteFile(filepath.Join(dtlsTestdata, name), []byte(sb.String()), 0o644))
}

// Assertion helpers, all as the moved tests used them.

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

// equal is eq for the PPv2 tests.
func equal(t testing.TB, want, got any, msg ...any) { t.Helper(); eq(t, want, got, msg...) }

func isTrue(t testing.TB, cond bool, msg ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("condition failed%s", msgOf(msg))
	}
}

// withCRC fills the 4-byte CRC32C TLV value at off of hdr, computed over
// hdr with that value zeroed (PPv2 §2.2.5), with the standard library's
// Castagnoli table.
func withCRC(hdr []byte, off int) []byte {
	clear(hdr[off : off+4])
	binary.BigEndian.PutUint32(hdr[off:], crc32c(hdr))
	return hdr
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }
