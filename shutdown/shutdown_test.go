package shutdown

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fake holds open sessions until drained; each one ends by itself after
// its own delay, or is cut at the deadline.
type fake struct {
	mu     sync.Mutex
	ends   []time.Duration
	closed bool
}

func (f *fake) Open() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.ends) }

func (f *fake) Drain(ctx context.Context) (cut int) {
	for _, d := range f.ends {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			cut++
		}
	}
	return cut
}

func (f *fake) Close() error { f.mu.Lock(); defer f.mu.Unlock(); f.closed = true; return nil }

func TestSignalsAndDrain(t *testing.T) {
	sig := make(chan os.Signal, 2)
	drain, kill := fromSignals(sig)
	var logs bytes.Buffer
	srv := &fake{ends: []time.Duration{0, time.Hour}}
	done := make(chan struct{})
	go func() {
		Drain(drain, kill, srv, Config{Timeout: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Name: "b", Unit: "conns"})
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("drained before any signal")
	case <-time.After(20 * time.Millisecond):
	}
	sig <- syscall.SIGTERM
	select {
	case <-done:
		t.Fatal("the first signal cut the hour-long session")
	case <-time.After(50 * time.Millisecond):
	}
	sig <- syscall.SIGTERM // the second: stop now
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the second signal did not stop it")
	}
	out := logs.String()
	for _, want := range []string{`msg="b draining: new conns are refused`, "open=2", `msg="b drained" ended=1 cut=1`} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if !srv.closed {
		t.Error("not closed")
	}
}

func TestDrainTimeout(t *testing.T) {
	drain, cancel := context.WithCancel(context.Background())
	cancel()
	srv := &fake{ends: []time.Duration{time.Hour}}
	start := time.Now()
	Drain(drain, context.Background(), srv, Config{Timeout: 30 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if took := time.Since(start); took > 5*time.Second || !srv.closed {
		t.Fatalf("took %v, closed %v", took, srv.closed)
	}
	srv = &fake{ends: []time.Duration{time.Hour}}
	start = time.Now()
	Drain(drain, context.Background(), srv, Config{Timeout: -1, Logger: slog.New(slog.DiscardHandler)})
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a negative timeout took %v", took)
	}
}
