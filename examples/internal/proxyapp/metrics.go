package proxyapp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/cidroute/cidroute/promcollector"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsHandler serves /metrics from its own registry (not the global one),
// /readyz and /livez, and Go's profiler under /debug/pprof/.
func metricsHandler(p *proxy) http.Handler {
	c, err := promcollector.New(promcollector.Config{Pipeline: p.pipe, Registry: p.regs.Registry, Checker: p.regs.Checker,
		Paths: []promcollector.Path{{Name: "xdp", Stats: p.xdpStats}}})
	if err != nil {
		panic(err) // a pipeline and a named path: cannot fail
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, reloadCollector{p},
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

// reloadCollector exports the SIGHUP reloads by result (reload.go).
type reloadCollector struct{ p *proxy }

var descReloads = prometheus.NewDesc("cidroute_config_reloads_total",
	"SIGHUP reloads of the configuration file, by result: applied (all of it), partial (keys that need a restart handover refused, or a change that failed; the rest applied), invalid (the file was refused; nothing changed).",
	[]string{"result"}, nil)

func (c reloadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descReloads }

func (c reloadCollector) Collect(ch chan<- prometheus.Metric) {
	for r, name := range reloadResults {
		ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, float64(c.p.reloads[r].Load()), name)
	}
}
