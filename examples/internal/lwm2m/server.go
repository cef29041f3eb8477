package lwm2m

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pion "github.com/pion/dtls/v3"
	coapdtls "github.com/plgd-dev/go-coap/v3/dtls"
	dtlsServer "github.com/plgd-dev/go-coap/v3/dtls/server"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	coapNet "github.com/plgd-dev/go-coap/v3/net"
	"github.com/plgd-dev/go-coap/v3/net/monitor/inactivity"
	"github.com/plgd-dev/go-coap/v3/net/responsewriter"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/internal/echobase"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// ServerConfig configures a Server. The zero value listens on 127.0.0.1
// with ordinal 0, 8-byte CIDs and no trusted proxy; PSK is required.
type ServerConfig struct {
	Listen         netip.AddrPort       // zero: 127.0.0.1 on any port
	Ordinal        uint8                // written into every CID the server issues
	CIDLen         int                  // 0 = 8; the proxies' cid_length
	PSK            []byte               // the key of every identity (TLS_PSK_WITH_AES_128_CCM_8)
	TrustedProxies []netip.Prefix       // see backend.Config
	Direct         backend.DirectPolicy // see backend.Config
	// RouteIdle is the PPv2 adapter's route lifetime (backend.Config;
	// 0 = its default, 5 minutes). A queue-mode device's session needs no
	// route while it sleeps: its first record on waking commits a new one.
	RouteIdle time.Duration
	// HandshakeTimeout bounds a handshake (0 = 10 s).
	HandshakeTimeout time.Duration
	// ObservePath is the resource observed on every registered device
	// (default "/3303/0/5700", a temperature sensor's value).
	ObservePath string
	// ACKTimeout and MaxRetransmit are the CoAP transmission parameters of
	// the server's confirmable requests (0 = RFC 7252's 2 s and 4).
	ACKTimeout    time.Duration
	MaxRetransmit int
	Logger        *slog.Logger // nil: discarded
}

// Stats counts what a Server did. Everything but Registered and Sessions
// only grows.
type Stats struct {
	Ordinal         uint8  `json:"ordinal"`
	Handshakes      uint64 `json:"handshakes"`         // sessions whose handshake completed
	HandshakeFailed uint64 `json:"handshake_failed"`   // sessions whose handshake did not
	Sessions        int    `json:"sessions"`           // live DTLS sessions
	Registrations   uint64 `json:"registrations"`      // 2.01 Created answered
	ReRegistrations uint64 `json:"re_registrations"`   // of which for an endpoint registered here already
	Updates         uint64 `json:"updates"`            // 2.04 Changed answered
	UpdatesUnknown  uint64 `json:"updates_unknown"`    // 4.04: no such registration (expired or another server's)
	Deregistrations uint64 `json:"deregistrations"`    // DELETE /rd/<id>
	Expired         uint64 `json:"expired"`            // registrations whose lifetime ran out
	Registered      int    `json:"registered"`         // registrations held now
	Observations    uint64 `json:"observations"`       // observations the devices accepted
	ObserveFailed   uint64 `json:"observe_failed"`     // observe requests not accepted
	Notifications   uint64 `json:"notifications"`      // confirmable notifications delivered (unique)
	Duplicates      uint64 `json:"duplicates"`         // confirmable messages received again (same message ID)
	BadRequests     uint64 `json:"bad_requests"`       // malformed registrations and unknown paths
	DroppedNoSess   uint64 `json:"dropped_no_session"` // records for no session (piondtls)
	DroppedForeign  uint64 `json:"dropped_foreign_hello"`
	Cut             uint64 `json:"cut"` // sessions closed at a drain's deadline
}

// A Server is an LwM2M-shaped registration server: the registration
// interface (register, update, de-register, lifetime expiry) and one
// observation per registered device, over CoAP on DTLS 1.2 with
// connection IDs, behind cidroute proxies. Registrations live in memory:
// a restarted server has none, and its devices learn it on their next
// update (a 4.04, or no answer because their session is gone too).
//
// Its methods are safe for concurrent use.
type Server struct {
	cfg  ServerConfig
	log  *slog.Logger
	bc   *backend.Conn
	ln   *piondtls.Listener
	coap interface{ Stop() }
	done chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	handshakes, hsFailed, regs, reregs, updates, unknown, dereg, expired atomic.Uint64
	observations, obsFailed, notifications, duplicates, bad              atomic.Uint64

	mu    sync.Mutex
	next  uint64
	byID  map[string]*registration
	byEP  map[string]*registration
	conns map[*udpClient.Conn]*connState
}

type registration struct {
	id, ep   string
	lifetime time.Duration
	expires  time.Time
	conn     *udpClient.Conn
}

// connState is what the server remembers of one session: the message IDs
// of its latest confirmable messages, to count retransmissions that
// arrive (their first copy's ACK was lost or late).
type connState struct {
	mids [16]int32
	n    int
}

func (c *connState) seen(mid int32) bool {
	for _, m := range c.mids {
		if m == mid {
			return true
		}
	}
	c.mids[c.n%len(c.mids)] = mid
	c.n++
	return false
}

// Listen binds the socket and starts serving.
func Listen(cfg ServerConfig) (*Server, error) {
	if len(cfg.PSK) == 0 {
		return nil, errors.New("lwm2m: a PSK is required")
	}
	if cfg.CIDLen == 0 {
		cfg.CIDLen = dtls.OrdinalFirstDefaultLen
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.ObservePath == "" {
		cfg.ObservePath = "/3303/0/5700"
	}
	if cfg.ACKTimeout == 0 {
		cfg.ACKTimeout = 2 * time.Second
	}
	if cfg.MaxRetransmit == 0 {
		cfg.MaxRetransmit = 4
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gen, err := piondtls.Generator(cfg.Ordinal, cfg.CIDLen)
	if err != nil {
		return nil, fmt.Errorf("lwm2m: %w", err)
	}
	key := cfg.PSK
	pc := &pion.Config{
		ConnectionIDGenerator: gen,
		ExtendedMasterSecret:  pion.RequestExtendedMasterSecret,
		PSK:                   func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint:       []byte("lwm2m"),
		CipherSuites:          []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8},
	}
	bc, err := echobase.Listen(cfg.Listen, backend.Config{
		TrustedProxies: cfg.TrustedProxies,
		Direct:         cfg.Direct,
		Protocol:       backend.DTLS,
		CIDLen:         cfg.CIDLen,
		RouteIdle:      cfg.RouteIdle,
		Logger:         log,
	})
	if err != nil {
		return nil, fmt.Errorf("lwm2m: %w", err)
	}
	ln, err := piondtls.Listen(bc, pc)
	if err != nil {
		bc.Close()
		return nil, fmt.Errorf("lwm2m: %w", err)
	}
	s := &Server{cfg: cfg, log: log.With("ordinal", cfg.Ordinal), bc: bc, ln: ln, done: make(chan struct{}),
		byID: map[string]*registration{}, byEP: map[string]*registration{}, conns: map[*udpClient.Conn]*connState{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	srv := coapdtls.NewServer(
		options.WithContext(s.ctx),
		options.WithHandlerFunc(udpClient.HandlerFunc(s.handle)),
		options.WithErrors(func(error) {}), // counted where they matter; go-coap prints the rest
		options.WithPeriodicRunner(periodic.New(s.ctx.Done(), 200*time.Millisecond)),
		options.WithTransmission(1, cfg.ACKTimeout, uint32(cfg.MaxRetransmit)),
		options.WithDTLSHandshakeTimeout(cfg.HandshakeTimeout),
		noInactivity{},
		options.WithOnNewConn(func(cc *udpClient.Conn) {
			s.handshakes.Add(1)
			s.mu.Lock()
			s.conns[cc] = &connState{mids: [16]int32{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}}
			s.mu.Unlock()
			cc.AddOnClose(func() {
				s.mu.Lock()
				delete(s.conns, cc)
				s.mu.Unlock()
			})
		}),
		options.WithRequestMonitor(func(cc *udpClient.Conn, m *pool.Message) (bool, error) {
			if m.Type() != message.Confirmable {
				return false, nil
			}
			s.mu.Lock()
			st := s.conns[cc]
			dup := st != nil && st.seen(m.MessageID())
			s.mu.Unlock()
			if dup {
				s.duplicates.Add(1)
			}
			return false, nil
		}),
	)
	s.coap = srv
	go func() {
		defer close(s.done)
		srv.Serve(coapListener{ln: ln, hsFailed: &s.hsFailed})
	}()
	go s.expire()
	return s, nil
}

// noInactivity turns off go-coap's DTLS server inactivity monitor, which
// by default closes a session after 16 s without a datagram: a queue-mode
// device sleeps far longer. A session ends with its registration's
// lifetime instead (expire).
type noInactivity struct{}

func (noInactivity) DTLSServerApply(cfg *dtlsServer.Config) {
	cfg.CreateInactivityMonitor = func() udpClient.InactivityMonitor {
		return inactivity.NewNilMonitor[*udpClient.Conn]()
	}
}

// coapListener is the piondtls Listener as go-coap's DTLS server takes it.
type coapListener struct {
	ln       *piondtls.Listener
	hsFailed *atomic.Uint64
}

func (l coapListener) AcceptWithContext(ctx context.Context) (net.Conn, error) {
	c, err := l.ln.Accept()
	if errors.Is(err, piondtls.ErrClosed) {
		// A drain closes the listener first: go-coap's Serve would stop at
		// once and end every connection with it, so wait for Close.
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %w", err, coapNet.ErrListenerIsClosed)
	}
	if err != nil {
		return nil, err
	}
	return countHandshake{Conn: c.(*pion.Conn), failed: l.hsFailed}, nil
}

func (l coapListener) Close() error { return l.ln.Close() }

// countHandshake counts the handshakes go-coap runs that fail.
type countHandshake struct {
	*pion.Conn
	failed *atomic.Uint64
}

func (c countHandshake) HandshakeContext(ctx context.Context) error {
	err := c.Conn.HandshakeContext(ctx)
	if err != nil {
		c.failed.Add(1)
	}
	return err
}

// Addr returns the bound address.
func (s *Server) Addr() netip.AddrPort { return echobase.Addr(s.bc) }

// Ordinal returns the server's ordinal.
func (s *Server) Ordinal() uint8 { return s.cfg.Ordinal }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	registered := len(s.byID)
	s.mu.Unlock()
	dm := s.ln.Stats()
	return Stats{
		Ordinal: s.cfg.Ordinal, Handshakes: s.handshakes.Load(), HandshakeFailed: s.hsFailed.Load(), Sessions: dm.Sessions,
		Registrations: s.regs.Load(), ReRegistrations: s.reregs.Load(), Updates: s.updates.Load(), UpdatesUnknown: s.unknown.Load(),
		Deregistrations: s.dereg.Load(), Expired: s.expired.Load(), Registered: registered,
		Observations: s.observations.Load(), ObserveFailed: s.obsFailed.Load(), Notifications: s.notifications.Load(),
		Duplicates: s.duplicates.Load(), BadRequests: s.bad.Load(),
		DroppedNoSess: dm.DroppedNoSession, DroppedForeign: dm.DroppedForeignHello, Cut: dm.Cut,
	}
}

// ServeHTTP writes Stats as JSON, for a simulator in another process.
func (s *Server) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.Stats())
}

// Drain refuses new sessions (and the proxies' health probes) at once,
// serves the open ones until they end or ctx is done, then closes those
// left with close_notify, so that their devices handshake again elsewhere
// at once instead of waiting for a request to time out. It returns how
// many it closed. Close the server after it.
func (s *Server) Drain(ctx context.Context) int { return s.ln.Drain(ctx) }

// Kill stops the server as a crash would: the socket closes first, so
// that no close_notify reaches a device, which learns of it only when an
// exchange goes unanswered.
func (s *Server) Kill() error {
	s.bc.Close()
	return s.Close()
}

// Close stops serving, ends every session and closes the socket. It is
// idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.coap.Stop()
		// go-coap's Serve waits for its connections, which a stopped
		// server does not end: end them.
		s.mu.Lock()
		conns := make([]*udpClient.Conn, 0, len(s.conns))
		for cc := range s.conns {
			conns = append(conns, cc)
		}
		s.mu.Unlock()
		for _, cc := range conns {
			cc.Close()
		}
		<-s.done
		s.bc.Close()
	})
	return nil
}

func (s *Server) expire() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case now := <-t.C:
			var gone []*udpClient.Conn
			s.mu.Lock()
			for id, r := range s.byID {
				if now.After(r.expires) {
					delete(s.byID, id)
					if s.byEP[r.ep] == r {
						delete(s.byEP, r.ep)
					}
					s.expired.Add(1)
					gone = append(gone, r.conn)
				}
			}
			s.mu.Unlock()
			// A device whose registration expired has vanished: its
			// session goes too, so that a fleet's memory is bounded by the
			// registrations' lifetimes, not by how many devices ever came.
			for _, cc := range gone {
				cc.Close()
			}
		}
	}
}

type rw = responsewriter.ResponseWriter[*udpClient.Conn]

func (s *Server) handle(w *rw, r *pool.Message) {
	path, _ := r.Options().Path()
	path = "/" + strings.TrimPrefix(path, "/")
	cc := w.Conn()
	switch {
	case r.Code() == codes.POST && path == "/rd":
		s.register(w, r, cc)
	case r.Code() == codes.POST && strings.HasPrefix(path, "/rd/"):
		s.update(w, r, path[len("/rd/"):], cc)
	case r.Code() == codes.DELETE && strings.HasPrefix(path, "/rd/"):
		s.deregister(w, path[len("/rd/"):])
	default:
		s.bad.Add(1)
		w.SetResponse(codes.NotFound, message.TextPlain, nil)
	}
}

// register handles POST /rd?ep=…&lt=…&b=U with a link-format payload.
func (s *Server) register(w *rw, r *pool.Message, cc *udpClient.Conn) {
	qs, _ := r.Options().Queries()
	var ep string
	lt := 86400 * time.Second // LwM2M's default lifetime
	for _, q := range qs {
		k, v, _ := strings.Cut(q, "=")
		switch k {
		case "ep":
			ep = v
		case "lt":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				s.bad.Add(1)
				w.SetResponse(codes.BadRequest, message.TextPlain, nil)
				return
			}
			lt = time.Duration(n) * time.Second
		}
	}
	if ep == "" || cc == nil {
		s.bad.Add(1)
		w.SetResponse(codes.BadRequest, message.TextPlain, nil)
		return
	}
	s.mu.Lock()
	s.next++
	id := strconv.FormatUint(uint64(s.cfg.Ordinal)<<40|s.next, 36)
	reg := &registration{id: id, ep: ep, lifetime: lt, expires: time.Now().Add(lt), conn: cc}
	if old := s.byEP[ep]; old != nil {
		delete(s.byID, old.id)
		s.reregs.Add(1)
	}
	s.byID[id], s.byEP[ep] = reg, reg
	s.mu.Unlock()
	s.regs.Add(1)
	w.SetResponse(codes.Created, message.TextPlain, nil,
		message.Option{ID: message.LocationPath, Value: []byte("rd")},
		message.Option{ID: message.LocationPath, Value: []byte(id)})
	// The response is sent when the handler returns; the observation
	// follows it, as a server observes what a device registered.
	go s.observe(cc, reg)
}

func (s *Server) observe(cc *udpClient.Conn, reg *registration) {
	ctx, cancel := context.WithTimeout(s.ctx, s.exchangeLifetime())
	defer cancel()
	_, err := cc.Observe(ctx, s.cfg.ObservePath, func(n *pool.Message) {
		if n.Type() == message.Confirmable {
			s.notifications.Add(1)
		}
	})
	if err != nil {
		s.obsFailed.Add(1)
		return
	}
	s.observations.Add(1)
}

// exchangeLifetime is how long a confirmable request may take before it
// is given up (RFC 7252 MAX_TRANSMIT_SPAN with the random factor, and a
// second for processing).
func (s *Server) exchangeLifetime() time.Duration {
	return time.Duration(float64(s.cfg.ACKTimeout)*1.5)*(1<<(s.cfg.MaxRetransmit+1)-1) + time.Second
}

func (s *Server) update(w *rw, r *pool.Message, id string, cc *udpClient.Conn) {
	s.mu.Lock()
	reg := s.byID[id]
	if reg != nil {
		reg.expires = time.Now().Add(reg.lifetime)
		reg.conn = cc
		qs, _ := r.Options().Queries()
		for _, q := range qs {
			if v, ok := strings.CutPrefix(q, "lt="); ok {
				if n, err := strconv.Atoi(v); err == nil && n > 0 {
					reg.lifetime = time.Duration(n) * time.Second
					reg.expires = time.Now().Add(reg.lifetime)
				}
			}
		}
	}
	s.mu.Unlock()
	if reg == nil {
		s.unknown.Add(1)
		w.SetResponse(codes.NotFound, message.TextPlain, nil)
		return
	}
	s.updates.Add(1)
	w.SetResponse(codes.Changed, message.TextPlain, nil)
}

func (s *Server) deregister(w *rw, id string) {
	s.mu.Lock()
	reg := s.byID[id]
	if reg != nil {
		delete(s.byID, id)
		if s.byEP[reg.ep] == reg {
			delete(s.byEP, reg.ep)
		}
	}
	s.mu.Unlock()
	if reg == nil {
		s.unknown.Add(1)
		w.SetResponse(codes.NotFound, message.TextPlain, nil)
		return
	}
	s.dereg.Add(1)
	w.SetResponse(codes.Deleted, message.TextPlain, nil)
}
