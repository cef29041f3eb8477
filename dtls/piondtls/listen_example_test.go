package piondtls_test

import (
	"fmt"
	"log"
	"net"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// A pion/dtls server behind cidroute proxies: its socket goes through the
// PPv2 adapter (ppv2/backend), which trusts the proxies and hands pion each
// client's own address; its connection IDs carry its ordinal, so the
// proxies route every record of the session back to it, whichever replica
// or client port it arrives on. A proxy replica (cidroutetest) and a pion
// client on loopback show the server answering through the proxy.
func ExampleListen() {
	psk := func([]byte) ([]byte, error) { return []byte("secret"), nil }
	suites := []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8}
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}

	// The server, ordinal 2.
	udp, err := net.ListenUDP("udp4", lo)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := backend.New(udp, backend.Config{
		TrustedProxies: backend.DefaultTrustedProxies(), // the proxies' network, e.g. their pod CIDR
		Direct:         backend.DirectNoHandshake,       // new clients only through the proxies
		Protocol:       backend.DTLS,
	})
	if err != nil {
		log.Fatal(err)
	}
	gen, err := piondtls.Generator(2, 0) // ordinal 2, 8-byte CIDs
	if err != nil {
		log.Fatal(err)
	}
	ln, err := piondtls.Listen(conn, &pion.Config{PSK: psk, PSKIdentityHint: []byte("server"),
		CipherSuites: suites, ConnectionIDGenerator: gen})
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 100)
		n, _ := c.Read(buf)
		peer := c.RemoteAddr().(*backend.Addr) // the client, and the proxy it came through
		fmt.Fprintf(c, "%s from %v", buf[:n], peer.Client)
		c.Read(buf) // until the client closes: our close_notify could overtake the reply
	}()

	// A proxy replica in front of it.
	proxy, err := cidroutetest.New(42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 2, Addr: udp.LocalAddr().(*net.UDPAddr).AddrPort()})
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()

	// A client of the proxy's address.
	cudp, err := net.ListenUDP("udp4", lo)
	if err != nil {
		log.Fatal(err)
	}
	cl, err := pion.Client(cudp, net.UDPAddrFromAddrPort(proxy.Addr), &pion.Config{PSK: psk,
		PSKIdentityHint: []byte("client"), CipherSuites: suites, ConnectionIDGenerator: pion.OnlySendCIDGenerator()})
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	cl.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := cl.Write([]byte("hello")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 100)
	n, err := cl.Read(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("answered as to the client's own address:", string(buf[:n]) == fmt.Sprintf("hello from %v", cudp.LocalAddr()))
	fmt.Println("sessions:", ln.Stats().Sessions)
	// Output:
	// answered as to the client's own address: true
	// sessions: 1
}
