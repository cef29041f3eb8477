package piondtls

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// A forged tls12_cid record carrying a live session's CID, with the newest
// sequence number, sent through the other replica from another address:
// pion rejects it, so neither the session nor its route moves, and the
// real client keeps being answered.
func TestForgedCIDRecordMovesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := startServer(t, 4)
	bs := []registry.Backend{{Ordinal: 4, Addr: srv.addr(), Weight: 1, State: registry.Ready}}
	ra, rb := startProxy(t, bs), startProxy(t, bs)

	sc := newSwitchConn(t, ra)
	real := sc.local()
	c := dial(t, ctx, sc)
	require.Equal(t, "4|hi", ask(t, c, "hi"))

	srv.pl.mu.Lock()
	var cid []byte
	for k := range srv.pl.byCID {
		cid = []byte(k)
	}
	srv.pl.mu.Unlock()
	require.Len(t, cid, 8)
	before, ok := srv.bc.RouteCID(cid)
	require.True(t, ok)
	require.Equal(t, real, before.Client)

	base := srv.pl.Stats().Delivered
	forger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer forger.Close()
	forged := forger.LocalAddr().(*net.UDPAddr).AddrPort()
	rec := []byte{25, 0xfe, 0xfd, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf0}
	rec = append(rec, cid...)
	rec = append(rec, 0, 40)
	rec = append(rec, make([]byte, 40)...)
	for range 3 {
		_, err = forger.WriteToUDPAddrPort(rec, rb)
		require.NoError(t, err)
	}
	// The demultiplexer handed the forged records to the session (by CID);
	// delivery counts after routing, so whatever routing did is done.
	require.Eventually(t, func() bool { return srv.pl.Stats().Delivered >= base+3 }, 5*time.Second, 5*time.Millisecond)

	unmoved := func(when string) {
		t.Helper()
		after, ok := srv.bc.RouteCID(cid)
		require.True(t, ok, when)
		assert.Equal(t, before, after, "route unchanged %s", when)
		_, ok = srv.bc.Route(forged)
		assert.False(t, ok, "no route to the forger %s", when)
		srv.pl.mu.Lock()
		_, keyed := srv.pl.byClient[forged]
		s := srv.pl.byClient[real]
		srv.pl.mu.Unlock()
		assert.False(t, keyed, "session not re-keyed under the forger's address %s", when)
		assert.NotNil(t, s, "session still keyed under the real address %s", when)
	}
	// Checked before any real traffic could repair a moved route.
	unmoved("after the forged records")
	// The next real exchange still runs on the real path.
	assert.Equal(t, "4|again", ask(t, c, "again"))
	unmoved("after the next real exchange")
}

// Without a proxy: the adapter's default policy lets a direct pion client
// in ("sniff, don't require"); DirectNoHandshake keeps it out.
func TestDirectClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, policy := range []backend.DirectPolicy{backend.DirectAccept, backend.DirectNoHandshake} {
		udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		bc, err := backend.New(udp, backend.Config{Direct: policy, Protocol: backend.DTLS})
		require.NoError(t, err)
		gen, err := Generator(1, 0)
		require.NoError(t, err)
		cfg := pskConfig()
		cfg.ConnectionIDGenerator = gen
		ln, err := Listen(bc, cfg)
		require.NoError(t, err)
		// The server keeps its session until the client has its answer: a
		// close_notify right behind the reply can reach the client's Read
		// first, as EOF.
		answered := make(chan struct{})
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 100)
			n, err := c.Read(buf)
			if err == nil {
				c.Write(append([]byte("1|"), buf[:n]...))
				<-answered
			}
		}()
		sc := newSwitchConn(t, bc.LocalAddr().(*net.UDPAddr).AddrPort())
		ccfg := pskConfig()
		ccfg.PSKIdentityHint = []byte("client")
		ccfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
		cl, err := pion.Client(sc, sc.remote, ccfg)
		require.NoError(t, err)
		hctx, hcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err = cl.HandshakeContext(hctx)
		hcancel()
		if policy == backend.DirectAccept {
			require.NoError(t, err)
			assert.Equal(t, "1|direct", ask(t, cl, "direct"))
			assert.NotZero(t, bc.Stats().AcceptedDirect)
		} else {
			assert.Error(t, err, "handshake must not complete")
			assert.NotZero(t, bc.Stats().DroppedDirectHandshake)
		}
		close(answered)
		cl.Close()
		ln.Close()
		bc.Close()
	}
}

func TestDemuxDrops(t *testing.T) {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	require.NoError(t, err)
	pl, err := NewPacketListener(bc, Config{CIDLen: 8, Backlog: 1, Queue: 1})
	require.NoError(t, err)
	peer, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer peer.Close()
	to := bc.LocalAddr().(*net.UDPAddr).AddrPort()
	send := func(client string, b []byte) {
		h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy,
			Src: netip.MustParseAddrPort(client), Dst: publicAddr})
		require.NoError(t, err)
		_, err = peer.WriteToUDPAddrPort(append(h, b...), to)
		require.NoError(t, err)
	}
	hello := testtool.ReadHex(t, "../testdata/pion_clienthello_1.hex")
	send("192.0.2.1:1", []byte("garbage"))                                   // malformed
	send("192.0.2.1:1", testtool.ReadHex(t, "../testdata/pion_appdata.hex")) // no session
	send("192.0.2.1:1", hello)                                               // new session 1, queued
	send("192.0.2.1:1", hello)                                               // session 1's queue is full
	send("192.0.2.1:1", hello)                                               // still full
	send("192.0.2.2:2", hello)                                               // backlog full
	require.Eventually(t, func() bool { return bc.Stats().AcceptedProxied == 6 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		s := pl.Stats()
		return s.DroppedMalformed == 1 && s.DroppedNoSession == 1 && s.NewSessions == 1 &&
			s.DroppedQueue == 2 && s.DroppedBacklog == 1 && s.Sessions == 1
	}, 5*time.Second, time.Millisecond, "%+v", pl.Stats())

	pc, ra, err := pl.Accept()
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddrPort("192.0.2.1:1"), ra.(*backend.Addr).Client)
	assert.Equal(t, publicAddr, ra.(*backend.Addr).Service)
	buf := make([]byte, 2048)
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(time.Second)))
	n, _, err := pc.ReadFrom(buf)
	require.NoError(t, err)
	assert.Equal(t, hello, buf[:n])
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(time.Millisecond)))
	_, _, err = pc.ReadFrom(buf)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())

	require.NoError(t, pl.Close())
	_, _, err = pl.Accept()
	assert.ErrorIs(t, err, ErrClosed)
	// The socket stays open for the accepted session, and closes after it.
	_, err = pc.WriteTo([]byte("x"), ra)
	require.NoError(t, err)
	require.NoError(t, pc.Close())
	_, _, err = pc.ReadFrom(buf)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = pc.WriteTo([]byte("x"), ra)
	assert.ErrorIs(t, err, ErrClosed)
	_, _, err = bc.ReadFrom(buf)
	assert.ErrorIs(t, err, net.ErrClosed, "the last session closed the socket")
}

func TestConfigErrors(t *testing.T) {
	_, err := Listen(nil, nil)
	assert.ErrorIs(t, err, ErrConfig)
	_, err = NewPacketListener(nil, Config{CIDLen: -1})
	assert.ErrorIs(t, err, ErrConfig)
	_, err = Generator(255, 0)
	assert.Error(t, err)
}
