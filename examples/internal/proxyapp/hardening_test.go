package proxyapp

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/proxyconfig"
	"github.com/cidroute/cidroute/registry"
)

// TestLogLimitPerCause: the limiter keys on the message and its
// attributes, so a different error under the same message is written at
// once; a repeated one is held back and its count written when the window
// ends, with the last occurrence.
func TestLogLimitPerCause(t *testing.T) {
	var buf syncBuffer
	log := newLogger(&buf, slog.LevelInfo, 200*time.Millisecond)
	for range 3 {
		log.Error("bad backend file", "err", "JSON syntax error")
	}
	log.Error("bad backend file", "err", "ordinal 255 is reserved")
	log.Error("bad backend file", "err", "unknown key")
	l := buf.String()
	require.Equal(t, 3, strings.Count(l, "\n"), "one line per cause at once:\n%s", l)
	for _, cause := range []string{"JSON syntax error", "ordinal 255", "unknown key"} {
		require.Contains(t, l, cause)
	}
	// The two held back are reported when the window ends, without another
	// occurrence.
	waitFor(t, 5*time.Second, "the suppressed count", func() bool { return strings.Contains(buf.String(), "suppressed=1") })
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 4, buf.String())
	require.Contains(t, lines[3], "JSON syntax error")
}

// TestLogLimitTimeOrder: a held line is written with the time it is
// written, after every line written before it, and says when it last
// occurred: a flapping "stale" held for the window must not appear with
// its old time after the "fresh" that followed it.
func TestLogLimitTimeOrder(t *testing.T) {
	var buf syncBuffer
	log := newLogger(&buf, slog.LevelInfo, 300*time.Millisecond)
	log.Warn("registry stale")
	log.Info("registry fresh again")
	log.Warn("registry stale") // held
	time.Sleep(50 * time.Millisecond)
	log.Info("unrelated")
	waitFor(t, 5*time.Second, "the held line", func() bool { return strings.Count(buf.String(), "\n") == 4 })
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var prev time.Time
	for _, l := range lines {
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(strings.Fields(l)[0], "time="))
		require.NoError(t, err, l)
		require.False(t, at.Before(prev), "a line older than the one before it:\n%s", buf.String())
		prev = at
	}
	require.Contains(t, lines[3], "registry stale")
	require.Contains(t, lines[3], "last=")
}

// TestLogLimitEveryLevel: a repeated line is limited at every level, not
// only warnings: "registry fresh again" flapping wrote 33,000 info lines
// in 4 s. Times and durations in a line do not make it another line.
func TestLogLimitEveryLevel(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(&buf, slog.LevelDebug, time.Hour)
	for i := range 1000 {
		log.Info("registry fresh again", "version", 3)
		log.Warn("registry stale", "age", time.Duration(i), "version", 3)
		log.Debug("poll")
	}
	log.Info("registry fresh again", "version", 4) // another version: another line
	require.Equal(t, 4, strings.Count(buf.String(), "\n"), buf.String())
}

// TestCheckFIFO: -check with a FIFO as backends_file, or as the config
// file itself, fails at once instead of waiting for a writer.
func TestCheckFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	defer func() { // unblock an open(2) that waits, should the test fail
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	}()
	cfgPath := filepath.Join(dir, "c.json")
	require.NoError(t, os.WriteFile(cfgPath, []byte(withServices(`{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:5", "backends_file": "fifo"}`)), 0o600))
	for _, path := range []string{cfgPath, fifo} {
		res := make(chan string, 1)
		go func() {
			code, _, errOut := runArgs(t, "-check", "-config", path)
			res <- fmt.Sprint(code, " ", errOut)
		}()
		select {
		case got := <-res:
			require.True(t, strings.HasPrefix(got, "1 "), got)
			require.Contains(t, got, "not a regular file")
		case <-time.After(5 * time.Second):
			t.Fatalf("-check -config %s blocked", filepath.Base(path))
		}
	}
}

// TestStopWithStuckSource: a backend source that ignores its context
// delays the stop by at most proxyconfig.StopWait (the process then stops
// without it, and says so), so a signal stops the process within 2 s on a
// quiet machine. The bound is taken against the same stop with a source
// that returns, measured in the same run, so that a loaded machine (which
// slows both) does not fail it.
func TestStopWithStuckSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k.json")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`{"services": [{"name": "k", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 1,
		"kubernetes": {"service": "ds"}}]}`, freePort(t, "udp"))), 0o600))
	release := make(chan struct{})
	defer close(release)
	// stop runs the program with src as the Kubernetes source and returns
	// how long it took to stop once its context was cancelled.
	stop := func(src registry.Source) (time.Duration, string) {
		var errOut syncBuffer
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, []string{"-config", path}, &bytes.Buffer{}, &errOut, Options{
				Kubernetes: func(proxyconfig.Kubernetes, *slog.Logger) (registry.Source, error) { return src, nil },
			})
		}()
		waitFor(t, 10*time.Second, "start", func() bool { return strings.Contains(errOut.String(), "service started") })
		began := time.Now()
		cancel()
		select {
		case code := <-done:
			require.Equal(t, 0, code, errOut.String())
			return time.Since(began), errOut.String()
		case <-time.After(30 * time.Second):
			t.Fatal("not stopped within 30 s of the signal")
			return 0, ""
		}
	}
	polite, log := stop(registry.SourceFunc(func(ctx context.Context, _ registry.Updater) error { <-ctx.Done(); return nil }))
	require.NotContains(t, log, "did not stop")
	stuck, log := stop(registry.SourceFunc(func(context.Context, registry.Updater) error { <-release; return nil }))
	require.Contains(t, log, "did not stop")
	t.Logf("stopped in %v with a source that returns, %v with one that ignores its context", polite, stuck)
	assert.Less(t, stuck, polite+proxyconfig.StopWait+time.Second, "a stuck source delayed the stop by more than StopWait")
}

// TestSecondInstanceRefused: a second cidproxy on the listen address of a
// running one (workers > 1, so SO_REUSEPORT) fails with a clear error
// instead of silently taking part of the traffic; -join lets it in.
func TestSecondInstanceRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	port := freePort(t, "udp")
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`{"services": [{"name": "a", "protocol": "dtls", "listen": "127.0.0.1:%d", "workers": 2,
		"backends": [{"ordinal": 0, "address": "127.0.0.1:9"}]}]}`, port)), 0o600))
	var firstErr syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- Run(ctx, []string{"-config", path}, &bytes.Buffer{}, &firstErr, Options{}) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "the first instance", func() bool { return strings.Contains(firstErr.String(), "service started") })

	second := func(args ...string) (int, string) {
		var errOut syncBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		code := Run(ctx, append(args, "-config", path), &bytes.Buffer{}, &errOut, Options{})
		return code, errOut.String()
	}
	code, out := second()
	require.Equal(t, 1, code, "the second instance must not start:\n%s", out)
	require.Contains(t, out, "in use")
	require.Contains(t, out, "-join")

	code, out = second("-join")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "service started")
}
