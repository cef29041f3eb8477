package registry

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cidroute/cidroute/hrw"
)

// slowKeys returns n distinct keys.
func slowKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = binary.BigEndian.AppendUint64(nil, uint64(i)*0x9e3779b97f4a7c15)
	}
	return keys
}

// pickAll returns the ordinal each key's new session goes to.
func pickAll(t testing.TB, s *Snapshot, keys [][]byte) []uint8 {
	t.Helper()
	out := make([]uint8, len(keys))
	for i, k := range keys {
		b, ok := s.PickNew(k)
		truth(t, ok, "no backend for key %d", i)
		out[i] = b.Ordinal
	}
	return out
}

func share(picks []uint8, o uint8) float64 {
	n := 0
	for _, p := range picks {
		if p == o {
			n++
		}
	}
	return float64(n) / float64(len(picks))
}

func owners(s *Snapshot) [hrw.Buckets]uint8 {
	var o [hrw.Buckets]uint8
	s.Table().Owners(&o)
	return o
}

// slowList: four settled backends of weight 1 and ordinal 4, weight 2,
// ready since readySince.
func slowList(readySince time.Time) []Backend {
	bs := manyBackends(5)
	for i := range bs {
		bs[i].Weight = 1
	}
	bs[4].Weight, bs[4].ReadySince = 2, readySince
	return bs
}

func newSlowRegistry(t testing.TB, clk *fakeClock) *Registry {
	t.Helper()
	r, err := New(Config{Service: "test", Seed: 7, SlowStart: 100 * time.Second, Logger: quietLogger(), now: clk.Now})
	noErr(t, err)
	t.Cleanup(r.Close)
	return r
}

// A backend that just became ready takes 10%, then 50%, then all of its
// weight's share of new sessions at the steps of its slow start; each
// step moves keys only to it, and the ramp ends in the table without
// slow start.
func TestSlowStartRamps(t *testing.T) {
	clk := newFakeClock()
	t0 := clk.Now()
	r := newSlowRegistry(t, clk)
	keys := slowKeys(100000)
	noErr(t, r.Update(slowList(t0)))
	var prev []uint8
	for _, step := range []struct {
		at       time.Duration
		permille uint16
	}{{0, 100}, {9 * time.Second, 100}, {40 * time.Second, 500}, {49 * time.Second, 500}, {90 * time.Second, 1000}, {time.Hour, 1000}} {
		clk.t = t0.Add(step.at)
		r.rampStep() // what the timer does at each step's start
		s := r.Snapshot()
		equal(t, s.Permille(4), step.permille, "at %v", step.at)
		for o := range uint8(5) { // CID routes: every backend serves, ramping or not
			_, ok := s.Serving(o)
			truth(t, ok, "at %v: ordinal %d not serving", step.at, o)
		}
		w := 2 * float64(step.permille) / 1000
		want := w / (4 + w)
		got := pickAll(t, s, keys)
		if d := share(got, 4) - want; d > 0.015 || d < -0.015 {
			t.Errorf("at %v: share of the new backend %.4f, want %.4f ± 0.015", step.at, share(got, 4), want)
		}
		for i := range prev {
			if got[i] != prev[i] && got[i] != 4 {
				t.Fatalf("at %v: key %d moved %d → %d, not to the new backend", step.at, i, prev[i], got[i])
			}
		}
		prev = got
		ramping := 0
		if step.permille < 1000 {
			ramping = 1
		}
		equal(t, r.Stats().SlowStarting, ramping, "at %v", step.at)
	}
	plain, err := NewStatic(Config{Seed: 7}, slowList(time.Time{}))
	noErr(t, err)
	defer plain.Close()
	truth(t, owners(r.Snapshot()) == owners(plain.Snapshot()), "after the ramp: the table without slow start")
	r.mu.Lock()
	truth(t, r.ramp == nil, "no timer once nothing ramps")
	r.mu.Unlock()
	equal(t, r.Snapshot().Permille(200), uint16(0), "not a backend")
}

// Two replicas fed the same backend list at different local times within
// one step, one of them after an intermediate list the other never saw,
// pick alike for every key: the ramp is a function of the list and the
// step, not of when or in what order a replica observed it. Had each
// replica taken "ready since" from its own observation, they would not.
func TestSlowStartReplicasAgree(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	ca, cb := newFakeClock(), newFakeClock()
	ca.t, cb.t = t0.Add(12*time.Second), t0.Add(17500*time.Millisecond) // both in the second step
	a, b := newSlowRegistry(t, ca), newSlowRegistry(t, cb)

	noErr(t, a.Update(slowList(t0)[:4])) // a saw the list before ordinal 4 joined
	ca.Add(time.Second)
	noErr(t, a.Update(slowList(t0)))
	noErr(t, b.Update(slowList(t0)))
	equal(t, a.Snapshot().Permille(4), uint16(200))
	truth(t, owners(a.Snapshot()) == owners(b.Snapshot()), "replicas in one step disagree")
	keys := slowKeys(20000)
	pa, pb := pickAll(t, a.Snapshot(), keys), pickAll(t, b.Snapshot(), keys)
	equal(t, pa, pb)

	// A replica whose clock is already in the next step differs only in
	// keys moving to the new backend.
	cb.t = t0.Add(20 * time.Second)
	b.rampStep()
	pb = pickAll(t, b.Snapshot(), keys)
	moved := 0
	for i := range pa {
		if pa[i] != pb[i] {
			truth(t, pb[i] == 4, "key %d: %d → %d", i, pa[i], pb[i])
			moved++
		}
	}
	truth(t, moved > 0, "the next step moved nothing")

	// The counterfactual: had each replica started the ramp when it
	// observed the backend (a at t0+3s, b at t0+13s), at the same instant
	// they would be in different steps and disagree.
	ca.t, cb.t = t0.Add(17500*time.Millisecond), t0.Add(17500*time.Millisecond)
	noErr(t, a.Update(slowList(t0.Add(3*time.Second))))
	noErr(t, b.Update(slowList(t0.Add(13*time.Second))))
	truth(t, owners(a.Snapshot()) != owners(b.Snapshot()), "local observation times would have agreed")
}

// The timer publishes each step when it begins, on the real clock.
func TestSlowStartTimer(t *testing.T) {
	r, err := New(Config{Service: "test", SlowStart: 10 * time.Second, Logger: quietLogger()})
	noErr(t, err)
	defer r.Close()
	bs := slowList(time.Now().Add(-950 * time.Millisecond)) // the second step begins in 50 ms
	noErr(t, r.Update(bs))
	equal(t, r.Snapshot().Permille(4), uint16(100))
	v := r.Snapshot().Version()
	deadline := time.Now().Add(5 * time.Second)
	for r.Snapshot().Permille(4) != 200 {
		truth(t, time.Now().Before(deadline), "the second step was never published")
		time.Sleep(10 * time.Millisecond)
	}
	equal(t, r.Snapshot().Version(), v+1)
	r.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	truth(t, r.ramp == nil || !r.ramp.Stop(), "Close stops the timer")
}

func TestSlowStartConfig(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, time.Second, MinSlowStart - 1, MaxSlowStart + 1} {
		_, err := New(Config{SlowStart: d})
		isErr(t, err, ErrConfig, "SlowStart %v", d)
		truth(t, strings.Contains(err.Error(), "want 0 (off) or 10s to 1h0m0s"), err.Error())
	}
	for _, d := range []time.Duration{0, MinSlowStart, MaxSlowStart} {
		r, err := New(Config{SlowStart: d})
		noErr(t, err, "SlowStart %v", d)
		r.Close()
	}
	// Without slow start ReadySince changes nothing.
	clk := newFakeClock()
	r, err := New(Config{Seed: 7, now: clk.Now})
	noErr(t, err)
	defer r.Close()
	noErr(t, r.Update(slowList(clk.Now())))
	equal(t, r.Snapshot().Permille(4), uint16(1000))
}

func TestRampPermille(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := 100 * time.Second
	for _, c := range []struct {
		at   time.Duration
		p    uint16
		next time.Duration // 0: none
	}{
		{-time.Hour, 100, 10 * time.Second}, // a clock behind the source's
		{0, 100, 10 * time.Second},
		{10*time.Second - 1, 100, 10 * time.Second},
		{10 * time.Second, 200, 20 * time.Second},
		{89 * time.Second, 900, 90 * time.Second},
		{90 * time.Second, 1000, 0},
		{time.Hour, 1000, 0},
	} {
		p, next := rampPermille(t0, t0.Add(c.at), d)
		equal(t, p, c.p, "at %v", c.at)
		if c.next == 0 {
			truth(t, next.IsZero(), "at %v: next %v", c.at, next)
		} else {
			equal(t, next, t0.Add(c.next), "at %v", c.at)
		}
	}
	p, next := rampPermille(time.Time{}, t0, d)
	truth(t, p == 1000 && next.IsZero(), "no ReadySince: no ramp")
}

func TestReadySinceJSON(t *testing.T) {
	in := `[{"ordinal": 1, "address": "10.0.0.1:5684", "ready_since": "2026-01-02T16:04:05.5+01:00"}]`
	bs, err := DecodeBackends(strings.NewReader(in))
	noErr(t, err)
	want := time.Date(2026, 1, 2, 15, 4, 5, 5e8, time.UTC)
	equal(t, bs[0].ReadySince, want)
	out, err := json.Marshal(bs[0])
	noErr(t, err)
	equal(t, string(out), `{"ordinal":1,"address":"10.0.0.1:5684","weight":1,"state":"ready","ready_since":"2026-01-02T15:04:05.5Z"}`)
	var back Backend
	noErr(t, json.Unmarshal(out, &back))
	equal(t, back, bs[0])
	for _, bad := range []string{`"2026-01-02 15:04:05"`, `"yesterday"`, `17`} {
		_, err := DecodeBackends(strings.NewReader(`[{"ordinal": 1, "address": "10.0.0.1:5684", "ready_since": ` + bad + `}]`))
		isErr(t, err, ErrDecode, bad)
	}
}
