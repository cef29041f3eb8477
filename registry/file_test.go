package registry

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recUpdater forwards to a Registry and counts the calls it sees.
type recUpdater struct {
	*Registry
	updates, rejects, confirms atomic.Int64
}

func (u *recUpdater) Update(bs []Backend) error {
	err := u.Registry.Update(bs)
	if err != nil {
		u.rejects.Add(1)
	} else {
		u.updates.Add(1)
	}
	return err
}

func (u *recUpdater) Confirm() {
	u.Registry.Confirm()
	u.confirms.Add(1)
}

// fileRun runs a File source in lockstep with the test: Run blocks after
// every poll until the test takes it with waitPolls.
type fileRun struct {
	t     *testing.T
	path  string
	f     *File
	reg   *Registry
	clk   *fakeClock
	u     *recUpdater
	logs  logCounter
	polls chan struct{}
	stop  context.CancelFunc
	done  chan error
}

func startFile(t *testing.T, content string, maxAge time.Duration) *fileRun {
	t.Helper()
	h := &fileRun{t: t, path: filepath.Join(t.TempDir(), "backends.json"), logs: newLogCounter(), polls: make(chan struct{}), done: make(chan error, 1)}
	if content != "" {
		h.write(content)
	}
	h.reg, h.clk = newTestRegistry(t, maxAge)
	h.u = &recUpdater{Registry: h.reg}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	h.f = &File{Path: h.path, Interval: time.Millisecond, Logger: h.logs.logger()}
	h.f.afterPoll = func() {
		select {
		case h.polls <- struct{}{}:
		case <-ctx.Done():
		}
	}
	go func() { h.done <- h.f.Run(ctx, h.u) }()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	h.waitPolls(1) // the initial read
	return h
}

// write replaces the file atomically, as the File docs ask.
func (h *fileRun) write(content string) {
	h.t.Helper()
	tmp := h.path + ".tmp"
	noErr(h.t, os.WriteFile(tmp, []byte(content), 0o644))
	noErr(h.t, os.Rename(tmp, h.path))
}

// waitPolls waits for n polls to complete. After a change to the file, two
// polls guarantee that one started after the change.
func (h *fileRun) waitPolls(n int) {
	h.t.Helper()
	for range n {
		select {
		case <-h.polls:
		case err := <-h.done:
			h.t.Fatalf("Run returned early: %v", err)
		case <-time.After(time.Minute):
			h.t.Fatal("no poll within a minute")
		}
	}
}

// pollUntil polls until cond holds, at most 1000 polls.
func (h *fileRun) pollUntil(what string, cond func() bool) {
	h.t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		h.waitPolls(1)
	}
	h.t.Fatalf("%s: not after 1000 polls", what)
}

func (h *fileRun) errorsLogged() int { return h.logs.count(slog.LevelError) }

const (
	fileA = `[{"ordinal":0,"address":"10.0.0.1:5684"},{"ordinal":1,"address":"10.0.0.2:5684"}]`
	fileB = `[{"ordinal":0,"address":"10.0.0.1:5684"},{"ordinal":1,"address":"10.0.0.2:5684","state":"draining"}]`
	fileC = `[{"ordinal":0,"address":"10.0.0.1:5684"},{"ordinal":1,"address":"10.0.0.2:5684","state":"gone"}]`
)

func TestFileSource(t *testing.T) {
	h := startFile(t, fileA, 0)
	equal(t, h.reg.Snapshot().Version(), uint64(1))
	equal(t, h.reg.Snapshot().Len(), 2)

	// Unchanged: confirmed on every poll, never republished.
	h.waitPolls(3)
	truth(t, h.u.confirms.Load() >= 3, "confirms %d", h.u.confirms.Load())
	equal(t, h.reg.Snapshot().Version(), uint64(1))

	// Changed: published.
	h.write(fileB)
	h.waitPolls(2)
	equal(t, h.reg.Snapshot().Version(), uint64(2))
	b, _ := h.reg.Snapshot().Backend(1)
	equal(t, b.State, Draining)

	// Changed with the same size and mtime: still seen (content compared).
	st, err := os.Stat(h.path)
	noErr(t, err)
	c := fileC[:len(fileC)-1] + strings.Repeat(" ", len(fileB)-len(fileC)) + "]"
	equal(t, len(c), len(fileB))
	tmp := h.path + ".tmp"
	noErr(t, os.WriteFile(tmp, []byte(c), 0o644))
	noErr(t, os.Chtimes(tmp, st.ModTime(), st.ModTime()))
	noErr(t, os.Rename(tmp, h.path))
	h.waitPolls(2)
	equal(t, h.reg.Snapshot().Version(), uint64(3))
	b, _ = h.reg.Snapshot().Backend(1)
	equal(t, b.State, Gone)
	equal(t, h.errorsLogged(), 0)
	good := h.reg.Snapshot()

	// Malformed JSON: previous snapshot stays, logged once, not confirmed.
	h.write(`[{"ordinal":`)
	h.waitPolls(2)
	confirms := h.u.confirms.Load()
	h.waitPolls(5)
	equal(t, h.errorsLogged(), 1)
	equal(t, h.u.confirms.Load(), confirms, "a bad file confirms nothing")
	truth(t, h.reg.Snapshot() == good)

	equal(t, h.reg.Stats().Rejections, uint64(1), "counted once")

	// Invalid list (duplicate ordinal): rejected by the registry, logged once.
	h.write(`[{"ordinal":0,"address":"10.0.0.1:5684"},{"ordinal":0,"address":"10.0.0.2:5684"}]`)
	h.waitPolls(7)
	equal(t, h.errorsLogged(), 2)
	equal(t, h.reg.Stats().Rejections, uint64(2))
	truth(t, h.reg.Snapshot() == good)

	// Reload: re-read, counted and logged again even though nothing changed.
	h.f.Reload()
	h.pollUntil("reload logs", func() bool { return h.errorsLogged() == 3 })
	h.waitPolls(5)
	equal(t, h.errorsLogged(), 3)
	equal(t, h.reg.Stats().Rejections, uint64(3))

	// Missing file: logged once.
	noErr(t, os.Remove(h.path))
	h.pollUntil("missing file logged", func() bool { return h.errorsLogged() == 4 })
	h.waitPolls(5)
	equal(t, h.errorsLogged(), 4)
	truth(t, h.reg.Snapshot() == good)

	// Back to a good file: published.
	h.write(fileA)
	h.waitPolls(2)
	equal(t, h.reg.Snapshot().Version(), uint64(4))
	equal(t, h.errorsLogged(), 4)

	// Cancel stops Run, which returns nil.
	h.stop()
	select {
	case err := <-h.done:
		noErr(t, err)
		h.done <- err // for Cleanup
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after cancel")
	}
}

func TestFileReload(t *testing.T) {
	h := startFile(t, fileA, 0)
	equal(t, h.u.updates.Load(), int64(1))
	h.f.Reload()
	h.pollUntil("forced update", func() bool { return h.u.updates.Load() == 2 })
	h.waitPolls(5)
	equal(t, h.u.updates.Load(), int64(2), "one reload, one update")

	// Reloads while one is pending coalesce: at most two more updates
	// (the pending one may be taken between the calls).
	for range 10 {
		h.f.Reload()
	}
	h.pollUntil("forced update", func() bool { return h.u.updates.Load() >= 3 })
	h.waitPolls(5)
	truth(t, h.u.updates.Load() <= 4, "%d updates for 10 reloads", h.u.updates.Load())

	// A Reload before Run is kept for it.
	f := &File{Path: h.path, Interval: time.Hour, Logger: quietLogger()}
	f.Reload()
	r, _ := newTestRegistry(t, 0)
	u := &recUpdater{Registry: r}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.Run(ctx, u) }()
	waitFor(t, func() bool { return u.updates.Load() == 2 }) // initial read, then the reload
	cancel()
	noErr(t, <-done)
}

func TestFileMissingAtStart(t *testing.T) {
	h := startFile(t, "", 0)
	equal(t, h.errorsLogged(), 1)
	equal(t, h.reg.Snapshot().Len(), 0)
	h.write(fileA)
	h.waitPolls(2)
	equal(t, h.reg.Snapshot().Len(), 2)
}

func TestFileTooLarge(t *testing.T) {
	h := startFile(t, fileA, 0)
	h.write("[" + strings.Repeat(" ", maxFileSize) + "]")
	h.waitPolls(4)
	equal(t, h.errorsLogged(), 1)
	isErr(t, h.logs.lastErr(), ErrFileTooLarge)
	equal(t, h.reg.Snapshot().Version(), uint64(1))
}

func TestFileRunErrors(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	truth(t, (&File{}).Run(context.Background(), r) != nil, "no Path")
	truth(t, (&File{Path: "x"}).Run(context.Background(), nil) != nil, "nil Updater")
}

// Two services fed by two files: one file goes bad and its registry goes
// stale; the other service stays fresh and keeps routing.
func TestFileServicesIsolated(t *testing.T) {
	a := startFile(t, fileA, time.Hour)
	b := startFile(t, fileA, time.Hour)
	a.write("garbage")
	a.waitPolls(2)
	a.clk.Add(2 * time.Hour)
	b.clk.Add(2 * time.Hour)
	b.waitPolls(2) // b confirms at the new time
	a.waitPolls(2) // a has nothing to confirm
	a.reg.checkFreshness()
	b.reg.checkFreshness()
	truth(t, a.reg.Stale(), "a stale")
	truth(t, !b.reg.Stale(), "b fresh")
	_, ok := b.reg.Snapshot().PickNew([]byte("k"))
	truth(t, ok)
	_, ok = a.reg.Snapshot().Serving(1)
	truth(t, ok, "a still routes CIDs")
	equal(t, b.errorsLogged(), 0)

	// a recovers.
	a.write(fileB)
	a.waitPolls(2)
	truth(t, !a.reg.Stale(), "a fresh again")
}

func TestStatic(t *testing.T) {
	bs := Static{{Ordinal: 1, Addr: ap("10.0.0.1:5684")}}
	run := func(u Updater) (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- bs.Run(ctx, u) }()
		return cancel, done
	}

	// With a freshness limit it keeps confirming, so it never goes stale.
	r, err := New(Config{MaxAge: 4 * time.Millisecond, Logger: quietLogger()})
	noErr(t, err)
	defer r.Close()
	cancel, done := run(r)
	waitFor(t, func() bool { return r.Stats().Confirmations >= 3 })
	equal(t, r.Snapshot().Len(), 1)
	cancel()
	noErr(t, <-done)

	// Freshness off, or an Updater without MaxAge: published, then idle.
	for _, u := range []Updater{&recUpdater{Registry: newQuiet(t, 0)}, struct{ Updater }{newQuiet(t, 0)}} {
		cancel, done := run(u)
		waitFor(t, func() bool {
			var r *Registry
			switch u := u.(type) {
			case *recUpdater:
				r = u.Registry
			case struct{ Updater }:
				r = u.Updater.(*Registry)
			}
			return r.Snapshot().Len() == 1
		})
		cancel()
		noErr(t, <-done)
	}

	// Invalid: Run returns the error at once.
	err = Static{{Ordinal: 255, Addr: ap("10.0.0.1:1")}}.Run(context.Background(), newQuiet(t, 0))
	isErr(t, err, ErrReservedOrdinal)
	truth(t, Static(nil).Run(context.Background(), nil) != nil, "nil Updater")
}

func newQuiet(t *testing.T, maxAge time.Duration) *Registry {
	r, _ := newTestRegistry(t, maxAge)
	return r
}

func (h logCounter) lastErr() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var last error
	for _, r := range *h.recs {
		r.Attrs(func(a slog.Attr) bool {
			if e, ok := a.Value.Any().(error); ok && a.Key == "err" {
				last = e
			}
			return true
		})
	}
	if last == nil {
		return errors.New("no error logged")
	}
	return last
}

// TestFileRejectionsCounted: every file the source cannot publish counts as
// a rejected update, once per distinct content, whether the registry
// refused the list or it never became one (syntax, unknown key, ordinal
// 255), and is logged once; the previous snapshot stays.
func TestFileRejectionsCounted(t *testing.T) {
	h := startFile(t, fileA, 0)
	good := h.reg.Snapshot()
	for i, bad := range []string{
		`[{"ordinal":`,
		`[{"ordinal":0,"adress":"10.0.0.1:5684"}]`,
		`[{"ordinal":255,"address":"10.0.0.1:5684"}]`,
		`[{"ordinal":0,"address":"10.0.0.1:5684"},{"ordinal":0,"address":"10.0.0.2:5684"}]`,
		`[]`,
		`null`,
		"[" + strings.Repeat(" ", maxFileSize) + "]",
	} {
		h.write(bad)
		h.pollUntil("rejection counted", func() bool { return h.reg.Stats().Rejections >= uint64(i+1) })
		h.waitPolls(3)
		equal(t, h.reg.Stats().Rejections, uint64(i+1), "counted once: %.40s", bad)
		equal(t, h.errorsLogged(), i+1, "logged once: %.40s", bad)
		truth(t, h.reg.Snapshot() == good, "the previous list stays")
	}
	// Read errors are rejections too, once per distinct error.
	noErr(t, os.Remove(h.path))
	h.pollUntil("missing file counted", func() bool { return h.reg.Stats().Rejections == 8 })
	h.waitPolls(3)
	equal(t, h.reg.Stats().Rejections, uint64(8))
	// A reload reads (and counts) again.
	h.f.Reload()
	h.pollUntil("reload counted", func() bool { return h.reg.Stats().Rejections == 9 })
}

// TestStaticTinyMaxAge: a static source confirms at most once a
// millisecond, whatever the freshness limit (a 1ns ticker spun a CPU).
func TestStaticTinyMaxAge(t *testing.T) {
	u := &tinyAge{}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	noErr(t, Static{{Ordinal: 1, Addr: ap("10.0.0.1:5684")}}.Run(ctx, u))
	truth(t, u.confirms.Load() <= 150, "%d confirmations in 100ms", u.confirms.Load())
}

// tinyAge is an Updater whose registry claims a 4ns MaxAge.
type tinyAge struct{ confirms atomic.Int64 }

func (u *tinyAge) Update([]Backend) error { return nil }
func (u *tinyAge) Confirm()               { u.confirms.Add(1) }
func (u *tinyAge) MaxAge() time.Duration  { return 4 }

// TestFileHungRead: a read that never returns (a hung network mount) is
// abandoned after ReadTimeout, reported and counted; no second read starts
// while it hangs, and Run returns as soon as it is cancelled.
func TestFileHungRead(t *testing.T) {
	release := make(chan struct{})
	var reads atomic.Int64
	logs := newLogCounter()
	r, _ := newTestRegistry(t, 0)
	f := &File{Path: "/hung/backends.json", Interval: time.Millisecond, ReadTimeout: 20 * time.Millisecond, Logger: logs.logger()}
	f.read = func(string) ([]byte, error) {
		reads.Add(1)
		<-release
		return []byte(fileA), nil
	}
	stop := runFile(f, r)
	defer close(release)
	// Timed out, then still blocked; the count comes before the log line.
	waitFor(t, func() bool { return r.Stats().Rejections == 2 && logs.count(slog.LevelError) == 2 })
	time.Sleep(50 * time.Millisecond) // more polls
	equal(t, r.Stats().Rejections, uint64(2))
	equal(t, logs.count(slog.LevelError), 2)
	equal(t, reads.Load(), int64(1), "one stuck read at a time")
	stop(t)
}

// runFile runs f in the background; stop cancels it and requires Run to
// return nil within 2 s, whatever the file is doing.
func runFile(f *File, u Updater) (stop func(t *testing.T)) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, u) }()
	return func(t *testing.T) {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			noErr(t, err)
		case <-time.After(2 * time.Second):
			t.Fatal("Run did not return within 2 s of cancel")
		}
	}
}
