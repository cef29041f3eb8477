package cidroute

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
)

// bigClientHello is a ClientHello record of exactly n bytes.
func bigClientHello(n int) []byte {
	body := make([]byte, n-dtls.HeaderLen-12)
	return must(dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, body)}))
}

// A datagram that the PPv2 header makes larger than a UDP datagram may be
// (65,507 payload bytes over IPv4, 65,527 over IPv6) is refused by the
// kernel with EMSGSIZE and counted as too_big, not as a send error; one
// byte less goes through. The header adds 28 bytes (IPv4) or 52 (IPv6).
func TestTooBig(t *testing.T) {
	for _, c := range []struct {
		name     string
		loopback string
		header   int
		maxUDP   int
	}{
		{"IPv4", "127.0.0.1", ppv2.HeaderLen4, 65535 - 20 - 8},
		{"IPv6", "::1", ppv2.HeaderLen6, 65535 - 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			be, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(c.loopback), 0)))
			if err != nil {
				t.Skipf("no %s loopback: %v", c.name, err)
			}
			defer be.Close()
			reg := newRegistry(t, 1, backend(0, be.LocalAddr().String(), 0))
			listen := netip.AddrPortFrom(netip.MustParseAddr(c.loopback), 0)
			p, err := New(Config{MaxDatagram: 65535, Logger: quietLog, Services: []Service{{Name: "svc", Listen: listen, Workers: 1,
				RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}}})
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() { errc <- p.Run(context.Background()) }()
			defer func() {
				require.NoError(t, p.Close())
				require.NoError(t, <-errc)
			}()
			tp := &testProxy{reg: reg, p: p}
			cl, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(listen))
			require.NoError(t, err)
			defer cl.Close()
			fits := c.maxUDP - c.header
			for _, n := range []int{fits, fits + 1} {
				_, err := cl.WriteToUDPAddrPort(bigClientHello(n), tp.addr())
				require.NoError(t, err)
			}
			st := tp.settled(t, func(s ServiceStats) bool { return s.Forward.Received >= 2 })
			require.Equal(t, uint64(2), st.Forward.Received, "%+v", st.Forward)
			require.Equal(t, uint64(1), st.Forward.Forwarded, "%d bytes + the header fit", fits)
			require.Equal(t, uint64(1), st.Forward.Dropped[TooBig], "%d bytes + the header do not", fits+1)
			require.Zero(t, st.Forward.Dropped[SendError])
			be.SetReadBuffer(1 << 20)
			buf := make([]byte, 65536)
			n, err := be.Read(buf)
			require.NoError(t, err)
			require.Equal(t, c.maxUDP, n, "the backend got the largest datagram there is")
		})
	}
}
