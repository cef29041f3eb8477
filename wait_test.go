package cidroute

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/registry"
)

// TestPipelineThread runs the pipeline's tests again with every worker
// in WaitThread mode: the same routing, counters and shutdown, whatever
// the wait.
func TestPipelineThread(t *testing.T) {
	testWait = WaitThread
	t.Cleanup(func() { testWait = WaitNetpoller })
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"ReplicasAgree", TestPipelineReplicasAgree},
		{"CIDSurvivesRebinding", TestPipelineCIDSurvivesRebinding},
		{"DrainAndRemove", TestPipelineDrainAndRemove},
		{"StaleRegistry", TestPipelineStaleRegistry},
		{"ReversePathChecks", TestPipelineReversePathChecks},
		{"Lifecycle", TestPipelineLifecycle},
		{"SiblingReflection", TestPipelineSiblingReflection},
		{"TransparentRouting", TestTransparentRouting},
		{"TransparentRepliesOnlyFromBackend", TestTransparentRepliesOnlyFromBackend},
	} {
		t.Run(tc.name, tc.f)
	}
}

// TestWaitThreadHoldsThreads: on Linux a PPv2 worker and a transparent
// one each hold one thread blocked in epoll_wait, and Run gives each a P.
func TestWaitThreadHoldsThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("WaitThread falls back to the netpoller off Linux")
	}
	testWait = WaitThread
	t.Cleanup(func() { testWait = WaitNetpoller })
	e := startEcho(t, 0)
	bs := []registry.Backend{{Ordinal: 0, Addr: e.Addr(), State: registry.Ready}}
	pp := startProxy(t, DTLS, bs, nil)
	tr := startProxy(t, DTLS, bs, func(s *Service) { s.Transparent = true })
	c := newClient(t) // pp runs, and routes
	require.Equal(t, 0, c.ask(pp.addr(), dtlsCIDRecord(ordinalCID(t, pp.router().Codec(), 0), 1, []byte("ping"))))
	for _, w := range pp.p.services[0].workers {
		require.NotNil(t, w.poll)
		assert.Equal(t, 1, w.heldThreads())
		assert.Len(t, w.loops(), 1, "one loop serves both sockets")
	}
	for _, w := range tr.p.services[0].workers {
		assert.Equal(t, 1, w.heldThreads())
		assert.Len(t, w.loops(), 2, "the thread and the session sweep")
	}
	<-pp.p.Serving()
	<-tr.p.Serving()
	require.Greater(t, runtime.GOMAXPROCS(0), len(pp.p.services[0].workers)+len(tr.p.services[0].workers),
		"a P for every held thread of the process, both pipelines'")

	// The netpoller mode holds none.
	testWait = WaitNetpoller
	np := startProxy(t, DTLS, bs, nil)
	require.Equal(t, 0, c.ask(np.addr(), dtlsCIDRecord(ordinalCID(t, np.router().Codec(), 0), 2, []byte("ping"))))
	for _, w := range np.p.services[0].workers {
		assert.Zero(t, w.heldThreads())
		assert.Len(t, w.loops(), 2)
	}
}

func TestWaitModeText(t *testing.T) {
	for _, m := range []WaitMode{WaitNetpoller, WaitThread} {
		b, err := m.MarshalText()
		require.NoError(t, err)
		var back WaitMode
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, m, back)
	}
	var m WaitMode
	require.ErrorIs(t, m.UnmarshalText([]byte("spin")), ErrConfig)
	_, err := WaitMode(7).MarshalText()
	require.ErrorIs(t, err, ErrConfig)
}

// TestPipelineThreadNoAllocs: a WaitThread pipeline forwards and relays
// without allocating (the process's mallocs over 2,048 round trips, the
// client's and the echo backend's loops allocating nothing themselves).
func TestPipelineThreadNoAllocs(t *testing.T) {
	tp := startThreadProxy(t)
	rec := dtlsCIDRecord(ordinalCID(t, tp.router().Codec(), 0), 1, make([]byte, 100))
	c := newClient(t)
	to := tp.addr()
	require.Equal(t, 0, c.ask(to, rec), "warm up")
	buf := make([]byte, 2048)
	const window, rounds = 32, 64
	run := func() {
		for range rounds {
			for range window {
				c.conn.WriteToUDPAddrPort(rec, to)
			}
			for range window {
				c.conn.ReadFromUDPAddrPort(buf)
			}
		}
	}
	require.NoError(t, c.conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	run() // warm: buffers, the registry snapshot, the runtime's own
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	run()
	runtime.ReadMemStats(&ms1)
	perDatagram := float64(ms1.Mallocs-ms0.Mallocs) / (2 * window * rounds)
	t.Logf("%.4f allocations per datagram", perDatagram)
	assert.Less(t, perDatagram, 0.05, "allocations per datagram through the pipeline")
}

// startThreadProxy starts a DTLS pipeline of one WaitThread worker in
// front of one echo backend, ordinal 0; it skips off Linux, where
// WaitThread falls back to the netpoller.
func startThreadProxy(t *testing.T) *testProxy {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("WaitThread falls back to the netpoller off Linux")
	}
	testWait = WaitThread
	t.Cleanup(func() { testWait = WaitNetpoller })
	e := startEcho(t, 0)
	return startProxy(t, DTLS, []registry.Backend{{Ordinal: 0, Addr: e.Addr(), State: registry.Ready}},
		func(s *Service) { s.Workers = 1 })
}

// TestDefaultWorkersFromStart: a service without Workers gets GOMAXPROCS
// as the process started, whatever WaitThread raised it to since.
func TestDefaultWorkersFromStart(t *testing.T) {
	prev := runtime.GOMAXPROCS(startProcs + 5) // as raiseProcs would
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	p, err := New(Config{Logger: quietLog, Services: []Service{{Name: "s", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: newRegistry(t, 1)}}}})
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.AddService(Service{Name: "added", Listen: netip.MustParseAddrPort("127.0.0.1:0"),
		RouterConfig: RouterConfig{Protocol: DTLS, Backends: newRegistry(t, 1)}}))
	for _, name := range []string{"s", "added"} {
		assert.Len(t, p.service(name).workers, startProcs, name)
	}
}

// TestMaxWorkers: the workers of all services together are capped, in New
// and when AddService adds a service (a reload), with a configuration
// error that names the cap.
func TestMaxWorkers(t *testing.T) {
	svc := func(name string, workers int) Service {
		return Service{Name: name, Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: workers,
			RouterConfig: RouterConfig{Protocol: DTLS, Backends: newRegistry(t, 1)}}
	}
	_, err := New(Config{Logger: quietLog, MaxWorkers: 3, Services: []Service{svc("a", 2), svc("b", 2)}})
	require.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, "4 workers in all services, more than the 3 allowed")
	p, err := New(Config{Logger: quietLog, MaxWorkers: 3, Services: []Service{svc("a", 2)}})
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, p.AddService(svc("b", 1)))
	err = p.AddService(svc("c", 1))
	require.ErrorIs(t, err, ErrConfig)
	assert.Len(t, p.Stats(), 2, "the refused service was not added")
	_, err = New(Config{Logger: quietLog, Services: []Service{svc("a", 256), svc("b", 256), svc("c", 256), svc("d", 256), svc("e", 1)}})
	assert.ErrorContains(t, err, "1025 workers in all services, more than the 1024 allowed", "DefaultMaxWorkers")
}
