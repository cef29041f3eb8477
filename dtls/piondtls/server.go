package piondtls

import (
	"context"
	"fmt"
	"net"
	"sync"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/ppv2/backend"
)

// A Listener serves pion/dtls v3 sessions over a backend.Conn: a
// PacketListener demultiplexes the datagrams into sessions, and Accept
// returns each new one as a server-side *pion.Conn. It also answers the
// proxies' health probes without opening a session, and drains: Drain
// stops new sessions and gives the accepted ones time to end before the
// process does.
//
// Its methods are safe for concurrent use.
type Listener struct {
	pl      *PacketListener
	newConn func(net.PacketConn, net.Addr) (*pion.Conn, error)

	mu    sync.Mutex
	conns map[*session]*pion.Conn // accepted and not ended
	ended chan struct{}           // signalled when a tracked session ends
}

var _ net.Listener = (*Listener)(nil)

// Listen returns a Listener that serves pion sessions configured by cfg
// over conn. The CID length is taken from cfg.ConnectionIDGenerator (set
// it to an ordinal-first generator, see Generator, so that the proxies
// route by CID); without one, sessions are told apart by client address
// only and do not survive a client address change.
//
// pion v3.1 deprecates its Config in favour of options: ListenWithOptions
// takes them.
//
// The Listener owns conn: closing it stops accepting, and conn is closed
// once the Listener is closed and its last session has ended.
func Listen(conn *backend.Conn, cfg *pion.Config) (*Listener, error) {
	return ListenConfig(conn, Config{}, cfg)
}

// ListenConfig is Listen with the adapter's own settings in ac: its
// session timer (SessionIdle), bounds (MaxSessions, Backlog, Queue) and
// probe limit. ac.CIDLen 0 is taken from cfg.ConnectionIDGenerator, as
// Listen does; ac.ProbeConfig is ignored: probes are answered with cfg.
func ListenConfig(conn *backend.Conn, ac Config, cfg *pion.Config) (*Listener, error) {
	if cfg == nil {
		return nil, fmt.Errorf("piondtls: Listen needs a pion Config (nil given): %w", ErrConfig)
	}
	pc := ac
	pc.ProbeConfig = cfg
	if cfg.ConnectionIDGenerator != nil && pc.CIDLen == 0 {
		pc.CIDLen = len(cfg.ConnectionIDGenerator())
	}
	//lint:ignore SA1019 Listen is the Config form; ListenWithOptions is the options form.
	return newListener(conn, pc, func(c net.PacketConn, a net.Addr) (*pion.Conn, error) { return pion.Server(c, a, cfg) })
}

// ListenWithOptions returns a Listener that serves pion sessions
// configured by opts over conn, pion v3.1's options form of Listen.
// cfg.CIDLen must be the length of the connection IDs that the
// pion.WithConnectionIDGenerator option issues (Generator's, so that the
// proxies route by CID); 0 means the server issues none. cfg.ProbeConfig
// is ignored: probes are answered with opts.
func ListenWithOptions(conn *backend.Conn, cfg Config, opts ...pion.ServerOption) (*Listener, error) {
	// Check the options once, as pion would on the first ClientHello.
	c, err := pion.ServerWithOptions(nopConn{}, nopAddr{}, opts...)
	if err != nil {
		return nil, fmt.Errorf("piondtls: pion server options: %w", err)
	}
	c.Close()
	cfg.ProbeConfig = nil
	return newListener(conn, cfg, func(c net.PacketConn, a net.Addr) (*pion.Conn, error) {
		return pion.ServerWithOptions(c, a, opts...)
	})
}

func newListener(conn *backend.Conn, cfg Config, newConn func(net.PacketConn, net.Addr) (*pion.Conn, error)) (*Listener, error) {
	l := &Listener{newConn: newConn, conns: map[*session]*pion.Conn{}, ended: make(chan struct{}, 1)}
	pl, err := NewPacketListener(conn, cfg)
	if err != nil {
		return nil, err
	}
	pl.mu.Lock()
	pl.newServer, pl.onEnd, pl.onIdle = newConn, l.sessionEnded, l.sessionIdle
	pl.mu.Unlock()
	l.pl = pl
	return l, nil
}

// Accept waits for the next new session and returns its *pion.Conn, whose
// handshake runs on the first Read, Write or HandshakeContext.
func (l *Listener) Accept() (net.Conn, error) {
	pc, a, err := l.pl.Accept()
	if err != nil {
		return nil, err
	}
	s := pc.(*session)
	c, err := l.newConn(s, a)
	if err != nil {
		s.Close()
		return nil, err
	}
	l.mu.Lock()
	select {
	case <-s.closed: // ended already (the listener's socket failed)
	default:
		l.conns[s] = c
	}
	l.mu.Unlock()
	return c, nil
}

func (l *Listener) sessionEnded(s *session) {
	l.mu.Lock()
	_, ok := l.conns[s]
	delete(l.conns, s)
	l.mu.Unlock()
	if ok {
		select {
		case l.ended <- struct{}{}:
		default:
		}
	}
}

// sessionIdle closes an idle session (Config.SessionIdle): through its
// pion.Conn when accepted, so that the application's Read fails.
func (l *Listener) sessionIdle(s *session) {
	l.mu.Lock()
	c := l.conns[s]
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	s.Close()
}

// Close stops accepting new sessions, as pion's listeners do: accepted
// sessions are not closed, and the socket is closed after the last of
// them ended. Drain closes them too, after a grace period.
func (l *Listener) Close() error { return l.pl.Close() }

// Addr returns the socket's local address.
func (l *Listener) Addr() net.Addr { return l.pl.Addr() }

// Stats returns the demultiplexer's counters.
func (l *Listener) Stats() Stats { return l.pl.Stats() }

// Drain is a graceful stop. It refuses new sessions at once (ClientHellos
// of new clients are dropped, Stats.DroppedBacklog, and health probes go
// unanswered, so that the proxies take the backend for down if they did
// not already see it draining), serves the accepted sessions, handshakes
// in progress included, until each has ended or ctx is done, and then
// closes those left: pion sends close_notify on each established one, and
// its client can open a new session, which the proxies send elsewhere.
//
// It returns the number of established sessions it closed (also counted
// in Stats.Cut), 0 when every session ended by itself. Handshakes still
// unfinished at the deadline are closed too but not counted: their client
// has no session yet and must handshake again: once the proxies see this
// backend draining, its ClientHello with this backend's cookie reaches
// another one, which drops it as foreign (Stats.DroppedForeignHello), and
// its next handshake works there. Accept returns ErrClosed from the start
// of Drain.
func (l *Listener) Drain(ctx context.Context) (cut int) {
	l.pl.Close()
	for {
		l.mu.Lock()
		n := len(l.conns)
		l.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-l.ended:
			continue
		case <-ctx.Done():
		}
		break
	}
	l.mu.Lock()
	left := make(map[*session]*pion.Conn, len(l.conns))
	for s, c := range l.conns {
		left[s] = c
	}
	l.mu.Unlock()
	for s, c := range left {
		if s.established.Load() {
			cut++
		}
		c.Close()
	}
	l.pl.st.cut.Add(uint64(cut))
	return cut
}

// nopConn and nopAddr let ListenWithOptions check the options.
type nopConn struct{ net.PacketConn }

func (nopConn) Close() error { return nil }

type nopAddr struct{}

func (nopAddr) Network() string { return "udp" }
func (nopAddr) String() string  { return "check" }
