package e2e

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/dtls"
)

// soakSock is a soak client's UDP socket, as seen through a load balancer:
// the stack on top always talks to one remote (the public address), while
// the test moves the socket to another replica (Retarget, same source port:
// the load balancer rerouted it) or to a new source port (Rebind: a NAT
// rebinding). It counts every datagram it sends and receives, so that the
// test can hold the proxies' counters against what the clients did.
type soakSock struct {
	remote net.Addr

	mu     sync.Mutex
	udp    *net.UDPConn
	target netip.AddrPort
	cid    []byte // the first server CID this socket's DTLS client used
	rdl    time.Time
	closed bool

	sent, recv atomic.Uint64
	rebinds    atomic.Int64
	// swallow drops every datagram received while it is set, counted in
	// swallowed: a crashed backend sends no close_notify, and dtlsecho's
	// Close does, so its clients' sockets swallow it.
	swallow   atomic.Bool
	swallowed atomic.Uint64
}

func soakListen(target netip.AddrPort, remote netip.AddrPort) (*soakSock, error) {
	s := &soakSock{remote: net.UDPAddrFromAddrPort(remote), target: target}
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	s.udp = u
	return s, nil
}

// Rebind moves to a fresh socket (a new source port) that sends to target;
// the old one is closed, as a NAT forgets the old mapping.
func (s *soakSock) Rebind(target netip.AddrPort) error {
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		u.Close()
		return net.ErrClosed
	}
	old := s.udp
	s.udp, s.target = u, target
	if !s.rdl.IsZero() {
		u.SetReadDeadline(s.rdl)
	}
	s.mu.Unlock()
	s.rebinds.Add(1)
	return old.Close()
}

// Retarget sends to another replica from the same source port.
func (s *soakSock) Retarget(target netip.AddrPort) {
	s.mu.Lock()
	s.target = target
	s.mu.Unlock()
}

func (s *soakSock) Target() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

func (s *soakSock) Local() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// CID returns the server connection ID of the first tls12_cid record the
// socket sent (pion does not expose it), or nil.
func (s *soakSock) CID() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cid
}

func (s *soakSock) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		s.mu.Lock()
		u := s.udp
		s.mu.Unlock()
		n, _, err := u.ReadFromUDPAddrPort(b)
		if err == nil && s.swallow.Load() {
			s.swallowed.Add(1)
			continue
		}
		if err == nil {
			s.recv.Add(1)
			return n, s.remote, nil
		}
		s.mu.Lock()
		swapped := s.udp != u && !s.closed
		s.mu.Unlock()
		if !swapped {
			return 0, nil, err
		}
	}
}

func (s *soakSock) WriteTo(b []byte, _ net.Addr) (int, error) {
	s.mu.Lock()
	u, to := s.udp, s.target
	if s.cid == nil {
		if cl, err := dtls.Classify(b, soakCIDLen); err == nil && cl.Kind == dtls.KindEstablished {
			s.cid = append([]byte(nil), cl.CID...)
		}
	}
	s.mu.Unlock()
	n, err := u.WriteToUDPAddrPort(b, to)
	if err == nil {
		s.sent.Add(1)
	}
	return n, err
}

func (s *soakSock) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.udp.Close()
}

func (s *soakSock) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(s.Local()) }

func (s *soakSock) SetDeadline(t time.Time) error { return s.SetReadDeadline(t) }

func (s *soakSock) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdl = t
	return s.udp.SetReadDeadline(t)
}

func (s *soakSock) SetWriteDeadline(time.Time) error { return nil }

// The buffer methods let quic-go size the socket without a warning.
func (s *soakSock) SetReadBuffer(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp.SetReadBuffer(n)
}

func (s *soakSock) SetWriteBuffer(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp.SetWriteBuffer(n)
}

func (s *soakSock) SyscallConn() (syscall.RawConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.udp.SyscallConn()
}
