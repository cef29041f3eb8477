package cidroute_test

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
)

// customLoop is what a Go server author writes to route on sockets of
// their own: plain net.UDPConns, one datagram at a time, and nothing of
// cidroute but a Router, its View and the two rules.
type customLoop struct {
	svc, up *net.UDPConn
	router  *cidroute.Router
	own     *cidroute.OwnAddrs

	mu           sync.Mutex
	fwdIn, revIn int
	fwdOK, revOK int
	fwdBy, revBy map[cidroute.Reason]int
	wg           sync.WaitGroup
}

func startCustomLoop(t *testing.T, reg *registry.Registry) *customLoop {
	listen := func(a string) *net.UDPConn {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(a)))
		require.NoError(t, err)
		return c
	}
	l := &customLoop{svc: listen("127.0.0.1:0"), up: listen("0.0.0.0:0"),
		fwdBy: map[cidroute.Reason]int{}, revBy: map[cidroute.Reason]int{}}
	public := l.svc.LocalAddr().(*net.UDPAddr).AddrPort()
	r, err := cidroute.NewRouter(cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: public, Backends: reg})
	require.NoError(t, err)
	l.router = r
	host, err := cidroute.LocalAddrs()
	require.NoError(t, err)
	l.own = cidroute.NewOwnAddrs([]netip.AddrPort{public, l.up.LocalAddr().(*net.UDPAddr).AddrPort()}, host)
	l.wg.Add(2)
	go l.forward()
	go l.reverse()
	t.Cleanup(func() { l.svc.Close(); l.up.Close(); l.wg.Wait() })
	return l
}

func (l *customLoop) forward() {
	defer l.wg.Done()
	buf := make([]byte, cidroute.HeaderRoom+2048)
	for {
		n, client, err := l.svc.ReadFromUDPAddrPort(buf[cidroute.HeaderRoom:])
		if err != nil {
			return
		}
		v := l.router.View(l.own)
		d, out := l.router.ForwardAt(buf[:cidroute.HeaderRoom+n], cidroute.HeaderRoom, client, netip.Addr{}, &v)
		if d.Reason == cidroute.Forwarded {
			_, err = l.up.WriteToUDPAddrPort(out, d.Backend)
		}
		l.count(&l.fwdIn, &l.fwdOK, l.fwdBy, d.Reason, err)
	}
}

func (l *customLoop) reverse() {
	defer l.wg.Done()
	buf := make([]byte, 2048)
	for {
		n, from, err := l.up.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		v := l.router.View(l.own)
		rep := l.router.Reverse(buf[:n], from, cidroute.Session{}, &v)
		if rep.Reason == cidroute.Forwarded {
			_, err = l.svc.WriteToUDPAddrPort(rep.Payload, rep.Client)
		}
		l.count(&l.revIn, &l.revOK, l.revBy, rep.Reason, err)
	}
}

func (l *customLoop) count(in, ok *int, by map[cidroute.Reason]int, r cidroute.Reason, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*in++
	switch {
	case r != cidroute.Forwarded:
		by[r]++
	case err != nil:
		by[cidroute.SendError]++
	default:
		*ok++
	}
}

// reverseDrops returns the loop's reverse counters as a Pipeline's.
func (l *customLoop) reverseDrops() cidroute.Counters {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := cidroute.Counters{Received: uint64(l.revIn), Forwarded: uint64(l.revOK)}
	for r, n := range l.revBy {
		c.Dropped[r] = uint64(n)
	}
	return c
}

// TestCustomLoopMatchesPipeline: the reverse-path cases of the Pipeline's
// tests (a stranger with a perfect header, a backend without one or naming
// another source, destinations no reply may reach, the process's own
// sockets) sent to a Pipeline and to a hand-written loop over plain
// sockets that uses only the exported rules: same reasons, same counts,
// and the good replies reach the client from the service address.
func TestCustomLoopMatchesPipeline(t *testing.T) {
	be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer be.Close()
	backend := be.LocalAddr().(*net.UDPAddr).AddrPort()
	bs := []registry.Backend{{Ordinal: 0, Addr: backend, State: registry.Ready}}
	reg, err := registry.New(registry.Config{Seed: 1})
	require.NoError(t, err)
	defer reg.Close()
	require.NoError(t, reg.Update(bs))
	rogue, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer rogue.Close()
	victim, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer victim.Close()
	victimAddr := victim.LocalAddr().(*net.UDPAddr).AddrPort()

	loop := startCustomLoop(t, reg)
	px := cidroutetest.Start(t, 1, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS}}, bs...)
	p, svc := px.Pipeline, px.Addr
	ups, _ := p.UpstreamAddrs("svc")
	lo := netip.MustParseAddr("127.0.0.1")

	// send plays the cases against one proxy: its public address, its
	// upstream socket and its own addresses.
	send := func(public, up netip.AddrPort) {
		reply := func(src, dst netip.AddrPort, payload string) []byte {
			b, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: src, Dst: dst})
			require.NoError(t, err)
			return append(b, payload...)
		}
		rogue.WriteToUDPAddrPort(reply(public, victimAddr, "spoof"), up)                          // untrusted sender
		be.WriteToUDPAddrPort([]byte("no header at all"), up)                                     // bad proxy header
		be.WriteToUDPAddrPort(reply(netip.MustParseAddrPort("127.0.0.1:9"), victimAddr, "x"), up) // another source
		for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("224.0.0.1:5000"), netip.MustParseAddrPort("255.255.255.255:5000"),
			netip.MustParseAddrPort("0.0.0.0:5000"), netip.MustParseAddrPort("127.0.0.1:0"), netip.MustParseAddrPort("[2001:db8::1]:5000"),
			public, up} { // bad destinations, and the proxy's own sockets
			be.WriteToUDPAddrPort(reply(public, dst, "x"), up)
		}
		be.WriteToUDPAddrPort(reply(public, victimAddr, ""), up)     // nothing to relay
		be.WriteToUDPAddrPort(reply(public, victimAddr, "good"), up) // and a good one
	}
	send(loop.router.PublicAddr(), netip.AddrPortFrom(lo, loop.up.LocalAddr().(*net.UDPAddr).AddrPort().Port()))
	send(svc, netip.AddrPortFrom(lo, ups[0].Port()))

	want := cidroute.Counters{Received: 12, Forwarded: 1}
	want.Dropped[cidroute.UntrustedSender] = 1
	want.Dropped[cidroute.BadProxyHeader] = 2
	want.Dropped[cidroute.BadDestination] = 7
	want.Dropped[cidroute.Malformed] = 1
	// The outcomes, not how the datagrams were batched.
	outcomes := func() cidroute.Counters {
		c := p.Stats()[0].Reverse
		c.BatchSizes, c.KernelDrops, c.Queued, c.QueueLimit = [cidroute.NumBatchBuckets]uint64{}, 0, 0, 0
		return c
	}
	require.Eventually(t, func() bool { return loop.reverseDrops() == want && outcomes() == want },
		5*time.Second, 10*time.Millisecond, "want %+v", want)
	require.Equal(t, want, outcomes())
	victim.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	from := map[netip.AddrPort]string{}
	for range 2 {
		n, a, err := victim.ReadFromUDPAddrPort(buf)
		require.NoError(t, err)
		from[a] = string(buf[:n])
	}
	assert.Equal(t, map[netip.AddrPort]string{loop.router.PublicAddr(): "good", svc: "good"}, from)

	// And the forward direction: a ClientHello through the loop reaches
	// the backend behind a PPv2 header naming the client.
	hello, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10,
		Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, []byte("hi"))})
	require.NoError(t, err)
	_, err = victim.WriteToUDPAddrPort(hello, loop.router.PublicAddr())
	require.NoError(t, err)
	be.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := be.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	h, off, err := ppv2.Parse(buf[:n])
	require.NoError(t, err)
	assert.Equal(t, victimAddr, h.Src)
	assert.Equal(t, loop.router.PublicAddr(), h.Dst)
	assert.Equal(t, hello, buf[off:n])
}
