//go:build !cidroute_plain_dispatch

package cidroute

import (
	"net/netip"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

// dispatch calls the Router's built-in stages directly rather than through
// their interfaces, filling the Class in place: a Class returned by value
// through an interface costs as much as the parse. A user's own stages
// still go through the interfaces (FuzzRoute checks that both paths decide
// alike). It is one of the tricks issue 18 measures end to end; the
// cidroute_plain_dispatch build tag selects the interface calls of
// dispatch_plain.go instead. measured end to end (bash bench/tricks.sh e2e 4, 2026-12-01, load 3-4: cidproxy's CPU per datagram under ../shared/bench against the build without it; noise about ±1.7 %): it saves
// 0.7 % at 100k/s, -0.3 % at 50k/s, 0.5 % at 25k/s: under the 1 % that
// would keep it, but without it (and the unrolled HRW key) the routing
// step misses its 60 ns target (ClientHello 96 ns, QUIC Initial 76 ns
// against 47 and 57), so it stays until that target is reconsidered.
type dispatch struct {
	clsProto   Protocol          // DTLS or QUIC: cls is that protocol's classifier
	clsLen     int               // its CIDLen
	codecProto Protocol          // DTLS: codec is dtls.OrdinalFirst; QUIC: quic.LB
	of         dtls.OrdinalFirst // the codec when codecProto is DTLS
	lb         quic.LB           // the codec when codecProto is QUIC
	ppv2       bool              // enc is a PPv2Encoder, held in pp
	pp         PPv2Encoder
}

func newDispatch(cls Classifier, codec CIDCodec, enc Encoder) dispatch {
	var d dispatch
	switch c := cls.(type) {
	case DTLSClassifier:
		d.clsProto, d.clsLen = DTLS, c.CIDLen
	case QUICClassifier:
		d.clsProto, d.clsLen = QUIC, c.CIDLen
	}
	switch c := codec.(type) {
	case dtls.OrdinalFirst:
		d.codecProto, d.of = DTLS, c
	case quic.LB:
		d.codecProto, d.lb = QUIC, c
	}
	d.pp, d.ppv2 = enc.(PPv2Encoder)
	return d
}

// classify is r.cls.Classify(b) into *c.
func (r *Router) classify(b []byte, c *Class) error {
	switch r.fast.clsProto {
	case DTLS:
		return classifyDTLS(b, r.fast.clsLen, c)
	case QUIC:
		return classifyQUIC(b, r.fast.clsLen, c)
	}
	var err error
	*c, err = r.cls.Classify(b)
	return err
}

// ordinal is r.codec.Ordinal(cid).
func (r *Router) ordinal(cid []byte) (uint8, bool) {
	switch r.fast.codecProto {
	case DTLS:
		return r.fast.of.Ordinal(cid)
	case QUIC:
		return r.fast.lb.Ordinal(cid)
	}
	return r.codec.Ordinal(cid)
}

// appendHeader is r.enc.AppendHeader.
func (r *Router) appendHeader(dst []byte, client, service netip.AddrPort) ([]byte, error) {
	if r.fast.ppv2 {
		return r.fast.pp.AppendHeader(dst, client, service)
	}
	return r.enc.AppendHeader(dst, client, service)
}
