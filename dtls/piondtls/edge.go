package piondtls

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/edge"
)

// EdgeConfig configures an EdgeDialer. DTLS and Edge.Resolve are
// required.
type EdgeConfig struct {
	// DTLS is the client configuration with the service's credentials,
	// used for the session and for every probe (probes never resume a
	// session: each is a full handshake). Its ConnectionIDGenerator must
	// offer connection IDs (dtls.OnlySendCIDGenerator() is enough): the
	// CID is what lets the session move between edges without a
	// handshake.
	DTLS *dtls.Config
	// Edge configures the Chooser. Probe defaults to the dialer's own
	// (EdgeDialer.Probe).
	Edge edge.Config
	// HandshakeTimeout bounds each handshake of Dial (0 = 10 s).
	HandshakeTimeout time.Duration
	// Silence is how long the session may go without a datagram from its
	// edge after it wrote one before the edge counts as dead and the
	// session fails over to the next (0 = 3 s; negative: never, call
	// EdgeConn.Failover instead). It assumes the peer answers, as CoAP
	// confirmables and LwM2M do; set it above the longest expected answer
	// time.
	Silence time.Duration
	// Local is the address the client's sockets bind (zero: any address
	// and port, both IP versions).
	Local netip.AddrPort
}

// An EdgeDialer dials a DTLS service through the best of its edges, and
// keeps its session on the best edge, with a Chooser. It uses the same
// socket for the whole session: an edge switch sends the next record to
// the new edge, and records are accepted from any edge of the set. A DTLS
// 1.2 record with a connection ID (RFC 9146) belongs to the session, not
// to an address, and every cidroute edge routes a CID to the backend that
// issued it, so the session, and any registration on top of it, goes on
// without a handshake when an edge dies or a better one wins.
type EdgeDialer struct {
	cfg   EdgeConfig
	ch    *edge.Chooser
	log   *slog.Logger
	known atomic.Pointer[[]netip.AddrPort] // the last resolved set
}

// NewEdgeDialer validates cfg. It does no I/O.
func NewEdgeDialer(cfg EdgeConfig) (*EdgeDialer, error) {
	if cfg.DTLS == nil {
		return nil, fmt.Errorf("piondtls: nil DTLS config: %w", ErrConfig)
	}
	if cfg.DTLS.ConnectionIDGenerator == nil {
		return nil, fmt.Errorf("piondtls: the DTLS config offers no connection IDs (set ConnectionIDGenerator, e.g. dtls.OnlySendCIDGenerator()): %w", ErrConfig)
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.Silence == 0 {
		cfg.Silence = 3 * time.Second
	}
	d := &EdgeDialer{cfg: cfg, log: cfg.Edge.Logger}
	if d.log == nil {
		d.log = slog.Default()
	}
	ec := cfg.Edge
	if ec.Probe == nil {
		ec.Probe = d.Probe
	}
	user := ec.OnEvent
	ec.OnEvent = func(e edge.Event) {
		if e.Kind == edge.EventResolved && len(e.Addrs) > 0 {
			addrs := append([]netip.AddrPort(nil), e.Addrs...)
			d.known.Store(&addrs)
		}
		if user != nil {
			user(e)
		}
	}
	ch, err := edge.New(ec)
	if err != nil {
		return nil, fmt.Errorf("piondtls: %w", err)
	}
	d.ch = ch
	return d, nil
}

// Chooser returns the dialer's Chooser, for its Stats and Ranking.
func (d *EdgeDialer) Chooser() *edge.Chooser { return d.ch }

// Probe is a full DTLS handshake through the edge at addr with the
// service's credentials, from a fresh socket, closed with close_notify.
// It measures the round-trip time as the mean over the handshake's
// flights (from a flight's first datagram to the first answer), so that
// a handshake of three round trips (with a HelloVerifyRequest) and one of
// two compare alike.
func (d *EdgeDialer) Probe(ctx context.Context, addr netip.AddrPort) (edge.Sample, error) {
	udp, err := d.listen()
	if err != nil {
		return edge.Sample{}, err
	}
	ps := &probeSock{UDPConn: udp, to: addr, remote: net.UDPAddrFromAddrPort(addr)}
	cfg := *d.cfg.DTLS
	cfg.SessionStore = nil
	conn, err := dtls.Client(ps, ps.remote, &cfg)
	if err != nil {
		udp.Close()
		return edge.Sample{}, err
	}
	start := time.Now()
	err = conn.HandshakeContext(ctx)
	hs := time.Since(start)
	rtt := ps.rtt()
	conn.Close() // close_notify, and the socket
	if err != nil {
		return edge.Sample{}, fmt.Errorf("handshake via %v: %w", addr, err)
	}
	return edge.Sample{RTT: rtt, Handshake: hs}, nil
}

// Dial resolves the edges, ranks them (measuring when there is no valid
// ranking), and handshakes through each in order until one succeeds; the
// session then stays on the best edge, as the Chooser decides, until
// Close. An error means no edge completed a handshake; the caller's
// reconnect backoff applies to it, and never to edge switches. While the
// dialer's session is open, Dial returns edge.ErrInUse: a dialer, like its
// Chooser, follows one session.
func (d *EdgeDialer) Dial(ctx context.Context) (*EdgeConn, error) {
	var c *EdgeConn
	_, err := d.ch.Connect(ctx, func(ctx context.Context, a netip.AddrPort) (err error) {
		c, err = d.dialEdge(ctx, a)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("piondtls: %w", err)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if d.cfg.Silence > 0 {
		c.sock.watchSilence(d.cfg.Silence, c.silent)
	}
	go func() {
		defer close(c.done)
		d.ch.Run(c.ctx, c.retarget)
	}()
	return c, nil
}

// dialEdge handshakes through the edge at a.
func (d *EdgeDialer) dialEdge(ctx context.Context, a netip.AddrPort) (*EdgeConn, error) {
	udp, err := d.listen()
	if err != nil {
		return nil, err
	}
	s := newEdgeSock(udp, a, &d.known)
	conn, err := dtls.Client(s, s.remote, d.cfg.DTLS)
	if err != nil {
		s.Close()
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, d.cfg.HandshakeTimeout)
	err = conn.HandshakeContext(hctx)
	cancel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("handshake via %v: %w", a, err)
	}
	return &EdgeConn{Conn: conn, d: d, sock: s, done: make(chan struct{})}, nil
}

func (d *EdgeDialer) listen() (*net.UDPConn, error) {
	var la *net.UDPAddr
	if d.cfg.Local.IsValid() {
		la = net.UDPAddrFromAddrPort(d.cfg.Local)
	}
	return net.ListenUDP("udp", la)
}

// An EdgeConn is a DTLS session through the edges: a *dtls.Conn whose
// socket follows the edge the Chooser picks. Close it to stop watching.
type EdgeConn struct {
	*dtls.Conn
	d    *EdgeDialer
	sock *edgeSock

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// Edge returns the edge the session's records go to now.
func (c *EdgeConn) Edge() netip.AddrPort { return c.sock.current() }

// Failover moves the session off its current edge now, as the silence
// detector does: to the next edge of the ranking, without a handshake or
// a probe. Call it when the application knows the edge is gone.
func (c *EdgeConn) Failover() (edge.Switch, error) {
	return c.d.ch.Failover(c.ctx, c.sock.current(), c.retarget)
}

// EdgeStats counts the datagrams of an EdgeConn's socket.
type EdgeStats struct {
	Received  uint64 // from an edge of the set
	Strangers uint64 // from anywhere else, dropped
	Silences  uint64 // times the current edge went silent
}

// Stats returns the socket's counters.
func (c *EdgeConn) Stats() EdgeStats {
	return EdgeStats{Received: c.sock.received.Load(), Strangers: c.sock.strangers.Load(), Silences: c.sock.silences.Load()}
}

// Close stops watching the edges, then closes the session (close_notify)
// and its socket. It is idempotent.
func (c *EdgeConn) Close() error {
	var err error
	c.once.Do(func() {
		c.cancel()
		<-c.done
		c.sock.stopSilence()
		err = c.Conn.Close()
		c.d.ch.Release()
	})
	return err
}

// retarget is the session's SwitchFunc: nothing to dial, the next record
// goes to the new edge.
func (c *EdgeConn) retarget(_ context.Context, sw edge.Switch) error {
	c.sock.retarget(sw.To)
	return nil
}

func (c *EdgeConn) silent(from netip.AddrPort) {
	if _, err := c.d.ch.Failover(c.ctx, from, c.retarget); err != nil && c.ctx.Err() == nil {
		c.d.log.Warn("edge silent and no other edge to fail over to", "edge", from, "err", err)
	}
}
