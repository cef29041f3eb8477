package cidroute

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
)

// Backends is where a service's routing reads its backends: a
// *registry.Registry, or anything that publishes registry snapshots.
// Both methods run once per batch and must be cheap and safe for
// concurrent use.
type Backends interface {
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

// Protocol is the transport a service speaks.
type Protocol uint8

const (
	DTLS Protocol = iota + 1 // DTLS 1.2 with Connection ID (RFC 9146)
	QUIC                     // QUIC v1 and v2 (RFC 9000, RFC 9369)
)

func (p Protocol) String() string {
	switch p {
	case DTLS:
		return "dtls"
	case QUIC:
		return "quic"
	}
	return "invalid"
}

// ParseProtocol parses "dtls" or "quic".
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "dtls":
		return DTLS, nil
	case "quic":
		return QUIC, nil
	}
	return 0, fmt.Errorf("cidroute: protocol %q: want \"dtls\" or \"quic\"", s)
}

// Default CID lengths: 8 for DTLS (ordinal-first), 12 for QUIC (QUIC-LB), so
// that a QUIC server CID is never confused with a client's random 8-byte
// DCID.
const (
	DefaultDTLSCIDLen = 8
	DefaultQUICCIDLen = 12
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("cidroute: invalid configuration")

// A Decision is the routing step's verdict on one datagram.
type Decision struct {
	// Reason is Forwarded, or why the datagram is dropped.
	Reason Reason
	// Backend is where the datagram goes (when forwarded), and Ordinal the
	// backend's ordinal.
	Backend netip.AddrPort
	Ordinal uint8
	// Class is the classifier's verdict (zero when Malformed).
	Class Class
	// Err is the classifier's or encoder's error when Reason is Malformed.
	Err error
}

// A Router is the pure routing step of one service: datagram and client
// address in, decision and header bytes out, with no sockets. It applies
// SPEC.md's routing table; admission limits are a separate stage
// (Admission). A Router is immutable and safe for concurrent use.
type Router struct {
	service  netip.AddrPort
	cls      Classifier
	codec    CIDCodec
	backends Backends
	enc      Encoder
	cidLen   int // codec.Len()

	// The built-in stages are called directly rather than through their
	// interfaces, which costs as much again as the work (see classify).
	clsProto   Protocol          // DTLS or QUIC: cls is that protocol's classifier
	clsLen     int               // its CIDLen
	codecProto Protocol          // DTLS: codec is dtls.OrdinalFirst; QUIC: quic.LB
	of         dtls.OrdinalFirst // the codec when codecProto is DTLS
	lb         quic.LB           // the codec when codecProto is QUIC
	ppv2       bool              // enc is a PPv2Encoder, held in pp
	pp         PPv2Encoder
}

// RouterConfig is what a Router needs. Zero fields take defaults.
type RouterConfig struct {
	Protocol Protocol
	// Service is the service's public address: the HRW key of DTLS
	// datagrams without CID uses it, so every replica must be configured
	// with the same one, and it is the PPv2 destination unless the
	// datagram's measured destination is given.
	Service netip.AddrPort
	// Codec is the CID layout; nil means dtls.OrdinalFirst of CIDLen
	// (DTLS) or quic.LB of CIDLen (QUIC).
	Codec CIDCodec
	// CIDLen is the CID length when Codec is nil: 0 means 8 (DTLS) or 12
	// (QUIC).
	CIDLen int
	// Classifier nil means the protocol's classifier for Codec.Len().
	Classifier Classifier
	// Backends is required.
	Backends Backends
	// Encoder nil means PPv2Encoder{}.
	Encoder Encoder
}

// NewRouter validates cfg and returns its Router.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.Backends == nil {
		return nil, fmt.Errorf("router: no backends: %w", ErrConfig)
	}
	if !cfg.Service.IsValid() {
		return nil, fmt.Errorf("router: service address %v: %w", cfg.Service, ErrConfig)
	}
	r := &Router{service: unmap(cfg.Service), cls: cfg.Classifier, codec: cfg.Codec, backends: cfg.Backends, enc: cfg.Encoder}
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
	if r.cls == nil {
		switch cfg.Protocol {
		case DTLS:
			r.cls = DTLSClassifier{CIDLen: r.codec.Len()}
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
	switch c := r.cls.(type) {
	case DTLSClassifier:
		r.clsProto, r.clsLen = DTLS, c.CIDLen
	case QUICClassifier:
		r.clsProto, r.clsLen = QUIC, c.CIDLen
	}
	switch c := r.codec.(type) {
	case dtls.OrdinalFirst:
		r.codecProto, r.of = DTLS, c
	case quic.LB:
		r.codecProto, r.lb = QUIC, c
	}
	r.pp, r.ppv2 = r.enc.(PPv2Encoder)
	return r, nil
}

// Codec returns the router's CID codec.
func (r *Router) Codec() CIDCodec { return r.codec }

// Route classifies datagram b from client, routes it against the current
// registry snapshot and, when it is forwarded, appends the header to hdr.
// The PPv2 destination is the configured service address. It does not
// allocate when hdr has room (52 bytes for PPv2 without TLVs).
func (r *Router) Route(hdr, b []byte, client netip.AddrPort) (Decision, []byte) {
	var d Decision
	hdr = r.route(&d, hdr, b, client, r.service)
	return d, hdr
}

// RouteTo is Route with the datagram's measured destination, for a service
// listening on a wildcard address: it becomes the PPv2 destination.
func (r *Router) RouteTo(hdr, b []byte, client, local netip.AddrPort) (Decision, []byte) {
	var d Decision
	hdr = r.route(&d, hdr, b, client, local)
	return d, hdr
}

// route fills *d in place; a Decision is too large to pass back cheaply
// through two calls.
func (r *Router) route(d *Decision, hdr, b []byte, client, local netip.AddrPort) []byte {
	if err := r.classify(b, &d.Class); err != nil {
		d.Reason, d.Err = Malformed, err
		return hdr
	}
	stale := d.Class.Kind == KindNew && r.backends.Stale()
	be, reason := r.decide(r.backends.Snapshot(), stale, &d.Class, client)
	if reason != Forwarded {
		d.Reason = reason
		return hdr
	}
	out, err := r.appendHeader(hdr, client, local)
	if err != nil {
		d.Reason, d.Err = Malformed, err
		return hdr
	}
	d.Backend, d.Ordinal = be.Addr, be.Ordinal
	return out
}

// classify is r.cls.Classify(b) into *c.
func (r *Router) classify(b []byte, c *Class) error {
	switch r.clsProto {
	case DTLS:
		return classifyDTLS(b, r.clsLen, c)
	case QUIC:
		return classifyQUIC(b, r.clsLen, c)
	}
	var err error
	*c, err = r.cls.Classify(b)
	return err
}

// ordinal is r.codec.Ordinal(cid) for a CID of the codec's length.
func (r *Router) ordinal(cid []byte) (uint8, bool) {
	switch r.codecProto {
	case DTLS:
		return r.of.Ordinal(cid)
	case QUIC:
		return r.lb.Ordinal(cid)
	}
	return r.codec.Ordinal(cid)
}

// appendHeader is r.enc.AppendHeader.
func (r *Router) appendHeader(dst []byte, client, service netip.AddrPort) ([]byte, error) {
	if r.ppv2 {
		return r.pp.AppendHeader(dst, client, service)
	}
	return r.enc.AppendHeader(dst, client, service)
}

// decide is SPEC.md's routing table. It reads like the table: established
// sessions by their CID's ordinal (never re-hashed), new ones by HRW over
// ready backends. stale matters only for new sessions.
func (r *Router) decide(snap *registry.Snapshot, stale bool, c *Class, client netip.AddrPort) (*registry.Backend, Reason) {
	switch c.Kind {
	case KindEstablished:
		if len(c.ID) != r.cidLen {
			return nil, UnknownOrdinal // a server CID always has the service's length
		}
		ord, routable := r.ordinal(c.ID)
		if !routable {
			// QUIC-LB "unroutable": the draft's fallback hashes the client.
			return r.pick(snap, false, nil, client)
		}
		return serving(snap, ord)
	case KindNew:
		if len(c.ID) == r.cidLen {
			// A QUIC Initial or 0-RTT packet that already carries the
			// server's CID goes on to the backend it names.
			if ord, ok := r.ordinal(c.ID); ok {
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
// classifier gave one (a QUIC DCID), else over client and service address.
func (r *Router) pick(snap *registry.Snapshot, stale bool, key []byte, client netip.AddrPort) (*registry.Backend, Reason) {
	if stale {
		return nil, StaleRegistry
	}
	var b *registry.Backend
	var ok bool
	if key != nil {
		b, ok = snap.PickNew(key)
	} else {
		b, ok = snap.PickNewAddrs(client, r.service)
	}
	if !ok {
		return nil, NoReadyBackend
	}
	return b, Forwarded
}

// unmap returns a with an IPv4-mapped IPv6 address in its IPv4 form, the
// form sockets, registry and PPv2 decoding report.
func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}
