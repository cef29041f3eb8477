package boundedread

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRegular(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(path, []byte("12345"), 0o600))
	got, err := Regular(path, 5)
	require.NoError(t, err)
	require.Equal(t, "12345", string(got))

	_, err = Regular(path, 4)
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = Regular(dir, 100)
	require.ErrorIs(t, err, ErrNotRegular)
	_, err = Regular(filepath.Join(dir, "absent"), 100)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestGuard(t *testing.T) {
	var g Guard
	release := make(chan struct{})
	var calls atomic.Int32
	stuck := func() ([]byte, error) {
		calls.Add(1)
		<-release
		return []byte("late"), nil
	}
	start := time.Now()
	_, err := g.Do(context.Background(), 20*time.Millisecond, stuck)
	require.ErrorIs(t, err, ErrTimeout)
	require.Less(t, time.Since(start), 10*time.Second)

	// While the first read is stuck, no other starts.
	_, err = g.Do(context.Background(), time.Second, func() ([]byte, error) { calls.Add(1); return nil, nil })
	require.ErrorIs(t, err, ErrBlocked)
	require.Equal(t, int32(1), calls.Load())

	// Once it returns, reads go on; its late result is dropped.
	close(release)
	require.Eventually(t, func() bool {
		got, err := g.Do(context.Background(), time.Second, func() ([]byte, error) { return []byte("now"), nil })
		return err == nil && string(got) == "now"
	}, 10*time.Second, time.Millisecond)

	// A cancelled context ends the wait at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	block := make(chan struct{})
	defer close(block)
	_, err = g.Do(ctx, 0, func() ([]byte, error) { <-block; return nil, nil })
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

func TestRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte(strings.Repeat("x", 10)), 0o600))
	got, err := Read(context.Background(), path, 10, time.Second)
	require.NoError(t, err)
	require.Len(t, got, 10)
}

// TestNotRegularNamed: a directory is named as one, with its mode in
// octal (FileMode's String printed "d---------").
func TestNotRegularNamed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755)) // whatever the umask
	_, err := Regular(dir, 10)
	require.ErrorIs(t, err, ErrNotRegular)
	require.EqualError(t, err, dir+": not a regular file (a directory, mode 0755)")
}
