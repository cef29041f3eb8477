//go:build !linux

package cidroute

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/cidroute/cidroute/udpio"
)

// Original-source mode binds sockets to foreign addresses with
// IP_TRANSPARENT, which only Linux has.
func probeTransparent(bool) error {
	return fmt.Errorf("original source: IP_TRANSPARENT is Linux only: %w: %w", udpio.ErrNotSupported, ErrOriginalSource)
}

func dialOriginal(netip.AddrPort, netip.AddrPort) (*net.UDPConn, error) {
	return nil, fmt.Errorf("original source: %w", udpio.ErrNotSupported)
}

func checkReturnRoute(netip.AddrPort) error {
	return fmt.Errorf("original source: %w", udpio.ErrNotSupported)
}
