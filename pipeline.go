package cidroute

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

// Service configures one proxied service of a Pipeline.
type Service struct {
	// Name labels the service in metrics and logs.
	Name string
	// Listen is the address the service's sockets bind, where clients
	// send. A wildcard address listens on every local address.
	Listen netip.AddrPort
	// RouterConfig holds the routing fields: Protocol, Codec or CIDLen,
	// Classifier, Backends, Encoder, and Service, the public address
	// (zero means Listen). The public address is in the HRW key of new
	// DTLS sessions, so all replicas must be configured with the same one:
	// behind a load balancer, the VIP. When it is a wildcard, the PPv2
	// destination is the address each datagram was sent to, and replies
	// leave from it.
	RouterConfig
	// Limits are the admission limits (all off by default).
	Limits Limits
	// Workers is the number of SO_REUSEPORT sockets, each served by one
	// forward and one reverse goroutine. 0 means GOMAXPROCS.
	Workers int
	// RecvBuffer and SendBuffer request socket buffer sizes in bytes (0
	// keeps the kernel default).
	RecvBuffer, SendBuffer int

	// Transparent forwards datagrams without a PPv2 header, for backends
	// that cannot parse one, at the cost of one upstream socket and one
	// goroutine per client address (see transparent.go). The Encoder is
	// not used.
	Transparent bool
	// MaxSessions bounds each worker's transparent session table (0 =
	// DefaultMaxSessions); datagrams of further client addresses are
	// dropped with SessionLimit until idle sessions expire.
	MaxSessions int
	// SessionIdle is how long a transparent session lives without traffic
	// (0 = DefaultSessionIdle, 2 minutes).
	SessionIdle time.Duration
}

// Config configures a Pipeline.
type Config struct {
	Services []Service
	// BatchSize is the number of datagrams per recvmmsg/sendmmsg (0 = 32).
	BatchSize int
	// MaxDatagram is the largest datagram accepted in either direction,
	// PPv2 header included (0 = 9216). Larger ones are dropped as
	// malformed.
	MaxDatagram int
	// Logger receives start-up, shutdown and error logs, never one line
	// per datagram. nil means slog.Default().
	Logger *slog.Logger
}

// ErrClosed is returned by Run on a Pipeline that was already run or
// closed.
var ErrClosed = errors.New("cidroute: pipeline closed")

// A Pipeline is the CID-aware proxy: for each service, workers that read
// batches from the service's sockets, route them (Router), prepend PPv2 and
// send them to backends, and relay the backends' replies back to clients.
// It keeps no per-client state.
type Pipeline struct {
	log      *slog.Logger
	services []*service

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	runOnce  sync.Once
	err      error
}

type service struct {
	cfg    Service
	router *Router
	// measured: the public address is a wildcard, so each datagram's
	// measured destination stands in for it (PPv2 destination, reply
	// source).
	measured bool
	workers  []*worker
}

// New validates cfg and opens every socket, so that a bad address fails
// here and Addr reports the bound ports; Run starts the traffic.
func New(cfg Config) (*Pipeline, error) {
	if len(cfg.Services) == 0 {
		return nil, fmt.Errorf("no services: %w", ErrConfig)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = udpio.DefaultBatch
	}
	if cfg.MaxDatagram == 0 {
		cfg.MaxDatagram = 9216
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 1024 || cfg.MaxDatagram < 64 || cfg.MaxDatagram > 65535 {
		return nil, fmt.Errorf("batch size %d, max datagram %d: %w", cfg.BatchSize, cfg.MaxDatagram, ErrConfig)
	}
	p := &Pipeline{log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	names := map[string]bool{}
	for _, sc := range cfg.Services {
		if sc.Name == "" || names[sc.Name] {
			p.closeSockets()
			return nil, fmt.Errorf("service name %q empty or repeated: %w", sc.Name, ErrConfig)
		}
		names[sc.Name] = true
		s, err := p.openService(sc, cfg)
		if err != nil {
			p.closeSockets()
			return nil, fmt.Errorf("service %s: %w", sc.Name, err)
		}
		p.services = append(p.services, s)
	}
	return p, nil
}

func (p *Pipeline) openService(sc Service, cfg Config) (*service, error) {
	if err := sc.Limits.validate(); err != nil {
		return nil, err
	}
	if sc.Workers == 0 {
		sc.Workers = runtime.GOMAXPROCS(0)
	}
	if sc.Workers < 1 || sc.Workers > 256 {
		return nil, fmt.Errorf("workers %d: %w", sc.Workers, ErrConfig)
	}
	if sc.MaxSessions < 0 || sc.SessionIdle < 0 || (!sc.Transparent && (sc.MaxSessions != 0 || sc.SessionIdle != 0)) {
		return nil, fmt.Errorf("max sessions %d, session idle %v (transparent mode only): %w", sc.MaxSessions, sc.SessionIdle, ErrConfig)
	}
	rc := sc.RouterConfig
	if !rc.Service.IsValid() {
		rc.Service = sc.Listen
	}
	r, err := NewRouter(rc)
	if err != nil {
		return nil, err
	}
	s := &service{cfg: sc, router: r, measured: r.service.Addr().IsUnspecified()}
	lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer,
		PacketInfo: s.measured && sc.Listen.Addr().IsUnspecified()}
	network := "udp4"
	if sc.Listen.Addr().Is6() {
		network = "udp6"
	}
	group, err := udpio.ListenGroup(network, sc.Listen.String(), sc.Workers, lc)
	if err != nil {
		return nil, err
	}
	for _, in := range group {
		w, err := newWorker(s, in, sc, cfg)
		if err != nil {
			for _, c := range group {
				c.Close()
			}
			s.closeSessions()
			for _, w := range s.workers {
				w.closeUpstream()
			}
			return nil, err
		}
		s.workers = append(s.workers, w)
	}
	if port := group[0].LocalAddr().(*net.UDPAddr).AddrPort().Port(); s.cfg.Listen.Port() == 0 {
		// Learn the port the kernel picked.
		s.cfg.Listen = netip.AddrPortFrom(s.cfg.Listen.Addr(), port)
		if s.router.service.Port() == 0 {
			s.router.service = netip.AddrPortFrom(s.router.service.Addr(), port)
		}
	}
	return s, nil
}

// Addr returns the bound address of the named service.
func (p *Pipeline) Addr(service string) (netip.AddrPort, bool) {
	for _, s := range p.services {
		if s.cfg.Name == service {
			return s.cfg.Listen, true
		}
	}
	return netip.AddrPort{}, false
}

// UpstreamAddrs returns the local addresses of the named service's upstream
// sockets, the physical source of every datagram backends receive from this
// pipeline.
func (p *Pipeline) UpstreamAddrs(service string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range p.services {
		if s.cfg.Name == service {
			for _, w := range s.workers {
				if w.upConn != nil {
					out = append(out, w.upConn.LocalAddr().(*net.UDPAddr).AddrPort())
				}
			}
		}
	}
	return out
}

// Router returns the named service's routing step.
func (p *Pipeline) Router(service string) *Router {
	for _, s := range p.services {
		if s.cfg.Name == service {
			return s.router
		}
	}
	return nil
}

// Stats returns every service's counters, summed over its workers.
func (p *Pipeline) Stats() []ServiceStats {
	out := make([]ServiceStats, len(p.services))
	for i, s := range p.services {
		out[i].Name = s.cfg.Name
		for _, w := range s.workers {
			w.fwd.load(&out[i].Forward)
			w.rev.load(&out[i].Reverse)
			if w.sessions != nil {
				out[i].Sessions += int(w.sessions.count.Load())
			}
		}
	}
	return out
}

// Run serves until ctx is done or Close is called, then stops reading,
// sends what it had read, closes the sockets and returns. It returns nil
// after a requested stop, or the first socket error that stopped it. A
// Pipeline runs once; a second Run, or a Run after Close, returns ErrClosed.
func (p *Pipeline) Run(ctx context.Context) error {
	claimed := false
	p.runOnce.Do(func() { claimed = true })
	if !claimed {
		return ErrClosed
	}
	defer close(p.done)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for _, s := range p.services {
		for _, w := range s.workers {
			for _, loop := range w.loops() {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := loop(); err != nil {
						select {
						case errc <- err:
						default:
						}
					}
				}()
			}
		}
		p.log.Info("service started", "service", s.cfg.Name, "protocol", s.cfg.Protocol,
			"listen", s.cfg.Listen, "workers", len(s.workers), "cid_len", s.router.codec.Len())
	}
	var err error
	select {
	case <-ctx.Done():
	case <-p.stop:
	case err = <-errc:
		p.log.Error("pipeline stopped by a socket error", "err", err)
	}
	// Wake every reader without closing its socket: in-flight batches are
	// still sent, then the loops return and the sockets close.
	p.eachSocket(func(c *net.UDPConn) { c.SetReadDeadline(time.Unix(1, 0)) })
	wg.Wait()
	p.closeSockets() // after the forward loops: nothing opens a session now
	p.err = err
	p.log.Info("pipeline stopped")
	return err
}

// Close stops a running pipeline and waits until Run has returned, or
// closes the sockets of one that never ran. It is idempotent and returns
// what Run returned.
func (p *Pipeline) Close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.runOnce.Do(func() { // Run never started, and now never will
		p.closeSockets()
		close(p.done)
	})
	<-p.done
	return p.err
}

func (p *Pipeline) eachSocket(f func(*net.UDPConn)) {
	for _, s := range p.services {
		for _, w := range s.workers {
			f(w.inConn)
			if w.upConn != nil {
				f(w.upConn)
			}
		}
	}
}

// closeSockets ends the transparent sessions, then closes every socket.
func (p *Pipeline) closeSockets() {
	for _, s := range p.services {
		s.closeSessions()
	}
	p.eachSocket(func(c *net.UDPConn) { c.Close() })
}

func (s *service) closeSessions() {
	for _, w := range s.workers {
		if w.sessions != nil {
			w.sessions.close()
		}
	}
}
