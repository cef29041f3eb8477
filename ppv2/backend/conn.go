package backend

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/addr"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/udpio"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrConfig is wrapped by New when a Config value is out of range.
	ErrConfig = errors.New("backend: invalid configuration")
	// ErrNoRoute is returned by a write that names a client only by address
	// (or by connection ID) when the route table has no live route for it.
	ErrNoRoute = errors.New("backend: no route to client")
	// ErrAddress is returned by a write whose address cannot be used: a
	// proxied Addr without a service address, or a net.Addr that is not an
	// IP address and port.
	ErrAddress = errors.New("backend: unusable address")
)

// Errors returned on the per-datagram write path, fixed so that returning
// one allocates nothing.
var (
	errNoRouteClient = fmt.Errorf("backend: write to a client address: %w", ErrNoRoute)
	errNoRouteCID    = fmt.Errorf("backend: write to a connection ID: %w", ErrNoRoute)
	errNilAddr       = fmt.Errorf("backend: nil address: %w", ErrAddress)
	errAddrKind      = fmt.Errorf("backend: address is not an IP address and port: %w", ErrAddress)
	errNoService     = fmt.Errorf("backend: proxied address without a service address: %w", ErrAddress)
)

// Protocol names the protocol spoken over the socket: the proxy's own
// cidroute.Protocol, whose zero value (AnyProtocol here) means the adapter
// does not look into payloads. It is only needed by DirectNoHandshake,
// which must recognise the datagrams that start a session.
type Protocol = cidroute.Protocol

const (
	// AnyProtocol: the adapter does not look into payloads.
	AnyProtocol Protocol = 0
	// DTLS 1.2 (a direct ClientHello starts a session).
	DTLS = cidroute.DTLS
	// QUIC v1/v2 (a direct Initial or 0-RTT packet starts a session).
	QUIC = cidroute.QUIC
)

// DirectPolicy says what happens to a datagram without the PPv2 signature
// ("sniff, don't require").
type DirectPolicy uint8

const (
	// DirectAccept delivers it as sent directly by its measured sender.
	// This lets PPv2 be enabled on the backends before the proxies.
	DirectAccept DirectPolicy = iota
	// DirectNoHandshake drops direct datagrams that would start a session
	// (a DTLS ClientHello, a QUIC Initial or 0-RTT packet, anywhere in the
	// datagram: Protocol.StartsSession, the definition the proxy's
	// admission limits use) and delivers the rest, so that no new client
	// bypasses the proxy tier while sessions that started directly before
	// the switch run on. Needs Config.Protocol.
	DirectNoHandshake
	// DirectDrop drops every datagram without the signature.
	DirectDrop
)

var directNames = [...]string{DirectAccept: "accept", DirectNoHandshake: "no-handshake", DirectDrop: "drop"}

// String returns the policy's name: "accept", "no-handshake" or "drop".
func (d DirectPolicy) String() string {
	if int(d) < len(directNames) {
		return directNames[d]
	}
	return fmt.Sprintf("DirectPolicy(%d)", uint8(d))
}

// MarshalText implements encoding.TextMarshaler with String's names.
func (d DirectPolicy) MarshalText() ([]byte, error) {
	if int(d) >= len(directNames) {
		return nil, fmt.Errorf("backend: direct policy %d: %w", uint8(d), ErrConfig)
	}
	return []byte(directNames[d]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler: "accept",
// "no-handshake" or "drop" (so a DirectPolicy works with flag.TextVar and
// encoding/json).
func (d *DirectPolicy) UnmarshalText(b []byte) error {
	for i, n := range directNames {
		if string(b) == n {
			*d = DirectPolicy(i)
			return nil
		}
	}
	return fmt.Errorf("backend: direct policy %q: want accept, no-handshake or drop: %w", b, ErrConfig)
}

// Config configures a Conn. The zero value accepts PPv2 from nobody and
// every direct datagram, i.e. behaves like the plain socket.
type Config struct {
	// TrustedProxies are the networks whose datagrams may carry a PPv2
	// header (the proxies' upstream addresses). A datagram with the
	// signature from any other sender is dropped: its header is an
	// assertion nobody vouches for. Empty (the default) trusts nobody, not
	// even loopback: set DefaultTrustedProxies() for proxies on this host.
	TrustedProxies []netip.Prefix
	// Direct is the policy for datagrams without the signature.
	Direct DirectPolicy
	// Protocol and CIDLen (the server's CID length; 0 = 8 for DTLS, 12
	// for QUIC) let DirectNoHandshake classify payloads.
	Protocol Protocol
	CIDLen   int // see Protocol
	// DropLocal drops PPv2 LOCAL datagrams (a proxy's own traffic, such as
	// a health check). By default they are delivered as direct datagrams
	// from the proxy, as the PROXY protocol specifies ("use the real
	// connection endpoints"), whatever Direct says: the sender is a
	// trusted proxy, not a client going around one.
	DropLocal bool
	// MaxRoutes bounds the route table and the cache of addresses handed
	// out by ReadFrom (0 = 65536 each). When full, expired routes are swept
	// and then an arbitrary route is evicted.
	MaxRoutes int
	// RouteIdle is how long a route lives without being committed again
	// (0 = 5 minutes; MinRouteIdle to MaxRouteIdle). A route is what
	// server-initiated datagrams (WriteToCID, a write to a client that
	// sent nothing lately) need; set it to the longest silence after which
	// the server still sends first, such as an LwM2M lifetime
	// (docs/backends.md). MaxRoutes bounds the table whatever it is.
	RouteIdle time.Duration
	// ManualCommit turns off commit-on-write (see Conn.WriteTo); routes
	// are then made only by Commit.
	ManualCommit bool
	// Batch is the number of datagrams read per recvmmsg (0 = 8), and
	// MaxDatagram the largest datagram accepted, PPv2 header included
	// (0 = 9216, the proxy's default). Larger ones are dropped (counted
	// as truncated).
	Batch, MaxDatagram int
	// Logger receives the adapter's warnings (nil: slog.Default()). It
	// never logs per datagram: a PPv2 datagram from a sender outside
	// TrustedProxies, the usual sign of a missing or wrong trusted set
	// (the client then sees only a handshake timeout), is logged the
	// first time and then at most every 10 s, with the sender, the
	// trusted set and the count so far (Stats.DroppedUntrusted).
	Logger *slog.Logger
}

// MinRouteIdle is the shortest Config.RouteIdle: a route must outlive the
// round trip of the reply it is made for, or every reply loses it.
const MinRouteIdle = time.Second

// MaxRouteIdle is the longest Config.RouteIdle: 31 days, past the longest
// LwM2M registration lifetimes in use; a longer value is a unit mistake.
const MaxRouteIdle = 31 * 24 * time.Hour

const (
	defaultMaxRoutes   = 65536
	defaultRouteIdle   = 5 * time.Minute
	defaultBatch       = 8
	defaultMaxDatagram = 9216
	maxHeader          = 256 // room for a reverse header; ours has no TLVs
)

func (cfg *Config) setDefaults() error {
	if cfg.MaxRoutes == 0 {
		cfg.MaxRoutes = defaultMaxRoutes
	}
	if cfg.RouteIdle == 0 {
		cfg.RouteIdle = defaultRouteIdle
	}
	if cfg.Batch == 0 {
		cfg.Batch = defaultBatch
	}
	if cfg.MaxDatagram == 0 {
		cfg.MaxDatagram = defaultMaxDatagram
	}
	if cfg.CIDLen == 0 {
		cfg.CIDLen = cfg.Protocol.DefaultCIDLen()
	}
	switch {
	case cfg.MaxRoutes < 1:
		return fmt.Errorf("backend: MaxRoutes %d: want at least 1: %w", cfg.MaxRoutes, ErrConfig)
	case cfg.RouteIdle < MinRouteIdle || cfg.RouteIdle > MaxRouteIdle:
		return fmt.Errorf("backend: RouteIdle %v: want 0 (default %v) or %v to %v: %w", cfg.RouteIdle, defaultRouteIdle, MinRouteIdle, MaxRouteIdle, ErrConfig)
	case cfg.Batch < 1 || cfg.Batch > 1024:
		return fmt.Errorf("backend: Batch %d: want 1 to 1024 datagrams: %w", cfg.Batch, ErrConfig)
	case cfg.MaxDatagram < 64 || cfg.MaxDatagram > 65535:
		return fmt.Errorf("backend: MaxDatagram %d: want 64 to 65535 bytes: %w", cfg.MaxDatagram, ErrConfig)
	case cfg.Direct > DirectDrop:
		return fmt.Errorf("backend: unknown Direct policy %d: %w", cfg.Direct, ErrConfig)
	case cfg.Protocol > QUIC:
		return fmt.Errorf("backend: unknown Protocol %d: %w", cfg.Protocol, ErrConfig)
	case cfg.Direct == DirectNoHandshake && cfg.Protocol == AnyProtocol:
		return fmt.Errorf("backend: DirectNoHandshake must recognise a handshake: set Protocol to DTLS or QUIC: %w", ErrConfig)
	case cfg.Protocol == DTLS && (cfg.CIDLen < dtls.MinCIDLen || cfg.CIDLen > dtls.MaxCIDLen):
		return fmt.Errorf("backend: DTLS CIDLen %d: want %d to %d: %w", cfg.CIDLen, dtls.MinCIDLen, dtls.MaxCIDLen, ErrConfig)
	case cfg.Protocol == QUIC && (cfg.CIDLen < 1 || cfg.CIDLen > quic.MaxCIDLen):
		return fmt.Errorf("backend: QUIC CIDLen %d: want 1 to %d: %w", cfg.CIDLen, quic.MaxCIDLen, ErrConfig)
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return fmt.Errorf("backend: TrustedProxies holds an invalid (zero) prefix: %w", ErrConfig)
		}
	}
	return nil
}

// A Conn is a net.PacketConn over a backend's UDP socket that sits behind
// PPv2 proxies. See the package documentation.
//
// All methods are safe for concurrent use. Reads are serialised with each
// other, and so are writes; a read and a write proceed in parallel.
type Conn struct {
	udp     *net.UDPConn
	io      *udpio.Conn
	cfg     Config
	trusted []netip.Prefix // unmapped copies of cfg.TrustedProxies
	epoch   time.Time
	now     func() int64 // nanoseconds since epoch; tests replace it

	rmu   sync.Mutex
	rmsgs []udpio.Message
	rnext int
	rn    int
	addrs map[Addr]*Addr // interned ReadFrom addresses

	wmu  sync.Mutex
	wmsg [1]udpio.Message
	hdr  []byte

	routes routeTable
	st     counters

	log           *slog.Logger
	untrustedNext atomic.Int64 // clock reading before which no untrusted sender is logged
}

var _ net.PacketConn = (*Conn)(nil)

// New wraps c. The Conn owns c from then on: Close closes it. c should not
// be read or written other than through the Conn.
func New(c *net.UDPConn, cfg Config) (*Conn, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	bio, err := udpio.NewConn(c, cfg.Batch)
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	cn := &Conn{udp: c, io: bio, cfg: cfg, epoch: time.Now(), log: cfg.Logger,
		rmsgs: make([]udpio.Message, cfg.Batch),
		addrs: make(map[Addr]*Addr),
		hdr:   make([]byte, 0, maxHeader),
	}
	cn.now = func() int64 { return int64(time.Since(cn.epoch)) }
	if cn.log == nil {
		cn.log = slog.Default()
	}
	for _, p := range cfg.TrustedProxies {
		cn.trusted = append(cn.trusted, netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-unmapBits(p))).Masked())
	}
	slab := make([]byte, cfg.Batch*cfg.MaxDatagram)
	for i := range cn.rmsgs {
		cn.rmsgs[i].Buf = slab[i*cfg.MaxDatagram : (i+1)*cfg.MaxDatagram : (i+1)*cfg.MaxDatagram]
	}
	cn.routes.init(cfg.MaxRoutes, int64(cfg.RouteIdle))
	return cn, nil
}

// unmapBits is the number of prefix bits an IPv4-mapped prefix loses when
// unmapped (96), else 0.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// ReadFrom reads the next accepted datagram's payload into p and returns
// its length and its *Addr: the claimed client (String) and, for a proxied
// datagram, the measured proxy and the service address. A payload longer
// than p is truncated to len(p). Dropped datagrams are counted (Stats) and
// never returned.
//
// The *Addr is shared: the same pointer comes back for every datagram with
// the same client, service and proxy while it stays in the Conn's bounded
// cache, so steady-state reads do not allocate. Do not modify it.
func (c *Conn) ReadFrom(p []byte) (int, net.Addr, error) {
	c.rmu.Lock()
	n, a, err := c.read(p)
	var ap *Addr
	if err == nil {
		ap = c.intern(a)
	}
	c.rmu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	return n, ap, nil
}

// ReadFromAddr is ReadFrom returning the address as a value. It does not
// allocate.
func (c *Conn) ReadFromAddr(p []byte) (int, Addr, error) {
	c.rmu.Lock()
	n, a, err := c.read(p)
	c.rmu.Unlock()
	return n, a, err
}

// read returns the next datagram that inspect accepts. c.rmu is held.
func (c *Conn) read(p []byte) (int, Addr, error) {
	for {
		if c.rnext >= c.rn {
			k, err := c.io.ReadBatch(c.rmsgs)
			if err != nil {
				return 0, Addr{}, err
			}
			c.rnext, c.rn = 0, k
			continue
		}
		m := &c.rmsgs[c.rnext]
		c.rnext++
		if m.Err != nil {
			c.st.droppedTruncated.Add(1)
			continue
		}
		b := m.Buf[:m.N]
		a, off, ok := c.inspect(b, m.Addr)
		if !ok {
			continue
		}
		return copy(p, b[off:]), a, nil
	}
}

// inspect applies the receive rules to datagram b from the measured
// sender from: it returns the address to report and the payload offset, or
// ok=false after counting the drop.
func (c *Conn) inspect(b []byte, from netip.AddrPort) (a Addr, off int, ok bool) {
	if ppv2.Sniff(b) {
		if !c.isTrusted(from.Addr()) {
			c.st.droppedUntrusted.Add(1)
			c.warnUntrusted(from)
			return Addr{}, 0, false
		}
		h, off, err := ppv2.Parse(b)
		if err != nil {
			c.st.droppedBadHeader.Add(1)
			return Addr{}, 0, false
		}
		if h.Command == ppv2.Local {
			if c.cfg.DropLocal {
				c.st.droppedLocal.Add(1)
				return Addr{}, 0, false
			}
			c.st.acceptedLocal.Add(1)
			return Addr{Client: from, Local: true}, off, true
		}
		if !usable(h.Src) || !usable(h.Dst) {
			c.st.droppedBadHeader.Add(1)
			return Addr{}, 0, false
		}
		c.st.acceptedProxied.Add(1)
		return Addr{Client: h.Src, Service: h.Dst, Proxy: from}, off, true
	}
	switch c.cfg.Direct {
	case DirectDrop:
		c.st.droppedDirect.Add(1)
		return Addr{}, 0, false
	case DirectNoHandshake:
		if c.cfg.Protocol.StartsSession(b, c.cfg.CIDLen) {
			c.st.droppedDirectHandshake.Add(1)
			return Addr{}, 0, false
		}
	}
	c.st.acceptedDirect.Add(1)
	return Addr{Client: from}, 0, true
}

// untrustedEvery is how often at most an untrusted sender is logged.
const untrustedEvery = int64(10 * time.Second)

// warnUntrusted logs a PPv2 datagram from an untrusted sender, at most once
// per untrustedEvery: the usual cause is a trusted set that misses the
// proxies, and the client sees nothing but a handshake timeout.
func (c *Conn) warnUntrusted(from netip.AddrPort) {
	now, next := c.now(), c.untrustedNext.Load()
	if now < next || !c.untrustedNext.CompareAndSwap(next, now+untrustedEvery) {
		return
	}
	trusted := "none: Config.TrustedProxies is empty"
	if len(c.cfg.TrustedProxies) > 0 {
		trusted = fmt.Sprint(c.cfg.TrustedProxies)
	}
	c.log.Warn("backend: dropped a PROXY v2 datagram from a sender outside the trusted proxies; if it is a proxy, add its address or network to them",
		"sender", from, "trusted_proxies", trusted, "dropped_untrusted", c.st.droppedUntrusted.Load())
}

// usable reports whether a header address can be written back in a reply
// header: a valid address with a port, not unspecified or multicast.
func usable(a netip.AddrPort) bool {
	ip := a.Addr()
	return ip.IsValid() && a.Port() != 0 && !ip.IsUnspecified() && !ip.IsMulticast()
}

func (c *Conn) isTrusted(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range c.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// intern returns the shared *Addr for a. c.rmu is held.
func (c *Conn) intern(a Addr) *Addr {
	if p, ok := c.addrs[a]; ok {
		return p
	}
	if len(c.addrs) >= c.cfg.MaxRoutes {
		for k := range c.addrs { // evict an arbitrary entry
			delete(c.addrs, k)
			break
		}
	}
	p := new(Addr)
	*p = a
	c.addrs[a] = p
	return p
}

// WriteTo sends p to addr:
//
//   - *Addr or Addr with a Proxy (as ReadFrom returned it): p goes through
//     that proxy with a reverse PPv2 header (source = Service, destination
//     = Client). This is the reply path: a reply to a request leaves
//     through the proxy that delivered the request. Unless
//     Config.ManualCommit is set, the write also commits the client's
//     route to addr (see Commit), just before sending: a DTLS or QUIC
//     stack writes to a peer address only after it accepted a datagram
//     from it.
//   - *Addr or Addr without a Proxy: p goes straight to Client, no header.
//   - any other net.Addr (*net.UDPAddr, ...): the client's committed route
//     is looked up (Route); without one the write fails with ErrNoRoute.
//
// Header and payload leave as two iovecs of one datagram; p is not copied.
// It does not allocate when addr is a *Addr.
func (c *Conn) WriteTo(p []byte, addr net.Addr) (int, error) {
	switch a := addr.(type) {
	case *Addr:
		if a == nil {
			return 0, errNilAddr
		}
		return c.WriteToAddr(p, *a)
	case Addr:
		return c.WriteToAddr(p, a)
	case *net.UDPAddr:
		if a == nil {
			return 0, errNilAddr
		}
		return c.writeRoute(p, a.AddrPort())
	case nil:
		return 0, errNilAddr
	default:
		ap, err := netip.ParseAddrPort(addr.String())
		if err != nil {
			return 0, errAddrKind
		}
		return c.writeRoute(p, ap)
	}
}

// WriteToAddr is WriteTo with an Addr value: through a.Proxy when it is
// set (committing the route unless Config.ManualCommit), else directly to
// a.Client. It does not allocate.
func (c *Conn) WriteToAddr(p []byte, a Addr) (int, error) {
	if a.Proxy.IsValid() && !a.Service.IsValid() {
		return 0, errNoService
	}
	if a.Proxy.IsValid() && !c.cfg.ManualCommit {
		// Before the send, so that the route is in place by the time
		// the client can react to the datagram.
		c.routes.commit(a, nil, c.now())
	}
	return c.send(p, a)
}

func (c *Conn) writeRoute(p []byte, client netip.AddrPort) (int, error) {
	a, ok := c.routes.lookupClient(addr.Unmap(client), c.now())
	if !ok {
		c.st.writeNoRoute.Add(1)
		return 0, errNoRouteClient
	}
	return c.send(p, a)
}

// WriteToCID sends p to the session that issued connection ID cid, through
// the proxy and to the client address of its newest committed route. This
// is for messages the server starts on its own, after the client may have
// moved. Without a live route it fails with ErrNoRoute.
func (c *Conn) WriteToCID(p, cid []byte) (int, error) {
	a, ok := c.routes.lookupCID(cid, c.now())
	if !ok {
		c.st.writeNoRoute.Add(1)
		return 0, errNoRouteCID
	}
	return c.send(p, a)
}

// send writes one datagram; it commits nothing.
func (c *Conn) send(p []byte, a Addr) (int, error) {
	c.wmu.Lock()
	m := &c.wmsg[0]
	if a.Proxy.IsValid() {
		if !a.Service.IsValid() {
			c.wmu.Unlock()
			return 0, errNoService
		}
		h, err := ppv2.AppendHeader(c.hdr[:0], ppv2.Header{Command: ppv2.Proxy, Src: a.Service, Dst: a.Client})
		if err != nil {
			c.wmu.Unlock()
			return 0, fmt.Errorf("backend: reverse header: %w", err)
		}
		m.Prefix, m.Addr = h, a.Proxy
	} else {
		m.Prefix, m.Addr = nil, a.Client
	}
	m.Buf = p
	_, err := c.io.WriteBatch(c.wmsg[:])
	if err == nil {
		err = m.Err
	}
	m.Buf, m.Prefix = nil, nil // do not keep the caller's buffer
	c.wmu.Unlock()
	if err != nil {
		c.st.writeErrors.Add(1)
		return 0, err
	}
	if a.Proxy.IsValid() {
		c.st.writtenProxied.Add(1)
	} else {
		c.st.writtenDirect.Add(1)
	}
	return len(p), nil
}

// Commit records that the protocol layer accepted (authenticated) a
// datagram that ReadFrom reported as a, of the session with connection ID
// cid (nil if it has none yet): later writes that name only the client
// address (WriteTo with a *net.UDPAddr) or the connection ID (WriteToCID)
// go to a.Client through a.Proxy. A route is keyed by the client address
// and, once known, by the CID; committing a known CID with a new client
// address moves the route (the client rebound) and the old address no
// longer resolves; a route that held the new address before is dropped,
// since its session no longer owns it. Commit of an address without a Proxy
// or Service does nothing.
//
// Never commit on inspection alone: a forged datagram would redirect the
// session's replies. Commit allocates only when it creates a route.
func (c *Conn) Commit(a Addr, cid []byte) {
	if !a.Proxy.IsValid() || !a.Service.IsValid() {
		return
	}
	c.routes.commit(a, cid, c.now())
}

// Route returns the live route committed for client.
func (c *Conn) Route(client netip.AddrPort) (Addr, bool) {
	return c.routes.lookupClient(addr.Unmap(client), c.now())
}

// RouteCID returns the live route committed for connection ID cid.
func (c *Conn) RouteCID(cid []byte) (Addr, bool) {
	return c.routes.lookupCID(cid, c.now())
}

// Forget removes the routes of client and of cid (either may be zero/nil),
// for a session that ended.
func (c *Conn) Forget(client netip.AddrPort, cid []byte) {
	c.routes.forget(addr.Unmap(client), cid)
}

// Close closes the socket. Blocked reads return an error wrapping
// net.ErrClosed.
func (c *Conn) Close() error { return c.udp.Close() }

// LocalAddr returns the socket's address.
func (c *Conn) LocalAddr() net.Addr { return c.udp.LocalAddr() }

// SetDeadline, SetReadDeadline and SetWriteDeadline set the socket's
// deadlines. Datagrams already read in a batch are delivered before a read
// deadline is noticed.
func (c *Conn) SetDeadline(t time.Time) error { return c.udp.SetDeadline(t) }

// SetReadDeadline sets the socket's read deadline (see SetDeadline).
func (c *Conn) SetReadDeadline(t time.Time) error { return c.udp.SetReadDeadline(t) }

// SetWriteDeadline sets the socket's write deadline.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.udp.SetWriteDeadline(t) }

// SetReadBuffer and SetWriteBuffer size the socket's buffers (quic-go
// calls them, and would warn without them).
func (c *Conn) SetReadBuffer(bytes int) error { return c.udp.SetReadBuffer(bytes) }

// SetWriteBuffer sizes the socket's send buffer (see SetReadBuffer).
func (c *Conn) SetWriteBuffer(bytes int) error { return c.udp.SetWriteBuffer(bytes) }

// SyscallConn returns the socket's raw connection, so that quic-go can
// check the buffer sizes it set and set the don't-fragment bit. Reading or
// writing through it bypasses the adapter.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.udp.SyscallConn() }
