package registry

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
)

// backendsFromBytes turns fuzz input into a backend list, 7 bytes an entry:
// ordinal, flags (bits 0–1 state, bit 2 IPv6, bit 3 IPv4-mapped form, bits
// 4–7 weight), then three address bytes and a big-endian port. The address
// space is small so that duplicates, unspecified, multicast and broadcast
// addresses come up often.
func backendsFromBytes(data []byte) []Backend {
	var bs []Backend
	for ; len(data) >= 7 && len(bs) < 300; data = data[7:] {
		ord, fl, hi, b, a := data[0], data[1], data[2], data[3], data[4]
		var addr netip.Addr
		switch {
		case fl&4 != 0:
			addr = netip.AddrFrom16([16]byte{0: hi, 14: b, 15: a})
		case fl&8 != 0:
			addr = netip.AddrFrom16(netip.AddrFrom4([4]byte{hi, 0, b, a}).As16())
		default:
			addr = netip.AddrFrom4([4]byte{hi, hi, b, a})
		}
		bs = append(bs, Backend{
			Ordinal: ord,
			Addr:    netip.AddrPortFrom(addr, binary.BigEndian.Uint16(data[5:7])),
			Weight:  uint32(fl >> 4),
			State:   State(fl & 3),
		})
	}
	return bs
}

// refValid is a naive validator to cross-check Validate.
func refValid(bs []Backend) bool {
	if len(bs) == 0 {
		return false
	}
	for i, b := range bs {
		a := b.Addr.Addr().Unmap()
		if b.Ordinal == 255 || !a.IsValid() || a.IsUnspecified() || a.IsMulticast() ||
			a == netip.MustParseAddr("255.255.255.255") || b.Addr.Port() == 0 || b.State > Gone {
			return false
		}
		for _, c := range bs[:i] {
			if c.Ordinal == b.Ordinal || c.Addr.Addr().Unmap() == a && c.Addr.Port() == b.Addr.Port() {
				return false
			}
		}
	}
	return true
}

// checkInvariants compares everything s answers with a linear scan of the
// list it was built from.
func checkInvariants(s *Snapshot, in []Backend) error {
	if s.Len() != len(in) {
		return fmt.Errorf("%d backends, want %d", s.Len(), len(in))
	}
	var counts [3]int
	for i, b := range s.Backends() {
		if i > 0 && s.Backends()[i-1].Ordinal >= b.Ordinal {
			return fmt.Errorf("not sorted at %d", i)
		}
		counts[b.State]++
	}
	for st := Ready; st <= Gone; st++ {
		if s.Count(st) != counts[st] {
			return fmt.Errorf("Count(%v) = %d, want %d", st, s.Count(st), counts[st])
		}
	}
	for o := range 256 {
		var want *Backend
		for _, b := range in {
			if int(b.Ordinal) == o {
				n := b.normalize()
				want = &n
			}
		}
		got, ok := s.Backend(uint8(o))
		if (want == nil) == ok || ok && *got != *want {
			return fmt.Errorf("Backend(%d) = %+v, %v; want %+v", o, got, ok, want)
		}
		if sv, sok := s.Serving(uint8(o)); sok != (ok && got.State.Serving()) || sok && sv != got {
			return fmt.Errorf("Serving(%d) = %v", o, sok)
		}
	}
	for _, b := range in {
		a := b.Addr.Addr()
		for _, q := range []netip.AddrPort{
			b.Addr,
			netip.AddrPortFrom(a.Unmap(), b.Addr.Port()),
			netip.AddrPortFrom(netip.AddrFrom16(a.As16()), b.Addr.Port()),
			netip.AddrPortFrom(a, b.Addr.Port()+1),
		} {
			want := false
			for _, c := range in {
				c = c.normalize()
				want = want || c.State.Serving() && c.Addr == netip.AddrPortFrom(q.Addr().Unmap(), q.Port())
			}
			if s.IsBackend(q) != want {
				return fmt.Errorf("IsBackend(%v) = %v, want %v", q, !want, want)
			}
		}
	}
	for k := range 16 {
		key := []byte{byte(k), 1, 2, 3}
		b, ok := s.PickNew(key)
		if ok != (counts[Ready] > 0) || ok && b.State != Ready {
			return fmt.Errorf("PickNew = %+v, %v with %d ready", b, ok, counts[Ready])
		}
	}
	return nil
}

// FuzzUpdate: Update agrees with a naive validator, a rejected update leaves
// the previous snapshot, an accepted one answers like a linear scan.
func FuzzUpdate(f *testing.F) {
	f.Add([]byte("\x00\x00\x0a\x00\x01\x16\x34\x01\x01\x0a\x00\x02\x16\x34"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, _ := newTestRegistry(t, 0)
		noErr(t, r.Update(gen(1)))
		prev := r.Snapshot()
		bs := backendsFromBytes(data)
		err := r.Update(bs)
		if ok := refValid(bs); ok != (err == nil) {
			t.Fatalf("Update error %v, reference says valid=%v for %+v", err, ok, bs)
		}
		if err != nil {
			truth(t, wrapsSentinel(err), "%v wraps no sentinel", err)
			truth(t, r.Snapshot() == prev, "rejected update replaced the snapshot")
			equal(t, r.Stats().Rejections, uint64(1))
			return
		}
		if err := checkInvariants(r.Snapshot(), bs); err != nil {
			t.Fatal(err)
		}
	})
}
