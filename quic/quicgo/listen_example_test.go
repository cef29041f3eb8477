package quicgo_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
	cidquic "github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo"
	"github.com/cidroute/cidroute/registry"
)

// A quic-go server behind cidroute proxies: its socket goes through the
// PPv2 adapter (ppv2/backend), which trusts the proxies and hands quic-go
// each client's own address; its connection IDs carry its ordinal, so the
// proxies route every later packet back to it; quicgo.Listen adds Drain
// for a graceful stop. A proxy replica (cidroutetest) and a quic-go client
// on loopback show the server answering through the proxy.
func ExampleListen() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}

	// The server, ordinal 2.
	udp, err := net.ListenUDP("udp4", lo)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := backend.New(udp, backend.Config{
		TrustedProxies: backend.DefaultTrustedProxies(), // the proxies' network, e.g. their pod CIDR
		Direct:         backend.DirectNoHandshake,       // new clients only through the proxies
		Protocol:       backend.QUIC,
	})
	if err != nil {
		log.Fatal(err)
	}
	gen, err := quicgo.NewGenerator(cidquic.LB{}, 2)
	if err != nil {
		log.Fatal(err)
	}
	tr := &quic.Transport{Conn: conn, ConnectionIDGenerator: gen}
	defer tr.Close()
	ln, err := quicgo.Listen(tr, &tls.Config{Certificates: []tls.Certificate{selfSigned()}, NextProtos: []string{"echo"}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		st, err := c.AcceptStream(ctx)
		if err != nil {
			return
		}
		msg, _ := io.ReadAll(st)
		peer := c.RemoteAddr().(*backend.Addr) // the client, and the proxy it came through
		fmt.Fprintf(st, "%s from %v", msg, peer.Client)
		st.Close()
	}()

	// A proxy replica in front of it.
	proxy, err := cidroutetest.New(42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC}},
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
	ctr := &quic.Transport{Conn: cudp}
	defer ctr.Close()
	c, err := ctr.Dial(ctx, net.UDPAddrFromAddrPort(proxy.Addr), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"echo"}}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.CloseWithError(0, "")
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		log.Fatal(err)
	}
	st.Write([]byte("hello"))
	st.Close()
	answer, err := io.ReadAll(st)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("answered as to the client's own address:", string(answer) == fmt.Sprintf("hello from %v", cudp.LocalAddr()))
	fmt.Println("open connections:", ln.Conns())
	// Output:
	// answered as to the client's own address: true
	// open connections: 1
}

// selfSigned is a throwaway certificate for the example's server.
func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		log.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
