//go:build unix

package cidkeys

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cidroute/cidroute/internal/boundedread"
)

// TestLoadFIFO: a FIFO as key file is refused at once; an open of it used
// to wait for a writer for ever, so -check hung and ignored SIGTERM.
func TestLoadFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "keys.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { // unblock a reader, should the test fail
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	done := make(chan error, 2)
	go func() { _, err := Load(context.Background(), fifo); done <- err }()
	go func() { _, err := Open(context.Background(), fifo, 0); done <- err }()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, boundedread.ErrNotRegular) {
				t.Errorf("a FIFO: %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("reading a FIFO blocks")
		}
	}
}
