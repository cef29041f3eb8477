//go:build !linux

package udpio

import "fmt"

// A Poller is not supported on this platform: Conns cannot be detached,
// and wait on the netpoller.
type Poller struct{}

// NewPoller returns an error wrapping ErrNotSupported.
func NewPoller(conns ...*Conn) (*Poller, error) {
	return nil, fmt.Errorf("poller: %w", ErrNotSupported)
}

// Wait returns an error wrapping ErrNotSupported.
func (p *Poller) Wait(ready []bool) (woken bool, err error) {
	return false, fmt.Errorf("poller: %w", ErrNotSupported)
}

// Wake returns an error wrapping ErrNotSupported.
func (p *Poller) Wake() error { return fmt.Errorf("poller: %w", ErrNotSupported) }

// Close does nothing.
func (p *Poller) Close() error { return nil }
