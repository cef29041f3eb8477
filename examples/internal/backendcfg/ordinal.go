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
	"strconv"
	"strings"
)

// ErrNoOrdinal is returned when no ordinal could be found or it is out of
// range (0–254; 255 is reserved).
var ErrNoOrdinal = errors.New("backendcfg: no usable ordinal")

// FromHostname returns the number after the last '-' of a pod name:
// "ds-2" → 2. Any domain part ("ds-2.dtls-backend.ns.svc") is ignored. A
// suffix with a leading zero ("ds-01") is refused, as the proxies'
// Kubernetes source refuses it: a backend must never claim an ordinal the
// proxies do not route to it.
func FromHostname(name string) (uint8, error) {
	name, _, _ = strings.Cut(name, ".")
	i := strings.LastIndexByte(name, '-')
	if i < 0 || i == len(name)-1 {
		return 0, fmt.Errorf("hostname %q has no -N suffix: %w", name, ErrNoOrdinal)
	}
	return parse(name[i+1:], "hostname "+strconv.Quote(name))
}

func parse(s, what string) (uint8, error) {
	n, err := strconv.Atoi(s)
	if s == "" || strings.Trim(s, "0123456789") != "" || len(s) > 1 && s[0] == '0' {
		err = strconv.ErrSyntax
	}
	if err != nil || n < 0 || n > 254 {
		return 0, fmt.Errorf("%s: ordinal %q not in 0..254: %w", what, s, ErrNoOrdinal)
	}
	return uint8(n), nil
}

// Resolve returns the ordinal from flag when it is not negative, else from
// the HOSTNAME environment variable, else from os.Hostname, and says which
// one it used. getenv nil means os.Getenv.
func Resolve(flag int, getenv func(string) string) (ord uint8, from string, err error) {
	if flag >= 0 {
		o, err := parse(strconv.Itoa(flag), "flag")
		return o, "flag", err
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
