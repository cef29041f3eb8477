package cidroute

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/addr"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// Backends is where a service's routing reads its backends: a
// *registry.Registry, or anything that publishes registry snapshots.
// Both methods run once per batch and must be cheap and safe for
// concurrent use.
type Backends interface {
	// Snapshot returns the current backends; the Router does not modify
	// or retain it beyond the batch.
	Snapshot() *registry.Snapshot
	// Stale reports that the source has not confirmed the snapshot within
	// its freshness limit: new sessions are refused, CID routes go on.
	Stale() bool
}

var _ Backends = (*registry.Registry)(nil)

// An Encoder writes the header that goes in front of a forwarded datagram.
// It must not allocate when dst has room, and must be safe for concurrent
// use.
type Encoder interface {
	// AppendHeader appends the header for a datagram from client to the
	// service address, and returns the extended dst.
	AppendHeader(dst []byte, client, service netip.AddrPort) ([]byte, error)
}

// PPv2Encoder writes a PROXY protocol v2 header (v2 PROXY over DGRAM):
// source = the client as measured, destination = the service address.
type PPv2Encoder struct {
	// CRC adds a CRC32C TLV, for backends that verify it.
	CRC bool
}

// AppendHeader implements Encoder.
func (e PPv2Encoder) AppendHeader(dst []byte, client, service netip.AddrPort) ([]byte, error) {
	if e.CRC {
		return ppv2.AppendHeaderCRC(dst, ppv2.Header{Command: ppv2.Proxy, Src: client, Dst: service})
	}
	return ppv2.AppendProxy(dst, client, service)
}

// HeaderRoom is room enough for any header the built-in encoder writes (a
// PPv2 IPv6 header is 52 bytes, 59 with the CRC TLV): the headroom to
// leave in front of a datagram for ForwardAt.
const HeaderRoom = 256

// Protocol is the transport a service speaks. The zero Protocol names
// none.
type Protocol uint8

const (
	DTLS Protocol = iota + 1 // DTLS 1.2 with Connection ID (RFC 9146)
	QUIC                     // QUIC v1 and v2 (RFC 9000, RFC 9369)
)

// String returns "dtls" or "quic", the names ParseProtocol reads, or
// "invalid".
func (p Protocol) String() string {
	switch p {
	case DTLS:
		return "dtls"
	case QUIC:
		return "quic"
	}
	return "invalid"
}

// ParseProtocol parses "dtls" or "quic". Anything else is an error
// wrapping ErrConfig.
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "dtls":
		return DTLS, nil
	case "quic":
		return QUIC, nil
	}
	return 0, fmt.Errorf("cidroute: protocol %q: want \"dtls\" or \"quic\": %w", s, ErrConfig)
}

// Default CID lengths: those of the built-in codecs' zero values, 8 for
// DTLS (ordinal-first) and 12 for QUIC (QUIC-LB), so that a QUIC server CID
// is never confused with a client's random 8-byte DCID.
const (
	DefaultDTLSCIDLen = dtls.OrdinalFirstDefaultLen // 8
	DefaultQUICCIDLen = quic.LBDefaultLen           // 12
)

// DefaultCIDLen returns the protocol's default CID length, 0 for none.
func (p Protocol) DefaultCIDLen() int {
	switch p {
	case DTLS:
		return DefaultDTLSCIDLen
	case QUIC:
		return DefaultQUICCIDLen
	}
	return 0
}

// StartsSession reports whether datagram b, of a service of protocol p
// whose CIDs are cidLen bytes long, opens a session at a server
// (dtls.StartsSession, quic.StartsSession). The forward rule counts such
// datagrams against the handshake and 0-RTT limits whatever else they
// carry; ppv2/backend drops them when they arrive directly.
func (p Protocol) StartsSession(b []byte, cidLen int) bool {
	switch p {
	case DTLS:
		return dtls.StartsSession(b, cidLen)
	case QUIC:
		return quic.StartsSession(b, cidLen)
	}
	return false
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("cidroute: invalid configuration")

// ErrCIDLength is the Decision.Err of a datagram dropped as CIDLength: it
// carries a server CID of another length than the service's, which only a
// misconfiguration produces (backends that issue CIDs of one length, a
// proxy configured with another). Decision.Class.ID is then that CID, of
// its own length. What can be told on the wire:
//
//   - a QUIC long header packet names its DCID length: a Handshake packet
//     (the first packet of the datagram) whose DCID is not of the service's
//     length is CIDLength, also when the rest of the datagram does not
//     parse (quic-go coalesces its Handshake and 1-RTT packets);
//   - a DTLS tls12_cid record and a QUIC short header do not. A DTLS
//     datagram the classifier rejects is CIDLength when it is well formed
//     under another CID length (dtls.MismatchedCID), tried on the drop path
//     only. A short header is read with the service's length whatever the
//     client meant: a CID longer or shorter than that still routes by its
//     ordinal octet when the codec's ordinal sits inside both (byte 0 for
//     ordinal-first, byte 1 for QUIC-LB plaintext), or is dropped by the
//     codec's own checks; neither is told apart from a good route or
//     another drop.
//
// The built-in classifiers only: a custom Classifier's rejections stay
// Malformed, and its established CIDs of another length CIDLength.
var ErrCIDLength = errors.New("cidroute: CID of another length than the service's")

// ErrDTLS13NoCID is the Decision.Err of a datagram dropped as DTLS13NoCID:
// well-formed DTLS 1.3 (RFC 9147) that the service cannot route by CID.
// Either
//
//   - its ciphertext records (unified headers) carry no CID, it opens no
//     session, and RouterConfig.RequireDTLS13CID asks for one (the
//     DTLSClassifier returns it); or
//   - its first CID record, the last of the datagram, is a unified header
//     without length that is too short for a CID of the service's length
//     and 16 bytes of ciphertext, but not for a shorter CID
//     (dtls.ShortCID, tried on the drop path only): a peer that uses
//     shorter CIDs than the service, by how much the record does not say.
//     Only services whose CIDs are longer than 16 bytes can see it.
//
// A unified header with length whose CID is of another length is
// CIDLength, as a tls12_cid record is.
var ErrDTLS13NoCID = errors.New("cidroute: DTLS 1.3 records without a CID the service can route by")

// UnroutablePolicy says what the forward rule does with a datagram whose
// CID the codec marks not routable: a QUIC-LB CID with config rotation
// 0b111, or with a rotation codepoint this service is not configured with.
type UnroutablePolicy uint8

const (
	// UnroutableDrop drops it, counted as Unroutable. The default: the
	// built-in codecs always encode an ordinal, so no backend of a
	// cidroute service issues such a CID; hashing would deliver random
	// bytes to backends (7 in 8 random short headers carry a rotation
	// codepoint other than the configured one), and could not keep a
	// session anyway, since a connection's Initial packets are hashed by
	// their DCID and its later packets would be hashed by the client
	// address, which generally picks another backend.
	UnroutableDrop UnroutablePolicy = iota
	// UnroutableHash routes it by HRW over the ready backends with the
	// client address as the key, draft-ietf-quic-load-balancers-21's
	// fallback, for backends that issue unroutable CIDs and a single
	// backend or a client-address-consistent fallback.
	UnroutableHash
)

// String returns "drop" or "hash", the names UnmarshalText reads, or
// "invalid".
func (u UnroutablePolicy) String() string {
	switch u {
	case UnroutableDrop:
		return "drop"
	case UnroutableHash:
		return "hash"
	}
	return "invalid"
}

// MarshalText implements encoding.TextMarshaler ("drop", "hash").
func (u UnroutablePolicy) MarshalText() ([]byte, error) {
	if u > UnroutableHash {
		return nil, fmt.Errorf("cidroute: unroutable policy %d: %w", u, ErrConfig)
	}
	return []byte(u.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler ("drop", "hash").
func (u *UnroutablePolicy) UnmarshalText(b []byte) error {
	switch string(b) {
	case "drop":
		*u = UnroutableDrop
	case "hash":
		*u = UnroutableHash
	default:
		return fmt.Errorf("cidroute: unroutable %q: want \"drop\" or \"hash\": %w", b, ErrConfig)
	}
	return nil
}

// RouterConfig is what a Router needs. Zero fields take defaults.
type RouterConfig struct {
	// Protocol is the service's transport, DTLS or QUIC; it picks the
	// classifier and the default codec. Required.
	Protocol Protocol
	// PublicAddr is the service's public address: the HRW key of DTLS
	// datagrams without CID uses it, so every replica must be configured
	// with the same one (behind a load balancer, the VIP); it is the PPv2
	// destination, and the only source a reply's header may name. A
	// wildcard address (0.0.0.0 or ::) stands for the address each
	// datagram was sent to (the forward rule's local argument).
	PublicAddr netip.AddrPort
	// Codec is the CID layout; nil means dtls.OrdinalFirst of CIDLen
	// (DTLS) or quic.LB of CIDLen (QUIC).
	Codec CIDCodec
	// CIDLen is the CID length when Codec is nil: 0 means 8 (DTLS) or 12
	// (QUIC). A QUIC service refuses 8, and the ordinal-first codec of 8
	// or more octets, whatever the codec (quic.CheckServerCIDLen): a
	// client's random first DCID could pass for a server CID.
	CIDLen int
	// Classifier nil means the protocol's classifier for Codec.Len().
	Classifier Classifier
	// RequireDTLS13CID (DTLS, with the built-in classifier) drops DTLS 1.3
	// ciphertext records without a CID as DTLS13NoCID instead of hashing
	// them by client address (DTLSClassifier.RequireDTLS13CID): for a
	// service whose backends always issue CIDs, a session without one is
	// then counted at once rather than lost at its client's first address
	// change. It also drops 0-RTT records sent apart from their
	// ClientHello, which cannot carry a CID yet.
	RequireDTLS13CID bool
	// Backends is required.
	Backends Backends
	// Encoder nil means PPv2Encoder{}.
	Encoder Encoder
	// Unroutable is what happens to datagrams whose CID the codec marks
	// unroutable (default UnroutableDrop).
	Unroutable UnroutablePolicy
	// Transparent serves backends that cannot read a header: the forward
	// rule writes none, and the reverse rule takes the client from the
	// caller's session instead of a PPv2 header. The Encoder is not used.
	Transparent bool
}

// A Router holds a service's two routing rules: Forward (client →
// backend) and Reverse (backend → client). Both are pure functions of
// their arguments, the router's configuration and a View (a registry
// snapshot and the process's own addresses): no sockets, no hidden state,
// so a program that reads its own sockets applies exactly what a Pipeline
// does. A Router is immutable and safe for concurrent use.
type Router struct {
	public      netip.AddrPort
	measured    bool // public is a wildcard: each datagram's destination stands in for it
	v4          bool // an IPv4 service, which cannot answer an IPv6 client
	cls         Classifier
	codec       CIDCodec
	backends    Backends
	enc         Encoder
	cidLen      int // codec.Len()
	hash        bool
	transparent bool
}

// NewRouter validates cfg and returns its Router.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.Backends == nil {
		return nil, fmt.Errorf("router: no backends: %w", ErrConfig)
	}
	if !cfg.PublicAddr.IsValid() {
		return nil, fmt.Errorf("router: public address %v: %w", cfg.PublicAddr, ErrConfig)
	}
	if cfg.Unroutable > UnroutableHash {
		return nil, fmt.Errorf("router: unroutable policy %d: %w", cfg.Unroutable, ErrConfig)
	}
	pub := addr.Unmap(cfg.PublicAddr)
	r := &Router{public: pub, measured: pub.Addr().IsUnspecified(), v4: pub.Addr().Is4(),
		cls: cfg.Classifier, codec: cfg.Codec, backends: cfg.Backends, enc: cfg.Encoder,
		hash: cfg.Unroutable == UnroutableHash, transparent: cfg.Transparent}
	if r.codec == nil {
		switch cfg.Protocol {
		case DTLS:
			c := dtls.OrdinalFirst{Length: cfg.CIDLen}
			if err := c.Validate(); err != nil {
				return nil, fmt.Errorf("router: %w: %w", err, ErrConfig)
			}
			r.codec = c
		case QUIC:
			c := quic.LB{Length: cfg.CIDLen}
			if err := c.Validate(); err != nil {
				return nil, fmt.Errorf("router: %w: %w", err, ErrConfig)
			}
			r.codec = c
		default:
			return nil, fmt.Errorf("router: protocol %v and no codec: %w", cfg.Protocol, ErrConfig)
		}
	} else if cfg.CIDLen != 0 && cfg.CIDLen != r.codec.Len() {
		return nil, fmt.Errorf("router: CID length %d but codec length %d: %w", cfg.CIDLen, r.codec.Len(), ErrConfig)
	}
	if cfg.Protocol == QUIC {
		if err := checkQUICCodec(r.codec); err != nil {
			return nil, fmt.Errorf("router: %w: %w", err, ErrConfig)
		}
	}
	if cfg.RequireDTLS13CID && (cfg.Protocol != DTLS || r.cls != nil) {
		return nil, fmt.Errorf("router: RequireDTLS13CID applies to DTLS services with the built-in classifier: %w", ErrConfig)
	}
	if r.cls == nil {
		switch cfg.Protocol {
		case DTLS:
			r.cls = DTLSClassifier{CIDLen: r.codec.Len(), RequireDTLS13CID: cfg.RequireDTLS13CID}
		case QUIC:
			r.cls = QUICClassifier{CIDLen: r.codec.Len()}
		default:
			return nil, fmt.Errorf("router: protocol %v and no classifier: %w", cfg.Protocol, ErrConfig)
		}
	}
	if r.enc == nil {
		r.enc = PPv2Encoder{}
	}
	r.cidLen = r.codec.Len()
	return r, nil
}

// checkQUICCodec refuses CID layouts whose server CIDs a client's random
// first DCID can pass for (quic.CheckServerCIDLen): new sessions would be
// routed by those random bytes instead of by HRW.
func checkQUICCodec(c CIDCodec) error {
	n := c.Len()
	if err := quic.CheckServerCIDLen(n); err != nil {
		return err
	}
	if _, ok := c.(dtls.OrdinalFirst); ok && n >= quic.MinInitialDCIDLen {
		return fmt.Errorf("%w: the ordinal-first codec of %d octets on QUIC: it decodes nearly every client DCID of that length (use QUIC-LB, or fewer than %d octets)",
			quic.ErrServerCIDLen, n, quic.MinInitialDCIDLen)
	}
	return nil
}

// Codec returns the router's CID codec.
func (r *Router) Codec() CIDCodec { return r.codec }

// PublicAddr returns the service's public address.
func (r *Router) PublicAddr() netip.AddrPort { return r.public }

// A View is what the rules read besides the datagram. Take one per batch
// (Router.View), so that a whole batch is routed against one snapshot.
type View struct {
	// Snapshot is the registry snapshot to route against; required.
	Snapshot *registry.Snapshot
	// Stale refuses new sessions (StaleRegistry); CID sessions go on.
	Stale bool
	// Own is the process's own addresses, where neither rule sends (nil:
	// none known; the service's public address is refused regardless).
	Own *OwnAddrs
	// Admission, when not nil, applies the admission limits to the
	// forward rule's datagrams at time Now (Unix nanoseconds).
	Admission *Admission
	Now       int64 // the admission limits' clock, Unix nanoseconds
}

// View returns a View of the router's backends as they are now, with own
// as the process's own addresses and no admission limits.
func (r *Router) View(own *OwnAddrs) View {
	return View{Snapshot: r.backends.Snapshot(), Stale: r.backends.Stale(), Own: own}
}

// A Decision is the forward rule's verdict on one datagram.
type Decision struct {
	// Reason is Forwarded, or why the datagram is dropped.
	Reason Reason
	// Backend is where the datagram goes (when forwarded), or the backend
	// refused as one of the proxy's own addresses (OwnAddress), and
	// Ordinal the backend's ordinal; zero otherwise.
	Backend netip.AddrPort
	Ordinal uint8 // the CID's ordinal, or the one HRW picked
	// Class is the classifier's verdict (zero when Malformed; for
	// CIDLength, the CID as it came, of its own length).
	Class Class
	// Err is the classifier's or encoder's error when Reason is Malformed,
	// ErrCIDLength when it is CIDLength, ErrDTLS13NoCID (or the
	// classifier's error that wraps it) when it is DTLS13NoCID.
	Err error
}

// Forward is the forward rule, the routing table of docs/design.md (in the
// repository): it decides where
// datagram b from client goes, and appends its header to hdr. local is
// the address the client sent it to, as the socket measured it; it is used
// (as the PPv2 destination) only when the public address is a wildcard,
// and may be the zero Addr otherwise. In order:
//
//   - a datagram the classifier rejects is Malformed, or CIDLength when
//     it carries a server CID of another length (ErrCIDLength), or
//     DTLS13NoCID when it is DTLS 1.3 the service cannot route by CID
//     (ErrDTLS13NoCID);
//   - v.Admission refuses it (RateLimited); whatever starts a session
//     anywhere in the datagram counts against the handshake and 0-RTT
//     limits (see Class);
//   - an established session (a CID the servers issued) goes to the
//     backend its ordinal names while that backend serves (UnknownOrdinal,
//     NotServing), never re-hashed, if it has the service's CID length
//     (CIDLength); an unroutable CID per RouterConfig.Unroutable;
//   - a new session goes by HRW to a ready backend (NoReadyBackend), unless
//     the registry is stale (StaleRegistry); a QUIC Initial whose DCID is a
//     server CID of a serving backend goes to that backend;
//   - a backend that is the public address or one of v.Own is refused
//     (OwnAddress): the datagram would come back to the proxy.
//
// b is not retained; hdr is appended to and returned, unchanged unless the
// datagram is forwarded. Forward does not allocate when hdr has room
// (HeaderRoom).
func (r *Router) Forward(hdr, b []byte, client netip.AddrPort, local netip.Addr, v *View) (d Decision, out []byte) {
	out = r.forward(&d, hdr, b, client, local, v) // inlined: d is filled where the caller keeps it
	return d, out
}

// forward is Forward filling *d in place: a Decision is too large to pass
// back cheaply through two calls.
func (r *Router) forward(d *Decision, hdr, b []byte, client netip.AddrPort, local netip.Addr, v *View) []byte {
	if err := r.classify(b, &d.Class); err != nil {
		d.Reason, d.Err = Malformed, err
		switch {
		case errors.Is(err, ErrDTLS13NoCID):
			d.Reason = DTLS13NoCID
		case r.mismatchedCID(b, &d.Class):
			d.Reason, d.Err = CIDLength, ErrCIDLength
		case r.shortCID(b):
			d.Reason, d.Err = DTLS13NoCID, ErrDTLS13NoCID
		}
		return hdr
	}
	if v.Admission != nil && !v.Admission.Admit(d.Class, client, v.Now) {
		d.Reason = RateLimited
		return hdr
	}
	be, reason := r.decide(v.Snapshot, v.Stale, &d.Class, client)
	if reason == Forwarded && (be.Addr == r.public || v.Own.Contains(be.Addr)) {
		reason = OwnAddress
		d.Backend, d.Ordinal = be.Addr, be.Ordinal // which backend, for the caller's log
	}
	if reason != Forwarded {
		d.Reason = reason
		if reason == CIDLength {
			d.Err = ErrCIDLength
		}
		return hdr
	}
	out := hdr
	if !r.transparent {
		pub := r.public
		if r.measured && local.IsValid() {
			pub = netip.AddrPortFrom(local, pub.Port())
		}
		var err error
		if out, err = r.enc.AppendHeader(hdr, client, pub); err != nil {
			d.Reason, d.Err = Malformed, err
			return hdr
		}
	}
	d.Backend, d.Ordinal = be.Addr, be.Ordinal
	return out
}

// ErrHeadroom is the Decision.Err of ForwardAt when the header does not fit
// in front of the datagram.
var ErrHeadroom = errors.New("cidroute: header does not fit the headroom")

// ForwardAt is Forward for a datagram received into buf at offset off
// (b = buf[off:]), whose first off bytes are headroom: the header is
// written into it, right in front of the datagram, and out is header and
// datagram as one slice of buf, ready for a plain send. Headroom of
// HeaderRoom bytes fits any built-in header; less is Malformed with
// ErrHeadroom. It does not allocate.
func (r *Router) ForwardAt(buf []byte, off int, client netip.AddrPort, local netip.Addr, v *View) (d Decision, out []byte) {
	d, hdr := r.Forward(buf[:0:off], buf[off:], client, local, v)
	if d.Reason != Forwarded {
		return d, nil
	}
	if len(hdr) > off || (len(hdr) > 0 && &hdr[0] != &buf[0]) {
		return Decision{Reason: Malformed, Class: d.Class, Err: ErrHeadroom}, nil
	}
	start := off - len(hdr)
	copy(buf[start:off], hdr) // memmove: the two may overlap
	return d, buf[start:]
}

// A Session is what transparent mode knows about a reply: the client the
// upstream socket it arrived on serves, and the address that client sent
// to (zero unless the public address is a wildcard).
type Session struct {
	Client netip.AddrPort // the client the upstream socket serves; zero in PPv2 mode
	Local  netip.Addr     // the address the client sent to, for a wildcard service
}

// A Reply is the reverse rule's verdict on one backend datagram.
type Reply struct {
	// Reason is Forwarded, or why the datagram is dropped.
	Reason Reason
	// Client is where Payload goes, and Local the source address it must
	// leave from: the zero Addr unless the public address is a wildcard,
	// when it is the address the client sent to.
	Client  netip.AddrPort
	Local   netip.Addr // see Client
	Payload []byte     // a view into the datagram
}

// Reverse is the reverse rule: it decides whether datagram b, which from
// (its physical sender, as measured by the socket) sent to one of the
// service's upstream sockets, goes to a client. In order:
//
//   - from must be a ready or draining backend of v.Snapshot
//     (UntrustedSender);
//   - with PPv2, b must start with a PPv2 PROXY header whose source is the
//     public address (any unicast address on its port when that is a
//     wildcard) (BadProxyHeader); its destination is the client. In
//     transparent mode b has no header and the client is sess's;
//   - the client must be a unicast peer the service can answer: not
//     unspecified, multicast, broadcast, port 0, loopback (unless the
//     public address is, or the client is a transparent session's, which
//     the proxy measured), of the other address family than the public
//     address, the public address itself, or in v.Own, the process's own
//     addresses (BadDestination);
//   - the payload, the rest of b, must not be empty: DTLS and QUIC send
//     no empty datagrams, and a 0-byte datagram would only probe the
//     client (Malformed).
//
// sess is ignored with PPv2. Payload is a view into b. Reverse does not
// allocate.
func (r *Router) Reverse(b []byte, from netip.AddrPort, sess Session, v *View) (rep Reply) {
	r.reverse(&rep, b, from, sess, v) // inlined: rep is filled where the caller keeps it
	return rep
}

func (r *Router) reverse(rep *Reply, b []byte, from netip.AddrPort, sess Session, v *View) {
	if !v.Snapshot.IsBackend(from) {
		rep.Reason = UntrustedSender
		return
	}
	if r.transparent {
		rep.Client, rep.Local, rep.Payload = sess.Client, sess.Local, b
	} else {
		h, off, err := ppv2.Parse(b)
		src := addr.Unmap(h.Src)
		if err != nil || h.Command != ppv2.Proxy || !r.isPublic(src) {
			rep.Reason = BadProxyHeader
			return
		}
		rep.Client, rep.Payload = addr.Unmap(h.Dst), b[off:]
		if r.measured {
			rep.Local = src.Addr() // leave from the address the client used
		}
	}
	switch {
	case !r.validClient(rep.Client, v.Own):
		rep.Reason = BadDestination
	case len(rep.Payload) == 0:
		rep.Reason = Malformed
	}
}

// classify is r.cls.Classify(b) into *c. The built-in classifiers fill c
// in place: a Class returned by value through an interface call cost as
// much as the parse (BenchmarkRoute's QUIC Initial 77 → 58 ns). End to end
// that is under 1 % of CPU per datagram (the whole hand dispatch this
// replaced saved 0.7 % at 100k/s, bash bench/tricks.sh e2e 4, 2026-12-01),
// so it stays only for the routing step's 60 ns target.
func (r *Router) classify(b []byte, c *Class) error {
	switch cls := r.cls.(type) {
	case DTLSClassifier:
		return classifyDTLS(b, cls.CIDLen, cls.RequireDTLS13CID, c)
	case QUICClassifier:
		return classifyQUIC(b, cls.CIDLen, c)
	}
	var err error
	*c, err = r.cls.Classify(b)
	return err
}

// mismatchedCID reports, for datagram b that the classifier rejected,
// whether it carries a server CID of another length (see ErrCIDLength),
// and sets c to that CID. It runs on the drop path only.
func (r *Router) mismatchedCID(b []byte, c *Class) bool {
	var cid []byte
	switch cls := r.cls.(type) {
	case DTLSClassifier:
		var ok bool
		if cid, ok = dtls.MismatchedCID(b, cls.CIDLen); !ok {
			return false
		}
	case QUICClassifier:
		h, err := quic.ParseHeader(b, cls.CIDLen)
		if err != nil || h.Type != quic.Handshake || len(h.DCID) == cls.CIDLen {
			return false
		}
		cid = h.DCID
	default:
		return false
	}
	*c = Class{Kind: KindEstablished, ID: cid}
	return true
}

// shortCID reports, for datagram b that the classifier rejected, whether
// it is DTLS 1.3 whose CID record is too short for the service's CID
// (dtls.ShortCID; see ErrDTLS13NoCID). It runs on the drop path only.
func (r *Router) shortCID(b []byte) bool {
	cls, ok := r.cls.(DTLSClassifier)
	return ok && dtls.ShortCID(b, cls.CIDLen)
}

// isPublic reports whether a is the public address; when that is a
// wildcard, any unicast address on its port.
func (r *Router) isPublic(a netip.AddrPort) bool {
	if !r.measured {
		return a == r.public
	}
	ip := a.Addr()
	return a.Port() == r.public.Port() && ip.IsValid() && !ip.IsUnspecified() && !ip.IsMulticast()
}

var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// validClient reports whether a reply may be sent to a.
func (r *Router) validClient(a netip.AddrPort, own *OwnAddrs) bool {
	ip := a.Addr()
	switch {
	case !ip.IsValid(), a.Port() == 0, ip.IsUnspecified(), ip.IsMulticast(), ip == limitedBroadcast:
		return false
	case ip.Is4() != r.v4:
		return false // the service's socket cannot reach the other family
	case ip.IsLoopback() && !r.public.Addr().IsLoopback() && !r.transparent:
		// A backend must not aim the proxy at local services. A transparent
		// session's client is not a claim but the measured sender of a
		// datagram the proxy received, so it may well be local.
		return false
	case a == r.public, own.Contains(a):
		return false
	}
	return true
}

// decide is the routing table of docs/design.md. It reads like the table:
// established sessions by their CID's ordinal (never re-hashed), new ones
// by HRW over ready backends. stale matters only for new sessions.
func (r *Router) decide(snap *registry.Snapshot, stale bool, c *Class, client netip.AddrPort) (*registry.Backend, Reason) {
	switch c.Kind {
	case KindEstablished:
		if len(c.ID) != r.cidLen {
			return nil, CIDLength // a QUIC Handshake DCID: a server CID has the service's length
		}
		ord, routable := r.codec.Ordinal(c.ID)
		if !routable {
			if !r.hash {
				return nil, Unroutable
			}
			// QUIC-LB's fallback: hash the client address.
			return r.pick(snap, false, nil, client)
		}
		return serving(snap, ord)
	case KindNew:
		if len(c.ID) == r.cidLen {
			// A QUIC Initial or 0-RTT packet that already carries the
			// server's CID goes on to the backend it names.
			if ord, ok := r.codec.Ordinal(c.ID); ok {
				if b, ok := snap.Serving(ord); ok {
					return b, Forwarded
				}
			}
		}
		return r.pick(snap, stale, c.ID, client)
	}
	return nil, Malformed
}

// serving routes to the backend of ordinal when it still serves sessions.
func serving(snap *registry.Snapshot, ord uint8) (*registry.Backend, Reason) {
	b, ok := snap.Backend(ord) // 255 is never in a snapshot
	switch {
	case !ok:
		return nil, UnknownOrdinal
	case b.State == registry.Gone:
		return nil, NotServing
	}
	return b, Forwarded
}

// pick chooses a ready backend for a new session by HRW: over key when the
// classifier gave one (a QUIC DCID), else over client and public address.
func (r *Router) pick(snap *registry.Snapshot, stale bool, key []byte, client netip.AddrPort) (*registry.Backend, Reason) {
	if stale {
		return nil, StaleRegistry
	}
	var b *registry.Backend
	var ok bool
	if key != nil {
		b, ok = snap.PickNew(key)
	} else {
		b, ok = snap.PickNewAddrs(client, r.public)
	}
	if !ok {
		return nil, NoReadyBackend
	}
	return b, Forwarded
}
