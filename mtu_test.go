package cidroute

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

// At the largest MaxDatagram a family allows, a datagram that the PPv2
// header makes larger than a UDP datagram may be (65,507 payload bytes
// over IPv4, 65,527 over IPv6) is counted as too_big, not as a send
// error; one byte less goes through. The header adds 28 bytes (IPv4) or
// 52 (IPv6).
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
			maxDatagram := MaxDatagram4
			if c.name == "IPv6" {
				maxDatagram = MaxDatagram6
			}
			p, err := New(Config{MaxDatagram: maxDatagram, Logger: quietLog, Services: []Service{{Name: "svc", Listen: listen, Workers: 1,
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

// TestMaxDatagram (issue 36): one limit, Config.MaxDatagram, counted as
// the client sees a datagram (the PPv2 header not included), in both
// directions and both modes: a datagram of exactly the limit is relayed,
// one byte more is dropped as too_big.
func TestMaxDatagram(t *testing.T) {
	const limit = 2000
	for _, transparent := range []bool{false, true} {
		t.Run(map[bool]string{false: "ppv2", true: "transparent"}[transparent], func(t *testing.T) {
			be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			defer be.Close()
			var replySize atomic.Int64
			got := make(chan int, 8) // payload sizes the backend received
			go func() {
				buf := make([]byte, 65536)
				for {
					n, from, err := be.ReadFromUDPAddrPort(buf)
					if err != nil {
						return
					}
					reply := make([]byte, replySize.Load())
					if transparent {
						got <- n
					} else {
						h, off, err := ppv2.Parse(buf[:n])
						if err != nil {
							continue
						}
						got <- n - off
						reply = append(must(ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: h.Dst, Dst: h.Src})), reply...)
					}
					be.WriteToUDPAddrPort(reply, from)
				}
			}()
			reg := newRegistry(t, 1, backend(0, be.LocalAddr().String(), 0))
			p, err := New(Config{MaxDatagram: limit, Logger: quietLog, Wait: testWait, Services: []Service{{Name: "svc",
				Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
				RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg, Transparent: transparent}}}})
			require.NoError(t, err)
			errc := make(chan error, 1)
			go func() { errc <- p.Run(context.Background()) }()
			defer func() {
				require.NoError(t, p.Close())
				require.NoError(t, <-errc)
			}()
			tp := &testProxy{reg: reg, p: p}
			cl, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			defer cl.Close()
			// exchange sends a ClientHello of n bytes, the backend answering
			// with reply bytes, and returns what the backend and the client
			// received (-1: nothing).
			exchange := func(n, reply int) (atBackend, atClient int) {
				replySize.Store(int64(reply))
				_, err := cl.WriteToUDPAddrPort(bigClientHello(n), tp.addr())
				require.NoError(t, err)
				atBackend, atClient = -1, -1
				select {
				case atBackend = <-got:
				case <-time.After(time.Second):
					return
				}
				buf := make([]byte, 65536)
				cl.SetReadDeadline(time.Now().Add(time.Second))
				if m, _, err := cl.ReadFromUDPAddrPort(buf); err == nil {
					atClient = m
				}
				return
			}
			b, c := exchange(limit, limit)
			assert.Equal(t, limit, b, "a client datagram of the limit reaches the backend whole")
			assert.Equal(t, limit, c, "a reply of the limit reaches the client")
			b, _ = exchange(limit+1, 10)
			assert.Equal(t, -1, b, "one byte more is not forwarded")
			b, c = exchange(100, limit+1)
			assert.Equal(t, 100, b)
			assert.Equal(t, -1, c, "a reply of one byte more is not relayed")
			st := tp.quiet(t)
			assert.Equal(t, uint64(1), st.Forward.Dropped[TooBig], "%+v", st.Forward)
			assert.Equal(t, uint64(1), st.Reverse.Dropped[TooBig], "%+v", st.Reverse)
			assert.Zero(t, st.Forward.Dropped[Malformed]+st.Reverse.Dropped[Malformed])
		})
	}
}
