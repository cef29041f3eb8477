//go:build !linux

package cidroute

import "net/netip"

// LocalNets returns no prefixes: local routes are read from rtnetlink,
// on Linux only.
func LocalNets() ([]netip.Prefix, error) { return nil, nil }

// watchHostAddrs rescans the host's addresses every hostScanInterval until
// stop is closed: only Linux has rtnetlink notifications.
func watchHostAddrs(stop <-chan struct{}, changed func()) { scanHostAddrs(stop, changed) }
