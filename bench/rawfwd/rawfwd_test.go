package main

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/ppv2"
)

func TestHeaderIsPPv2(t *testing.T) {
	f, err := newForwarder("127.0.0.1:0", netip.MustParseAddrPort("127.0.0.1:9"), 4)
	require.NoError(t, err)
	defer f.close()
	client := netip.MustParseAddrPort("127.1.2.3:4567")
	h := f.fwd.hdrs[3*hdrLen : 4*hdrLen]
	stampClient(h, client)
	got, off, err := ppv2.Parse(h)
	require.NoError(t, err, "the fixed header is a valid PROXY v2 header")
	assert.Equal(t, hdrLen, off)
	assert.Equal(t, client, got.Src)
	assert.Equal(t, f.service, got.Dst)

	// The reverse path reads the destination of the backend's header.
	rev, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: got.Dst, Dst: client})
	require.NoError(t, err)
	assert.Equal(t, client, clientOf(rev))

	assert.Zero(t, testing.AllocsPerRun(100, func() { stampClient(h, client); _ = clientOf(rev) }))
}

func TestForwardAndBack(t *testing.T) {
	f, err := newForwarder("127.0.0.1:0", testecho.PPv2(t), 8)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	svc := f.service
	var clients []*net.UDPConn
	for range 3 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer c.Close()
		clients = append(clients, c)
	}
	for i, c := range clients {
		for j := range 5 {
			_, err := c.WriteToUDPAddrPort([]byte{byte(i), byte(j)}, svc)
			require.NoError(t, err)
		}
	}
	buf := make([]byte, 100)
	for i, c := range clients {
		for range 5 {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			require.NoError(t, err)
			assert.Equal(t, svc, from, "replies come from the service address")
			assert.Equal(t, byte(i), buf[0], "each client gets its own replies")
			assert.Equal(t, 2, n)
		}
	}
}

func TestFlags(t *testing.T) {
	assert.Equal(t, 2, cmd(context.Background(), nil, io.Discard, io.Discard), "no backend")
	assert.Equal(t, 2, cmd(context.Background(), []string{"-backend", "[::1]:9"}, io.Discard, io.Discard), "IPv4 only")
	assert.Equal(t, 1, cmd(context.Background(), []string{"-backend", "127.0.0.1:9", "-listen", "bad"}, io.Discard, io.Discard))
}
