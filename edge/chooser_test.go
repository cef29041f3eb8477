package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/fakeclock"
)

var (
	edgeA = netip.MustParseAddrPort("192.0.2.1:5684")
	edgeB = netip.MustParseAddrPort("192.0.2.2:5684")
	edgeC = netip.MustParseAddrPort("192.0.2.3:5684")
	edgeD = netip.MustParseAddrPort("192.0.2.4:5684")
)

var errDown = errors.New("edge down")

// A fakeNet is what the fake probes see: each edge's round-trip time, or down.
// It counts probes per edge.
type fakeNet struct {
	mu     sync.Mutex
	rtt    map[netip.AddrPort]time.Duration // 0: down
	probes map[netip.AddrPort]int
	hang   map[netip.AddrPort]bool // block until the probe's context ends
}

func newNet(rtts map[netip.AddrPort]time.Duration) *fakeNet {
	return &fakeNet{rtt: rtts, probes: map[netip.AddrPort]int{}, hang: map[netip.AddrPort]bool{}}
}

func (n *fakeNet) set(a netip.AddrPort, rtt time.Duration) {
	n.mu.Lock()
	n.rtt[a] = rtt
	n.mu.Unlock()
}

func (n *fakeNet) probe(ctx context.Context, a netip.AddrPort) (Sample, error) {
	n.mu.Lock()
	n.probes[a]++
	rtt, hang := n.rtt[a], n.hang[a]
	n.mu.Unlock()
	if hang {
		<-ctx.Done()
		return Sample{}, ctx.Err()
	}
	if rtt == 0 {
		return Sample{}, errDown
	}
	return Sample{RTT: rtt, Handshake: 3 * rtt}, nil
}

// count returns the probes per edge since the last call.
func (n *fakeNet) count() map[netip.AddrPort]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.probes
	n.probes = map[netip.AddrPort]int{}
	return p
}

// recorder keeps every event.
type recorder struct {
	mu  sync.Mutex
	evs []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) kinds(k EventKind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.evs {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

type fixture struct {
	t     *testing.T
	net   *fakeNet
	addrs []netip.AddrPort
	clock *fakeclock.Clock
	rec   *recorder
	c     *Chooser
}

// newFixture builds a Chooser over the fake net, resolving to addrs (which
// the test may change), with a fake clock.
func newFixture(t *testing.T, n *fakeNet, cfg Config, addrs ...netip.AddrPort) *fixture {
	f := &fixture{t: t, net: n, addrs: addrs, clock: fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), rec: &recorder{}}
	cfg.Probe = n.probe
	cfg.Resolve = func(context.Context) ([]netip.AddrPort, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return slices.Clone(f.addrs), nil
	}
	cfg.Clock = f.clock
	cfg.OnEvent = f.rec.add
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	f.c = c
	return f
}

func (f *fixture) setAddrs(addrs ...netip.AddrPort) {
	f.net.mu.Lock()
	f.addrs = addrs
	f.net.mu.Unlock()
}

// dial is what a dialer does: take the first of Order and Use it.
func (f *fixture) dial() netip.AddrPort {
	order, err := f.c.Order(context.Background())
	require.NoError(f.t, err)
	f.c.Use(order[0])
	return order[0]
}

// step runs one round and applies its switch.
func (f *fixture) step() *Switch {
	sw, err := f.c.Step(context.Background(), func(context.Context, Switch) error { return nil })
	require.NoError(f.t, err)
	return sw
}

func TestOrderRanksByRTT(t *testing.T) {
	n := newNet(map[netip.AddrPort]time.Duration{edgeA: 80 * time.Millisecond, edgeB: 5 * time.Millisecond, edgeC: 30 * time.Millisecond})
	f := newFixture(t, n, Config{}, edgeA, edgeB, edgeC)
	order, err := f.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeB, edgeC, edgeA}, order)
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeB: 1, edgeC: 1}, n.count())
	r := f.c.Ranking()
	require.NotNil(t, r)
	assert.Equal(t, setOf([]netip.AddrPort{edgeA, edgeB, edgeC}), r.Set)
	assert.Equal(t, f.clock.Now(), r.Measured)
	require.Len(t, f.rec.kinds(EventProbe), 3)
	require.Len(t, f.rec.kinds(EventRanked), 1)

	// A second dial uses the ranking: no probes.
	order2, err := f.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, order, order2)
	assert.Empty(t, n.count())
}

func TestProbesRunInParallelEachWithItsTimeout(t *testing.T) {
	// Every probe blocks until all three have started: a sequential
	// chooser would time out the first two. One edge never answers; the
	// measurement takes its timeout, once, not three.
	var started atomic.Int32
	all := make(chan struct{})
	n := newNet(map[netip.AddrPort]time.Duration{edgeA: 40 * time.Millisecond, edgeB: 10 * time.Millisecond})
	n.hang[edgeC] = true
	probe := func(ctx context.Context, a netip.AddrPort) (Sample, error) {
		if started.Add(1) == 3 {
			close(all)
		}
		select {
		case <-all:
		case <-ctx.Done():
			return Sample{}, ctx.Err()
		}
		return n.probe(ctx, a)
	}
	c, err := New(Config{Resolve: Static(edgeC, edgeA, edgeB), Probe: probe, ProbeTimeout: 300 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t0 := time.Now()
	order, err := c.Order(t.Context())
	took := time.Since(t0)
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeB, edgeA, edgeC}, order, "the silent edge ranks last")
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	t.Logf("measurement with one silent edge took %v (probe timeout 300ms)", took)
	r := c.Ranking()
	assert.False(t, r.Entries[2].OK)
	assert.Contains(t, r.Entries[2].Err, "deadline exceeded")
}

func TestFewerThanTwoCandidatesNeverProbe(t *testing.T) {
	n := newNet(map[netip.AddrPort]time.Duration{edgeA: 5 * time.Millisecond})
	f := newFixture(t, n, Config{}, edgeA)
	assert.Equal(t, edgeA, f.dial())
	for range 5 {
		assert.Nil(t, f.step())
	}
	assert.Empty(t, n.count())
	st := f.c.Stats()
	assert.Equal(t, uint64(6), st.Skipped)
	assert.Zero(t, st.Probes)
	assert.Equal(t, uint64(6), st.Resolves, "the name is resolved in every round all the same")
	assert.Nil(t, f.c.Ranking())

	// A second address appears: now it measures.
	n.set(edgeB, 3*time.Millisecond)
	f.setAddrs(edgeA, edgeB)
	f.step()
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeB: 1}, n.count())
}

func TestEveryProbeFailedUsesResolverOrder(t *testing.T) {
	n := newNet(map[netip.AddrPort]time.Duration{})
	f := newFixture(t, n, Config{}, edgeC, edgeA, edgeB)
	order, err := f.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeC, edgeA, edgeB}, order, "the resolver's order, untouched")
	require.Len(t, f.rec.kinds(EventFallback), 1)
	assert.Equal(t, uint64(1), f.c.Stats().Fallbacks)

	// Still nothing: measured again (a failed ranking is no ranking), same
	// answer.
	order, err = f.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeC, edgeA, edgeB}, order)
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 2, edgeB: 2, edgeC: 2}, n.count())

	// One edge returns: the next dial finds it first.
	n.set(edgeB, 30*time.Millisecond)
	order, err = f.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeB, edgeC, edgeA}, order, "the edge that answers, then the others in resolver order")
}

// rounds drives a session on cur through rounds of RTTs (edge → RTT, 0 =
// down, per round) and returns the round (1-based) that switched, 0 for
// none.
func rounds(t *testing.T, start map[netip.AddrPort]time.Duration, cur netip.AddrPort, seq []map[netip.AddrPort]time.Duration) (int, *Switch) {
	t.Helper()
	n := newNet(start)
	var addrs []netip.AddrPort
	for a := range start {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, compareAddrPort)
	f := newFixture(t, n, Config{}, addrs...)
	_, err := f.c.Order(t.Context())
	require.NoError(t, err)
	f.c.Use(cur)
	for i, rtts := range seq {
		for a, d := range rtts {
			n.set(a, d)
		}
		// Each round is a full measurement, as on the best edge after
		// MaxAge, or the partial one of a failback round: both probe the
		// candidates that matter here.
		f.clock.Advance(2 * time.Hour)
		if sw := f.step(); sw != nil {
			require.Equal(t, sw.To, f.c.Current())
			return i + 1, sw
		}
		require.Equal(t, cur, f.c.Current())
	}
	return 0, nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

type rtts = map[netip.AddrPort]time.Duration

func TestSwitchThresholdsAndStreak(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  rtts
		seq    []rtts
		round  int
		reason Reason
	}{
		{"best edge degrades: moves on the second round", rtts{edgeA: ms(5), edgeB: ms(30), edgeC: ms(80)},
			[]rtts{{edgeA: ms(60)}, {edgeA: ms(60)}, {edgeA: ms(60)}}, 2, Better},
		{"once better is not enough", rtts{edgeA: ms(5), edgeB: ms(30)},
			[]rtts{{edgeA: ms(60)}, {edgeA: ms(5)}, {edgeA: ms(60)}, {edgeA: ms(5)}}, 0, 0},
		{"the streak restarts after a miss", rtts{edgeA: ms(5), edgeB: ms(30)},
			[]rtts{{edgeA: ms(60)}, {edgeA: ms(5)}, {edgeA: ms(60)}, {edgeA: ms(60)}}, 4, Better},
		{"a 10 ms wobble never moves it", rtts{edgeA: ms(30), edgeB: ms(30)},
			[]rtts{{edgeA: ms(40)}, {edgeA: ms(30), edgeB: ms(20)}, {edgeA: ms(40), edgeB: ms(30)}, {edgeA: ms(40)}, {edgeA: ms(35), edgeB: ms(25)}}, 0, 0},
		{"100 ms to 79 ms: 21 ms is not 25 %", rtts{edgeA: ms(100), edgeB: ms(79)},
			[]rtts{{}, {}, {}}, 0, 0},
		{"4 ms to 3 ms: 25 % is not 20 ms", rtts{edgeA: ms(4), edgeB: ms(3)},
			[]rtts{{}, {}, {}}, 0, 0},
		{"80 ms to 61 ms: 19 ms", rtts{edgeA: ms(80), edgeB: ms(61)},
			[]rtts{{}, {}, {}}, 0, 0},
		{"100 ms to 75 ms: both thresholds exactly", rtts{edgeA: ms(100), edgeB: ms(75)},
			[]rtts{{}, {}, {}}, 2, Better},
		{"the current edge fails its probe twice", rtts{edgeA: ms(5), edgeB: ms(30)},
			[]rtts{{edgeA: 0}, {edgeA: 0}}, 2, Failing},
		{"every edge fails: stay", rtts{edgeA: ms(5), edgeB: ms(30)},
			[]rtts{{edgeA: 0, edgeB: 0}, {}, {}}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			round, sw := rounds(t, tc.start, edgeA, tc.seq)
			require.Equal(t, tc.round, round)
			if round > 0 {
				assert.Equal(t, tc.reason, sw.Reason)
				assert.Equal(t, edgeA, sw.From)
				assert.Equal(t, edgeB, sw.To)
			}
		})
	}
}

func TestFailbackRoundsProbeOnlyWhatCanWin(t *testing.T) {
	// On C, third of four: a failback round probes C and the two above it,
	// not D; a failed edge is watched too.
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(20), edgeC: ms(40), edgeD: ms(90)})
	f := newFixture(t, n, Config{}, edgeA, edgeB, edgeC, edgeD)
	_, err := f.c.Order(t.Context())
	require.NoError(t, err)
	n.count()
	f.c.Use(edgeC)
	assert.Nil(t, f.step(), "first round: a streak of one")
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeB: 1, edgeC: 1}, n.count())

	// MaxAge later the round measures everything; D fails in it.
	f.clock.Advance(2 * time.Hour)
	n.set(edgeD, 0)
	sw := f.step()
	require.NotNil(t, sw, "second round in a row: A wins")
	assert.Equal(t, edgeA, sw.To)
	assert.Equal(t, Better, sw.Reason)
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeB: 1, edgeC: 1, edgeD: 1}, n.count(), "MaxAge passed: a full measurement")

	// On A, the best; D failed, so rounds keep watching it (and nothing
	// else but the current edge).
	assert.Nil(t, f.step())
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeD: 1}, n.count())
	n.set(edgeD, ms(90))
	assert.Nil(t, f.step())
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeD: 1}, n.count())
	// All well and on the best: nothing to watch until MaxAge.
	assert.Nil(t, f.step())
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1}, n.count())
}

func TestRemovedEdgeMovesAtOnce(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30), edgeC: ms(50)})
	f := newFixture(t, n, Config{}, edgeA, edgeB, edgeC)
	assert.Equal(t, edgeA, f.dial())
	f.setAddrs(edgeB, edgeC)
	sw := f.step()
	require.NotNil(t, sw)
	assert.Equal(t, Switch{From: edgeA, To: edgeB, Reason: Removed, ToRTT: ms(30)}, *sw)
	assert.Equal(t, uint64(1), f.c.Stats().Discarded, "the set changed: the ranking was measured again")

	// Down to one address, which is not ours: move, without probing.
	f.setAddrs(edgeC)
	n.count()
	sw = f.step()
	require.NotNil(t, sw)
	assert.Equal(t, Switch{From: edgeB, To: edgeC, Reason: Removed}, *sw)
	assert.Empty(t, n.count())
}

func TestFailoverTriesInRankingOrderWithoutProbing(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30), edgeC: ms(50)})
	f := newFixture(t, n, Config{}, edgeC, edgeB, edgeA)
	assert.Equal(t, edgeA, f.dial())
	n.count()
	var tried []netip.AddrPort
	sw, err := f.c.Failover(t.Context(), edgeA, func(_ context.Context, sw Switch) error {
		tried = append(tried, sw.To)
		if sw.To == edgeB {
			return errDown
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeB, edgeC}, tried)
	assert.Equal(t, Switch{From: edgeA, To: edgeC, Reason: Unreachable, ToRTT: ms(50)}, sw)
	assert.Equal(t, edgeC, f.c.Current())
	assert.Empty(t, n.count(), "no probe: a failover costs no handshake")
	st := f.c.Stats()
	assert.Equal(t, uint64(1), st.Switches[Unreachable])
	assert.Equal(t, uint64(1), st.SwitchErrors)
	r := f.c.Ranking()
	assert.Equal(t, []netip.AddrPort{edgeB, edgeC, edgeA}, r.Order(), "A is marked failed")

	// A stale failover (the session already left A) does nothing.
	sw, err = f.c.Failover(t.Context(), edgeA, func(context.Context, Switch) error { panic("called") })
	require.NoError(t, err)
	assert.Zero(t, sw)

	// Failback: rounds watch A (failed) and B (above C); B is better at
	// once, and A comes back better still: two rounds later, A.
	sw1 := f.step()
	require.Nil(t, sw1)
	assert.Equal(t, map[netip.AddrPort]int{edgeA: 1, edgeB: 1, edgeC: 1}, n.count())
	sw2 := f.step()
	require.NotNil(t, sw2)
	assert.Equal(t, edgeA, sw2.To)
	assert.Equal(t, Better, sw2.Reason)

	// Nowhere to go: an error, and the session stays.
	_, err = f.c.Failover(t.Context(), edgeA, func(context.Context, Switch) error { return errDown })
	require.ErrorIs(t, err, ErrNoEdge)
	require.ErrorIs(t, err, errDown)
	assert.Equal(t, edgeA, f.c.Current())
}

func TestFailedSwitchStays(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30)})
	f := newFixture(t, n, Config{}, edgeA, edgeB)
	f.dial()
	n.set(edgeA, ms(90))
	f.clock.Advance(2 * time.Hour)
	require.Nil(t, f.step())
	sw, err := f.c.Step(t.Context(), func(context.Context, Switch) error { return errDown })
	require.ErrorIs(t, err, errDown)
	assert.Nil(t, sw)
	assert.Equal(t, edgeA, f.c.Current())
	require.Len(t, f.rec.kinds(EventSwitchFailed), 1)
	// The streak starts over: one more round is not enough.
	assert.Nil(t, f.step())
	assert.NotNil(t, f.step())
}

func TestResolverFailureKeepsLastSet(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30)})
	calls := 0
	fail := false
	c, err := New(Config{Probe: n.probe, Logger: slog.New(slog.DiscardHandler), Resolve: func(context.Context) ([]netip.AddrPort, error) {
		calls++
		if fail {
			return nil, errors.New("SERVFAIL")
		}
		return []netip.AddrPort{edgeA, edgeB}, nil
	}})
	require.NoError(t, err)
	_, err = c.Order(t.Context())
	require.NoError(t, err)
	c.Use(edgeA)
	fail = true
	order, err := c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeA, edgeB}, order)
	c.Cycle(t.Context())
	assert.Equal(t, 3, calls, "resolved at every dial and every round")
	assert.Equal(t, uint64(2), c.Stats().ResolveErrors)

	// Nothing ever resolved: an error wrapping ErrNoEdge.
	c2, err := New(Config{Probe: n.probe, Logger: slog.New(slog.DiscardHandler),
		Resolve: func(context.Context) ([]netip.AddrPort, error) { return nil, errors.New("NXDOMAIN") }})
	require.NoError(t, err)
	_, err = c2.Order(t.Context())
	require.ErrorIs(t, err, ErrNoEdge)
}

func TestRankingSurvivesRestartAndIsDiscardedWithTheSet(t *testing.T) {
	path := t.TempDir() + "/edges.json"
	n := newNet(rtts{edgeA: ms(80), edgeB: ms(5), edgeC: ms(30)})
	f := newFixture(t, n, Config{Store: FileStore(path)}, edgeA, edgeB, edgeC)
	assert.Equal(t, edgeB, f.dial())
	assert.Len(t, n.count(), 3)

	// A restart: a new Chooser on the same file dials B without probing.
	f2 := newFixture(t, n, Config{Store: FileStore(path)}, edgeC, edgeB, edgeA)
	order, err := f2.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []netip.AddrPort{edgeB, edgeC, edgeA}, order)
	assert.Empty(t, n.count())
	assert.Equal(t, f.c.Ranking(), f2.c.Ranking())

	// An edge is added: the stored ranking is stale even though B is still
	// there; everything is measured again.
	n.set(edgeD, ms(2))
	f3 := newFixture(t, n, Config{Store: FileStore(path)}, edgeA, edgeB, edgeC, edgeD)
	order, err = f3.c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, edgeD, order[0])
	assert.Len(t, n.count(), 4)
	require.Len(t, f3.rec.kinds(EventDiscarded), 1)
	assert.Equal(t, uint64(1), f3.c.Stats().Discarded)

	// And one removed: the same.
	f4 := newFixture(t, n, Config{Store: FileStore(path)}, edgeA, edgeB, edgeC)
	_, err = f4.c.Order(t.Context())
	require.NoError(t, err)
	assert.Len(t, n.count(), 3)
}

type brokenStore struct{}

func (brokenStore) Load() (*Ranking, error) { return nil, errors.New("disk on fire") }
func (brokenStore) Save(*Ranking) error     { return errors.New("disk on fire") }

func TestStoreFailuresAreNotFatal(t *testing.T) {
	for name, st := range map[string]Store{
		"broken":   brokenStore{},
		"no dir":   FileStore(t.TempDir() + "/missing/edges.json"),
		"is a dir": FileStore(t.TempDir()),
	} {
		t.Run(name, func(t *testing.T) {
			n := newNet(rtts{edgeA: ms(30), edgeB: ms(5)})
			f := newFixture(t, n, Config{Store: st}, edgeA, edgeB)
			assert.Equal(t, edgeB, f.dial())
			assert.NotZero(t, f.c.Stats().StoreErrors)
			assert.NotEmpty(t, f.rec.kinds(EventStoreError))
		})
	}
}

func TestFileStoreRejectsCorruptFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"not json":     "{",
		"old version":  `{"version": 0, "set": [], "entries": []}`,
		"set mismatch": `{"version": 1, "set": ["192.0.2.1:1"], "entries": [{"addr": "192.0.2.2:1"}]}`,
		"unsorted set": `{"version": 1, "set": ["192.0.2.2:1", "192.0.2.1:1"], "entries": [{"addr": "192.0.2.2:1"}, {"addr": "192.0.2.1:1"}]}`,
		"bad address":  `{"version": 1, "set": ["nope"], "entries": []}`,
	} {
		t.Run(name, func(t *testing.T) {
			p := dir + "/" + name
			require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
			_, err := FileStore(p).Load()
			require.ErrorIs(t, err, ErrCorrupt)
		})
	}
	r, err := FileStore(dir + "/absent").Load()
	require.NoError(t, err)
	require.Nil(t, r)
}

func TestJitterSpreadsFailbackRounds(t *testing.T) {
	// While on a non-best edge, the rounds come uniform in [0, 5 min): a
	// χ² test over ten bins. The seed is fixed, so the test is
	// deterministic; a schedule without full jitter (a fixed period, or
	// jitter over half the interval) fails it.
	const rounds, bins = 3000, 10
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(100)})
	f := newFixture(t, n, Config{Rand: newRand(1)}, edgeA, edgeB)
	f.dial()
	// On B, the far edge, say after a failover; A is still ranked best but
	// its new RTT is not better enough to win, so every round is a
	// failback round and nothing switches.
	f.c.Use(edgeB)
	n.set(edgeA, ms(90))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.c.Run(ctx, func(context.Context, Switch) error { return errDown }) }()
	var delays []time.Duration
	for range rounds {
		delays = append(delays, f.clock.Fire())
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.Equal(t, delays, f.clock.Asked()[:rounds], "Run waited exactly the scheduled delays")

	interval := 5 * time.Minute
	var count [bins]int
	var sum time.Duration
	for _, d := range delays {
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, interval)
		count[int(d*bins/interval)]++
		sum += d
	}
	exp := float64(rounds) / bins
	chi2 := 0.0
	for _, c := range count {
		chi2 += (float64(c) - exp) * (float64(c) - exp) / exp
	}
	mean := sum / rounds
	t.Logf("bins %v, χ² = %.1f (9 degrees of freedom, p=0.001 critical value 27.9), mean %v", count, chi2, mean)
	assert.Less(t, chi2, 27.9, "delays not uniform over [0, Interval)")
	assert.InDelta(t, float64(interval/2), float64(mean), float64(interval/20), "mean delay")

	// Two clients with different seeds do not share a schedule.
	g := newFixture(t, n, Config{Rand: newRand(2)}, edgeA, edgeB)
	g.dial()
	g.c.Use(edgeB)
	same := 0
	for i := range 100 {
		if g.c.NextDelay() == delays[i] {
			same++
		}
	}
	assert.Zero(t, same)
}

func TestSettledWaitsForMaxAge(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30)})
	f := newFixture(t, n, Config{Rand: newRand(3)}, edgeA, edgeB)
	f.dial()
	for range 100 {
		d := f.c.NextDelay()
		require.GreaterOrEqual(t, d, time.Hour, "on the best edge: not before the ranking is MaxAge old")
		require.Less(t, d, time.Hour+5*time.Minute)
	}
	f.clock.Advance(50 * time.Minute)
	d := f.c.NextDelay()
	assert.GreaterOrEqual(t, d, 10*time.Minute)
	assert.Less(t, d, 15*time.Minute)
}

func TestBetter(t *testing.T) {
	for _, tc := range []struct {
		cand, cur int
		want      bool
	}{
		{30, 60, true}, {40, 60, true}, {41, 60, false}, {79, 100, false}, {75, 100, true},
		{3, 4, false}, {0, 19, false}, {0, 20, true}, {60, 60, false}, {90, 60, false},
	} {
		assert.Equal(t, tc.want, better(ms(tc.cand), ms(tc.cur), ms(20), 25), "%d ms vs %d ms", tc.cand, tc.cur)
	}
}

func TestConfig(t *testing.T) {
	probe := func(context.Context, netip.AddrPort) (Sample, error) { return Sample{}, nil }
	for _, cfg := range []Config{
		{Probe: probe},
		{Resolve: Static(edgeA)},
		{Resolve: Static(edgeA), Probe: probe, MinGainPercent: 101},
		{Resolve: Static(edgeA), Probe: probe, Interval: -1},
	} {
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrConfig)
	}
}

func TestLookupHostUsesTheSystemResolver(t *testing.T) {
	addrs, err := LookupHost("localhost", 5684)(t.Context())
	require.NoError(t, err)
	require.NotEmpty(t, addrs)
	for _, a := range addrs {
		assert.True(t, a.Addr().IsLoopback(), "%v", a)
		assert.Equal(t, uint16(5684), a.Port())
		assert.False(t, a.Addr().Is4In6())
	}
}

func TestProbeWithoutRTTIsAFailure(t *testing.T) {
	c, err := New(Config{Resolve: Static(edgeA, edgeB), Logger: slog.New(slog.DiscardHandler),
		Probe: func(context.Context, netip.AddrPort) (Sample, error) { return Sample{}, nil }})
	require.NoError(t, err)
	_, err = c.Order(t.Context())
	require.NoError(t, err)
	assert.Equal(t, uint64(2), c.Stats().ProbeErrors)
	assert.Equal(t, uint64(1), c.Stats().Fallbacks)
}

func ExampleReason() {
	fmt.Println(Better, Failing, Unreachable, Removed)
	// Output: better failing unreachable removed
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed)) }

func TestConnectTriesInOrderAndFollowsOneSession(t *testing.T) {
	n := newNet(rtts{edgeA: ms(5), edgeB: ms(30), edgeC: ms(80)})
	f := newFixture(t, n, Config{}, edgeC, edgeB, edgeA)
	var tried []netip.AddrPort
	got, err := f.c.Connect(t.Context(), func(_ context.Context, a netip.AddrPort) error {
		tried = append(tried, a)
		if a == edgeA {
			return errDown // the probe passed, the dial did not
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, edgeB, got)
	assert.Equal(t, []netip.AddrPort{edgeA, edgeB}, tried)
	assert.Equal(t, edgeB, f.c.Current())

	_, err = f.c.Connect(t.Context(), func(context.Context, netip.AddrPort) error { return nil })
	require.ErrorIs(t, err, ErrInUse)
	f.c.Release()
	assert.False(t, f.c.Current().IsValid())
	assert.Nil(t, f.step(), "no session, no round")

	_, err = f.c.Connect(t.Context(), func(context.Context, netip.AddrPort) error { return errDown })
	require.ErrorIs(t, err, ErrNoEdge)
	require.ErrorIs(t, err, errDown)
	assert.False(t, f.c.Current().IsValid())
	got, err = f.c.Connect(t.Context(), func(context.Context, netip.AddrPort) error { return nil })
	require.NoError(t, err)
	assert.Equal(t, edgeA, got)
}
