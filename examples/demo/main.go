// Command demo shows cidroute on loopback in a few seconds: two proxy
// replicas of one service, three echo backends behind the PPv2 adapter, and
// clients with connection IDs that rebind like a NAT and switch replicas.
// It exits 0 only if every message was answered by the backend its
// session's CID names.
//
//	go run ./examples/demo [-duration 3s]
//
// Its sessions are unencrypted DTLS 1.2 records with connection IDs (the
// proxies read only record headers), so it builds only the core module and
// a first run from an empty build cache is quick; `cidproxy -demo` runs the
// same demo with pion/dtls v3 handshakes and encryption.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/cidroute/cidroute/examples/internal/demo"
)

func main() {
	d := flag.Duration("duration", demo.DefaultDuration, "how long the clients send traffic")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := demo.Run(ctx, os.Stdout, log, *d, demo.Records)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
}
