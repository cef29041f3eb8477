//go:build cidroute_plain_ppv2

package ppv2

import (
	"net/netip"
	"slices"

	"github.com/cidroute/cidroute/internal/addr"
)

// The plain per-datagram encoder: values in, the compiler's own inlining
// (see append_fast.go).

func appendProxyHeader(dst []byte, h *Header) ([]byte, error) {
	return appendProxy(dst, h.Src, h.Dst)
}

func appendProxyAddrs(dst []byte, src, dest netip.AddrPort) ([]byte, error) {
	return appendProxy(dst, src, dest)
}

func appendProxy(dst []byte, src, dest netip.AddrPort) ([]byte, error) {
	shi, slo := addr.Words(src.Addr())
	dhi, dlo := addr.Words(dest.Addr())
	n := HeaderLen6
	if is4(shi, slo) && is4(dhi, dlo) {
		n = HeaderLen4
	} else if !src.Addr().IsValid() || !dest.Addr().IsValid() {
		return dst, errNoAddr
	}
	start := len(dst)
	dst = slices.Grow(dst, n)[:start+n]
	if n == HeaderLen4 {
		put4(dst[start:], slo, dlo, src.Port(), dest.Port())
	} else {
		put6(dst[start:], shi, slo, dhi, dlo, src.Port(), dest.Port())
	}
	return dst, nil
}

func growSlow(dst []byte, n int) []byte { return slices.Grow(dst, n) }
