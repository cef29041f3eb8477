package backend

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
)

// proxiedDatagram is a 28-byte IPv4 header plus a payload of n bytes.
func proxiedDatagram(t testing.TB, n int) []byte {
	h, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: client1, Dst: service})
	require.NoError(t, err)
	return append(h, make([]byte, n)...)
}

func TestNoAllocs(t *testing.T) {
	c := newConn(t, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(t)
	to := c.LocalAddr().(*net.UDPAddr).AddrPort()
	dg := proxiedDatagram(t, 1200)
	buf := make([]byte, 2048)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	var a net.Addr
	roundTrip := func() {
		if _, err := px.c.WriteToUDPAddrPort(dg, to); err != nil {
			t.Fatal(err)
		}
		var err error
		if _, a, err = c.ReadFrom(buf); err != nil {
			t.Fatal(err)
		}
	}
	roundTrip() // intern the address
	if n := testing.AllocsPerRun(100, roundTrip); n != 0 {
		t.Errorf("send+ReadFrom: %v allocs", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := px.c.WriteToUDPAddrPort(dg, to); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.ReadFromAddr(buf); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("send+ReadFromAddr: %v allocs", n)
	}
	payload := make([]byte, 1200)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := c.WriteTo(payload, a); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("WriteTo(*Addr): %v allocs", n)
	}
	cid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	c.Commit(*a.(*Addr), cid)
	ua := net.UDPAddrFromAddrPort(client1)
	if n := testing.AllocsPerRun(100, func() {
		c.Commit(*a.(*Addr), cid)
		if _, err := c.WriteToCID(payload, cid); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteTo(payload, ua); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Commit+WriteToCID+WriteTo(*net.UDPAddr): %v allocs", n)
	}
	var s Stats
	if n := testing.AllocsPerRun(100, func() {
		_, _, ok := c.inspect(dg, px.addr())
		if !ok {
			t.Fatal("dropped")
		}
		s = c.Stats()
	}); n != 0 {
		t.Errorf("inspect: %v allocs", n)
	}
	_ = s
}

// BenchmarkInspect is the per-datagram receive decision without the
// syscall: sniff, trust check, parse.
func BenchmarkInspect(b *testing.B) {
	c := newConn(b, Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), loop}})
	dg := proxiedDatagram(b, 1200)
	from := netip.MustParseAddrPort("127.0.0.1:4000")
	b.ReportAllocs()
	b.SetBytes(int64(len(dg)))
	for b.Loop() {
		if _, _, ok := c.inspect(dg, from); !ok {
			b.Fatal("dropped")
		}
	}
}

// payloadLen is the datagram payload of the I/O benchmarks, the size
// SetBytes counts.
const payloadLen = 1200

// benchIO runs op per iteration; the closure costs nothing next to the
// syscalls it wraps.
func benchIO(b *testing.B, op func() error) {
	b.ReportAllocs()
	b.SetBytes(payloadLen)
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchReadFrom sends a proxied datagram from a new peer to to and reads it
// with read, per op.
func benchReadFrom(b *testing.B, to netip.AddrPort, read func(buf []byte) error) {
	px := newPeer(b)
	dg := proxiedDatagram(b, payloadLen)
	buf := make([]byte, 2048)
	benchIO(b, func() error {
		if _, err := px.c.WriteToUDPAddrPort(dg, to); err != nil {
			return err
		}
		return read(buf)
	})
}

// BenchmarkReadFrom sends a proxied 1200-byte datagram over loopback and
// reads it through the adapter: two syscalls per op, plus the adapter's
// work and one copy of the payload.
func BenchmarkReadFrom(b *testing.B) {
	c := newConn(b, Config{TrustedProxies: []netip.Prefix{loop}})
	benchReadFrom(b, c.LocalAddr().(*net.UDPAddr).AddrPort(), func(buf []byte) error {
		_, _, err := c.ReadFrom(buf)
		return err
	})
}

// BenchmarkReadFromBaseline is BenchmarkReadFrom on the bare socket, for
// comparison.
func BenchmarkReadFromBaseline(b *testing.B) {
	u := listen(b)
	benchReadFrom(b, addrOf(u), func(buf []byte) error {
		_, _, err := u.ReadFromUDPAddrPort(buf)
		return err
	})
}

// BenchmarkWriteTo writes a 1200-byte reply to a *Addr: reverse header,
// commit-on-write, one sendmmsg with two iovecs. The receiver does not
// read; loopback drops what overflows its buffer after the send succeeded.
func BenchmarkWriteTo(b *testing.B) {
	c := newConn(b, Config{TrustedProxies: []netip.Prefix{loop}})
	px := newPeer(b)
	a := &Addr{Client: client1, Service: service, Proxy: px.addr()}
	payload := make([]byte, payloadLen)
	benchIO(b, func() error {
		_, err := c.WriteTo(payload, a)
		return err
	})
}

// BenchmarkWriteToBaseline is a plain WriteToUDPAddrPort of header and
// payload joined, for comparison.
func BenchmarkWriteToBaseline(b *testing.B) {
	u := listen(b)
	px := newPeer(b)
	dg := proxiedDatagram(b, payloadLen)
	benchIO(b, func() error {
		_, err := u.WriteToUDPAddrPort(dg, px.addr())
		return err
	})
}

// BenchmarkWriteToCID is a server-initiated message through the table.
func BenchmarkWriteToCID(b *testing.B) {
	c := newConn(b, Config{})
	px := newPeer(b)
	cid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	c.Commit(Addr{Client: client1, Service: service, Proxy: px.addr()}, cid)
	payload := make([]byte, payloadLen)
	benchIO(b, func() error {
		_, err := c.WriteToCID(payload, cid)
		return err
	})
}

// BenchmarkCommit re-commits a known session's route (the per-write cost
// piondtls adds).
func BenchmarkCommit(b *testing.B) {
	c := newConn(b, Config{})
	a := Addr{Client: client1, Service: service, Proxy: netip.MustParseAddrPort("127.0.0.1:9")}
	cid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	c.Commit(a, cid)
	b.ReportAllocs()
	for b.Loop() {
		c.Commit(a, cid)
	}
}
