package proxyapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/examples/internal/cidkeys"
	"github.com/cidroute/cidroute/health"
	"github.com/cidroute/cidroute/registry"
)

// A proxy is one replica: a Pipeline, each service's registry, and the
// sources that feed the registries. The sources run on their own, so a
// slow or failing source never stalls the packet path, and the pipeline
// keeps routing on the last snapshot.
type proxy struct {
	log      *slog.Logger
	pipe     *cidroute.Pipeline
	services []*proxyService
	accel    Accelerator // the XDP fast path, or nil (xdp.go)

	stopSources context.CancelFunc
	sources     sync.WaitGroup
	stopping    atomic.Bool // set by close: /readyz and /livez fail (health.go)
}

type proxyService struct {
	cfg     serviceConfig
	reg     *registry.Registry
	updater *loggingUpdater // reg, logging changes
	source  registry.Source
	file    *registry.File  // nil for a static list
	keys    *cidkeys.File   // nil without encrypted CIDs (cidkeys.go)
	checker *health.Checker // nil without health_check (health.go)
}

// newProxy builds the registries and the pipeline (which opens every
// socket, so a busy port fails here) and starts the sources. A static list
// is published before the pipeline exists, so no datagram meets an empty
// registry.
func newProxy(cfg *config, log *slog.Logger, opts Options) (*proxy, error) {
	p := &proxy{log: log}
	ctx, cancel := context.WithCancel(context.Background())
	p.stopSources = cancel
	var pc cidroute.Config
	pc.Logger = log
	for _, sc := range cfg.Services {
		reg, err := registry.New(registry.Config{Service: sc.Name, Seed: cfg.Seed, MaxAge: sc.MaxAge, Logger: log})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("service %q: %w", sc.Name, err)
		}
		ps := &proxyService{cfg: sc, reg: reg}
		ps.updater = &loggingUpdater{Registry: reg, log: log.With("service", sc.Name)}
		p.services = append(p.services, ps)
		switch {
		case sc.Kubernetes != nil:
			if opts.Kubernetes == nil {
				p.close()
				return nil, fmt.Errorf("service %q: %w", sc.Name, errNoKubernetes)
			}
			if ps.source, err = opts.Kubernetes(*sc.Kubernetes, log.With("service", sc.Name)); err != nil {
				p.close()
				return nil, fmt.Errorf("service %q: %w", sc.Name, err)
			}
		case sc.BackendsFile != "":
			ps.file = &registry.File{Path: sc.BackendsFile, Logger: log.With("service", sc.Name)}
			ps.source = ps.file
		default:
			if err := ps.updater.Update(sc.Backends); err != nil {
				p.close()
				return nil, fmt.Errorf("service %q: %w", sc.Name, err)
			}
			ps.source = registry.Static(sc.Backends)
		}
		codec, err := ps.cidCodec(log.With("service", sc.Name))
		if err != nil {
			p.close()
			return nil, fmt.Errorf("service %q: %w", sc.Name, err)
		}
		pc.Services = append(pc.Services, cidroute.Service{
			Name:   sc.Name,
			Listen: sc.Listen,
			RouterConfig: cidroute.RouterConfig{
				Protocol:    sc.Protocol,
				PublicAddr:  sc.Public,
				CIDLen:      sc.CIDLen,
				Codec:       codec,
				Backends:    reg,
				Transparent: sc.Transparent,
				Unroutable:  unroutable(sc.UnroutableHash),
			},
			Limits:       sc.Limits,
			Workers:      sc.Workers,
			MaxSessions:  sc.MaxSessions,
			SessionIdle:  sc.SessionIdle,
			JoinExisting: cfg.Join,
		})
	}
	pipe, err := cidroute.New(pc)
	if err != nil {
		p.close()
		return nil, err
	}
	p.pipe = pipe
	if err := p.startXDP(cfg, pc, opts, log); err != nil {
		p.close()
		return nil, err
	}
	p.runXDP(ctx)
	for _, ps := range p.services {
		if ps.keys != nil {
			p.sources.Go(func() { ps.keys.Run(ctx) })
		}
		if err := p.startHealth(ctx, ps, log); err != nil { // the checker names the service
			p.close()
			return nil, fmt.Errorf("service %q: health_check: %w", ps.cfg.Name, err)
		}
		u := ps.updater
		p.sources.Go(func() {
			if err := ps.source.Run(ctx, u); err != nil && !errors.Is(err, context.Canceled) {
				u.log.Error("backend source stopped; routing goes on with the last backends", "err", err)
			}
		})
	}
	return p, nil
}

// run serves until ctx is done, then stops the sources.
func (p *proxy) run(ctx context.Context) error {
	err := p.pipe.Run(ctx)
	p.close()
	return err
}

// sourceStopWait bounds how long close waits for the sources, so that a
// signal stops the process within 2 s whatever they do (a read stuck in
// the kernel, a source that ignores its context).
const sourceStopWait = time.Second

// close stops the sources and the registries' timers, and the pipeline if
// it never ran. It is idempotent.
func (p *proxy) close() {
	p.stopping.Store(true)
	p.closeXDP()
	if p.pipe != nil {
		p.pipe.Close()
	}
	p.stopSources()
	stopped := make(chan struct{})
	go func() {
		p.sources.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(sourceStopWait):
		p.log.Error("a backend source did not stop within 1s; stopping without it", "wait", sourceStopWait)
	}
	for _, ps := range p.services {
		ps.reg.Close()
	}
}

// reload asks every file source, and every CID key file, to read its file
// now (SIGHUP).
func (p *proxy) reload() {
	for _, ps := range p.services {
		if ps.file != nil {
			ps.file.Reload()
		}
		if ps.keys != nil {
			ps.keys.Reload()
		}
	}
}

// loggingUpdater logs each change of a service's backends. Sources log
// their own failures; confirmations and unchanged updates are silent.
// Embedding keeps Registry's MaxAge, which Static uses to pace Confirm.
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

// unroutable is the service's "unroutable" key as the router's policy.
func unroutable(hash bool) cidroute.UnroutablePolicy {
	if hash {
		return cidroute.UnroutableHash
	}
	return cidroute.UnroutableDrop
}
