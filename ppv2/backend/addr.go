package backend

import "net/netip"

// Addr is where a datagram came from, as the adapter saw it. It keeps the
// two addresses of a proxied datagram apart:
//
//   - Client is the client address the proxy claims in the PPv2 header (an
//     assertion), or, for a direct datagram, the measured sender;
//   - Proxy is the measured sender of a proxied datagram (a fact: the
//     socket reported it), zero for a direct one;
//   - Service is the PPv2 destination, the public service address the
//     client sent to; it becomes the source of the reply header.
//
// String and Network describe the client only, so that logs and protocol
// stacks see the client; print Proxy explicitly to log the measured side.
// Nothing about identity should depend on Client.
//
// Addr is comparable and can be a map key. Both Addr and *Addr implement
// net.Addr.
type Addr struct {
	Client  netip.AddrPort
	Service netip.AddrPort
	Proxy   netip.AddrPort
}

// Network returns "udp".
func (a Addr) Network() string { return "udp" }

// String returns the client's address.
func (a Addr) String() string { return a.Client.String() }

// Proxied reports whether the datagram came through a proxy.
func (a Addr) Proxied() bool { return a.Proxy.IsValid() }
