package proxyapp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"syscall"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/promcollector"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
)

// metricsHandler serves /metrics from its own registry (not the global
// one), /readyz and /livez. Go's profiler is not here: pprofHandler, on
// pprof_listen's listener, when configured.
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
	return mux
}

// pprofHandler serves Go's profiler under /debug/pprof/.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Bounds of the admin listeners (metrics, pprof), variables for tests.
// Each listener holds at most its cap of connections (more wait in the
// kernel's backlog until one closes), each connection lives at most
// adminReadTimeout reading a request and adminIdleTimeout between two,
// so that idle keep-alive connections cannot take the descriptors the
// health probes and the sessions need.
var (
	adminReadTimeout  = 10 * time.Second
	adminIdleTimeout  = 30 * time.Second
	metricsWriteLimit = 10 * time.Second // a scrape's answer
	pprofWriteLimit   = 2 * time.Minute  // a CPU profile or trace of up to about 110 s
)

// pprofMaxConns caps the profiler's connections: one profile at a time is
// what an operator takes, and each costs the proxy CPU.
const pprofMaxConns = 2

// metricsMaxConns caps the metrics listener's connections at a quarter of
// the descriptors the pipeline leaves to the rest of the process
// (cidroute.ReservedFDs: at least 64), 4 to 64: a Prometheus server or
// two, the kubelet's probes and an operator's curl need a few each.
func metricsMaxConns() int {
	n, ok := cidroute.ReservedFDs()
	if !ok {
		return 64
	}
	return min(64, max(4, n/4))
}

// metricsServer serves an admin listener (metrics or pprof) until stop is
// called.
type metricsServer struct {
	srv  *http.Server
	ln   net.Listener // the bare listener, handed to a successor (handover.go)
	done chan struct{}
	quit chan struct{} // stops a pprof listener still waiting for its port
}

// startMetrics serves h on ln when given (inherited in a restart
// handover), else on a new listener on addr, which it opens at once (so
// a busy port fails start-up).
func startMetrics(addr string, ln net.Listener, h http.Handler, log *slog.Logger) (*metricsServer, error) {
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, err
		}
	}
	m := newAdminServer(h, metricsWriteLimit, log)
	max := metricsMaxConns()
	log.Info("metrics listening", "addr", ln.Addr().String(), "paths", "/metrics /readyz /livez", "max_conns", max)
	m.serve(ln, max, log)
	return m, nil
}

// startPprof serves Go's profiler on addr. In a restart handover the
// predecessor holds the port until it exits (the profiler's listener is
// not handed over): with wait set, a busy port is tried again every
// 250 ms until it is free or stop is called.
func startPprof(addr string, wait bool, log *slog.Logger) (*metricsServer, error) {
	m := newAdminServer(pprofHandler(), pprofWriteLimit, log)
	listen := func() (net.Listener, error) { return net.Listen("tcp", addr) }
	ln, err := listen()
	switch {
	case err == nil:
	case !wait || !errors.Is(err, syscall.EADDRINUSE):
		return nil, err
	default:
		log.Info("pprof_listen busy, as a predecessor holds it until it exits; trying again every 250ms", "addr", addr)
		go func() {
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-m.quit:
					close(m.done)
					return
				case <-t.C:
				}
				if ln, err := listen(); err == nil {
					log.Info("pprof listening", "addr", ln.Addr().String(), "paths", "/debug/pprof/", "max_conns", pprofMaxConns)
					m.serveOn(ln, pprofMaxConns, log)
					return
				}
			}
		}()
		return m, nil
	}
	log.Info("pprof listening", "addr", ln.Addr().String(), "paths", "/debug/pprof/", "max_conns", pprofMaxConns)
	m.serve(ln, pprofMaxConns, log)
	return m, nil
}

func newAdminServer(h http.Handler, write time.Duration, log *slog.Logger) *metricsServer {
	return &metricsServer{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: adminReadTimeout,
			WriteTimeout: write, IdleTimeout: adminIdleTimeout, MaxHeaderBytes: 16 << 10,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		done: make(chan struct{}),
		quit: make(chan struct{}),
	}
}

// serve serves on ln, at most max connections at a time, until stop.
func (m *metricsServer) serve(ln net.Listener, max int, log *slog.Logger) {
	m.ln = ln
	go m.serveOn(ln, max, log)
}

func (m *metricsServer) serveOn(ln net.Listener, max int, log *slog.Logger) {
	defer close(m.done)
	if err := m.srv.Serve(netutil.LimitListener(ln, max)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("admin listener stopped", "addr", ln.Addr().String(), "err", err)
	}
}

// stop closes the listener and waits briefly for requests in flight; a
// long profile request is cut off. It is nil-safe.
func (m *metricsServer) stop() {
	if m == nil {
		return
	}
	close(m.quit)
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
