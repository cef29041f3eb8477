package cidroutetest

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
)

// ppv2Echo is a backend that answers each PPv2 datagram with its payload
// behind the reverse header, and reports the claimed client of each.
func ppv2Echo(t *testing.T) (netip.AddrPort, <-chan netip.AddrPort) {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	clients := make(chan netip.AddrPort, 16)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			h, off, err := ppv2.Parse(buf[:n])
			if err != nil {
				continue
			}
			clients <- h.Src
			out, _ := ppv2.AppendProxy(nil, h.Dst, h.Src)
			c.WriteToUDPAddrPort(append(out, buf[off:n]...), from)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort(), clients
}

func cidRecord(t *testing.T, ord uint8) []byte {
	cid, err := dtls.OrdinalFirst{}.AppendCID(nil, ord)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 1, CID: cid, Fragment: []byte("app data")})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func exchange(t *testing.T, c net.PacketConn, b []byte) []byte {
	t.Helper()
	if _, err := c.WriteTo(b, nil); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65536)
	n, _, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestStartAndRebind: a CID session keeps its backend through a rebinding
// and a move to a second replica, and the backend sees each new source
// port as the claimed client.
func TestStartAndRebind(t *testing.T) {
	be, clients := ppv2Echo(t)
	bs := []registry.Backend{{Ordinal: 0, Addr: be}}
	svc := cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}}
	a, b := Start(t, 9, svc, bs...), Start(t, 9, svc, bs...)
	if a.Addr == b.Addr || !a.Addr.Addr().IsLoopback() {
		t.Fatalf("replicas at %v and %v", a.Addr, b.Addr)
	}
	c, err := ListenRebind(a.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WatchDTLSCID(dtls.OrdinalFirstDefaultLen)
	rec := cidRecord(t, 0)
	first := c.Local()
	if got := exchange(t, c, rec); !bytes.Equal(got, rec) {
		t.Fatalf("echo %x", got)
	}
	if got := <-clients; got != first {
		t.Fatalf("backend saw client %v, want %v", got, first)
	}
	if err := c.Rebind(b.Addr); err != nil {
		t.Fatal(err)
	}
	if c.Local() == first || c.Target() != b.Addr || c.Ports() != 2 {
		t.Fatalf("after Rebind: local %v, target %v, %d ports", c.Local(), c.Target(), c.Ports())
	}
	if got := exchange(t, c, rec); !bytes.Equal(got, rec) {
		t.Fatalf("echo after rebinding %x", got)
	}
	if got := <-clients; got != c.Local() {
		t.Fatalf("backend saw client %v, want the new port %v", got, c.Local())
	}
	if !bytes.Equal(c.CID(), rec[11:19]) {
		t.Fatalf("CID %x", c.CID())
	}
	// A reply is counted after its send returns, so the client can read it
	// before the replica's counter moves: wait for the counts.
	for _, p := range []*Proxy{a, b} {
		deadline := time.Now().Add(5 * time.Second)
		for st := p.Stats()[0]; st.Forward.Forwarded != 1 || st.Reverse.Forwarded != 1; st = p.Stats()[0] {
			if time.Now().After(deadline) {
				t.Fatalf("replica %v: %+v", p.Addr, st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The registry is the replica's own: a removed backend's CID is dropped.
	if err := a.Registry.Update([]registry.Backend{{Ordinal: 1, Addr: be}}); err != nil {
		t.Fatal(err)
	}
	c.Retarget(a.Addr)
	c.WriteTo(rec, nil)
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats()[0].Forward.Dropped[cidroute.UnknownOrdinal] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("not dropped: %+v", a.Stats()[0].Forward)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNewError(t *testing.T) {
	if _, err := New(1, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}}); err == nil {
		t.Fatal("no backends: started")
	}
	p, err := New(1, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}},
		registry.Backend{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}
