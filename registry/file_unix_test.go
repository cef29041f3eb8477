//go:build unix

package registry

import (
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFileFIFO: a FIFO (or any file that is not regular) as the backend
// file is refused at once and counted, instead of blocking the source in
// open(2), and Run still returns promptly when cancelled.
func TestFileFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "backends.json")
	noErr(t, syscall.Mkfifo(path, 0o600))
	logs := newLogCounter()
	r, _ := newTestRegistry(t, 0)
	f := &File{Path: path, Interval: time.Millisecond, Logger: logs.logger()}
	stop := runFile(f, r)
	defer func() {
		// Unblock an open(2) stuck on the FIFO, should the test fail.
		if w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	// The count comes before the log line: wait for both.
	for r.Stats().Rejections == 0 || logs.count(slog.LevelError) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the FIFO was neither refused nor counted within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	equal(t, logs.count(slog.LevelError), 1)
	stop(t)
}
