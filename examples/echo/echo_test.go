package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/udpio"
)

var (
	client  = netip.MustParseAddrPort("198.51.100.7:40000")
	service = netip.MustParseAddrPort("203.0.113.1:5684")
	proxy   = netip.MustParseAddrPort("127.0.0.1:9999")
)

func framed(t testing.TB, payload string) []byte {
	b, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client, Dst: service})
	require.NoError(t, err)
	return append(b, payload...)
}

func received(b []byte) udpio.Message {
	buf := make([]byte, 2048)
	return udpio.Message{Buf: buf, N: copy(buf, b), Addr: proxy}
}

func TestReply(t *testing.T) {
	out := udpio.Message{Prefix: make([]byte, 0, headerRoom)}
	in := received(framed(t, "hello"))
	require.True(t, reply(&in, &out, true))
	assert.Equal(t, proxy, out.Addr, "back to the proxy that sent it")
	assert.Equal(t, "hello", string(out.Buf))
	h, off, err := ppv2.Parse(out.Prefix)
	require.NoError(t, err)
	assert.Equal(t, len(out.Prefix), off)
	assert.Equal(t, ppv2.Header{Command: ppv2.Proxy, Src: service, Dst: client}, h, "the reverse header")

	in = received([]byte("no header"))
	assert.False(t, reply(&in, &out, true), "PPv2 mode answers only framed datagrams")
	require.True(t, reply(&in, &out, false))
	assert.Equal(t, "no header", string(out.Buf))
	assert.Empty(t, out.Prefix)

	in.Err = udpio.ErrTruncated
	assert.False(t, reply(&in, &out, false))

	local, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Local})
	require.NoError(t, err)
	in = received(local)
	assert.False(t, reply(&in, &out, true), "LOCAL carries no client")
}

func TestReplyDoesNotAllocate(t *testing.T) {
	out := udpio.Message{Prefix: make([]byte, 0, headerRoom)}
	in := received(framed(t, "payload"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { reply(&in, &out, true) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { reply(&in, &out, false) }))
}

// start runs the command in-process and returns its address.
func start(t *testing.T, args ...string) netip.AddrPort {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int)
	go func() { done <- cmd(ctx, args, pw, io.Discard); pw.Close() }()
	t.Cleanup(func() { cancel(); assert.Equal(t, 0, <-done) })
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go io.Copy(io.Discard, pr)
	_, a, ok := strings.Cut(strings.TrimSpace(line), "listening on ")
	require.True(t, ok, line)
	return netip.MustParseAddrPort(a)
}

func roundTrip(t *testing.T, to netip.AddrPort, b []byte) []byte {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.WriteToUDPAddrPort(b, to)
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	return buf[:n]
}

func TestServe(t *testing.T) {
	pp := start(t, "-sockets", "2")
	got := roundTrip(t, pp, framed(t, "ping"))
	h, off, err := ppv2.Parse(got)
	require.NoError(t, err)
	assert.Equal(t, service, h.Src)
	assert.Equal(t, client, h.Dst)
	assert.Equal(t, "ping", string(got[off:]))

	plain := start(t, "-proxy-protocol=false")
	assert.Equal(t, "pong", string(roundTrip(t, plain, []byte("pong"))))
}

func TestBadFlags(t *testing.T) {
	assert.Equal(t, 2, cmd(context.Background(), []string{"-nope"}, io.Discard, io.Discard))
	assert.Equal(t, 1, cmd(context.Background(), []string{"-listen", "not an address"}, io.Discard, io.Discard))
}
