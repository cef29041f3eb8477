package cidroute

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// needFilters skips where socket filters cannot be attached (off Linux,
// or an emulator that does not pass SO_ATTACH_FILTER through).
func needFilters(t *testing.T) {
	t.Helper()
	needKernelDrops(t)
	if err := udpio.AttachFilter(listenLoopback(t), &udpio.Filter{CIDLen: 8}); err != nil {
		t.Skipf("socket filters cannot be attached here: %v", err)
	}
}

// TestEarlyDropFollowsRegistry: with EarlyDrop, what can never route is
// dropped before the pipeline reads it (a kernel drop, not a received
// datagram), and the filter follows the registry: a backend added routes
// its CIDs, one removed has them dropped, on every worker.
func TestEarlyDropFollowsRegistry(t *testing.T) {
	needFilters(t)
	for _, wait := range []WaitMode{WaitNetpoller, WaitThread} {
		t.Run(wait.String(), func(t *testing.T) {
			testWait = wait
			t.Cleanup(func() { testWait = WaitNetpoller })
			var es []*testecho.Echo
			var bs []registry.Backend
			for i := range 3 {
				e := startEcho(t, uint8(i))
				es = append(es, e)
				bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: e.Addr(), Weight: 1, State: registry.Ready})
			}
			tp := startProxy(t, DTLS, bs[:2], func(s *Service) { s.EarlyDrop = true })
			codec := tp.router().Codec()
			c := newClient(t)
			rec := func(ord uint8) []byte { return dtlsCIDRecord(ordinalCID(t, codec, ord), 1, []byte("x")) }
			send := func(b []byte) {
				_, err := c.conn.WriteToUDPAddrPort(b, tp.addr())
				require.NoError(t, err)
			}

			require.Equal(t, 0, c.ask(tp.addr(), rec(0)))
			require.NotEqual(t, -1, c.ask(tp.addr(), dtlsClientHello(1)), "a new session routes")
			before := tp.quiet(t)                         // the ClientHello's count may follow its echo
			send(rec(2))                                  // no backend 2 yet
			send(make([]byte, 40))                        // no DTLS record
			send(append([]byte{25, 3, 3}, rec(0)[3:]...)) // not a DTLS version
			s := tp.settled(t, func(s ServiceStats) bool { return s.Forward.KernelDrops >= before.Forward.KernelDrops+3 })
			assert.Equal(t, before.Forward.Received, s.Forward.Received, "the pipeline read none of them")
			assert.Equal(t, before.Forward.KernelDrops+3, s.Forward.KernelDrops)

			// Backend 2 arrives; a new 4-tuple may land on the other
			// worker, which reads nothing before its filter follows.
			tp.reg.Update(bs)
			c2 := newClient(t)
			deadline := time.Now().Add(2 * time.Second)
			got := -1
			for got != 2 && time.Now().Before(deadline) {
				got = c2.ask(tp.addr(), rec(2))
			}
			assert.Equal(t, 2, got, "an added backend's CIDs route")
			// Backend 1 goes: its CIDs can no longer route.
			tp.reg.Update([]registry.Backend{bs[0], bs[2]})
			time.Sleep(3 * earlyDropEvery)
			before = tp.quiet(t)
			send(rec(1))
			s = tp.settled(t, func(s ServiceStats) bool { return s.Forward.KernelDrops > before.Forward.KernelDrops })
			assert.Equal(t, before.Forward.Received, s.Forward.Received)
			assert.Equal(t, 0, c.ask(tp.addr(), rec(0)), "the others still route")
		})
	}
}

// TestEarlyDropRefused: the filter mirrors the DTLS classifier and the
// ordinal-first codec only.
func TestEarlyDropRefused(t *testing.T) {
	reg := newRegistry(t, 1)
	for _, rc := range []RouterConfig{
		{Protocol: QUIC, Backends: reg},
		{Protocol: DTLS, Codec: quic.LB{Length: 12}, Backends: reg},
		{Protocol: DTLS, Backends: reg, Classifier: ClassifierFunc(func(b []byte) (Class, error) {
			return DTLSClassifier{CIDLen: 8}.Classify(b)
		})},
	} {
		_, err := New(Config{Logger: quietLog, Services: []Service{{Name: "s", Listen: publicAddr, Workers: 1, EarlyDrop: true, RouterConfig: rc}}})
		if runtime.GOOS == "linux" {
			assert.ErrorIs(t, err, ErrConfig, "%+v", rc)
		} else {
			assert.Error(t, err)
		}
	}
}
