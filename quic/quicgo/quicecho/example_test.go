package quicecho_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// The echo server behind a proxy replica, and a quic-go client talking to
// it through the proxy.
func Example() {
	srv, err := quicecho.Listen(quicecho.Config{Ordinal: 2, TrustedProxies: backend.DefaultTrustedProxies()})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	proxy, err := cidroutetest.New(42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC}},
		registry.Backend{Ordinal: 2, Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer proxy.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	defer tr.Close()
	c, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(proxy.Addr),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicecho.DefaultALPN}}, &quic.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.CloseWithError(0, "done")
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		log.Fatal(err)
	}
	st.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(st, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(buf), "through the proxy:", srv.Connections()[0].First.Proxied())
	// Output: hello through the proxy: true
}
