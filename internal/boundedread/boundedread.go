// Package boundedread reads small configuration files so that the file
// cannot block its reader: regular files only, up to a size limit, within a
// timeout, and never a second read while an abandoned one is still stuck.
// A FIFO, a device or a hung network mount named by a configuration would
// otherwise hold a goroutine (and the shutdown waiting for it) forever.
package boundedread

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"
)

// Errors, wrapped with the path or the timeout.
var (
	ErrNotRegular = errors.New("not a regular file")
	ErrTooLarge   = errors.New("file too large")
	ErrTimeout    = errors.New("read did not finish in time")
	ErrBlocked    = errors.New("an earlier read of the file is still blocked")
)

// Regular reads the regular file at path, at most limit bytes. The open
// does not wait for a writer (O_NONBLOCK where the system has it), so a
// FIFO is refused at once, as is anything else that is not a regular file.
func Regular(path string, limit int64) ([]byte, error) {
	return RegularFunc(path, limit, nil)
}

// RegularFunc is Regular with check, when not nil, run on the opened
// file's information before anything is read (a key file's mode): the
// file checked is the file read, whatever happens to the name meanwhile.
func RegularFunc(path string, limit int64, check func(fs.FileInfo) error) ([]byte, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w (%s, mode %04o)", path, ErrNotRegular, TypeName(fi.Mode()), fi.Mode().Perm())
	}
	if check != nil {
		if err := check(fi); err != nil {
			return nil, err
		}
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: %w: %d bytes, limit %d", path, ErrTooLarge, fi.Size(), limit)
	}
	// The size can change, and some files (procfs) report 0.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: %w: more than %d bytes", path, ErrTooLarge, limit)
	}
	return data, nil
}

// A Guard runs reads with a timeout. A read that overruns it is abandoned:
// a read blocked in the kernel cannot be interrupted, and its goroutine
// ends when the syscall does. Until then the Guard starts no other read
// (ErrBlocked), so a stuck mount costs one goroutine, not one per poll. The
// zero value is ready; a Guard is for one goroutine at a time.
type Guard struct {
	stuck chan struct{} // closed when the abandoned read returns
}

// Do runs read and returns its result, or ErrTimeout once timeout has
// passed (no limit when it is 0 or less), or ctx's error when ctx is done
// first.
func (g *Guard) Do(ctx context.Context, timeout time.Duration, read func() ([]byte, error)) ([]byte, error) {
	if g.stuck != nil {
		select {
		case <-g.stuck:
			g.stuck = nil
		default:
			return nil, ErrBlocked
		}
	}
	type result struct {
		data []byte
		err  error
	}
	res := make(chan result, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		data, err := read()
		res <- result{data, err}
	}()
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case r := <-res:
		return r.data, r.err
	case <-expired:
		g.stuck = finished
		return nil, fmt.Errorf("%w (%v)", ErrTimeout, timeout)
	case <-ctx.Done():
		g.stuck = finished
		return nil, ctx.Err()
	}
}

// Read is Regular under a Guard of its own, for a one-off read.
func Read(ctx context.Context, path string, limit int64, timeout time.Duration) ([]byte, error) {
	var g Guard
	data, err := g.Do(ctx, timeout, func() ([]byte, error) { return Regular(path, limit) })
	if errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return data, err
}

// TypeName names the type of a file that is not a regular one: "a
// directory", "a FIFO" ... (FileMode's String prints a directory's type
// as "d---------").
func TypeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "a special file"
}
