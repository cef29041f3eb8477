package proxyapp

import (
	"context"
	"log/slog"
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
	pipe  *cidroute.Pipeline
	regs  *proxyconfig.Registries
	names []string    // the services, in the file's order
	accel Accelerator // the XDP fast path, or nil (xdp.go)

	stopSources context.CancelFunc
	sources     sync.WaitGroup
	stopping    atomic.Bool // set by close: /readyz and /livez fail (health.go)
}

// cidKeysPoll is how often a key file is checked for changes (tests
// lengthen it to see SIGHUP alone reload it).
var cidKeysPoll = time.Second

// newProxy builds the registries and the pipeline (which opens every
// socket, so a busy port fails here) and starts the sources. start
// cancels the reads of the start-up (the CID key files).
func newProxy(start context.Context, cfg *proxyconfig.Config, log *slog.Logger, opts Options) (*proxy, error) {
	p := &proxy{log: log}
	ctx, cancel := context.WithCancel(context.Background())
	p.stopSources = cancel
	regs, err := cfg.Build(proxyconfig.Options{Logger: log, Kubernetes: opts.Kubernetes, Join: opts.join, KeysPoll: cidKeysPoll, Context: start})
	if err != nil {
		cancel()
		return nil, err
	}
	p.regs = regs
	for _, s := range cfg.Services {
		p.names = append(p.names, s.Name)
	}
	pc := cidroute.Config{Services: regs.Services(), Logger: log, Wait: cfg.Wait}
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
	p.sources.Add(1)
	go func() {
		defer p.sources.Done()
		regs.Run(ctx)
	}()
	return p, nil
}

// run serves until ctx is done, then stops the sources.
func (p *proxy) run(ctx context.Context) error {
	err := p.pipe.Run(ctx)
	p.close()
	return err
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

// reload asks every file source, and every CID key file, to read its file
// now (SIGHUP).
func (p *proxy) reload() { p.regs.Reload() }
