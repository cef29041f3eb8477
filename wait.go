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
	// WaitBlocking runs each worker's forward loop, and in PPv2 mode its
	// reply loop, on an OS thread of its own, blocked in recvmmsg until a
	// datagram arrives (udpio.Conn.SetBlocking). One syscall per batch
	// instead of the netpoller's would-block, epoll_wait and thread
	// handoff: below saturation, where a batch holds a datagram or two,
	// that is most of the proxy's own CPU per datagram. It holds those
	// threads for the Pipeline's life, and Run raises GOMAXPROCS above
	// their number so that a thread returning from the kernel always finds
	// a P (with too few, locked threads hand the Ps around through sysmon,
	// in millisecond stalls). Linux only; elsewhere workers use the
	// netpoller.
	WaitBlocking
)

func (m WaitMode) String() string {
	switch m {
	case WaitNetpoller:
		return "netpoller"
	case WaitBlocking:
		return "blocking"
	}
	return "invalid"
}

// MarshalText implements encoding.TextMarshaler ("netpoller", "blocking").
func (m WaitMode) MarshalText() ([]byte, error) {
	if m > WaitBlocking {
		return nil, fmt.Errorf("cidroute: wait mode %d: %w", m, ErrConfig)
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler ("netpoller", "blocking").
func (m *WaitMode) UnmarshalText(b []byte) error {
	switch string(b) {
	case "netpoller":
		*m = WaitNetpoller
	case "blocking":
		*m = WaitBlocking
	default:
		return fmt.Errorf("cidroute: wait %q: want \"netpoller\" or \"blocking\": %w", b, ErrConfig)
	}
	return nil
}
