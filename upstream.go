package cidroute

import (
	"net"
	"net/netip"
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

// newSharedUpstream binds the upstream socket: the wildcard address of
// both families on a kernel-chosen port. It is not bound to the family or
// interface of today's backends because the registry changes them at run
// time, to any address of either family, while the socket is bound once;
// a wildcard socket lets the kernel pick the source address for each
// backend's route. Anyone can send to it, so a reply counts only when its
// physical sender is a backend (the reverse rule), and the port is in
// the process's own addresses, where neither rule sends.
func newSharedUpstream(rp *replies, lc udpio.ListenConfig, batch, maxDatagram int) (*sharedUpstream, error) {
	ups, err := udpio.ListenGroup("udp", ":0", 1, lc)
	if err != nil {
		return nil, err
	}
	u := &sharedUpstream{conn: ups[0], rp: rp,
		revIn: rxMessages(batch, maxDatagram), revOut: make([]udpio.Message, batch)}
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
		n, err := u.io.ReadBatch(u.revIn)
		if err != nil {
			return ended(err)
		}
		if err := u.rp.relay(u.revIn[:n], u.revOut, Session{}); err != nil {
			return err
		}
	}
}

func (u *sharedUpstream) wake()  { u.conn.SetReadDeadline(time.Unix(1, 0)) }
func (u *sharedUpstream) close() { u.conn.Close() }

func (u *sharedUpstream) addrs() []netip.AddrPort {
	return []netip.AddrPort{u.conn.LocalAddr().(*net.UDPAddr).AddrPort()}
}

func (u *sharedUpstream) sessions() int { return 0 }
