package e2e

// pion/dtls v2 has no RFC 9146 support: its sessions carry no connection
// ID, so the proxies route every one of its records by HRW over the
// client address (and the public address), like a ClientHello. That works
// through any replica, since they all compute the same choice, but only as
// long as the client keeps its address: after a NAT rebinding its records
// hash to a new address, reach a backend (maybe the same one) that has no
// session for it, and are dropped there. Surviving rebinding needs CIDs,
// that is pion/dtls v3 (TestPionSessionsSurviveRebinding).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	dtlsv2 "github.com/pion/dtls/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/ppv2/backend"
	"github.com/cidroute/cidroute/registry"
)

// sessionConn is the net.Conn pion v2's dtls.Server takes: one session's
// PacketConn from the demultiplexer, fixed to its client.
type sessionConn struct {
	net.PacketConn
	peer net.Addr
}

func (c sessionConn) Read(b []byte) (int, error) {
	n, _, err := c.ReadFrom(b)
	return n, err
}

func (c sessionConn) Write(b []byte) (int, error) { return c.WriteTo(b, c.peer) }
func (c sessionConn) RemoteAddr() net.Addr        { return c.peer }

// v2Backend is a pion/dtls v2 echo server behind the PPv2 adapter. The
// demultiplexer runs without CIDs (piondtls.Config.CIDLen 0): sessions are
// told apart by client address only.
type v2Backend struct {
	ord uint8
	bc  *backend.Conn
	pl  *piondtls.PacketListener
}

func startV2Backend(t *testing.T, ord uint8) *v2Backend {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	bc, err := backend.New(udp, backend.Config{TrustedProxies: loopback, Direct: backend.DirectNoHandshake, Protocol: backend.DTLS})
	require.NoError(t, err)
	pl, err := piondtls.NewPacketListener(bc, piondtls.Config{})
	require.NoError(t, err)
	b := &v2Backend{ord: ord, bc: bc, pl: pl}
	cfg := &dtlsv2.Config{
		PSK:             func([]byte) ([]byte, error) { return testPSK, nil },
		PSKIdentityHint: []byte("cidroute"),
		CipherSuites:    []dtlsv2.CipherSuiteID{dtlsv2.TLS_PSK_WITH_AES_128_CCM_8},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			pc, addr, err := pl.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer pc.Close()
				hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
				c, err := dtlsv2.ServerWithContext(hctx, sessionConn{pc, addr}, cfg)
				hcancel()
				if err != nil {
					return
				}
				defer c.Close()
				context.AfterFunc(ctx, func() { c.Close() })
				buf := make([]byte, 2048)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := fmt.Fprintf(c, "%d|%s", ord, buf[:n]); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		pl.Close()
		wg.Wait()
		bc.Close()
	})
	return b
}

func (b *v2Backend) addr() netip.AddrPort { return b.bc.LocalAddr().(*net.UDPAddr).AddrPort() }

func dialV2(t *testing.T, via netip.AddrPort) (*cidroutetest.RebindConn, *dtlsv2.Conn) {
	t.Helper()
	sock, err := cidroutetest.ListenRebind(via, net.UDPAddrFromAddrPort(public))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := dtlsv2.ClientWithContext(ctx, sock.NetConn(), &dtlsv2.Config{
		PSK:             func([]byte) ([]byte, error) { return testPSK, nil },
		PSKIdentityHint: []byte("v2-client"),
		CipherSuites:    []dtlsv2.CipherSuiteID{dtlsv2.TLS_PSK_WITH_AES_128_CCM_8},
	})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return sock, c
}

// TestPionV2ByClientAddress: pion/dtls v2 servers behind the adapter and
// the proxies, routed by HRW on the client address; a v2 client that
// rebinds loses its session.
func TestPionV2ByClientAddress(t *testing.T) {
	var bs []registry.Backend
	var srvs []*v2Backend
	for ord := range uint8(3) {
		b := startV2Backend(t, ord)
		srvs = append(srvs, b)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: b.addr()})
	}
	rs := startReplicas(t, 2, cidroute.DTLS, bs)

	const clients = 9
	socks := make([]*cidroutetest.RebindConn, clients)
	conns := make([]*dtlsv2.Conn, clients)
	owner := make([]int, clients)
	perBackend := map[int]int{}
	for i := range clients {
		socks[i], conns[i] = dialV2(t, rs[i%2].addr)
		want, ok := rs[0].reg.Snapshot().PickNewAddrs(socks[i].Local(), public)
		require.True(t, ok)
		// The client's records go through both replicas in turn (a load
		// balancer rehashing): all of them reach the HRW choice.
		for k := range 4 {
			socks[i].Retarget(rs[(i+k)%2].addr)
			msg := fmt.Sprint("v2 client ", i, " message ", k)
			reply, err := ask(conns[i], msg, 3, replyWait)
			require.NoError(t, err, "client %d", i)
			owner[i] = answeredBy(t, reply, msg)
			require.Equal(t, int(want.Ordinal), owner[i], "client %d: HRW over its address", i)
		}
		perBackend[owner[i]]++
	}
	t.Logf("v2 sessions per backend: %v", perBackend)
	var sessions uint64
	for _, b := range srvs {
		st := b.pl.Stats()
		sessions += st.NewSessions
		assert.Zero(t, st.DroppedNoSession, "backend %d", b.ord)
	}
	assert.Equal(t, uint64(clients), sessions)

	// NAT rebinding: a new source port. The proxies hash the new address;
	// whichever backend that picks has no session for it and drops the
	// record. The v2 session is lost.
	noSession := func() (n uint64) {
		for _, b := range srvs {
			n += b.pl.Stats().DroppedNoSession
		}
		return n
	}
	before := noSession()
	err := within(clients, clients, func(i int) error {
		if err := socks[i].Rebind(rs[i%2].addr); err != nil {
			return err
		}
		if _, err := ask(conns[i], "after rebinding", 1, 300*time.Millisecond); !errors.Is(err, errNoReply) {
			return fmt.Errorf("client %d: want no reply after rebinding, got %v", i, err)
		}
		return nil
	})
	require.NoError(t, err, "a v2 session does not survive rebinding")
	assert.Equal(t, uint64(clients), noSession()-before, "each record reached a backend without a session for the new address")
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "the proxies forwarded everything: the loss is on the backends: %v", dropList(&f))
}
