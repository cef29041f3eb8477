package piondtls

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// probeTimeout bounds how long pion may take to answer a probe.
const probeTimeout = 2 * time.Second

// probe answers the health probe hello from a (a ClientHello under a PPv2
// LOCAL header) with pion's first flight: a HelloVerifyRequest, or the
// ServerHello flight when the server skips the cookie exchange. pion runs
// on a PacketConn of its own that delivers hello, sends the first datagram
// pion writes and drops the rest; then the handshake is discarded. Nothing
// reaches Accept, nothing is logged.
func (l *PacketListener) probe(hello []byte, a *backend.Addr) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if l.newServer == nil || closed {
		l.st.probesDropped.Add(1)
		return
	}
	select {
	case l.probes <- struct{}{}:
	default:
		l.st.probesDropped.Add(1)
		return
	}
	pc := &probeConn{l: l, to: a, hello: append([]byte(nil), hello...),
		answered: make(chan struct{}), closed: make(chan struct{})}
	go func() {
		defer func() { <-l.probes }()
		c, err := l.newServer(pc, a)
		if err != nil {
			pc.Close()
			l.st.probesDropped.Add(1)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		done := make(chan struct{})
		go func() { c.HandshakeContext(ctx); close(done) }()
		select {
		case <-pc.answered:
			l.st.probes.Add(1)
		case <-ctx.Done():
			l.st.probesDropped.Add(1)
		case <-l.readDone:
		}
		cancel()
		c.Close()
		<-done
	}()
}

// probeConn is the PacketConn of a probe's throwaway handshake.
type probeConn struct {
	l     *PacketListener
	to    *backend.Addr
	hello []byte

	mu        sync.Mutex
	read      bool
	answered  chan struct{} // closed after the first write
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *probeConn) ReadFrom(b []byte) (int, net.Addr, error) {
	c.mu.Lock()
	first := !c.read
	c.read = true
	c.mu.Unlock()
	if first {
		return copy(b, c.hello), c.to, nil
	}
	<-c.closed
	return 0, nil, ErrClosed
}

// WriteTo sends pion's first datagram to the prober and drops the rest:
// its first record is what a prober checks. A HelloVerifyRequest takes
// the record sequence number of the hello, as RFC 6347 §4.2.2 wants
// (pion numbers its own records from 0): the prober ties the answer to
// its probe by it, so that answers forged from this backend's address,
// which cannot echo it, do not pass for this backend's.
func (c *probeConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.answered:
		return len(b), nil
	default:
	}
	close(c.answered)
	if hello, _, err := dtls.ParseRecord(c.hello, dtls.MinCIDLen); err == nil {
		if r, _, err := dtls.ParseRecord(b, dtls.MinCIDLen); err == nil && r.Type == dtls.Handshake && r.Epoch == 0 && len(r.Fragment) > 0 &&
			r.Fragment[0] == byte(dtls.HandshakeHelloVerifyRequest) && hello.Seq != r.Seq {
			b = append([]byte(nil), b...) // pion's buffer stays pion's
			putSeq48(b[5:11], hello.Seq)
		}
	}
	return c.l.conn.WriteToAddr(b, *c.to)
}

// putSeq48 writes a record's 48-bit sequence number.
func putSeq48(b []byte, seq uint64) {
	for i := 5; i >= 0; i-- {
		b[i] = byte(seq)
		seq >>= 8
	}
}

func (c *probeConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

func (c *probeConn) LocalAddr() net.Addr                { return c.l.conn.LocalAddr() }
func (c *probeConn) SetDeadline(t time.Time) error      { return nil }
func (c *probeConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *probeConn) SetWriteDeadline(t time.Time) error { return nil }

var _ net.PacketConn = (*probeConn)(nil)
