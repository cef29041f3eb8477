package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidkeys"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
)

// Options are what a program adds to a Config when it builds the
// services: the sources whose code the file cannot name, and settings that
// are flags rather than keys.
type Options struct {
	// Logger receives the registries', sources' and key files' logs, with
	// a "service" attribute. nil means slog.Default().
	Logger *slog.Logger
	// Source, when set, is asked first for each service's backend source
	// (the program's own Consul, etcd or DNS watcher). A nil Source
	// leaves the service to its backends, backends_file or kubernetes
	// key; a service with none of them must get one here.
	Source func(s Service, log *slog.Logger) (registry.Source, error)
	// Kubernetes makes the source of a service with a "kubernetes" key,
	// typically with module registry/kubernetes (kubernetes.New); nil
	// refuses such services with ErrNoKubernetes, so that the client-go
	// dependency stays out of programs that do not want it.
	Kubernetes func(k Kubernetes, log *slog.Logger) (registry.Source, error)
	// Join sets cidroute.Service.JoinExisting on every service: the new
	// process of a restart handover shares the sockets of the old one.
	Join bool
	// KeysPoll is how often a cid_keys_file is checked for changes (0
	// means 1 s).
	KeysPoll time.Duration
	// Context, when set, cancels the reads Build makes (the cid_keys_files,
	// each also bounded by cidkeys.ReadTimeout), so that a signal stops a
	// start-up stuck on a hung mount. nil means context.Background().
	Context context.Context
}

// Errors of Validate and Build, wrapped by an *Error at the service.
var (
	// ErrNoKubernetes: a service has a "kubernetes" key and Options no
	// Kubernetes hook.
	ErrNoKubernetes = errors.New(`proxyconfig: "kubernetes" backends need Options.Kubernetes`)
	// ErrNoSource: a service has no backends key and Options no Source.
	ErrNoSource = errors.New("proxyconfig: no backends: give backends, backends_file or kubernetes")
)

// StopWait bounds how long Registries.Run waits, once its context is
// done, for the sources to return: a read stuck in the kernel or a source
// that ignores its context must not hold up a shutdown.
const StopWait = time.Second

// Validate reports what Build would refuse for lack of a hook in o: a
// "kubernetes" service without Options.Kubernetes (ErrNoKubernetes), a
// service without backends key without Options.Source (ErrNoSource); and
// what a start would refuse: a static backend at a service's listen or
// public address, or at a wildcard listen's port on one of the host's
// addresses (cidroute.CheckBackends, as cidroute.New checks it). The
// errors are *Error, positioned in the file when c was read from one.
func (c *Config) Validate(o Options) error {
	for _, s := range c.Services {
		switch {
		case s.Kubernetes != nil && o.Kubernetes == nil:
			return c.serviceErr(s, "kubernetes", "this program has no Kubernetes source", `list the backends with "backends" or "backends_file"`, ErrNoKubernetes)
		case s.Kubernetes == nil && s.BackendsFile == "" && s.Backends == nil && o.Source == nil:
			return c.serviceErr(s, "", "no backends", `add "backends", "backends_file" or "kubernetes"`, ErrNoSource)
		}
	}
	return c.checkOwnBackends(func(i int) []registry.Backend { return c.Services[i].Backends },
		func(i, k int) *Error {
			return c.serviceErr(c.Services[i], fmt.Sprintf("backends[%d].address", k), "", "", nil)
		})
}

// checkOwnBackends applies cidroute.CheckBackends to the services, with
// their listen addresses as the proxy's own (its upstream sockets are not
// bound yet) and the host's current addresses for wildcard listens. The
// error is at(i, k), the position of service i's backend k, completed.
func (c *Config) checkOwnBackends(backends func(i int) []registry.Backend, at func(i, k int) *Error) error {
	svcs := make([]cidroute.Service, len(c.Services))
	listens := make([]netip.AddrPort, len(c.Services))
	for i, s := range c.Services {
		svcs[i] = cidroute.Service{Name: s.Name, Listen: s.Listen, RouterConfig: cidroute.RouterConfig{PublicAddr: s.Public}}
		listens[i] = s.Listen
	}
	host, _ := cidroute.LocalAddrs() // none: loopback still counts as the host's
	own := cidroute.NewOwnAddrs(listens, host)
	if cidroute.CheckBackends(svcs, own, backends) == nil {
		return nil
	}
	for i := range c.Services { // which backend: one at a time
		for k, b := range backends(i) {
			one := func(j int) []registry.Backend {
				if j == i {
					return []registry.Backend{b}
				}
				return nil
			}
			if err := cidroute.CheckBackends(svcs, own, one); err != nil {
				e := at(i, k)
				e.Problem = fmt.Sprintf("%v is an address of this proxy (a service's listen or public address, or a host address at a wildcard listen's port): datagrams sent there would loop", b.Addr)
				e.Fix = "write the backend's own address"
				e.Err = err
				return e
			}
		}
	}
	return cidroute.CheckBackends(svcs, own, backends) // not found one by one: cannot happen
}

// serviceErr makes the error of key in s (a path in the service:
// "cid_keys_file", "backends[2].address"; "" for the service itself),
// positioned when c (which may be nil) was read from a file that has s.
func (c *Config) serviceErr(s Service, key, problem, fix string, cause error) *Error {
	var e *Error
	if path, ok := c.servicePath(s.Name); ok {
		e = c.src.err(join(path, key), problem, fix)
	} else {
		e = &Error{Key: join(fmt.Sprintf("services[%q]", s.Name), key), Problem: problem, Fix: fix}
	}
	e.Err = cause
	return e
}

func (c *Config) servicePath(name string) (string, bool) {
	if c == nil || c.src == nil {
		return "", false
	}
	path, ok := c.src.services[name]
	return path, ok
}

// Registries are the registries of a Config's services, the sources that
// feed them and the CID key files their codecs read: what a Pipeline needs
// beside its sockets. Build them with Config.Build, hand Services to
// cidroute.New, and Run them beside the Pipeline.
type Registries struct {
	log  *slog.Logger
	seed uint64 // hrw_seed, for services added later

	// mu guards the services, which Apply and AddService change while
	// Run runs, and Run's context.
	mu       sync.Mutex
	services []*service
	defs     []cidroute.Service
	ctx      context.Context // Run's, while it runs; nil before and after
	wg       sync.WaitGroup  // every goroutine Run started
	ran      sync.Once
	closed   sync.Once
}

type service struct {
	name    string
	reg     *registry.Registry
	updater *loggingUpdater // reg, logging changes
	source  registry.Source
	file    *registry.File  // nil unless backends_file
	keys    *cidkeys.File   // nil without encrypted CIDs
	checker *health.Checker // nil without health_check

	// While Run runs: how to stop the source and the checker (Apply
	// replaces them), and when they have returned.
	srcStop, hcStop, keysStop context.CancelFunc
	srcDone, hcDone           chan struct{}
}

// Build makes a registry for each service, the source that feeds it, and
// the service's definition for cidroute.New. A static list is published
// before Build returns, so that no datagram meets an empty registry;
// every other source starts with Run. An encrypted service's key file is
// read here (a missing or unreadable file fails Build). Close releases
// what Build made if the Registries are never run.
func (c *Config) Build(o Options) (*Registries, error) {
	if err := c.Validate(o); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	r := &Registries{log: log, seed: c.Seed}
	for _, sc := range c.Services {
		s, def, err := r.build(c, sc, o, log.With("service", sc.Name))
		if err != nil {
			r.Close()
			if _, ok := err.(*Error); ok { // names the service already
				return nil, err
			}
			return nil, fmt.Errorf("service %q: %w", sc.Name, err)
		}
		r.services = append(r.services, s)
		r.defs = append(r.defs, def)
	}
	return r, nil
}

// build makes what Build makes for sc, a service of c, which may be nil
// (AddService): it positions the errors in c's file.
func (r *Registries) build(c *Config, sc Service, o Options, log *slog.Logger) (_ *service, _ cidroute.Service, err error) {
	reg, err := registry.New(registry.Config{Service: sc.Name, Seed: r.seed, MaxAge: sc.MaxAge, SlowStart: sc.SlowStart, Logger: log})
	if err != nil {
		return nil, cidroute.Service{}, err
	}
	defer func() {
		if err != nil {
			reg.Close()
		}
	}()
	s := &service{name: sc.Name, reg: reg, updater: &loggingUpdater{Registry: reg, log: log}}
	var static bool
	if s.source, s.file, static, err = newSource(sc, o, log); err != nil {
		return nil, cidroute.Service{}, err
	}
	if static {
		if err := s.updater.Update(sc.Backends); err != nil {
			return nil, cidroute.Service{}, err
		}
	}
	if s.checker, err = newChecker(reg, sc, o); err != nil {
		return nil, cidroute.Service{}, err
	}
	var codec cidroute.CIDCodec
	if e := sc.CIDEncryption; e != nil {
		ctx := o.Context
		if ctx == nil {
			ctx = context.Background()
		}
		f, err := c.openKeys(ctx, sc)
		if err != nil {
			return nil, cidroute.Service{}, err
		}
		f.Interval, f.Logger = o.KeysPoll, log
		log.Info("CID keys loaded", "cid_keys_file", e.KeysFile, "codec", f.Codec().String())
		s.keys, codec = f, f.Codec()
	}
	return s, cidroute.Service{
		Name:   sc.Name,
		Listen: sc.Listen,
		RouterConfig: cidroute.RouterConfig{
			Protocol:    sc.Protocol,
			PublicAddr:  sc.Public,
			CIDLen:      sc.CIDLen,
			Codec:       codec,
			Backends:    reg,
			Transparent: sc.Transparent,
			Unroutable:  sc.Unroutable,

			RequireDTLS13CID: sc.RequireDTLS13CID,
		},
		Limits:         sc.Limits,
		Workers:        sc.Workers,
		RecvBuffer:     sc.RecvBuffer,
		SendBuffer:     sc.SendBuffer,
		EarlyDrop:      sc.EarlyDrop,
		MaxSessions:    sc.MaxSessions,
		SessionIdle:    sc.SessionIdle,
		SessionMemory:  sc.SessionMemory,
		OriginalSource: sc.OriginalSource,
		JoinExisting:   o.Join,
	}, nil
}

// newSource makes the backend source of sc: the program's (o.Source),
// Kubernetes, a backends_file (returned as file too, for Reload) or the
// static list (static true: publish it at once).
func newSource(sc Service, o Options, log *slog.Logger) (src registry.Source, file *registry.File, static bool, err error) {
	if o.Source != nil {
		if src, err = o.Source(sc, log); err != nil || src != nil {
			return src, nil, false, err
		}
	}
	switch {
	case sc.Kubernetes != nil:
		src, err = o.Kubernetes(*sc.Kubernetes, log)
		return src, nil, false, err
	case sc.BackendsFile != "":
		file = &registry.File{Path: sc.BackendsFile, Logger: log}
		return file, file, false, nil
	case sc.Backends != nil:
		return registry.Static(sc.Backends), nil, true, nil
	}
	return nil, nil, false, ErrNoSource
}

// newChecker makes the health checker of sc over reg, or nil without
// health_check.
func newChecker(reg *registry.Registry, sc Service, o Options) (*health.Checker, error) {
	if sc.Health == nil {
		return nil, nil
	}
	hc := *sc.Health
	hc.Logger = o.Logger
	if hc.Logger == nil {
		hc.Logger = slog.Default()
	}
	c, err := health.New(reg, hc) // the checker names the service
	if err != nil {
		return nil, fmt.Errorf("health_check: %w", err)
	}
	return c, nil
}

// Services returns the services' definitions for cidroute.Config, in the
// file's order, each routing over its registry. The slice is the caller's.
func (r *Registries) Services() []cidroute.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.defs)
}

// Registry returns the named service's registry.
func (r *Registries) Registry(service string) (reg *registry.Registry, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.services {
		if s.name == service {
			return s.reg, true
		}
	}
	return nil, false
}

// Checker returns the named service's health checker; ok is false for a
// service without health_check.
func (r *Registries) Checker(service string) (c *health.Checker, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.services {
		if s.name == service && s.checker != nil {
			return s.checker, true
		}
	}
	return nil, false
}

// Run runs every source, key file and health checker until ctx is done, then waits for
// them to return, at most StopWait. A source that fails is logged; its
// registry keeps the last backends. Run runs at most once.
func (r *Registries) Run(ctx context.Context) {
	r.ran.Do(func() {
		r.mu.Lock()
		r.ctx = ctx
		for _, s := range r.services {
			r.startLocked(s)
		}
		r.mu.Unlock()
	})
	<-ctx.Done()
	r.mu.Lock()
	r.ctx = nil // Apply and AddService start nothing more
	r.mu.Unlock()
	stopped := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(StopWait):
		r.log.Error("a backend source did not stop in time; stopping without it", "wait", StopWait)
	}
}

// startLocked starts what s runs, if Run runs. The caller holds mu.
func (r *Registries) startLocked(s *service) {
	if r.ctx == nil {
		return
	}
	if s.keys != nil && s.keysStop == nil {
		var ctx context.Context
		ctx, s.keysStop = context.WithCancel(r.ctx)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			s.keys.Run(ctx)
		}()
	}
	r.startCheckerLocked(s)
	r.startSourceLocked(s)
}

func (r *Registries) startSourceLocked(s *service) {
	if r.ctx == nil || s.source == nil {
		return
	}
	ctx, stop := context.WithCancel(r.ctx)
	done := make(chan struct{})
	s.srcStop, s.srcDone = stop, done
	src := s.source
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		if err := src.Run(ctx, s.updater); err != nil && !errors.Is(err, context.Canceled) {
			s.updater.log.Error("backend source stopped; routing goes on with the last backends", "err", err)
		}
	}()
}

func (r *Registries) startCheckerLocked(s *service) {
	if r.ctx == nil || s.checker == nil {
		return
	}
	ctx, stop := context.WithCancel(r.ctx)
	done := make(chan struct{})
	s.hcStop, s.hcDone = stop, done
	c := s.checker
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		c.Run(ctx)
	}()
}

// stopWait cancels a goroutine Run started and waits for it, at most
// StopWait (a source stuck in a read is left behind, as at shutdown).
func (r *Registries) stopWait(stop context.CancelFunc, done chan struct{}, what string, log *slog.Logger) {
	if stop == nil {
		return
	}
	stop()
	select {
	case <-done:
	case <-time.After(StopWait):
		log.Error(what+" did not stop in time; going on without it", "wait", StopWait)
	}
}

// Reload asks every backends_file source and every CID key file to read
// its file now (wire it to SIGHUP). It does not wait.
func (r *Registries) Reload() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.services {
		if s.file != nil {
			s.file.Reload()
		}
		if s.keys != nil {
			s.keys.Reload()
		}
	}
}

// Close stops the registries' timers. Call it after Run has returned (or
// instead of Run). It is idempotent.
func (r *Registries) Close() {
	r.closed.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, s := range r.services {
			s.reg.Close()
		}
	})
}

// loggingUpdater logs each change of a service's backends. Sources log
// their own failures; confirmations and unchanged updates are silent.
// Embedding keeps Registry's MaxAge, which Static uses to pace Confirm,
// and Reject, which File uses to count undecodable files.
type loggingUpdater struct {
	*registry.Registry
	log    *slog.Logger
	mu     sync.Mutex // one Update at a time, so that prev is the one before
	logged bool
}

func (u *loggingUpdater) Update(bs []registry.Backend) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	prev := u.Snapshot()
	if err := u.Registry.Update(bs); err != nil {
		return err
	}
	// Compared with the snapshot just before, not the last one logged: a
	// health checker publishes too (a backend marked down is listed as
	// draining), and its changes are its own to log.
	s := u.Snapshot()
	if u.logged && slices.Equal(prev.Backends(), s.Backends()) { // a source repeating itself
		return nil
	}
	u.logged = true
	u.log.Info("backends changed", "version", s.Version(),
		"ready", s.Count(registry.Ready), "draining", s.Count(registry.Draining), "gone", s.Count(registry.Gone),
		"backends", backendList(s.Backends()))
	return nil
}

// backendList formats backends compactly for a log line:
// "0=10.0.0.10:5684 ready w1, 1=...".
func backendList(bs []registry.Backend) string {
	var b strings.Builder
	for i, be := range bs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d=%v %v w%d", be.Ordinal, be.Addr, be.State, be.Weight)
	}
	return b.String()
}
