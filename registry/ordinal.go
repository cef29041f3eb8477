package registry

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// OrdinalFromHostname returns the StatefulSet ordinal at the end of a pod
// name or hostname: "ds-2" → 2, "ds-17.dtls-backend.ns.svc" → 17 (the
// domain, after the first dot, is ignored: StatefulSet names are DNS
// labels). The suffix after the last '-' must be a decimal number
// 0–MaxOrdinal without leading zeros: StatefulSets never write them, and
// "ds-02" next to "ds-2" would be two pods claiming one ordinal. This is
// the one parser both sides use: the proxies' Kubernetes source reads
// backends' ordinals with it, and backends read their own (OwnOrdinal),
// so that a backend never claims an ordinal the proxies do not route to
// it.
func OrdinalFromHostname(name string) (uint8, bool) {
	name, _, _ = strings.Cut(name, ".")
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return 0, false
	}
	s := name[i+1:]
	if len(s) == 0 || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > MaxOrdinal {
		return 0, false
	}
	return uint8(n), true
}

// ErrNoOrdinal is wrapped by OwnOrdinal's errors: no usable ordinal was
// given or found.
var ErrNoOrdinal = errors.New("registry: no usable ordinal")

// OwnOrdinal returns the ordinal a backend writes into its CIDs, as a
// backend program takes it: flag, when it is not negative (a -ordinal
// command-line flag whose default is -1); else the suffix of the HOSTNAME
// environment variable, which Kubernetes sets to the pod's name; else
// that of os.Hostname. Names are parsed by OrdinalFromHostname, as the
// proxies' Kubernetes source parses them. from says which one it used
// ("flag", "HOSTNAME ds-2", "hostname ds-2"), for the start-up log line.
// A flag above MaxOrdinal, or a name without a valid suffix, is an error
// wrapping ErrNoOrdinal.
func OwnOrdinal(flag int) (ord uint8, from string, err error) {
	return ownOrdinal(flag, os.Getenv, os.Hostname)
}

func ownOrdinal(flag int, getenv func(string) string, hostname func() (string, error)) (uint8, string, error) {
	if flag >= 0 {
		if flag > MaxOrdinal {
			return 0, "flag", fmt.Errorf("ordinal %d not in 0..%d: %w", flag, MaxOrdinal, ErrNoOrdinal)
		}
		return uint8(flag), "flag", nil
	}
	from := "HOSTNAME"
	h := getenv("HOSTNAME")
	if h == "" {
		from = "hostname"
		var err error
		if h, err = hostname(); err != nil {
			return 0, from, fmt.Errorf("hostname: %v: %w", err, ErrNoOrdinal)
		}
	}
	from += " " + h
	o, ok := OrdinalFromHostname(h)
	if !ok {
		return 0, from, fmt.Errorf("%s %q has no -N suffix with N in 0..%d: %w", strings.Fields(from)[0], h, MaxOrdinal, ErrNoOrdinal)
	}
	return o, from, nil
}
