package proxyapp

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

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
	cfg := health.ProbeConfig{Protocol: cidroute.DTLS, Direct: *f.direct}
	target := *f.dtls
	if *f.quic != "" {
		cfg.Protocol, target = cidroute.QUIC, *f.quic
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
	rtt, m, err := health.ProbeAnswer(pctx, addr, cfg)
	if err != nil {
		fmt.Fprintf(stdout, "%v %v: %v (%v)\n", cfg.Protocol, addr, health.ResultOf(err), err)
		return 1
	}
	untied := ""
	if m == health.Untied {
		untied = " (untied: the answer echoes nothing of the probe, so the checker cannot tell it from a forged one)"
	}
	fmt.Fprintf(stdout, "%v %v: ok in %v%s\n", cfg.Protocol, addr, rtt.Round(time.Microsecond), untied)
	return 0
}

// readiness reports why the proxy cannot route new sessions: for every
// service, a stale registry or no ready backend; nil when it can. A
// stopping proxy is not ready.
func (p *proxy) readiness() []string {
	var why []string
	if p.stopping.Load() {
		why = append(why, "stopping")
	}
	for _, name := range p.serviceNames() {
		reg, _ := p.regs.Registry(name)
		st := reg.Stats()
		switch {
		case st.Stale:
			why = append(why, fmt.Sprintf("service %s: registry stale (last confirmed %v ago, max_registry_age %v)",
				name, st.Age.Round(time.Millisecond), reg.MaxAge()))
		case st.Ready == 0:
			why = append(why, fmt.Sprintf("service %s: no ready backend (draining %d, down by probes %d, gone %d, snapshot version %d)",
				name, st.Draining, st.Down, st.Gone, st.Version))
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

// inheritMarks hands a predecessor's down marks (restart handover) to the
// service's health checker, which keeps them until its own probes speak.
// A service without health_check takes none: nothing would ever lift
// them.
func inheritMarks(regs *proxyconfig.Registries, service string, down []registry.Backend, log *slog.Logger) {
	if len(down) == 0 {
		return
	}
	if c, ok := regs.Checker(service); ok {
		c.Inherit(down)
		return
	}
	log.Info("handover: the predecessor's down marks are dropped: this service has no health_check",
		"service", service, "marked_down", len(down))
}
