package main

import (
	"fmt"
	"slices"
	"strings"
)

// results is everything one benchmark run produced; results.json holds it
// and the plot program reads its Summary.
type results struct {
	Command     string   `json:"command"`
	Quick       bool     `json:"quick"`
	Reps        int      `json:"reps"`
	Started     string   `json:"started"`
	Elapsed     string   `json:"elapsed"`
	Machine     string   `json:"machine"`
	LoadBefore  string   `json:"loadavg_before"`
	LoadAfter   string   `json:"loadavg_after"`
	FwdCPU      string   `json:"forwarder_cpu"`
	GenCPU      string   `json:"loadgen_cpu"`
	Timing      string   `json:"timing"`
	RateClients int      `json:"rate_clients"`
	ClientRate  uint64   `json:"client_rate"`
	Samples     []sample `json:"samples"`
	Summary     []summary
	Failures    []string `json:"failures,omitempty"`
	Profiles    []string `json:"profiles,omitempty"`
}

// A summary is the median of one forwarder's samples at one point, and its
// ratios to the raw-limit forwarder: medians over repetitions of the
// ratio of two samples taken back to back. A ratio of 0 means none.
type summary struct {
	Forwarder string  `json:"forwarder"`
	Point     point   `json:"point"`
	Runs      int     `json:"runs"`
	Median    sample  `json:"median"`
	CPURatio  float64 `json:"cpu_ratio"`
	UserRatio float64 `json:"user_ratio"`
	P99Ratio  float64 `json:"p99_ratio"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// summarize fills Summary from Samples.
func (r *results) summarize() {
	type key struct {
		f  string
		pt point
	}
	var order []key
	groups := map[key][]sample{}
	raw := map[point]map[int]sample{} // point → rep → raw sample
	for _, s := range r.Samples {
		k := key{s.Forwarder, s.Point}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], s)
		if s.Forwarder == rawName {
			if raw[s.Point] == nil {
				raw[s.Point] = map[int]sample{}
			}
			raw[s.Point][s.Rep] = s
		}
	}
	r.Summary = nil
	for _, k := range order {
		ss := groups[k]
		col := func(f func(sample) float64) float64 {
			v := make([]float64, 0, len(ss))
			for _, s := range ss {
				v = append(v, f(s))
			}
			return median(v)
		}
		ratio := func(f func(sample) float64) float64 {
			var v []float64
			for _, s := range ss {
				if b, ok := raw[s.Point][s.Rep]; ok && f(b) > 0 {
					v = append(v, f(s)/f(b))
				}
			}
			return median(v)
		}
		m := sample{Forwarder: k.f, Point: k.pt, Rep: -1,
			OfferedPPS: col(func(s sample) float64 { return s.OfferedPPS }),
			RoundTrips: col(func(s sample) float64 { return s.RoundTrips }),
			Loss:       col(func(s sample) float64 { return s.Loss }),
			P50:        col(func(s sample) float64 { return s.P50 }),
			P90:        col(func(s sample) float64 { return s.P90 }),
			P99:        col(func(s sample) float64 { return s.P99 }),
			P999:       col(func(s sample) float64 { return s.P999 }),
			UserUS:     col(func(s sample) float64 { return s.UserUS }),
			SysUS:      col(func(s sample) float64 { return s.SysUS }),
			TotalUS:    col(func(s sample) float64 { return s.TotalUS }),
			PerCPUSec:  col(func(s sample) float64 { return s.PerCPUSec }),
			Allocs:     col(func(s sample) float64 { return s.Allocs }),
			RSSKB:      int64(col(func(s sample) float64 { return float64(s.RSSKB) })),
			FDs:        int(col(func(s sample) float64 { return float64(s.FDs) })),
		}
		r.Summary = append(r.Summary, summary{Forwarder: k.f, Point: k.pt, Runs: len(ss), Median: m,
			CPURatio:  ratio(func(s sample) float64 { return s.TotalUS }),
			UserRatio: ratio(func(s sample) float64 { return s.UserUS }),
			P99Ratio:  ratio(func(s sample) float64 { return s.P99 })})
	}
}

func (r *results) find(f string, pt point) (summary, bool) {
	for _, s := range r.Summary {
		if s.Forwarder == f && s.Point == pt {
			return s, true
		}
	}
	return summary{}, false
}

func rateLabel(rate uint64) string {
	if rate == 0 {
		return "flat out"
	}
	if rate%1000 == 0 {
		return fmt.Sprintf("%dk/s", rate/1000)
	}
	return fmt.Sprintf("%d/s", rate)
}

func ratio(x float64) string {
	if x == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x)
}

func allocs(x float64) string {
	if x < 0 {
		return "–"
	}
	return fmt.Sprintf("%.4f", x)
}

// markdown renders the report: the two tables and the targets.
func (r *results) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Forwarding benchmark\n\n")
	p("Command: `%s` (%d repetitions; %s; %s).  \n", r.Command, r.Reps, r.Timing, r.Elapsed)
	p("Machine: %s. Forwarder pinned to CPU %s, loadgen and the echo backends to CPU %s. ", r.Machine, r.FwdCPU, r.GenCPU)
	p("Load average before %s, after %s (the machine was shared with other work: expect noise).\n\n", r.LoadBefore, r.LoadAfter)
	p("A *datagram* is one datagram forwarded in one direction; a round trip is two. CPU is the forwarder process's ")
	p("utime and stime over the measured window (from /proc/PID/stat) divided by the datagrams of the round trips completed in it, ")
	p("so µs per datagram equals CPU seconds per million datagrams. Every figure is the median of %d runs; ", r.Reps)
	p("each ×raw is the median over repetitions of the forwarder's figure divided by the raw-limit forwarder's, measured back to back. ")
	p("cidproxy and raw put a PPv2 header in front (PPv2 echo backend); naive and nginx forward unchanged to a plain echo, ")
	p("one upstream socket per client. nginx: stream proxy, one process (`master_process off`), `proxy_responses 1`; ")
	p("nginx-session: the same without `proxy_responses` (sessions end after 60 s idle).\n\n")

	var rates []uint64
	var counts []int
	for _, s := range r.Summary {
		switch s.Point.Scenario {
		case "rate":
			if !slices.Contains(rates, s.Point.Rate) {
				rates = append(rates, s.Point.Rate)
			}
		case "clients":
			if !slices.Contains(counts, s.Point.Clients) {
				counts = append(counts, s.Point.Clients)
			}
		}
	}
	if len(rates) > 0 {
		p("## Load sweep: 121-byte DTLS-CID datagrams, %d client addresses\n\n", r.RateClients)
		p("| offered | forwarder | sent/s | round trips/s | loss | RTT p50 / p90 / p99 / p99.9 µs | p99 ×raw | CPU µs/datagram user + sys = total | CPU ×raw | user ×raw | datagrams per CPU-s | allocs/datagram |\n")
		p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, rate := range rates {
			for _, s := range r.Summary {
				if s.Point.Scenario != "rate" || s.Point.Rate != rate {
					continue
				}
				m := s.Median
				mark := ""
				if m.Loss > 0.01 {
					mark = " †"
				}
				p("| %s | %s | %.0f | %.0f%s | %.2f%% | %.0f / %.0f / %.0f / %.0f | %s | %.2f + %.2f = %.2f | %s | %s | %.0f | %s |\n",
					rateLabel(rate), s.Forwarder, m.OfferedPPS, m.RoundTrips, mark, 100*m.Loss, m.P50, m.P90, m.P99, m.P999,
					ratio(s.P99Ratio), m.UserUS, m.SysUS, m.TotalUS, ratio(s.CPURatio), ratio(s.UserRatio), m.PerCPUSec, allocs(m.Allocs))
			}
		}
		p("\n† more than 1 %% lost: the forwarder is saturated at this offered rate. Its CPU per datagram counts completed round trips ")
		p("only, so it overstates what each forwarded datagram cost. Flat out, loadgen keeps %d datagrams in flight per socket ", 256)
		p("(a closed loop), and loadgen with the echo backends on one CPU, not the forwarder, usually sets the rate: read capacity from CPU per datagram.\n\n")
	}
	if len(counts) > 0 {
		p("## State: concurrent client addresses at %s offered\n\n", rateLabel(r.ClientRate))
		p("| forwarder | clients | RSS MiB | open fds | RSS − RSS@%d | fds − fds@%d | CPU µs/datagram | CPU ×raw | RTT p99 µs | loss |\n", counts[0], counts[0])
		p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		var fwds []string
		for _, s := range r.Summary {
			if s.Point.Scenario == "clients" && !slices.Contains(fwds, s.Forwarder) {
				fwds = append(fwds, s.Forwarder)
			}
		}
		for _, f := range fwds {
			base, _ := r.find(f, point{"clients", r.ClientRate, counts[0]})
			for _, c := range counts {
				s, ok := r.find(f, point{"clients", r.ClientRate, c})
				if !ok {
					continue
				}
				m := s.Median
				p("| %s | %d | %.1f | %d | %+.2f MiB | %+d | %.2f | %s | %.0f | %.2f%% |\n", f, c, float64(m.RSSKB)/1024, m.FDs,
					float64(m.RSSKB-base.Median.RSSKB)/1024, m.FDs-base.Median.FDs, m.TotalUS, ratio(s.CPURatio), m.P99, 100*m.Loss)
			}
		}
		p("\n")
	}
	p("## Targets (issue 9)\n\n")
	p("| target | cidproxy-1w | cidproxy-2w |\n|---|---|---|\n")
	for _, t := range r.targets() {
		p("| %s | %s | %s |\n", t.name, t.res[0], t.res[1])
	}
	if len(r.Failures) > 0 {
		p("\nFailed runs (left out of the medians):\n\n")
		for _, f := range r.Failures {
			p("- %s\n", f)
		}
	}
	return b.String()
}

type target struct {
	name string
	res  [2]string
}

func verdict(ok bool, format string, a ...any) string {
	v := "**missed**"
	if ok {
		v = "met"
	}
	return v + ": " + fmt.Sprintf(format, a...)
}

// targets checks issue 9's targets for both cidproxy configurations.
func (r *results) targets() []target {
	var out []target
	each := func(name string, f func(fwd string) string) {
		t := target{name: name}
		for i, fwd := range []string{"cidproxy-1w", "cidproxy-2w"} {
			t.res[i] = f(fwd)
		}
		out = append(out, t)
	}
	for _, rate := range []uint64{0, 25000, 50000} {
		pt := point{"rate", rate, r.RateClients}
		each(fmt.Sprintf("CPU per datagram ≤ 1.05× raw at %s", rateLabel(rate)), func(fwd string) string {
			s, ok := r.find(fwd, pt)
			if !ok || s.CPURatio == 0 {
				return "not measured"
			}
			return verdict(s.CPURatio <= 1.05, "%.2f×", s.CPURatio)
		})
	}
	each("CPU per datagram below nginx at every rate", func(fwd string) string {
		var worse []string
		n := 0
		for _, s := range r.Summary {
			if s.Forwarder != fwd || s.Point.Scenario != "rate" {
				continue
			}
			ng, ok := r.find("nginx", s.Point)
			if !ok {
				continue
			}
			n++
			if s.Median.TotalUS >= ng.Median.TotalUS {
				worse = append(worse, fmt.Sprintf("%s: %.2f vs %.2f µs", rateLabel(s.Point.Rate), s.Median.TotalUS, ng.Median.TotalUS))
			}
		}
		if n == 0 {
			return "not measured"
		}
		if len(worse) == 0 {
			return verdict(true, "at all %d rates", n)
		}
		return verdict(false, "%s", strings.Join(worse, "; "))
	})
	each("0 allocations per datagram (< 0.001 heap objects per datagram over the window)", func(fwd string) string {
		worst := -1.0
		for _, s := range r.Summary {
			if s.Forwarder == fwd && s.Median.Allocs > worst {
				worst = s.Median.Allocs
			}
		}
		if worst < 0 {
			return "not measured"
		}
		return verdict(worst < 0.001, "at most %.4f", worst)
	})
	each("RSS and fds flat: at the most clients within 1 MiB and 0 fds of the fewest", func(fwd string) string {
		var lo, hi summary
		found := 0
		for _, s := range r.Summary {
			if s.Forwarder != fwd || s.Point.Scenario != "clients" {
				continue
			}
			if found == 0 || s.Point.Clients < lo.Point.Clients {
				lo = s
			}
			if found == 0 || s.Point.Clients > hi.Point.Clients {
				hi = s
			}
			found++
		}
		if found < 2 {
			return "not measured"
		}
		d := hi.Median.RSSKB - lo.Median.RSSKB
		df := hi.Median.FDs - lo.Median.FDs
		return verdict(d <= 1024 && df <= 0, "%d → %d clients: RSS %+.2f MiB, fds %+d", lo.Point.Clients, hi.Point.Clients, float64(d)/1024, df)
	})
	each("p99 RTT at 50k/s ≤ 1.2× raw", func(fwd string) string {
		s, ok := r.find(fwd, point{"rate", 50000, r.RateClients})
		if !ok || s.P99Ratio == 0 {
			return "not measured"
		}
		return verdict(s.P99Ratio <= 1.2, "%.2f× (%.0f µs)", s.P99Ratio, s.Median.P99)
	})
	each("datagrams per CPU-second at flat out (a Rust DTLS proxy: 70–80k pps per core)", func(fwd string) string {
		s, ok := r.find(fwd, point{"rate", 0, r.RateClients})
		if !ok {
			return "not measured"
		}
		return fmt.Sprintf("%.0f (raw ×%.2f)", s.Median.PerCPUSec, safeDiv(1, s.CPURatio))
	})
	return out
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
