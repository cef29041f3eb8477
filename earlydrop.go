package cidroute

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// earlyDrop keeps one service socket's socket filter (Service.EarlyDrop,
// udpio.Filter) in step with the registry: rebuilt for every new
// snapshot, by the worker when a batch shows it one and by the
// Pipeline's watcher for a worker that gets nothing to read (the filter
// would drop the datagrams that could tell it).
type earlyDrop struct {
	conn     syscall.Conn
	backends Backends
	cidLen   int
	mu       sync.Mutex                        // one attach at a time
	built    atomic.Pointer[registry.Snapshot] // what the attached filter was built from
}

// newEarlyDrop checks that the router's rules are the ones the filter
// mirrors: DTLS, the built-in classifier, the ordinal-first codec.
func newEarlyDrop(conn syscall.Conn, r *Router) (*earlyDrop, error) {
	_, ordFirst := r.codec.(dtls.OrdinalFirst)
	if _, ok := r.cls.(DTLSClassifier); !ok || !ordFirst {
		return nil, fmt.Errorf("early drop: a DTLS service with the built-in classifier and the ordinal-first codec only: %w", ErrConfig)
	}
	return &earlyDrop{conn: conn, backends: r.backends, cidLen: r.codec.Len()}, nil
}

// sync attaches the filter of the registry's current snapshot unless it
// is attached already. On failure it removes the filter: a filter out of
// step could drop a datagram that routes.
func (e *earlyDrop) sync() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	snap := e.backends.Snapshot() // the newest, under mu
	if snap == e.built.Load() {
		return nil
	}
	f := udpio.Filter{CIDLen: e.cidLen}
	for o := range 255 {
		_, f.Routable[o] = snap.Serving(uint8(o))
	}
	if err := udpio.AttachFilter(e.conn, &f); err != nil {
		e.built.Store(nil)
		return errors.Join(fmt.Errorf("early drop: %w", err), udpio.AttachFilter(e.conn, nil))
	}
	e.built.Store(snap)
	return nil
}

// stale reports whether snap is not what the filter was built from.
func (e *earlyDrop) stale(snap *registry.Snapshot) bool { return e != nil && snap != e.built.Load() }
