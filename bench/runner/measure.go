package main

import (
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
)

// loadResult is the part of loadgen's -json output the runner reads.
type loadResult struct {
	Sent        uint64  `json:"sent"`
	Received    uint64  `json:"received"`
	LossRatio   float64 `json:"loss_ratio"`
	OfferedPPS  float64 `json:"offered_pps"`
	ReceivedPPS float64 `json:"received_pps"`
	WindowSecs  float64 `json:"window_s"`
	RTT         struct {
		P50, P90, P99, P999 float64
	} `json:"rtt_us"`
	Watch *struct {
		UserSecs   float64 `json:"user_s"`
		SystemSecs float64 `json:"system_s"`
		RSSKB      int64   `json:"rss_kb"`
		FDs        int     `json:"fds"`
		Mallocs    float64 `json:"mallocs"`
	} `json:"watch"`
}

// A point is one load setting: offered rate (0 = flat out) and clients.
type point struct {
	Scenario string `json:"scenario"` // "rate" or "clients"
	Rate     uint64 `json:"rate"`
	Clients  int    `json:"clients"`
}

func (p point) String() string {
	r := "flat out"
	if p.Rate > 0 {
		r = strconv.FormatUint(p.Rate, 10) + "/s"
	}
	return fmt.Sprintf("%s %s, %d clients", p.Scenario, r, p.Clients)
}

// A sample is one measurement of one forwarder at one point, with the
// figures derived from it. A datagram is one forwarded datagram: a round
// trip is two, client→backend and backend→client.
type sample struct {
	Forwarder string `json:"forwarder"`
	Point     point  `json:"point"`
	Rep       int    `json:"rep"`

	OfferedPPS float64 `json:"offered_pps"`
	// RoundTrips is round trips completed per second.
	RoundTrips float64 `json:"round_trips_per_s"`
	Loss       float64 `json:"loss"`
	P50        float64 `json:"p50_us"`
	P90        float64 `json:"p90_us"`
	P99        float64 `json:"p99_us"`
	P999       float64 `json:"p999_us"`
	// CPU per forwarded datagram, in µs (= CPU seconds per million).
	UserUS  float64 `json:"user_us_per_datagram"`
	SysUS   float64 `json:"sys_us_per_datagram"`
	TotalUS float64 `json:"cpu_us_per_datagram"`
	// PerCPUSec is datagrams forwarded per CPU-second.
	PerCPUSec float64 `json:"datagrams_per_cpu_s"`
	// Allocs is heap objects per forwarded datagram; -1 = not measured.
	Allocs float64 `json:"allocs_per_datagram"`
	RSSKB  int64   `json:"rss_kb"`
	FDs    int     `json:"fds"`
}

func derive(f forwarder, pt point, rep int, r loadResult) sample {
	s := sample{Forwarder: f.Name, Point: pt, Rep: rep, OfferedPPS: r.OfferedPPS, RoundTrips: r.ReceivedPPS,
		Loss: r.LossRatio, P50: r.RTT.P50, P90: r.RTT.P90, P99: r.RTT.P99, P999: r.RTT.P999, Allocs: -1}
	dg := 2 * float64(r.Received)
	if w := r.Watch; w != nil && dg > 0 {
		s.UserUS = w.UserSecs * 1e6 / dg
		s.SysUS = w.SystemSecs * 1e6 / dg
		s.TotalUS = s.UserUS + s.SysUS
		if cpu := w.UserSecs + w.SystemSecs; cpu > 0 {
			s.PerCPUSec = dg / cpu
		}
		if f.Allocs && w.Mallocs >= 0 {
			s.Allocs = w.Mallocs / dg
		}
		s.RSSKB, s.FDs = w.RSSKB, w.FDs
	}
	return s
}

// timing is how long each loadgen run lasts.
type timing struct {
	warmup, duration, drain string // Go durations
}

// measure starts f, runs loadgen through it at pt, and stops f.
func (e *env) measure(ctx context.Context, f forwarder, echo map[bool]netip.AddrPort, pt point, t timing, rep int) (sample, error) {
	p, err := f.start(e, echo[f.PPv2])
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w", f.Name, err)
	}
	defer p.Stop()
	if err := waitReady(ctx, p); err != nil {
		return sample{}, fmt.Errorf("%s: %w", f.Name, err)
	}
	args := []string{"-json", "-target", p.addr.String(), "-clients", strconv.Itoa(pt.Clients),
		"-rate", strconv.FormatUint(pt.Rate, 10), "-warmup", t.warmup, "-duration", t.duration, "-drain", t.drain,
		"-watch-pid", strconv.Itoa(p.pid())}
	if f.Allocs && p.pprofBase != "" {
		args = append(args, "-watch-allocs", p.pprofURL("heap?debug=1"))
	}
	cmd := command(e.genCPU, filepath.Join(e.bin, "loadgen"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return sample{}, fmt.Errorf("%s: loadgen: %w: %s", f.Name, err, errb.String())
	}
	var r loadResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return sample{}, fmt.Errorf("%s: loadgen output: %w", f.Name, err)
	}
	select {
	case <-p.done:
		return sample{}, fmt.Errorf("%s exited during the run: %s", f.Name, p.stderr)
	default:
	}
	return derive(f, pt, rep, r), nil
}

// profile captures a CPU profile of cidproxy while loadgen drives it.
func (e *env) profile(ctx context.Context, f forwarder, echo map[bool]netip.AddrPort, pt point, secs int, dst string) error {
	p, err := f.start(e, echo[f.PPv2])
	if err != nil {
		return err
	}
	defer p.Stop()
	if err := waitReady(ctx, p); err != nil {
		return err
	}
	gen := command(e.genCPU, filepath.Join(e.bin, "loadgen"), "-target", p.addr.String(), "-clients", strconv.Itoa(pt.Clients),
		"-rate", strconv.FormatUint(pt.Rate, 10), "-warmup", "0s", "-duration", fmt.Sprintf("%ds", secs+2))
	if err := gen.Start(); err != nil {
		return err
	}
	defer gen.Wait()
	url := p.pprofURL(fmt.Sprintf("profile?seconds=%d", secs))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
