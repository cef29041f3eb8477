package cidroute

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// headerRoom is the capacity reserved per datagram for the encoder's
// header: a PPv2 IPv6 header (52 bytes) with room for TLVs.
const headerRoom = 256

// A worker serves one SO_REUSEPORT socket of a service: a forward goroutine
// (service socket → upstream socket) and a reverse one (upstream → service
// socket). All batch state is allocated here, once.
type worker struct {
	svc    *service
	inConn *net.UDPConn // one of the service's SO_REUSEPORT sockets
	upConn *net.UDPConn // this worker's source towards the backends
	in, up *udpio.Conn
	upPort uint16
	adm    *Admission
	// sessions is the transparent-mode session table; nil in PPv2 mode,
	// where upConn is the shared upstream socket instead.
	sessions *sessionTable
	clients  []netip.AddrPort // transparent: client of fwdOut[i]
	locals   []netip.Addr     // transparent: the address that client sent to

	fwdIn, fwdOut []udpio.Message
	revIn, revOut []udpio.Message

	fwd, rev liveCounters
}

func newWorker(s *service, in *net.UDPConn, sc Service, cfg Config) (*worker, error) {
	w := &worker{svc: s, inConn: in, adm: NewAdmission(sc.Limits, sc.Workers)}
	n := cfg.BatchSize
	var err error
	if w.in, err = udpio.NewConn(in, n); err != nil {
		return nil, err
	}
	if sc.Transparent {
		w.sessions = newSessionTable(w, sc, cfg.MaxDatagram)
		w.clients = make([]netip.AddrPort, n)
		w.locals = make([]netip.Addr, n)
	} else {
		lc := udpio.ListenConfig{RecvBuffer: sc.RecvBuffer, SendBuffer: sc.SendBuffer}
		ups, err := udpio.ListenGroup("udp", ":0", 1, lc)
		if err != nil {
			return nil, fmt.Errorf("upstream socket: %w", err)
		}
		w.upConn = ups[0]
		w.upPort = w.upConn.LocalAddr().(*net.UDPAddr).AddrPort().Port()
		if w.up, err = udpio.NewConn(w.upConn, n); err != nil {
			w.upConn.Close()
			return nil, err
		}
	}
	w.fwdIn, w.revIn = rxMessages(n, cfg.MaxDatagram), rxMessages(n, cfg.MaxDatagram)
	w.fwdOut, w.revOut = make([]udpio.Message, n), make([]udpio.Message, n)
	hdrs := make([]byte, n*headerRoom)
	for i := range w.fwdOut {
		w.fwdOut[i].Prefix = hdrs[i*headerRoom : i*headerRoom : (i+1)*headerRoom]
	}
	return w, nil
}

func (w *worker) closeUpstream() {
	if w.upConn != nil {
		w.upConn.Close()
	}
}

// loops returns the goroutines that serve the worker.
func (w *worker) loops() []func() error {
	if w.sessions != nil {
		return []func() error{w.forwardLoop} // relays and sweeper belong to the table
	}
	return []func() error{w.forwardLoop, w.reverseLoop}
}

func rxMessages(n, size int) []udpio.Message {
	ms := make([]udpio.Message, n)
	slab := make([]byte, n*size)
	for i := range ms {
		ms[i].Buf = slab[i*size : (i+1)*size : (i+1)*size]
	}
	return ms
}

// forwardLoop moves client datagrams to backends until the socket is
// closed or its read deadline passes (shutdown).
func (w *worker) forwardLoop() error {
	r := w.svc.router
	var c Counters
	for {
		n, err := w.in.ReadBatch(w.fwdIn)
		if err != nil {
			return ended(err)
		}
		snap, stale := r.backends.Snapshot(), r.backends.Stale()
		var now int64
		if w.adm != nil {
			now = time.Now().UnixNano() // once per batch, and only with limits
		}
		c.Received += uint64(n)
		out := w.fwdOut[:0]
		for i := range w.fwdIn[:n] {
			o := &w.fwdOut[len(out)]
			if reason := w.forward(&w.fwdIn[i], o, snap, stale, now); reason != Forwarded {
				c.Dropped[reason]++
				continue
			}
			if w.sessions != nil {
				w.clients[len(out)] = w.fwdIn[i].Addr
				w.locals[len(out)] = netip.Addr{}
				if w.svc.measured {
					w.locals[len(out)] = w.fwdIn[i].Local
				}
			}
			out = out[:len(out)+1]
		}
		if w.sessions != nil {
			w.sessions.send(out, w.clients, w.locals, &c)
		} else {
			err = send(w.up, out, &c)
		}
		w.fwd.flush(&c)
		if err != nil {
			return err
		}
	}
}

// forward routes one client datagram m into o, following SPEC.md's routing
// table; every refusal names its drop reason.
func (w *worker) forward(m, o *udpio.Message, snap *registry.Snapshot, stale bool, now int64) Reason {
	if m.Err != nil {
		return Malformed // larger than MaxDatagram
	}
	r := w.svc.router
	b := m.Buf[:m.N]
	var c Class
	if r.classify(b, &c) != nil {
		return Malformed
	}
	if w.adm != nil && !w.adm.Admit(c, m.Addr, now) {
		return RateLimited
	}
	be, reason := r.decide(snap, stale, &c, m.Addr)
	if reason != Forwarded {
		return reason
	}
	o.Buf, o.Addr, o.Local = b, be.Addr, netip.Addr{}
	if w.sessions != nil {
		o.Prefix = nil // transparent: the datagram goes unchanged
		return Forwarded
	}
	service := r.service
	if w.svc.measured && m.Local.IsValid() {
		service = netip.AddrPortFrom(m.Local, service.Port())
	}
	hdr, err := r.appendHeader(o.Prefix[:cap(o.Prefix)][:0], m.Addr, service)
	if err != nil {
		return Malformed
	}
	o.Prefix = hdr
	return Forwarded
}

// reverseLoop relays backends' replies to clients until shutdown.
func (w *worker) reverseLoop() error {
	r := w.svc.router
	var c Counters
	for {
		n, err := w.up.ReadBatch(w.revIn)
		if err != nil {
			return ended(err)
		}
		snap := r.backends.Snapshot()
		c.Received += uint64(n)
		out := w.revOut[:0]
		for i := range w.revIn[:n] {
			o := &w.revOut[len(out)]
			if reason := w.reverse(&w.revIn[i], o, snap); reason != Forwarded {
				c.Dropped[reason]++
				continue
			}
			out = out[:len(out)+1]
		}
		err = send(w.in, out, &c)
		w.rev.flush(&c)
		if err != nil {
			return err
		}
	}
}

// reverse checks one backend reply m and prepares o, the payload to its
// client.
func (w *worker) reverse(m, o *udpio.Message, snap *registry.Snapshot) Reason {
	if m.Err != nil {
		if !snap.IsBackend(m.Addr) {
			return UntrustedSender
		}
		return Malformed
	}
	client, service, payload, reason := w.svc.reply(snap, m.Addr, m.Buf[:m.N])
	if reason != Forwarded {
		return reason
	}
	o.Prefix, o.Buf, o.Addr, o.Local = nil, payload, client, netip.Addr{}
	if w.svc.measured {
		o.Local = service.Addr() // leave from the address the client used
	}
	return Forwarded
}

// reply is the reverse path's rule: a datagram b from the physical sender
// from is relayed only when from is a backend of the service, its PPv2
// source is the service's address and its destination a valid unicast
// client. It returns the client, the service address the backend named and
// the payload (a view into b).
func (s *service) reply(snap *registry.Snapshot, from netip.AddrPort, b []byte) (client, service netip.AddrPort, payload []byte, reason Reason) {
	if !snap.IsBackend(from) {
		return client, service, nil, UntrustedSender
	}
	h, off, err := ppv2.Parse(b)
	if err != nil || h.Command != ppv2.Proxy || !s.isServiceAddr(unmap(h.Src)) {
		return client, service, nil, BadProxyHeader
	}
	client = unmap(h.Dst)
	if !s.validClient(client) {
		return client, service, nil, BadDestination
	}
	return client, unmap(h.Src), b[off:], Forwarded
}

// isServiceAddr reports whether a is the service's public address; when
// that is a wildcard, any unicast address on the service's port.
func (s *service) isServiceAddr(a netip.AddrPort) bool {
	l := s.router.service
	if !s.measured {
		return a == l
	}
	ip := a.Addr()
	return a.Port() == l.Port() && ip.IsValid() && !ip.IsUnspecified() && !ip.IsMulticast()
}

var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// validClient reports whether a reply may be sent to a: a unicast address
// that is not the proxy's own, and not loopback unless the service itself
// listens on loopback (so a backend cannot aim the proxy at local services).
func (s *service) validClient(a netip.AddrPort) bool {
	ip := a.Addr()
	switch {
	case !ip.IsValid(), a.Port() == 0, ip.IsUnspecified(), ip.IsMulticast(), ip == limitedBroadcast:
		return false
	case ip.IsLoopback() && !s.router.service.Addr().IsLoopback():
		return false
	}
	// The proxy's own sockets: the service's ports and the upstream ports,
	// on loopback or on the service's own addresses.
	own := ip.IsLoopback() || ip == s.router.service.Addr() || ip == s.cfg.Listen.Addr()
	if !own {
		return true
	}
	if a.Port() == s.router.service.Port() || a.Port() == s.cfg.Listen.Port() {
		return false
	}
	for _, w := range s.workers {
		if a.Port() == w.upPort {
			return false
		}
	}
	return true
}

// send writes a batch and counts each datagram as forwarded or as a send
// error. A socket-level error is returned; its datagrams are counted as
// send errors.
func send(c *udpio.Conn, out []udpio.Message, cnt *Counters) error {
	if len(out) == 0 {
		return nil
	}
	_, err := c.WriteBatch(out)
	for i := range out {
		if out[i].Err != nil {
			cnt.Dropped[SendError]++
		} else {
			cnt.Forwarded++
		}
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// ended maps the read error that ends a loop: a shutdown is not an error.
func ended(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("receive: %w", err)
}
