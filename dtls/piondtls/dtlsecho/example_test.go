package dtlsecho_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// The echo server behind a proxy replica, and a pion/dtls v3 client with
// connection IDs talking to it through the proxy.
func Example() {
	srv, err := dtlsecho.Listen(dtlsecho.Config{Ordinal: 1, PSK: []byte("secret"), Prefix: "1|",
		TrustedProxies: backend.DefaultTrustedProxies()})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	proxy, err := cidroutetest.New(42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 1, Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()

	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	c, err := pion.Client(udp, net.UDPAddrFromAddrPort(proxy.Addr), dtlsecho.PSKClientConfig([]byte("secret"), "device-17"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		log.Fatal(err)
	}
	c.Write([]byte("hello"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		log.Fatal(err)
	}
	s := srv.Sessions()[0]
	fmt.Println(string(buf[:n]), "through the proxy:", s.First.Proxied(), "client:", s.First.Client == udp.LocalAddr().(*net.UDPAddr).AddrPort())
	// Output: 1|hello through the proxy: true client: true
}
