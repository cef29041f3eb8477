package backend

import (
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
)

var (
	service = netip.MustParseAddrPort("192.0.2.10:5684")
	client1 = netip.MustParseAddrPort("198.51.100.7:40001")
	client2 = netip.MustParseAddrPort("198.51.100.8:40002")
	loop    = netip.MustParsePrefix("127.0.0.0/8")
)

func listen(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// newConn returns a backend Conn on loopback with cfg; without a Logger it
// logs nowhere.
func newConn(t testing.TB, cfg Config) *Conn {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := New(listen(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// peer is a fake proxy or client: a plain socket.
type peer struct {
	t testing.TB
	c *net.UDPConn
}

func newPeer(t testing.TB) *peer { return &peer{t: t, c: listen(t)} }

func (p *peer) addr() netip.AddrPort { return addrOf(p.c) }

// send sends hdr+payload to the backend.
func (p *peer) send(to *Conn, hdr, payload []byte) {
	p.t.Helper()
	b := append(append([]byte(nil), hdr...), payload...)
	_, err := p.c.WriteToUDPAddrPort(b, to.LocalAddr().(*net.UDPAddr).AddrPort())
	require.NoError(p.t, err)
}

// proxied sends payload with a PROXY header claiming client → service.
func (p *peer) proxied(to *Conn, client netip.AddrPort, payload []byte) {
	p.t.Helper()
	h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client, Dst: service})
	require.NoError(p.t, err)
	p.send(to, h, payload)
}

// recv returns the next datagram, or nil after a short wait.
func (p *peer) recv() []byte {
	p.t.Helper()
	p.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 65536)
	n, _, err := p.c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// nothing reports that no datagram arrives within a short wait.
func (p *peer) nothing() bool {
	p.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 65536)
	_, _, err := p.c.ReadFromUDPAddrPort(buf)
	return err != nil
}

// read reads one datagram from c with a deadline.
func read(t testing.TB, c *Conn) ([]byte, *Addr) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(2*time.Second)))
	buf := make([]byte, 65536)
	n, a, err := c.ReadFrom(buf)
	require.NoError(t, err)
	return buf[:n], a.(*Addr)
}

// reverse parses a reply the backend sent to a proxy.
func reverse(t testing.TB, b []byte) (ppv2.Header, []byte) {
	t.Helper()
	h, off, err := ppv2.Parse(b)
	require.NoError(t, err)
	return h, b[off:]
}

// clock is a fake route-table clock.
type clock struct{ t atomic.Int64 }

func (c *clock) now() int64              { return c.t.Load() }
func (c *clock) advance(d time.Duration) { c.t.Add(int64(d)) }

func withClock(c *Conn) *clock {
	ck := &clock{}
	c.now = ck.now
	return ck
}

// balanced checks that every datagram read was counted once.
func balanced(t testing.TB, s Stats, read uint64) {
	t.Helper()
	require.Equal(t, read, s.Accepted()+s.Dropped(), "%+v", s)
}
