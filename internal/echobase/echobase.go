// Package echobase holds what the DTLS and QUIC echo servers
// (dtls/piondtls/dtlsecho, quic/quicgo/quicecho) share: their socket behind
// the PPv2 adapter, the peer of a connection and how it is logged, and the
// in-order list of what they served. They live in other modules, which
// import it across the module boundary (internal is path-based): change
// it only together with them.
package echobase

import (
	"net"
	"net/netip"

	"github.com/cidroute/cidroute/ppv2/backend"
)

// Listen binds laddr (zero: 127.0.0.1 on any port) and wraps the socket in
// the PPv2 adapter configured by cfg.
func Listen(laddr netip.AddrPort, cfg backend.Config) (*backend.Conn, error) {
	if !laddr.IsValid() {
		laddr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
	}
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(laddr))
	if err != nil {
		return nil, err
	}
	bc, err := backend.New(udp, cfg)
	if err != nil {
		udp.Close()
		return nil, err
	}
	return bc, nil
}

// Addr returns the address bc is bound to, an IPv4 one unmapped.
func Addr(bc *backend.Conn) netip.AddrPort {
	a := bc.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// Peer returns the PPv2 adapter's view of c's remote address (zero when it
// is not the adapter's).
func Peer(c interface{ RemoteAddr() net.Addr }) backend.Addr {
	if a, ok := c.RemoteAddr().(*backend.Addr); ok {
		return *a
	}
	return backend.Addr{}
}

// AddrAttrs logs the claimed client and the measured proxy apart.
func AddrAttrs(a backend.Addr) []any {
	if !a.Proxied() {
		return []any{"client", a.Client, "proxy", "none (direct)"}
	}
	return []any{"client", a.Client, "proxy", a.Proxy, "service", a.Service}
}

// InOrder returns copies of the records of m with IDs 1 to last, in ID
// order; the caller holds m's lock.
func InOrder[T any](m map[uint64]*T, last uint64) []T {
	out := make([]T, 0, len(m))
	for id := uint64(1); id <= last; id++ {
		if r, ok := m[id]; ok {
			out = append(out, *r)
		}
	}
	return out
}
