package cidroute_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
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

// A Pipeline runs the rules on batched sockets: here one DTLS service on
// loopback, in front of a registry a source keeps up to date.
func ExamplePipeline() {
	reg, err := registry.New(registry.Config{Service: "coap", Seed: 42})
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	err = reg.Update([]registry.Backend{{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:15684")}})
	if err != nil {
		panic(err)
	}
	p, err := cidroute.New(cidroute.Config{
		Logger: slog.New(slog.DiscardHandler),
		Services: []cidroute.Service{{
			Name:   "coap",
			Listen: netip.MustParseAddrPort("127.0.0.1:0"),
			RouterConfig: cidroute.RouterConfig{
				Protocol: cidroute.DTLS,
				Backends: reg,
			},
			Limits:  cidroute.Limits{HandshakePPS: 1000},
			Workers: 1,
		}},
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	go func() { <-ctx.Done(); p.Close() }()
	addr, _ := p.Addr("coap")
	fmt.Println(addr.Addr(), addr.Port() != 0)
	if err := p.Run(ctx); err != nil {
		panic(err)
	}
	st := p.Stats()[0]
	fmt.Println(st.Name, st.Forward.Received, st.Forward.Balanced())
	// Output:
	// 127.0.0.1 true
	// coap 0 true
}
