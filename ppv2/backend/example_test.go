package backend_test

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// A backend behind a PPv2 proxy: the proxy's datagram arrives with the
// client's claimed address, the reply goes back through the proxy with the
// reverse header.
func Example() {
	udp, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	conn, err := backend.New(udp, backend.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	// What a cidroute proxy sends: header (client → service), payload.
	proxy, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer proxy.Close()
	client := netip.MustParseAddrPort("198.51.100.7:40001")
	service := netip.MustParseAddrPort("192.0.2.10:5684")
	dg, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client, Dst: service})
	proxy.WriteTo(append(dg, "ping"...), conn.LocalAddr())

	buf := make([]byte, 1500)
	n, from, _ := conn.ReadFrom(buf)
	a := from.(*backend.Addr)
	fmt.Printf("%s from %v (claimed), measured proxy is ours: %v\n",
		buf[:n], a.Client, a.Proxy == proxy.LocalAddr().(*net.UDPAddr).AddrPort())

	conn.WriteTo([]byte("pong"), from) // the reply path: through that proxy

	n, _, _ = proxy.ReadFrom(buf)
	h, off, _ := ppv2.Parse(buf[:n])
	fmt.Printf("proxy got %s: %v → %v\n", buf[off:n], h.Src, h.Dst)
	fmt.Println(conn.Stats().AcceptedProxied, conn.Stats().WrittenProxied)
	// Output:
	// ping from 198.51.100.7:40001 (claimed), measured proxy is ours: true
	// proxy got pong: 192.0.2.10:5684 → 198.51.100.7:40001
	// 1 1
}

// The zero Config trusts no proxy, not even one on loopback: a PPv2
// datagram is dropped and counted, while a datagram without the signature
// is delivered as the plain socket would. Name the proxies in
// TrustedProxies (DefaultTrustedProxies for proxies on this host).
func ExampleConfig() {
	udp, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	conn, err := backend.New(udp, backend.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	proxy, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	defer proxy.Close()
	dg, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy,
		Src: netip.MustParseAddrPort("198.51.100.7:40001"), Dst: netip.MustParseAddrPort("192.0.2.10:5684")})
	proxy.WriteTo(append(dg, "proxied"...), conn.LocalAddr())
	proxy.WriteTo([]byte("direct"), conn.LocalAddr())

	buf := make([]byte, 1500)
	n, from, _ := conn.ReadFrom(buf)
	fmt.Printf("%s, from the sender itself: %v\n", buf[:n], from.(*backend.Addr).Client == proxy.LocalAddr().(*net.UDPAddr).AddrPort())
	fmt.Println("dropped as untrusted:", conn.Stats().DroppedUntrusted)
	// Output:
	// direct, from the sender itself: true
	// dropped as untrusted: 1
}
