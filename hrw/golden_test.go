package hrw

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt")

const goldenFile = "testdata/golden.txt"

var goldenSets = []struct {
	name  string
	seed  uint64
	cands []Candidate
}{
	{"one", 0, []Candidate{{Ordinal: 0, Weight: 1}}},
	{"empty", 0, nil},
	{"w123", 0, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 3}}},
	{"w123-seeded", 0x0123456789abcdef, []Candidate{{Ordinal: 0, Weight: 1}, {Ordinal: 1, Weight: 2}, {Ordinal: 2, Weight: 3}}},
	{"sparse", 42, []Candidate{{Ordinal: 7, Weight: 1}, {Ordinal: 200, Weight: math.MaxUint32}, {Ordinal: 254, Weight: 1000}, {Ordinal: 100, Weight: 5}}},
	{"mixed32", 1, mixedCands(32)},
	{"mixed254", math.MaxUint64, mixedCands(254)},
}

var goldenAddrs = [][2]string{
	{"192.0.2.1:5684", "203.0.113.10:5684"},
	{"198.51.100.77:40000", "203.0.113.10:5684"},
	{"[2001:db8::1]:55555", "[2001:db8:ffff::10]:443"},
	{"[::ffff:192.0.2.1]:5684", "203.0.113.10:5684"}, // same key as the first line
	{"0.0.0.0:0", "[::]:0"},
}

func formatCands(cs []Candidate) string {
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%d:%d", c.Ordinal, c.Weight))
	}
	return strings.Join(parts, ",")
}

func parseCands(s string) ([]Candidate, error) {
	var cs []Candidate
	if s == "" {
		return nil, nil
	}
	for p := range strings.SplitSeq(s, ",") {
		o, w, ok := strings.Cut(p, ":")
		if !ok {
			return nil, fmt.Errorf("bad candidate %q", p)
		}
		on, err := strconv.ParseUint(o, 10, 8)
		if err != nil {
			return nil, err
		}
		wn, err := strconv.ParseUint(w, 10, 32)
		if err != nil {
			return nil, err
		}
		cs = append(cs, Candidate{Ordinal: uint8(on), Weight: uint32(wn)})
	}
	return cs, nil
}

func fmtPick(o uint8, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.Itoa(int(o))
}

func generateGolden(t *testing.T) []byte {
	var b bytes.Buffer
	b.WriteString(`# hrw golden vectors; regenerate with: go test ./hrw -run TestGolden -update
# Any change to a line below changes which backend new sessions go to.
#
# neglog <h> <negLog(h)>                        (hex; fixed point 2^-57)
# set <name> seed=<hex> cands=<ordinal:weight,...>
# table <XXH64 (seed 0) of the 16384 bucket owners>
# key <hex key, or empty> <picked ordinal, or - for none>
# addrs <client> <service> <picked ordinal>     (PickAddrs)
`)
	r := rand.New(rand.NewPCG(7, 7))
	hs := []uint64{0, 1, 2, 1 << 62, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64, math.MaxUint64 - 1<<20}
	for range 24 {
		hs = append(hs, r.Uint64(), r.Uint64()>>r.IntN(64), ^(r.Uint64() >> r.IntN(64)))
	}
	for _, h := range hs {
		fmt.Fprintf(&b, "neglog %016x %016x\n", h, negLog(h))
	}
	var keys [][]byte
	for n := range 41 {
		k := make([]byte, n)
		for i := range k {
			k[i] = byte(r.Uint32())
		}
		keys = append(keys, k)
	}
	for _, s := range goldenSets {
		tb := mustNew(t, s.seed, s.cands)
		fmt.Fprintf(&b, "\nset %s seed=%016x cands=%s\n", s.name, s.seed, formatCands(s.cands))
		fmt.Fprintf(&b, "table %016x\n", xxhash.Sum64(tb.owner[:]))
		for _, k := range keys {
			hk := hex.EncodeToString(k)
			if hk == "" {
				hk = "empty"
			}
			fmt.Fprintf(&b, "key %s %s\n", hk, fmtPick(tb.Pick(k)))
		}
		for _, a := range goldenAddrs {
			c, sv := netip.MustParseAddrPort(a[0]), netip.MustParseAddrPort(a[1])
			fmt.Fprintf(&b, "addrs %s %s %s\n", a[0], a[1], fmtPick(tb.PickAddrs(c, sv)))
		}
	}
	return b.Bytes()
}

// TestGolden checks every vector in testdata/golden.txt. The file is the
// contract between replicas and architectures: it must not change unless the
// mapping is meant to change.
func TestGolden(t *testing.T) {
	if *update {
		if err := os.WriteFile(goldenFile, generateGolden(t), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		tb      *Table
		checked int
	)
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if text == "" || text[0] == '#' {
			continue
		}
		fields := strings.Fields(text)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s: %s", goldenFile, line, text, fmt.Sprintf(format, args...))
		}
		switch fields[0] {
		case "neglog":
			h, _ := strconv.ParseUint(fields[1], 16, 64)
			want, _ := strconv.ParseUint(fields[2], 16, 64)
			if got := negLog(h); got != want {
				fail("negLog = %016x", got)
			}
		case "set":
			seed, err := strconv.ParseUint(strings.TrimPrefix(fields[2], "seed="), 16, 64)
			if err != nil {
				fail("%v", err)
			}
			cands, err := parseCands(strings.TrimPrefix(fields[3], "cands="))
			if err != nil {
				fail("%v", err)
			}
			tb = mustNew(t, seed, cands)
		case "table":
			if got := fmt.Sprintf("%016x", xxhash.Sum64(tb.owner[:])); got != fields[1] {
				fail("table hash %s", got)
			}
		case "key":
			k, err := hex.DecodeString(strings.TrimPrefix(fields[1], "empty"))
			if err != nil {
				fail("%v", err)
			}
			if got := fmtPick(tb.Pick(k)); got != fields[2] {
				fail("Pick = %s", got)
			}
		case "addrs":
			c, sv := netip.MustParseAddrPort(fields[1]), netip.MustParseAddrPort(fields[2])
			if got := fmtPick(tb.PickAddrs(c, sv)); got != fields[3] {
				fail("PickAddrs = %s", got)
			}
		default:
			fail("unknown line")
		}
		checked++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if checked < 300 {
		t.Fatalf("only %d vectors checked", checked)
	}
}
