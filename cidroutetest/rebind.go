package cidroutetest

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/dtls"
)

// A RebindConn is a client-side net.PacketConn whose UDP socket can be
// swapped for a fresh one in the middle of a session, the way a NAT
// rebinding changes a client's source port, and pointed at another proxy
// replica at the same time. The protocol stack on top (a pion/dtls client,
// a quic-go Transport) sees one fixed remote address throughout: every
// datagram it reads appears to come from it, whatever replica actually
// sent it. That is what a client behind a load balancer sees, since all
// replicas answer from the one public address. Its methods are safe for
// concurrent use.
type RebindConn struct {
	remote net.Addr                     // what the stack is told it talks to
	listen func() (*net.UDPConn, error) // a fresh socket

	mu     sync.Mutex
	udp    *net.UDPConn
	target netip.AddrPort
	ports  int
	cidLen int
	cid    []byte
	qLen   int
	dcid   []byte
	rdl    time.Time
	closed bool
}

// ListenRebind opens a socket on 127.0.0.1 that sends to target. Reads
// report target as their source, unless remote is given: then remote is
// what the stack sees as its peer for the RebindConn's whole life.
func ListenRebind(target netip.AddrPort, remote net.Addr) (*RebindConn, error) {
	return ListenRebindFunc(func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	}, target, remote)
}

// ListenRebindFunc is ListenRebind with the sockets opened by listen, for
// a client elsewhere than on 127.0.0.1 (another address, another network
// namespace, a fixed port).
func ListenRebindFunc(listen func() (*net.UDPConn, error), target netip.AddrPort, remote net.Addr) (*RebindConn, error) {
	if remote == nil {
		remote = net.UDPAddrFromAddrPort(target)
	}
	c := &RebindConn{remote: remote, listen: listen}
	if err := c.Rebind(target); err != nil {
		return nil, err
	}
	return c, nil
}

// Rebind moves to a fresh socket (a new source port) that sends to
// target. A read blocked on the old socket goes on reading the new one.
func (c *RebindConn) Rebind(target netip.AddrPort) error {
	u, err := c.listen()
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		u.Close()
		return net.ErrClosed
	}
	old := c.udp
	c.udp, c.target = u, target
	c.ports++
	if !c.rdl.IsZero() {
		u.SetReadDeadline(c.rdl)
	}
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// Retarget keeps the socket and sends to target from now on, as when a
// load balancer starts picking another proxy replica for the same client
// address.
func (c *RebindConn) Retarget(target netip.AddrPort) {
	c.mu.Lock()
	c.target = target
	c.mu.Unlock()
}

// Local returns the current socket's address.
func (c *RebindConn) Local() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Target returns where writes go now.
func (c *RebindConn) Target() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.target
}

// Ports returns how many sockets the RebindConn has used.
func (c *RebindConn) Ports() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ports
}

// WatchDTLSCID makes the RebindConn remember the connection ID of the first
// outgoing DTLS tls12_cid record with a CID of cidLen bytes: the CID the
// server issued, so the client can tell which backend owns its session
// (pion does not expose it).
func (c *RebindConn) WatchDTLSCID(cidLen int) {
	c.mu.Lock()
	c.cidLen = cidLen
	c.mu.Unlock()
}

// CID returns the connection ID seen by WatchDTLSCID, or nil.
func (c *RebindConn) CID() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cid
}

// WatchQUICDCID makes the RebindConn remember the destination connection ID of
// the latest outgoing QUIC short-header packet, whose DCID has cidLen
// bytes: the server CID the client uses now, which changes on connection
// migration (quic-go does not expose it).
func (c *RebindConn) WatchQUICDCID(cidLen int) {
	c.mu.Lock()
	c.qLen = cidLen
	c.mu.Unlock()
}

// DCID returns a copy of the connection ID seen by WatchQUICDCID, or nil.
func (c *RebindConn) DCID() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.dcid...)
}

// ReadFrom reads from the current socket; a read interrupted by Rebind
// continues on the new one.
func (c *RebindConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		c.mu.Lock()
		u := c.udp
		c.mu.Unlock()
		n, _, err := u.ReadFromUDPAddrPort(b)
		if err == nil {
			return n, c.remote, nil
		}
		c.mu.Lock()
		swapped := c.udp != u && !c.closed
		c.mu.Unlock()
		if !swapped {
			return 0, nil, err
		}
	}
}

// WriteTo sends b to the current target; the address argument is ignored.
func (c *RebindConn) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	u, to := c.udp, c.target
	if c.cidLen > 0 && c.cid == nil {
		if cl, err := dtls.Classify(b, c.cidLen); err == nil && cl.Kind == dtls.KindEstablished {
			c.cid = append([]byte(nil), cl.CID...)
		}
	}
	if c.qLen > 0 && len(b) > c.qLen && b[0]&0xc0 == 0x40 {
		c.dcid = append(c.dcid[:0], b[1:1+c.qLen]...)
	}
	c.mu.Unlock()
	return u.WriteToUDPAddrPort(b, to)
}

// Close closes the current socket.
func (c *RebindConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.udp.Close()
}

// LocalAddr returns the current socket's address.
func (c *RebindConn) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(c.Local()) }

// SetDeadline sets the read deadline (writes do not block).
func (c *RebindConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// SetReadDeadline sets the read deadline of this and later sockets.
func (c *RebindConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	return c.udp.SetReadDeadline(t)
}

// SetWriteDeadline does nothing: UDP writes do not block.
func (c *RebindConn) SetWriteDeadline(time.Time) error { return nil }

// SetReadBuffer and SetWriteBuffer size the current socket's buffers
// (quic-go asks for them).
func (c *RebindConn) SetReadBuffer(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.udp.SetReadBuffer(n)
}

// SetWriteBuffer: see SetReadBuffer.
func (c *RebindConn) SetWriteBuffer(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.udp.SetWriteBuffer(n)
}

// SyscallConn returns the current socket's raw connection, so that
// quic-go can check its buffer sizes.
func (c *RebindConn) SyscallConn() (syscall.RawConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.udp.SyscallConn()
}

// NetConn returns a net.Conn view of c talking to its remote address, for
// stacks that take a connected socket (pion/dtls v2).
func (c *RebindConn) NetConn() net.Conn { return netConn{c} }

type netConn struct{ *RebindConn }

func (n netConn) Read(b []byte) (int, error) {
	k, _, err := n.ReadFrom(b)
	return k, err
}

func (n netConn) Write(b []byte) (int, error) { return n.WriteTo(b, nil) }
func (n netConn) RemoteAddr() net.Addr        { return n.remote }

var _ net.PacketConn = (*RebindConn)(nil)
