package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"
)

// Assertion helpers, all fatal. testify's assert package needs a module
// (go.yaml.in/yaml/v3) that the shared go.sum lacks, and go.mod is not this
// package's to change.

func noErr(t testing.TB, err error, ctx ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%sunexpected error: %v", prefix(ctx), err)
	}
}

func isErr(t testing.TB, err, target error, ctx ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%serror %v, want one wrapping %v", prefix(ctx), err, target)
	}
}

func equal[T any](t testing.TB, got, want T, ctx ...any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%sgot  %+v\nwant %+v", prefix(ctx), got, want)
	}
}

func truth(t testing.TB, cond bool, ctx ...any) {
	t.Helper()
	if !cond {
		t.Fatalf("%scondition is false", prefix(ctx))
	}
}

func prefix(ctx []any) string {
	if len(ctx) == 0 {
		return ""
	}
	if f, ok := ctx[0].(string); ok {
		return fmt.Sprintf(f, ctx[1:]...) + ": "
	}
	return fmt.Sprint(ctx...) + ": "
}

// fakeClock is a settable clock for freshness tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logCounter is a slog.Handler that keeps every record, shared by all the
// loggers derived from it.
type logCounter struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newLogCounter() logCounter { return logCounter{mu: new(sync.Mutex), recs: new([]slog.Record)} }

func (h logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logCounter) WithGroup(string) slog.Handler            { return h }
func (h logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r.Clone())
	return nil
}

// count returns how many records at level have been logged.
func (h logCounter) count(level slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range *h.recs {
		if r.Level == level {
			n++
		}
	}
	return n
}

func (h logCounter) logger() *slog.Logger { return slog.New(h) }

// quietLogger discards everything.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// newTestRegistry returns a registry on a fake clock with freshness limit
// maxAge (0 = off), closed at the end of the test.
func newTestRegistry(t testing.TB, maxAge time.Duration) (*Registry, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	r, err := New(Config{Service: "test", Seed: 7, MaxAge: maxAge, Logger: quietLogger(), now: clk.Now})
	noErr(t, err)
	t.Cleanup(r.Close)
	return r, clk
}

// manyBackends returns n ready backends with ordinals 0..n-1 on distinct
// IPv4 addresses.
func manyBackends(n int) []Backend {
	bs := make([]Backend, n)
	for i := range bs {
		bs[i] = Backend{
			Ordinal: uint8(i),
			Addr:    netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 5684),
			Weight:  uint32(1 + i%3),
		}
	}
	return bs
}
