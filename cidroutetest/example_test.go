package cidroutetest_test

import (
	"fmt"
	"log"
	"net"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// A backend behind a proxy replica, as a backend author's test sets it
// up: the backend's socket goes through ppv2/backend, which trusts the
// proxy on loopback and tells the claimed client apart from the proxy
// that carried the datagram. (In a test, cidroutetest.Start(t, …) also
// closes the proxy when the test ends.)
func Example() {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	be, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies()})
	if err != nil {
		log.Fatal(err)
	}
	defer be.Close()
	answered := make(chan struct{}, 1)
	go func() { // the server: echo every datagram to whoever sent it
		buf := make([]byte, 2048)
		for {
			n, from, err := be.ReadFrom(buf)
			if err != nil {
				return
			}
			be.WriteTo(buf[:n], from)
			answered <- struct{}{}
		}
	}()

	proxy, err := cidroutetest.New(42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 0, Addr: be.LocalAddr().(*net.UDPAddr).AddrPort()})
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()

	// A client's first flight: a ClientHello, hashed to a ready backend.
	hello, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, make([]byte, 40))})
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.WriteToUDPAddrPort(hello, proxy.Addr)
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, from, err := client.ReadFromUDPAddrPort(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("echoed:", n == len(hello), "from the service address:", from == proxy.Addr)
	<-answered // the echo can reach the client before WriteTo returns and counts it
	st := be.Stats()
	fmt.Println("the backend read and answered through the proxy:", st.AcceptedProxied == 1 && st.WrittenProxied == 1)
	// Output:
	// echoed: true from the service address: true
	// the backend read and answered through the proxy: true
}
