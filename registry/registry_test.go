package registry

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestUpdateRejectsWhole(t *testing.T) {
	good := []Backend{
		{Ordinal: 0, Addr: ap("10.0.0.1:5684")},
		{Ordinal: 1, Addr: ap("10.0.0.2:5684")},
	}
	for _, c := range []struct {
		name string
		bad  Backend
		want error
	}{
		{"duplicate ordinal", Backend{Ordinal: 1, Addr: ap("10.0.0.3:5684")}, ErrDuplicateOrdinal},
		{"duplicate address", Backend{Ordinal: 2, Addr: ap("10.0.0.2:5684")}, ErrDuplicateAddr},
		{"duplicate 4in6 address", Backend{Ordinal: 2, Addr: ap("[::ffff:10.0.0.2]:5684")}, ErrDuplicateAddr},
		{"duplicate of a gone backend", Backend{Ordinal: 2, Addr: ap("10.0.0.2:5684"), State: Gone}, ErrDuplicateAddr},
		{"ordinal 255", Backend{Ordinal: 255, Addr: ap("10.0.0.3:5684")}, ErrReservedOrdinal},
		{"zero port", Backend{Ordinal: 2, Addr: ap("10.0.0.3:0")}, ErrZeroPort},
		{"unspecified v4", Backend{Ordinal: 2, Addr: ap("0.0.0.0:5684")}, ErrUnspecifiedAddr},
		{"unspecified v6", Backend{Ordinal: 2, Addr: ap("[::]:5684")}, ErrUnspecifiedAddr},
		{"zero address", Backend{Ordinal: 2}, ErrInvalidAddr},
		{"multicast", Backend{Ordinal: 2, Addr: ap("224.0.0.1:5684")}, ErrInvalidAddr},
		{"broadcast", Backend{Ordinal: 2, Addr: ap("255.255.255.255:5684")}, ErrInvalidAddr},
		{"bad state", Backend{Ordinal: 2, Addr: ap("10.0.0.3:5684"), State: 3}, ErrInvalidState},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _ := newTestRegistry(t, 0)
			noErr(t, r.Update(good))
			before := r.Snapshot()

			bad := append(append([]Backend(nil), good...), c.bad)
			err := r.Update(bad)
			isErr(t, err, c.want)
			isErr(t, Validate(bad), c.want)
			truth(t, r.Snapshot() == before, "the previous snapshot stays")
			st := r.Stats()
			equal(t, st.Rejections, uint64(1))
			equal(t, st.Updates, uint64(1))
			equal(t, st.Version, uint64(1))
			t.Log(err)
		})
	}
}

func TestUpdateCopiesInput(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	bs := []Backend{{Ordinal: 1, Addr: ap("10.0.0.1:5684")}}
	noErr(t, r.Update(bs))
	bs[0].Ordinal = 9
	_, ok := r.Snapshot().Backend(1)
	truth(t, ok, "the registry keeps its own copy")
}

func TestNewConfig(t *testing.T) {
	_, err := New(Config{MaxAge: -1})
	isErr(t, err, ErrConfig, "negative MaxAge")
	var zero Config
	r, err := New(zero)
	noErr(t, err)
	defer r.Close()
	truth(t, r.Snapshot() != nil && !r.Stale())
	equal(t, r.MaxAge(), time.Duration(0))
	r.Close() // idempotent
}

// The state transitions a backend goes through, as the Pipeline sees them.
func TestStateTransitions(t *testing.T) {
	r, clk := newTestRegistry(t, time.Hour)
	const ord = 1
	list := func(st State) []Backend {
		return []Backend{
			{Ordinal: 0, Addr: ap("10.0.0.1:5684")},
			{Ordinal: ord, Addr: ap("10.0.0.2:5684"), State: st},
		}
	}
	addr := ap("10.0.0.2:5684")
	pickedOrd := func(s *Snapshot) map[uint8]bool {
		got := map[uint8]bool{}
		for i := range 1000 {
			var k [4]byte
			binary.BigEndian.PutUint32(k[:], uint32(i))
			if b, ok := s.PickNew(k[:]); ok {
				got[b.Ordinal] = true
			}
		}
		return got
	}

	// ready: serves CIDs, takes new sessions, its replies pass.
	noErr(t, r.Update(list(Ready)))
	s := r.Snapshot()
	_, ok := s.Serving(ord)
	truth(t, ok && s.IsBackend(addr) && pickedOrd(s)[ord])

	// ready → draining: CIDs still routed, replies still pass, no new sessions.
	noErr(t, r.Update(list(Draining)))
	s = r.Snapshot()
	b, ok := s.Serving(ord)
	truth(t, ok && b.State == Draining, "draining still serves")
	truth(t, s.IsBackend(addr), "draining replies pass")
	truth(t, !pickedOrd(s)[ord], "draining takes no new sessions")

	// draining → gone: CID datagrams dropped (not serving), replies refused.
	noErr(t, r.Update(list(Gone)))
	s = r.Snapshot()
	b, ok = s.Serving(ord)
	truth(t, !ok && b != nil && b.State == Gone, "gone: known but not serving")
	truth(t, !s.IsBackend(addr), "gone replies refused")
	truth(t, !pickedOrd(s)[ord])

	// gone → removed: unknown ordinal.
	noErr(t, r.Update(list(Ready)[:1]))
	s = r.Snapshot()
	b, ok = s.Serving(ord)
	truth(t, !ok && b == nil)

	// removed → ready again (a restarted pod).
	noErr(t, r.Update(list(Ready)))
	s = r.Snapshot()
	_, ok = s.Serving(ord)
	truth(t, ok && pickedOrd(s)[ord])

	// fresh → stale: new sessions refused by the caller (Stale), CIDs still
	// routed from the same snapshot.
	clk.Add(time.Hour)
	r.checkFreshness()
	truth(t, r.Stale(), "stale after MaxAge without confirmation")
	truth(t, r.Snapshot() == s, "going stale does not touch the snapshot")
	_, ok = s.Serving(ord)
	truth(t, ok, "CID routes keep working while stale")

	// stale → fresh by Confirm.
	r.Confirm()
	truth(t, !r.Stale(), "Confirm un-stales")

	// stale → fresh by Update.
	clk.Add(2 * time.Hour)
	r.checkFreshness()
	truth(t, r.Stale())
	noErr(t, r.Update(list(Draining)))
	truth(t, !r.Stale(), "Update un-stales")

	// A rejected update is no confirmation.
	clk.Add(2 * time.Hour)
	r.checkFreshness()
	truth(t, r.Stale())
	isErr(t, r.Update(append(list(Ready), list(Ready)...)), ErrDuplicateOrdinal)
	truth(t, r.Stale(), "a rejected update does not un-stale")
}

func TestFreshnessClock(t *testing.T) {
	r, clk := newTestRegistry(t, time.Hour)
	truth(t, !r.Stale(), "fresh at start")
	clk.Add(59 * time.Minute)
	r.checkFreshness()
	truth(t, !r.Stale(), "59m < 1h")
	r.Confirm()
	clk.Add(59 * time.Minute)
	r.checkFreshness()
	truth(t, !r.Stale(), "Confirm restarted the clock")
	clk.Add(time.Minute)
	r.checkFreshness()
	truth(t, r.Stale(), "1h since the last Confirm")
	st := r.Stats()
	truth(t, st.Stale && st.Age == time.Hour && st.Confirmations == 1, "%+v", st)

	// Freshness off: never stale.
	off, clk2 := newTestRegistry(t, 0)
	clk2.Add(1000 * time.Hour)
	off.checkFreshness()
	truth(t, !off.Stale())
}

// The real timer, with a tiny MaxAge: it must flip the flag by itself, and
// restart after a confirmation. No timing is asserted, only eventual state.
func TestFreshnessTimer(t *testing.T) {
	logs := newLogCounter()
	r, err := New(Config{Service: "timer", MaxAge: time.Millisecond, Logger: logs.logger()})
	noErr(t, err)
	defer r.Close()
	for range 3 {
		waitFor(t, r.Stale)
		r.Confirm()
		// The flag is cleared synchronously; the timer may already have
		// fired again on a slow machine, so only the next staleness is
		// awaited.
	}
	waitFor(t, r.Stale)
	r.Close()
	r.Confirm()

	// The shortest limit, which may fire while New is still running.
	tiny, err := New(Config{MaxAge: MinMaxAge, Logger: quietLogger()})
	noErr(t, err)
	waitFor(t, tiny.Stale)
	tiny.Close()
	truth(t, !r.Stale(), "Confirm still clears after Close")
	truth(t, logs.count(slog.LevelWarn) >= 4, "stale transitions logged")
}

// waitFor polls cond until it holds, failing after a minute: long enough
// for any emulator, and never a timing assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within a minute")
		}
		time.Sleep(time.Millisecond)
	}
}

// gen returns generation v's backend list. Every address carries v, so a
// reader can tell which generation anything it read belongs to, and no two
// generations share an address. Ordinals, weights and the list size change
// every 32 generations (so that the HRW table is rebuilt for some and reused
// for others); draining and gone backends swap states every generation.
func gen(v uint64) []Backend {
	blk := int(v / 32)
	n := 1 + blk%9
	bs := make([]Backend, n)
	for i := range bs {
		var a [16]byte
		a[0] = 0xfd
		binary.BigEndian.PutUint64(a[4:], v)
		a[15] = byte(i)
		st := State((blk + i) % 3)
		switch {
		case i == 0:
			st = Ready
		case st != Ready && v%2 == 1:
			st = Draining + Gone - st
		}
		bs[i] = Backend{
			Ordinal: uint8((blk*7 + i*13) % 255),
			Addr:    netip.AddrPortFrom(netip.AddrFrom16(a), uint16(1000+i)),
			Weight:  uint32(1 + (blk+i)%4),
			State:   st,
		}
	}
	return bs
}

// genOf decodes the generation and the index a gen address carries.
func genOf(a netip.AddrPort) (v uint64, i int) {
	b := a.Addr().As16()
	return binary.BigEndian.Uint64(b[4:]), int(b[15])
}

// checkSnapshot verifies that everything s answers belongs to generation
// s.Version() and matches gen exactly. want is gen(s.Version()).
func checkSnapshot(s *Snapshot, want []Backend, key []byte) error {
	v := s.Version()
	if v == 0 {
		if s.Len() != 0 {
			return fmt.Errorf("version 0 has %d backends", s.Len())
		}
		return nil
	}
	bs := s.Backends()
	if len(bs) != len(want) {
		return fmt.Errorf("version %d: %d backends, want %d", v, len(bs), len(want))
	}
	for _, b := range bs {
		gv, i := genOf(b.Addr)
		if gv != v || i >= len(want) || want[i] != b {
			return fmt.Errorf("version %d holds %+v (generation %d)", v, b, gv)
		}
		got, ok := s.Backend(b.Ordinal)
		if !ok || *got != b {
			return fmt.Errorf("version %d: Backend(%d) = %+v", v, b.Ordinal, got)
		}
		if s.IsBackend(b.Addr) != b.State.Serving() {
			return fmt.Errorf("version %d: IsBackend(%v) wrong", v, b.Addr)
		}
	}
	if v > 1 {
		// Generation v-1's first address, which was always ready.
		old := want[0].Addr
		a := old.Addr().As16()
		binary.BigEndian.PutUint64(a[4:], v-1)
		old = netip.AddrPortFrom(netip.AddrFrom16(a), old.Port())
		if s.IsBackend(old) {
			return fmt.Errorf("version %d accepts generation %d's %v", v, v-1, old)
		}
	}
	p, ok := s.PickNew(key)
	if !ok {
		return fmt.Errorf("version %d: no pick", v)
	}
	if gv, _ := genOf(p.Addr); gv != v || p.State != Ready {
		return fmt.Errorf("version %d picked %+v", v, p)
	}
	return nil
}

// Many readers route while a writer publishes thousands of generations.
// Each reader checks that all it reads from one snapshot is that
// generation's, so a torn or mutated snapshot, or a table shared with the
// wrong generation, fails the test; -race checks the memory model.
func TestConcurrentPublish(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	const generations = 2000
	var (
		done    atomic.Bool
		wg      sync.WaitGroup
		seen    atomic.Uint64
		failed  atomic.Bool
		readers = max(4, 2*runtime.GOMAXPROCS(0))
	)
	for g := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				last uint64
				want []Backend
			)
			key := make([]byte, 8)
			for n := uint64(0); ; n++ {
				stop := done.Load() // read before the last check, so the final snapshot is checked too
				s := r.Snapshot()
				if n == 0 || s.Version() != last {
					want = gen(s.Version())
				}
				binary.BigEndian.PutUint64(key, n*uint64(readers)+uint64(g))
				if err := checkSnapshot(s, want, key); err != nil {
					if !failed.Swap(true) {
						t.Error(err)
					}
					return
				}
				if s.Version() < last {
					t.Errorf("version went back from %d to %d", last, s.Version())
					return
				}
				if s.Version() != last {
					seen.Add(1)
				}
				last = s.Version()
				if stop {
					return
				}
				runtime.Gosched() // let the writer run on a small machine
			}
		}()
	}
	for v := uint64(1); v <= generations && !failed.Load(); v++ {
		if err := r.Update(gen(v)); err != nil {
			t.Fatal(err)
		}
	}
	done.Store(true)
	wg.Wait()
	equal(t, r.Snapshot().Version(), uint64(generations))
	t.Logf("%d readers saw %d version changes", readers, seen.Load())
}

// Two services, each with its own registry and source: one's source fails
// and its registry goes stale; the other keeps routing and stays fresh.
func TestServicesIsolated(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := newFakeClock() // one clock for both: time passes for everyone
	mk := func(name string) *Registry {
		r, err := New(Config{Service: name, MaxAge: time.Hour, Logger: quietLogger(), now: clk.Now})
		noErr(t, err)
		t.Cleanup(r.Close)
		return r
	}
	a, b := mk("a"), mk("b")
	shared := []Backend{{Ordinal: 0, Addr: ap("10.0.0.1:5684")}} // same backends, still separate
	noErr(t, a.Update(shared))
	noErr(t, b.Update(shared))

	// a's source dies with an error; b's keeps confirming.
	failing := SourceFunc(func(ctx context.Context, u Updater) error {
		return u.Update([]Backend{{Ordinal: 1, Addr: ap("0.0.0.0:1")}})
	})
	isErr(t, failing.Run(ctx, a), ErrUnspecifiedAddr)
	clk.Add(2 * time.Hour)
	b.Confirm()
	a.checkFreshness()
	b.checkFreshness()
	truth(t, a.Stale(), "a is stale")
	truth(t, !b.Stale(), "b is not")
	bb, ok := b.Snapshot().PickNew([]byte("key"))
	truth(t, ok && bb.Ordinal == 0, "b still takes new sessions")
	_, ok = a.Snapshot().Serving(0)
	truth(t, ok, "a still routes CIDs")
	equal(t, a.Stats().Rejections, uint64(1))
	equal(t, b.Stats().Rejections, uint64(0))
}

func TestStats(t *testing.T) {
	r, clk := newTestRegistry(t, time.Hour)
	noErr(t, r.Update([]Backend{
		{Ordinal: 0, Addr: ap("10.0.0.1:1")},
		{Ordinal: 1, Addr: ap("10.0.0.2:1")},
		{Ordinal: 2, Addr: ap("10.0.0.3:1"), State: Draining},
		{Ordinal: 3, Addr: ap("10.0.0.4:1"), State: Gone},
	}))
	_ = r.Update([]Backend{{Ordinal: 255}})
	r.Confirm()
	clk.Add(time.Minute)
	st := r.Stats()
	want := Stats{
		Service: "test", Version: 1, Updates: 1, Rejections: 1, Confirmations: 1,
		LastConfirmed: clk.Now().Add(-time.Minute), Age: time.Minute,
		Ready: 2, Draining: 1, Gone: 1,
	}
	equal(t, st, want)
}

func BenchmarkUpdate(b *testing.B) {
	// Alternating lists whose ready sets differ: the HRW table is rebuilt
	// every time.
	b.Run("rebuild", func(b *testing.B) {
		r, _ := newTestRegistry(b, 0)
		bs := [2][]Backend{manyBackends(254), manyBackends(254)}
		bs[1][0].State = Draining
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			noErr(b, r.Update(bs[i&1]))
			i++
		}
	})
	// Only a draining backend changes: the table is reused.
	b.Run("reuse", func(b *testing.B) {
		r, _ := newTestRegistry(b, 0)
		bs := [2][]Backend{manyBackends(254), manyBackends(254)}
		bs[0][0].State = Draining
		bs[1][0].State = Gone
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			noErr(b, r.Update(bs[i&1]))
			i++
		}
	})
}

func BenchmarkStale(b *testing.B) {
	r, _ := newTestRegistry(b, time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		sinkOK = r.Stale()
	}
}

func BenchmarkSnapshot(b *testing.B) {
	r, _ := newTestRegistry(b, 0)
	noErr(b, r.Update(manyBackends(254)))
	b.ReportAllocs()
	for b.Loop() {
		sinkB, sinkOK = r.Snapshot().Serving(3)
	}
}

// TestEmptyListRefused: an empty list is refused by every path into a
// registry (Validate, DecodeBackends, Update: inline config, -check, the
// file source, Kubernetes), counted, and the previous snapshot stays. Its
// meaning, "every session is dead", is said by marking backends gone.
func TestEmptyListRefused(t *testing.T) {
	isErr(t, Validate(nil), ErrEmptyList)
	_, err := DecodeBackends(strings.NewReader(" [ ] "))
	isErr(t, err, ErrEmptyList)
	r, _ := newTestRegistry(t, 0)
	noErr(t, r.Update([]Backend{{Ordinal: 1, Addr: ap("10.0.0.1:5684")}}))
	before := r.Snapshot()
	isErr(t, r.Update(nil), ErrEmptyList)
	isErr(t, r.Update([]Backend{}), ErrEmptyList)
	truth(t, r.Snapshot() == before, "the previous snapshot stays")
	equal(t, r.Stats().Rejections, uint64(2))
	noErr(t, r.Update([]Backend{{Ordinal: 1, Addr: ap("10.0.0.1:5684"), State: Gone}}))
}

// TestNewTinyMaxAge: a freshness limit below what any source can confirm
// is refused instead of flapping stale and fresh.
func TestNewTinyMaxAge(t *testing.T) {
	for _, d := range []time.Duration{1, 4, time.Microsecond, time.Millisecond - 1} {
		_, err := New(Config{MaxAge: d, Logger: quietLogger()})
		isErr(t, err, ErrConfig, "MaxAge %v", d)
	}
	r, err := New(Config{MaxAge: time.Millisecond, Logger: quietLogger()})
	noErr(t, err)
	r.Close()
}

// TestNewStatic: one call builds a registry serving the list, validated as
// Update validates; a freshness limit, which nothing would meet, is refused.
func TestNewStatic(t *testing.T) {
	r, err := NewStatic(Config{Service: "s", Seed: 3, Logger: quietLogger()}, []Backend{
		{Ordinal: 0, Addr: ap("10.0.0.1:5684")},
		{Ordinal: 1, Addr: ap("10.0.0.2:5684"), Weight: 2, State: Draining},
	})
	noErr(t, err)
	defer r.Close()
	s := r.Snapshot()
	equal(t, s.Version(), uint64(1))
	equal(t, s.Table().Seed(), uint64(3))
	b, ok := s.Serving(1)
	truth(t, ok && b.State == Draining && b.Weight == 2, "ordinal 1: %+v", b)
	truth(t, !r.Stale(), "a static registry is never stale")

	_, err = NewStatic(Config{Logger: quietLogger()}, []Backend{
		{Ordinal: 0, Addr: ap("10.0.0.1:5684")}, {Ordinal: 0, Addr: ap("10.0.0.2:5684")}})
	isErr(t, err, ErrDuplicateOrdinal)
	_, err = NewStatic(Config{Logger: quietLogger()}, nil)
	isErr(t, err, ErrEmptyList)
	_, err = NewStatic(Config{MaxAge: time.Second, Logger: quietLogger()}, []Backend{{Ordinal: 0, Addr: ap("10.0.0.1:5684")}})
	isErr(t, err, ErrConfig)
}
