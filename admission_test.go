package cidroute

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAdmissionOff(t *testing.T) {
	assert.Nil(t, NewAdmission(Limits{}, 4), "no limits: no stage, no clock, no table")
}

func countAdmitted(a *Admission, c Class, client netip.AddrPort, start int64, n int, every time.Duration) int {
	ok := 0
	for i := range n {
		if a.Admit(c, client, start+int64(i)*int64(every)) {
			ok++
		}
	}
	return ok
}

func TestAdmissionRates(t *testing.T) {
	const sec = int64(time.Second)
	hello := Class{Kind: KindNew, Handshake: true}
	data := Class{Kind: KindEstablished}
	zero := Class{Kind: KindNew, ZeroRTT: true}

	t.Run("global: a burst of one second, then the rate", func(t *testing.T) {
		a := NewAdmission(Limits{GlobalPPS: 100}, 1)
		assert.Equal(t, 100, countAdmitted(a, data, client1, sec, 1000, 0))
		// 10 s at 1000 pps offered: 100 pps pass.
		got := countAdmitted(a, data, client1, 2*sec, 10000, time.Millisecond)
		assert.InDelta(t, 1100, got, 15) // a refilled burst, then 100 pps
	})
	t.Run("global is shared out over workers", func(t *testing.T) {
		a := NewAdmission(Limits{GlobalPPS: 100}, 4)
		assert.Equal(t, 25, countAdmitted(a, data, client1, sec, 1000, 0))
	})
	t.Run("per source: a flooding source does not starve another", func(t *testing.T) {
		a := NewAdmission(Limits{PerSourcePPS: 10}, 4)
		flood := netip.MustParseAddrPort("203.0.113.1:1")
		assert.Equal(t, 10, countAdmitted(a, data, flood, sec, 500, 0), "per-source rate is not divided by workers")
		assert.Equal(t, 10, countAdmitted(a, data, client1, sec, 10, 0))
	})
	t.Run("handshake and 0-RTT limits apply to their classes only", func(t *testing.T) {
		a := NewAdmission(Limits{HandshakePPS: 5, ZeroRTTPPS: 3}, 1)
		assert.Equal(t, 5, countAdmitted(a, hello, client1, sec, 50, 0))
		assert.Equal(t, 3, countAdmitted(a, zero, client1, sec, 50, 0))
		assert.Equal(t, 50, countAdmitted(a, data, client1, sec, 50, 0), "established traffic is not a handshake")
	})
	t.Run("a refused datagram costs no other bucket", func(t *testing.T) {
		a := NewAdmission(Limits{GlobalPPS: 10, HandshakePPS: 2}, 1)
		countAdmitted(a, hello, client1, sec, 100, 0) // 2 pass, 98 refused by the handshake limit
		assert.Equal(t, 8, countAdmitted(a, data, client1, sec, 100, 0))
	})
	t.Run("clock going backwards is harmless", func(t *testing.T) {
		a := NewAdmission(Limits{GlobalPPS: 10}, 1)
		countAdmitted(a, data, client1, 10*sec, 10, 0)
		assert.False(t, a.Admit(data, client1, 5*sec))
	})
}

func TestAdmissionSourceTableBounded(t *testing.T) {
	a := NewAdmission(Limits{PerSourcePPS: 1}, 1)
	require.Len(t, a.sources, sourceSlots)
	for i := range 100000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 1)
		a.Admit(Class{}, c, 1)
	}
	assert.Len(t, a.sources, sourceSlots, "memory does not grow with sources")
}

// TestAdmissionSourceSlotsSeeded: which sources share a slot differs
// from one Admission to the next, so that nobody can compute offline the
// sources that reset a victim's bucket.
func TestAdmissionSourceSlotsSeeded(t *testing.T) {
	a := NewAdmission(Limits{PerSourcePPS: 1}, 1)
	victim := netip.MustParseAddrPort("192.0.2.1:5684")
	var twins []netip.AddrPort // sources in the victim's slot of a
	for i := 0; len(twins) < 8; i++ {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 1)
		if a.slot(c) == a.slot(victim) {
			twins = append(twins, c)
		}
	}
	b := NewAdmission(Limits{PerSourcePPS: 1}, 1)
	shared := 0
	for _, c := range twins {
		if b.slot(c) == b.slot(victim) {
			shared++
		}
	}
	assert.Less(t, shared, len(twins), "another Admission puts every one of a's twins of the victim in its slot too")
}

func TestAdmissionNoAllocs(t *testing.T) {
	a := NewAdmission(Limits{GlobalPPS: 1000, PerSourcePPS: 100, HandshakePPS: 10, ZeroRTTPPS: 10}, 2)
	c := Class{Kind: KindNew, Handshake: true, ZeroRTT: true}
	if n := testing.AllocsPerRun(100, func() { a.Admit(c, client1, 1) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

func BenchmarkAdmit(b *testing.B) {
	a := NewAdmission(Limits{GlobalPPS: 1 << 30, PerSourcePPS: 1 << 30, HandshakePPS: 1 << 30}, 1)
	c := Class{Kind: KindNew, Handshake: true}
	b.ReportAllocs()
	var now int64
	for b.Loop() {
		now++
		a.Admit(c, client1, now)
	}
}
