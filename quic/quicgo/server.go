package quicgo

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// A Listener is a quic-go server Listener that can drain: Drain stops new
// connections and gives the accepted ones time to end before the process
// does. It keeps track of the connections its Accept returned.
//
// Its methods are safe for concurrent use.
type Listener struct {
	ln serverListener

	mu    sync.Mutex
	conns map[*quic.Conn]struct{} // accepted and open
	ended chan struct{}           // signalled when a tracked connection ends
	cut   atomic.Uint64
}

// serverListener is a *quic.Listener or a *quic.EarlyListener.
type serverListener interface {
	Accept(context.Context) (*quic.Conn, error)
	Addr() net.Addr
	Close() error
}

// Listen starts a server on tr, as tr.Listen does, in a Listener.
func Listen(tr *quic.Transport, tlsConf *tls.Config, conf *quic.Config) (*Listener, error) {
	ln, err := tr.Listen(tlsConf, conf)
	if err != nil {
		return nil, err
	}
	return NewListener(ln), nil
}

// ListenEarly starts a server that accepts 0-RTT, as tr.ListenEarly does,
// in a Listener.
func ListenEarly(tr *quic.Transport, tlsConf *tls.Config, conf *quic.Config) (*Listener, error) {
	ln, err := tr.ListenEarly(tlsConf, conf)
	if err != nil {
		return nil, err
	}
	return NewEarlyListener(ln), nil
}

// NewListener wraps ln, a listener from quic.Transport.Listen. Only
// connections accepted through the Listener are drained.
func NewListener(ln *quic.Listener) *Listener { return newListener(ln) }

// NewEarlyListener wraps ln, a listener from quic.Transport.ListenEarly.
func NewEarlyListener(ln *quic.EarlyListener) *Listener { return newListener(ln) }

func newListener(ln serverListener) *Listener {
	return &Listener{ln: ln, conns: map[*quic.Conn]struct{}{}, ended: make(chan struct{}, 1)}
}

// Accept returns the next connection whose handshake completed.
func (l *Listener) Accept(ctx context.Context) (*quic.Conn, error) {
	c, err := l.ln.Accept(ctx)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	context.AfterFunc(c.Context(), func() { l.connEnded(c) })
	return c, nil
}

func (l *Listener) connEnded(c *quic.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	select {
	case l.ended <- struct{}{}:
	default:
	}
}

// Addr returns the listener's local address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close closes the listener, as quic.Listener.Close does: accepted
// connections and the transport run on.
func (l *Listener) Close() error { return l.ln.Close() }

// Conns returns the number of accepted connections still open.
func (l *Listener) Conns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// Cut returns the number of connections Drain closed at its deadline.
func (l *Listener) Cut() uint64 { return l.cut.Load() }

// Drain is a graceful stop. It closes the listener, not the transport:
// quic-go refuses handshakes still in flight (CONNECTION_REFUSED), drops
// new Initials and stops answering health probes, while every accepted
// connection runs on. Connections that completed their handshake before
// the close are still returned by Accept (keep calling it until it returns
// quic.ErrServerClosed) and are drained too. Drain waits until each
// accepted connection has ended or ctx is done, then closes those left
// with CONNECTION_CLOSE carrying code and reason, so that their clients
// reconnect, which the proxies send elsewhere.
//
// It returns the number of connections it closed (also counted by Cut),
// 0 when every connection ended by itself. Close the transport after it.
func (l *Listener) Drain(ctx context.Context, code quic.ApplicationErrorCode, reason string) (cut int) {
	l.ln.Close()
	for l.Conns() > 0 {
		select {
		case <-l.ended:
			continue
		case <-ctx.Done():
		}
		break
	}
	l.mu.Lock()
	left := make([]*quic.Conn, 0, len(l.conns))
	for c := range l.conns {
		left = append(left, c)
	}
	l.mu.Unlock()
	for _, c := range left {
		c.CloseWithError(code, reason)
	}
	l.cut.Add(uint64(len(left)))
	return len(left)
}
