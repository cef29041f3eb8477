package proxyapp

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
	"github.com/prometheus/client_golang/prometheus"
)

// fileHealthCheck is a service's "health_check" key: active probes through
// the backends' DTLS or QUIC stack (package health). Absent: no probes.
type fileHealthCheck struct {
	Interval string `json:"interval"` // default 2s
	Timeout  string `json:"timeout"`  // default 1s, at most the interval
	Jitter   string `json:"jitter"`   // default interval/5; "0s": none
	Fall     int    `json:"fall"`     // default 3
	Rise     int    `json:"rise"`     // default 2
}

// Lower bounds of the health_check durations: a probe per backend every
// 100 ms is already far more than any deployment needs.
const (
	minProbeInterval = 100 * time.Millisecond
	minProbeTimeout  = 10 * time.Millisecond
)

// parseHealthCheck applies "health_check" to s, whose protocol and mode
// are known.
func parseHealthCheck(fh *fileHealthCheck, s *serviceConfig) error {
	if fh == nil {
		return nil
	}
	hc := health.Config{Service: s.Name, Fall: fh.Fall, Rise: fh.Rise,
		ProbeConfig: health.ProbeConfig{Protocol: health.DTLS, Direct: s.Transparent}}
	if s.Protocol == cidroute.QUIC {
		hc.Protocol = health.QUIC
	}
	var err error
	if hc.Interval, err = parseDuration("health_check.interval", fh.Interval, minProbeInterval, false); err != nil {
		return err
	}
	if hc.Timeout, err = parseDuration("health_check.timeout", fh.Timeout, minProbeTimeout, false); err != nil {
		return err
	}
	if fh.Jitter == "0s" {
		hc.Jitter = -1
	} else if hc.Jitter, err = parseDuration("health_check.jitter", fh.Jitter, time.Millisecond, false); err != nil {
		return err
	}
	if fh.Fall < 0 || fh.Rise < 0 {
		return fmt.Errorf("health_check: fall %d, rise %d: want 1 to 100 (0: the defaults 3 and 2)", fh.Fall, fh.Rise)
	}
	if hc, err = hc.WithDefaults(); err != nil {
		return fmt.Errorf("health_check: %w", err)
	}
	hc.Logger = nil // the proxy's, at start
	s.Health = &hc
	return nil
}

// startHealth starts the service's health checker, when it has one; it
// stops with ctx.
func (p *proxy) startHealth(ctx context.Context, ps *proxyService, log *slog.Logger) error {
	if ps.cfg.Health == nil {
		return nil
	}
	hc := *ps.cfg.Health
	hc.Logger = log
	c, err := health.New(ps.reg, hc)
	if err != nil {
		return err
	}
	ps.checker = c
	p.sources.Add(1)
	go func() {
		defer p.sources.Done()
		c.Run(ctx)
	}()
	return nil
}

// probeFlags are -probe-dtls and -probe-quic: one health probe, as the
// checker sends it, for an operator's shell (docs/runbooks.md).
type probeFlags struct {
	dtls, quic *string
	timeout    *time.Duration
	direct     *bool
}

func (f *probeFlags) register(fs *flag.FlagSet) {
	f.dtls = fs.String("probe-dtls", "", "send one DTLS health probe (a ClientHello under a PROXY v2 LOCAL header) to the backend at `ip:port`, print the result and exit (0: answered)")
	f.quic = fs.String("probe-quic", "", "send one QUIC health probe (a reserved-version packet under a PROXY v2 LOCAL header) to the backend at `ip:port`, print the result and exit")
	f.timeout = fs.Duration("probe-timeout", time.Second, "how long -probe-dtls and -probe-quic wait for the answer")
	f.direct = fs.Bool("probe-direct", false, "send -probe-dtls or -probe-quic without the PROXY v2 header (backends of a transparent service)")
}

func (f *probeFlags) set() bool { return *f.dtls != "" || *f.quic != "" }

// run sends the probe; the exit code is 0 when a healthy stack answered,
// 1 when not, 2 on bad arguments.
func (f *probeFlags) run(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) int {
	cfg := health.ProbeConfig{Protocol: health.DTLS, Direct: *f.direct}
	target := *f.dtls
	if *f.quic != "" {
		cfg.Protocol, target = health.QUIC, *f.quic
	}
	addr, err := netip.ParseAddrPort(target)
	switch {
	case *f.dtls != "" && *f.quic != "":
		err = fmt.Errorf("give one of -probe-dtls and -probe-quic")
	case err != nil:
		err = fmt.Errorf("-probe-%v %q: want ip:port", cfg.Protocol, target)
	case fs.NArg() > 0:
		err = fmt.Errorf("unexpected arguments %q", fs.Args())
	case *f.timeout <= 0:
		err = fmt.Errorf("-probe-timeout %v: must be positive", *f.timeout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "cidproxy: %v\n", err)
		return 2
	}
	pctx, cancel := context.WithTimeout(ctx, *f.timeout)
	defer cancel()
	rtt, err := health.Probe(pctx, addr, cfg)
	if err != nil {
		fmt.Fprintf(stdout, "%v %v: %v (%v)\n", cfg.Protocol, addr, health.ResultOf(err), err)
		return 1
	}
	fmt.Fprintf(stdout, "%v %v: ok in %v\n", cfg.Protocol, addr, rtt.Round(time.Microsecond))
	return 0
}

// healthSummary is the health_check part of a service's summary line.
func healthSummary(hc *health.Config) string {
	if hc == nil {
		return ""
	}
	return fmt.Sprintf(", probes every %v (timeout %v, fall %d, rise %d)", hc.Interval, hc.Timeout, hc.Fall, hc.Rise)
}

// readiness reports why the proxy cannot route new sessions: for every
// service, a stale registry or no ready backend; nil when it can. A
// stopping proxy is not ready.
func (p *proxy) readiness() []string {
	var why []string
	if p.stopping.Load() {
		why = append(why, "stopping")
	}
	for _, ps := range p.services {
		st := ps.reg.Stats()
		switch {
		case st.Stale:
			why = append(why, fmt.Sprintf("service %s: registry stale (last confirmed %v ago, max_registry_age %v)",
				ps.cfg.Name, st.Age.Round(time.Millisecond), ps.cfg.MaxAge))
		case st.Ready == 0:
			why = append(why, fmt.Sprintf("service %s: no ready backend (draining %d, down by probes %d, gone %d, snapshot version %d)",
				ps.cfg.Name, st.Draining, st.Down, st.Gone, st.Version))
		}
	}
	return why
}

// readyz answers 200 "ok" when every service can take new sessions, else
// 503 with one line per failing service. It writes no log line.
func (p *proxy) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if why := p.readiness(); len(why) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(why, "\n"))
		return
	}
	fmt.Fprintln(w, "ok")
}

// livez answers 200 "ok" while the proxy serves: its sockets are open and
// its workers run, whatever its backends do (a proxy without backends is
// not ready, but restarting it would not help).
func (p *proxy) livez(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if p.stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "stopping")
		return
	}
	fmt.Fprintln(w, "ok")
}

// healthCollector exports the health checkers' probes and verdicts.
type healthCollector struct{ p *proxy }

var (
	descProbes = prometheus.NewDesc("cidroute_probes_total",
		"Health probes sent to a backend (a DTLS ClientHello or a QUIC reserved-version packet under a PPv2 LOCAL header), by result: ok, timeout, refused (ICMP port unreachable), bad_answer (not the protocol's answer), error (not sent).",
		[]string{"service", "ordinal", "result"}, nil)
	descProbeUp = prometheus.NewDesc("cidroute_backend_probe_up",
		"1 while the health checker considers the backend up, 0 while it is marked down (no new sessions; its CID sessions keep their route). Only for backends of services with health_check that the checker probes.",
		[]string{"service", "ordinal"}, nil)
	descProbeRTT = prometheus.NewDesc("cidroute_probe_duration_seconds",
		"Round-trip time of answered health probes: from the probe's send to the backend stack's answer.",
		[]string{"service"}, nil)
	descSessionsMax = prometheus.NewDesc("cidroute_sessions_max",
		"Transparent-mode session tables' capacity, summed over the service's workers; 0 with PROXY protocol.",
		[]string{"service"}, nil)
)

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descProbes, descProbeUp, descProbeRTT, descSessionsMax} {
		ch <- d
	}
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.p.pipe.Stats() {
		ch <- prometheus.MustNewConstMetric(descSessionsMax, prometheus.GaugeValue, float64(s.MaxSessions), s.Name)
	}
	for _, ps := range c.p.services {
		if ps.checker == nil {
			continue
		}
		name := ps.cfg.Name
		st := ps.checker.Stats()
		for _, b := range st.Backends {
			ord := strconv.Itoa(int(b.Ordinal))
			up := 0.0
			if b.Up {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(descProbeUp, prometheus.GaugeValue, up, name, ord)
			for r := range health.NumResults {
				ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(b.Results[r]), name, ord, health.Result(r).String())
			}
		}
		buckets := make(map[float64]uint64, len(health.RTTBuckets))
		for i, ub := range health.RTTBuckets {
			buckets[ub] = st.RTT.Buckets[i]
		}
		ch <- prometheus.MustNewConstHistogram(descProbeRTT, st.RTT.Count, st.RTT.Sum, buckets, name)
	}
}

// backendStates are the cidroute_registry_backends states: the registry's
// three, and "down" (ready by the source, down by the probes).
func backendStates(st registry.Stats) [4]struct {
	state string
	n     int
} {
	return [4]struct {
		state string
		n     int
	}{{"ready", st.Ready}, {"draining", st.Draining}, {"down", st.Down}, {"gone", st.Gone}}
}
