package registry

import (
	"encoding/binary"
	"testing"
)

// picked returns the ordinals PickNew chooses for 1000 keys.
func picked(s *Snapshot) map[uint8]int {
	got := map[uint8]int{}
	for i := range 1000 {
		var k [4]byte
		binary.BigEndian.PutUint32(k[:], uint32(i))
		if b, ok := s.PickNew(k[:]); ok {
			got[b.Ordinal]++
		}
	}
	return got
}

// A backend marked down takes no new sessions and keeps its CID route and
// its replies; only its own keys move (HRW), and marking it up restores the
// placement exactly. The mark follows the backend's address through source
// updates and dies with it.
func TestSetDown(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	bs := manyBackends(4)
	noErr(t, r.Update(bs))
	before := r.Snapshot()
	v := before.Version()
	m := r.TakeMarks(nil)
	equal(t, r.Snapshot().Version(), v, "no marks, no new snapshot")

	truth(t, !m.SetDown(2, ap("10.9.9.9:5684"), true), "an address the backend does not have is not marked")
	truth(t, m.SetDown(2, bs[2].Addr, true), "marking down publishes")
	truth(t, !m.SetDown(2, bs[2].Addr, true), "twice is no change")
	s := r.Snapshot()
	equal(t, s.Version(), v+1, "a health change is a new version")
	b, ok := s.Serving(2)
	truth(t, ok && b.State == Draining && s.Down(2), "down: served as draining, CID route kept")
	truth(t, s.IsBackend(bs[2].Addr), "its replies still pass")
	equal(t, s.CountDown(), 1)
	equal(t, s.Count(Ready), 3)
	p0, p1 := picked(before), picked(s)
	equal(t, p1[2], 0, "no new session to the down backend")
	for key := range 1000 { // only the down backend's keys move
		var k [4]byte
		binary.BigEndian.PutUint32(k[:], uint32(key))
		a, _ := before.PickNew(k[:])
		c, _ := s.PickNew(k[:])
		truth(t, a.Ordinal == 2 || a.Ordinal == c.Ordinal, "key %d moved from %d to %d", key, a.Ordinal, c.Ordinal)
	}
	truth(t, p0[2] > 0)
	st := r.Stats()
	equal(t, [4]int{st.Ready, st.Draining, st.Down, st.Gone}, [4]int{3, 0, 1, 0})

	// The source repeating itself keeps the mark.
	noErr(t, r.Update(bs))
	truth(t, r.Snapshot().Down(2), "kept through an update with the same address")

	// Up again: the placement is the original one.
	truth(t, m.SetDown(2, bs[2].Addr, false))
	equal(t, picked(r.Snapshot()), p0)
	truth(t, !r.Snapshot().Down(2))

	// Draining by the source and down: one routing state; the mark waits
	// and applies when the source makes it ready again.
	truth(t, m.SetDown(1, bs[1].Addr, true))
	dr := manyBackends(4)
	dr[1].State = Draining
	noErr(t, r.Update(dr))
	st = r.Stats()
	equal(t, [4]int{st.Ready, st.Draining, st.Down, st.Gone}, [4]int{3, 1, 0, 0}, "draining by the source")
	noErr(t, r.Update(bs))
	truth(t, r.Snapshot().Down(1), "ready by the source again, still down")

	// A new address is a new backend: the mark goes.
	moved := manyBackends(4)
	moved[1].Addr = ap("10.2.0.1:5684")
	noErr(t, r.Update(moved))
	truth(t, !r.Snapshot().Down(1), "the mark does not follow the ordinal to a new address")
	noErr(t, r.Update(bs))
	truth(t, !r.Snapshot().Down(1), "nor come back with the old address")

	// Every ready backend down: nothing takes new sessions, CIDs still route.
	for _, b := range bs {
		m.SetDown(b.Ordinal, b.Addr, true)
	}
	s = r.Snapshot()
	_, ok = s.PickNew([]byte("k"))
	truth(t, !ok, "no ready backend")
	_, ok = s.Serving(0)
	truth(t, ok)
	equal(t, r.Stats().Ready, 0)
}

// Marks belong to the checker that set them: a retired Marks takes every
// mark away, a draining or gone backend's too, and can set none again;
// taking new Marks retires the old ones in the same snapshot, with the
// marks handed over; marks taken before the first list wait for it.
func TestMarksOwnership(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	bs := manyBackends(4)
	pending := r.TakeMarks([]Backend{bs[1], {Ordinal: 9, Addr: ap("10.9.9.9:1")}})
	equal(t, r.Snapshot().Version(), uint64(0), "nothing published before the source's first list")
	noErr(t, r.Update(bs))
	truth(t, r.Snapshot().Down(1), "a mark taken before the first list applies to it")
	pending.Release()
	truth(t, !r.Snapshot().Down(1))

	a := r.TakeMarks(nil)
	truth(t, a.SetDown(0, bs[0].Addr, true))
	truth(t, a.SetDown(1, bs[1].Addr, true))
	a.SetDown(2, bs[2].Addr, true)
	st := manyBackends(4)
	st[1].State, st[2].State = Draining, Gone
	noErr(t, r.Update(st)) // marks on a draining and a gone backend wait quietly
	equal(t, r.Stats().Down, 1)
	v := r.Snapshot().Version()
	a.Release()
	truth(t, r.Snapshot().Version() == v+1 && r.Stats().Down == 0, "released: the ready backend's mark is lifted")
	truth(t, !a.Live())
	noErr(t, r.Update(bs))
	equal(t, r.Stats().Ready, 4, "and so are those of the draining and the gone backend")
	truth(t, !a.SetDown(0, bs[0].Addr, true), "a retired Marks sets nothing")
	equal(t, r.Stats().Down, 0)
	a.Release() // idempotent

	b := r.TakeMarks(nil)
	truth(t, b.SetDown(3, bs[3].Addr, true))
	c := r.TakeMarks([]Backend{bs[0], {Ordinal: 3, Addr: ap("10.9.9.9:1")}})
	truth(t, !b.Live() && c.Live())
	s := r.Snapshot()
	truth(t, s.Down(0) && !s.Down(3), "the new Marks start with what was handed over, at the listed address only")
	b.Release()
	truth(t, r.Snapshot().Down(0), "releasing a retired Marks touches nothing")
	truth(t, !b.SetDown(1, bs[1].Addr, true))
	c.Release()
	equal(t, r.Stats().Down, 0)
}
