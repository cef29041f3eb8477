package quicecho

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute/internal/echobase"
	"github.com/cidroute/cidroute/internal/selfsigned"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo"
)

// DefaultALPN is the protocol the server offers when Config.ALPN is empty.
const DefaultALPN = "cidroute-echo"

// Config configures a Server. The zero value listens on 127.0.0.1 with
// ordinal 0, QUIC-LB plaintext CIDs of 12 bytes, a self-signed certificate
// and no trusted proxy.
type Config struct {
	// Listen is the UDP address to bind (zero: 127.0.0.1 on any port).
	Listen netip.AddrPort
	// Ordinal is written into every connection ID the server issues.
	Ordinal uint8
	// Codec is the CID layout (nil: QUIC-LB plaintext, 12 bytes); the
	// proxies must use the same.
	Codec quicgo.Codec
	// ALPN lists the application protocols offered (default DefaultALPN).
	ALPN []string
	// Certificate is the TLS certificate; nil generates a self-signed one.
	Certificate *tls.Certificate
	// TrustedProxies and Direct are the PPv2 adapter's settings (see
	// backend.Config).
	TrustedProxies []netip.Prefix
	Direct         backend.DirectPolicy // see TrustedProxies
	// Allow0RTT accepts 0-RTT data from resuming clients.
	Allow0RTT bool
	// SessionTicketKey, when set, encrypts the server's session tickets,
	// so that every server with the same key resumes (and takes 0-RTT
	// from) the others' clients: a new connection through another proxy
	// or edge lands on a backend chosen by its random DCID. Nil: a random
	// key of this server's own.
	SessionTicketKey *[32]byte
	// Logger receives the per-connection lines (nil: discarded).
	Logger *slog.Logger
	// Observe, when set, is called with every chunk a stream reads before
	// it is echoed.
	Observe func(Message)
}

// A Message is one chunk a stream read. Data is valid only during the
// Observe call.
type Message struct {
	Conn uint64       // the Connection's ID
	From backend.Addr // the connection's peer when it was read
	Data []byte       // what the stream read
}

// A Connection is what the server knows of one QUIC connection.
type Connection struct {
	ID          uint64       // numbers the server's connections from 1
	First, Last backend.Addr // the peer at the start and now
	Streams     int          // streams accepted
	Bytes       int64        // bytes its streams read (and echoed)
	Moves       int          // how often the peer changed (client or proxy)
	Used0RTT    bool         // the client resumed with 0-RTT (known once the handshake completed)
	Open        bool         // not ended yet
}

// A Server is a running echo server. Its methods are safe for concurrent
// use.
type Server struct {
	cfg Config
	log *slog.Logger
	bc  *backend.Conn
	tr  *quic.Transport
	ln  *quicgo.Listener

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
	draining atomic.Bool

	mu    sync.Mutex
	next  uint64
	conns map[uint64]*Connection
}

// TLSConfig returns the server TLS configuration for cert (nil: a fresh
// self-signed certificate) and alpn.
func TLSConfig(cert *tls.Certificate, alpn []string) (*tls.Config, error) {
	if cert == nil {
		c, err := selfsigned.New("localhost")
		if err != nil {
			return nil, err
		}
		cert = &c
	}
	if len(alpn) == 0 {
		alpn = []string{DefaultALPN}
	}
	return &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: alpn}, nil
}

// Listen binds the socket and starts serving.
func Listen(cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gen, err := quicgo.NewGenerator(cfg.Codec, cfg.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("quicecho: %w", err)
	}
	tlsConf, err := TLSConfig(cfg.Certificate, cfg.ALPN)
	if err != nil {
		return nil, fmt.Errorf("quicecho: certificate: %w", err)
	}
	bc, err := echobase.Listen(cfg.Listen, backend.Config{
		TrustedProxies: cfg.TrustedProxies,
		Direct:         cfg.Direct,
		Logger:         log,
		Protocol:       backend.QUIC,
		CIDLen:         gen.ConnectionIDLen(),
	})
	if err != nil {
		return nil, fmt.Errorf("quicecho: %w", err)
	}
	var resetKey quic.StatelessResetKey
	rand.Read(resetKey[:])
	tr := &quic.Transport{Conn: bc, ConnectionIDGenerator: gen, StatelessResetKey: &resetKey}
	if cfg.SessionTicketKey != nil {
		tlsConf.SessionTicketKey = *cfg.SessionTicketKey
	}
	var ln *quicgo.Listener
	if cfg.Allow0RTT {
		ln, err = quicgo.ListenEarly(tr, tlsConf, &quic.Config{Allow0RTT: true})
	} else {
		ln, err = quicgo.Listen(tr, tlsConf, &quic.Config{})
	}
	if err != nil {
		tr.Close()
		bc.Close()
		return nil, fmt.Errorf("quicecho: %w", err)
	}
	s := &Server{cfg: cfg, log: log.With("ordinal", cfg.Ordinal), bc: bc, tr: tr, ln: ln, conns: map[uint64]*Connection{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the bound address.
func (s *Server) Addr() netip.AddrPort { return echobase.Addr(s.bc) }

// Ordinal returns the server's ordinal.
func (s *Server) Ordinal() uint8 { return s.cfg.Ordinal }

// Stats returns the PPv2 adapter's counters.
func (s *Server) Stats() backend.Stats { return s.bc.Stats() }

// Connections returns every connection the server has accepted, in order.
func (s *Server) Connections() []Connection {
	s.mu.Lock()
	defer s.mu.Unlock()
	return echobase.InOrder(s.conns, s.next)
}

// DrainCode is the application error code of the CONNECTION_CLOSE that
// Drain sends to the connections left at its deadline.
const DrainCode quic.ApplicationErrorCode = 0

// Drain refuses new connections (and health probes) at once, serves the
// open ones until they end or ctx is done, then closes those left with
// CONNECTION_CLOSE (DrainCode, "server draining"); it returns how many it
// closed. Close the server after it.
func (s *Server) Drain(ctx context.Context) (cut int) {
	s.draining.Store(true)
	return s.ln.Drain(ctx, DrainCode, "server draining")
}

// Open returns the number of connections not ended yet.
func (s *Server) Open() int { return s.ln.Conns() }

// Close closes every connection and the socket, and waits for the
// server's goroutines. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.ln.Close()
		s.tr.Close()
		s.wg.Wait()
		s.bc.Close()
	})
	return nil
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept(s.ctx)
		if err != nil {
			if s.ctx.Err() == nil && !errors.Is(err, quic.ErrServerClosed) && !errors.Is(err, quic.ErrTransportClosed) {
				s.log.Error("accept failed", "err", err)
			}
			return
		}
		s.mu.Lock()
		s.next++
		id := s.next
		first := echobase.Peer(c)
		s.conns[id] = &Connection{ID: id, First: first, Last: first, Open: true}
		s.mu.Unlock()
		s.log.Info("connection started", append([]any{"conn", id, "alpn", c.ConnectionState().TLS.NegotiatedProtocol}, echobase.AddrAttrs(first)...)...)
		s.wg.Add(1)
		go s.serve(id, c)
	}
}

func (s *Server) serve(id uint64, c *quic.Conn) {
	defer s.wg.Done()
	var streams sync.WaitGroup
	defer streams.Wait()
	streams.Go(func() {
		select {
		case <-c.HandshakeComplete():
			s.mu.Lock()
			s.conns[id].Used0RTT = c.ConnectionState().Used0RTT
			s.mu.Unlock()
		case <-c.Context().Done():
		}
	})
	for {
		st, err := c.AcceptStream(s.ctx)
		if err != nil {
			s.mu.Lock()
			cn := s.conns[id]
			cn.Open = false
			client, bytes := cn.Last.Client, cn.Bytes
			s.mu.Unlock()
			s.log.Info("connection ended", "conn", id, "client", client, "bytes", bytes, "reason", s.endReason(err))
			return
		}
		s.mu.Lock()
		s.conns[id].Streams++
		s.mu.Unlock()
		streams.Go(func() { s.echo(id, c, st) })
	}
}

func (s *Server) echo(id uint64, c *quic.Conn, st *quic.Stream) {
	defer st.Close()
	buf := make([]byte, 16384)
	for {
		n, err := st.Read(buf)
		if n > 0 {
			now := echobase.Peer(c)
			s.mu.Lock()
			cn := s.conns[id]
			cn.Bytes += int64(n)
			last := cn.Last
			if now != last {
				cn.Moves++
				cn.Last = now
			}
			s.mu.Unlock()
			if now != last {
				s.log.Info("connection moved", append([]any{"conn", id, "from", last.Client}, echobase.AddrAttrs(now)...)...)
			}
			if s.cfg.Observe != nil {
				s.cfg.Observe(Message{Conn: id, From: now, Data: buf[:n]})
			}
			if _, werr := st.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *Server) endReason(err error) string {
	var app *quic.ApplicationError
	var idle *quic.IdleTimeoutError
	switch {
	case s.draining.Load() && errors.As(err, &app) && !app.Remote:
		return "cut at the drain deadline"
	case s.ctx.Err() != nil:
		return "server stopped"
	case errors.As(err, &idle):
		return "idle"
	case errors.As(err, &app):
		return fmt.Sprintf("closed by peer (code %d)", app.ErrorCode)
	case errors.Is(err, context.Canceled), errors.Is(err, io.EOF):
		return "closed"
	}
	return err.Error()
}
