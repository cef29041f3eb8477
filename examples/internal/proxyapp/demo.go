package proxyapp

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/cidroute/cidroute/examples/internal/demo"
)

// demoDuration is -demo-duration's default, the same as examples/demo's.
const demoDuration = demo.DefaultDuration

// runDemo is -demo: the demo of examples/demo (package
// examples/internal/demo), which builds without the rest of cidproxy.
func runDemo(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration) error {
	return demo.Run(ctx, out, log, d)
}
