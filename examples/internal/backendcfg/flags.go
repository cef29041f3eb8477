package backendcfg

import (
	"flag"
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
// or "drop" (backend.DirectPolicy's text form).
func ParseDirect(s string) (backend.DirectPolicy, error) {
	var d backend.DirectPolicy
	err := d.UnmarshalText([]byte(s))
	return d, err
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

// Flags are the flags both backends take, as given.
type Flags struct {
	Listen, Trusted, Direct, Level string
	Ordinal                        int
}

// Register defines the flags on fs. listen is the default address, pod an
// example pod name ("ds-2") and initials what -direct no-handshake drops
// ("ClientHellos").
func (f *Flags) Register(fs *flag.FlagSet, listen, pod, initials string) {
	fs.StringVar(&f.Listen, "listen", listen, "UDP `address` to listen on")
	fs.IntVar(&f.Ordinal, "ordinal", -1, "the backend's ordinal 0-254; -1 takes it from the HOSTNAME suffix ("+pod+" → 2)")
	fs.StringVar(&f.Trusted, "trusted-proxies", DefaultTrusted, "comma-separated `prefixes` allowed to send PROXY v2 headers")
	fs.StringVar(&f.Direct, "direct", "accept", "datagrams without PROXY v2: accept, no-handshake (drop direct "+initials+") or drop")
	fs.StringVar(&f.Level, "log-level", "info", "debug, info, warn or error")
}

// Settings are the flags parsed.
type Settings struct {
	Log            *slog.Logger
	Ordinal        uint8
	OrdinalFrom    string // which source Resolve used
	Listen         netip.AddrPort
	TrustedProxies []netip.Prefix
	Direct         backend.DirectPolicy
}

// Parse checks that fs, already parsed, has no arguments left and parses
// the flags, the logger writing to stderr.
func (f *Flags) Parse(fs *flag.FlagSet, stderr io.Writer) (Settings, error) {
	var s Settings
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if s.Log, err = Logger(stderr, f.Level); err != nil {
		return s, err
	}
	if s.Ordinal, s.OrdinalFrom, err = Resolve(f.Ordinal, nil); err != nil {
		return s, err
	}
	if s.Listen, err = netip.ParseAddrPort(f.Listen); err != nil {
		return s, err
	}
	if s.TrustedProxies, err = ParsePrefixes(f.Trusted); err != nil {
		return s, err
	}
	s.Direct, err = ParseDirect(f.Direct)
	return s, err
}
