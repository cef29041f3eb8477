package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cidroute/cidroute/internal/boundedread"
)

// ErrFileTooLarge reports a backend file over 1 MiB (255 backends take a few
// tens of kilobytes).
var ErrFileTooLarge = errors.New("registry: backend file larger than 1 MiB")

const maxFileSize = 1 << 20

// DefaultReadTimeout bounds one read of a backend file when
// File.ReadTimeout is 0.
const DefaultReadTimeout = 5 * time.Second

// File is a Source that reads a JSON backend list (the format of
// DecodeBackends) from Path. It reads the file when Run starts, then every
// Interval and on Reload. A file whose bytes changed is decoded and passed
// to Update; an unchanged file that was accepted is confirmed. The file is
// small, so it is read and compared whole each time rather than trusted to
// a coarse mtime.
//
// A file that cannot be read or decoded, or whose list Update rejects,
// leaves the previous backends in place, is counted as a rejected update
// (through the Updater's Reject method when the list never got to Update)
// and is logged, once per change of the file (or of the read error), not
// on every poll; a Reload counts and logs it again. Such a file is not a
// confirmation: if it stays bad past the registry's MaxAge, the registry
// turns stale, as it should when the source of truth is unreadable.
//
// Reads are bounded so that no file can stall the source or its shutdown:
// only a regular file is read (a FIFO or a device is refused without
// waiting for a writer), at most 1 MiB, within ReadTimeout. A read that
// overruns (a hung network mount) is abandoned and reported, and no other
// starts until it returns; Run still returns as soon as ctx is done.
//
// Replace the file atomically (write a temporary file, then rename it over
// Path) so that a poll never reads half of it; a half-written file is only
// logged and retried, though.
//
// The fields must not change once Run has started, and a File runs at most
// once at a time. Reload is safe to call from any goroutine.
type File struct {
	Path        string        // the JSON backend list to poll
	Interval    time.Duration // polling period; 0 means 1s, at least 1ms
	ReadTimeout time.Duration // bound on one read; 0 means DefaultReadTimeout
	Logger      *slog.Logger  // nil means slog.Default()

	once   sync.Once
	reload chan struct{}

	afterPoll func()                            // tests: called after every poll
	read      func(path string) ([]byte, error) // tests: replaces readFile
}

func (f *File) init() { f.once.Do(func() { f.reload = make(chan struct{}, 1) }) }

// Reload asks a running (or the next) Run to read the file now, even if its
// bytes have not changed, and to log a failure again. It does not wait.
// Wire it to SIGHUP.
func (f *File) Reload() {
	f.init()
	select {
	case f.reload <- struct{}{}:
	default: // a reload is already pending
	}
}

// Run implements Source. It returns nil when ctx is done, and an error only
// for a missing Path or a nil Updater; file errors are logged and retried.
func (f *File) Run(ctx context.Context, u Updater) error {
	if u == nil {
		return errNilUpdater
	}
	if f.Path == "" {
		return errors.New("registry: File source without a Path")
	}
	f.init()
	interval := f.Interval
	if interval <= 0 {
		interval = time.Second
	}
	interval = max(interval, MinMaxAge) // a tiny period would spin
	log := f.Logger
	if log == nil {
		log = slog.Default()
	}
	st := filePoller{path: f.Path, u: u, log: log.With("path", f.Path), read: f.read, timeout: f.ReadTimeout}
	if st.read == nil {
		st.read = readFile
	}
	if st.timeout <= 0 {
		st.timeout = DefaultReadTimeout
	}
	st.poll(ctx, false)
	f.polled()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			st.poll(ctx, false)
		case <-f.reload:
			st.poll(ctx, true)
		}
		f.polled()
	}
}

func (f *File) polled() {
	if f.afterPoll != nil {
		f.afterPoll()
	}
}

// filePoller is the state of one File.Run.
type filePoller struct {
	path    string
	u       Updater
	log     *slog.Logger
	read    func(path string) ([]byte, error)
	timeout time.Duration
	guard   boundedread.Guard

	last     []byte // the last bytes read
	haveLast bool
	lastOK   bool   // whether last was accepted
	readErr  string // the last read error reported, "" after a good read
}

func (p *filePoller) poll(ctx context.Context, forced bool) {
	data, err := p.guard.Do(ctx, p.timeout, func() ([]byte, error) { return p.read(p.path) })
	if ctx.Err() != nil {
		return // stopping; an abandoned read is no rejection
	}
	if err != nil {
		// Keep last: a file that briefly vanishes and comes back unchanged
		// is confirmed, not republished.
		if msg := err.Error(); forced || msg != p.readErr {
			p.readErr = msg
			reject(p.u)
			p.log.Error("cannot read backend file; keeping the previous backends", "err", err)
		}
		return
	}
	p.readErr = ""
	if !forced && p.haveLast && bytes.Equal(data, p.last) {
		if p.lastOK {
			p.u.Confirm()
		}
		return
	}
	p.last, p.haveLast = data, true
	// Validation is left to Update, so that the registry counts the
	// rejection; a list that does not even decode is counted here.
	bs, err := decodeList(bytes.NewReader(data))
	if err != nil {
		reject(p.u)
	} else {
		err = p.u.Update(bs)
	}
	p.lastOK = err == nil
	if err != nil {
		p.log.Error("bad backend file; keeping the previous backends", "err", err)
		return
	}
	p.log.Info("backend file loaded", "backends", len(bs))
}

func readFile(path string) ([]byte, error) {
	data, err := boundedread.Regular(path, maxFileSize)
	if errors.Is(err, boundedread.ErrTooLarge) {
		return nil, fmt.Errorf("%s: %w", path, ErrFileTooLarge)
	}
	return data, err
}
