package registry

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var errNilUpdater = errors.New("registry: nil Updater")

// Updater receives a source's view of the backends. *Registry implements
// it; wrappers (to fan out, or to log) may too, and should embed the
// *Registry, or forward its MaxAge and Reject methods, which sources look
// for: MaxAge to pace confirmations, Reject to count an update that failed
// before it became a list.
type Updater interface {
	// Update replaces the whole backend list. It validates and copies bs;
	// an error leaves the previous list in place.
	Update(bs []Backend) error
	// Confirm says the source still stands by the current list.
	Confirm()
}

// rejecter is implemented by Updaters that count updates a source could
// not even decode (as *Registry does with Reject); sources that can fail
// that way call it through reject.
type rejecter interface{ Reject() }

func reject(u Updater) {
	if r, ok := u.(rejecter); ok {
		r.Reject()
	}
}

// A Source discovers a service's backends and reports them to an Updater.
// Run calls u.Update with the whole list whenever it changes and u.Confirm
// whenever it has checked that nothing changed, so that a registry with a
// freshness limit stays fresh exactly as long as the source is alive and in
// touch with its origin (a watch-based source, like the Kubernetes one,
// confirms while its watch is healthy: on resyncs or bookmarks). Run
// returns nil when ctx is done, or an error earlier if it cannot work at
// all. Implement it to plug in Consul, etcd, DNS or anything else.
type Source interface {
	// Run feeds u until ctx is done, as described above.
	Run(ctx context.Context, u Updater) error
}

// SourceFunc adapts a function to a Source.
type SourceFunc func(ctx context.Context, u Updater) error

// Run calls f(ctx, u).
func (f SourceFunc) Run(ctx context.Context, u Updater) error { return f(ctx, u) }

var (
	_ Source = SourceFunc(nil)
	_ Source = Static(nil)
	_ Source = (*File)(nil)
)

// Static is a fixed backend list, from configuration. Run publishes it once
// (returning the validation error if it is invalid) and then confirms it
// until ctx is done, because a fixed list cannot go stale: every MaxAge/4
// (but at most once a millisecond) when u has a MaxAge method (as
// *Registry does), once a second otherwise, never when MaxAge is 0.
type Static []Backend

// Run implements Source.
func (s Static) Run(ctx context.Context, u Updater) error {
	if u == nil {
		return errNilUpdater
	}
	if err := u.Update(s); err != nil {
		return fmt.Errorf("static source: %w", err)
	}
	every := time.Second
	if m, ok := u.(interface{ MaxAge() time.Duration }); ok {
		maxAge := m.MaxAge()
		if maxAge <= 0 {
			<-ctx.Done()
			return nil
		}
		every = max(maxAge/4, MinMaxAge)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			u.Confirm()
		}
	}
}
