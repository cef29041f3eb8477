package backend

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
)

func TestProxiedClaimedAndMeasured(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	px.proxied(c, client1, []byte("hello"))
	b, a := read(t, c)
	assert.Equal(t, "hello", string(b))
	assert.Equal(t, client1, a.Client, "claimed")
	assert.Equal(t, px.addr(), a.Proxy, "measured")
	assert.Equal(t, service, a.Service)
	assert.Equal(t, client1.String(), a.String())
	assert.Equal(t, "udp", a.Network())

	n, err := c.WriteTo([]byte("world"), a)
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	h, p := reverse(t, px.recv())
	assert.Equal(t, ppv2.Header{Command: ppv2.Proxy, Src: service, Dst: client1}, h)
	assert.Equal(t, "world", string(p))

	r, ok := c.Route(client1)
	require.True(t, ok, "commit-on-write")
	assert.Equal(t, *a, r)
	_, err = c.WriteTo([]byte("later"), net.UDPAddrFromAddrPort(client1))
	require.NoError(t, err)
	_, p = reverse(t, px.recv())
	assert.Equal(t, "later", string(p))
}
