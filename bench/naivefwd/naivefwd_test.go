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

	"github.com/cidroute/cidroute/internal/testecho"
)

func TestSessions(t *testing.T) {
	echo := testecho.Plain(t)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int)
	go func() {
		done <- cmd(ctx, []string{"-backend", echo.String(), "-idle", "200ms"}, pw, io.Discard)
		pw.Close()
	}()
	defer func() { cancel(); assert.Equal(t, 0, <-done) }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go io.Copy(io.Discard, pr)
	_, a, _ := strings.Cut(strings.TrimSpace(line), "listening on ")
	svc := netip.MustParseAddrPort(a)

	buf := make([]byte, 100)
	for round := range 2 { // the second round comes after the sessions idled out
		for i := range 3 {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			for j := range 3 {
				_, err := c.WriteToUDPAddrPort([]byte{byte(round), byte(i), byte(j)}, svc)
				require.NoError(t, err)
			}
			for range 3 {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, from, err := c.ReadFromUDPAddrPort(buf)
				require.NoError(t, err)
				assert.Equal(t, svc, from)
				assert.Equal(t, []byte{byte(round), byte(i)}, buf[:2])
				assert.Equal(t, 3, n)
			}
			c.Close()
		}
		time.Sleep(400 * time.Millisecond)
	}
}

func TestFlags(t *testing.T) {
	assert.Equal(t, 2, cmd(context.Background(), nil, io.Discard, io.Discard), "no backend")
	assert.Equal(t, 2, cmd(context.Background(), []string{"-backend", "127.0.0.1:9", "-listen", "bad"}, io.Discard, io.Discard))
}
