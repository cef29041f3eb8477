// Command runner is the forwarding benchmark behind bench/run.sh: it
// starts each forwarder (cidproxy with 1 and 2 workers, the raw-limit and
// naive baselines, nginx's UDP stream proxy) pinned to one CPU, drives it
// with loadgen pinned to the other CPU (beside the echo backends), and
// writes results.json, table.md and chart data into -out.
//
// Every figure is the median of -reps runs; the forwarders take turns
// within each repetition (in a rotating order), and each ratio is the
// median over repetitions of forwarder ÷ raw-limit measured back to back.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "-spin" { // -overload's busy loop
		spin()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "runner:", err)
		os.Exit(1)
	}
}

type options struct {
	quick         bool
	bin, out      string
	reps          int
	rates         []uint64
	rateClients   int
	clientCounts  []int
	clientRate    uint64
	rateFwds      []forwarder
	clientFwds    []forwarder
	timing        timing
	clientTiming  timing
	fwdCPU        string
	genCPU        string
	profileSecs   int
	command       string // as typed, for the report
	nginx, module string
	render        string
	ov            overloadOptions
	recvBuf       int
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.BoolVar(&o.quick, "quick", false, "validation run: 1 repetition, 1 s per point, fewer points")
	fs.StringVar(&o.bin, "bin", "bench/out/bin", "directory with loadgen, echo, cidproxy, rawfwd, naivefwd")
	fs.StringVar(&o.out, "out", "bench/out", "directory for results.json and table.md")
	reps := fs.Int("reps", 0, "repetitions per figure (0 = 3, or 1 with -quick)")
	rates := fs.String("rates", "", "offered rates of the rate sweep, 0 = flat out (default 10000,25000,50000,100000,0)")
	fs.IntVar(&o.rateClients, "rate-clients", 64, "client addresses in the rate sweep")
	counts := fs.String("clients", "", "client address counts of the state test (default 10,1000,10000)")
	fs.Uint64Var(&o.clientRate, "client-rate", 20000, "offered rate of the state test")
	rfw := fs.String("forwarders", "cidproxy-1w,cidproxy-2w,cidproxy-1w-np,raw,naive,nginx", "forwarders of the rate sweep")
	cfw := fs.String("client-forwarders", "cidproxy-1w,raw,naive,nginx,nginx-session", "forwarders of the state test")
	dur := fs.Duration("duration", 0, "measured window per run (0 = 3s, or 1s with -quick)")
	warm := fs.Duration("warmup", 0, "sending before each window (0 = 1s, 1.5s in the state test; 300ms, 700ms with -quick)")
	fs.StringVar(&o.fwdCPU, "fwd-cpu", "1", "taskset CPU list of the forwarder (empty = no pinning)")
	fs.StringVar(&o.genCPU, "gen-cpu", "0", "taskset CPU list of loadgen and the echo backends (empty = no pinning)")
	profile := fs.Int("profile", -1, "also capture a CPU profile of cidproxy-1w of this many seconds at flat out and at 50000/s (default 3, or 0 with -quick; 0 = none)")
	fs.StringVar(&o.nginx, "nginx", "nginx", "nginx binary")
	fs.StringVar(&o.module, "nginx-stream-module", "/usr/lib/nginx/modules/ngx_stream_module.so", "ngx_stream_module.so")
	command := fs.String("command", "", "the command line to print in the report (run.sh passes its own)")
	fs.BoolVar(&o.ov.on, "overload", false, "run only the experiment past capacity (overload.md, overload.json): open-loop load at multiples of one worker's capacity, recv_buffer sizes, junk floods")
	mults := fs.String("overload-mults", "1,2,5", "-overload: offered load in multiples of cidproxy-1w's capacity")
	fs.IntVar(&o.ov.spin, "overload-spin", 3, "-overload: busy loops sharing the forwarder's CPU, so that loadgen can offer several times what it forwards")
	bufs := fs.String("overload-buffers", "212992,1048576,4194304", "-overload: recv_buffer sizes measured at 2× capacity")
	fs.IntVar(&o.recvBuf, "cidproxy-recv-buffer", 0, "recv_buffer of every cidproxy forwarder in `bytes` (0 = cidproxy's default)")
	fs.StringVar(&o.render, "render", "", "only rewrite table.md in -out from this `results.json` (after changing the report)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.command = strings.TrimSpace(*command)
	if o.command == "" {
		o.command = strings.TrimSpace("go run ./bench/runner " + strings.Join(args, " "))
	}
	o.profileSecs = *profile
	if o.profileSecs < 0 {
		o.profileSecs = 3
		if o.quick {
			o.profileSecs = 0
		}
	}
	o.reps = *reps
	if o.reps == 0 {
		o.reps = 3
		if o.quick {
			o.reps = 1
		}
	}
	d := *dur
	if d == 0 {
		d = 3 * time.Second
		if o.quick {
			d = time.Second
		}
	}
	o.timing = timing{warmup: "1s", duration: d.String(), drain: "500ms"}
	o.clientTiming = timing{warmup: "1500ms", duration: d.String(), drain: "500ms"}
	if o.quick {
		o.timing.warmup, o.clientTiming.warmup = "300ms", "700ms"
	}
	if *warm > 0 {
		o.timing.warmup, o.clientTiming.warmup = warm.String(), warm.String()
	}
	defRates, defCounts := "10000,25000,50000,100000,0", "10,1000,10000"
	if o.quick {
		defRates = "25000,50000,0"
	}
	var err error
	if o.rates, err = parseList(or(*rates, defRates), func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }); err != nil {
		return o, fmt.Errorf("-rates: %w", err)
	}
	if o.clientCounts, err = parseList(or(*counts, defCounts), strconv.Atoi); err != nil {
		return o, fmt.Errorf("-clients: %w", err)
	}
	if o.ov.mults, err = parseList(*mults, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }); err != nil {
		return o, fmt.Errorf("-overload-mults: %w", err)
	}
	if o.ov.buffers, err = parseList(*bufs, strconv.Atoi); err != nil {
		return o, fmt.Errorf("-overload-buffers: %w", err)
	}
	o.ov.reps, o.ov.t = o.reps, timing{warmup: "500ms", duration: min(d, 2*time.Second).String(), drain: "500ms"}
	if o.rateFwds, err = parseForwarders(*rfw); err != nil {
		return o, err
	}
	if o.clientFwds, err = parseForwarders(*cfw); err != nil {
		return o, err
	}
	if o.reps < 1 {
		return o, errors.New("-reps must be ≥ 1")
	}
	return o, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	if strings.TrimSpace(s) == "" || s == "none" {
		return nil, nil
	}
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseForwarders(s string) ([]forwarder, error) {
	names, _ := parseList(s, func(s string) (string, error) { return s, nil })
	var out []forwarder
	raw := false
	for _, n := range names {
		f, ok := lookupForwarder(n)
		if !ok {
			return nil, fmt.Errorf("unknown forwarder %q", n)
		}
		raw = raw || n == rawName
		out = append(out, f)
	}
	if len(out) > 0 && !raw {
		return nil, fmt.Errorf("forwarders %q: %q must be among them, every ratio is taken against it", s, rawName)
	}
	return out, nil
}

func cmd(ctx context.Context, args []string, log io.Writer) error {
	o, err := parseOptions(args, log)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.render != "" {
		return render(o.render, o.out)
	}
	// Sessions of the naive forwarder and nginx need one fd per client;
	// children inherit this (root may raise the hard limit).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		if need := uint64(slices.Max(append(o.clientCounts, 0)) + 100); lim.Max < need {
			fmt.Fprintf(log, "runner: RLIMIT_NOFILE %d is below the %d a per-session forwarder needs\n", lim.Max, need)
		}
	}
	tmp, err := os.MkdirTemp("", "cidroute-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	e := &env{bin: o.bin, tmp: tmp, fwdCPU: o.fwdCPU, genCPU: o.genCPU, recvBuf: o.recvBuf, log: log}
	if p, err := exec.LookPath(o.nginx); err == nil {
		if _, err := os.Stat(o.module); err == nil {
			e.nginx, e.nginxMod = p, o.module
		}
	}
	if e.nginx == "" {
		fmt.Fprintln(log, "runner: nginx or its stream module not found; skipping nginx (Debian packages nginx, libnginx-mod-stream)")
		o.rateFwds, o.clientFwds = dropNginx(o.rateFwds), dropNginx(o.clientFwds)
	}
	if (o.fwdCPU != "" || o.genCPU != "") && !haveTaskset() {
		return errors.New("taskset not found (Debian package util-linux); pass -fwd-cpu= -gen-cpu= to run unpinned")
	}

	res := &results{Command: o.command, Quick: o.quick, Reps: o.reps, Started: time.Now().UTC().Format(time.RFC3339),
		Machine: machine(), LoadBefore: loadavg(), FwdCPU: o.fwdCPU, GenCPU: o.genCPU,
		Timing:      fmt.Sprintf("warmup %s, window %s, drain ≤ %s", o.timing.warmup, o.timing.duration, o.timing.drain),
		RateClients: o.rateClients, ClientRate: o.clientRate}

	// Two long-lived echo backends beside loadgen: PPv2 and plain.
	echo := map[bool]netip.AddrPort{}
	for _, pp := range []bool{true, false} {
		p, err := e.startListenerOn(o.genCPU, "echo", "-listen", "127.0.0.1:0", "-proxy-protocol="+strconv.FormatBool(pp))
		if err != nil {
			return err
		}
		defer p.Stop()
		echo[pp] = p.addr
	}

	if o.ov.on {
		o.ov.loadBefore = loadavg()
		return e.overload(ctx, o, echo, log)
	}

	type job struct {
		pt   point
		fwds []forwarder
		t    timing
	}
	var jobs []job
	for _, r := range o.rates {
		jobs = append(jobs, job{point{"rate", r, o.rateClients}, o.rateFwds, o.timing})
	}
	for _, c := range o.clientCounts {
		jobs = append(jobs, job{point{"clients", o.clientRate, c}, o.clientFwds, o.clientTiming})
	}
	total := 0
	for _, j := range jobs {
		total += len(j.fwds) * o.reps
	}
	n := 0
	began := time.Now()
	for rep := range o.reps {
		for ji, j := range jobs {
			// Alternate: each repetition and point starts with another
			// forwarder.
			for k := range j.fwds {
				f := j.fwds[(k+rep+ji)%len(j.fwds)]
				n++
				s, err := e.measure(ctx, f, echo, j.pt, j.t, rep)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err != nil {
					fmt.Fprintf(log, "[%d/%d] %s: %v\n", n, total, j.pt, err)
					res.Failures = append(res.Failures, fmt.Sprintf("rep %d, %s: %v", rep+1, j.pt, err))
					continue
				}
				fmt.Fprintf(log, "[%d/%d %s] %-13s %-28s offered %7.0f rt/s %7.0f loss %6.3f%% p99 %8.1fµs cpu %.2fµs/dg (u %.2f s %.2f) rss %dK fds %d\n",
					n, total, time.Since(began).Round(time.Second), f.Name, j.pt, s.OfferedPPS, s.RoundTrips, 100*s.Loss, s.P99,
					s.TotalUS, s.UserUS, s.SysUS, s.RSSKB, s.FDs)
				res.Samples = append(res.Samples, s)
			}
		}
	}
	if o.profileSecs > 0 {
		f, _ := lookupForwarder("cidproxy-1w")
		for _, r := range []uint64{0, 50000} {
			dst := filepath.Join(o.out, fmt.Sprintf("cidproxy-1w-rate%d.pprof", r))
			if err := e.profile(ctx, f, echo, point{"rate", r, o.rateClients}, o.profileSecs, dst); err != nil {
				fmt.Fprintln(log, "runner: profile:", err)
				continue
			}
			res.Profiles = append(res.Profiles, dst)
			fmt.Fprintln(log, "runner: wrote", dst)
		}
	}
	res.LoadAfter = loadavg()
	res.Elapsed = time.Since(began).Round(time.Second).String()
	res.summarize()
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), b, 0o644); err != nil {
		return err
	}
	table := res.markdown()
	if err := os.WriteFile(filepath.Join(o.out, "table.md"), []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(log, "runner: wrote %s and %s in %s\n", filepath.Join(o.out, "results.json"), filepath.Join(o.out, "table.md"), res.Elapsed)
	return nil
}

func dropNginx(fs []forwarder) []forwarder {
	var out []forwarder
	for _, f := range fs {
		if !strings.HasPrefix(f.Name, "nginx") {
			out = append(out, f)
		}
	}
	return out
}

func haveTaskset() bool {
	_, err := exec.LookPath("taskset")
	return err == nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func machine() string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	kernel := "?"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	ng := "?"
	if out, err := exec.Command("nginx", "-v").CombinedOutput(); err == nil {
		ng = strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version: ")
	}
	return fmt.Sprintf("%d × %s, Linux %s, %s, nginx %s", runtime.NumCPU(), cpu, kernel, runtime.Version(), ng)
}

// render rewrites table.md from a results.json.
func render(from, out string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	r.summarize()
	return os.WriteFile(filepath.Join(out, "table.md"), []byte(r.markdown()), 0o644)
}
