package proxyapp

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/cidroute/cidroute/examples/internal/demo"
	"github.com/cidroute/cidroute/examples/internal/demo/piondemo"
)

// demoDuration is -demo-duration's default, the same as examples/demo's.
const demoDuration = demo.DefaultDuration

// runDemo is -demo: the demo of examples/demo with pion/dtls v3 sessions
// (package piondemo), as cidproxy compiles pion anyway.
func runDemo(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration) error {
	return piondemo.Run(ctx, out, log, d)
}
