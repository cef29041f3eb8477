package proxyapp

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/proxyconfig"
)

// A proxy is one replica: a Pipeline and the registries of its services
// with their sources (proxyconfig.Registries). The sources run on their
// own, so a slow or failing source never stalls the packet path, and the
// pipeline keeps routing on the last snapshot.
type proxy struct {
	log   *slog.Logger
	opts  Options
	pipe  *cidroute.Pipeline
	regs  *proxyconfig.Registries
	accel Accelerator // the XDP fast path, or nil (xdp.go)

	namesMu sync.Mutex
	names   []string // the services, in the file's order, then those reloads added

	// cur is the configuration running (reload.go), changed by reloads
	// only, which run one at a time.
	cur     *proxyconfig.Config
	reloads [numReloadResults]atomic.Uint64

	runCtx      context.Context // the process's signal context: reads of key files stop with it
	sourcesCtx  context.Context // of the sources and the fast path, until close
	stopSources context.CancelFunc
	sources     sync.WaitGroup
	stopping    atomic.Bool // set by close: /readyz and /livez fail (health.go)
}

// cidKeysPoll is how often a key file is checked for changes (tests
// lengthen it to see SIGHUP alone reload it).
var cidKeysPoll = time.Second

// newProxy builds the registries and the pipeline (which opens every
// socket, so a busy port fails here, or serves those a predecessor handed
// over: opts.inherit) and starts the sources. The XDP fast path starts
// here too, except in a handover, where startAccel attaches it once the
// predecessor has detached its own.
func newProxy(run context.Context, cfg *proxyconfig.Config, log *slog.Logger, opts Options) (*proxy, error) {
	p := &proxy{log: log, opts: opts, cur: cfg, runCtx: run}
	ctx, cancel := context.WithCancel(context.Background())
	p.sourcesCtx, p.stopSources = ctx, cancel
	regs, err := cfg.Build(p.configOptions())
	if err != nil {
		cancel()
		opts.inherit.closeRest()
		return nil, err
	}
	p.regs = regs
	for _, s := range cfg.Services {
		p.names = append(p.names, s.Name)
	}
	defs := regs.Services()
	opts.inherit.adopt(defs, regs, log)
	pc := cidroute.Config{Services: defs, Logger: log, Wait: cfg.Wait, MaxDatagram: cfg.MaxDatagram}
	pipe, err := cidroute.New(pc)
	if err != nil {
		p.close()
		return nil, err
	}
	p.pipe = pipe
	p.sources.Add(1)
	go func() {
		defer p.sources.Done()
		regs.Run(ctx)
	}()
	if opts.inherit == nil {
		if err := p.startAccel(ctx); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// startAccel attaches and runs the XDP fast path of p.cur, if any.
func (p *proxy) startAccel(ctx context.Context) error {
	defs := p.regs.Services()
	if err := p.startXDP(p.cur, cidroute.Config{Services: defs, Logger: p.log}, p.opts, p.log); err != nil {
		return err
	}
	p.runXDP(ctx)
	return nil
}

func (p *proxy) sourcesContext() context.Context { return p.sourcesCtx }

// configOptions are the proxyconfig options of Build, Apply and
// AddService.
func (p *proxy) configOptions() proxyconfig.Options {
	return proxyconfig.Options{Logger: p.log, Kubernetes: p.opts.Kubernetes, Join: p.opts.join, KeysPoll: cidKeysPoll, Context: p.runCtx}
}

// serviceNames returns the services, in order.
func (p *proxy) serviceNames() []string {
	p.namesMu.Lock()
	defer p.namesMu.Unlock()
	return slices.Clone(p.names)
}

// logFinal writes each service's final counters, the identity of this
// process's life (a restart handover's test reads them).
func (p *proxy) logFinal() {
	for _, s := range p.pipe.Stats() {
		for _, d := range []struct {
			name string
			c    cidroute.Counters
		}{{"forward", s.Forward}, {"reverse", s.Reverse}} {
			p.log.Info("final counters", "service", s.Name, "direction", d.name, "received", d.c.Received,
				"forwarded", d.c.Forwarded, "dropped", d.c.DroppedTotal(), "balanced", d.c.Balanced(), "drops", d.c.DropSummary())
		}
	}
}

// sourceStopWait bounds how long close waits for the sources and the XDP
// fast path, so that a signal stops the process within 2 s whatever they
// do (a read stuck in the kernel, a source that ignores its context).
// Registries.Run gives up on its sources after proxyconfig.StopWait and
// logs it; this is for the rest.
const sourceStopWait = proxyconfig.StopWait + 250*time.Millisecond

// close stops the sources (and the fast path) and the registries' timers, and the pipeline if
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
		p.log.Error("the XDP fast path did not stop in time; stopping without it", "wait", sourceStopWait)
	}
	p.regs.Close()
}
