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
// flow (a client address and the backend its datagrams go to) gets its
// own upstream socket, connected to that backend, so the backend sees a
// distinct source per client and the kernel accepts replies on it only
// from that backend. Datagrams go through unchanged. Routing is exactly
// the PPv2 mode's; only the state differs, and it is bounded: at most
// MaxSessions entries per worker, each expiring after SessionIdle without
// traffic in either direction.
//
// A flow, not a client address, is the key: one client socket may hold
// sessions with two backends at once (quic-go's Transport runs several
// connections on one socket), and each keeps its own upstream socket.
//
// When the table is full, a new flow makes room by expiring early the
// sessions quiet the longest, oldest first, among those silent for at
// least a quarter of SessionIdle (counted: ServiceStats.SessionsEvicted);
// when there are none, its datagram is dropped (SessionLimit). So a flood
// of spoofed sources, each sending once, cannot hold the table for a whole
// SessionIdle, and it cannot evict a session that keeps talking. A CID
// client that rebinds is a new flow too; size MaxSessions for the clients
// plus their rebinds within SessionIdle.

// Transparent-mode defaults.
const (
	// DefaultMaxSessions caps the default size of a worker's table; the
	// default is smaller when RLIMIT_NOFILE is (see Service.MaxSessions).
	DefaultMaxSessions = 65536
	// DefaultSessionIdle is how long a session lives without a datagram
	// in either direction when Service.SessionIdle is 0.
	DefaultSessionIdle = 2 * time.Minute
	// DefaultSessionMemory is Service.SessionMemory's default: 256 MiB,
	// about 18,700 sessions of the default 9216-byte MaxDatagram.
	DefaultSessionMemory = 256 << 20
	// MinSessionIdle is the shortest SessionIdle New accepts: a session
	// that expires faster than a client's pause between datagrams is no
	// session, each expiry and re-creation costs a socket, and the expiry
	// ticker runs at a quarter of it (3ns made that 0 and panicked). 1 s is
	// far below any DTLS or QUIC idle timeout.
	MinSessionIdle = time.Second
)

// SessionBytes is what a transparent session holds in memory with a
// Config.MaxDatagram of maxDatagram (0: the default): its receive buffer,
// and a relay goroutine's stack and the session's state, about 5 KiB
// (examples/e2e's BenchmarkTransparentSessions measured 10.0–10.4 KB of
// heap and ~4 KB of stack a session with the default 9216; the kernel's
// ~3.8 KB for the socket are not in the process's memory). It also holds
// one file descriptor. Lower MaxDatagram to shrink it.
func SessionBytes(maxDatagram int) int {
	if maxDatagram == 0 {
		maxDatagram = DefaultMaxDatagram
	}
	return maxDatagram + 5<<10
}

// SessionsFit is how many transparent sessions each of workers may hold
// within a session memory of memory bytes (0: DefaultSessionMemory), at
// SessionBytes(maxDatagram) each: the bound New puts on MaxSessions.
func SessionsFit(memory int64, workers, maxDatagram int) int {
	if memory == 0 {
		memory = DefaultSessionMemory
	}
	return int(memory / (int64(SessionBytes(maxDatagram)) * int64(max(workers, 1))))
}

// fdReserve is how many file descriptors session tables leave for
// everything else a process needs besides the pipeline's own sockets: the
// metrics listener and its connections, reloads of a backends file, a
// Kubernetes client, logs, the runtime's poller. It is fdReserveMin or an
// eighth of the limit, whichever is larger.
func fdReserve(limit uint64) uint64 { return max(fdReserveMin, limit/8) }

const fdReserveMin = 64

// ReservedFDs returns how many of RLIMIT_NOFILE's descriptors a Pipeline
// leaves to the rest of the process when it sizes its session tables: a
// program fits what it opens beside the pipeline (an admin listener's
// connections, health probes) into it. ok is false where the process has
// no limit.
func ReservedFDs() (n int, ok bool) {
	limit, ok := fdLimit()
	if !ok {
		return 0, false
	}
	return int(min(fdReserve(limit), 1<<30)), true
}

// flow is a transparent session's key.
type flow struct{ client, backend netip.AddrPort }

// sessionTable is one worker's transparent sessions. The forward
// goroutine adds and uses entries; serve expires them; each session's
// goroutine relays its replies.
type sessionTable struct {
	rp        *replies
	max       int
	idle      int64 // ns
	evictions atomic.Uint64
	fullAt    int64 // under mu: the coarse time of the last scan that freed nothing
	bufSize   int
	mu        sync.Mutex
	closed    bool // under mu: no session opens after close
	table     map[flow]*session
	count     atomic.Int64
	now       atomic.Int64 // coarse clock, advanced by serve
	wg        sync.WaitGroup
	stop      chan struct{}
	stopOnce  sync.Once
	// dial opens a session's socket: dialBackend, or original-source
	// mode's dialOriginal.
	dial func(f flow) (*net.UDPConn, error)
}

type session struct {
	flow
	local netip.Addr // the address the client sent to (wildcard public addresses)
	conn  *net.UDPConn
	io    *udpio.Conn
	seen  atomic.Int64 // coarse time of the last datagram either way
}

func newSessionTable(rp *replies, maxSessions int, idle time.Duration, maxDatagram int) *sessionTable {
	t := &sessionTable{rp: rp, max: maxSessions, idle: int64(idle), bufSize: maxDatagram,
		table: map[flow]*session{}, stop: make(chan struct{}), dial: dialBackend}
	t.now.Store(time.Now().UnixNano())
	return t
}

// send forwards a routed batch, each datagram (to out[i].Addr) on the
// session of from[i].
func (t *sessionTable) send(out []udpio.Message, from []Session, c *Counters) error {
	now := t.now.Load()
	for i := range out {
		m := &out[i]
		s, reason := t.session(flow{from[i].Client, m.Addr}, from[i].Local, now)
		if reason != Forwarded {
			c.Dropped[reason]++
			continue
		}
		if _, err := s.conn.Write(m.Buf); err != nil {
			c.Dropped[sendReason(err)]++
			continue
		}
		c.Forwarded++
	}
	return nil
}

// session returns the session of f, opening one while the table has room.
func (t *sessionTable) session(f flow, local netip.Addr, now int64) (*session, Reason) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, SendError // shutting down
	}
	if s := t.table[f]; s != nil {
		s.seen.Store(now)
		return s, Forwarded
	}
	if len(t.table) >= t.max && !t.evictLocked(now) {
		return nil, SessionLimit
	}
	conn, err := t.dial(f)
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return nil, SessionLimit // out of file descriptors: a limit too
	}
	if err != nil {
		return nil, SendError
	}
	bio, err := udpio.NewConn(conn, 1)
	if err != nil {
		conn.Close()
		return nil, SendError
	}
	s := &session{flow: f, local: local, conn: conn, io: bio}
	s.seen.Store(now)
	t.table[f] = s
	t.count.Store(int64(len(t.table)))
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.relay(s)
	}()
	return s, Forwarded
}

// dialBackend is transparent mode's session socket: an ephemeral port of
// the proxy, connected to the backend.
func dialBackend(f flow) (*net.UDPConn, error) {
	return net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(f.backend))
}

// evictLocked makes room in a full table: it expires the sessions quiet
// the longest, those in the oldest quarter of the span between the
// oldest's last datagram and now, among the ones silent for at least a
// quarter of SessionIdle. One scan frees a share of the table, so a flood
// of new flows costs a scan per many sessions, not per datagram; a scan
// that freed nothing is not repeated until the coarse clock moves (no
// session grows quieter before it does). It reports whether it freed
// any. The caller holds mu.
func (t *sessionTable) evictLocked(now int64) bool {
	if t.fullAt == now {
		return false
	}
	quiet := now - t.idle/4 // sessions seen after it keep their place
	oldest := quiet + 1
	for _, s := range t.table {
		oldest = min(oldest, s.seen.Load())
	}
	if oldest > quiet {
		t.fullAt = now
		return false
	}
	cut := oldest + (quiet-oldest)/4
	n := 0
	for _, s := range t.table {
		if s.seen.Load() <= cut {
			t.drop(s)
			n++
		}
	}
	t.evictions.Add(uint64(n))
	return n > 0
}

// drop closes s; its relay goroutine ends. The caller holds mu.
func (t *sessionTable) drop(s *session) {
	delete(t.table, s.flow)
	t.count.Store(int64(len(t.table)))
	s.conn.Close()
}

// relay sends the backend's replies on s to its client, through the
// reverse rule, from the service socket. The socket is connected, so the
// kernel has already discarded datagrams from anyone but the backend.
// One datagram per read: a session's buffer is MaxDatagram bytes, and
// there may be tens of thousands of sessions.
func (t *sessionTable) relay(s *session) {
	in := rxMessages(1, t.bufSize)
	out := make([]udpio.Message, 1)
	sess := Session{Client: s.client, Local: s.local}
	errs := 0
	for {
		n, err := s.io.ReadBatch(in)
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
		s.seen.Store(t.now.Load())
		t.rp.relay(in[:n], out, sess) // a send error is counted; the session goes on
	}
}

// remove drops s if it is still its flow's session.
func (t *sessionTable) remove(s *session) {
	t.mu.Lock()
	if t.table[s.flow] == s {
		t.drop(s)
	}
	t.mu.Unlock()
}

// serve advances the coarse clock and expires idle sessions until wake or
// close.
func (t *sessionTable) serve() error {
	tick := time.NewTicker(min(time.Second, time.Duration(t.idle)/4))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return nil
		case now := <-tick.C:
			ns := now.UnixNano()
			t.now.Store(ns)
			t.mu.Lock()
			for _, s := range t.table {
				if ns-s.seen.Load() > t.idle {
					t.drop(s)
				}
			}
			t.mu.Unlock()
		}
	}
}

func (t *sessionTable) wake() { t.stopOnce.Do(func() { close(t.stop) }) }

// close ends every session and waits for their goroutines. The forward
// loop must have returned; sessions it would still ask for are refused
// anyway.
func (t *sessionTable) close() {
	t.wake()
	t.mu.Lock()
	t.closed = true
	for _, s := range t.table {
		t.drop(s)
	}
	t.mu.Unlock()
	t.wg.Wait()
}

func (t *sessionTable) addrs() []netip.AddrPort { return nil }

// replyConn is nil: each session's goroutine relays its own replies.
func (t *sessionTable) replyConn() *udpio.Conn { return nil }

func (t *sessionTable) relayBatch() (int, error, error) { return 0, nil, nil }

// queue adds nothing: the sessions' sockets come and go, and are not
// counted.
func (t *sessionTable) queue(*Counters) {}

func (t *sessionTable) sessions() int   { return int(t.count.Load()) }
func (t *sessionTable) evicted() uint64 { return t.evictions.Load() }
