package registry

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cidroute/cidroute/hrw"
)

func TestSnapshotLookups(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	noErr(t, r.Update([]Backend{
		{Ordinal: 7, Addr: ap("10.0.0.7:5684"), State: Gone},
		{Ordinal: 2, Addr: ap("10.0.0.2:5684"), Weight: 3},
		{Ordinal: 4, Addr: ap("[fd00::4]:5684"), State: Draining},
		{Ordinal: 0, Addr: ap("[::ffff:10.0.0.100]:5684")},
	}))
	s := r.Snapshot()
	equal(t, s.Version(), 1)

	// Sorted by ordinal, normalized (weight 0 → 1, 4in6 unmapped).
	want := []Backend{
		{Ordinal: 0, Addr: ap("10.0.0.100:5684"), Weight: 1, State: Ready},
		{Ordinal: 2, Addr: ap("10.0.0.2:5684"), Weight: 3, State: Ready},
		{Ordinal: 4, Addr: ap("[fd00::4]:5684"), Weight: 1, State: Draining},
		{Ordinal: 7, Addr: ap("10.0.0.7:5684"), Weight: 1, State: Gone},
	}
	equal(t, s.Backends(), want)
	equal(t, s.Len(), 4)
	equal(t, s.Count(Ready), 2)
	equal(t, s.Count(Draining), 1)
	equal(t, s.Count(Gone), 1)
	equal(t, s.Count(State(9)), 0)

	for o := range 256 {
		b, ok := s.Backend(uint8(o))
		sb, sok := s.Serving(uint8(o))
		switch o {
		case 0, 2, 4:
			truth(t, ok)
			truth(t, sok)
			truth(t, b == sb)
			equal(t, int(b.Ordinal), o)
		case 7:
			truth(t, ok)
			equal(t, b.State, Gone)
			truth(t, !(sok), "gone is not serving")
		default:
			truth(t, !(ok), "ordinal %d", o)
			truth(t, !(sok), "ordinal %d", o)
		}
	}

	// IsBackend: ready and draining yes, gone no, 4in6 and IPv4 forms alike.
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"10.0.0.100:5684", true},
		{"[::ffff:10.0.0.100]:5684", true},
		{"10.0.0.2:5684", true},
		{"[::ffff:10.0.0.2]:5684", true},
		{"[fd00::4]:5684", true},
		{"10.0.0.7:5684", false}, // gone
		{"10.0.0.2:5685", false},
		{"10.0.0.3:5684", false},
		{"[fd00::4%eth0]:5684", false},
		{"[fd00::5]:5684", false},
	} {
		equal(t, s.IsBackend(ap(c.addr)), c.want, c.addr)
		b, ok := s.BackendByAddr(ap(c.addr))
		equal(t, ok, c.want, c.addr)
		if ok {
			equal(t, b.Addr.Addr(), ap(c.addr).Addr().Unmap())
		}
	}
	truth(t, !(s.IsBackend(netip.AddrPort{})))

	// PickNew only ever returns ready backends, and is deterministic.
	seen := map[uint8]int{}
	for i := range 2000 {
		var k [8]byte
		binary.BigEndian.PutUint64(k[:], uint64(i))
		b, ok := s.PickNew(k[:])
		truth(t, ok)
		equal(t, b.State, Ready)
		b2, _ := s.PickNew(k[:])
		truth(t, b == b2)
		seen[b.Ordinal]++
	}
	equal(t, len(seen), 2, "both ready backends take keys")
	truth(t, seen[2] > seen[0], "weight 3 beats weight 1: %v", seen)

	b, ok := s.PickNewAddrs(ap("192.0.2.1:40000"), ap("198.51.100.1:5684"))
	truth(t, ok)
	equal(t, b.State, Ready)
}

func TestSnapshotZoneAndEmpty(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	s := r.Snapshot()
	equal(t, s.Version(), 0)
	equal(t, len(s.Backends()), 0)
	_, ok := s.PickNew([]byte("k"))
	truth(t, !(ok))
	_, ok = s.PickNewAddrs(ap("192.0.2.1:1"), ap("192.0.2.2:2"))
	truth(t, !(ok))
	truth(t, !(s.IsBackend(ap("10.0.0.1:1"))))
	_, ok = s.Backend(0)
	truth(t, !(ok))

	// Addresses that differ only by zone are different backends.
	noErr(t, r.Update([]Backend{
		{Ordinal: 1, Addr: ap("[fe80::1%eth0]:5684")},
		{Ordinal: 2, Addr: ap("[fe80::1%eth1]:5684")},
		{Ordinal: 3, Addr: ap("[fe80::1]:5684"), State: Draining},
	}))
	s = r.Snapshot()
	for o, a := range map[uint8]string{1: "[fe80::1%eth0]:5684", 2: "[fe80::1%eth1]:5684", 3: "[fe80::1]:5684"} {
		b, ok := s.BackendByAddr(ap(a))
		truth(t, ok, a)
		equal(t, b.Ordinal, o)
	}
	truth(t, !(s.IsBackend(ap("[fe80::1%eth2]:5684"))))

	// No ready backend: nothing to pick, but draining ones still serve.
	noErr(t, r.Update([]Backend{{Ordinal: 1, Addr: ap("10.0.0.1:1"), State: Draining}}))
	s = r.Snapshot()
	_, ok = s.PickNew([]byte("k"))
	truth(t, !(ok))
	_, ok = s.Serving(1)
	truth(t, ok)
}

// The address table against a linear scan, on many backends with clustered
// addresses, so that chains form.
func TestAddrTableMatchesScan(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	bs := make([]Backend, 0, 255)
	for i := range 255 {
		var a netip.Addr
		switch i % 3 {
		case 0:
			a = netip.AddrFrom4([4]byte{127, 0, 0, 1}) // same IP, ports differ
		case 1:
			a = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		default:
			a = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
		}
		bs = append(bs, Backend{Ordinal: uint8(i), Addr: netip.AddrPortFrom(a, uint16(5000+i)), State: State(i % 3)})
	}
	noErr(t, r.Update(bs))
	s := r.Snapshot()
	for _, b := range bs {
		for _, port := range []uint16{b.Addr.Port(), b.Addr.Port() + 1} {
			q := netip.AddrPortFrom(b.Addr.Addr(), port)
			want := -1
			for j, c := range s.Backends() {
				if c.Addr == q && c.State.Serving() {
					want = j
				}
			}
			got, ok := s.BackendByAddr(q)
			if want < 0 {
				truth(t, !(ok), q)
				continue
			}
			truth(t, ok, q)
			truth(t, &s.Backends()[want] == got, q)
		}
	}
}

func TestSnapshotNoAllocs(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	noErr(t, r.Update(manyBackends(254)))
	s := r.Snapshot()
	key := []byte("0123456789ab")
	hit, miss := s.Backends()[100].Addr, ap("[fd00::1]:5684")
	client, service := ap("192.0.2.1:40000"), ap("198.51.100.1:5684")
	for name, f := range map[string]func(){
		"Snapshot":     func() { _ = r.Snapshot() },
		"Stale":        func() { _ = r.Stale() },
		"Backend":      func() { _, _ = s.Backend(100) },
		"Serving":      func() { _, _ = s.Serving(100) },
		"IsBackend":    func() { _ = s.IsBackend(hit) || s.IsBackend(miss) },
		"PickNew":      func() { _, _ = s.PickNew(key) },
		"PickNewAddrs": func() { _, _ = s.PickNewAddrs(client, service) },
		"Backends":     func() { _ = s.Backends() },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs, want 0", name, n)
		}
	}
}

func benchSnapshot(b *testing.B) *Snapshot {
	r, _ := newTestRegistry(b, 0)
	noErr(b, r.Update(manyBackends(254)))
	return r.Snapshot()
}

var sinkB *Backend
var sinkOK bool

func BenchmarkBackend(b *testing.B) {
	s := benchSnapshot(b)
	b.ReportAllocs()
	var o uint8
	for b.Loop() {
		sinkB, sinkOK = s.Serving(o)
		o++
	}
}

func BenchmarkIsBackend(b *testing.B) {
	s := benchSnapshot(b)
	addrs := make([]netip.AddrPort, 0, 512)
	for _, be := range s.Backends() {
		addrs = append(addrs, be.Addr, netip.AddrPortFrom(be.Addr.Addr(), 1)) // hit, miss
	}
	addrs = append(addrs, addrs[:512-len(addrs)]...)
	b.Run("table", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			sinkOK = s.IsBackend(addrs[i&511])
			i++
		}
	})
	b.Run("ipv6", func(b *testing.B) {
		r, _ := newTestRegistry(b, 0)
		bs := manyBackends(254)
		for i := range bs {
			bs[i].Addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 8: 1, 14: byte(i >> 8), 15: byte(i)}), 443)
		}
		noErr(b, r.Update(bs))
		s := r.Snapshot()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			sinkOK = s.IsBackend(bs[i&127].Addr)
			i++
		}
	})
	// The alternative the table is measured against.
	b.Run("map", func(b *testing.B) {
		m := make(map[netip.AddrPort]uint8)
		for i, be := range s.Backends() {
			m[be.Addr] = uint8(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			a := addrs[i&511]
			if a.Addr().Is4In6() {
				a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
			}
			_, sinkOK = m[a]
			i++
		}
	})
}

func BenchmarkPickNew(b *testing.B) {
	s := benchSnapshot(b)
	key := []byte("0123456789ab") // a QUIC client DCID
	b.SetBytes(int64(len(key)))
	b.ReportAllocs()
	for b.Loop() {
		sinkB, sinkOK = s.PickNew(key)
		key[0]++
	}
}

func BenchmarkPickNewAddrs(b *testing.B) {
	s := benchSnapshot(b)
	client, service := ap("192.0.2.1:40000"), ap("198.51.100.1:5684")
	b.ReportAllocs()
	for b.Loop() {
		sinkB, sinkOK = s.PickNewAddrs(client, service)
	}
}

// The HRW table is shared with the previous snapshot exactly when the ready
// backends and their weights are unchanged.
func TestTableReuse(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	base := manyBackends(5)
	noErr(t, r.Update(base))
	s1 := r.Snapshot()

	same := manyBackends(5)
	same = append(same, Backend{Ordinal: 9, Addr: ap("10.9.9.9:1"), State: Draining})
	same[2].Addr = ap("10.2.2.2:2") // addresses do not matter to HRW
	noErr(t, r.Update(same))
	s2 := r.Snapshot()
	truth(t, s2.pick == s1.pick, "same ready set: table reused")

	for name, change := range map[string]func([]Backend){
		"weight":   func(bs []Backend) { bs[1].Weight = 7 },
		"draining": func(bs []Backend) { bs[1].State = Draining },
		"ordinal":  func(bs []Backend) { bs[1].Ordinal = 77 },
	} {
		bs := manyBackends(5)
		change(bs)
		noErr(t, r.Update(bs))
		truth(t, r.Snapshot().pick != s2.pick, name)
		noErr(t, r.Update(same))
		s2 = r.Snapshot()
	}
}

// TestZeroWeightAgrees: weight 0 means 1 in a Backend and in an
// hrw.Candidate alike, so a table built by hand from a snapshot's backends,
// zero weights and all, picks what the snapshot picks.
func TestZeroWeightAgrees(t *testing.T) {
	r, _ := newTestRegistry(t, 0)
	bs := []Backend{{Ordinal: 0, Addr: ap("10.0.0.1:1")}, {Ordinal: 1, Addr: ap("10.0.0.2:1"), Weight: 2}, {Ordinal: 5, Addr: ap("10.0.0.3:1")}}
	noErr(t, r.Update(bs))
	var cands []hrw.Candidate
	for _, b := range bs {
		cands = append(cands, hrw.Candidate{Ordinal: b.Ordinal, Weight: b.Weight})
	}
	tb, err := hrw.New(r.Snapshot().Table().Seed(), cands)
	noErr(t, err)
	var want, got [hrw.Buckets]uint8
	tb.Owners(&want)
	r.Snapshot().Table().Owners(&got)
	truth(t, want == got, "a zero Backend weight is not a zero hrw.Candidate weight")
	b, _ := r.Snapshot().Backend(0)
	equal(t, b.Weight, uint32(1))
}
