package ppecho

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/stretchr/testify/require"
)

func TestEcho(t *testing.T) {
	var seen []Datagram
	b, err := Listen(Config{Observe: func(d Datagram) {
		d.Payload = append([]byte(nil), d.Payload...)
		seen = append(seen, d)
	}})
	require.NoError(t, err)
	defer b.Close()

	proxy, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer proxy.Close()
	client := netip.MustParseAddrPort("192.0.2.7:4000")
	service := netip.MustParseAddrPort("198.51.100.1:5684")
	msg, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client, Dst: service})
	require.NoError(t, err)
	msg = append(msg, "payload"...)

	_, err = proxy.WriteToUDPAddrPort([]byte("no header"), b.Addr()) // not echoed
	require.NoError(t, err)
	_, err = proxy.WriteToUDPAddrPort(msg, b.Addr())
	require.NoError(t, err)
	proxy.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := proxy.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	require.Equal(t, b.Addr(), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
	h, off, err := ppv2.Parse(buf[:n])
	require.NoError(t, err)
	require.Equal(t, service, h.Src, "reply source is the service")
	require.Equal(t, client, h.Dst, "reply destination is the client")
	require.Equal(t, "payload", string(buf[off:n]))

	require.NoError(t, b.Close())
	require.Equal(t, uint64(2), b.Received())
	require.Equal(t, uint64(1), b.Bad())
	require.Equal(t, uint64(1), b.Echoed())
	require.Len(t, seen, 1)
	require.Equal(t, Datagram{Proxy: proxy.LocalAddr().(*net.UDPAddr).AddrPort(), Client: client, Service: service, Payload: []byte("payload")}, seen[0])
}
