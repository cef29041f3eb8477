package cidroute

import "fmt"

// A WaitMode says how a Pipeline's workers wait for datagrams.
type WaitMode uint8

const (
	// WaitNetpoller parks each loop's goroutine on Go's netpoller when its
	// socket has nothing to read, holding no OS thread. The default: it
	// suits a Pipeline embedded beside other work, and any number of
	// services.
	WaitNetpoller WaitMode = iota
	// WaitThread runs each worker in a goroutine that blocks an OS thread
	// in epoll_wait for both of the worker's sockets (udpio.Poller), the
	// service socket and, in PPv2 mode, the upstream socket, and serves
	// whichever has datagrams: one wait per wake-up, whichever direction
	// woke it, no handoff between threads, and the sockets out of Go's
	// netpoller (udpio.Conn.Detach), whose own waiting thread would
	// otherwise wake for every datagram too. Below saturation, where a
	// wake-up brings a datagram or two, that wake-up is most of a
	// datagram's cost. It holds one thread per worker for the Pipeline's
	// life, and Run raises GOMAXPROCS above their number so that a thread
	// returning from the kernel always finds a P (with too few, blocked
	// threads hand the Ps around through sysmon, in millisecond stalls).
	// While datagrams keep coming the goroutine yields every 5 ms, so
	// that sysmon never takes it for one running too long (yieldEvery).
	// The goroutine is not locked to its thread, so that a yield needs
	// no second thread to hand its P back (docs/performance.md).
	// One thread rather than one per direction: on the independent
	// benchmark a thread per direction, each in its own epoll set, locked
	// or not, had no better p99 at 50k/s and cost more flat out (0.89–0.91×
	// raw's CPU against 0.82–0.83×, docs/performance.md).
	// A transparent worker's sessions still relay on the netpoller.
	// Linux only; elsewhere workers use the netpoller.
	WaitThread
)

// String returns "netpoller" or "thread", or "invalid".
func (m WaitMode) String() string {
	switch m {
	case WaitNetpoller:
		return "netpoller"
	case WaitThread:
		return "thread"
	}
	return "invalid"
}

// MarshalText implements encoding.TextMarshaler ("netpoller", "thread").
func (m WaitMode) MarshalText() ([]byte, error) {
	if m > WaitThread {
		return nil, fmt.Errorf("cidroute: wait mode %d: %w", m, ErrConfig)
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler ("netpoller", "thread").
func (m *WaitMode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "netpoller":
		*m = WaitNetpoller
	case "thread":
		*m = WaitThread
	default:
		return fmt.Errorf("cidroute: wait %q: want \"netpoller\" or \"thread\": %w", b, ErrConfig)
	}
	return nil
}
