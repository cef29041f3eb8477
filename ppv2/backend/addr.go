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
//     client sent to; it becomes the source of the reply header;
//   - Local is set for a datagram that came with a PPv2 LOCAL header from a
//     trusted proxy (a health probe, see the package documentation): Client
//     is then the proxy's measured address, and replies go straight to it.
//
// Nothing about identity should depend on Client. Log Client and Proxy as
// fields; String is for protocol stacks (see String).
//
// Addr is comparable and can be a map key. Both Addr and *Addr implement
// net.Addr.
type Addr struct {
	Client  netip.AddrPort // claimed by the proxy, or measured when direct
	Service netip.AddrPort // the PPv2 destination; zero when direct
	Proxy   netip.AddrPort // the measured proxy; zero when direct
	Local   bool           // a PPv2 LOCAL datagram: a proxy's health probe
}

// Network returns "udp".
func (a Addr) Network() string { return "udp" }

// String returns the client's address and, for a proxied datagram, the
// measured proxy after " via ": "198.51.100.7:40001 via 10.0.3.4:36012".
//
// The proxy is part of it because it is part of the path: a stack that
// tells a connection's paths apart by String (quic-go does, for addresses
// other than *net.UDPAddr) must see a new path when the connection's
// datagrams start arriving through another proxy replica (the one before
// died, or the load balancer re-hashed the client), or it would go on
// answering through the first proxy. quic-go then validates the new path,
// which only the real client can answer, and moves its replies there.
func (a Addr) String() string {
	if !a.Proxy.IsValid() {
		return a.Client.String()
	}
	b := make([]byte, 0, 2*len("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535")+len(" via "))
	b = a.Client.AppendTo(b)
	b = append(b, " via "...)
	b = a.Proxy.AppendTo(b)
	return string(b)
}

// Proxied reports whether the datagram came through a proxy.
func (a Addr) Proxied() bool { return a.Proxy.IsValid() }
