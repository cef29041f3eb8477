package cidroute

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/registry"
)

// TestPipelineSetLimits swaps a running service's limits: a handshake
// limit refuses a ClientHello burst, lifting it lets the next one through.
func TestPipelineSetLimits(t *testing.T) {
	e := startEcho(t, 0)
	tp := startProxy(t, DTLS, []registry.Backend{{Ordinal: 0, Addr: e.Addr()}}, func(s *Service) { s.Workers = 1 })
	c := newClient(t)
	// burst sends 40 ClientHellos at once and counts the echoes.
	burst := func() (answered int) {
		for i := range 40 {
			_, err := c.conn.WriteToUDPAddrPort(dtlsClientHello(byte(i)), tp.addr())
			require.NoError(t, err)
		}
		buf := make([]byte, 2048)
		c.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			if _, _, err := c.conn.ReadFromUDPAddrPort(buf); err != nil {
				return answered
			}
			answered++
		}
	}
	require.Equal(t, 40, burst(), "no limits")
	require.NoError(t, tp.p.SetLimits("svc", Limits{HandshakePPS: 5}))
	n := burst()
	assert.Less(t, n, 40, "a limit of 5/s refuses most of a burst of 40")
	assert.NotZero(t, tp.quiet(t).Forward.Dropped[RateLimited])
	require.NoError(t, tp.p.SetLimits("svc", Limits{}))
	require.Equal(t, 40, burst(), "limits lifted")
	require.ErrorIs(t, tp.p.SetLimits("nope", Limits{}), ErrConfig)
	require.ErrorIs(t, tp.p.SetLimits("svc", Limits{GlobalPPS: -1}), ErrConfig)
}

// TestPipelineAddService adds a service to a running pipeline: it serves
// at once, the first one's sockets are untouched.
func TestPipelineAddService(t *testing.T) {
	e0, e1 := startEcho(t, 0), startEcho(t, 1)
	tp := startProxy(t, DTLS, []registry.Backend{{Ordinal: 0, Addr: e0.Addr()}}, nil)
	before, _, _ := tp.p.Sockets("svc")
	c := newClient(t)
	cid := ordinalCID(t, dtls.OrdinalFirst{Length: DefaultDTLSCIDLen}, 0)
	require.Equal(t, 0, c.ask(tp.addr(), dtlsCIDRecord(cid, 1, []byte("x"))))

	reg := newRegistry(t, 42, registry.Backend{Ordinal: 1, Addr: e1.Addr()})
	add := Service{Name: "two", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: publicAddr, Backends: reg}}
	require.NoError(t, tp.p.AddService(add))
	a, ok := tp.p.Addr("two")
	require.True(t, ok)
	cid1 := ordinalCID(t, dtls.OrdinalFirst{Length: DefaultDTLSCIDLen}, 1)
	require.Equal(t, 1, c.ask(a, dtlsCIDRecord(cid1, 1, []byte("y"))))
	require.Equal(t, 0, c.ask(tp.addr(), dtlsCIDRecord(cid, 2, []byte("x"))))
	after, _, _ := tp.p.Sockets("svc")
	require.Equal(t, before, after)
	require.Len(t, tp.p.Stats(), 2)
	assert.True(t, tp.p.OwnAddrs().Contains(a), "the new service's address is the proxy's own")

	require.ErrorIs(t, tp.p.AddService(add), ErrConfig, "a repeated name")
	own := add
	own.Name = "three"
	own.Backends = newRegistry(t, 42, registry.Backend{Ordinal: 0, Addr: tp.addr()})
	require.ErrorIs(t, tp.p.AddService(own), ErrConfig, "a backend at the proxy's own address")
	require.Len(t, tp.p.Stats(), 2)
	require.NoError(t, tp.p.Close())
	add.Name = "four"
	require.ErrorIs(t, tp.p.AddService(add), ErrClosed)
}
