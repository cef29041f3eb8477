package addr

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"strings"
	"testing"
)

func check(t *testing.T, a netip.Addr) {
	t.Helper()
	b := a.As16()
	hi, lo := Words(a)
	if hi != binary.BigEndian.Uint64(b[:8]) || lo != binary.BigEndian.Uint64(b[8:]) {
		t.Fatalf("%v: Words %016x %016x, As16 %x", a, hi, lo, b)
	}
	if shi, slo := slow(a); shi != hi || slo != lo {
		t.Fatalf("%v: direct and As16 paths differ", a)
	}
}

func TestWords(t *testing.T) {
	if !direct {
		if strings.HasPrefix(runtime.Version(), "go1.26") && !purego {
			t.Fatal("netip.Addr layout not recognised on the Go release this module is tested with")
		}
		t.Log("netip.Addr layout not recognised: Words uses As16")
	}
	for _, a := range probes() {
		check(t, a)
	}
	for _, s := range []string{"0.0.0.0", "127.0.0.1", "::", "::1", "::ffff:1.2.3.4", "2001:db8::1%lo", "ff02::1"} {
		check(t, netip.MustParseAddr(s))
	}
}

func FuzzWords(f *testing.F) {
	f.Add([]byte{192, 0, 2, 1}, "")
	f.Add(make([]byte, 16), "eth0")
	f.Add([]byte{}, "")
	f.Fuzz(func(t *testing.T, b []byte, zone string) {
		var a netip.Addr
		switch len(b) {
		case 4:
			a = netip.AddrFrom4([4]byte(b))
		case 16:
			a = netip.AddrFrom16([16]byte(b)).WithZone(zone)
		}
		check(t, a)
	})
}

func BenchmarkWords(b *testing.B) {
	a := netip.MustParseAddr("2001:db8::1")
	var sink uint64
	for b.Loop() {
		hi, lo := Words(a)
		sink += hi ^ lo
	}
	_ = sink
}
