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
	// Classifier, Backends, Encoder, Unroutable, Transparent and
	// PublicAddr (zero means Listen). The public address is in the HRW
	// key of new DTLS sessions, so all replicas must be configured with
	// the same one: behind a load balancer, the VIP. When it is a
	// wildcard, the PPv2 destination is the address each datagram was
	// sent to, and replies leave from it.
	RouterConfig
	// Limits are the admission limits (all off by default).
	Limits Limits
	// Workers is the number of SO_REUSEPORT sockets, each served by one
	// forward and one reverse goroutine. 0 means GOMAXPROCS.
	Workers int
	// RecvBuffer and SendBuffer request socket buffer sizes in bytes (0
	// keeps the kernel default).
	RecvBuffer, SendBuffer int
	// JoinExisting joins the SO_REUSEPORT group another process holds on
	// Listen (the new process of a restart handover) instead of failing
	// with udpio.ErrInUse; see udpio.ListenConfig.
	JoinExisting bool
	// Conns, when set, are the service's sockets, opened by the caller
	// (inherited from systemd or a parent process, or bound with options
	// of its own): the Pipeline serves them instead of binding Listen, one
	// worker each, and owns them from New on: it closes them when it stops,
	// and when New fails. They must all be bound to one address, which is
	// Listen (a zero Listen takes it from them); Workers must be 0 or
	// len(Conns), and RecvBuffer, SendBuffer and JoinExisting, which apply
	// to sockets the Pipeline binds, must be zero. When both Listen and
	// the public address are wildcards, each socket needs packet info
	// enabled (IP_PKTINFO or IPV6_RECVPKTINFO, as udpio.ListenConfig's
	// PacketInfo sets), so that replies leave from the address clients
	// sent to.
	Conns []*net.UDPConn

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
	// Wait is how workers wait for datagrams (WaitNetpoller by default).
	Wait WaitMode
}

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
	log      *slog.Logger
	services []*service
	own      atomic.Pointer[OwnAddrs]
	bound    []netip.AddrPort // every socket bound to receive: services and upstreams

	stop     chan struct{}
	stopOnce sync.Once
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
func New(cfg Config) (p *Pipeline, err error) {
	defer func() {
		if err != nil { // the caller's sockets are the Pipeline's from here on
			for _, sc := range cfg.Services {
				closeAll(sc.Conns)
			}
		}
	}()
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
	if cfg.Wait > WaitBlocking {
		return nil, fmt.Errorf("wait mode %d: %w", cfg.Wait, ErrConfig)
	}
	p = &Pipeline{log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	svcs := slices.Clone(cfg.Services)
	names := map[string]bool{}
	for i := range svcs {
		sc := &svcs[i]
		if sc.Name == "" || names[sc.Name] {
			return nil, fmt.Errorf("service name %q empty or repeated: %w", sc.Name, ErrConfig)
		}
		names[sc.Name] = true
		if err := sc.validate(); err != nil {
			return nil, fmt.Errorf("service %s: %w", sc.Name, err)
		}
	}
	if err := sizeSessions(svcs); err != nil {
		return nil, err
	}
	for _, sc := range svcs {
		s, err := p.openService(sc, cfg)
		if err != nil {
			p.closeSockets()
			return nil, fmt.Errorf("service %s: %w", sc.Name, err)
		}
		p.services = append(p.services, s)
	}
	p.refreshOwn()
	if err := p.checkBackends(); err != nil {
		p.closeSockets()
		return nil, err
	}
	return p, nil
}

// validate checks sc and fills in its defaults (Workers; Listen from
// Conns). The listen address is unmapped then: every check and the bind
// see ::ffff:a.b.c.d as a.b.c.d, as the own-address set and the routers
// do.
func (sc *Service) validate() error {
	if err := sc.Limits.validate(); err != nil {
		return err
	}
	if err := sc.validateConns(); err != nil {
		return err
	}
	sc.Listen = addr.Unmap(sc.Listen)
	if sc.Workers == 0 {
		sc.Workers = runtime.GOMAXPROCS(0)
	}
	switch {
	case sc.Workers < 1 || sc.Workers > 256:
		return fmt.Errorf("workers %d: %w", sc.Workers, ErrConfig)
	case sc.RecvBuffer < 0 || sc.SendBuffer < 0:
		return fmt.Errorf("buffer sizes %d/%d: %w", sc.RecvBuffer, sc.SendBuffer, ErrConfig)
	case sc.MaxSessions < 0 || sc.SessionIdle < 0 || (!sc.Transparent && (sc.MaxSessions != 0 || sc.SessionIdle != 0)):
		return fmt.Errorf("max sessions %d, session idle %v (transparent mode only): %w", sc.MaxSessions, sc.SessionIdle, ErrConfig)
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

// validateConns checks the caller's sockets, if any, and takes Workers and
// Listen from them.
func (sc *Service) validateConns() error {
	if len(sc.Conns) == 0 {
		return nil
	}
	if sc.RecvBuffer != 0 || sc.SendBuffer != 0 || sc.JoinExisting {
		return fmt.Errorf("buffer sizes and joining apply to sockets the pipeline binds, not to Conns: %w", ErrConfig)
	}
	if sc.Workers != 0 && sc.Workers != len(sc.Conns) {
		return fmt.Errorf("workers %d for %d sockets: want 0 or %d: %w", sc.Workers, len(sc.Conns), len(sc.Conns), ErrConfig)
	}
	sc.Workers = len(sc.Conns)
	var at netip.AddrPort
	for i, c := range sc.Conns {
		if c == nil {
			return fmt.Errorf("socket %d is nil: %w", i, ErrConfig)
		}
		a, ok := c.LocalAddr().(*net.UDPAddr)
		if !ok {
			return fmt.Errorf("socket %d is not bound: %w", i, ErrConfig)
		}
		ap := a.AddrPort()
		switch {
		case i == 0:
			at = ap
		case ap != at:
			return fmt.Errorf("socket %d is bound to %v, socket 0 to %v: %w", i, ap, at, ErrConfig)
		}
	}
	if !sc.Listen.IsValid() {
		sc.Listen = at
	} else if sc.Listen != at {
		return fmt.Errorf("listen address %v, but the sockets are bound to %v: %w", sc.Listen, at, ErrConfig)
	}
	return nil
}

// sizeSessions gives each transparent service without MaxSessions its
// share of the descriptors RLIMIT_NOFILE leaves, and refuses tables that
// cannot fit it (see Service.MaxSessions).
func sizeSessions(svcs []Service) error {
	limit, ok := fdLimit()
	return sizeSessionsFor(svcs, limit, ok)
}

// sizeSessionsFor is sizeSessions for a limit of limit descriptors (ok
// false: no limit).
func sizeSessionsFor(svcs []Service, limit uint64, ok bool) error {
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
	for i := range svcs {
		sc := &svcs[i]
		switch {
		case !sc.Transparent:
		case !ok && sc.MaxSessions == 0:
			sc.MaxSessions = DefaultMaxSessions
		case sc.MaxSessions == 0:
			sc.MaxSessions = int(min(budget/uint64(workers), DefaultMaxSessions))
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

func (p *Pipeline) openService(sc Service, cfg Config) (*service, error) {
	rc := sc.RouterConfig
	rc.PublicAddr = addr.Unmap(rc.PublicAddr) // as NewRouter sees it
	if !rc.PublicAddr.IsValid() {
		rc.PublicAddr = sc.Listen
	}
	if _, err := NewRouter(rc); err != nil {
		return nil, err
	}
	measured := rc.PublicAddr.Addr().IsUnspecified()
	lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer,
		PacketInfo: measured && sc.Listen.Addr().IsUnspecified()}
	// A later instance may take the sockets over (udpio.ListenConfig).
	lc.Joinable, lc.JoinExisting = true, sc.JoinExisting
	group := sc.Conns
	if len(group) == 0 {
		network := "udp4"
		if sc.Listen.Addr().Is6() {
			network = "udp6"
		}
		var err error
		if group, err = udpio.ListenGroup(network, sc.Listen.String(), sc.Workers, lc); err != nil {
			return nil, configErr(err)
		}
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
	var err error
	if s.router, err = NewRouter(rc); err != nil {
		closeAll(group)
		return nil, err
	}
	s.lenLog.log, s.lenLog.want = p.log.With("service", sc.Name), s.router.cidLen
	p.bound = append(p.bound, s.cfg.Listen)
	for _, in := range group {
		w, err := p.newWorker(s, in, cfg)
		if err == nil && lc.PacketInfo && !w.in.PacketInfo() {
			err = fmt.Errorf("socket bound to %v without packet info, which a wildcard public address needs: %w", s.cfg.Listen, ErrConfig)
			w.up.close()
		}
		if err != nil {
			closeAll(group)
			s.close()
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

// newWorker builds the worker of socket in and its upstream.
func (p *Pipeline) newWorker(s *service, in *net.UDPConn, cfg Config) (*worker, error) {
	sc := s.cfg
	w, err := newWorker(in, s.router, &p.own, NewAdmission(sc.Limits, sc.Workers), cfg.BatchSize, cfg.MaxDatagram)
	if err != nil {
		return nil, err
	}
	if cfg.Wait == WaitBlocking {
		w.blocking = w.in.SetBlocking() == nil // else the netpoller (not Linux)
	}
	rp := &replies{router: s.router, own: &p.own, out: w.in}
	w.rp, w.lenLog = rp, &s.lenLog
	if sc.Transparent {
		w.up = newSessionTable(rp, sc.MaxSessions, sc.SessionIdle, cfg.MaxDatagram)
		return w, nil
	}
	lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer}
	if w.up, err = newSharedUpstream(rp, lc, cfg.BatchSize, cfg.MaxDatagram, w.blocking); err != nil {
		return nil, fmt.Errorf("upstream socket: %w", err)
	}
	return w, nil
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
	host, err := LocalAddrs()
	if err != nil {
		p.log.Warn("listing the host's addresses", "err", err)
		if cur := p.own.Load(); cur != nil {
			return // keep the last good set
		}
	}
	p.own.Store(NewOwnAddrs(p.bound, host))
}

// checkBackends applies CheckBackends to the pipeline's services, with
// the ports the kernel picked and every socket it bound.
func (p *Pipeline) checkBackends() error {
	svcs := make([]Service, len(p.services))
	for i, s := range p.services {
		svcs[i] = s.cfg
		svcs[i].PublicAddr = s.router.public
	}
	return CheckBackends(svcs, p.own.Load(), func(i int) []registry.Backend {
		return p.services[i].router.backends.Snapshot().Backends()
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

// Stats returns every service's counters, summed over its workers. The
// kernel's drops take one getsockopt per socket.
func (p *Pipeline) Stats() []ServiceStats {
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
			out[i].Forward.KernelDrops += kernelDrops(w.in)
			out[i].Reverse.KernelDrops += w.up.kernelDrops()
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
	run := func(loop func() error) {
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
	p.raiseProcs()
	for _, s := range p.services {
		for _, w := range s.workers {
			run(w.forwardLoop)
			run(w.up.serve)
		}
		p.log.Info("service started", "service", s.cfg.Name, "protocol", s.cfg.Protocol,
			"listen", s.cfg.Listen, "workers", len(s.workers), "cid_len", s.router.codec.Len())
	}
	watchStop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		watchHostAddrs(watchStop, p.refreshOwn)
	}()
	var err error
	select {
	case <-ctx.Done():
	case <-p.stop:
	case err = <-errc:
		p.log.Error("pipeline stopped by a socket error", "err", err)
	}
	// Wake every reader without closing its socket: in-flight batches are
	// still sent, then the loops return and the sockets close.
	for _, s := range p.services {
		for _, w := range s.workers {
			w.wake()
		}
	}
	wg.Wait()
	close(watchStop)
	<-watched
	p.closeSockets() // after the forward loops: nothing opens a session now
	p.err = err
	p.log.Info("pipeline stopped")
	return err
}

// raiseProcs gives every thread that WaitBlocking locks a P of its own,
// and one for the rest of the process (see WaitBlocking).
func (p *Pipeline) raiseProcs() {
	locked := 0
	for _, s := range p.services {
		for _, w := range s.workers {
			locked += w.lockedThreads()
		}
	}
	if cur := runtime.GOMAXPROCS(0); locked > 0 && cur <= locked {
		runtime.GOMAXPROCS(locked + 1)
		p.log.Info("GOMAXPROCS raised for the blocking workers' threads", "from", cur, "to", locked+1)
	}
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

func (p *Pipeline) closeSockets() {
	for _, s := range p.services {
		s.close()
	}
}

// close ends the service's transparent sessions and closes its sockets.
func (s *service) close() {
	for _, w := range s.workers {
		w.close()
	}
}
