package piondtls

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/registry"
)

// TestCookieRoundElsewhere: a handshake whose cookie exchange straddles a
// change of the backends. The client's first ClientHello reaches backend
// A, and A's HelloVerifyRequest is on its way back when A starts draining;
// the ClientHello with the cookie then goes where the proxy's rule for
// records without a CID sends it, HRW over the ready backends, to B. B has
// no state for that handshake and pion cannot take it over (it waits for
// message 0), so this attempt fails: no stateless proxy can tell which
// backend sent a random cookie. What the adapter owes the client is that
// B drops those hellos without making a session of them, so that the
// client's next handshake, from the same socket, works at once.
func TestCookieRoundElsewhere(t *testing.T) {
	srvs := []*server{startServer(t, 0), startServer(t, 1)}
	states := func(draining uint8) []registry.Backend {
		var bs []registry.Backend
		for _, s := range srvs {
			st := registry.Ready
			if s.ord == draining {
				st = registry.Draining
			}
			bs = append(bs, registry.Backend{Ordinal: s.ord, Addr: s.addr(), Weight: 1, State: st})
		}
		return bs
	}
	p := cidroutetest.Start(t, 42, cidroute.Service{RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, PublicAddr: publicAddr}}, states(255)...)

	seen := map[uint8]bool{}
	for i := 0; len(seen) < 2; i++ {
		require.Less(t, i, 64, "no client address picked both backends")
		require.NoError(t, p.Registry.Update(states(255)))
		sc := newSwitchConn(t, p.Addr)
		first, _ := p.Registry.Snapshot().PickNewAddrs(sc.local(), publicAddr)
		if seen[first.Ordinal] {
			continue
		}
		seen[first.Ordinal] = true
		a, b := srvs[first.Ordinal], srvs[1-first.Ordinal]
		aBefore, bBefore := a.pl.Stats(), b.pl.Stats()

		hooked := &onHelloVerify{switchConn: sc, fn: func() { require.NoError(t, p.Registry.Update(states(first.Ordinal))) }}
		c, err := handshake(hooked, 1500*time.Millisecond)
		if c != nil {
			c.Close()
		}
		require.Error(t, err, "client %d: the cookie round went to %d, which never sent the cookie", i, b.ord)
		require.True(t, hooked.fired(), "the registry changed at the HelloVerifyRequest")

		aNow, bNow := a.pl.Stats(), b.pl.Stats()
		assert.Equal(t, aBefore.NewSessions+1, aNow.NewSessions, "the handshake began at %d", a.ord)
		assert.Equal(t, bBefore.NewSessions, bNow.NewSessions, "%d made no session of the foreign hellos", b.ord)
		assert.Greater(t, bNow.DroppedForeignHello, bBefore.DroppedForeignHello, "%d counted the foreign hellos", b.ord)

		// The client's next handshake, from the same socket, goes to B
		// and works at the first try.
		start := time.Now()
		c, err = handshake(&onHelloVerify{switchConn: sc}, 5*time.Second)
		require.NoError(t, err, "client %d: the handshake after the failed one", i)
		assert.Less(t, time.Since(start), time.Second, "no retransmission was needed")
		assert.Equal(t, fmt.Sprintf("%d|again", b.ord), ask(t, c, "again"))
		c.Close()
	}
	for _, st := range p.Stats() {
		assert.Equal(t, st.Forward.Received, st.Forward.Forwarded, "the proxy routed every datagram")
	}
}

// onHelloVerify is a client socket that calls fn when the first
// HelloVerifyRequest arrives, before pion reads it. Close leaves the
// socket open for the next client.
type onHelloVerify struct {
	*switchConn
	fn   func()
	done atomic.Bool
}

func (h *onHelloVerify) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := h.switchConn.ReadFrom(b)
	if err == nil && h.fn != nil && isHelloVerify(b[:n]) && h.done.CompareAndSwap(false, true) {
		h.fn()
	}
	return n, a, err
}

func (h *onHelloVerify) fired() bool { return h.done.Load() }

// isHelloVerify reports whether datagram b starts with a handshake record
// holding a HelloVerifyRequest.
func isHelloVerify(b []byte) bool {
	r, _, err := dtls.ParseRecord(b, 8)
	return err == nil && r.Type == dtls.Handshake && r.Fragment[0] == byte(dtls.HandshakeHelloVerifyRequest)
}

func (h *onHelloVerify) Close() error { return nil }

func clientPSK() *pion.Config {
	cfg := pskConfig()
	cfg.PSKIdentityHint = []byte("client")
	cfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
	return cfg
}

// handshake runs one client handshake on h within budget; the caller
// closes the conn.
func handshake(h *onHelloVerify, budget time.Duration) (*pion.Conn, error) {
	c, err := pion.Client(h, h.remote, clientPSK())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	return c, c.HandshakeContext(ctx)
}
