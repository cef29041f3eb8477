//go:build unix

package boundedread

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFIFO: a FIFO without a writer is refused at once; a plain open(2)
// would wait for a writer forever.
func TestFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	start := time.Now()
	_, err := Read(context.Background(), path, 1<<20, 5*time.Second)
	require.ErrorIs(t, err, ErrNotRegular)
	require.Less(t, time.Since(start), 4*time.Second, "refused, not timed out")
	require.Contains(t, err.Error(), path)
}

// TestDevice: a character device (endless data) is refused too.
func TestDevice(t *testing.T) {
	_, err := Regular("/dev/zero", 1<<20)
	require.ErrorIs(t, err, ErrNotRegular)
}
