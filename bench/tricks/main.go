// Command tricks summarises bench/tricks.sh runs: for each build variant
// (the default build, and one build per compiler-shaped trick compiled
// without it), the median cost of each benchmark, and how much the trick
// saves. Issue 18 keeps a trick only where it saves at least 1 % CPU per
// datagram end to end at some rate.
//
//	go run ./bench/tricks -e2e DIR    # DIR/<round>-<variant>/raw.jsonl of ../shared/bench/run.sh
//	go run ./bench/tricks -micro DIR  # DIR/<round>-<variant>.txt of go test -bench output
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// base is the variant every other is compared with: the default build,
// every trick in.
const base = "default"

func main() {
	e2e := flag.String("e2e", "", "directory of end-to-end runs")
	micro := flag.String("micro", "", "directory of micro-benchmark runs")
	flag.Parse()
	var err error
	switch {
	case *e2e != "":
		err = summariseE2E(*e2e)
	case *micro != "":
		err = summariseMicro(*micro)
	default:
		err = fmt.Errorf("give -e2e DIR or -micro DIR")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tricks:", err)
		os.Exit(1)
	}
}

// samples maps variant → measure → values, one per round.
type samples map[string]map[string][]float64

func (s samples) add(variant, measure string, v float64) {
	if s[variant] == nil {
		s[variant] = map[string][]float64{}
	}
	s[variant][measure] = append(s[variant][measure], v)
}

// row is one line of ../shared/bench/run.sh's raw.jsonl.
type row struct {
	Exp        string  `json:"exp"`
	Target     string  `json:"target"`
	Rate       int     `json:"rate"`
	NsPerDgram float64 `json:"fwd_ns_per_dgram"`
}

// summariseE2E reads one raw.jsonl per run and compares, per offered rate,
// cidproxy's CPU per datagram as a multiple of nullfwd's in the same run:
// the ratio cancels the drift of a shared machine between runs.
func summariseE2E(dir string) error {
	runs, err := filepath.Glob(filepath.Join(dir, "*", "raw.jsonl"))
	if err != nil || len(runs) == 0 {
		return fmt.Errorf("no %s/*/raw.jsonl", dir)
	}
	s := samples{}
	for _, path := range runs {
		variant := variantOf(filepath.Base(filepath.Dir(path)))
		rows, err := readRows(path)
		if err != nil {
			return err
		}
		null := map[int]float64{}
		for _, r := range rows {
			if r.Exp == "grid" && r.Target == "nullfwd" && r.NsPerDgram > 0 {
				null[r.Rate] = r.NsPerDgram
			}
		}
		for _, r := range rows {
			if r.Exp == "grid" && r.Target == "cidproxy" && null[r.Rate] > 0 {
				s.add(variant, rateName(r.Rate), r.NsPerDgram/null[r.Rate])
			}
		}
	}
	fmt.Println("cidproxy CPU per datagram as a multiple of nullfwd's in the same run (median over rounds);")
	fmt.Println("saved = what the trick saves: (without − with) / without, where \"with\" is the default build.")
	s.print("%.3f×", true)
	return nil
}

func readRows(path string) ([]row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []row
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
}

func rateName(r int) string {
	if r == 0 {
		return "flat out"
	}
	return fmt.Sprintf("%dk/s", r/1000)
}

// summariseMicro reads go test -bench output, one file per run, and
// compares the CPU (cpu-ns/op where the benchmark reports it, else ns/op)
// of every benchmark.
func summariseMicro(dir string) error {
	runs, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(runs) == 0 {
		return fmt.Errorf("no %s/*.txt", dir)
	}
	s := samples{}
	for _, path := range runs {
		variant := variantOf(strings.TrimSuffix(filepath.Base(path), ".txt"))
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
				continue
			}
			name := f[0]
			if i := strings.LastIndexByte(name, '-'); i > 0 {
				name = name[:i] // GOMAXPROCS suffix
			}
			v := -1.0
			for i := 2; i+1 < len(f); i++ {
				x, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					continue
				}
				if f[i+1] == "cpu-ns/op" || (f[i+1] == "ns/op" && v < 0) {
					v = x
				}
			}
			if v >= 0 {
				s.add(variant, name, v)
			}
		}
	}
	fmt.Println("CPU ns/op (median over rounds); saved = (without − with) / without, where \"with\" is the default build.")
	s.print("%.1f", false)
	return nil
}

// variantOf takes "<round>-<variant>".
func variantOf(name string) string {
	if _, v, ok := strings.Cut(name, "-"); ok {
		return v
	}
	return name
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func (s samples) print(format string, verdicts bool) {
	var measures []string
	for m := range s[base] {
		measures = append(measures, m)
	}
	sort.Strings(measures)
	var variants []string
	for v := range s {
		if v != base {
			variants = append(variants, v)
		}
	}
	sort.Strings(variants)
	for _, m := range measures {
		with := median(s[base][m])
		fmt.Printf("\n%s: %s %s (n=%d)\n", m, base, fmt.Sprintf(format, with), len(s[base][m]))
		for _, v := range variants {
			xs := s[v][m]
			if len(xs) == 0 {
				continue
			}
			without := median(xs)
			saved := (without - with) / without * 100
			verdict := ""
			switch {
			case !verdicts || v == "none":
			case saved >= 1:
				verdict = "keep (saves ≥ 1 %)"
			default:
				verdict = "remove (saves < 1 %)"
			}
			fmt.Printf("  without %-26s %s (n=%d)  saved %+6.2f %%  %s\n", v, fmt.Sprintf(format, without), len(xs), saved, verdict)
		}
	}
}
