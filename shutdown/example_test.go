package shutdown_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/cidroute/cidroute/shutdown"
)

type server struct{} // stands for a *dtlsecho.Server, a *quicecho.Server, or your own

func (server) Drain(ctx context.Context) int { return 0 }
func (server) Close() error                  { return nil }

// A backend's main: serve until SIGTERM, then drain for up to 110 s (the
// example manifests give pods 120 s), cut what is left and return.
func Example() {
	drain, kill := shutdown.Signals()
	srv := server{}
	shutdown.Drain(drain, kill, srv, shutdown.Config{Timeout: 110 * time.Second, Logger: slog.Default(), Name: "dtls-backend"})
}
