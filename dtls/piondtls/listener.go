package piondtls

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	pion "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/pion/transport/v5/deadline"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrClosed is returned by Accept after Close, and by a session's
	// reads and writes after it or its listener's socket closed.
	ErrClosed = errors.New("piondtls: closed")
	// ErrConfig is wrapped when the configuration cannot work.
	ErrConfig = errors.New("piondtls: invalid configuration")
)

// Config tunes a PacketListener. The zero value means defaults.
type Config struct {
	// CIDLen is the length of the connection IDs the server issues (its
	// ConnectionIDGenerator's), used to find the CID of incoming tls12_cid
	// records. 0 means no CIDs: sessions are told apart by client address.
	CIDLen int
	// Backlog is the number of new sessions that may wait for Accept
	// (0 = 128); ClientHellos beyond it are dropped.
	Backlog int
	// Queue is the number of datagrams buffered per session (0 = 64);
	// datagrams beyond it are dropped, as a socket buffer would.
	Queue int
	// ProbeConfig, when set, is the server configuration that answers
	// health probes (a ClientHello under a PPv2 LOCAL header, see the
	// backend package's documentation) with pion's own first flight, from
	// a handshake that is then discarded: no session, no Accept. Without
	// it probes are dropped (Stats.ProbesDropped). Listen and
	// ListenWithOptions answer probes with the server's own settings.
	ProbeConfig *pion.Config
	// MaxProbes is the number of probes answered at once (0 = 4); more
	// are dropped.
	MaxProbes int
	// SessionIdle closes a session that received no datagram for this
	// long (0 = never, the default: the application's own timer decides).
	// A Listener closes the session's *pion.Conn, whose Read then fails;
	// a PacketListener closes the session's PacketConn. Either way its
	// demultiplexer entries and its return route go, so memory does not
	// grow with devices that vanished without a close_notify. Set it above
	// the longest silence a live client keeps: for LwM2M in queue mode,
	// the registration lifetime plus a margin (docs/backends.md). It must
	// be 0 or from MinSessionIdle to MaxIdle; it is enforced within an
	// eighth of itself (at most a minute) late.
	SessionIdle time.Duration
	// MaxSessions bounds the live sessions (0 = no bound): a ClientHello
	// beyond it is dropped (Stats.DroppedFull), as a full accept backlog
	// drops one. Together with SessionIdle it bounds the demultiplexer's
	// memory for a fleet.
	MaxSessions int
}

// Limits of Config.SessionIdle. MaxIdle is also backend.MaxRouteIdle.
const (
	// MinSessionIdle is the shortest SessionIdle: below it a client's
	// pause between two handshake flights (pion retransmits after 1 s)
	// would end the session.
	MinSessionIdle = time.Second
	// MaxIdle is the longest SessionIdle: 31 days, past the longest LwM2M
	// registration lifetimes in use; a longer value is a unit mistake.
	MaxIdle = backend.MaxRouteIdle
)

// Stats counts the datagrams the demultiplexer handled.
type Stats struct {
	Delivered        uint64 // handed to a session
	NewSessions      uint64 // sessions created from a ClientHello
	DroppedNoSession uint64 // no session by CID or client address, and not a ClientHello
	// DroppedForeignHello counts ClientHellos that answer a
	// HelloVerifyRequest (message_seq > 0) from a client without a
	// session here: its handshake began at another server, which alone
	// holds the cookie and the state. A session made from one would never
	// progress (pion waits for message 0) and would take the client's
	// next handshake from the same address with it.
	DroppedForeignHello uint64
	DroppedMalformed    uint64 // not a valid DTLS 1.2 datagram
	DroppedBacklog      uint64 // ClientHello with the accept backlog full, or after Close
	DroppedQueue        uint64 // session queue full
	Probes              uint64 // health probes answered (see Config.ProbeConfig)
	ProbesDropped       uint64 // health probes not answered: no ProbeConfig, MaxProbes busy, or closed
	Sessions            int    // live sessions
	Cut                 uint64 // sessions a Listener's Drain closed at its deadline
	IdleClosed          uint64 // sessions closed after Config.SessionIdle without a datagram
	DroppedFull         uint64 // ClientHellos refused with Config.MaxSessions live sessions
	// AddressTaken counts the ClientHellos that started a new session
	// from the client address of a session whose client already sent
	// records by its CID (a reboot, or a NAT that gave the address to
	// another device); the older session goes on by its CID.
	AddressTaken uint64
}

// Generator returns pion's ConnectionIDGenerator for a backend's ordinal,
// with cidroute's ordinal-first layout of length cidLen (0 = 8).
func Generator(ordinal uint8, cidLen int) (func() []byte, error) {
	return dtls.OrdinalFirst{Length: cidLen}.Generator(ordinal)
}

// A PacketListener demultiplexes the datagrams of a backend.Conn into one
// net.PacketConn per DTLS session, for pion's dtls.NewListener (or
// dtls.Server per accepted session). A datagram goes to the session whose
// CID its first tls12_cid record carries, else to the session of its
// claimed client address, else, if it is a ClientHello, to a new session
// that Accept returns.
//
// Each session's PacketConn is also the commit point of the backend's
// route table: pion writes a session's records to its remote address,
// which it sets from the first datagram and moves only when an
// authenticated tls12_cid record with the newest sequence number arrives
// from another address. On every write the session commits that address
// with its CID (backend.Conn.Commit) and re-keys itself under the new
// client address, so server-initiated messages (Conn.WriteToCID) follow
// the client, and a forged datagram, which pion rejects, moves nothing.
type PacketListener struct {
	conn   *backend.Conn
	cfg    Config
	accept chan *session

	mu       sync.Mutex
	byCID    map[string]*session
	byClient map[netip.AddrPort]*session
	all      map[*session]struct{} // the live sessions, however keyed
	sessions int
	closed   bool // no more sessions
	readErr  error

	done     chan struct{} // closed by Close
	readDone chan struct{} // closed when the read loop ends
	once     sync.Once

	newServer func(net.PacketConn, net.Addr) (*pion.Conn, error) // answers probes; nil: none
	probes    chan struct{}                                      // one token per probe being answered
	onEnd     func(*session)                                     // a Listener's, called when a session ends
	onIdle    func(*session)                                     // a Listener's: closes an idle session's pion.Conn

	// clock is a coarse reading (ns since start) that expireIdle advances,
	// so that the read loop stamps sessions without reading the time.
	clock atomic.Int64

	st struct {
		delivered, newSessions, noSession, foreignHello, malformed, backlog, queue atomic.Uint64
		probes, probesDropped, cut, idleClosed, full, addressTaken                 atomic.Uint64
	}
}

var _ dtlsnet.PacketListener = (*PacketListener)(nil)

// NewPacketListener starts demultiplexing conn. See Listen for ownership.
func NewPacketListener(conn *backend.Conn, cfg Config) (*PacketListener, error) {
	if cfg.Backlog == 0 {
		cfg.Backlog = 128
	}
	if cfg.Queue == 0 {
		cfg.Queue = 64
	}
	if cfg.MaxProbes == 0 {
		cfg.MaxProbes = 4
	}
	switch {
	case cfg.CIDLen < 0 || cfg.CIDLen > dtls.MaxCIDLen:
		return nil, fmt.Errorf("piondtls: CIDLen %d: want 0 (no CIDs) to %d: %w", cfg.CIDLen, dtls.MaxCIDLen, ErrConfig)
	case cfg.Backlog < 1:
		return nil, fmt.Errorf("piondtls: Backlog %d: want at least 1: %w", cfg.Backlog, ErrConfig)
	case cfg.Queue < 1:
		return nil, fmt.Errorf("piondtls: Queue %d: want at least 1: %w", cfg.Queue, ErrConfig)
	case cfg.MaxProbes < 1:
		return nil, fmt.Errorf("piondtls: MaxProbes %d: want at least 1: %w", cfg.MaxProbes, ErrConfig)
	case cfg.SessionIdle != 0 && (cfg.SessionIdle < MinSessionIdle || cfg.SessionIdle > MaxIdle):
		return nil, fmt.Errorf("piondtls: SessionIdle %v: want 0 (never) or %v to %v: %w", cfg.SessionIdle, MinSessionIdle, MaxIdle, ErrConfig)
	case cfg.MaxSessions < 0:
		return nil, fmt.Errorf("piondtls: MaxSessions %d: want 0 (no bound) or more: %w", cfg.MaxSessions, ErrConfig)
	}
	l := &PacketListener{
		conn:     conn,
		cfg:      cfg,
		accept:   make(chan *session, cfg.Backlog),
		byCID:    map[string]*session{},
		byClient: map[netip.AddrPort]*session{},
		all:      map[*session]struct{}{},
		done:     make(chan struct{}),
		readDone: make(chan struct{}),
		probes:   make(chan struct{}, cfg.MaxProbes),
	}
	if pc := cfg.ProbeConfig; pc != nil {
		l.newServer = func(c net.PacketConn, a net.Addr) (*pion.Conn, error) { return pion.Server(c, a, pc) }
	}
	go l.readLoop()
	if cfg.SessionIdle > 0 {
		go l.expireIdle()
	}
	return l, nil
}

// Accept returns the next new session: its PacketConn and the client's
// *backend.Addr.
func (l *PacketListener) Accept() (net.PacketConn, net.Addr, error) {
	select {
	case s := <-l.accept:
		return s, s.first, nil
	case <-l.done:
		return nil, nil, ErrClosed
	case <-l.readDone:
		return nil, nil, l.readError()
	}
}

// Close stops accepting sessions and closes those not yet accepted: new
// ClientHellos are dropped (Stats.DroppedBacklog) and health probes go
// unanswered. The socket stays open for the accepted sessions, which are
// served on, and is closed after the last of them.
func (l *PacketListener) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.done)
		l.mu.Unlock()
		for {
			select {
			case s := <-l.accept:
				s.Close()
				continue
			default:
			}
			break
		}
		l.mu.Lock()
		last := l.sessions == 0
		l.mu.Unlock()
		if last {
			l.conn.Close()
		}
	})
	return nil
}

// Addr returns the socket's local address.
func (l *PacketListener) Addr() net.Addr { return l.conn.LocalAddr() }

// Stats returns the demultiplexer's counters.
func (l *PacketListener) Stats() Stats {
	l.mu.Lock()
	n := l.sessions
	l.mu.Unlock()
	return Stats{
		Delivered:           l.st.delivered.Load(),
		NewSessions:         l.st.newSessions.Load(),
		DroppedNoSession:    l.st.noSession.Load(),
		DroppedForeignHello: l.st.foreignHello.Load(),
		DroppedMalformed:    l.st.malformed.Load(),
		DroppedBacklog:      l.st.backlog.Load(),
		DroppedQueue:        l.st.queue.Load(),
		Probes:              l.st.probes.Load(),
		ProbesDropped:       l.st.probesDropped.Load(),
		Sessions:            n,
		Cut:                 l.st.cut.Load(),
		IdleClosed:          l.st.idleClosed.Load(),
		DroppedFull:         l.st.full.Load(),
		AddressTaken:        l.st.addressTaken.Load(),
	}
}

func (l *PacketListener) readError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.readErr == nil || errors.Is(l.readErr, net.ErrClosed) {
		return ErrClosed
	}
	return l.readErr
}

func (l *PacketListener) readLoop() {
	defer close(l.readDone)
	buf := make([]byte, 65536)
	for {
		n, a, err := l.conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // someone set a deadline on the shared socket
			}
			l.mu.Lock()
			l.readErr = err
			l.mu.Unlock()
			return
		}
		ap := a.(*backend.Addr)
		s, byCID := l.route(buf[:n], ap)
		if s == nil {
			continue
		}
		if byCID || !s.hasCID.Load() {
			s.latest.Store(ap)
		}
		if byCID && !s.viaCID.Load() {
			s.viaCID.Store(true)
		}
		s.seen.Store(l.clock.Load())
		s.deliver(buf[:n], ap)
	}
}

// route finds or creates the session of datagram b from a; byCID reports
// that it was found by the CID of a tls12_cid record.
func (l *PacketListener) route(b []byte, a *backend.Addr) (s *session, byCID bool) {
	cidLen := l.cfg.CIDLen
	if cidLen == 0 {
		cidLen = dtls.MinCIDLen // no tls12_cid records expected; any is malformed for pion too
	}
	cl, err := dtls.Classify(b, cidLen)
	if err != nil {
		l.st.malformed.Add(1)
		return nil, false
	}
	if a.Local && cl.ClientHello {
		l.probe(b, a) // a health probe: answered without a session
		return nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if cl.Kind == dtls.KindEstablished && l.cfg.CIDLen > 0 {
		if s := l.byCID[string(cl.CID)]; s != nil {
			l.st.delivered.Add(1)
			return s, true
		}
	}
	taken := false
	if s := l.byClient[a.Client]; s != nil {
		if !cl.ClientHello || !s.viaCID.Load() {
			l.st.delivered.Add(1)
			return s, false
		}
		// A ClientHello from the address of a session whose client
		// already sends by its CID is no retransmission of that session's
		// handshake: the client rebooted, or a NAT gave the address of a
		// device asleep on another port to a new device. It starts a
		// session of its own below, which takes the address; the old one
		// stays reachable by its CID. (Sent to the old session, the hello
		// would be swallowed until it ended: hours for a sleeping fleet.)
		taken = true
	}
	if !cl.ClientHello {
		l.st.noSession.Add(1)
		return nil, false
	}
	if seq, ok := dtls.HelloSeq(b, cidLen); ok && seq > 0 {
		l.st.foreignHello.Add(1)
		return nil, false
	}
	if l.closed {
		l.st.backlog.Add(1)
		return nil, false
	}
	if l.cfg.MaxSessions > 0 && l.sessions >= l.cfg.MaxSessions {
		l.st.full.Add(1)
		return nil, false
	}
	s = l.newSession(a)
	select {
	case l.accept <- s:
	default:
		l.st.backlog.Add(1)
		return nil, false
	}
	l.byClient[a.Client] = s
	l.all[s] = struct{}{}
	l.sessions++
	l.st.newSessions.Add(1)
	if taken {
		l.st.addressTaken.Add(1)
	}
	l.st.delivered.Add(1)
	return s, false
}

// endSession removes s from the demultiplexer; l.mu is not held.
func (l *PacketListener) endSession(s *session) {
	l.mu.Lock()
	if l.byClient[s.client] == s {
		delete(l.byClient, s.client)
	}
	if s.cid != "" && l.byCID[s.cid] == s {
		delete(l.byCID, s.cid)
	}
	delete(l.all, s)
	l.sessions--
	last := l.closed && l.sessions == 0
	client, cid := s.client, s.cidB
	onEnd := l.onEnd
	l.mu.Unlock()
	l.conn.Forget(client, cid)
	if onEnd != nil {
		onEnd(s)
	}
	if last {
		l.conn.Close()
	}
}

type packet struct {
	b    []byte
	addr *backend.Addr
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// session is one DTLS session's net.PacketConn.
type session struct {
	l     *PacketListener
	first *backend.Addr
	in    chan packet

	// Guarded by l.mu.
	client netip.AddrPort // the client address it is keyed by
	cid    string         // the CID it issued, once seen in its ServerHello
	cidB   []byte         // the same bytes, for Commit

	hasCID      atomic.Bool                  // cid is set
	seen        atomic.Int64                 // l.clock when its newest datagram arrived
	latest      atomic.Pointer[backend.Addr] // the newest datagram's address (see WriteTo)
	established atomic.Bool                  // the server has sent a record of epoch 1 or later
	viaCID      atomic.Bool                  // a datagram has reached it by its CID: the client has it

	rdl, wdl  *deadline.Deadline
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *PacketListener) newSession(a *backend.Addr) *session {
	s := &session{l: l, first: a, client: a.Client, in: make(chan packet, l.cfg.Queue),
		rdl: deadline.New(), wdl: deadline.New(), closed: make(chan struct{})}
	s.seen.Store(l.clock.Load())
	return s
}

// expireIdle advances the coarse clock and closes the sessions that
// received nothing for Config.SessionIdle, until the listener's socket
// closes.
func (l *PacketListener) expireIdle() {
	idle := l.cfg.SessionIdle
	tick := time.NewTicker(min(max(idle/8, 10*time.Millisecond), time.Minute))
	defer tick.Stop()
	start := time.Now()
	var expired []*session
	for {
		select {
		case <-l.readDone:
			return
		case <-tick.C:
		}
		now := int64(time.Since(start))
		l.clock.Store(now)
		expired = expired[:0]
		l.mu.Lock()
		for s := range l.all {
			if now-s.seen.Load() > int64(idle) {
				expired = append(expired, s)
			}
		}
		onIdle := l.onIdle
		l.mu.Unlock()
		for _, s := range expired {
			l.st.idleClosed.Add(1)
			if onIdle != nil {
				onIdle(s)
			} else {
				s.Close()
			}
		}
		clear(expired)
	}
}

func (s *session) deliver(b []byte, a *backend.Addr) {
	bp := bufPool.Get().(*[]byte)
	p := packet{b: append((*bp)[:0], b...), addr: a}
	select {
	case s.in <- p:
	default:
		*bp = p.b
		bufPool.Put(bp)
		s.l.st.queue.Add(1)
	}
}

// ReadFrom returns the session's next datagram.
func (s *session) ReadFrom(b []byte) (int, net.Addr, error) {
	select {
	case <-s.closed:
		return 0, nil, ErrClosed
	default:
	}
	select {
	case p := <-s.in:
		n := copy(b, p.b)
		bp := &p.b
		bufPool.Put(bp)
		return n, p.addr, nil
	case <-s.rdl.Done():
		return 0, nil, os.ErrDeadlineExceeded
	case <-s.closed:
		return 0, nil, ErrClosed
	case <-s.l.readDone:
		return 0, nil, s.l.readError()
	}
}

// WriteTo sends b to addr through the backend Conn and commits addr as the
// session's route (see PacketListener).
func (s *session) WriteTo(b []byte, addr net.Addr) (int, error) {
	select {
	case <-s.closed:
		return 0, ErrClosed
	case <-s.wdl.Done():
		return 0, os.ErrDeadlineExceeded
	default:
	}
	a, ok := addr.(*backend.Addr)
	if !ok {
		return s.l.conn.WriteTo(b, addr)
	}
	if v := s.latest.Load(); v != nil && v.Proxy != a.Proxy && v.Client == a.Client && v.Service == a.Service && a.Proxied() {
		// Same client, newer proxy: the replica before may be gone.
		a = v
	}
	if !s.established.Load() && sealed(b) {
		s.established.Store(true)
	}
	l := s.l
	l.mu.Lock()
	if s.cid == "" && l.cfg.CIDLen > 0 {
		if cid, ok := serverHelloCID(b); ok && len(cid) == l.cfg.CIDLen {
			s.cid, s.cidB = string(cid), []byte(string(cid))
			l.byCID[s.cid] = s
			s.hasCID.Store(true)
		}
	}
	if a.Client != s.client {
		// pion moved the session: the client's address changed.
		if l.byClient[s.client] == s {
			delete(l.byClient, s.client)
		}
		s.client = a.Client
		l.byClient[a.Client] = s
	}
	cid := s.cidB
	l.mu.Unlock()
	if cid != nil {
		l.conn.Commit(*a, cid)
	}
	return l.conn.WriteToAddr(b, *a)
}

func (s *session) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.l.endSession(s)
	})
	return nil
}

func (s *session) LocalAddr() net.Addr { return s.l.conn.LocalAddr() }

func (s *session) SetDeadline(t time.Time) error {
	s.rdl.Set(t)
	s.wdl.Set(t)
	return nil
}

func (s *session) SetReadDeadline(t time.Time) error  { s.rdl.Set(t); return nil }
func (s *session) SetWriteDeadline(t time.Time) error { s.wdl.Set(t); return nil }
