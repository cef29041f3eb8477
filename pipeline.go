package cidroute

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/internal/addr"
	"github.com/cidroute/cidroute/registry"
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
	// Classifier, RequireDTLS13CID, Backends, Encoder, Unroutable,
	// Transparent and PublicAddr (zero means Listen). The public address is in the HRW
	// key of new DTLS sessions, so all replicas must be configured with
	// the same one: behind a load balancer, the VIP. When it is a
	// wildcard, the PPv2 destination is the address each datagram was
	// sent to, and replies leave from it.
	RouterConfig
	// Limits are the admission limits (all off by default).
	Limits Limits
	// Workers is the number of SO_REUSEPORT sockets, each served by one
	// forward and one reverse goroutine. 0 means GOMAXPROCS as the
	// process started with it (the CPUs its affinity and cgroup allow),
	// never as WaitThread raised it: a service added later gets as many.
	Workers int
	// RecvBuffer and SendBuffer request socket buffer sizes in bytes (0
	// keeps the kernel default).
	RecvBuffer, SendBuffer int
	// JoinExisting joins the SO_REUSEPORT group another process holds on
	// Listen (the new process of a restart handover) instead of failing
	// with udpio.ErrInUse; see udpio.ListenConfig.
	JoinExisting bool
	// Conns, when set, are the service's sockets, already bound to Listen
	// (zero Listen: their address): the ones a previous process handed
	// over (Pipeline.Sockets, passed as descriptors), or the caller's own.
	// The Pipeline serves them instead of opening a group, one worker
	// each, keeping their kernel queues and SO_REUSEPORT group. Workers
	// beyond len(Conns) get new sockets that join the group; fewer
	// Workers than Conns is taken as len(Conns), since closing a socket
	// of the group would lose what it holds. From New on the Pipeline
	// owns them and closes them when it stops, or when New fails. When
	// both Listen and the public address are wildcards, New turns packet
	// info on for them, so that replies leave from the address clients
	// sent to; RecvBuffer and SendBuffer apply to them too.
	Conns []*net.UDPConn
	// UpstreamConns, in PPv2 mode, are the workers' upstream sockets in
	// worker order (Pipeline.Sockets of the previous process), so that
	// backends keep replying to the ports they know and replies in flight
	// reach this Pipeline; a worker without one opens its own. Owned as
	// Conns are.
	UpstreamConns []*net.UDPConn

	// MaxSessions bounds each worker's transparent session table
	// (RouterConfig.Transparent); datagrams of further flows are dropped
	// with SessionLimit until idle sessions expire. Each session holds a
	// file descriptor, so the table must fit RLIMIT_NOFILE: 0 sizes it to
	// what the limit leaves after the pipeline's own sockets and a
	// reserve of max(64, limit/8) descriptors for everything else (metrics
	// connections, backend file reloads, logs), shared among every
	// transparent worker of the Pipeline and capped at
	// DefaultMaxSessions; New refuses a value that does not fit.
	MaxSessions int
	// SessionIdle is how long a transparent session lives without traffic
	// (0 = DefaultSessionIdle, 2 minutes; at least MinSessionIdle).
	SessionIdle time.Duration
	// SessionMemory bounds the memory of the service's transparent
	// sessions, all workers together, in bytes (0 = DefaultSessionMemory).
	// A session costs SessionBytes(Config.MaxDatagram): a 0 MaxSessions
	// is sized to fit it, and New refuses a MaxSessions that does not.
	SessionMemory int64

	// EarlyDrop attaches a socket filter to the service's sockets that
	// drops, in the kernel before they take room in the socket's queue,
	// the datagrams that can never route: those whose first record is
	// not DTLS 1.2, 1.0 or 1.3, and CID records whose ordinal no serving
	// backend has (udpio.Filter). It is rebuilt with every registry
	// snapshot: at once by a worker that reads a batch, within 100 ms for
	// one that reads nothing. Its drops are counted by the kernel with the
	// socket's queue overflows (Counters.KernelDrops), not under their
	// reasons. DTLS services with the built-in classifier and the
	// ordinal-first codec; Linux only (New fails elsewhere). Without it
	// a filter that a previous process left on handed-over sockets is
	// removed.
	EarlyDrop bool

	stall *stall // the overload tests' slow workers
}

// Config configures a Pipeline.
type Config struct {
	// Services are the services to run, each on its own sockets and
	// workers: at least one, each with a Name of its own.
	Services []Service
	// BatchSize is the number of datagrams per recvmmsg/sendmmsg (0 =
	// DefaultBatchSize).
	BatchSize int
	// MaxDatagram is the largest datagram relayed in either direction,
	// as a client sends or receives it: the PPv2 header is not counted
	// (0 = DefaultMaxDatagram). A larger one is dropped as TooBig. With
	// PROXY protocol the header is added on the way to the backend, so
	// MaxDatagram plus the header must fit a UDP datagram: New refuses
	// more than MaxDatagram4 for an IPv4 service, MaxDatagram6 for IPv6.
	MaxDatagram int
	// Logger receives start-up, shutdown and error logs, never one line
	// per datagram. nil means slog.Default().
	Logger *slog.Logger
	// Wait is how workers wait for datagrams (WaitNetpoller by default).
	Wait WaitMode
	// MaxWorkers caps the workers of all services together, those that
	// AddService adds included (0 = DefaultMaxWorkers). Each worker holds
	// two sockets and, with WaitThread, a thread and a P of GOMAXPROCS:
	// a configuration that asks for more fails rather than starve the
	// host.
	MaxWorkers int
}

// DefaultMaxWorkers is Config.MaxWorkers's default: far more than the
// CPUs of any host one proxy serves (one worker per CPU is the
// default), far fewer than would exhaust its threads.
const DefaultMaxWorkers = 1024

// Datagram sizes. A UDP datagram carries at most 65,507 payload bytes over
// IPv4 and 65,527 over IPv6; the PPv2 header takes 28 and 52 of them.
const (
	// DefaultMaxDatagram is Config.MaxDatagram's default: a jumbo frame's
	// payload, far above what DTLS and QUIC peers send (pion 1200 bytes,
	// quic-go at most 1452), at 9 KiB of buffer per datagram of a batch.
	DefaultMaxDatagram = 9216
	// MaxDatagram4 is the largest Config.MaxDatagram for an IPv4 PPv2
	// service: with the 28-byte header, a whole UDP datagram.
	MaxDatagram4 = maxUDP4 - 28
	// MaxDatagram6 is MaxDatagram4 for IPv6 (or dual-stack) services,
	// whose header takes 52 bytes.
	MaxDatagram6 = maxUDP6 - 52

	maxUDP4 = 65535 - 20 - 8
	maxUDP6 = 65535 - 8
)

// DefaultBatchSize is Config.BatchSize's default: 64 datagrams a syscall.
// Flat out, against 32, it took cidproxy from 1.08× to 1.03× the CPU per
// datagram of the independent benchmark's raw-limit forwarder (which
// batches 64 too) and costs 1.2 MB of buffers per worker; below
// saturation batches are short anyway.
const DefaultBatchSize = 64

// ErrClosed is returned by Run on a Pipeline that was already run or
// closed.
var ErrClosed = errors.New("cidroute: pipeline closed")

// A Pipeline is the CID-aware proxy: for each service, workers that read
// batches from the service's sockets, apply the service Router's forward
// rule to each datagram and send it to its backend behind a PPv2 header,
// and relay the backends' replies that pass the reverse rule back to
// their clients. It keeps no per-client state (except in transparent
// mode), and keeps the process's own addresses (OwnAddrs) current, so
// that neither direction ever sends to the proxy itself.
type Pipeline struct {
	log *slog.Logger
	cfg Config // batch size and datagram bound, for AddService
	own atomic.Pointer[OwnAddrs]

	// mu guards the service list, which AddService grows while Run runs;
	// the packet path never takes it.
	mu       sync.Mutex
	services []*service
	bound    []netip.AddrPort // every socket bound to receive: services and upstreams
	start    func(*service)   // while Run runs: starts a service's loops
	ended    bool             // Run has stopped, or Close ran first

	serving  chan struct{} // closed once Run's loops are all running
	stop     chan struct{}
	stopOnce sync.Once
	drain    context.Context // set by Drain (under mu) before stop closes
	done     chan struct{}
	runOnce  sync.Once
	err      error
}

type service struct {
	cfg     Service
	router  *Router
	workers []*worker
	lenLog  lengthWarning
}

// New validates cfg and opens every socket, so that a bad address fails
// here and Addr reports the bound ports; Run starts the traffic.
func New(cfg Config) (*Pipeline, error) {
	svcs := slices.Clone(cfg.Services)
	fail := func(err error) (*Pipeline, error) {
		for _, sc := range svcs { // the caller's sockets are the Pipeline's
			closeAll(sc.Conns)
			closeAll(sc.UpstreamConns)
		}
		return nil, err
	}
	if len(cfg.Services) == 0 {
		return nil, fmt.Errorf("no services: %w", ErrConfig)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MaxDatagram == 0 {
		cfg.MaxDatagram = DefaultMaxDatagram
	}
	if cfg.BatchSize < 1 || cfg.BatchSize > 1024 || cfg.MaxDatagram < 64 || cfg.MaxDatagram > maxUDP6 {
		return fail(fmt.Errorf("batch size %d, max datagram %d: %w", cfg.BatchSize, cfg.MaxDatagram, ErrConfig))
	}
	if cfg.Wait > WaitThread {
		return fail(fmt.Errorf("wait mode %d: %w", cfg.Wait, ErrConfig))
	}
	if cfg.MaxWorkers == 0 {
		cfg.MaxWorkers = DefaultMaxWorkers
	}
	if cfg.MaxWorkers < 1 {
		return fail(fmt.Errorf("max workers %d: %w", cfg.MaxWorkers, ErrConfig))
	}
	p := &Pipeline{log: cfg.Logger, cfg: cfg, serving: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	names := map[string]bool{}
	for i := range svcs {
		sc := &svcs[i]
		if sc.Name == "" || names[sc.Name] {
			return fail(fmt.Errorf("service name %q empty or repeated: %w", sc.Name, ErrConfig))
		}
		names[sc.Name] = true
		if err := sc.validate(); err != nil {
			return fail(fmt.Errorf("service %s: %w", sc.Name, err))
		}
	}
	if err := checkWorkers(svcs, cfg.MaxWorkers); err != nil {
		return fail(err)
	}
	if err := checkDatagram(svcs, cfg.MaxDatagram); err != nil {
		return fail(err)
	}
	if err := sizeSessions(svcs, cfg.MaxDatagram); err != nil {
		return fail(err)
	}
	for i, sc := range svcs {
		s, err := p.openService(sc)
		if err != nil {
			p.closeSockets()
			svcs = svcs[i+1:] // openService closed sc's own
			return fail(fmt.Errorf("service %s: %w", sc.Name, err))
		}
		p.services = append(p.services, s)
	}
	p.refreshOwn()
	if err := p.checkBackends(p.services); err != nil {
		p.closeSockets()
		return nil, err
	}
	return p, nil
}

// AddService opens the sockets of one more service and, while Run runs,
// starts serving it; the other services' sockets are not touched. A
// configuration reload adds services this way. It fails as New would for
// the service alone, and with ErrClosed once the Pipeline has stopped.
func (p *Pipeline) AddService(sc Service) error {
	fail := func(err error) error {
		closeAll(sc.Conns)
		closeAll(sc.UpstreamConns)
		return err
	}
	if err := sc.validate(); err != nil {
		return fail(fmt.Errorf("service %s: %w", sc.Name, err))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return fail(ErrClosed)
	}
	all := []Service{}
	for _, s := range p.services {
		if s.cfg.Name == sc.Name || sc.Name == "" {
			return fail(fmt.Errorf("service name %q empty or repeated: %w", sc.Name, ErrConfig))
		}
		all = append(all, s.cfg)
	}
	all = append(all, sc)
	if err := checkWorkers(all, p.cfg.MaxWorkers); err != nil {
		return fail(err)
	}
	if err := checkDatagram(all[len(all)-1:], p.cfg.MaxDatagram); err != nil {
		return fail(err)
	}
	if err := sizeSessions(all, p.cfg.MaxDatagram); err != nil {
		return fail(err)
	}
	sc = all[len(all)-1]
	nbound := len(p.bound)
	s, err := p.openServiceLocked(sc)
	if err != nil {
		return fmt.Errorf("service %s: %w", sc.Name, err)
	}
	p.refreshOwnLocked()
	if err := p.checkBackends(append(slices.Clone(p.services), s)); err != nil {
		s.close()
		p.bound = p.bound[:nbound]
		p.refreshOwnLocked()
		return err
	}
	p.services = append(p.services, s)
	if p.start != nil {
		p.start(s)
	}
	return nil
}

// validate checks sc and fills in its defaults (Workers, and Listen
// from Conns). The listen address is unmapped then: every check and the
// bind see ::ffff:a.b.c.d as a.b.c.d, as the own-address set and the
// routers do.
func (sc *Service) validate() error {
	if err := sc.Limits.validate(); err != nil {
		return err
	}
	if err := sc.checkConns(); err != nil {
		return err
	}
	sc.Listen = addr.Unmap(sc.Listen)
	if sc.Workers == 0 {
		sc.Workers = DefaultWorkers()
	}
	switch {
	case sc.Workers < 1 || sc.Workers > 256:
		return fmt.Errorf("workers %d: %w", sc.Workers, ErrConfig)
	case sc.RecvBuffer < 0 || sc.SendBuffer < 0:
		return fmt.Errorf("buffer sizes %d/%d: %w", sc.RecvBuffer, sc.SendBuffer, ErrConfig)
	case sc.MaxSessions < 0 || sc.SessionIdle < 0 || sc.SessionMemory < 0 || (!sc.Transparent && (sc.MaxSessions != 0 || sc.SessionIdle != 0 || sc.SessionMemory != 0)):
		return fmt.Errorf("max sessions %d, session idle %v, session memory %d (transparent mode only): %w", sc.MaxSessions, sc.SessionIdle, sc.SessionMemory, ErrConfig)
	case sc.SessionIdle != 0 && sc.SessionIdle < MinSessionIdle:
		return fmt.Errorf("session idle %v: want 0 (default %v) or at least %v: %w", sc.SessionIdle, DefaultSessionIdle, MinSessionIdle, ErrConfig)
	case !sc.Listen.IsValid():
		return fmt.Errorf("listen address %v: %w", sc.Listen, ErrConfig)
	case sc.Listen.Addr().IsMulticast() || sc.Listen.Addr() == limitedBroadcast:
		return fmt.Errorf("listen address %v: not unicast or wildcard: %w", sc.Listen, ErrConfig)
	}
	if sc.SessionIdle == 0 {
		sc.SessionIdle = DefaultSessionIdle
	}
	return nil
}

// checkConns checks the given sockets against Listen (filling it in when
// zero) and sizes Workers to hold them all.
func (sc *Service) checkConns() error {
	if len(sc.UpstreamConns) > 0 && (sc.Transparent || len(sc.UpstreamConns) > len(sc.Conns)) {
		return fmt.Errorf("%d upstream sockets for %d service sockets (transparent %v): %w", len(sc.UpstreamConns), len(sc.Conns), sc.Transparent, ErrConfig)
	}
	if len(sc.Conns) == 0 {
		return nil
	}
	for i, c := range sc.Conns {
		if c == nil {
			return fmt.Errorf("service socket %d is nil: %w", i, ErrConfig)
		}
		la, ok := c.LocalAddr().(*net.UDPAddr)
		if !ok || la == nil {
			return fmt.Errorf("service socket %d is not bound: %w", i, ErrConfig)
		}
		a := la.AddrPort()
		a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
		if !sc.Listen.IsValid() {
			sc.Listen = a
		}
		if a != sc.Listen {
			return fmt.Errorf("service socket %d is bound to %v, not the listen address %v: %w", i, a, sc.Listen, ErrConfig)
		}
	}
	if sc.Workers < len(sc.Conns) {
		sc.Workers = len(sc.Conns)
	}
	return nil
}

// sizeSessions gives each transparent service without MaxSessions its
// share of the descriptors RLIMIT_NOFILE leaves, and refuses tables that
// cannot fit it (see Service.MaxSessions).
func sizeSessions(svcs []Service, maxDatagram int) error {
	limit, ok := fdLimit()
	return sizeSessionsFor(svcs, limit, ok, maxDatagram)
}

// sizeSessionsFor is sizeSessions for a limit of limit descriptors (ok
// false: no limit).
func sizeSessionsFor(svcs []Service, limit uint64, ok bool, maxDatagram int) error {
	own, workers, configured := 0, 0, 0
	for _, sc := range svcs {
		own += sc.Workers // service sockets
		if !sc.Transparent {
			own += sc.Workers // shared upstream sockets
			continue
		}
		workers += sc.Workers
		configured += sc.Workers * sc.MaxSessions
	}
	if workers == 0 {
		return nil
	}
	own++ // the address watcher's socket
	var budget uint64
	if need := fdReserve(limit) + uint64(own); ok && limit > need {
		budget = limit - need
	}
	per := int64(SessionBytes(maxDatagram))
	for i := range svcs {
		sc := &svcs[i]
		if !sc.Transparent {
			continue
		}
		mem := sc.SessionMemory
		if mem == 0 {
			mem = DefaultSessionMemory
		}
		fit := int64(SessionsFit(mem, sc.Workers, maxDatagram))
		if sc.MaxSessions != 0 && int64(sc.MaxSessions) > fit {
			return fmt.Errorf("service %s: max sessions %d × %d workers × %d bytes a session (max datagram %d) need %d MiB, more than the session memory of %d MiB: %w",
				sc.Name, sc.MaxSessions, sc.Workers, per, maxDatagram, int64(sc.MaxSessions)*int64(sc.Workers)*per>>20, mem>>20, ErrConfig)
		}
		if fit == 0 {
			return fmt.Errorf("service %s: a session memory of %d bytes holds no session of %d bytes on each of %d workers: %w", sc.Name, mem, per, sc.Workers, ErrConfig)
		}
		switch {
		case !ok && sc.MaxSessions == 0:
			sc.MaxSessions = int(min(DefaultMaxSessions, fit))
		case sc.MaxSessions == 0:
			sc.MaxSessions = int(min(budget/uint64(workers), DefaultMaxSessions, uint64(fit)))
			if sc.MaxSessions == 0 {
				return fmt.Errorf("service %s: RLIMIT_NOFILE %d leaves no descriptors for transparent sessions (reserve %d, own sockets %d): %w",
					sc.Name, limit, fdReserve(limit), own, ErrConfig)
			}
		}
	}
	if ok && uint64(configured) > budget {
		return fmt.Errorf("transparent sessions of %d in all (max sessions × workers) need as many descriptors, RLIMIT_NOFILE %d leaves %d (reserve %d, own sockets %d): %w",
			configured, limit, budget, fdReserve(limit), own, ErrConfig)
	}
	return nil
}

func (p *Pipeline) openService(sc Service) (*service, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.openServiceLocked(sc)
}

// openServiceLocked opens (or adopts) the service's sockets and builds its
// workers. On failure every socket of sc, given or opened, is closed.
func (p *Pipeline) openServiceLocked(sc Service) (*service, error) {
	ups := sc.UpstreamConns
	defer func() { closeAll(ups) }() // those no worker took
	rc := sc.RouterConfig
	rc.PublicAddr = addr.Unmap(rc.PublicAddr) // as NewRouter sees it
	if !rc.PublicAddr.IsValid() {
		rc.PublicAddr = sc.Listen
	}
	if _, err := NewRouter(rc); err != nil {
		closeAll(sc.Conns)
		return nil, err
	}
	measured := rc.PublicAddr.Addr().IsUnspecified()
	lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer,
		PacketInfo: measured && sc.Listen.Addr().IsUnspecified()}
	// A later instance may take the sockets over (udpio.ListenConfig).
	lc.Joinable, lc.JoinExisting = true, sc.JoinExisting
	network := "udp4"
	if sc.Listen.Addr().Is6() {
		network = "udp6"
	}
	group, err := p.listen(network, sc, lc)
	if err != nil {
		return nil, configErr(err)
	}
	s := &service{cfg: sc}
	p.warnBuffers(sc, "service", group[0])
	if sc.Listen.Port() == 0 { // learn the port the kernel picked
		port := group[0].LocalAddr().(*net.UDPAddr).AddrPort().Port()
		s.cfg.Listen = netip.AddrPortFrom(sc.Listen.Addr(), port)
		if rc.PublicAddr.Port() == 0 {
			rc.PublicAddr = netip.AddrPortFrom(rc.PublicAddr.Addr(), port)
		}
	}
	if s.router, err = NewRouter(rc); err != nil {
		closeAll(group)
		return nil, err
	}
	s.lenLog.log, s.lenLog.want = p.log.With("service", sc.Name), s.router.cidLen
	s.cfg.Conns, s.cfg.UpstreamConns = nil, nil // the workers hold them now
	nbound := len(p.bound)
	p.bound = append(p.bound, s.cfg.Listen)
	for i, in := range group {
		var up *net.UDPConn
		if i < len(ups) {
			up, ups[i] = ups[i], nil
		}
		w, err := p.newWorker(s, in, up)
		if err == nil && lc.PacketInfo && !w.in.PacketInfo() {
			err = fmt.Errorf("socket bound to %v without packet info, which a wildcard public address needs: %w", s.cfg.Listen, ErrConfig)
			w.close()
		}
		if err != nil {
			closeAll(group[i:])
			s.close()
			p.bound = p.bound[:nbound]
			return nil, configErr(err)
		}
		s.workers = append(s.workers, w)
		p.bound = append(p.bound, w.up.addrs()...)
	}
	if u, ok := s.workers[0].up.(*sharedUpstream); ok {
		p.warnBuffers(sc, "upstream", u.io)
	}
	return s, nil
}

// warnBuffers logs when the kernel granted socket c (one of the service's
// sockets of a kind) smaller buffers than sc asks for: without
// CAP_NET_ADMIN it caps them at net.core.rmem_max and wmem_max, silently,
// and a short receive buffer drops datagrams in bursts (KernelDrops).
func (p *Pipeline) warnBuffers(sc Service, kind string, c syscall.Conn) {
	if sc.RecvBuffer == 0 && sc.SendBuffer == 0 {
		return
	}
	recv, send, err := udpio.BufferSizes(c)
	if err != nil {
		return // not reported on this platform
	}
	// Linux reports twice what it grants, its bookkeeping included.
	for _, b := range []struct {
		what, sysctl  string
		asked, actual int
	}{{"receive", "net.core.rmem_max", sc.RecvBuffer, recv / 2}, {"send", "net.core.wmem_max", sc.SendBuffer, send / 2}} {
		if b.asked > 0 && b.actual < b.asked {
			p.log.Warn("socket buffer smaller than configured: the kernel capped it; raise "+b.sysctl+" or give the process CAP_NET_ADMIN",
				"service", sc.Name, "socket", kind, "buffer", b.what, "asked", b.asked, "granted", b.actual)
		}
	}
}

// listen returns the service's sockets: sc.Conns, with more joining their
// group up to sc.Workers, or a new group.
func (p *Pipeline) listen(network string, sc Service, lc udpio.ListenConfig) ([]*net.UDPConn, error) {
	if len(sc.Conns) == 0 {
		return udpio.ListenGroup(network, sc.Listen.String(), sc.Workers, lc)
	}
	group := slices.Clone(sc.Conns)
	fail := func(err error) ([]*net.UDPConn, error) {
		closeAll(group)
		return nil, err
	}
	if lc.PacketInfo || lc.RecvBuffer > 0 || lc.SendBuffer > 0 {
		for _, c := range group {
			if err := udpio.Configure(c, lc); err != nil {
				return fail(err)
			}
		}
	}
	if n := sc.Workers - len(group); n > 0 {
		lc.JoinExisting = true // the group of the given sockets
		more, err := udpio.ListenGroup(network, sc.Listen.String(), n, lc)
		if err != nil {
			return fail(err)
		}
		group = append(group, more...)
	}
	return group, nil
}

// newWorker builds the worker of socket in and its upstream, on socket up
// when given (PPv2 mode).
func (p *Pipeline) newWorker(s *service, in, up *net.UDPConn) (*worker, error) {
	sc, cfg := s.cfg, p.cfg
	w, err := newWorker(in, s.router, &p.own, NewAdmission(sc.Limits, sc.Workers), cfg.BatchSize, cfg.MaxDatagram)
	if err != nil {
		if up != nil {
			up.Close()
		}
		return nil, err
	}
	rp := &replies{router: s.router, own: &p.own, out: w.in, stall: sc.stall, maxDatagram: cfg.MaxDatagram}
	w.rp, w.lenLog, w.stall = rp, &s.lenLog, sc.stall
	if sc.Transparent {
		w.up = newSessionTable(rp, sc.MaxSessions, sc.SessionIdle, cfg.MaxDatagram)
	} else {
		if up == nil {
			lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer}
			ups, err := udpio.ListenGroup("udp", ":0", 1, lc)
			if err != nil {
				w.in.Close()
				return nil, fmt.Errorf("upstream socket: %w", err)
			}
			up = ups[0]
		}
		if w.up, err = newSharedUpstream(rp, up, cfg.BatchSize, cfg.MaxDatagram); err != nil {
			w.in.Close()
			return nil, fmt.Errorf("upstream socket: %w", err)
		}
	}
	if err := p.earlyDrop(w, s); err != nil {
		w.close()
		return nil, err
	}
	if cfg.Wait == WaitThread {
		w.thread() // false off Linux: the worker stays on the netpoller
	}
	return w, nil
}

// earlyDrop attaches the worker's socket filter (Service.EarlyDrop), or
// removes one a previous process left on its socket.
func (p *Pipeline) earlyDrop(w *worker, s *service) error {
	if !s.cfg.EarlyDrop {
		if err := udpio.AttachFilter(w.in, nil); err != nil {
			p.log.Warn("removing a socket filter a previous process may have left", "service", s.cfg.Name, "err", err)
		}
		return nil
	}
	e, err := newEarlyDrop(w.in, s.router)
	if err == nil {
		err = e.sync()
	}
	if err != nil {
		return configErr(err)
	}
	w.early = e
	return nil
}

// earlyDropEvery is how often the watcher brings idle workers' socket
// filters in step with the registry.
const earlyDropEvery = 100 * time.Millisecond

// watchEarlyDrop keeps every worker's socket filter in step with its
// registry until stop is closed, and logs a failure once per change.
func (p *Pipeline) watchEarlyDrop(stop <-chan struct{}) {
	t := time.NewTicker(earlyDropEvery)
	defer t.Stop()
	var last string
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		var errs []error
		p.mu.Lock()
		for _, s := range p.services {
			for _, w := range s.workers {
				if w.early != nil {
					errs = append(errs, w.early.sync())
				}
			}
		}
		p.mu.Unlock()
		msg := ""
		if err := errors.Join(errs...); err != nil {
			if msg = err.Error(); msg != last {
				p.log.Error("early drop: the socket filter could not follow the registry and was removed", "err", err)
			}
		}
		last = msg
	}
}

// configErr makes a configuration error of a lower layer wrap ErrConfig.
func configErr(err error) error {
	if errors.Is(err, udpio.ErrConfig) && !errors.Is(err, ErrConfig) {
		return fmt.Errorf("%w: %w", err, ErrConfig)
	}
	return err
}

func closeAll(cs []*net.UDPConn) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

// refreshOwn publishes the process's own addresses: every bound socket,
// and the host's current addresses for the wildcard-bound ones.
func (p *Pipeline) refreshOwn() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshOwnLocked()
}

func (p *Pipeline) refreshOwnLocked() {
	host, err := LocalAddrs()
	if err != nil {
		p.log.Warn("listing the host's addresses", "err", err)
		if cur := p.own.Load(); cur != nil {
			return // keep the last good set
		}
	}
	nets, err := LocalNets()
	if err != nil {
		p.log.Warn("listing the host's local routes", "err", err)
		if cur := p.own.Load(); cur != nil {
			nets = cur.nets // keep the last good routes
		}
	}
	p.own.Store(NewOwnAddrs(p.bound, host, nets...))
}

// checkBackends applies CheckBackends to svcs, with the ports the kernel
// picked and every socket the pipeline bound.
func (p *Pipeline) checkBackends(svcs []*service) error {
	defs := make([]Service, len(svcs))
	for i, s := range svcs {
		defs[i] = s.cfg
		defs[i].PublicAddr = s.router.public
	}
	return CheckBackends(defs, p.own.Load(), func(i int) []registry.Backend {
		return svcs[i].router.backends.Snapshot().Backends()
	})
}

// CheckBackends refuses a backend that is a service's public address
// (PublicAddr, or Listen when that is zero) or one of own's addresses: the
// forward rule would drop every datagram to it (OwnAddress), so the
// configuration can only be wrong. backends(i) lists the backends of
// svcs[i]. New applies it once the sockets are bound; a configuration
// check that opens no socket (cidproxy -check) applies it to the listen
// addresses, own being NewOwnAddrs(listens, LocalAddrs()). The error
// wraps ErrConfig.
func CheckBackends(svcs []Service, own *OwnAddrs, backends func(i int) []registry.Backend) error {
	public := func(sc *Service) netip.AddrPort {
		if sc.PublicAddr.IsValid() {
			return addr.Unmap(sc.PublicAddr)
		}
		return addr.Unmap(sc.Listen)
	}
	for i := range svcs {
		for _, b := range backends(i) {
			a := addr.Unmap(b.Addr)
			if own.Contains(a) {
				return fmt.Errorf("service %s: backend %d at %v is one of the proxy's own addresses: %w", svcs[i].Name, b.Ordinal, a, ErrConfig)
			}
			for j := range svcs {
				if a == public(&svcs[j]) {
					return fmt.Errorf("service %s: backend %d at %v is the public address of service %s: %w", svcs[i].Name, b.Ordinal, a, svcs[j].Name, ErrConfig)
				}
			}
		}
	}
	return nil
}

func (p *Pipeline) service(name string) *service {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.services {
		if s.cfg.Name == name {
			return s
		}
	}
	return nil
}

// Addr returns the bound address of the named service; ok is false when
// there is no such service.
func (p *Pipeline) Addr(service string) (addr netip.AddrPort, ok bool) {
	if s := p.service(service); s != nil {
		return s.cfg.Listen, true
	}
	return netip.AddrPort{}, false
}

// UpstreamAddrs returns the local addresses of the named service's shared
// upstream sockets, the physical source of every datagram backends receive
// from this pipeline in PPv2 mode (none in transparent mode, where each
// session has its own); ok is false when there is no such service.
func (p *Pipeline) UpstreamAddrs(service string) (addrs []netip.AddrPort, ok bool) {
	s := p.service(service)
	if s == nil {
		return nil, false
	}
	for _, w := range s.workers {
		addrs = append(addrs, w.up.addrs()...)
	}
	return addrs, true
}

// Router returns the named service's rules; ok is false when there is no
// such service.
func (p *Pipeline) Router(service string) (r *Router, ok bool) {
	if s := p.service(service); s != nil {
		return s.router, true
	}
	return nil, false
}

// OwnAddrs returns the process's own addresses as the pipeline knows them
// now: every socket it bound, and for the wildcard-bound ones every
// address of the host, which it tracks while it runs.
func (p *Pipeline) OwnAddrs() *OwnAddrs { return p.own.Load() }

// Sockets returns the named service's sockets, for handing them to a
// successor process (their SyscallConn gives the descriptors to pass; see
// Service.Conns): the service sockets in worker order and, in PPv2 mode,
// each worker's upstream socket. They stay the Pipeline's. ok is false
// when there is no such service.
func (p *Pipeline) Sockets(service string) (listen, upstream []syscall.Conn, ok bool) {
	s := p.service(service)
	if s == nil {
		return nil, nil, false
	}
	for _, w := range s.workers {
		listen = append(listen, w.in)
		if u, ok := w.up.(*sharedUpstream); ok {
			upstream = append(upstream, u.io)
		}
	}
	return listen, upstream, true
}

// SetLimits replaces the named service's admission limits while it runs.
// Each worker picks its new buckets, which start full, at its next batch;
// the datagrams pay nothing for it.
func (p *Pipeline) SetLimits(service string, l Limits) error {
	if err := l.validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.services {
		if s.cfg.Name == service {
			s.cfg.Limits = l
			for _, w := range s.workers {
				w.adm.Store(NewAdmission(l, len(s.workers)))
			}
			return nil
		}
	}
	return fmt.Errorf("service %q: no such service: %w", service, ErrConfig)
}

// Stats returns every service's counters, summed over its workers. The
// kernel's drops and queues take one getsockopt per socket.
func (p *Pipeline) Stats() []ServiceStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ServiceStats, len(p.services))
	for i, s := range p.services {
		out[i].Name = s.cfg.Name
		if s.cfg.Transparent {
			out[i].MaxSessions = s.cfg.MaxSessions * len(s.workers)
		}
		for _, w := range s.workers {
			w.fwd.load(&out[i].Forward)
			w.rp.rev.load(&out[i].Reverse)
			out[i].Sessions += w.up.sessions()
			out[i].SessionsEvicted += w.up.evicted()
			addQueue(&out[i].Forward, w.in)
			w.up.queue(&out[i].Reverse)
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
	var wg, started sync.WaitGroup
	initial := true // under mu: the loops Serving waits for
	run := func(loop func() error) {
		wg.Add(1)
		st := &started
		if initial {
			st.Add(1)
		} else {
			st = nil
		}
		go func() {
			defer wg.Done()
			if st != nil {
				st.Done()
			}
			if err := loop(); err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		}()
	}
	start := func(s *service) {
		p.raiseProcs()
		for _, w := range s.workers {
			for _, loop := range w.loops() {
				run(loop)
			}
		}
		p.log.Info("service started", "service", s.cfg.Name, "protocol", s.cfg.Protocol,
			"listen", s.cfg.Listen, "workers", len(s.workers), "cid_len", s.router.codec.Len())
	}
	p.mu.Lock()
	for _, s := range p.services {
		start(s)
	}
	p.start = start
	initial = false
	p.mu.Unlock()
	go func() {
		started.Wait()
		close(p.serving)
	}()
	watchStop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchHostAddrs(watchStop, p.refreshOwn)
	}()
	filtered := make(chan struct{})
	go func() {
		defer close(filtered)
		p.watchEarlyDrop(watchStop)
	}()
	var err error
	select {
	case <-ctx.Done():
	case <-p.stop:
	case err = <-errc:
		p.log.Error("pipeline stopped by a socket error", "err", err)
	}
	p.mu.Lock()
	p.start, p.ended = nil, true
	svcs := slices.Clone(p.services)
	drain := p.drain
	p.mu.Unlock()
	if drain != nil && err == nil {
		p.drainOut(svcs, drain)
	}
	// Wake every reader without closing its socket: in-flight batches are
	// still sent, then the loops return and the sockets close.
	for _, s := range svcs {
		for _, w := range s.workers {
			w.wake()
		}
	}
	wg.Wait()
	close(watchStop)
	<-watched
	<-filtered
	p.closeSockets() // after the forward loops: nothing opens a session now
	p.err = err
	p.log.Info("pipeline stopped")
	return err
}

// Serving is closed once Run runs every worker's goroutines, about to
// read: a successor in a restart handover waits for it before it tells
// its predecessor to stop reading the sockets they share.
func (p *Pipeline) Serving() <-chan struct{} { return p.serving }

// MaxDatagramFor is the largest Config.MaxDatagram a service listening on
// listen may have: with the PPv2 header, a UDP datagram (MaxDatagram4
// for IPv4, MaxDatagram6 for IPv6 or dual-stack, whose header is the
// larger); a transparent service sends datagrams unchanged.
func MaxDatagramFor(listen netip.AddrPort, transparent bool) int {
	switch {
	case transparent:
		return maxUDP6
	case listen.Addr().Is4():
		return MaxDatagram4
	}
	return MaxDatagram6
}

// checkDatagram refuses a MaxDatagram above MaxDatagramFor a service.
func checkDatagram(svcs []Service, maxDatagram int) error {
	for _, sc := range svcs {
		if limit := MaxDatagramFor(sc.Listen, sc.Transparent); maxDatagram > limit {
			return fmt.Errorf("service %s: max datagram %d and the PROXY header exceed a UDP datagram (at most %d here): %w", sc.Name, maxDatagram, limit, ErrConfig)
		}
	}
	return nil
}

// checkWorkers refuses services whose workers, together, exceed max.
func checkWorkers(svcs []Service, limit int) error {
	n := 0
	for _, sc := range svcs {
		n += max(sc.Workers, len(sc.Conns))
	}
	if n > limit {
		return fmt.Errorf("%d workers in all services, more than the %d allowed (Config.MaxWorkers): %w", n, limit, ErrConfig)
	}
	return nil
}

// raiseProcs gives every thread that WaitThread holds, this Pipeline's and
// any other's in the process, a P of its own, and one for the rest of the
// process (see WaitThread). It never lowers GOMAXPROCS.
func (p *Pipeline) raiseProcs() {
	procsMu.Lock()
	defer procsMu.Unlock()
	held := int(threads.Load())
	if cur := runtime.GOMAXPROCS(0); held > 0 && cur <= held {
		runtime.GOMAXPROCS(held + 1)
		p.log.Info("GOMAXPROCS raised for the workers' threads", "from", cur, "to", held+1)
	}
}

var procsMu sync.Mutex // one GOMAXPROCS change at a time

// startProcs is GOMAXPROCS as the process started, before raiseProcs
// raised it for WaitThread's threads: the default worker count. Taken
// from the raised value, each service a reload added doubled the workers
// (5 reloads on 2 CPUs: 5, 10, 20, 40, 80).
var startProcs = runtime.GOMAXPROCS(0)

// DefaultWorkers is the worker count of a Service whose Workers is 0:
// GOMAXPROCS as the process started (the CPUs its affinity and cgroup
// allow), never as WaitThread raised it.
func DefaultWorkers() int { return startProcs }

// Close stops a running pipeline and waits until Run has returned, or
// closes the sockets of one that never ran. It is idempotent and returns
// what Run returned.
func (p *Pipeline) Close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.runOnce.Do(func() { // Run never started, and now never will
		p.mu.Lock()
		p.ended = true
		p.mu.Unlock()
		p.closeSockets()
		close(p.done)
	})
	<-p.done
	return p.err
}

// Drain is the stop of a process whose successor has taken over its
// sockets (a restart handover, Service.Conns): the pipeline stops reading
// client datagrams and the PPv2 upstream sockets, which the successor now
// reads, and sends what it had read; transparent sessions, whose sockets
// only this process holds, go on relaying their backends' replies until
// ctx is done. Then it stops as Close does, and returns what Run
// returned. Without transparent services Drain does not wait for ctx.
func (p *Pipeline) Drain(ctx context.Context) error {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.drain = ctx
		p.mu.Unlock()
		close(p.stop)
	})
	return p.Close()
}

// drainOut ends the forward loops and the shared upstreams' loops and
// waits for ctx while transparent sessions relay.
func (p *Pipeline) drainOut(svcs []*service, ctx context.Context) {
	transparent := false
	for _, s := range svcs {
		transparent = transparent || s.cfg.Transparent
		for _, w := range s.workers {
			w.stopReading()
			if !s.cfg.Transparent {
				w.up.wake()
			}
		}
	}
	if transparent {
		<-ctx.Done()
	}
}

func (p *Pipeline) closeSockets() {
	p.mu.Lock()
	svcs := slices.Clone(p.services)
	p.mu.Unlock()
	for _, s := range svcs {
		s.close()
	}
}

// close ends the service's transparent sessions and closes its sockets.
func (s *service) close() {
	for _, w := range s.workers {
		w.close()
	}
}
