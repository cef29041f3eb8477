//go:build linux

package cidroute

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/registry"
)

// dupConn duplicates c's descriptor, as SCM_RIGHTS does for the process
// that receives it: another descriptor of the same socket. (Not c.File:
// its Fd would make the shared socket blocking under c's reader.)
func dupConn(t testing.TB, c syscall.Conn) *net.UDPConn {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var fd int
	var derr error
	require.NoError(t, rc.Control(func(s uintptr) { fd, derr = unix.Dup(int(s)) }))
	require.NoError(t, derr)
	f := os.NewFile(uintptr(fd), "dup")
	defer f.Close()
	fc, err := net.FileConn(f)
	require.NoError(t, err)
	return fc.(*net.UDPConn)
}

func dupAll(t testing.TB, cs []syscall.Conn) []*net.UDPConn {
	var out []*net.UDPConn
	for _, c := range cs {
		out = append(out, dupConn(t, c))
	}
	return out
}

// TestPipelineHandover replaces a running pipeline with one serving the
// same sockets (Service.Conns and UpstreamConns, as a successor process
// gets them), while a client streams CID records. The old one drains.
// Nothing is lost either way: the sockets, and so their queues, stay; the
// two pipelines' counters add up to what was sent, each balanced.
func TestPipelineHandover(t *testing.T) {
	var bs []registry.Backend
	backs := make([]interface{ Received() uint64 }, 3)
	for i := range 3 {
		e := startEcho(t, uint8(i))
		backs[i] = e
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: e.Addr()})
	}
	reg := newRegistry(t, 42, bs...)
	svc := Service{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 2,
		RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: publicAddr, Backends: reg}}
	old, err := New(Config{Services: []Service{svc}, Logger: quietLog})
	require.NoError(t, err)
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Run(context.Background()) }()
	addr, _ := old.Addr("svc")

	// The client: 6000 records at about 20,000/s, counting the echoes.
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadBuffer(4<<20))
	const total = 6000
	var echoed atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			echoed.Add(1)
		}
	}()
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		codec := dtls.OrdinalFirst{Length: DefaultDTLSCIDLen}
		for i := range total {
			cid, _ := codec.AppendCID(nil, uint8(i%3))
			c.WriteToUDPAddrPort(dtlsCIDRecord(cid, uint64(i), []byte("payload")), addr)
			if i%20 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()

	time.Sleep(60 * time.Millisecond)
	listen, ups, ok := old.Sockets("svc")
	require.True(t, ok)
	require.Len(t, listen, 2)
	require.Len(t, ups, 2)
	next := svc
	next.Listen, next.Workers = netip.AddrPort{}, 0 // both from the sockets
	next.Conns, next.UpstreamConns = dupAll(t, listen), dupAll(t, ups)
	succ, err := New(Config{Services: []Service{next}, Logger: quietLog})
	require.NoError(t, err)
	succDone := make(chan error, 1)
	go func() { succDone <- succ.Run(context.Background()) }()
	sa, _ := succ.Addr("svc")
	require.Equal(t, addr, sa)
	oldUps, _ := old.UpstreamAddrs("svc")
	succUps, _ := succ.UpstreamAddrs("svc")
	require.Equal(t, oldUps, succUps, "the backends keep replying to the same ports")
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	require.NoError(t, old.Drain(ctx))
	cancel()
	require.NoError(t, <-oldDone)

	<-sent
	require.Eventually(t, func() bool { return echoed.Load() == total }, 5*time.Second, 10*time.Millisecond,
		"echoes %d of %d", echoed.Load(), total)
	var received uint64
	for _, b := range backs {
		received += b.Received()
	}
	assert.Equal(t, uint64(total), received, "the backends received every datagram")
	require.NoError(t, succ.Close())
	require.NoError(t, <-succDone)

	o, s := old.Stats()[0], succ.Stats()[0]
	for _, st := range []ServiceStats{o, s} {
		require.True(t, st.Forward.Balanced(), "%+v", st.Forward)
		require.True(t, st.Reverse.Balanced(), "%+v", st.Reverse)
	}
	t.Logf("old: forward %d, reverse %d; successor: forward %d, reverse %d", o.Forward.Received, o.Reverse.Received, s.Forward.Received, s.Reverse.Received)
	assert.Equal(t, uint64(total), o.Forward.Received+s.Forward.Received, "each datagram counted once, by one of them")
	assert.Equal(t, uint64(total), o.Forward.Forwarded+s.Forward.Forwarded)
	assert.Equal(t, uint64(total), o.Reverse.Forwarded+s.Reverse.Forwarded)
	assert.NotZero(t, o.Forward.Received, "the old one served before")
	assert.NotZero(t, s.Forward.Received, "the successor served after")
}

func TestPipelineConnsChecked(t *testing.T) {
	reg := newRegistry(t, 1, registry.Backend{Ordinal: 0, Addr: netip.MustParseAddrPort("127.0.0.1:9")})
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	svc := Service{Name: "a", Listen: netip.MustParseAddrPort("127.0.0.1:1"), Conns: []*net.UDPConn{dupConn(t, c)},
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: reg}}
	_, err = New(Config{Logger: quietLog, Services: []Service{svc}})
	require.ErrorIs(t, err, ErrConfig, "a socket bound elsewhere than Listen")

	svc.Listen, svc.Conns, svc.Transparent = netip.AddrPort{}, []*net.UDPConn{dupConn(t, c)}, true
	svc.UpstreamConns = []*net.UDPConn{dupConn(t, c)}
	_, err = New(Config{Logger: quietLog, Services: []Service{svc}})
	require.ErrorIs(t, err, ErrConfig, "upstream sockets in transparent mode")

	// Workers beyond the given sockets join their group.
	svc.Transparent, svc.UpstreamConns, svc.Workers = false, nil, 3
	g, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	g.Close()
	group := listenJoinable(t, g.LocalAddr().(*net.UDPAddr).AddrPort())
	svc.Conns = []*net.UDPConn{dupConn(t, group)}
	p, err := New(Config{Logger: quietLog, Services: []Service{svc}})
	require.NoError(t, err)
	listen, ups, _ := p.Sockets("a")
	assert.Len(t, listen, 3)
	assert.Len(t, ups, 3)
	require.NoError(t, p.Close())
}

// listenJoinable opens a socket with SO_REUSEPORT on a, as every
// Pipeline's service socket has.
func listenJoinable(t testing.TB, a netip.AddrPort) *net.UDPConn {
	t.Helper()
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "g", Listen: a, Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: newRegistry(t, 1)}}}})
	require.NoError(t, err)
	listen, _, _ := p.Sockets("g")
	c := dupConn(t, listen[0])
	t.Cleanup(func() { c.Close() })
	require.NoError(t, p.Close())
	return c
}
