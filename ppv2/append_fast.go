//go:build !cidroute_plain_ppv2

package ppv2

import (
	"net/netip"
	"slices"

	"github.com/cidroute/cidroute/internal/addr"
)

// The per-datagram encoder is shaped for the compiler: appendProxy takes
// pointers (two AddrPorts and a slice do not fit the argument registers,
// and both callers already hold them in memory), and growSlow stays out of
// line so that the common path inlines. It is one of the tricks issue 18
// measures end to end; the cidroute_plain_ppv2 build tag selects the plain
// version in append_plain.go. measured end to end (bash bench/tricks.sh e2e 4, 2026-12-01, load 3-4: cidproxy's CPU per datagram under ../shared/bench against the build without it; noise about ±1.7 %): it saves
// 5.4 % at 100k/s, 2.7 % at 50k/s, -0.9 % at 25k/s: kept.

func appendProxyHeader(dst []byte, h *Header) ([]byte, error) {
	return appendProxy(dst, &h.Src, &h.Dst)
}

func appendProxyAddrs(dst []byte, src, dest netip.AddrPort) ([]byte, error) {
	return appendProxy(dst, &src, &dest)
}

func appendProxy(dst []byte, src, dest *netip.AddrPort) ([]byte, error) {
	shi, slo := addr.Words(src.Addr())
	dhi, dlo := addr.Words(dest.Addr())
	start := len(dst)
	if is4(shi, slo) && is4(dhi, dlo) {
		if cap(dst)-start < HeaderLen4 {
			dst = growSlow(dst, HeaderLen4)
		}
		dst = dst[:start+HeaderLen4]
		put4(dst[start:], slo, dlo, src.Port(), dest.Port())
		return dst, nil
	}
	if !src.Addr().IsValid() || !dest.Addr().IsValid() {
		return dst, errNoAddr
	}
	if cap(dst)-start < HeaderLen6 {
		dst = growSlow(dst, HeaderLen6)
	}
	dst = dst[:start+HeaderLen6]
	put6(dst[start:], shi, slo, dhi, dlo, src.Port(), dest.Port())
	return dst, nil
}

//go:noinline
func growSlow(dst []byte, n int) []byte { return slices.Grow(dst, n) }
