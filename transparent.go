package cidroute

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

// Transparent mode serves backends that cannot read PROXY protocol: each
// client address gets its own upstream socket, connected to the backend the
// routing table chose, so the backend sees a distinct source per client and
// the kernel accepts replies on it only from that backend. Datagrams go
// through unchanged. Routing is exactly the PPv2 mode's; only the state
// differs, and it is bounded: at most MaxSessions entries, each expiring
// after SessionIdle without traffic in either direction. When the table is
// full, datagrams of new client addresses are dropped (SessionLimit) rather
// than evicting a live session: under a flood of spoofed sources, eviction
// would cut established sessions, refusal only delays new ones until idle
// entries expire. A CID client that rebinds is a new address too, so a full
// table also holds it back until an entry expires; size MaxSessions for the
// clients plus their rebinds within SessionIdle.

// Transparent-mode defaults.
const (
	DefaultMaxSessions = 65536
	DefaultSessionIdle = 2 * time.Minute
)

// A session costs one socket (fd), one relay goroutine and its receive
// buffer of Config.MaxDatagram bytes: about 14 KB with the default 9216,
// measured in examples/e2e (BenchmarkTransparentSessions). Lower
// MaxDatagram to shrink it.

// sessionTable is one worker's transparent sessions, keyed by client
// address. The forward goroutine adds and uses entries; the sweeper expires
// them; each session's goroutine relays replies.
type sessionTable struct {
	w        *worker
	max      int
	idle     int64 // ns
	bufSize  int
	mu       sync.Mutex
	closed   bool // under mu: no session opens after close
	sessions map[netip.AddrPort]*session
	count    atomic.Int64
	now      atomic.Int64 // coarse clock, advanced by the sweeper
	wg       sync.WaitGroup
	stop     chan struct{}

	// Replies go out through the worker's batch writer on the service
	// socket (one datagram per call), which sets the source address the
	// client used when the service listens on a wildcard address.
	replyMu  sync.Mutex
	replyOut [1]udpio.Message
}

type session struct {
	client  netip.AddrPort
	local   netip.Addr // the address the client sent to (wildcard listeners)
	backend netip.AddrPort
	conn    *net.UDPConn
	seen    atomic.Int64 // coarse time of the last datagram either way
}

func newSessionTable(w *worker, sc Service, maxDatagram int) *sessionTable {
	t := &sessionTable{w: w, max: sc.MaxSessions, idle: int64(sc.SessionIdle), bufSize: maxDatagram,
		sessions: map[netip.AddrPort]*session{}, stop: make(chan struct{})}
	if t.max == 0 {
		t.max = DefaultMaxSessions
	}
	if t.idle == 0 {
		t.idle = int64(DefaultSessionIdle)
	}
	t.now.Store(time.Now().UnixNano())
	t.wg.Add(1)
	go func() { defer t.wg.Done(); t.sweep() }()
	return t
}

// send forwards a routed batch, each datagram (to out[i].Addr) on the
// session of clients[i], who sent it to locals[i].
func (t *sessionTable) send(out []udpio.Message, clients []netip.AddrPort, locals []netip.Addr, c *Counters) {
	now := t.now.Load()
	for i := range out {
		m := &out[i]
		s, reason := t.session(clients[i], locals[i], m.Addr, now)
		if reason != Forwarded {
			c.Dropped[reason]++
			continue
		}
		if _, err := s.conn.Write(m.Buf); err != nil {
			c.Dropped[SendError]++
			continue
		}
		c.Forwarded++
	}
}

// session returns the session of client towards backend, opening one (and
// closing a session of the same client towards another backend: a NAT may
// hand a client's old address to another client).
func (t *sessionTable) session(client netip.AddrPort, local netip.Addr, backend netip.AddrPort, now int64) (*session, Reason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, SendError // shutting down
	}
	s := t.sessions[client]
	if s != nil && s.backend == backend {
		s.seen.Store(now)
		return s, Forwarded
	}
	if s != nil {
		t.drop(s)
	}
	if len(t.sessions) >= t.max {
		return nil, SessionLimit
	}
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(backend))
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return nil, SessionLimit // out of file descriptors: a limit too
	}
	if err != nil {
		return nil, SendError
	}
	s = &session{client: client, local: local, backend: backend, conn: conn}
	s.seen.Store(now)
	t.sessions[client] = s
	t.count.Store(int64(len(t.sessions)))
	t.wg.Add(1)
	go func() { defer t.wg.Done(); t.relay(s) }()
	return s, Forwarded
}

// drop closes s; its relay goroutine ends. The caller holds mu.
func (t *sessionTable) drop(s *session) {
	delete(t.sessions, s.client)
	t.count.Store(int64(len(t.sessions)))
	s.conn.Close()
}

// relay sends the backend's replies on s to its client from the service
// socket. The socket is connected, so the kernel has already discarded
// datagrams from anyone but the backend; a backend that has left the
// registry is not relayed, as in PPv2 mode.
func (t *sessionTable) relay(s *session) {
	buf := make([]byte, t.bufSize)
	rev := &t.w.rev
	backends := t.w.svc.router.backends
	errs := 0
	for {
		n, _, flags, _, err := s.conn.ReadMsgUDPAddrPort(buf, nil)
		if err != nil {
			var errno syscall.Errno
			if errs++; errors.As(err, &errno) && errs < 64 {
				// An ICMP error (port unreachable, host unreachable,
				// administratively prohibited) for an earlier send: the
				// session goes on, as the client's next datagram may.
				continue
			}
			t.remove(s) // closed, or a socket that keeps failing
			return
		}
		errs = 0
		rev.received.Add(1)
		s.seen.Store(t.now.Load())
		switch {
		case flags&msgTrunc != 0:
			rev.dropped[Malformed].Add(1)
		case !backends.Snapshot().IsBackend(s.backend):
			rev.dropped[UntrustedSender].Add(1)
		case t.reply(buf[:n], s) != nil:
			rev.dropped[SendError].Add(1)
		default:
			rev.forwarded.Add(1)
		}
	}
}

// reply sends b to s's client from the address it sent to.
func (t *sessionTable) reply(b []byte, s *session) error {
	t.replyMu.Lock()
	defer t.replyMu.Unlock()
	m := &t.replyOut[0]
	m.Buf, m.Addr, m.Local, m.Prefix = b, s.client, s.local, nil
	_, err := t.w.in.WriteBatch(t.replyOut[:])
	if err == nil {
		err = m.Err
	}
	m.Buf = nil
	return err
}

// remove drops s if it is still the client's session.
func (t *sessionTable) remove(s *session) {
	t.mu.Lock()
	if t.sessions[s.client] == s {
		t.drop(s)
	}
	t.mu.Unlock()
}

// sweep advances the coarse clock and expires idle sessions until close.
func (t *sessionTable) sweep() {
	tick := time.NewTicker(min(time.Second, time.Duration(t.idle)/4))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			ns := now.UnixNano()
			t.now.Store(ns)
			t.mu.Lock()
			for _, s := range t.sessions {
				if ns-s.seen.Load() > t.idle {
					t.drop(s)
				}
			}
			t.mu.Unlock()
		}
	}
}

// close ends every session and the sweeper, and waits for their
// goroutines. The forward loop must have returned; sessions it would still
// ask for are refused anyway.
func (t *sessionTable) close() {
	t.mu.Lock()
	done := t.closed
	t.mu.Unlock()
	if done {
		return
	}
	close(t.stop)
	t.mu.Lock()
	t.closed = true
	for _, s := range t.sessions {
		t.drop(s)
	}
	t.mu.Unlock()
	t.wg.Wait()
}
