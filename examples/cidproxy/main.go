// Command cidproxy is the reference cidroute proxy: a stateless, CID-aware
// UDP proxy for DTLS 1.2 (RFC 9146) and QUIC services, configured by a JSON
// file. See README.md for the file format.
//
//	cidproxy -config cidproxy.json          run
//	cidproxy -check -config cidproxy.json   validate the file and exit
//	cidproxy -demo                          a self-contained demo on loopback
//
// SIGINT and SIGTERM stop it; SIGHUP re-reads every backends_file.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// errWindow is how often one repeated warning or error may be logged.
const errWindow = 10 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cidproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "JSON configuration `file`")
	check := fs.Bool("check", false, "validate the configuration and exit")
	demo := fs.Bool("demo", false, "run a self-contained demo on loopback and exit")
	demoFor := fs.Duration("demo-duration", 10*time.Second, "how long the demo sends traffic")
	if err := fs.Parse(args); err != nil {
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
	cfg, err := loadConfig(*path)
	if err == nil && *check {
		err = cfg.checkBackendFiles()
	}
	if err != nil {
		fmt.Fprintf(stderr, "cidproxy: %v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintf(stdout, "%s: ok: %s\n", *path, cfg.summary())
		return 0
	}
	log := newLogger(stderr, cfg.LogLevel, errWindow)
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("cidproxy stopped", "err", err)
		return 1
	}
	return 0
}

// serve runs the proxy described by cfg until ctx is done.
func serve(ctx context.Context, cfg *config, log *slog.Logger) error {
	log.Info("cidproxy starting", "config", cfg.summary())
	p, err := newProxy(cfg, log)
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
				log.Info("SIGHUP: re-reading backend files")
				p.reload()
			}
		}
	}()
	err = p.run(ctx)
	log.Info("cidproxy stopped")
	return err
}
