package proxyapp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// newLogger returns a text logger writing to w. Warnings and errors with
// the same message (and logger attributes) are written at most once per
// window; the next one written says how many were held back, so a failure
// that repeats every poll cannot flood the log.
func newLogger(w io.Writer, level slog.Level, window time.Duration) *slog.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(&limitHandler{Handler: h, st: &limitState{window: window, seen: map[string]*limitEntry{}, now: time.Now}})
}

type limitHandler struct {
	slog.Handler
	prefix string // the attributes and groups added so far, part of the key
	st     *limitState
}

type limitState struct {
	mu     sync.Mutex
	window time.Duration
	seen   map[string]*limitEntry
	now    func() time.Time
}

type limitEntry struct {
	last       time.Time
	suppressed int
}

// maxKeys bounds the table; when full it is cleared, which at worst lets
// one extra line per message through.
const maxKeys = 1024

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	key := h.prefix + "\x00" + r.Level.String() + "\x00" + r.Message
	st := h.st
	st.mu.Lock()
	now := st.now()
	e := st.seen[key]
	if e != nil && now.Sub(e.last) < st.window {
		e.suppressed++
		st.mu.Unlock()
		return nil
	}
	held := 0
	if e != nil {
		held = e.suppressed
	}
	if len(st.seen) >= maxKeys {
		clear(st.seen)
	}
	st.seen[key] = &limitEntry{last: now}
	st.mu.Unlock()
	if held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("suppressed", held))
	}
	return h.Handler.Handle(ctx, r)
}

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{Handler: h.Handler.WithAttrs(as), prefix: h.prefix + fmt.Sprint(as), st: h.st}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{Handler: h.Handler.WithGroup(name), prefix: h.prefix + "/" + name, st: h.st}
}
