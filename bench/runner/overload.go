package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The overload experiment (-overload) runs forwarders past their
// capacity with open-loop load: loadgen sends at its rate whatever comes
// back. On a 2-core machine loadgen's one CPU cannot offer several times
// what a forwarder forwards on the other, so busy loops share the
// forwarder's CPU for the whole experiment (-overload-spin, 3: the
// forwarder's threads get about a quarter of it; with one, loadgen's CPU
// saturated at 5× and the echo backend beside it dropped replies, for
// every forwarder alike).
// Its points:
//
//   - capacity: each forwarder flat out in a closed loop (what it forwards
//     when the load waits for it);
//   - goodput: 1×, 2× and 5× cidproxy-1w's capacity, open loop, through
//     each forwarder: round trips delivered, loss, latency, and for
//     cidproxy the kernel's drops per direction from its metrics;
//   - buffers: cidproxy-1w at 2× with several recv_buffer sizes, for the
//     queueing delay each one allows;
//   - junk: a legitimate load at a tenth of the capacity beside a flood
//     of junk sent flat out (random bytes, CID records of an ordinal no
//     backend has, ClientHellos), the same with the early drop's socket
//     filter, and with two workers, where a flood from one socket lands
//     on one worker.

// overloadOptions are the -overload flags.
type overloadOptions struct {
	on         bool
	mults      []float64
	buffers    []int
	reps       int
	spin       int // busy loops beside the forwarder
	t          timing
	loadBefore string
}

// An overloadRow is one measurement of the experiment.
type overloadRow struct {
	Kind      string  `json:"kind"` // capacity, goodput, buffer, junk
	Forwarder string  `json:"forwarder"`
	Rep       int     `json:"rep"`
	Mult      float64 `json:"mult,omitempty"`        // goodput, buffer: × capacity offered
	Buffer    int     `json:"recv_buffer,omitempty"` // buffer: recv_buffer; 0 = cidproxy's default
	Junk      string  `json:"junk,omitempty"`        // junk: the flood's loadgen flags
	Offered   float64 `json:"offered_pps"`           // legitimate load offered
	Delivered float64 `json:"round_trips_per_s"`     // legitimate round trips completed
	Loss      float64 `json:"loss"`
	P50       float64 `json:"p50_us"`
	P99       float64 `json:"p99_us"`
	// From cidproxy's metrics over the run (-1: not measured): the
	// kernel's drops at the service sockets (forward) and the upstream
	// sockets (reverse) as fractions of what reached them, and the
	// replies relayed over those the backends sent.
	FwdKernelLoss float64 `json:"fwd_kernel_loss"`
	RevKernelLoss float64 `json:"rev_kernel_loss"`
	// junk: datagrams of the flood offered per second, and the share of
	// all offered datagrams the forwarder read (its processed fraction).
	JunkOffered float64 `json:"junk_offered_pps,omitempty"`
	Processed   float64 `json:"processed,omitempty"`
}

func (e *env) overload(ctx context.Context, o options, echo map[bool]netip.AddrPort, log io.Writer) error {
	for range o.ov.spin {
		p, err := e.startSpin()
		if err != nil {
			return err
		}
		defer p.Stop()
	}
	var rows []overloadRow
	add := func(r overloadRow, err error) {
		if err != nil {
			fmt.Fprintf(log, "overload %s %s: %v\n", r.Kind, r.Forwarder, err)
			return
		}
		fmt.Fprintf(log, "overload %-8s %-14s ×%-4.1f buf %-8d %-28s offered %7.0f delivered %7.0f loss %6.2f%% p50 %8.0fµs p99 %8.0fµs fwd-kq %5.1f%% rev-kq %5.1f%% junk %7.0f processed %.3f\n",
			r.Kind, r.Forwarder, r.Mult, r.Buffer, r.Junk, r.Offered, r.Delivered, 100*r.Loss, r.P50, r.P99,
			100*r.FwdKernelLoss, 100*r.RevKernelLoss, r.JunkOffered, r.Processed)
		rows = append(rows, r)
	}
	fwds := []string{"cidproxy-1w", "cidproxy-1w-np", rawName}
	capacity := map[string]float64{}
	for rep := range o.ov.reps {
		for _, name := range fwds {
			r, err := e.overloadPoint(ctx, name, 0, echo, o.ov.t, 0, false, "")
			r.Kind, r.Rep = "capacity", rep
			add(r, err)
			if err == nil && (capacity[name] == 0 || r.Delivered < capacity[name]) {
				capacity[name] = r.Delivered // the lowest: what it surely forwards
			}
		}
	}
	base := capacity["cidproxy-1w"]
	if base == 0 {
		return fmt.Errorf("overload: no capacity measured for cidproxy-1w")
	}
	for rep := range o.ov.reps {
		for _, m := range o.ov.mults {
			for k := range fwds {
				name := fwds[(k+rep)%len(fwds)]
				r, err := e.overloadPoint(ctx, name, 0, echo, o.ov.t, m*base, false, "")
				r.Kind, r.Rep, r.Mult = "goodput", rep, m
				add(r, err)
			}
		}
		for _, b := range o.ov.buffers {
			r, err := e.overloadPoint(ctx, "cidproxy-1w", b, echo, o.ov.t, 2*base, false, "")
			r.Kind, r.Rep, r.Mult, r.Buffer = "buffer", rep, 2, b
			add(r, err)
		}
		for _, junk := range []string{"-mix random", "-ordinals 200", "-mix dtls-hello"} {
			for _, name := range []string{"cidproxy-1w", "cidproxy-1w-ed", "cidproxy-1w-np", "cidproxy-2w"} {
				r, err := e.overloadPoint(ctx, name, 0, echo, o.ov.t, base/10, true, junk)
				r.Kind, r.Rep, r.Junk = "junk", rep, junk
				add(r, err)
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	b, err := json.MarshalIndent(struct {
		Command  string        `json:"command"`
		Machine  string        `json:"machine"`
		Load     [2]string     `json:"loadavg_before_after"`
		Capacity float64       `json:"capacity_cidproxy_1w"`
		Rows     []overloadRow `json:"rows"`
	}{o.command, machine(), [2]string{o.ov.loadBefore, loadavg()}, base, rows}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "overload.json"), b, 0o644); err != nil {
		return err
	}
	md := overloadMarkdown(o, base, rows)
	if err := os.WriteFile(filepath.Join(o.out, "overload.md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(log, "runner: wrote %s\n%s", filepath.Join(o.out, "overload.md"), md)
	return nil
}

// startSpin runs the busy loop that shares the forwarder's CPU: this
// program again, with -spin.
func (e *env) startSpin() (*process, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := command(e.fwdCPU, self, "-spin")
	cmd.Stdout = io.Discard
	p, _, err := launch(cmd)
	return p, err
}

// overloadPoint starts forwarder name (recv_buffer buf for cidproxy, 0 =
// its default) and runs loadgen through it at rate (0: flat out, closed
// loop), with a second loadgen flooding junk beside it when junk is set.
func (e *env) overloadPoint(ctx context.Context, name string, buf int, echo map[bool]netip.AddrPort, t timing, rate float64, withJunk bool, junk string) (overloadRow, error) {
	r := overloadRow{Forwarder: name, FwdKernelLoss: -1, RevKernelLoss: -1}
	f, ok := lookupForwarder(name)
	if !ok {
		return r, fmt.Errorf("unknown forwarder %q", name)
	}
	var p *process
	var err error
	if buf > 0 {
		p, err = e.startCidproxyWith(echo[true], 1, "thread", map[string]any{"recv_buffer": buf})
	} else {
		p, err = f.start(e, echo[f.PPv2])
	}
	if err != nil {
		return r, err
	}
	defer p.Stop()
	if err := waitReady(ctx, p); err != nil {
		return r, err
	}
	before, _ := scrape(p.debugURL)
	args := []string{"-json", "-target", p.addr.String(), "-clients", "64", "-sockets", "4",
		"-rate", strconv.FormatFloat(rate, 'f', 0, 64), "-warmup", t.warmup, "-duration", t.duration, "-drain", t.drain}
	var wg sync.WaitGroup
	var junkRes loadResult
	var junkErr error
	if withJunk {
		// Flat out from two sockets: two 4-tuples, which the kernel's
		// reuseport hash puts on one or two workers.
		jargs := append([]string{"-json", "-target", p.addr.String(), "-clients", "2", "-sockets", "2", "-open",
			"-warmup", t.warmup, "-duration", t.duration, "-drain", "0s"}, strings.Fields(junk)...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			junkRes, junkErr = e.loadgen(jargs)
		}()
	}
	lr, err := e.loadgen(args)
	wg.Wait()
	if err == nil {
		err = junkErr
	}
	if err != nil {
		return r, err
	}
	after, _ := scrape(p.debugURL)
	r.Offered, r.Delivered, r.Loss, r.P50, r.P99 = lr.OfferedPPS, lr.ReceivedPPS, lr.LossRatio, lr.RTT.P50, lr.RTT.P99
	if before != nil && after != nil {
		d := func(key string) float64 { return after[key] - before[key] }
		fk, fr := d(`cidroute_kernel_drops_total{direction="forward"}`), d(`cidroute_datagrams_received_total{direction="forward"}`)
		rk, rr := d(`cidroute_kernel_drops_total{direction="reverse"}`), d(`cidroute_datagrams_received_total{direction="reverse"}`)
		if fk+fr > 0 {
			r.FwdKernelLoss = fk / (fk + fr)
		}
		if rk+rr > 0 {
			r.RevKernelLoss = rk / (rk + rr)
		}
		if withJunk && fk+fr > 0 {
			r.JunkOffered = junkRes.OfferedPPS
			r.Processed = fr / (fk + fr)
		}
	}
	return r, nil
}

func (e *env) loadgen(args []string) (loadResult, error) {
	cmd := command(e.genCPU, filepath.Join(e.bin, "loadgen"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var r loadResult
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("loadgen: %w: %s", err, errb.String())
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("loadgen output: %w", err)
	}
	return r, nil
}

// scrape reads cidproxy's metrics at url + /metrics into sums by name and
// direction label: `name{direction="forward"}` (other labels summed
// over), or nil when there is no url.
func scrape(url string) (map[string]float64, error) {
	if url == "" {
		return nil, nil
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		name, rest, ok := strings.Cut(l, "{")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		dir := ""
		for _, kv := range strings.Split(labels, ",") {
			if k, v, _ := strings.Cut(kv, "="); k == "direction" {
				dir = strings.Trim(v, `"`)
			}
		}
		if strings.Contains(labels, `path="xdp"`) {
			continue
		}
		out[fmt.Sprintf(`%s{direction=%q}`, name, dir)] += v
	}
	return out, sc.Err()
}

// overloadMarkdown renders the experiment: medians over repetitions.
func overloadMarkdown(o options, base float64, rows []overloadRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Past capacity\n\n`%s` — %s; load average %s before the run, %s after; forwarder on CPU %s beside %d busy loops, loadgen on CPU %s; %s per point, medians of %d.\n\n",
		o.command, machine(), o.ov.loadBefore, loadavg(), o.fwdCPU, o.ov.spin, o.genCPU, o.ov.t.duration, o.ov.reps)
	fmt.Fprintf(&b, "One worker's capacity (cidproxy-1w flat out, closed loop, the lowest of the repetitions): %.0f round trips/s.\n\n", base)
	type key struct {
		kind, fwd, junk string
		mult            float64
		buf             int
	}
	groups := map[key][]overloadRow{}
	var order []key
	for _, r := range rows {
		k := key{r.Kind, r.Forwarder, r.Junk, r.Mult, r.Buffer}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	med := func(rs []overloadRow, f func(overloadRow) float64) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return median(v)
	}
	pct := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f %%", 100*v)
	}
	sections := []struct{ kind, head string }{
		{"capacity", "| forwarder | round trips/s flat out (closed loop) |\n|---|--:|\n"},
		{"goodput", "| offered × capacity | forwarder | offered/s | round trips/s | × its goodput at 1× | loss | forward kernel drops | reverse kernel drops | p50 µs | p99 µs |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n"},
		{"buffer", "| recv_buffer | offered × capacity | round trips/s | loss | p50 µs | p99 µs |\n|---|---|--:|--:|--:|--:|\n"},
		{"junk", "| flood (loadgen, flat out, 2 sockets) | forwarder | junk offered/s | legitimate offered/s | legitimate round trips/s | legitimate loss | processed share of all offered | reverse kernel drops |\n|---|---|--:|--:|--:|--:|--:|--:|\n"},
	}
	at1 := map[string]float64{}
	for _, k := range order {
		if k.kind == "goodput" && k.mult == 1 {
			at1[k.fwd] = med(groups[k], func(r overloadRow) float64 { return r.Delivered })
		}
	}
	for _, s := range sections {
		b.WriteString(s.head)
		for _, k := range order {
			if k.kind != s.kind {
				continue
			}
			rs := groups[k]
			del := med(rs, func(r overloadRow) float64 { return r.Delivered })
			switch s.kind {
			case "capacity":
				fmt.Fprintf(&b, "| %s | %.0f |\n", k.fwd, del)
			case "goodput":
				rel := "–"
				if at1[k.fwd] > 0 {
					rel = fmt.Sprintf("%.2f", del/at1[k.fwd])
				}
				fmt.Fprintf(&b, "| %g× | %s | %.0f | %.0f | %s | %s | %s | %s | %.0f | %.0f |\n", k.mult, k.fwd,
					med(rs, func(r overloadRow) float64 { return r.Offered }), del, rel,
					pct(med(rs, func(r overloadRow) float64 { return r.Loss })),
					pct(med(rs, func(r overloadRow) float64 { return r.FwdKernelLoss })),
					pct(med(rs, func(r overloadRow) float64 { return r.RevKernelLoss })),
					med(rs, func(r overloadRow) float64 { return r.P50 }), med(rs, func(r overloadRow) float64 { return r.P99 }))
			case "buffer":
				buf := "default (4 MiB)"
				if k.buf > 0 {
					buf = strconv.Itoa(k.buf)
				}
				fmt.Fprintf(&b, "| %s | %g× | %.0f | %s | %.0f | %.0f |\n", buf, k.mult, del,
					pct(med(rs, func(r overloadRow) float64 { return r.Loss })),
					med(rs, func(r overloadRow) float64 { return r.P50 }), med(rs, func(r overloadRow) float64 { return r.P99 }))
			case "junk":
				fmt.Fprintf(&b, "| `%s` | %s | %.0f | %.0f | %.0f | %s | %.3f | %s |\n", k.junk, k.fwd,
					med(rs, func(r overloadRow) float64 { return r.JunkOffered }),
					med(rs, func(r overloadRow) float64 { return r.Offered }), del,
					pct(med(rs, func(r overloadRow) float64 { return r.Loss })),
					med(rs, func(r overloadRow) float64 { return r.Processed }),
					pct(med(rs, func(r overloadRow) float64 { return r.RevKernelLoss })))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// spin is the busy loop of -spin.
func spin() {
	for {
	}
}
