package backend

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultTrustedProxies returns the loopback networks, 127.0.0.0/8 and
// ::1/128: the trusted set of a backend whose proxies run on its own host
// (tests, a sidecar, the example backends' default). Each call returns a
// new slice.
//
// Everywhere else, name the proxies: their addresses, or the network they
// and nothing else get addresses from, such as the pod CIDR of the node
// pool that runs them. Never trust a whole private range: any host in it
// could claim any client address, and a backend believes the claim.
func DefaultTrustedProxies() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

// ParseTrustedProxies parses a comma-separated list of networks and
// addresses, as a flag or an environment variable gives it: an address is
// a network of one address. Blanks around the items are ignored, and an
// empty string is an empty list, which trusts nobody.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("backend: trusted proxy %q is neither a network (10.244.0.0/16) nor an address (10.244.1.7): %w", f, ErrConfig)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
