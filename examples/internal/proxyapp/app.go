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
	"net"
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

	join       bool           // the -join flag
	handover   string         // the -handover flag: the handover socket's path
	drain      time.Duration  // -handover-drain
	configPath string         // what SIGHUP reloads ("" : only the backend and key files)
	level      *slog.LevelVar // the logger's level, which a reload sets
	inherit    *inherited     // the sockets a predecessor handed over (handover.go)
	hup        chan os.Signal // tests: SIGHUP without a signal
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
	demoFor := fs.Duration("demo-duration", demoDuration, "how long the demo sends traffic")
	join := fs.Bool("join", false, "join the SO_REUSEPORT groups a running cidproxy holds on the listen addresses\ninstead of refusing to start (both then share the traffic; -handover replaces one without loss)")
	handover := fs.String("handover", "", "unix socket `path` of the restart handover: take the sockets over from the cidproxy listening there,\nif any, and listen there for the successor that replaces this one (start each new build with the same flags)")
	drain := fs.Duration("handover-drain", 2*time.Second, "after a handover, how long transparent-mode sessions keep relaying their backends' replies")
	version := fs.Bool("version", false, "print the version and exit")
	var probe probeFlags // health.go
	probe.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if probe.set() {
		return probe.run(ctx, fs, stdout, stderr)
	}
	if *version {
		fmt.Fprintf(stdout, "cidproxy %s\n", Version)
		return 0
	}
	if *join && *handover != "" {
		fmt.Fprintln(stderr, "cidproxy: give one of -join and -handover")
		return 2
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
	cfg, err := loadConfig(ctx, *path, opts)
	if err == nil && *check {
		err = cfg.CheckFiles(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "cidproxy: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintf(stdout, "%s: ok: %s\n", *path, cfg.Summary())
		return 0
	}
	opts.join, opts.handover, opts.drain, opts.configPath = *join, *handover, *drain, *path
	opts.level = new(slog.LevelVar)
	opts.level.Set(cfg.LogLevel)
	log := newLogger(stderr, opts.level, errWindow)
	defer flushLogs(log)
	if err := serve(ctx, cfg, log, opts); err != nil {
		if errors.Is(err, udpio.ErrInUse) && !opts.join && opts.handover == "" {
			err = fmt.Errorf("%w; if that is a cidproxy this one replaces, start both with -handover PATH to take its sockets over without loss (restart handover), or this one with -join to share them", err)
		}
		log.Error("cidproxy stopped", "err", err)
		return 1
	}
	return 0
}

// serve runs the proxy described by cfg until ctx is done, or until a
// successor has taken it over (-handover).
func serve(ctx context.Context, cfg *proxyconfig.Config, log *slog.Logger, opts Options) error {
	if opts.level == nil {
		opts.level = new(slog.LevelVar)
		opts.level.Set(cfg.LogLevel)
	}
	log.Info("cidproxy starting", "version", Version, "config", cfg.Summary())
	hup := opts.hup
	if hup == nil { // before anything slow: an early SIGHUP must not kill the process
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	if opts.handover != "" {
		inh, err := takeOver(ctx, opts.handover, log)
		if err != nil {
			return err
		}
		opts.inherit = inh
	}
	inh := opts.inherit
	p, err := newProxy(ctx, cfg, log, opts)
	if err != nil {
		inh.abort(err)
		return err
	}
	var m *metricsServer
	if cfg.MetricsListen != "" {
		m, err = startMetrics(cfg.MetricsListen, inh.metricsListener(cfg.MetricsListen), metricsHandler(p), log)
		if err != nil {
			inh.abort(err)
			p.close()
			return fmt.Errorf("metrics_listen: %w", err)
		}
	}
	stopMetrics := func() {
		if m != nil {
			m.stop()
			m = nil
		}
	}
	defer stopMetrics()
	if inh != nil {
		if err := p.waitBackends(ctx, handoverReadyWait); err != nil {
			err = fmt.Errorf("handover: %w", err)
			inh.abort(err)
			p.close()
			return err
		}
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- p.pipe.Run(runCtx) }()
	stop := func() error {
		stopRun()
		err := <-runErr
		p.close()
		p.logFinal()
		log.Info("cidproxy stopped")
		return err
	}
	if inh != nil {
		select { // the two processes may read the shared queues together, never neither
		case <-p.pipe.Serving():
		case err := <-runErr:
			runErr <- err
		}
		if err := inh.ready(); err != nil {
			// The predecessor gave up and serves on: one of us is enough.
			log.Error("handover failed after this process started serving; stopping", "err", err)
			stopMetrics()
			dctx, cancel := context.WithTimeout(context.Background(), opts.drain)
			p.pipe.Drain(dctx)
			cancel()
			stop()
			return fmt.Errorf("handover: %w", err)
		}
		if err := p.startAccel(p.sourcesContext()); err != nil {
			log.Error("xdp: not attached after the handover; the sockets serve everything", "err", err)
		}
	}
	type successor struct {
		c     *net.UnixConn
		hello hoMsg
	}
	successors := make(chan successor)
	if opts.handover != "" {
		hl, err := listenHandover(opts.handover)
		if err != nil {
			log.Error("handover socket: this process cannot be replaced without loss", "path", opts.handover, "err", err)
		} else {
			log.Info("handover socket listening", "path", opts.handover)
			defer hl.close()
			go func() {
				for {
					c, err := hl.accept()
					if err != nil {
						return
					}
					hello, files, err := recvHandover(c, time.Now().Add(5*time.Second))
					closeFiles(files)
					if err != nil || hello.Type != "hello" {
						log.Warn("handover socket: not a successor's hello", "err", err, "message", hello.Type)
						c.Close()
						continue
					}
					select {
					case successors <- successor{c, hello}:
					case <-runCtx.Done():
						c.Close()
						return
					}
				}
			}()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return stop()
		case <-hup:
			p.reload(ctx)
		case s := <-successors:
			if p.handOver(ctx, s.c, s.hello, m, opts.drain) {
				stopMetrics()
				return stop()
			}
		case err := <-runErr:
			runErr <- err
			return stop()
		}
	}
}
