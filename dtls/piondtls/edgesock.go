package piondtls

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// An edgeSock is the net.PacketConn under an EdgeConn's dtls.Conn. pion
// sees one peer, remote, for the session's life; writes go to the current
// edge, and datagrams from any edge of the set (or one the session used)
// are read as the peer's. Anything else is dropped and counted: it cannot
// be the session's, though pion's record authentication would reject it
// anyway.
type edgeSock struct {
	udp    *net.UDPConn
	remote net.Addr
	known  *atomic.Pointer[[]netip.AddrPort]

	received, strangers, silences atomic.Uint64

	mu        sync.Mutex
	target    netip.AddrPort
	used      []netip.AddrPort
	silence   time.Duration
	pending   time.Time // the first write since the target last answered
	timer     *time.Timer
	onSilence func(netip.AddrPort)
}

func newEdgeSock(udp *net.UDPConn, target netip.AddrPort, known *atomic.Pointer[[]netip.AddrPort]) *edgeSock {
	s := &edgeSock{udp: udp, known: known, target: target, used: []netip.AddrPort{target}}
	s.remote = edgeAddr{s}
	return s
}

// edgeAddr is the peer address pion is given: its String is the edge the
// session uses now. It is one comparable value, so pion never sees the
// peer move.
type edgeAddr struct{ s *edgeSock }

func (edgeAddr) Network() string  { return "udp" }
func (a edgeAddr) String() string { return a.s.current().String() }

func (s *edgeSock) current() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

// retarget sends from now on to to.
func (s *edgeSock) retarget(to netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if to == s.target {
		return
	}
	s.target = to
	if !slices.Contains(s.used, to) {
		s.used = append(s.used, to)
	}
	s.pending = time.Time{}
	if s.timer != nil {
		s.timer.Stop()
	}
}

// watchSilence calls f (from its own goroutine) when the target has sent
// nothing for d since a write.
func (s *edgeSock) watchSilence(d time.Duration, f func(netip.AddrPort)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.silence, s.onSilence = d, f
	s.timer = time.AfterFunc(d, s.checkSilence)
	s.timer.Stop()
}

func (s *edgeSock) stopSilence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onSilence = nil
	if s.timer != nil {
		s.timer.Stop()
	}
}

func (s *edgeSock) checkSilence() {
	s.mu.Lock()
	if s.onSilence == nil || s.pending.IsZero() {
		s.mu.Unlock()
		return
	}
	if left := s.silence - time.Since(s.pending); left > 0 {
		s.timer.Reset(left)
		s.mu.Unlock()
		return
	}
	from, f := s.target, s.onSilence
	s.pending = time.Time{}
	s.mu.Unlock()
	s.silences.Add(1)
	f(from)
}

func (s *edgeSock) WriteTo(b []byte, _ net.Addr) (int, error) {
	s.mu.Lock()
	to := s.target
	if s.onSilence != nil && s.pending.IsZero() {
		s.pending = time.Now()
		s.timer.Reset(s.silence)
	}
	s.mu.Unlock()
	return s.udp.WriteToUDPAddrPort(b, to)
}

func (s *edgeSock) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(b)
		if err != nil {
			return 0, nil, err
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		if !s.accept(from) {
			s.strangers.Add(1)
			continue
		}
		s.received.Add(1)
		return n, s.remote, nil
	}
}

func (s *edgeSock) accept(from netip.AddrPort) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from == s.target {
		s.pending = time.Time{}
		return true
	}
	if slices.Contains(s.used, from) {
		return true
	}
	if k := s.known.Load(); k != nil {
		return slices.Contains(*k, from)
	}
	return false
}

func (s *edgeSock) Close() error {
	s.stopSilence()
	return s.udp.Close()
}

func (s *edgeSock) LocalAddr() net.Addr                { return s.udp.LocalAddr() }
func (s *edgeSock) SetDeadline(t time.Time) error      { return s.udp.SetDeadline(t) }
func (s *edgeSock) SetReadDeadline(t time.Time) error  { return s.udp.SetReadDeadline(t) }
func (s *edgeSock) SetWriteDeadline(t time.Time) error { return s.udp.SetWriteDeadline(t) }

// A probeSock is a probe's socket to one edge. It times the handshake's
// flights: from a flight's first datagram to the first datagram that
// answers it.
type probeSock struct {
	*net.UDPConn
	to     netip.AddrPort
	remote net.Addr

	mu      sync.Mutex
	waiting bool // a flight is out, unanswered
	sent    time.Time
	sum     time.Duration
	n       int
}

func (p *probeSock) WriteTo(b []byte, _ net.Addr) (int, error) {
	p.mu.Lock()
	if !p.waiting {
		p.waiting, p.sent = true, time.Now()
	}
	p.mu.Unlock()
	return p.WriteToUDPAddrPort(b, p.to)
}

func (p *probeSock) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, from, err := p.ReadFromUDPAddrPort(b)
		if err != nil {
			return 0, nil, err
		}
		if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != p.to {
			continue
		}
		p.mu.Lock()
		if p.waiting {
			p.sum += time.Since(p.sent)
			p.n++
			p.waiting = false
		}
		p.mu.Unlock()
		return n, p.remote, nil
	}
}

// rtt returns the mean flight time.
func (p *probeSock) rtt() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		return 0
	}
	return p.sum / time.Duration(p.n)
}
