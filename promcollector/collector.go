package promcollector

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
)

// Config says what a Collector reads at each scrape.
type Config struct {
	// Pipeline's Stats are the datagram counters of path "socket". Required.
	Pipeline *cidroute.Pipeline
	// Registry returns a service's registry, for the cidroute_registry_*
	// metrics (proxyconfig.Registries.Registry fits); nil, or false for a
	// service: none for it.
	Registry func(service string) (*registry.Registry, bool)
	// Checker returns a service's health checker, for the probe metrics
	// (proxyconfig.Registries.Checker fits); nil, or false: none.
	Checker func(service string) (*health.Checker, bool)
	// Paths are further datagram counters beside the pipeline's, each
	// exported under its own path label: the XDP fast path's ("xdp"),
	// which counts only the datagrams it decided itself.
	Paths []Path
}

// A Path is a source of datagram counters besides the pipeline. Stats
// may return nil (a fast path that is not attached).
type Path struct {
	Name  string                         // the path label of its series, such as "xdp"
	Stats func() []cidroute.ServiceStats // read at each scrape
}

// A Collector is a prometheus.Collector over the counters Config names.
// Register it on a prometheus.Registry. It is safe for concurrent use.
type Collector struct {
	cfg Config
}

var _ prometheus.Collector = (*Collector)(nil)

// ErrConfig is wrapped by New's errors.
var ErrConfig = errors.New("promcollector: invalid configuration")

// New returns a Collector for cfg.
func New(cfg Config) (*Collector, error) {
	if cfg.Pipeline == nil {
		return nil, fmt.Errorf("no pipeline: %w", ErrConfig)
	}
	for _, p := range cfg.Paths {
		if p.Name == "" || p.Name == pathSocket || p.Stats == nil {
			return nil, fmt.Errorf("path %q: want a name other than %q and a Stats function: %w", p.Name, pathSocket, ErrConfig)
		}
	}
	return &Collector{cfg: cfg}, nil
}

const pathSocket = "socket"

var (
	descDatagrams = prometheus.NewDesc("cidroute_datagrams_total",
		"Datagrams handled, by service, direction (forward: client to backend, reverse: backend to client), outcome, drop reason and path (socket: the pipeline; xdp: the XDP fast path).",
		[]string{"service", "direction", "outcome", "reason", "path"}, nil)
	descReceived = prometheus.NewDesc("cidroute_datagrams_received_total",
		"Datagrams received, by service, direction and path; equals the sum of cidroute_datagrams_total over outcome and reason.",
		[]string{"service", "direction", "path"}, nil)
	descSessions = prometheus.NewDesc("cidroute_sessions",
		"Transparent-mode sessions (one upstream socket per flow: client address and backend); always 0 with PROXY protocol.",
		[]string{"service"}, nil)
	descSessionsMax = prometheus.NewDesc("cidroute_sessions_max",
		"Transparent-mode session tables' capacity, summed over the service's workers; 0 with PROXY protocol.",
		[]string{"service"}, nil)
	descEvicted = prometheus.NewDesc("cidroute_sessions_evicted_total",
		"Transparent-mode sessions a full table expired early, the quietest first, to make room for a new flow.",
		[]string{"service"}, nil)
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
	descVersion = prometheus.NewDesc("cidroute_registry_snapshot_version",
		"Version of the current registry snapshot; it grows by one with each accepted update, health change and slow-start step.",
		[]string{"service"}, nil)
	descSlowStart = prometheus.NewDesc("cidroute_registry_slow_starting_backends",
		"Ready backends whose share of new sessions is still ramping up (slow_start).",
		[]string{"service"}, nil)
	descProbes = prometheus.NewDesc("cidroute_probes_total",
		"Health probes sent to a backend (a DTLS ClientHello or a QUIC reserved-version packet under a PPv2 LOCAL header), by result: ok, timeout, refused (ICMP port unreachable), bad_answer (not the protocol's answer), error (not sent).",
		[]string{"service", "ordinal", "result"}, nil)
	descProbeUp = prometheus.NewDesc("cidroute_backend_probe_up",
		"1 while the health checker considers the backend up, 0 while it is marked down (no new sessions; its CID sessions keep their route). Only for backends of services with health_check that the checker probes.",
		[]string{"service", "ordinal"}, nil)
	descKernelDrops = prometheus.NewDesc("cidroute_kernel_drops_total",
		"Datagrams the kernel dropped on the pipeline's receiving sockets because their receive buffers were full (forward: the service sockets; reverse: the upstream sockets), before the pipeline read them: the kernel accepted cidroute_datagrams_received_total + this. Raise recv_buffer when it grows.",
		[]string{"service", "direction"}, nil)
	descQueued = prometheus.NewDesc("cidroute_socket_queue_bytes",
		"Bytes waiting now in the receive queues of the pipeline's receiving sockets (forward: the service sockets; reverse: the upstream sockets), the kernel's bookkeeping included (about 1 KiB a small datagram): divided by what the workers read a second, how long a datagram waits. Near cidroute_socket_queue_limit_bytes the workers are past their capacity and the kernel drops.",
		[]string{"service", "direction"}, nil)
	descQueueLimit = prometheus.NewDesc("cidroute_socket_queue_limit_bytes",
		"What the same receive queues may hold: their receive buffers as the kernel counts them (twice recv_buffer, summed over the workers' sockets).",
		[]string{"service", "direction"}, nil)
	descBatch = prometheus.NewDesc("cidroute_batch_size",
		"Datagrams per receive call (recvmmsg), by service and direction: the mean (sum / count) near 1 means workers wake for every datagram (light load), near the batch size (64 by default) that they are saturated.",
		[]string{"service", "direction"}, nil)
	descProbeRTT = prometheus.NewDesc("cidroute_probe_duration_seconds",
		"Round-trip time of answered health probes: from the probe's send to the backend stack's answer.",
		[]string{"service"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDatagrams, descReceived, descSessions, descSessionsMax,
		descEvicted, descBackends, descAge, descStale, descRejected, descVersion, descSlowStart, descProbes, descProbeUp, descProbeRTT,
		descKernelDrops, descQueued, descQueueLimit, descBatch} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.cfg.Pipeline.Stats()
	for _, s := range stats {
		ch <- gauge(descSessions, float64(s.Sessions), s.Name)
		ch <- gauge(descSessionsMax, float64(s.MaxSessions), s.Name)
		ch <- counter(descEvicted, float64(s.SessionsEvicted), s.Name)
		datagrams(ch, s, pathSocket)
		sockets(ch, s)
	}
	for _, p := range c.cfg.Paths {
		for _, s := range p.Stats() {
			datagrams(ch, s, p.Name)
		}
	}
	for _, s := range stats {
		if c.cfg.Registry != nil {
			if reg, ok := c.cfg.Registry(s.Name); ok {
				registryMetrics(ch, s.Name, reg.Stats())
			}
		}
		if c.cfg.Checker != nil {
			if chk, ok := c.cfg.Checker(s.Name); ok {
				probeMetrics(ch, s.Name, chk.Stats())
			}
		}
	}
}

// datagrams exports one service's counters of one path: every reason its
// direction can count, and any other that counted something.
func datagrams(ch chan<- prometheus.Metric, s cidroute.ServiceStats, path string) {
	for _, d := range []struct {
		name    string
		c       *cidroute.Counters
		reasons cidroute.ReasonSet
	}{{"forward", &s.Forward, cidroute.ForwardDrops}, {"reverse", &s.Reverse, cidroute.ReverseDrops}} {
		ch <- counter(descReceived, float64(d.c.Received), s.Name, d.name, path)
		ch <- counter(descDatagrams, float64(d.c.Forwarded), s.Name, d.name, "forwarded", "", path)
		for r := cidroute.Reason(1); r < cidroute.NumReasons; r++ {
			if n := d.c.Dropped[r]; n > 0 || d.reasons.Has(r) {
				ch <- counter(descDatagrams, float64(n), s.Name, d.name, "dropped", r.String(), path)
			}
		}
	}
}

// sockets exports what the pipeline's sockets tell of their load: the
// kernel's drops and the batch sizes.
func sockets(ch chan<- prometheus.Metric, s cidroute.ServiceStats) {
	for _, d := range []struct {
		name string
		c    *cidroute.Counters
	}{{"forward", &s.Forward}, {"reverse", &s.Reverse}} {
		ch <- counter(descKernelDrops, float64(d.c.KernelDrops), s.Name, d.name)
		if d.c.QueueLimit > 0 { // reported by this platform's sockets
			ch <- gauge(descQueued, float64(d.c.Queued), s.Name, d.name)
			ch <- gauge(descQueueLimit, float64(d.c.QueueLimit), s.Name, d.name)
		}
		// BatchSizes[i] holds batches of 2^(i-1) to 2^i-1 datagrams: the
		// cumulative bucket "le 2^i-1" is the sum up to i.
		buckets := make(map[float64]uint64, cidroute.NumBatchBuckets-1)
		var cum uint64
		for i := 1; i < cidroute.NumBatchBuckets; i++ {
			cum += d.c.BatchSizes[i]
			buckets[float64(uint64(1)<<i-1)] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descBatch, cum, float64(d.c.Received), buckets, s.Name, d.name)
	}
}

func registryMetrics(ch chan<- prometheus.Metric, name string, st registry.Stats) {
	for _, b := range []struct {
		state string
		n     int
	}{{"ready", st.Ready}, {"draining", st.Draining}, {"down", st.Down}, {"gone", st.Gone}} {
		ch <- gauge(descBackends, float64(b.n), name, b.state)
	}
	ch <- gauge(descAge, st.Age.Seconds(), name)
	stale := 0.0
	if st.Stale {
		stale = 1
	}
	ch <- gauge(descStale, stale, name)
	ch <- counter(descRejected, float64(st.Rejections), name)
	ch <- gauge(descVersion, float64(st.Version), name)
	ch <- gauge(descSlowStart, float64(st.SlowStarting), name)
}

func probeMetrics(ch chan<- prometheus.Metric, name string, st health.Stats) {
	for _, b := range st.Backends {
		ord := strconv.Itoa(int(b.Ordinal))
		up := 0.0
		if b.Up {
			up = 1
		}
		ch <- gauge(descProbeUp, up, name, ord)
		for r := range health.NumResults {
			ch <- counter(descProbes, float64(b.Results[r]), name, ord, health.Result(r).String())
		}
	}
	buckets := make(map[float64]uint64, len(health.RTTBuckets))
	for i, ub := range health.RTTBuckets {
		buckets[ub] = st.RTT.Buckets[i]
	}
	ch <- prometheus.MustNewConstHistogram(descProbeRTT, st.RTT.Count, st.RTT.Sum, buckets, name)
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}
