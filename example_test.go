package cidroute_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// exampleRegistry holds two ready backends, ordinals 0 and 1.
func exampleRegistry() *registry.Registry {
	reg, err := registry.New(registry.Config{Service: "coap", Seed: 42})
	if err != nil {
		panic(err)
	}
	err = reg.Update([]registry.Backend{
		{Ordinal: 0, Addr: netip.MustParseAddrPort("10.0.0.10:5684"), Weight: 1},
		{Ordinal: 1, Addr: netip.MustParseAddrPort("10.0.0.11:5684"), Weight: 1},
	})
	if err != nil {
		panic(err)
	}
	return reg
}

// The forward rule on a client's tls12_cid record: the CID's first byte
// names backend 1, which gets the datagram behind a PPv2 header.
func ExampleRouter_Forward() {
	reg := exampleRegistry()
	defer reg.Close()
	r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: cidroute.DTLS,
		PublicAddr: netip.MustParseAddrPort("192.0.2.1:5684"), Backends: reg})
	if err != nil {
		panic(err)
	}
	rec, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 9,
		CID: []byte{1, 2, 3, 4, 5, 6, 7, 8}, Fragment: []byte("ciphertext")})
	client := netip.MustParseAddrPort("198.51.100.7:40000")

	v := r.View(nil) // once per batch: the registry snapshot, no own addresses
	hdr := make([]byte, 0, cidroute.HeaderRoom)
	d, hdr := r.Forward(hdr, rec, client, netip.Addr{}, &v)
	fmt.Println(d.Reason == cidroute.Forwarded, d.Class.Kind, d.Ordinal, d.Backend)
	h, _, _ := ppv2.Parse(hdr)
	fmt.Println(h.Src, "->", h.Dst)

	// A CID of an ordinal the registry does not know is dropped, never
	// re-hashed.
	rec[11] = 9
	d, _ = r.Forward(hdr[:0], rec, client, netip.Addr{}, &v)
	fmt.Println(d.Reason)
	// Output:
	// true established 1 10.0.0.11:5684
	// 198.51.100.7:40000 -> 192.0.2.1:5684
	// unknown_ordinal
}

// ForwardAt writes the header into headroom right in front of the
// datagram, so that a plain socket write sends both.
func ExampleRouter_ForwardAt() {
	reg := exampleRegistry()
	defer reg.Close()
	r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: cidroute.DTLS,
		PublicAddr: netip.MustParseAddrPort("192.0.2.1:5684"), Backends: reg})
	if err != nil {
		panic(err)
	}
	buf := make([]byte, cidroute.HeaderRoom+1500)
	// Receive into buf[cidroute.HeaderRoom:], e.g. with
	// conn.ReadFromUDPAddrPort(buf[cidroute.HeaderRoom:]).
	rec, _ := dtls.AppendRecord(buf[cidroute.HeaderRoom:cidroute.HeaderRoom], dtls.Record{Type: dtls.TLS12CID,
		Epoch: 1, CID: []byte{0, 2, 3, 4, 5, 6, 7, 8}, Fragment: []byte("ciphertext")})
	n := len(rec)

	v := r.View(nil)
	d, out := r.ForwardAt(buf[:cidroute.HeaderRoom+n], cidroute.HeaderRoom, netip.MustParseAddrPort("198.51.100.7:40000"), netip.Addr{}, &v)
	// conn.WriteToUDPAddrPort(out, d.Backend)
	fmt.Println(d.Backend, len(out) == ppv2.HeaderLen4+n, &out[len(out)-1] == &buf[cidroute.HeaderRoom+n-1])
	// Output:
	// 10.0.0.10:5684 true true
}

// The reverse rule on a backend's reply: it is relayed only from a backend,
// with a header naming the public address as source, to a client the
// service can reach that is none of the process's own addresses.
func ExampleRouter_Reverse() {
	reg := exampleRegistry()
	defer reg.Close()
	public := netip.MustParseAddrPort("192.0.2.1:5684")
	r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: public, Backends: reg})
	if err != nil {
		panic(err)
	}
	// This process's sockets: the service's and the upstream one.
	own := cidroute.NewOwnAddrs([]netip.AddrPort{public, netip.MustParseAddrPort("192.0.2.1:40000")}, nil)
	backend := netip.MustParseAddrPort("10.0.0.10:5684")
	reply := func(to string) []byte {
		b, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: public, Dst: netip.MustParseAddrPort(to)})
		return append(b, "answer"...)
	}

	v := r.View(own)
	rep := r.Reverse(reply("198.51.100.7:40000"), backend, cidroute.Session{}, &v)
	fmt.Println(rep.Reason == cidroute.Forwarded, rep.Client, string(rep.Payload))
	for _, b := range []struct {
		from netip.AddrPort
		b    []byte
	}{
		{netip.MustParseAddrPort("203.0.113.9:5684"), reply("198.51.100.7:40000")}, // not a backend
		{backend, reply("192.0.2.1:40000")},                                        // the proxy's own socket
		{backend, reply("[2001:db8::7]:40000")},                                    // an IPv6 client of an IPv4 service
		{backend, []byte("no header")},
	} {
		fmt.Println(r.Reverse(b.b, b.from, cidroute.Session{}, &v).Reason)
	}
	// Output:
	// true 198.51.100.7:40000 answer
	// untrusted_sender
	// bad_destination
	// bad_destination
	// bad_proxy_header
}

// Embedding a Pipeline: a registry of backends, one DTLS service in front
// of them, Run until the context ends, then Close. In a program the context
// is signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM), Listen the
// service's port on every address (":5684"), and a registry.Source (a file,
// Kubernetes) keeps the registry up to date. Here one client datagram goes
// through it to a backend on loopback and back.
func ExamplePipeline() {
	be := startEchoBackend()
	defer be.Close()

	reg, err := registry.NewStatic(registry.Config{Service: "coap", Seed: 42},
		[]registry.Backend{{Ordinal: 0, Addr: be.LocalAddr().(*net.UDPAddr).AddrPort()}})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close()

	p, err := cidroute.New(cidroute.Config{
		Logger: slog.New(slog.DiscardHandler),
		Services: []cidroute.Service{{
			Name:         "coap",
			Listen:       netip.MustParseAddrPort("127.0.0.1:0"),
			RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg},
			Limits:       cidroute.Limits{HandshakePPS: 1000},
			Workers:      1, // 0: one per CPU
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	// A client's first flight, echoed by the backend. (New bound the
	// sockets: what arrives before Run reads waits in the kernel.)
	addr, _ := p.Addr("coap")
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.WriteToUDPAddrPort(clientHello(), addr)
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, from, err := client.ReadFromUDPAddrPort(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("echoed:", bytes.Equal(buf[:n], clientHello()), "from the service:", from == addr)

	stop() // SIGTERM
	fmt.Println("run:", <-done)
	st := p.Stats()[0]
	fmt.Println(st.Name, st.Forward.Forwarded, st.Reverse.Forwarded, st.Forward.Balanced())
	// Output:
	// echoed: true from the service: true
	// run: <nil>
	// coap 1 1 true
}

// A Router in the caller's own loop: the caller owns the sockets (here one
// for clients and one towards the backends, on loopback) and calls Forward
// on what clients send and Reverse on what backends answer. The Pipeline
// does the same on batched sockets, with the admission limits.
func ExampleRouter() {
	be := startEchoBackend()
	defer be.Close()
	reg, err := registry.NewStatic(registry.Config{Service: "coap", Seed: 42},
		[]registry.Backend{{Ordinal: 0, Addr: be.LocalAddr().(*net.UDPAddr).AddrPort()}})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close()

	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	svc, err := net.ListenUDP("udp4", lo) // clients send here
	if err != nil {
		log.Fatal(err)
	}
	defer svc.Close()
	up, err := net.ListenUDP("udp4", lo) // backends answer here
	if err != nil {
		log.Fatal(err)
	}
	defer up.Close()
	public := svc.LocalAddr().(*net.UDPAddr).AddrPort()
	r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: public, Backends: reg})
	if err != nil {
		log.Fatal(err)
	}
	// Neither rule may send to the process's own sockets.
	own := cidroute.NewOwnAddrs([]netip.AddrPort{public, up.LocalAddr().(*net.UDPAddr).AddrPort()}, nil)
	var drops [cidroute.NumReasons]atomic.Uint64

	go func() { // forward: client → backend, behind a PPv2 header
		buf := make([]byte, 2048)
		out := make([]byte, 0, cidroute.HeaderRoom+len(buf))
		for {
			n, client, err := svc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			v := r.View(own) // once per batch of datagrams
			d, hdr := r.Forward(out[:0], buf[:n], client, netip.Addr{}, &v)
			if d.Reason != cidroute.Forwarded {
				drops[d.Reason].Add(1)
				continue
			}
			up.WriteToUDPAddrPort(append(hdr, buf[:n]...), d.Backend)
		}
	}()
	go func() { // reverse: backend → client, header checked and stripped
		buf := make([]byte, 2048)
		for {
			n, from, err := up.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			v := r.View(own)
			rep := r.Reverse(buf[:n], from, cidroute.Session{}, &v)
			if rep.Reason != cidroute.Forwarded {
				drops[rep.Reason].Add(1)
				continue
			}
			svc.WriteToUDPAddrPort(rep.Payload, rep.Client)
		}
	}()

	client, err := net.ListenUDP("udp4", lo)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.WriteToUDPAddrPort([]byte("not DTLS"), public)
	client.WriteToUDPAddrPort(clientHello(), public)
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, from, err := client.ReadFromUDPAddrPort(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("echoed:", bytes.Equal(buf[:n], clientHello()), "from the service:", from == public)
	fmt.Println("malformed:", drops[cidroute.Malformed].Load())
	// Output:
	// echoed: true from the service: true
	// malformed: 1
}

// startEchoBackend starts a backend as a DTLS or QUIC server runs one: its
// socket behind ppv2/backend, which trusts proxies on this host and hands
// the server each datagram with the client's address. It echoes every
// datagram until closed.
func startEchoBackend() *backend.Conn {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		log.Fatal(err)
	}
	be, err := backend.New(udp, backend.Config{TrustedProxies: backend.DefaultTrustedProxies()})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := be.ReadFrom(buf)
			if err != nil {
				return
			}
			be.WriteTo(buf[:n], from)
		}
	}()
	return be
}

// clientHello is a DTLS client's first datagram: a ClientHello record.
func clientHello() []byte {
	b, _ := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, make([]byte, 40))})
	return b
}
