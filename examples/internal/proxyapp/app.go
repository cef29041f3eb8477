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
	"sync"
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
	fs.Usage = func() { usage(fs) }
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
	if err == nil {
		// A start refuses what -check refuses: a backends_file that cannot
		// be read or holds a bad list at start would run the service with
		// no backends (at run time, a bad file keeps the previous list).
		err = cfg.CheckFiles(ctx)
	}
	if err != nil {
		printError(stderr, err)
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
		var ce *proxyconfig.Error
		if errors.As(err, &ce) { // a key file: as -check says it
			printError(stderr, ce)
			return 1
		}
		log.Error("cidproxy stopped", "err", err)
		return 1
	}
	return 0
}

// printError writes an error that stops the program before it serves. A
// configuration mistake is written alone, FILE:LINE:COLUMN: KEY: ..., as
// compilers write theirs (editors jump to it), the same from -check and
// from a start.
func printError(w io.Writer, err error) {
	var ce *proxyconfig.Error
	if errors.As(err, &ce) {
		fmt.Fprintln(w, ce)
		return
	}
	fmt.Fprintf(w, "cidproxy: %v\n", err)
}

// configReference is where every key of the configuration is described.
const configReference = "docs/configuration.md in the cidroute repository (module github.com/cidroute/cidroute)"

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprintf(w, `Usage:
  cidproxy -config FILE            run the proxy the JSON configuration FILE describes
  cidproxy -check -config FILE     validate FILE (and the files it names) as a start would, and exit
  cidproxy -demo                   a self-contained demo on loopback

The configuration reference, every key with its type, default and range:
  %s

Flags:
`, configReference)
	fs.PrintDefaults()
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
	fresh := false // no predecessor passed its sockets: none, or one that went away first
	if opts.handover != "" {
		if err := checkHandoverDir(opts.handover); err != nil {
			return err
		}
		inh, err := takeOver(ctx, opts.handover, log)
		if errors.Is(err, errDeclined) {
			log.Info("cidproxy stopped: told to stop before it took the sockets over")
			return nil
		}
		if err != nil {
			return err
		}
		opts.inherit = inh
		fresh = inh == nil
	}
	for {
		again, err := serveOnce(ctx, cfg, log, opts, hup, fresh)
		if again == nil {
			return err
		}
		// The successor vanished before the handover completed: serve
		// again, on the sockets kept, with the configuration running.
		opts.inherit, cfg, fresh = again.keep, again.cfg, false
	}
}

// serveAgain is what a process whose successor vanished serves again.
type serveAgain struct {
	keep *inherited
	cfg  *proxyconfig.Config
}

// serveOnce runs one pipeline: until ctx is done, a successor has taken
// over (nil, nil), or a successor vanished after this process stopped
// reading (what to serve again).
func serveOnce(ctx context.Context, cfg *proxyconfig.Config, log *slog.Logger, opts Options, hup chan os.Signal, fresh bool) (*serveAgain, error) {
	inh := opts.inherit
	p, err := newProxy(ctx, cfg, log, opts)
	for try := 0; fresh && errors.Is(err, udpio.ErrInUse) && try < 20 && ctx.Err() == nil; try++ {
		time.Sleep(50 * time.Millisecond) // the vanished predecessor's sockets are closing
		p, err = newProxy(ctx, cfg, log, opts)
	}
	if err != nil {
		inh.abort(err)
		return nil, err
	}
	var m *metricsServer
	if cfg.MetricsListen != "" {
		m, err = startMetrics(cfg.MetricsListen, inh.metricsListener(cfg.MetricsListen), metricsHandler(p), log)
		if err != nil {
			inh.abort(err)
			p.close()
			return nil, fmt.Errorf("metrics_listen: %w", err)
		}
	}
	stopMetrics := func() {
		if m != nil {
			m.stop()
			m = nil
		}
	}
	defer stopMetrics()
	if cfg.PprofListen != "" { // metrics.go
		pp, err := startPprof(cfg.PprofListen, inh != nil, log)
		if err != nil {
			inh.abort(err)
			p.close()
			return nil, fmt.Errorf("pprof_listen: %w", err)
		}
		defer pp.stop()
	}
	if inh != nil {
		within := handoverReadyWait
		if inh.conn == nil {
			within = handoverResumeWait
		}
		if err := p.waitBackends(ctx, within, inh.goneC()); err != nil {
			if ctx.Err() != nil {
				inh.abort(errDeclined)
				p.close()
				log.Warn("handover declined: this process was told to stop before it served")
				return nil, nil
			}
			if inh.conn != nil && !closed(inh.goneC()) {
				err = fmt.Errorf("handover: %w", err)
				inh.abort(err)
				p.close()
				return nil, err
			}
			log.Warn("handover: serving before every registry has its first list: no other process reads the queues", "err", err)
		}
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- p.pipe.Run(runCtx) }()
	end := func() error {
		stopRun()
		err := <-runErr
		p.close()
		p.logFinal()
		return err
	}
	stop := func() error {
		err := end()
		log.Info("cidproxy stopped")
		return err
	}
	if inh != nil {
		select { // the two processes may read the shared queues together, never neither
		case <-p.pipe.Serving():
		case err := <-runErr:
			runErr <- err
		}
		if err := inh.ready(ctx); err != nil {
			// The predecessor serves on: one of us is enough.
			if errors.Is(err, errDeclined) {
				log.Warn("handover declined: this process was told to stop before it completed", "err", err)
			} else {
				log.Error("handover failed after this process started serving; stopping", "err", err)
			}
			stopMetrics()
			dctx, cancel := context.WithTimeout(context.Background(), opts.drain)
			p.pipe.Drain(dctx)
			cancel()
			stop()
			if errors.Is(err, errDeclined) {
				return nil, nil
			}
			return nil, fmt.Errorf("handover: %w", err)
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
	handedOver := false // a successor serves, or is about to
	if opts.handover != "" {
		hl, err := listenHandover(opts.handover, log)
		if err != nil {
			log.Error("handover socket: this process cannot be replaced without loss", "path", opts.handover, "err", err)
		} else {
			log.Info("handover socket listening", "path", opts.handover)
			defer func() { hl.close(handedOver) }()
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
	// A handover runs off this loop, which goes on reloading meanwhile;
	// state keeps the two from changing the process at once.
	var state sync.Mutex
	var handing chan hoResult // while a handover runs
	for {
		done, runC, succ := ctx.Done(), runErr, successors
		if handing != nil { // it watches ctx itself, and stops the pipeline
			done, runC, succ = nil, nil, nil
		}
		select {
		case <-done:
			return nil, stop()
		case <-hup:
			state.Lock()
			p.reload(ctx)
			state.Unlock()
		case s := <-succ:
			handing = make(chan hoResult, 1)
			go func(s successor, m *metricsServer) {
				handing <- p.handOver(ctx, s.c, s.hello, m, cfg.MetricsListen, opts.drain, &state)
			}(s, m)
		case r := <-handing:
			handing = nil
			switch {
			case r.took:
				handedOver = true
				stopMetrics()
				return nil, stop()
			case r.resume != nil:
				stopMetrics()
				end()
				if ctx.Err() != nil {
					r.resume.closeRest()
					log.Info("cidproxy stopped")
					return nil, nil
				}
				log.Warn("handover: serving again after the successor vanished")
				return &serveAgain{keep: r.resume, cfg: p.cur}, nil
			}
		case err := <-runC:
			runErr <- err
			return nil, stop()
		}
	}
}

// closed reports whether c is closed (a nil c never is).
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
