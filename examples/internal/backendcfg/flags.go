// Package backendcfg holds the command-line plumbing the example backends
// (examples/dtls-backend, examples/quic-backend) share: the listen address,
// the ordinal, taken from a flag or from the pod's hostname as in a
// StatefulSet (ds-2 → 2, registry.OwnOrdinal), the trusted proxy list, the
// direct-datagram policy and the log level.
package backendcfg

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/shutdown"
)

// DefaultTrusted is the -trusted-proxies default: backend's
// DefaultTrustedProxies, loopback only, for proxies on the same host. In a
// cluster name the proxies' pod network instead (-trusted-proxies
// 10.244.0.0/16, the CIDR the cidproxy pods get their addresses from):
// every host in a trusted network can claim any client address.
var DefaultTrusted = func() string {
	var ps []string
	for _, p := range backend.DefaultTrustedProxies() {
		ps = append(ps, p.String())
	}
	return strings.Join(ps, ",")
}()

// DefaultDrainTimeout is the -drain-timeout default: below the 120 s
// terminationGracePeriodSeconds of the example manifests, so that the
// sessions left are closed cleanly before the kubelet kills the pod.
const DefaultDrainTimeout = 110 * time.Second

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
	DrainTimeout                   time.Duration
}

// Register defines the flags on fs. listen is the default address, pod an
// example pod name ("ds-2") and initials what -direct no-handshake drops
// ("ClientHellos").
func (f *Flags) Register(fs *flag.FlagSet, listen, pod, initials string) {
	fs.StringVar(&f.Listen, "listen", listen, "UDP `address` to listen on")
	fs.IntVar(&f.Ordinal, "ordinal", -1, "the backend's ordinal 0-254; -1 takes it from the HOSTNAME suffix ("+pod+" → 2)")
	fs.StringVar(&f.Trusted, "trusted-proxies", DefaultTrusted, "comma-separated `networks` allowed to send PROXY v2 headers: the proxies' (e.g. their pod CIDR, 10.244.0.0/16); the default is loopback only")
	fs.StringVar(&f.Direct, "direct", "accept", "datagrams without PROXY v2: accept, no-handshake (drop direct "+initials+") or drop")
	fs.StringVar(&f.Level, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.DrainTimeout, "drain-timeout", DefaultDrainTimeout, "on SIGTERM, refuse new sessions and serve the open ones this long, then close them; keep it below the pod's termination grace period")
}

// Settings are the flags parsed.
type Settings struct {
	Log            *slog.Logger
	Ordinal        uint8
	OrdinalFrom    string // which source registry.OwnOrdinal used
	Listen         netip.AddrPort
	TrustedProxies []netip.Prefix
	Direct         backend.DirectPolicy
	DrainTimeout   time.Duration
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
	if s.Ordinal, s.OrdinalFrom, err = registry.OwnOrdinal(f.Ordinal); err != nil {
		return s, err
	}
	if s.Listen, err = netip.ParseAddrPort(f.Listen); err != nil {
		return s, fmt.Errorf("-listen: %w", err)
	}
	if s.TrustedProxies, err = backend.ParseTrustedProxies(f.Trusted); err != nil {
		return s, fmt.Errorf("-trusted-proxies: %w", err)
	}
	if f.DrainTimeout < 0 {
		return s, fmt.Errorf("-drain-timeout %v: must not be negative", f.DrainTimeout)
	}
	s.DrainTimeout = f.DrainTimeout
	s.Direct, err = ParseDirect(f.Direct)
	return s, err
}

// Shutdown is the shutdown.Config of a backend called name whose sessions
// are unit ("sessions", "connections"): -drain-timeout, where 0 cuts the
// open sessions at once.
func (s Settings) Shutdown(name, unit string) shutdown.Config {
	t := s.DrainTimeout
	if t == 0 {
		t = -1 // shutdown.Config's 0 is its default
	}
	return shutdown.Config{Timeout: t, Logger: s.Log, Name: name, Unit: unit}
}
