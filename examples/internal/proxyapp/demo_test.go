package proxyapp

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDemo runs the demo in-process, shortened to 3 s (long enough for
// each client to rebind at least once: a rebinding every 20 messages,
// one message every 50 ms).
func TestDemo(t *testing.T) {
	var out, logs bytes.Buffer
	err := runDemo(context.Background(), &out, newLogger(&logs, slog.LevelWarn, errWindow), 3*time.Second)
	require.NoError(t, err, "%s\n%s", out.String(), logs.String())
	s := out.String()
	require.Contains(t, s, "both replicas pick the same backend for 1000/1000")
	require.Contains(t, s, "result: ok: every rebound session continued on its backend")
	require.Regexp(t, regexp.MustCompile(`across [1-9]\d* rebindings`), s)
	require.Regexp(t, regexp.MustCompile(`(?m)^  session 1 .* via [AB] → .* via [AB] `), s)
	require.Empty(t, logs.String())
}
