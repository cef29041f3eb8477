package cidroute

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cidroute/cidroute/udpio"
)

// sharedUpstream is the PPv2 mode's upstream: one socket per worker sends
// every datagram, header first, and receives every reply, which names its
// client in its own header. It keeps no per-client state.
type sharedUpstream struct {
	conn          *net.UDPConn
	io            *udpio.Conn
	rp            *replies
	revIn, revOut []udpio.Message
}

// newSharedUpstream serves the upstream socket conn, which newWorker binds
// to the wildcard address of both families on a kernel-chosen port (or
// inherits in a restart handover). It is not bound to the family or
// interface of today's backends because the registry changes them at run
// time, to any address of either family, while the socket is bound once;
// a wildcard socket lets the kernel pick the source address for each
// backend's route. Anyone can send to it, so a reply counts only when its
// physical sender is a backend (the reverse rule), and the port is in
// the process's own addresses, where neither rule sends.
// conn is closed on failure.
func newSharedUpstream(rp *replies, conn *net.UDPConn, batch, maxDatagram int) (*sharedUpstream, error) {
	u := &sharedUpstream{conn: conn, rp: rp,
		revIn: rxMessages(batch, maxDatagram+HeaderRoom), revOut: make([]udpio.Message, batch)}
	var err error
	if u.io, err = udpio.NewConn(u.conn, batch); err != nil {
		u.conn.Close()
		return nil, err
	}
	return u, nil
}

func (u *sharedUpstream) send(out []udpio.Message, _ []Session, c *Counters) error {
	return send(u.io, out, c)
}

// serve relays backends' replies to clients until shutdown.
func (u *sharedUpstream) serve() error {
	for {
		_, rerr, err := u.relayBatch()
		if rerr != nil {
			return ended(rerr)
		}
		if err != nil {
			return err
		}
	}
}

// relayBatch relays one batch of replies to their clients.
func (u *sharedUpstream) relayBatch() (n int, rerr, err error) {
	n, rerr = u.io.ReadBatch(u.revIn)
	if rerr != nil {
		return 0, rerr, nil
	}
	return n, nil, u.rp.relay(u.revIn[:n], u.revOut, Session{})
}

func (u *sharedUpstream) replyConn() *udpio.Conn { return u.io }
func (u *sharedUpstream) wake()                  { u.conn.SetReadDeadline(time.Unix(1, 0)) }
func (u *sharedUpstream) close()                 { u.io.Close() }
func (u *sharedUpstream) queue(c *Counters)      { addQueue(c, u.io) }

func (u *sharedUpstream) addrs() []netip.AddrPort {
	return []netip.AddrPort{u.conn.LocalAddr().(*net.UDPAddr).AddrPort()}
}

func (u *sharedUpstream) sessions() int   { return 0 }
func (u *sharedUpstream) evicted() uint64 { return 0 }

// replies is what both upstreams share to relay replies: the reverse rule
// and the service socket. It holds no pointer to the worker.
type replies struct {
	router *Router
	own    *atomic.Pointer[OwnAddrs]
	mu     sync.Mutex  // one writer at a time on out (transparent relays are many)
	out    *udpio.Conn // the service socket
	rev    liveCounters
	stall  *stall // the worker's, tests only

	maxDatagram int // Config.MaxDatagram: a longer reply is TooBig
}

func (rp *replies) view() View {
	return View{Snapshot: rp.router.backends.Snapshot(), Own: rp.own.Load()}
}

// relay applies the reverse rule to the received batch in and sends the
// replies it passes, from the service socket; sess is the session of a
// transparent socket. It counts the batch once.
func (rp *replies) relay(in, buf []udpio.Message, sess Session) error {
	var c Counters
	v := rp.view()
	if len(in) > 0 {
		c.batch(len(in))
		rp.stall.after(1)
	}
	out := buf[:0]
	for i := range in {
		m := &in[i]
		if m.Err != nil {
			c.Dropped[TooBig]++ // larger than the buffer: truncated
			continue
		}
		rep := rp.router.Reverse(m.Buf[:m.N], m.Addr, sess, &v)
		if rep.Reason != Forwarded {
			c.Dropped[rep.Reason]++
			continue
		}
		if len(rep.Payload) > rp.maxDatagram {
			c.Dropped[TooBig]++
			continue
		}
		o := &buf[len(out)]
		o.Prefix, o.Buf, o.Addr, o.Local = nil, rep.Payload, rep.Client, rep.Local
		out = out[:len(out)+1]
	}
	rp.mu.Lock()
	err := send(rp.out, out, &c)
	rp.mu.Unlock()
	for i := range out {
		out[i].Buf = nil // do not keep the receive buffer reachable
	}
	rp.rev.flush(&c)
	return err
}

// send writes a batch and counts each datagram as forwarded, too big or
// a send error. A socket-level error is returned; its datagrams are counted as
// send errors.
func send(c *udpio.Conn, out []udpio.Message, cnt *Counters) error {
	if len(out) == 0 {
		return nil
	}
	_, err := c.WriteBatch(out)
	for i := range out {
		if out[i].Err != nil {
			cnt.Dropped[sendReason(out[i].Err)]++
		} else {
			cnt.Forwarded++
		}
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}
