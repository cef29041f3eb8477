// Package backendcfg holds the command-line plumbing the example backends
// (examples/dtls-backend, examples/quic-backend) share: the listen address,
// the ordinal, taken from a flag or from the pod's hostname as in a
// StatefulSet (ds-2 → 2), the trusted proxy list, the direct-datagram policy
// and the log level.
package backendcfg

import (
	"errors"
	"fmt"
	"os"

	"github.com/cidroute/cidroute/registry"
)

// ErrNoOrdinal is returned when no ordinal could be found or it is out of
// range (0–254; 255 is reserved).
var ErrNoOrdinal = errors.New("backendcfg: no usable ordinal")

// FromHostname returns the ordinal at the end of a pod's hostname, "ds-2"
// → 2, by registry.OrdinalFromHostname, the parser the proxies' Kubernetes
// source uses too: a backend never claims an ordinal the proxies do not
// route to it.
func FromHostname(name string) (uint8, error) {
	o, ok := registry.OrdinalFromHostname(name)
	if !ok {
		return 0, fmt.Errorf("hostname %q has no -N suffix with N in 0..254: %w", name, ErrNoOrdinal)
	}
	return o, nil
}

// Resolve returns the ordinal from flag when it is not negative, else from
// the HOSTNAME environment variable, else from os.Hostname, and says which
// one it used. getenv nil means os.Getenv.
func Resolve(flag int, getenv func(string) string) (ord uint8, from string, err error) {
	if flag >= 0 {
		if flag > registry.MaxOrdinal {
			return 0, "flag", fmt.Errorf("flag: ordinal %d not in 0..%d: %w", flag, registry.MaxOrdinal, ErrNoOrdinal)
		}
		return uint8(flag), "flag", nil
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	if h := getenv("HOSTNAME"); h != "" {
		o, err := FromHostname(h)
		return o, "HOSTNAME " + h, err
	}
	h, err := os.Hostname()
	if err != nil {
		return 0, "", fmt.Errorf("hostname: %v: %w", err, ErrNoOrdinal)
	}
	o, err := FromHostname(h)
	return o, "hostname " + h, err
}
