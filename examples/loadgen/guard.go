package main

import (
	"errors"
	"fmt"
	"net/netip"
)

var (
	// errRemote refuses a target that is not on this host.
	errRemote = errors.New("loadgen: target is not a loopback address (pass -allow-remote to load another host)")
	// errClientAddrs refuses more client addresses than sockets where
	// loopback source addresses cannot supply them.
	errClientAddrs = errors.New("loadgen: more clients than sockets needs an IPv4 loopback target (clients use 127.1.0.0/16 source addresses)")
)

// checkTarget refuses to send anywhere but this host unless allowRemote.
// Unspecified addresses (0.0.0.0, ::) count as remote: they are not where
// a benchmark means to send.
func checkTarget(target netip.AddrPort, allowRemote bool) error {
	if !target.IsValid() || target.Port() == 0 {
		return fmt.Errorf("loadgen: target %v: need ip:port", target)
	}
	if !target.Addr().Unmap().IsLoopback() && !allowRemote {
		return fmt.Errorf("%v: %w", target, errRemote)
	}
	return nil
}

// clientSource returns the source address of client i when clients >
// sockets: 127.1.0.1 + i/sockets, so every client has its own address (the
// port is its socket's). The loopback interface owns all of 127.0.0.0/8.
// ok is false when the range is exhausted or the target is not IPv4
// loopback.
func clientSource(target netip.Addr, i, sockets int) (netip.Addr, bool) {
	k := i / sockets
	if !target.Unmap().Is4() || !target.Unmap().IsLoopback() || k >= 1<<16-2 {
		return netip.Addr{}, false
	}
	k++
	return netip.AddrFrom4([4]byte{127, 1, byte(k >> 8), byte(k)}), true
}
