package piondtls_test

import (
	"fmt"
	"net"
	"net/netip"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// A pion/dtls v3 server with ordinal CIDs over the PPv2 adapter. Here the
// client connects directly, which the adapter's default policy allows;
// behind cidroute proxies the same server sees each client's claimed
// address in RemoteAddr and the proxy beside it.
func Example() {
	psk := func([]byte) ([]byte, error) { return []byte("secret"), nil }
	suites := []pion.CipherSuiteID{pion.TLS_PSK_WITH_AES_128_CCM_8}

	udp, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	conn, err := backend.New(udp, backend.Config{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Protocol:       backend.DTLS,
	})
	if err != nil {
		panic(err)
	}
	gen, _ := piondtls.Generator(2, 0) // this backend's ordinal: 2
	ln, err := piondtls.Listen(conn, &pion.Config{PSK: psk, PSKIdentityHint: []byte("server"),
		CipherSuites: suites, ConnectionIDGenerator: gen})
	if err != nil {
		panic(err)
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
		a := c.RemoteAddr().(*backend.Addr)
		fmt.Fprintf(c, "%s (proxied: %v)", buf[:n], a.Proxied())
		c.Read(buf) // until the client closes: our close_notify could overtake the reply
	}()

	cl, err := pion.Dial("udp", ln.Addr().(*net.UDPAddr), &pion.Config{PSK: psk, PSKIdentityHint: []byte("client"),
		CipherSuites: suites, ConnectionIDGenerator: pion.OnlySendCIDGenerator()})
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	cl.Write([]byte("hello"))
	buf := make([]byte, 100)
	n, _ := cl.Read(buf)
	fmt.Println(string(buf[:n]))
	// Output:
	// hello (proxied: false)
}

// The same server with pion v3.1's options instead of its deprecated
// Config: the CID length is given beside them.
func ExampleListenWithOptions() {
	udp, _ := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	conn, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies(), Protocol: backend.DTLS})
	if err != nil {
		panic(err)
	}
	gen, _ := piondtls.Generator(2, 8) // ordinal 2, 8-byte CIDs
	ln, err := piondtls.ListenWithOptions(conn, piondtls.Config{CIDLen: 8},
		pion.WithPSK(func([]byte) ([]byte, error) { return []byte("secret"), nil }),
		pion.WithPSKIdentityHint([]byte("server")),
		pion.WithCipherSuites(pion.TLS_PSK_WITH_AES_128_CCM_8),
		pion.WithConnectionIDGenerator(gen))
	if err != nil {
		panic(err)
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
		c.Write(buf[:n])
		c.Read(buf)
	}()

	cl, err := pion.DialWithOptions("udp", ln.Addr().(*net.UDPAddr),
		pion.WithPSK(func([]byte) ([]byte, error) { return []byte("secret"), nil }),
		pion.WithPSKIdentityHint([]byte("client")),
		pion.WithCipherSuites(pion.TLS_PSK_WITH_AES_128_CCM_8),
		pion.WithConnectionIDGenerator(pion.OnlySendCIDGenerator()))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	cl.Write([]byte("options"))
	buf := make([]byte, 100)
	n, _ := cl.Read(buf)
	fmt.Println(string(buf[:n]))
	// Output:
	// options
}
