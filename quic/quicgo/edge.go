package quicgo

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute/edge"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrEdgeConfig is wrapped when an EdgeConfig cannot work.
	ErrEdgeConfig = errors.New("quicgo: invalid edge dialer configuration")
)

// EdgeConfig configures an EdgeDialer. TLS, with ServerName, and
// Edge.Resolve are required.
type EdgeConfig struct {
	// TLS is the client's TLS configuration. ServerName must name the
	// service: it is the same through every edge, and session tickets are
	// cached under it, so a ticket from one edge resumes, with 0-RTT,
	// through another (a ClientSessionCache is added when there is none).
	// Probes never resume: each is a full handshake.
	TLS *tls.Config
	// QUIC is the quic-go configuration (nil: its defaults). Its
	// MaxIdleTimeout and KeepAlivePeriod bound how soon a dead edge is
	// noticed.
	QUIC *quic.Config
	// Edge configures the Chooser. Probe defaults to the dialer's own
	// (EdgeDialer.Probe).
	Edge edge.Config
	// HandshakeTimeout bounds each handshake (0 = 10 s).
	HandshakeTimeout time.Duration
	// Local is the address the dialer's socket binds (zero: any address
	// and port, both IP versions).
	Local netip.AddrPort
	// OnSwitch, when set, is called when the session has a connection
	// through a new edge, before the old one is closed, so that the
	// application can move its streams. For a planned switch the new
	// connection's handshake is complete and the old connection still
	// works; after a failover (the old one timed out) the new one may
	// still be in its handshake, and streams opened on it send 0-RTT
	// data when a ticket allowed it (quic.Err0RTTRejected means: reopen
	// them on new.NextConnection).
	OnSwitch func(old, new *quic.Conn, sw edge.Switch)
}

// An EdgeDialer dials a QUIC service through the best of its edges, and
// keeps its session on the best edge, with a Chooser.
//
// Unlike DTLS with connection IDs, QUIC does not let a client move a
// connection to another server address: RFC 9000 §9 limits migration to
// new client addresses ("If a client receives packets from an unknown
// server address, the client MUST discard these packets"), except for
// the server's preferred_address (§9.6), which the server offers once,
// in the handshake, and quic-go does not act on. A socket that hid the
// edge change from quic-go would break that rule and reuse the old
// path's congestion and RTT state (§9.4). So an edge switch is a new
// connection, resumed with 0-RTT through the session ticket of the old
// one (which needs every backend behind the edges to share its session
// ticket key, as 0-RTT behind any load balancer does). A planned switch
// builds the new connection while the old one still works; after a
// failover the new connection is usable at once, for 0-RTT data.
type EdgeDialer struct {
	cfg EdgeConfig
	ch  *edge.Chooser
	log *slog.Logger
	udp *net.UDPConn
	tr  *quic.Transport
}

// NewEdgeDialer validates cfg and binds the dialer's socket; Close
// releases it.
func NewEdgeDialer(cfg EdgeConfig) (*EdgeDialer, error) {
	if cfg.TLS == nil || cfg.TLS.ServerName == "" {
		return nil, fmt.Errorf("TLS config with the service's ServerName required: %w", ErrEdgeConfig)
	}
	cfg.TLS = cfg.TLS.Clone()
	if cfg.TLS.ClientSessionCache == nil {
		cfg.TLS.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	}
	if cfg.QUIC == nil {
		cfg.QUIC = &quic.Config{}
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	d := &EdgeDialer{cfg: cfg, log: cfg.Edge.Logger}
	if d.log == nil {
		d.log = slog.Default()
	}
	ec := cfg.Edge
	if ec.Probe == nil {
		ec.Probe = d.Probe
	}
	ch, err := edge.New(ec)
	if err != nil {
		return nil, fmt.Errorf("quicgo: %w", err)
	}
	d.ch = ch
	var la *net.UDPAddr
	if cfg.Local.IsValid() {
		la = net.UDPAddrFromAddrPort(cfg.Local)
	}
	if d.udp, err = net.ListenUDP("udp", la); err != nil {
		return nil, fmt.Errorf("quicgo: %w", err)
	}
	d.tr = &quic.Transport{Conn: d.udp}
	return d, nil
}

// Chooser returns the dialer's Chooser, for its Stats and Ranking.
func (d *EdgeDialer) Chooser() *edge.Chooser { return d.ch }

// Close closes the dialer's transport, its connections and its socket.
func (d *EdgeDialer) Close() error {
	d.tr.Close()
	return d.udp.Close()
}

// Probe is a full QUIC handshake (no resumption) through the edge at
// addr, closed with application error 0 once complete. RTT is quic-go's
// smoothed RTT from the handshake's acknowledgements.
func (d *EdgeDialer) Probe(ctx context.Context, addr netip.AddrPort) (edge.Sample, error) {
	tc := d.cfg.TLS.Clone()
	tc.ClientSessionCache = nil
	start := time.Now()
	conn, err := d.tr.Dial(ctx, net.UDPAddrFromAddrPort(addr), tc, d.cfg.QUIC)
	if err != nil {
		return edge.Sample{}, fmt.Errorf("handshake via %v: %w", addr, err)
	}
	hs := time.Since(start)
	rtt := conn.ConnectionStats().SmoothedRTT
	conn.CloseWithError(0, "probe")
	return edge.Sample{RTT: rtt, Handshake: hs}, nil
}

// DialEdge dials the service through the edge at addr, resuming with
// 0-RTT when the session cache holds a ticket for ServerName: then it
// returns before the handshake completes, and data written at once goes
// in the first flight.
func (d *EdgeDialer) DialEdge(ctx context.Context, addr netip.AddrPort) (*quic.Conn, error) {
	return d.tr.DialEarly(ctx, net.UDPAddrFromAddrPort(addr), d.cfg.TLS, d.cfg.QUIC)
}

// Dial resolves the edges, ranks them (measuring when there is no valid
// ranking), and connects through each in order until a handshake
// completes; the session then stays on the best edge, as the Chooser
// decides, until Close. An error means no edge completed a handshake;
// the caller's reconnect backoff applies to it, and never to switches.
// While the dialer's session is open, Dial returns edge.ErrInUse.
func (d *EdgeDialer) Dial(ctx context.Context) (*EdgeSession, error) {
	s := &EdgeSession{d: d, done: make(chan struct{})}
	_, err := d.ch.Connect(ctx, func(ctx context.Context, a netip.AddrPort) error {
		conn, err := d.handshake(ctx, a)
		if err == nil {
			s.set(conn, a)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("quicgo: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); d.ch.Run(s.ctx, s.reconnect) }()
	go func() { defer wg.Done(); s.watchLoss() }()
	go func() { wg.Wait(); close(s.done) }()
	return s, nil
}

// handshake dials a and waits for the handshake to complete.
func (d *EdgeDialer) handshake(ctx context.Context, a netip.AddrPort) (*quic.Conn, error) {
	hctx, cancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	defer cancel()
	conn, err := d.DialEdge(hctx, a)
	if err != nil {
		return nil, fmt.Errorf("handshake via %v: %w", a, err)
	}
	if err := complete(hctx, conn); err != nil {
		conn.CloseWithError(0, "handshake timeout")
		return nil, fmt.Errorf("handshake via %v: %w", a, err)
	}
	return conn, nil
}

func complete(ctx context.Context, conn *quic.Conn) error {
	select {
	case <-conn.HandshakeComplete():
		return nil
	case <-conn.Context().Done():
		return context.Cause(conn.Context())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// An EdgeSession is a QUIC connection to the service that follows the
// edge the Chooser picks: Conn returns the current one.
type EdgeSession struct {
	d    *EdgeDialer
	cur  atomic.Pointer[quic.Conn]
	mu   sync.Mutex
	edge netip.AddrPort

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Conn returns the session's current connection.
func (s *EdgeSession) Conn() *quic.Conn { return s.cur.Load() }

// Edge returns the edge the current connection goes through.
func (s *EdgeSession) Edge() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edge
}

func (s *EdgeSession) set(c *quic.Conn, a netip.AddrPort) {
	s.mu.Lock()
	s.edge = a
	s.cur.Store(c)
	s.mu.Unlock()
}

// Close stops watching the edges and closes the current connection with
// application error 0. It is idempotent.
func (s *EdgeSession) Close() error {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.cur.Load().CloseWithError(0, "closed")
		s.d.ch.Release()
	})
	return nil
}

// reconnect is the session's SwitchFunc: a new connection through sw.To.
func (s *EdgeSession) reconnect(ctx context.Context, sw edge.Switch) error {
	old := s.cur.Load()
	alive := old.Context().Err() == nil
	if alive {
		// Planned: build the new connection while the old one works.
		nc, err := s.d.handshake(ctx, sw.To)
		if err != nil {
			return err
		}
		s.set(nc, sw.To)
		if f := s.d.cfg.OnSwitch; f != nil {
			f(old, nc, sw)
		}
		old.CloseWithError(0, "edge switch: "+sw.Reason.String())
		return nil
	}
	// The old connection is gone: the new one is usable at once (0-RTT).
	hctx, cancel := context.WithTimeout(ctx, s.d.cfg.HandshakeTimeout)
	defer cancel()
	nc, err := s.d.DialEdge(hctx, sw.To)
	if err != nil {
		return fmt.Errorf("dialing %v: %w", sw.To, err)
	}
	s.set(nc, sw.To)
	if f := s.d.cfg.OnSwitch; f != nil {
		f(old, nc, sw)
	}
	return nil
}

// watchLoss fails over when the current connection dies of silence: an
// idle timeout (the edge or the path is gone) or a handshake that never
// completes. Other ends (the peer closed it) end the session.
func (s *EdgeSession) watchLoss() {
	for {
		c := s.cur.Load()
		select {
		case <-s.ctx.Done():
			return
		case <-c.Context().Done():
		}
		if s.cur.Load() != c {
			continue // replaced by a switch
		}
		cause := context.Cause(c.Context())
		var idle *quic.IdleTimeoutError
		var hs *quic.HandshakeTimeoutError
		if !errors.As(cause, &idle) && !errors.As(cause, &hs) {
			return
		}
		from := s.Edge()
		if _, err := s.d.ch.Failover(s.ctx, from, s.reconnect); err != nil {
			if s.ctx.Err() == nil {
				s.d.log.Warn("edge connection lost and no other edge to fail over to", "edge", from, "cause", cause, "err", err)
			}
			return
		}
	}
}
