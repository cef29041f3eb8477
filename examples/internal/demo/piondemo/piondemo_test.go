package piondemo

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDemo runs the demo as `cidproxy -demo` does, with pion/dtls v3
// handshakes, shortened to 1 s (each client still moves through both
// replicas). The checks and how they catch a misroute are the demo
// package's, tested there.
func TestDemo(t *testing.T) {
	var out, logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := Run(context.Background(), &out, log, time.Second)
	require.NoError(t, err, "%s\n%s", out.String(), logs.String())
	s := out.String()
	require.Contains(t, s, "sessions: pion/dtls v3 with connection IDs")
	require.Contains(t, s, "result: ok: every message was answered by the backend its session's CID names")
	require.Regexp(t, regexp.MustCompile(`(?m)^  session 1 .* via [AB] → .* via [AB] `), s)
	require.Regexp(t, regexp.MustCompile(`(?m)^0 +[0-9a-f]{16} +backend (\d) +backend \d +[2-9] +A\+B `), s)
	require.Empty(t, logs.String())
}
