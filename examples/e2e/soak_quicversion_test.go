package e2e

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// TestSoakUnknownVersionIsHandshake: a QUIC long header with a version the
// proxy does not know starts a handshake (the backend answers it with
// Version Negotiation), so HandshakePPS should bound it like an Initial.
// Datagrams under 1200 bytes, which no server answers (RFC 9000 §14.1),
// are dropped as malformed.
func TestSoakUnknownVersionIsHandshake(t *testing.T) {
	// A plain UDP sink stands in for the backend: only the proxy's
	// verdicts matter here.
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer sink.Close()
	reg := soakStatic(t, "quic", nil)
	defer reg.Close()
	require.NoError(t, reg.Update(soakBackendAt(0, sink)))
	const hsPPS = 10
	p, err := cidroute.New(cidroute.Config{Logger: soakQuiet(), Services: []cidroute.Service{{
		Name: "quic", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		Limits:       cidroute.Limits{HandshakePPS: hsPPS},
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.QUIC, PublicAddr: soakQUICPublic, Backends: reg},
	}}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(t.Context()) }()
	defer func() { p.Close(); <-done }()
	to, _ := p.Addr("quic")

	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer u.Close()
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200
	start := time.Now()
	for i := range n {
		if i%20 == 19 {
			time.Sleep(2 * time.Millisecond) // stay within the socket buffer
		}
		b := []byte{0xc0}
		b = binary.BigEndian.AppendUint32(b, 0x1a2a3a4a) // a reserved (greasing) version
		b = append(b, 8)
		b = append(b, soakCID(r, 0)...)
		b = append(b, 0)
		b = append(b, make([]byte, 1200-len(b))...)
		_, err := u.WriteToUDPAddrPort(b, to)
		require.NoError(t, err)
	}
	elapsed := time.Since(start).Seconds()
	var st cidroute.ServiceStats
	soakEventually(t, 5*time.Second, func() bool {
		st = p.Stats()[0]
		return st.Forward.Received == n && st.Forward.Balanced()
	}, "not all received")
	budget := float64(hsPPS) * (elapsed + 1)
	assert.LessOrEqual(t, float64(st.Forward.Forwarded), budget,
		"unknown-version long headers forwarded past HandshakePPS: %d of %d (drops %v)", st.Forward.Forwarded, n, soakDrops(st.Forward))

	// Small ones are malformed, whatever the limit says.
	small := []byte{0xc0, 0x1a, 0x2a, 0x3a, 0x4a, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}
	for range 20 {
		_, err := u.WriteToUDPAddrPort(small, to)
		require.NoError(t, err)
	}
	soakEventually(t, 5*time.Second, func() bool {
		st = p.Stats()[0]
		return st.Forward.Received == n+20 && st.Forward.Balanced()
	}, "not all received")
	assert.Equal(t, uint64(20), st.Forward.Dropped[cidroute.Malformed])
}

func soakBackendAt(ord uint8, c *net.UDPConn) []registry.Backend {
	return []registry.Backend{{Ordinal: ord, Addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}}
}
