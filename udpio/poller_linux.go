//go:build linux

package udpio

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// A Poller waits on the calling OS thread until one of its Conns has
// datagrams queued, in epoll_wait, or until Wake: the wait of a loop that
// serves several detached Conns from one goroutine, which blocks its
// thread in the wait, as a worker serving its service socket and its
// upstream socket does.
// One thread per worker and one wait per wake-up, whichever socket woke
// it: no thread handoff, no netpoller.
//
// Wait must not be called concurrently with itself; Wake may be called
// from any goroutine, at any time. A loop that waits here never blocks
// in Go, so the runtime never reschedules it, and after 10 ms the
// runtime's sysmon takes it for one running too long: it takes the
// thread's P at its syscalls and polls every 20 µs, on the loop's CPU.
// While datagrams keep coming, yield (runtime.Gosched) every few
// milliseconds, as cidroute's workers do.
type Poller struct {
	ep, ev int // the epoll set, and the eventfd Wake writes
	conns  []*Conn
	events []unix.EpollEvent
}

// evIndex marks the eventfd among the epoll events.
const evIndex = -1

// NewPoller returns a Poller over conns, which must be detached
// (Conn.Detach).
func NewPoller(conns ...*Conn) (*Poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("udpio: epoll: %w", err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("udpio: eventfd: %w", err)
	}
	p := &Poller{ep: ep, ev: ev, conns: conns, events: make([]unix.EpollEvent, len(conns)+1)}
	add := func(fd, index int) error {
		e := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(index)} // level-triggered
		return unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &e)
	}
	err = add(ev, evIndex)
	for i, c := range conns {
		if err != nil {
			break
		}
		if c.fd == nil {
			err = errors.New("conn not detached")
			break
		}
		var aerr error
		if err = c.fd.Control(func(fd uintptr) { aerr = add(int(fd), i) }); err == nil {
			err = aerr
		}
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("udpio: poller: %w", err)
	}
	return p, nil
}

// Wait blocks until a Conn has datagrams queued or Wake was called, and
// sets ready[i] for each Conn i that has (ready has len(conns) entries).
// It returns woken true once Wake has been called, then and on every later
// call, at once. The sockets are level-triggered: a Conn read until it
// returned fewer datagrams than asked for, or ErrWouldBlock, and then
// given more by the kernel is reported again.
func (p *Poller) Wait(ready []bool) (woken bool, err error) {
	clear(ready)
	for {
		n, err := unix.EpollWait(p.ep, p.events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("udpio: epoll_wait: %w", err)
		}
		for _, e := range p.events[:n] {
			if e.Fd == evIndex {
				woken = true
			} else {
				ready[e.Fd] = true
			}
		}
		return woken, nil
	}
}

// Wake makes a Wait blocked now, and every later one, return woken.
func (p *Poller) Wake() error {
	var one [8]byte // an eventfd counter increment, in host order
	binary.NativeEndian.PutUint64(one[:], 1)
	if _, err := unix.Write(p.ev, one[:]); err != nil && err != unix.EAGAIN {
		return fmt.Errorf("udpio: wake: %w", err)
	}
	return nil
}

// Close releases the epoll set and the eventfd; the Conns stay open.
func (p *Poller) Close() error {
	return errors.Join(unix.Close(p.ep), unix.Close(p.ev))
}
