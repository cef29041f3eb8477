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
// entries expire.

// Transparent-mode defaults.
const (
	DefaultMaxSessions = 65536
	DefaultSessionIdle = 2 * time.Minute
	// sessionBuffer is each session's receive buffer. Replies larger than
	// this are dropped as malformed; 2 KiB keeps a session small while
	// holding any datagram a DTLS or QUIC stack sends at Ethernet MTU.
	sessionBuffer = 2048
)

// sessionTable is one worker's transparent sessions, keyed by client
// address. The forward goroutine adds and uses entries; the sweeper expires
// them; each session's goroutine relays replies.
type sessionTable struct {
	w        *worker
	max      int
	idle     int64 // ns
	mu       sync.Mutex
	sessions map[netip.AddrPort]*session
	count    atomic.Int64
	now      atomic.Int64 // coarse clock, advanced by the sweeper
	wg       sync.WaitGroup
	stop     chan struct{}
}

type session struct {
	client  netip.AddrPort
	backend netip.AddrPort
	conn    *net.UDPConn
	seen    atomic.Int64 // coarse time of the last datagram either way
}

func newSessionTable(w *worker, sc Service) *sessionTable {
	t := &sessionTable{w: w, max: sc.MaxSessions, idle: int64(sc.SessionIdle),
		sessions: map[netip.AddrPort]*session{}, stop: make(chan struct{})}
	if t.max == 0 {
		t.max = DefaultMaxSessions
	}
	if t.idle == 0 {
		t.idle = int64(DefaultSessionIdle)
	}
	t.now.Store(time.Now().UnixNano())
	return t
}

// send forwards a routed batch, each datagram (to out[i].Addr) on the
// session of clients[i].
func (t *sessionTable) send(out []udpio.Message, clients []netip.AddrPort, c *Counters) {
	now := t.now.Load()
	for i := range out {
		m := &out[i]
		s, reason := t.session(clients[i], m.Addr, now)
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
func (t *sessionTable) session(client, backend netip.AddrPort, now int64) (*session, Reason) {
	t.mu.Lock()
	defer t.mu.Unlock()
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
	if err != nil {
		return nil, SendError
	}
	s = &session{client: client, backend: backend, conn: conn}
	s.seen.Store(now)
	t.sessions[client] = s
	t.count.Store(int64(len(t.sessions)))
	t.wg.Go(func() { t.relay(s) })
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
// datagrams from anyone but the backend.
func (t *sessionTable) relay(s *session) {
	buf := make([]byte, sessionBuffer)
	svc := t.w.inConn
	rev := &t.w.rev
	for {
		n, _, flags, _, err := s.conn.ReadMsgUDPAddrPort(buf, nil)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue // an ICMP error for an earlier send; not a datagram
			}
			return
		}
		rev.received.Add(1)
		s.seen.Store(t.now.Load())
		if flags&msgTrunc != 0 {
			rev.dropped[Malformed].Add(1)
			continue
		}
		if _, err := svc.WriteToUDPAddrPort(buf[:n], s.client); err != nil {
			rev.dropped[SendError].Add(1)
			continue
		}
		rev.forwarded.Add(1)
	}
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

// close ends every session and waits for their goroutines.
func (t *sessionTable) close() {
	close(t.stop)
	t.mu.Lock()
	for _, s := range t.sessions {
		t.drop(s)
	}
	t.mu.Unlock()
	t.wg.Wait()
}
