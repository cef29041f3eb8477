package proxyapp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// newLogger returns a text logger writing to w in which no line can
// flood: a line repeated within window is held back. A line is its level,
// message and attributes (the logger's and the record's, except times and
// durations, which differ on every repeat), so each distinct cause, such as
// each distinct error under one message, is written at once. When a line
// was held back, its last occurrence is written at the end of the window
// with suppressed=N, the number of others held back since the previous
// line, and the window starts again: a line that repeats forever is written
// once per window with its count. A held line is written with the time it
// is written, so that the log stays in time order (a collector may refuse
// or misplace an older line, and a reader takes the last line for the
// current state), and the time of its last occurrence as last=.
func newLogger(w io.Writer, level slog.Leveler, window time.Duration) *slog.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(&limitHandler{Handler: h, st: &limitState{window: window, seen: map[string]*limitEntry{}}})
}

// flushLogs writes every held-back line now, with its count; for the end
// of the program.
func flushLogs(log *slog.Logger) {
	if h, ok := log.Handler().(*limitHandler); ok {
		h.st.flushAll()
	}
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
}

type limitEntry struct {
	last       time.Time // when a line of this key was last written
	suppressed int
	held       slog.Record  // the last one held back
	out        slog.Handler // the handler to write it with
	timer      *time.Timer  // pending write of held
}

// maxKeys bounds the table. When it is full, entries idle for a window are
// dropped; should that not free any, the table is cleared (pending counts
// written first), which at worst lets one extra line per key through.
const maxKeys = 1024

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	key := h.key(r)
	st := h.st
	st.mu.Lock()
	now := time.Now()
	e := st.seen[key]
	if e != nil && now.Sub(e.last) < st.window {
		e.suppressed++
		e.held, e.out = r.Clone(), h.Handler
		if e.timer == nil {
			e.timer = time.AfterFunc(e.last.Add(st.window).Sub(now), func() { st.flush(key) })
		}
		st.mu.Unlock()
		return nil
	}
	if e == nil {
		if len(st.seen) >= maxKeys {
			st.evictLocked(now)
		}
		e = &limitEntry{}
		st.seen[key] = e
	}
	e.last = now
	st.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

// key identifies a line: level, logger attributes, message and the
// record's attributes without times and durations.
func (h *limitHandler) key(r slog.Record) string {
	var b strings.Builder
	b.WriteString(r.Level.String())
	b.WriteByte(0)
	b.WriteString(h.prefix)
	b.WriteByte(0)
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		switch a.Value.Kind() {
		case slog.KindTime, slog.KindDuration:
			return true
		}
		b.WriteByte(0)
		b.WriteString(a.Key)
		b.WriteByte('=')
		b.WriteString(a.Value.String())
		return true
	})
	return b.String()
}

// flush writes the held-back line of key, if any, and restarts its window.
func (st *limitState) flush(key string) {
	st.mu.Lock()
	e := st.seen[key]
	if e == nil || e.suppressed == 0 {
		st.mu.Unlock()
		return
	}
	r, out, n := e.held, e.out, e.suppressed
	e.suppressed, e.held, e.out, e.timer = 0, slog.Record{}, nil, nil
	e.last = time.Now()
	st.mu.Unlock()
	write(out, r, n)
}

// write writes the held record r, of which suppressed occurrences were
// held back.
func write(out slog.Handler, r slog.Record, suppressed int) {
	r.AddAttrs(slog.Time("last", r.Time))
	r.Time = time.Now()
	if suppressed > 1 {
		r.AddAttrs(slog.Int("suppressed", suppressed-1))
	}
	out.Handle(context.Background(), r)
}

func (st *limitState) flushAll() {
	st.mu.Lock()
	keys := make([]string, 0, len(st.seen))
	for k, e := range st.seen {
		if e.suppressed > 0 {
			e.timer.Stop()
			keys = append(keys, k)
		}
	}
	st.mu.Unlock()
	for _, k := range keys {
		st.flush(k)
	}
}

// evictLocked makes room in a full table.
func (st *limitState) evictLocked(now time.Time) {
	for k, e := range st.seen {
		if e.suppressed == 0 && now.Sub(e.last) >= st.window {
			delete(st.seen, k)
		}
	}
	if len(st.seen) < maxKeys {
		return
	}
	for k, e := range st.seen {
		if e.suppressed > 0 {
			e.timer.Stop()
			write(e.out, e.held, e.suppressed)
		}
		delete(st.seen, k)
	}
}

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{Handler: h.Handler.WithAttrs(as), prefix: h.prefix + fmt.Sprint(as), st: h.st}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{Handler: h.Handler.WithGroup(name), prefix: h.prefix + "/" + name, st: h.st}
}
