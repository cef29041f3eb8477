package dtlsecho

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/internal/echobase"
	"github.com/cidroute/cidroute/internal/selfsigned"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// Config configures a Server. The zero value listens on 127.0.0.1, with
// ordinal 0, 8-byte CIDs, a self-signed certificate, and no trusted proxy.
type Config struct {
	// Listen is the UDP address to bind (zero: 127.0.0.1 on any port).
	Listen netip.AddrPort
	// Ordinal is written into every connection ID the server issues.
	Ordinal uint8
	// CIDLen is the connection ID length (0 = 8); the proxies must be
	// configured with the same.
	CIDLen int
	// Codec, when set, is the CID layout instead of ordinal-first of
	// CIDLen (which must then be 0 or the codec's length), for example the
	// encrypted QUIC-LB codec; the proxies must use the same.
	Codec dtls.Codec
	// PSK selects PSK mode (TLS_PSK_WITH_AES_128_CCM_8 and
	// TLS_PSK_WITH_AES_128_GCM_SHA256) with this key for every identity.
	// Without it the server runs in certificate mode.
	PSK []byte
	// PSKIdentityHint is sent to PSK clients (default "cidroute").
	PSKIdentityHint string
	// Certificate is the certificate-mode certificate; nil generates a
	// self-signed one at start.
	Certificate *tls.Certificate
	// TrustedProxies and Direct are the PPv2 adapter's settings (see
	// backend.Config).
	TrustedProxies []netip.Prefix
	Direct         backend.DirectPolicy // see TrustedProxies
	// Prefix is prepended to every echo, so a client can tell which server
	// answered.
	Prefix string
	// HandshakeTimeout bounds each handshake (0 = 10 s).
	HandshakeTimeout time.Duration
	// IdleTimeout ends a session that received nothing for this long (0 =
	// 5 minutes): a client that vanished sends no close_notify.
	IdleTimeout time.Duration
	// Logger receives the per-session lines (nil: discarded).
	Logger *slog.Logger
	// Observe, when set, is called with every message before it is echoed,
	// from the session's goroutine.
	Observe func(Message)
}

// A Message is one application record a session received. Data is valid
// only during the Observe call.
type Message struct {
	Session uint64       // the Session's ID
	From    backend.Addr // the session's peer when it arrived
	Data    []byte       // the record's plaintext
}

// A Session is what the server knows of one DTLS session.
type Session struct {
	ID          uint64       // numbers the server's sessions from 1
	First, Last backend.Addr // the peer at the start and now
	Messages    int          // application records received
	Moves       int          // how often the peer changed (client or proxy)
	Open        bool         // not ended yet
}

// A Server is a running echo server. Its methods are safe for concurrent
// use.
type Server struct {
	cfg Config
	log *slog.Logger
	bc  *backend.Conn
	ln  *piondtls.Listener

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
	draining atomic.Bool
	cutting  atomic.Bool // the drain deadline passed

	mu       sync.Mutex
	next     uint64
	sessions map[uint64]*Session
	conns    map[uint64]net.Conn
}

// Listen binds the socket and starts serving.
func Listen(cfg Config) (*Server, error) {
	codec := cfg.Codec
	switch {
	case codec == nil:
		if cfg.CIDLen == 0 {
			cfg.CIDLen = dtls.OrdinalFirstDefaultLen
		}
		codec = dtls.OrdinalFirst{Length: cfg.CIDLen}
	case cfg.CIDLen != 0 && cfg.CIDLen != codec.Len():
		return nil, fmt.Errorf("dtlsecho: CIDLen %d but codec length %d", cfg.CIDLen, codec.Len())
	}
	cfg.CIDLen = codec.Len()
	if cfg.PSKIdentityHint == "" {
		cfg.PSKIdentityHint = "cidroute"
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gen, err := dtls.Generator(codec, cfg.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("dtlsecho: %w", err)
	}
	pc := &pion.Config{ConnectionIDGenerator: gen, ExtendedMasterSecret: pion.RequestExtendedMasterSecret}
	if cfg.PSK != nil {
		key := cfg.PSK
		pc.PSK = func([]byte) ([]byte, error) { return key, nil }
		pc.PSKIdentityHint = []byte(cfg.PSKIdentityHint)
		pc.CipherSuites = []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8, pion.TLS_PSK_WITH_AES_128_GCM_SHA256}
	} else {
		cert := cfg.Certificate
		if cert == nil {
			c, err := selfsigned.New("localhost")
			if err != nil {
				return nil, fmt.Errorf("dtlsecho: self-signed certificate: %w", err)
			}
			cert = &c
		}
		pc.Certificates = []tls.Certificate{*cert}
	}
	bc, err := echobase.Listen(cfg.Listen, backend.Config{
		TrustedProxies: cfg.TrustedProxies,
		Direct:         cfg.Direct,
		Logger:         log,
		Protocol:       backend.DTLS,
		CIDLen:         cfg.CIDLen,
	})
	if err != nil {
		return nil, fmt.Errorf("dtlsecho: %w", err)
	}
	ln, err := piondtls.Listen(bc, pc)
	if err != nil {
		bc.Close()
		return nil, fmt.Errorf("dtlsecho: %w", err)
	}
	s := &Server{cfg: cfg, log: log.With("ordinal", cfg.Ordinal), bc: bc, ln: ln,
		sessions: map[uint64]*Session{}, conns: map[uint64]net.Conn{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the bound address.
func (s *Server) Addr() netip.AddrPort { return echobase.Addr(s.bc) }

// Ordinal returns the server's ordinal.
func (s *Server) Ordinal() uint8 { return s.cfg.Ordinal }

// Stats returns the PPv2 adapter's and the session demultiplexer's
// counters.
func (s *Server) Stats() (backend.Stats, piondtls.Stats) { return s.bc.Stats(), s.ln.Stats() }

// Sessions returns every session the server has had, in the order they
// started.
func (s *Server) Sessions() []Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return echobase.InOrder(s.sessions, s.next)
}

// Drain refuses new sessions (and health probes) at once, serves the open
// ones until they end or ctx is done, then closes those left with
// close_notify; it returns how many it closed. Close the server after it.
func (s *Server) Drain(ctx context.Context) (cut int) {
	s.draining.Store(true)
	// Mark the deadline before the listener cuts, so that the sessions it
	// closes are logged as cut, not as closed by their client.
	inner, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(ctx, func() { s.cutting.Store(true); cancel() })
	defer stop()
	return s.ln.Drain(inner)
}

// Open returns the number of sessions not ended yet.
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting, ends every session, closes the socket and waits
// for the server's goroutines. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		s.bc.Close()
	})
	return nil
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() == nil && !errors.Is(err, piondtls.ErrClosed) {
				s.log.Error("accept failed", "err", err)
			}
			return
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.next++
		id := s.next
		s.conns[id] = c
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(id, c.(*pion.Conn))
	}
}

func (s *Server) serve(id uint64, c *pion.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, id)
		s.mu.Unlock()
	}()
	first := echobase.Peer(c)
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandshakeTimeout)
	err := c.HandshakeContext(ctx)
	cancel()
	if err != nil {
		if s.ctx.Err() == nil && !s.draining.Load() {
			s.log.Warn("handshake failed", append(echobase.AddrAttrs(first), "err", err)...)
		}
		return
	}
	ss := &Session{ID: id, First: first, Last: first, Open: true}
	s.mu.Lock()
	s.sessions[id] = ss
	s.mu.Unlock()
	var suite string
	if st, ok := c.ConnectionState(); ok {
		suite = st.CipherSuiteID.String()
	}
	s.log.Info("session started", append([]any{"session", id}, append(echobase.AddrAttrs(first), "cipher_suite", suite)...)...)

	buf := make([]byte, 16384)
	out := make([]byte, 0, len(s.cfg.Prefix)+len(buf))
	last, msgs := first, 0
	end := func(err error) {
		s.mu.Lock()
		ss.Open = false
		s.mu.Unlock()
		s.log.Info("session ended", "session", id, "client", last.Client, "messages", msgs, "reason", s.endReason(err))
	}
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		n, err := c.Read(buf)
		if err != nil {
			end(err)
			return
		}
		now := echobase.Peer(c)
		msgs++
		s.mu.Lock()
		ss.Messages++
		moved := now != last
		if moved {
			ss.Moves++
			ss.Last = now
		}
		s.mu.Unlock()
		if moved {
			s.log.Info("session moved", append([]any{"session", id, "from", last.Client}, echobase.AddrAttrs(now)...)...)
			last = now
		}
		if s.cfg.Observe != nil {
			s.cfg.Observe(Message{Session: id, From: now, Data: buf[:n]})
		}
		out = append(append(out[:0], s.cfg.Prefix...), buf[:n]...)
		if _, err := c.Write(out); err != nil {
			end(err)
			return
		}
	}
}

func (s *Server) endReason(err error) string {
	var ne net.Error
	switch {
	case s.ctx.Err() != nil:
		return "server stopped"
	case s.cutting.Load():
		return "cut at the drain deadline"
	case errors.As(err, &ne) && ne.Timeout():
		return "idle"
	case errors.Is(err, net.ErrClosed) || errors.Is(err, piondtls.ErrClosed):
		return "closed"
	}
	if errors.Is(err, io.EOF) {
		return "close_notify"
	}
	return err.Error()
}

// PSKClientConfig is a pion client configuration that matches a PSK-mode
// Server: it offers connection ID support (sending the server's CIDs,
// asking for none itself), as RFC 9146 clients behind NAT do.
func PSKClientConfig(psk []byte, identity string) *pion.Config {
	return &pion.Config{
		PSK:                   func([]byte) ([]byte, error) { return psk, nil },
		PSKIdentityHint:       []byte(identity),
		CipherSuites:          []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8},
		ConnectionIDGenerator: pion.OnlySendCIDGenerator(),
		ExtendedMasterSecret:  pion.RequestExtendedMasterSecret,
	}
}
