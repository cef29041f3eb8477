package health

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/cidroute/cidroute/registry"
)

func newRegistry(t *testing.T, bs []registry.Backend) *registry.Registry {
	r, err := registry.New(registry.Config{Service: "svc", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	require.NoError(t, r.Update(bs))
	return r
}

// script answers each backend's probes as its entry says: true = answer.
type script struct {
	mu     sync.Mutex
	ok     map[netip.AddrPort]bool
	probes map[netip.AddrPort]int
}

func (s *script) set(a netip.AddrPort, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ok[a] = ok
}

func (s *script) probe(_ context.Context, a netip.AddrPort, _ ProbeConfig) (time.Duration, Match, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probes[a]++
	if s.ok[a] {
		return time.Millisecond, Tied, nil
	}
	return 0, Untied, ErrTimeout
}

func lines(logs *testtool.SyncBuffer, what string) int { return strings.Count(logs.String(), what) }

// The state machine, round by round: down after exactly Fall failures in
// a row, up after exactly Rise successes in a row, a success or a failure
// in between resets the count; a backend never seen answering goes down at
// its first failure; only changes are logged; the registry routes by the
// verdict, and draining or gone backends are not probed.
func TestCheckerFallRise(t *testing.T) {
	a0, a1, a2 := netip.MustParseAddrPort("10.0.0.1:5684"), netip.MustParseAddrPort("10.0.0.2:5684"), netip.MustParseAddrPort("10.0.0.3:5684")
	reg := newRegistry(t, []registry.Backend{{Ordinal: 0, Addr: a0}, {Ordinal: 1, Addr: a1}, {Ordinal: 2, Addr: a2, State: registry.Draining}})
	var logs testtool.SyncBuffer
	c, err := New(reg, Config{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Fall: 3, Rise: 2,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	s := &script{ok: map[netip.AddrPort]bool{a0: true, a1: true}, probes: map[netip.AddrPort]int{}}
	c.probe = s.probe
	c.begin() // as Run does
	ctx := context.Background()
	down := func(o uint8) bool { return reg.Snapshot().Down(o) }

	c.round(ctx) // both confirmed
	s.set(a0, false)
	c.round(ctx)
	c.round(ctx)
	assert.False(t, down(0), "2 failures of 3")
	s.set(a0, true)
	c.round(ctx) // resets the count
	s.set(a0, false)
	c.round(ctx)
	c.round(ctx)
	assert.False(t, down(0), "2 failures again")
	assert.Zero(t, lines(&logs, "level="), "no line per probe: %s", logs.String())
	c.round(ctx)
	require.True(t, down(0), "down at the 3rd failure in a row")
	assert.Equal(t, 1, lines(&logs, "backend down"))
	assert.Contains(t, logs.String(), "failures=3")
	_, ok := reg.Snapshot().Serving(0)
	assert.True(t, ok, "its CID route stays")
	assert.Equal(t, 1, reg.Stats().Ready)

	c.round(ctx)
	assert.Equal(t, 1, lines(&logs, "backend down"), "staying down is no news")
	s.set(a0, true)
	c.round(ctx)
	assert.True(t, down(0), "1 success of 2")
	s.set(a0, false)
	c.round(ctx) // resets
	s.set(a0, true)
	c.round(ctx)
	assert.True(t, down(0))
	c.round(ctx)
	assert.False(t, down(0), "up at the 2nd success in a row")
	assert.Equal(t, 1, lines(&logs, "backend up"))

	st := c.Stats()
	require.Len(t, st.Backends, 2, "the draining backend is not probed")
	assert.Equal(t, uint8(0), st.Backends[0].Ordinal)
	assert.True(t, st.Backends[0].Up)
	assert.Equal(t, uint64(7), st.Backends[0].Results[Timeout])
	assert.Equal(t, uint64(5), st.Backends[0].Results[OK])
	assert.Zero(t, s.probes[a2])
	assert.Equal(t, uint64(5+12), st.RTT.Count)
	assert.Equal(t, st.RTT.Count, st.RTT.Buckets[1], "1 ms answers in the 1 ms bucket")
	assert.Zero(t, st.RTT.Buckets[0])

	// A backend the checker has not seen answer goes down at its first
	// failure: a new ordinal in the list, dead from the start.
	a3 := netip.MustParseAddrPort("10.0.0.4:5684")
	require.NoError(t, reg.Update([]registry.Backend{{Ordinal: 0, Addr: a0}, {Ordinal: 1, Addr: a1}, {Ordinal: 3, Addr: a3}}))
	c.round(ctx)
	assert.True(t, down(3), "first probe failed")
	assert.Contains(t, logs.String(), "first_probe=true")

	// A moved backend is a new one: its old verdict does not follow it.
	s.set(a1, false)
	for range 3 {
		c.round(ctx)
	}
	require.True(t, down(1))
	moved := netip.MustParseAddrPort("10.0.1.2:5684")
	s.set(moved, true)
	require.NoError(t, reg.Update([]registry.Backend{{Ordinal: 0, Addr: a0}, {Ordinal: 1, Addr: moved}, {Ordinal: 3, Addr: a3}}))
	assert.False(t, down(1), "the registry forgets the mark")
	c.round(ctx)
	assert.False(t, down(1))
	for _, b := range c.Stats().Backends {
		assert.NotEqual(t, a1, b.Addr, "the checker forgets the old address")
	}
}

func TestConfigDefaults(t *testing.T) {
	c, err := Config{ProbeConfig: ProbeConfig{Protocol: cidroute.QUIC}}.WithDefaults()
	require.NoError(t, err)
	assert.Equal(t, [5]any{DefaultInterval, DefaultTimeout, DefaultInterval / 5, 3, 2}, [5]any{c.Interval, c.Timeout, c.Jitter, c.Fall, c.Rise})
	for _, bad := range []Config{
		{},
		{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: time.Millisecond},
		{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: time.Second, Timeout: 2 * time.Second},
		{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: time.Second, Jitter: time.Second},
		{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Fall: -1},
		{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Rise: 101},
	} {
		_, err := New(nil, bad)
		assert.ErrorIs(t, err, ErrConfig, "%+v", bad)
	}
}

// Run with real probes on real sockets: a peer that stops answering goes
// down at its Fall-th failed probe in a row, and up again at its Rise-th
// answered one, as the change lines say; the rounds are paced, never more
// than one per Interval − Jitter. Not timed: a loaded machine answers late
// and fails probes of its own accord (examples/e2e measures the time
// against Fall × Interval + Timeout, with slack).
func TestCheckerRun(t *testing.T) {
	var answering atomic.Bool
	answering.Store(true)
	peer := responder(t, func(in []byte) []byte {
		if answering.Load() && stripLocal(in) != nil {
			return hvr()
		}
		return nil
	})
	reg := newRegistry(t, []registry.Backend{{Ordinal: 0, Addr: peer}})
	const interval, timeout, jitter = 100 * time.Millisecond, 90 * time.Millisecond, 10 * time.Millisecond
	var logs testtool.SyncBuffer
	c, err := New(reg, Config{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: interval, Timeout: timeout, Jitter: jitter,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool {
		st := c.Stats()
		return len(st.Backends) == 1 && st.Backends[0].Results[OK] >= 2
	}, 10*time.Second, 5*time.Millisecond)

	wait := func(down bool) {
		require.Eventually(t, func() bool { return reg.Snapshot().Down(0) == down }, 10*time.Second, time.Millisecond, "down=%v", down)
	}
	answering.Store(false)
	wait(true)
	answering.Store(true)
	wait(false)
	answering.Store(false)
	wait(true)
	cancel()
	require.NoError(t, <-done)
	assert.False(t, reg.Snapshot().Down(0), "a stopped checker leaves no mark")
	assert.Contains(t, logs.String(), "failures=3 first_probe=false result=timeout")
	assert.Contains(t, logs.String(), "successes=2")
	elapsed := time.Since(start)
	assert.LessOrEqual(t, c.rounds.Load(), uint64(elapsed/(interval-jitter))+1, "paced: %d rounds in %v", c.rounds.Load(), elapsed)
}

// Issue 35: the marks are the running checker's. Stopping it lifts every
// mark it set, a draining backend's too; a checker that replaces it
// starts from what Inherit hands it and lifts it by its own probes; two
// checkers never share marks (the one that starts last owns them).
func TestCheckerOwnsItsMarks(t *testing.T) {
	a0, a1 := netip.MustParseAddrPort("10.0.0.1:5684"), netip.MustParseAddrPort("10.0.0.2:5684")
	bs := []registry.Backend{{Ordinal: 0, Addr: a0}, {Ordinal: 1, Addr: a1}}
	reg := newRegistry(t, bs)
	s := &script{ok: map[netip.AddrPort]bool{}, probes: map[netip.AddrPort]int{}}
	newChecker := func() *Checker {
		c, err := New(reg, Config{ProbeConfig: ProbeConfig{Protocol: cidroute.DTLS}, Interval: 20 * time.Millisecond,
			Timeout: 10 * time.Millisecond, Fall: 1, Rise: 1, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		c.probe = s.probe
		return c
	}
	run := func(c *Checker) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()
		return func() { cancel(); require.NoError(t, <-done) }
	}
	a := newChecker()
	stopA := run(a)
	require.Eventually(t, func() bool { return reg.Stats().Down == 2 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, bs, a.Down())
	drained := slices.Clone(bs)
	drained[1].State = registry.Draining
	require.NoError(t, reg.Update(drained)) // 1's mark waits quietly
	stopA()
	require.NoError(t, reg.Update(bs))
	assert.Zero(t, reg.Stats().Down, "no checker, no mark: the draining backend's went too")

	// A replacement starts from the marks handed over, and its probes
	// lift them.
	b := newChecker()
	b.Inherit([]registry.Backend{{Ordinal: 1, Addr: a1}})
	s.set(a0, true)
	stopB := run(b)
	require.Eventually(t, func() bool { return len(b.Stats().Backends) == 2 }, 10*time.Second, time.Millisecond)
	assert.True(t, reg.Snapshot().Down(1), "inherited, still failing")
	assert.False(t, reg.Snapshot().Down(0))
	s.set(a1, true)
	require.Eventually(t, func() bool { return !reg.Snapshot().Down(1) }, 10*time.Second, time.Millisecond)
	s.set(a1, false)
	require.Eventually(t, func() bool { return reg.Snapshot().Down(1) }, 10*time.Second, time.Millisecond)

	// A second checker on the same registry takes the marks over; the
	// first's verdicts no longer reach the registry, and its stop lifts
	// nothing of the second's.
	c := newChecker()
	c.Inherit(b.Down())
	stopC := run(c)
	require.Eventually(t, func() bool { return len(c.Stats().Backends) == 2 }, 10*time.Second, time.Millisecond)
	stopB()
	assert.True(t, reg.Snapshot().Down(1), "c's mark")
	stopC()
	assert.Zero(t, reg.Stats().Down)

	// Inherit while running, on a backend the checker has met: down at
	// once, up by its probes.
	d := newChecker()
	d.begin()
	s.set(a1, true)
	d.round(context.Background())
	d.Inherit([]registry.Backend{{Ordinal: 0, Addr: a0}})
	assert.True(t, reg.Snapshot().Down(0), "down at once")
	d.round(context.Background())
	assert.False(t, reg.Snapshot().Down(0), "up at its first success (rise 1)")
	d.end()
}
