package backendcfg

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/cidroute/cidroute/ppv2/backend"
)

// DefaultTrusted are the networks the example backends accept PPv2
// headers from unless told otherwise: loopback and the private ranges a
// cluster network uses. Narrow them to the proxies' addresses in
// production: a trusted sender can claim any client address.
const DefaultTrusted = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"

// ParsePrefixes parses a comma-separated list of prefixes or addresses (an
// address is a one-address prefix). An empty string is an empty list.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p)
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: not a prefix or address", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// ParseDirect parses the direct-datagram policy: "accept", "no-handshake"
// or "drop".
func ParseDirect(s string) (backend.DirectPolicy, error) {
	switch s {
	case "accept":
		return backend.DirectAccept, nil
	case "no-handshake":
		return backend.DirectNoHandshake, nil
	case "drop":
		return backend.DirectDrop, nil
	}
	return 0, fmt.Errorf("direct policy %q: want accept, no-handshake or drop", s)
}

// Logger returns a text logger on w at level ("debug", "info", "warn",
// "error").
func Logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
