package proxyapp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// collector turns the pipeline's counters and the registries' stats into
// metrics at scrape time, so the packet path does no metrics work at all.
type collector struct {
	p *proxy
}

var (
	descDatagrams = prometheus.NewDesc("cidroute_datagrams_total",
		"Datagrams handled, by service, direction (forward: client to backend, reverse: backend to client), outcome, drop reason and path (socket: the pipeline; xdp: the XDP fast path).",
		[]string{"service", "direction", "outcome", "reason", "path"}, nil)
	descReceived = prometheus.NewDesc("cidroute_datagrams_received_total",
		"Datagrams received, by service, direction and path; equals the sum of cidroute_datagrams_total over outcome and reason.",
		[]string{"service", "direction", "path"}, nil)
	descBackends = prometheus.NewDesc("cidroute_registry_backends",
		"Backends in the service's current registry snapshot, by state: ready, draining, down (ready by the source, marked down by health probes) and gone.",
		[]string{"service", "state"}, nil)
	descAge = prometheus.NewDesc("cidroute_registry_snapshot_age_seconds",
		"Seconds since the backend source last published or confirmed the snapshot.",
		[]string{"service"}, nil)
	descStale = prometheus.NewDesc("cidroute_registry_stale",
		"1 while the registry is stale (new sessions refused, CID sessions still routed), else 0.",
		[]string{"service"}, nil)
	descRejected = prometheus.NewDesc("cidroute_registry_rejected_updates_total",
		"Backend updates refused: invalid lists (duplicate ordinals or addresses, empty, ...) and backend files that could not be read or decoded.",
		[]string{"service"}, nil)
	descSessions = prometheus.NewDesc("cidroute_sessions",
		"Transparent-mode sessions (one upstream socket per flow: client address and backend); always 0 with PROXY protocol.",
		[]string{"service"}, nil)
	descReloads = prometheus.NewDesc("cidroute_config_reloads_total",
		"SIGHUP reloads of the configuration file, by result: applied (all of it), partial (keys that need a restart handover refused, or a change that failed; the rest applied), invalid (the file was refused; nothing changed).",
		[]string{"result"}, nil)
	descVersion = prometheus.NewDesc("cidroute_registry_snapshot_version",
		"Version of the current registry snapshot; it grows by one with each accepted update.",
		[]string{"service"}, nil)
)

// The drop reasons each direction can produce (cidroute.ForwardDrops and
// ReverseDrops) are exported from the start, at 0, so that rate() and
// alerts see them before the first drop; any other reason appears once it
// counts something.

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDatagrams, descReceived, descBackends, descAge, descStale, descRejected, descVersion, descSessions, descReloads} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for r, name := range reloadResults {
		ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, float64(c.p.reloads[r].Load()), name)
	}
	for _, s := range c.p.stats() {
		if s.path == "socket" {
			ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.Sessions), s.Name)
		}
		for _, d := range []struct {
			name    string
			c       *cidroute.Counters
			reasons cidroute.ReasonSet
		}{{"forward", &s.Forward, cidroute.ForwardDrops}, {"reverse", &s.Reverse, cidroute.ReverseDrops}} {
			ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(d.c.Received), s.Name, d.name, s.path)
			ch <- prometheus.MustNewConstMetric(descDatagrams, prometheus.CounterValue, float64(d.c.Forwarded), s.Name, d.name, "forwarded", "", s.path)
			for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
				if n := d.c.Dropped[r]; n > 0 || d.reasons.Has(r) {
					ch <- prometheus.MustNewConstMetric(descDatagrams, prometheus.CounterValue, float64(n), s.Name, d.name, "dropped", r.String(), s.path)
				}
			}
		}
	}
	for _, name := range c.p.serviceNames() {
		reg, _ := c.p.regs.Registry(name)
		st := reg.Stats()
		for _, b := range backendStates(st) {
			ch <- prometheus.MustNewConstMetric(descBackends, prometheus.GaugeValue, float64(b.n), name, b.state)
		}
		ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, st.Age.Seconds(), name)
		stale := 0.0
		if st.Stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(descStale, prometheus.GaugeValue, stale, name)
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(st.Rejections), name)
		ch <- prometheus.MustNewConstMetric(descVersion, prometheus.GaugeValue, float64(st.Version), name)
	}
}

// metricsHandler serves /metrics from its own registry (not the global one),
// /readyz and /livez, and Go's profiler under /debug/pprof/.
func metricsHandler(p *proxy) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{p}, healthCollector{p},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /readyz", p.readyz) // health.go
	mux.HandleFunc("GET /livez", p.livez)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// metricsServer listens on addr at once (so a busy port fails start-up) and
// serves until stop is called.
type metricsServer struct {
	srv  *http.Server
	ln   net.Listener // handed to a successor (handover.go)
	done chan struct{}
}

// startMetrics serves on ln when given (inherited in a restart handover),
// else on a new listener on addr.
func startMetrics(addr string, ln net.Listener, h http.Handler, log *slog.Logger) (*metricsServer, error) {
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, err
		}
	}
	m := &metricsServer{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		ln:   ln,
		done: make(chan struct{}),
	}
	log.Info("metrics listening", "addr", ln.Addr().String(), "paths", "/metrics /readyz /livez /debug/pprof/")
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	return m, nil
}

// stop closes the listener and waits briefly for scrapes in flight; a long
// profile request is cut off.
func (m *metricsServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if m.srv.Shutdown(ctx) != nil {
		m.srv.Close()
	}
	<-m.done
}
