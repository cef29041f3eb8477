package demo

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/echobase"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// Records is the stack of `go run ./examples/demo`: backends and clients
// that exchange DTLS 1.2 records with RFC 9146 connection IDs, as a real
// session's look to the tier, but unencrypted and after a one-round-trip
// handshake (ClientHello, then a ServerHello that carries the CID). The
// proxies read only record headers and never decrypt, so they route these
// exactly as real sessions; what the demo saves is compiling a TLS stack,
// which would take most of its first run. piondemo.Stack runs the same
// demo with pion/dtls v3 handshakes and encryption.
var Records = Stack{
	Sessions: "DTLS 1.2 records with connection IDs, unencrypted (the tier reads only record headers; `cidproxy -demo` runs pion/dtls v3)",
	Backend:  listenRecords,
	Client:   dialRecords,
}

// cidLen is the length of the CIDs the demo's backends issue and its
// proxies read.
const cidLen = cidroute.DefaultDTLSCIDLen

// handshakeHeaderLen is a handshake message's header (RFC 6347 §4.2.2).
const handshakeHeaderLen = 12

// recordServer is a Records backend: one goroutine reads the PPv2
// adapter, answers a ClientHello with a new session's CID, and echoes the
// CID records of its sessions.
type recordServer struct {
	cfg  BackendConfig
	bc   *backend.Conn
	gen  func() []byte
	done chan struct{}

	mu        sync.Mutex
	byCID     map[string]*Session
	byHello   map[string][]byte // a resent ClientHello gets the same session's CID
	sessions  map[uint64]*Session
	next      uint64
	noSession uint64
	seq       uint64
}

func listenRecords(cfg BackendConfig) (Backend, error) {
	gen, err := dtls.Generator(dtls.OrdinalFirst{Length: cidLen}, cfg.Ordinal)
	if err != nil {
		return nil, err
	}
	bc, err := echobase.Listen(netip.AddrPort{}, backend.Config{
		TrustedProxies: cfg.TrustedProxies,
		Direct:         backend.DirectNoHandshake, // no client around the proxies
		Logger:         cfg.Logger,
		Protocol:       backend.DTLS,
		CIDLen:         cidLen,
	})
	if err != nil {
		return nil, err
	}
	s := &recordServer{cfg: cfg, bc: bc, gen: gen, done: make(chan struct{}),
		byCID: map[string]*Session{}, byHello: map[string][]byte{}, sessions: map[uint64]*Session{}}
	go s.serve()
	return s, nil
}

func (s *recordServer) Ordinal() uint8 { return s.cfg.Ordinal }

func (s *recordServer) Addr() netip.AddrPort { return echobase.Addr(s.bc) }

func (s *recordServer) Report() BackendReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return BackendReport{Adapter: s.bc.Stats(), NoSession: s.noSession, Sessions: echobase.InOrder(s.sessions, s.next)}
}

func (s *recordServer) Close() error {
	err := s.bc.Close()
	<-s.done
	return err
}

func (s *recordServer) serve() {
	defer close(s.done)
	buf := make([]byte, 2048)
	out := make([]byte, 0, 2048)
	var echo []byte
	for {
		n, from, err := s.bc.ReadFromAddr(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.cfg.Logger.Error("backend read failed", "ordinal", s.cfg.Ordinal, "err", err)
			}
			return
		}
		rec, _, err := dtls.ParseRecord(buf[:n], cidLen)
		if err != nil {
			s.cfg.Logger.Warn("unreadable record", "ordinal", s.cfg.Ordinal, "client", from.Client, "err", err)
			continue
		}
		var reply []byte
		switch {
		case rec.Type == dtls.Handshake && len(rec.Fragment) > handshakeHeaderLen && dtls.HandshakeType(rec.Fragment[0]) == dtls.HandshakeClientHello:
			cid := s.hello(string(rec.Fragment[handshakeHeaderLen:]), from)
			reply = s.record(out, dtls.Record{Type: dtls.Handshake, Fragment: dtls.AppendHandshake(nil, dtls.HandshakeServerHello, 0, cid)})
		case rec.Type == dtls.TLS12CID:
			id, ok := s.message(rec.CID, from)
			if !ok {
				continue // counted: a misrouted record
			}
			// The record's CID names a session of this backend: for a real
			// stack, the record would now have been decrypted, so the
			// route through its proxy is committed (see backend.Conn.Commit).
			s.bc.Commit(from, rec.CID)
			if s.cfg.Observe != nil {
				s.cfg.Observe(Message{Session: id, Data: rec.Fragment})
			}
			echo = append(append(echo[:0], s.cfg.Prefix...), rec.Fragment...)
			reply = s.record(out, dtls.Record{Type: dtls.ApplicationData, Epoch: 1, Fragment: echo})
		default:
			s.cfg.Logger.Warn("unexpected record", "ordinal", s.cfg.Ordinal, "type", rec.Type, "client", from.Client)
			continue
		}
		if _, err := s.bc.WriteToAddr(reply, from); err != nil {
			s.cfg.Logger.Warn("echo not sent", "ordinal", s.cfg.Ordinal, "client", from.Client, "err", err)
		}
	}
}

// hello returns the CID of the session a ClientHello with body starts.
func (s *recordServer) hello(body string, from backend.Addr) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cid := s.byHello[body]; cid != nil {
		return cid
	}
	s.next++
	ss := &Session{ID: s.next, First: from, Last: from}
	cid := s.gen()
	s.sessions[ss.ID], s.byHello[body], s.byCID[string(cid)] = ss, cid, ss
	return cid
}

// message accounts a CID record: false if no session has its CID.
func (s *recordServer) message(cid []byte, from backend.Addr) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byCID[string(cid)]
	if ss == nil {
		s.noSession++
		return 0, false
	}
	ss.Messages++
	if from != ss.Last {
		ss.Moves++
		ss.Last = from
	}
	return ss.ID, true
}

func (s *recordServer) record(dst []byte, r dtls.Record) []byte {
	s.mu.Lock()
	s.seq++
	r.Seq = s.seq
	s.mu.Unlock()
	r.Version = dtls.VersionDTLS12
	b, err := dtls.AppendRecord(dst[:0], r)
	if err != nil {
		panic(err) // the demo's records are valid by construction
	}
	return b
}

// recordClient is a Records client session.
type recordClient struct {
	sock *cidroutetest.RebindConn
	cid  []byte
	seq  uint64
	buf  []byte
}

func dialRecords(ctx context.Context, sock *cidroutetest.RebindConn, id int) (ClientConn, error) {
	c := &recordClient{sock: sock, buf: make([]byte, 2048)}
	nonce := make([]byte, 8)
	rand.Read(nonce)
	hello := dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, fmt.Appendf(nil, "client %d %x", id, nonce))
	for wait := firstWait; c.cid == nil; wait *= 2 {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("no ServerHello: %w", err)
		}
		if err := c.send(dtls.Record{Type: dtls.Handshake, Fragment: hello}); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(wait)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		rec, err := c.read(deadline)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			continue // resend
		case err != nil:
			return nil, err
		case rec.Type == dtls.Handshake && len(rec.Fragment) == handshakeHeaderLen+cidLen &&
			dtls.HandshakeType(rec.Fragment[0]) == dtls.HandshakeServerHello:
			c.cid = append([]byte(nil), rec.Fragment[handshakeHeaderLen:]...)
		}
	}
	return c, nil
}

func (c *recordClient) Write(msg []byte) error {
	return c.send(dtls.Record{Type: dtls.TLS12CID, Epoch: 1, CID: c.cid, Fragment: msg})
}

func (c *recordClient) Read(buf []byte, deadline time.Time) (int, error) {
	for {
		rec, err := c.read(deadline)
		if err != nil {
			return 0, err
		}
		if rec.Type == dtls.ApplicationData {
			return copy(buf, rec.Fragment), nil
		}
		// A ServerHello again, answering a resent ClientHello: not an echo.
	}
}

func (c *recordClient) CID() []byte  { return c.cid }
func (c *recordClient) Close() error { return c.sock.Close() }

func (c *recordClient) send(r dtls.Record) error {
	c.seq++
	r.Version, r.Seq = dtls.VersionDTLS12, c.seq
	b, err := dtls.AppendRecord(nil, r)
	if err != nil {
		return err
	}
	_, err = c.sock.WriteTo(b, net.UDPAddrFromAddrPort(Public))
	return err
}

// read returns the next readable record, skipping what is not one.
func (c *recordClient) read(deadline time.Time) (dtls.Record, error) {
	c.sock.SetReadDeadline(deadline)
	for {
		n, _, err := c.sock.ReadFrom(c.buf)
		if err != nil {
			return dtls.Record{}, err
		}
		if rec, _, err := dtls.ParseRecord(c.buf[:n], cidLen); err == nil {
			return rec, nil
		}
	}
}
