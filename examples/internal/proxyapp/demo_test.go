package proxyapp

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemoFlag: `cidproxy -demo` runs the demo of examples/demo with
// pion/dtls v3 sessions (the demo package's tests check its verdict) and
// exits 0 when it passes.
func TestDemoFlag(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"-demo", "-demo-duration", "1s"}, &out, &errs)
	require.Equal(t, 0, code, "%s\n%s", out.String(), errs.String())
	require.Contains(t, out.String(), "sessions: pion/dtls v3")
	require.Contains(t, out.String(), "result: ok")
	require.Empty(t, errs.String())
}
