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
)

// A device asleep on another port leaves its old address to the NAT,
// which gives it to a new device: the new device's ClientHello starts a
// session of its own, and the sleeping device, on waking, goes on by its
// CID. (It used to be handed to the sleeping device's session, and the
// handshake failed until that session ended.)
func TestHelloTakesAddressOfCIDSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, to := startCIDEcho(t, Config{})

	sleeper := newSwitchConn(t, to)
	a := dial(t, ctx, sleeper)
	assert.Equal(t, "0|before sleep", ask(t, a, "before sleep"))
	old := sleeper.local()
	sleeper.rebind(t, to) // falls asleep on a new port; the old one is free

	// A new device on the old address.
	u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(old))
	require.NoError(t, err)
	newcomer := &switchConn{conn: u, target: to, remote: net.UDPAddrFromAddrPort(to)}
	t.Cleanup(func() { newcomer.Close() })
	ccfg := pskConfig()
	ccfg.PSKIdentityHint = []byte("client")
	ccfg.ConnectionIDGenerator = pion.OnlySendCIDGenerator()
	b, err := pion.Client(newcomer, newcomer.remote, ccfg)
	require.NoError(t, err)
	defer b.Close()
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	require.NoError(t, b.HandshakeContext(hctx), "a new device's handshake from an address a sleeping device used")
	assert.Equal(t, "0|newcomer", ask(t, b, "newcomer"))

	assert.Equal(t, "0|after sleep", ask(t, a, "after sleep"), "the sleeper wakes on its new port, in its session")
	assert.Equal(t, "0|newcomer again", ask(t, b, "newcomer again"))
	st := e.ln.Stats()
	assert.Equal(t, uint64(2), st.NewSessions)
	assert.Equal(t, uint64(1), st.AddressTaken)
	assert.Equal(t, 2, st.Sessions)
}

// A ClientHello retransmitted before the client has used its CID still
// belongs to its session: the handshake is not cut in two.
func TestHelloBeforeCIDStaysInSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, to := startCIDEcho(t, Config{})

	// A client without CIDs never sends by one: its repeated hellos
	// (pion retransmits the first flight) and its data go to one session.
	sc := newSwitchConn(t, to)
	ccfg := pskConfig()
	ccfg.PSKIdentityHint = []byte("client")
	c, err := pion.Client(sc, sc.remote, ccfg)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.HandshakeContext(ctx))
	assert.Equal(t, "0|x", ask(t, c, "x"))
	st := e.ln.Stats()
	assert.Equal(t, uint64(1), st.NewSessions)
	assert.Zero(t, st.AddressTaken)
}

// startCIDEcho serves an echo behind a listener with cfg whose sessions
// issue ordinal-0 CIDs, and returns it with the address clients dial.
func startCIDEcho(t *testing.T, cfg Config) (*echoListener, netip.AddrPort) {
	t.Helper()
	bc := newBackendConn(t, nil)
	gen, err := Generator(0, 0)
	require.NoError(t, err)
	pc := pskConfig()
	pc.ConnectionIDGenerator = gen
	ln, err := ListenConfig(bc, cfg, pc)
	require.NoError(t, err)
	return serveEcho(t, ln, bc), bc.LocalAddr().(*net.UDPAddr).AddrPort()
}
