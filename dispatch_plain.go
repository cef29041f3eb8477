//go:build cidroute_plain_dispatch

package cidroute

import "net/netip"

// dispatch is empty: with the cidroute_plain_dispatch build tag the
// Router calls every stage through its interface (see dispatch.go).
type dispatch struct{}

func newDispatch(Classifier, CIDCodec, Encoder) dispatch { return dispatch{} }

func (r *Router) classify(b []byte, c *Class) error {
	var err error
	*c, err = r.cls.Classify(b)
	return err
}

func (r *Router) ordinal(cid []byte) (uint8, bool) { return r.codec.Ordinal(cid) }

func (r *Router) appendHeader(dst []byte, client, service netip.AddrPort) ([]byte, error) {
	return r.enc.AppendHeader(dst, client, service)
}
