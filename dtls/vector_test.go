package dtls

import (
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

// vectorDirs hold datagrams with a sidecar of what Classify must say
// (testdata/README.md): written by hand from RFC 9147, and captured from
// wolfSSL.
var vectorDirs = []string{"rfc9147", "wolfssl"}

// A vector is one NAME.hex datagram and its NAME.expect sidecar.
type vector struct {
	name        string // dir/NAME
	b           []byte
	cidLen      int
	server      bool // direction: server
	kind        Kind
	err         error
	ordinal     int    // -1 when not given
	cid         []byte // nil when not given
	records     int    // -1 when not given
	clientHello string // "", "true" or "false"
	unified     string
}

var vectorErrors = map[string]error{
	"ErrTooShort": ErrTooShort, "ErrTruncated": ErrTruncated, "ErrContentType": ErrContentType,
	"ErrVersion": ErrVersion, "ErrEmptyRecord": ErrEmptyRecord,
}

// readVectors reads every vector of the directories that exist. A .hex
// file without a sidecar, a sidecar without a .hex file, or a sidecar it
// cannot read fails the test.
func readVectors(t testing.TB) []vector {
	t.Helper()
	var vs []vector
	for _, dir := range vectorDirs {
		names := map[string]bool{}
		for _, ext := range []string{".hex", ".expect"} {
			files, err := filepath.Glob(filepath.Join("testdata", dir, "*"+ext))
			noErr(t, err)
			for _, f := range files {
				names[strings.TrimSuffix(f, ext)] = true
			}
		}
		for _, base := range slices.Sorted(maps.Keys(names)) {
			vs = append(vs, readVector(t, base))
		}
	}
	return vs
}

func readVector(t testing.TB, base string) vector {
	t.Helper()
	name := strings.TrimPrefix(filepath.ToSlash(base), "testdata/")
	raw, err := os.ReadFile(base + ".hex")
	if err != nil {
		t.Fatalf("%s: %v (every .expect needs its .hex)", name, err)
	}
	exp, err := os.ReadFile(base + ".expect")
	if err != nil {
		t.Fatalf("%s: %v (every .hex needs its .expect: see testdata/README.md)", name, err)
	}
	v := vector{name: name, b: testtool.Hex(t, string(raw)), ordinal: -1, records: -1}
	seen := map[string]bool{}
	for i, line := range strings.Split(string(exp), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		bad := func(why string) { t.Fatalf("%s.expect:%d: %q: %s", name, i+1, line, why) }
		if !ok {
			bad("want key: value")
		}
		if seen[key] {
			bad("key given twice")
		}
		seen[key] = true
		num := func(lo, hi int) int {
			n, err := strconv.Atoi(val)
			if err != nil || n < lo || n > hi {
				bad("want a number in " + strconv.Itoa(lo) + ".." + strconv.Itoa(hi))
			}
			return n
		}
		boolean := func() string {
			if val != "true" && val != "false" {
				bad("want true or false")
			}
			return val
		}
		switch key {
		case "cid_len":
			v.cidLen = num(MinCIDLen, MaxCIDLen)
		case "direction":
			if val != "client" && val != "server" {
				bad("want client or server")
			}
			v.server = val == "server"
		case "kind":
			switch val {
			case "new":
				v.kind = KindNew
			case "established":
				v.kind = KindEstablished
			case "invalid":
				v.kind = KindInvalid
			default:
				bad("want new, established or invalid")
			}
		case "error":
			if v.err = vectorErrors[val]; v.err == nil {
				bad("not one of the package's record errors")
			}
		case "ordinal":
			v.ordinal = num(0, 254)
		case "cid":
			if v.cid, err = hex.DecodeString(val); err != nil || len(v.cid) == 0 {
				bad("want the CID in hex")
			}
		case "records":
			v.records = num(0, 1<<16)
		case "client_hello":
			v.clientHello = boolean()
		case "unified":
			v.unified = boolean()
		default:
			bad("unknown key (testdata/README.md lists them)")
		}
	}
	switch {
	case !seen["cid_len"] || !seen["kind"]:
		t.Fatalf("%s.expect: cid_len and kind are required", name)
	case (v.kind == KindInvalid) != (v.err != nil):
		t.Fatalf("%s.expect: error goes with kind: invalid, and only with it", name)
	case v.kind != KindEstablished && (v.ordinal >= 0 || v.cid != nil):
		t.Fatalf("%s.expect: ordinal and cid go with kind: established", name)
	}
	return v
}

// TestVectors classifies every vector and checks what its sidecar says,
// and that ParseRecord walks it into the same records.
func TestVectors(t *testing.T) {
	vs := readVectors(t)
	if len(vs) == 0 {
		t.Fatal("no vectors under testdata/rfc9147")
	}
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			c, err := Classify(v.b, v.cidLen)
			if v.kind == KindInvalid {
				if !errors.Is(err, v.err) {
					t.Fatalf("Classify: %v, want %v", err, v.err)
				}
				eq(t, KindInvalid, c.Kind)
				return
			}
			noErr(t, err, "Classify")
			eq(t, v.kind, c.Kind, "kind")
			if v.records >= 0 {
				eq(t, v.records, c.Records, "records")
			}
			if v.clientHello != "" {
				eq(t, v.clientHello == "true", c.ClientHello, "client_hello")
			}
			if v.unified != "" {
				eq(t, v.unified == "true", c.Unified, "unified")
			}
			if v.cid != nil {
				eq(t, v.cid, c.CID, "cid")
			}
			if v.ordinal >= 0 {
				ord, ok := OrdinalFirst{Length: v.cidLen}.Ordinal(c.CID)
				isTrue(t, ok)
				eq(t, uint8(v.ordinal), ord, "ordinal")
			}
			isTrue(t, StartsSession(v.b, v.cidLen) == c.ClientHello)
			n := 0
			for rest := v.b; len(rest) > 0; n++ {
				_, k, err := ParseRecord(rest, v.cidLen)
				noErr(t, err, "record %d", n)
				rest = rest[k:]
			}
			eq(t, c.Records, n, "ParseRecord's walk")
		})
	}
}
