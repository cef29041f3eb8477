package cidroute

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/cespare/xxhash/v2"

	"github.com/cidroute/cidroute/internal/addr"
)

// Limits are a service's optional admission limits, in datagrams per
// second; 0 turns a limit off. Each limit allows bursts of one second's
// worth. With every limit off the packet path reads no clock and touches
// no table.
type Limits struct {
	GlobalPPS    int // all datagrams of the service
	PerSourcePPS int // datagrams of one client address (IP and port)
	HandshakePPS int // datagrams that start a handshake (DTLS ClientHello, QUIC Initial)
	ZeroRTTPPS   int // datagrams carrying QUIC 0-RTT
}

func (l Limits) off() bool {
	return l.GlobalPPS == 0 && l.PerSourcePPS == 0 && l.HandshakePPS == 0 && l.ZeroRTTPPS == 0
}

func (l Limits) validate() error {
	if l.GlobalPPS < 0 || l.PerSourcePPS < 0 || l.HandshakePPS < 0 || l.ZeroRTTPPS < 0 {
		return fmt.Errorf("limits %+v: negative rate: %w", l, ErrConfig)
	}
	return nil
}

// sourceSlots is the size of a per-source table. A source whose slot was
// taken by another starts again with a full bucket: eviction can only make
// the limit more lenient, never refuse a source that kept to it.
const sourceSlots = 1 << 14

// Admission applies Limits. It is not safe for concurrent use: the
// Pipeline keeps one per worker and gives each 1/workers of the global,
// handshake and 0-RTT rates (a client's datagrams reach one worker, so the
// per-source rate is not divided).
type Admission struct {
	global, handshake, zeroRTT gcra
	perSource                  gcra // rate of each source's bucket
	sources                    []sourceSlot
	// seed keys the sources' slots: without it anyone could compute
	// offline which sources share a victim's slot, and reset its bucket
	// by sending from one of them (a source that takes a slot starts
	// full).
	seed uint64
}

type sourceSlot struct {
	addr netip.AddrPort
	tat  int64
}

// NewAdmission returns the admission stage for l split over share workers,
// or nil when every limit is off.
func NewAdmission(l Limits, share int) *Admission {
	if l.off() {
		return nil
	}
	share = max(share, 1)
	a := &Admission{
		global:    newGCRA(l.GlobalPPS, share),
		handshake: newGCRA(l.HandshakePPS, share),
		zeroRTT:   newGCRA(l.ZeroRTTPPS, share),
		perSource: newGCRA(l.PerSourcePPS, 1),
	}
	if l.PerSourcePPS > 0 {
		a.sources = make([]sourceSlot, sourceSlots)
		a.seed = rand.Uint64() // the runtime seeds it unpredictably
	}
	return a
}

// Admit says whether a datagram of class c from client may pass at time now
// (Unix nanoseconds). Tokens are taken only when every applicable limit
// allows it, so a refused datagram costs no other bucket anything. It does
// not allocate.
func (a *Admission) Admit(c Class, client netip.AddrPort, now int64) bool {
	var slot *sourceSlot
	var src int64
	if a.sources != nil {
		slot = a.slot(client)
		if slot.addr != client {
			slot.addr, slot.tat = client, 0 // evict: the new source starts full
		}
		var ok bool
		if src, ok = a.perSource.take(slot.tat, now); !ok {
			return false
		}
	}
	hs, ok := a.handshake.cond(c.Handshake, now)
	if !ok {
		return false
	}
	zr, ok := a.zeroRTT.cond(c.ZeroRTT, now)
	if !ok {
		return false
	}
	g, ok := a.global.cond(true, now)
	if !ok {
		return false
	}
	if slot != nil {
		slot.tat = src
	}
	a.handshake.commit(c.Handshake, hs)
	a.zeroRTT.commit(c.ZeroRTT, zr)
	a.global.commit(true, g)
	return true
}

func (a *Admission) slot(client netip.AddrPort) *sourceSlot {
	var k [32]byte
	hi, lo := addr.Words(client.Addr())
	binary.LittleEndian.PutUint64(k[0:], hi)
	binary.LittleEndian.PutUint64(k[8:], lo)
	binary.LittleEndian.PutUint64(k[16:], uint64(client.Port()))
	binary.LittleEndian.PutUint64(k[24:], a.seed)
	return &a.sources[xxhash.Sum64(k[:])&(sourceSlots-1)]
}

// gcra is a token bucket kept as the generic cell rate algorithm: one
// "theoretical arrival time" instead of a token count and a timestamp,
// all in integer nanoseconds.
type gcra struct {
	interval int64 // ns per datagram; 0 = off
	burst    int64 // how far ahead of now tat may run
	tat      int64
}

func newGCRA(pps, share int) gcra {
	if pps <= 0 {
		return gcra{}
	}
	rate := max(int64(pps)/int64(share), 1)
	interval := int64(1e9) / rate
	return gcra{interval: interval, burst: interval * (rate - 1)}
}

// take returns the new tat after one datagram at now from a bucket at tat,
// and whether the datagram conforms.
func (g *gcra) take(tat, now int64) (int64, bool) {
	tat = max(tat, now)
	if tat-now > g.burst {
		return 0, false
	}
	return tat + g.interval, true
}

// cond is take on g's own bucket when the limit is on and applies.
func (g *gcra) cond(applies bool, now int64) (int64, bool) {
	if g.interval == 0 || !applies {
		return 0, true
	}
	return g.take(g.tat, now)
}

func (g *gcra) commit(applies bool, tat int64) {
	if g.interval != 0 && applies {
		g.tat = tat
	}
}
