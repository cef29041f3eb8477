// Package testecho is an echo backend for tests of forwarders (the
// benchmark's baselines, cidproxy): examples/echo in miniature, on one
// loopback socket, stopped when the test ends.
package testecho

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/cidroute/cidroute/ppv2"
)

// Plain returns every datagram to its sender unchanged, for forwarders
// without PPv2.
func Plain(t testing.TB) netip.AddrPort { return start(t, false) }

// PPv2 answers a PROXY v2 framed datagram with the reverse header (source =
// service, destination = client), then the payload. Datagrams without a
// header get no answer.
func PPv2(t testing.TB) netip.AddrPort { return start(t, true) }

func start(t testing.TB, pp bool) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { c.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			out := buf[:n]
			if pp {
				h, off, err := ppv2.Parse(out)
				if err != nil {
					continue
				}
				hdr, _ := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: h.Dst, Dst: h.Src})
				out = append(hdr, buf[off:n]...)
			}
			c.WriteToUDPAddrPort(out, from)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}
