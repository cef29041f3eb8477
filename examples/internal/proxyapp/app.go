// Package proxyapp is the cidproxy program: flags, JSON configuration,
// registries and their sources, the Pipeline, metrics, logs and the demo.
// Two mains run it: examples/cidproxy (no Kubernetes code) and
// examples/kubernetes/cidproxy, a nested module that adds the EndpointSlice
// source through Options, so that only that build compiles client-go.
package proxyapp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// errWindow is how often one repeated warning or error may be logged.
const errWindow = 10 * time.Second

// Options are what a build of cidproxy adds to the program.
type Options struct {
	// Kubernetes makes the registry source of a service whose config has a
	// "kubernetes" key; nil in builds without Kubernetes support.
	Kubernetes func(k proxyconfig.Kubernetes, log *slog.Logger) (registry.Source, error)
	// XDP starts the XDP fast path on the "xdp_interfaces"; nil in builds
	// without it (xdp.go).
	XDP XDPFunc

	join bool // the -join flag
}

var errNoKubernetes = errors.New(`"kubernetes" backends need the Kubernetes build of cidproxy (examples/kubernetes/cidproxy)`)

// Main runs the program as a process: signals, arguments, exit code.
func Main(opts Options) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, os.Args[1:], os.Stdout, os.Stderr, opts)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return Run(ctx, args, stdout, stderr, Options{})
}

// Run is the program without the process: it returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, opts Options) int {
	fs := flag.NewFlagSet("cidproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "JSON configuration `file`")
	check := fs.Bool("check", false, "validate the configuration and exit")
	demo := fs.Bool("demo", false, "run a self-contained demo on loopback and exit")
	demoFor := fs.Duration("demo-duration", 10*time.Second, "how long the demo sends traffic")
	join := fs.Bool("join", false, "join the SO_REUSEPORT groups a running cidproxy holds on the listen addresses\n(the new process of a restart handover) instead of refusing to start")
	var probe probeFlags // health.go
	probe.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if probe.set() {
		return probe.run(ctx, fs, stdout, stderr)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cidproxy: unexpected arguments %q\n", fs.Args())
		return 2
	}
	switch {
	case *demo:
		if err := runDemo(ctx, stdout, newLogger(stderr, slog.LevelWarn, errWindow), *demoFor); err != nil {
			fmt.Fprintf(stderr, "cidproxy: demo failed: %v\n", err)
			return 1
		}
		return 0
	case *path == "":
		fmt.Fprintln(stderr, "cidproxy: -config FILE is required (or -demo)")
		fs.Usage()
		return 2
	}
	cfg, err := proxyconfig.Load(ctx, *path)
	if err == nil && *check {
		err = cfg.CheckFiles(ctx)
	}
	if err == nil && opts.Kubernetes == nil {
		for _, s := range cfg.Services {
			if s.Kubernetes != nil {
				err = fmt.Errorf("service %q: %w", s.Name, errNoKubernetes)
			}
		}
	}
	if err == nil {
		err = cfg.Validate(proxyconfig.Options{Kubernetes: opts.Kubernetes})
	}
	if err != nil {
		fmt.Fprintf(stderr, "cidproxy: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintf(stdout, "%s: ok: %s\n", *path, cfg.Summary())
		return 0
	}
	opts.join = *join
	log := newLogger(stderr, cfg.LogLevel, errWindow)
	defer flushLogs(log)
	if err := serve(ctx, cfg, log, opts); err != nil {
		if errors.Is(err, udpio.ErrInUse) && !opts.join {
			err = fmt.Errorf("%w; if that is the cidproxy this one replaces, start this one with -join to share its sockets (restart handover)", err)
		}
		log.Error("cidproxy stopped", "err", err)
		return 1
	}
	return 0
}

// serve runs the proxy described by cfg until ctx is done.
func serve(ctx context.Context, cfg *proxyconfig.Config, log *slog.Logger, opts Options) error {
	log.Info("cidproxy starting", "config", cfg.Summary())
	p, err := newProxy(ctx, cfg, log, opts)
	if err != nil {
		return err
	}
	if cfg.MetricsListen != "" {
		m, err := startMetrics(cfg.MetricsListen, metricsHandler(p), log)
		if err != nil {
			p.close()
			return fmt.Errorf("metrics_listen: %w", err)
		}
		defer m.stop()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: re-reading backend and CID key files")
				p.reload()
			}
		}
	}()
	err = p.run(ctx)
	log.Info("cidproxy stopped")
	return err
}
