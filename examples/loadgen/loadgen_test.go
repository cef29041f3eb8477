package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

func TestHistogramBuckets(t *testing.T) {
	// Every value lies in its bucket, buckets are contiguous and at most
	// 1/64 of their value wide.
	prevLow := int64(-1)
	for i := range histBuckets {
		low, w := histBounds(i)
		require.Greater(t, low, prevLow, "bucket %d", i)
		require.Equal(t, i, histIndex(low), "low of bucket %d", i)
		require.Equal(t, i, histIndex(low+w-1), "high of bucket %d", i)
		if i+1 < histBuckets {
			next, _ := histBounds(i + 1)
			require.Equal(t, low+w, next, "bucket %d ends where %d starts", i, i+1)
		}
		require.LessOrEqual(t, w*64, max(low, 64), "bucket %d too wide", i)
		prevLow = low
	}
	require.Equal(t, histBuckets-1, histIndex(1<<63-1))
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	assert.Zero(t, h.quantile(0.5), "empty")

	// Small values are exact; nearest rank: the ceil(q·n)-th smallest.
	for v := int64(1); v <= 100; v++ {
		h.record(v)
	}
	assert.Equal(t, int64(50), h.quantile(0.5))
	assert.Equal(t, int64(90), h.quantile(0.9))
	assert.Equal(t, int64(99), h.quantile(0.99))
	assert.Equal(t, int64(100), h.quantile(0.999))
	assert.Equal(t, int64(100), h.quantile(1))
	assert.Equal(t, int64(1), h.quantile(0.001))
	assert.InDelta(t, 50.5, h.mean(), 1e-9)

	// Large values: within the bucket resolution of the exact order
	// statistic.
	rng := rand.New(rand.NewPCG(1, 2))
	var big histogram
	vals := make([]int64, 100000)
	for i := range vals {
		vals[i] = 10_000 + rng.Int64N(5_000_000) // 10 µs .. 5 ms in ns
		big.record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := big.quantile(q)
		assert.InEpsilon(t, exact, got, 1.0/64, "q=%v", q)
	}
	assert.Equal(t, vals[len(vals)-1], big.quantile(1), "the maximum is kept exactly")

	// Merging two halves equals recording everything in one.
	var a, b histogram
	for i, v := range vals {
		if i%2 == 0 {
			a.record(v)
		} else {
			b.record(v)
		}
	}
	a.merge(&b)
	assert.Equal(t, big.counts, a.counts)
	assert.Equal(t, big.n, a.n)
	assert.Equal(t, big.min, a.min)
	assert.Equal(t, big.max, a.max)

	var neg histogram
	neg.record(-5) // a clock step is clamped, not a panic
	assert.Equal(t, int64(0), neg.quantile(0.5))
}

func TestStamp(t *testing.T) {
	b := make([]byte, 100)
	putStamp(b, 7, 123456789, 987654321)
	seq, sent, ok := readStamp(b, 7)
	require.True(t, ok)
	assert.Equal(t, uint64(123456789), seq)
	assert.Equal(t, int64(987654321), sent)
	assert.Equal(t, make([]byte, 100-stampLen), b[:100-stampLen], "only the tail is written")

	_, _, ok = readStamp(b, 8)
	assert.False(t, ok, "another run's stamp")
	_, _, ok = readStamp(b[:stampLen-1], 7)
	assert.False(t, ok, "too short")
	b[len(b)-stampLen] ^= 1
	_, _, ok = readStamp(b, 7)
	assert.False(t, ok, "bad magic")
}

func TestCheckTarget(t *testing.T) {
	for _, tc := range []struct {
		target string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:5684", false, true},
		{"127.9.9.9:5684", false, true},
		{"[::1]:5684", false, true},
		{"[::ffff:127.0.0.1]:5684", false, true},
		{"10.0.0.1:5684", false, false},
		{"10.0.0.1:5684", true, true},
		{"[2001:db8::1]:443", false, false},
		{"0.0.0.0:5684", false, false},
		{"127.0.0.1:0", true, false},
	} {
		err := checkTarget(netip.MustParseAddrPort(tc.target), tc.remote)
		if tc.ok {
			assert.NoError(t, err, tc.target)
		} else {
			assert.Error(t, err, tc.target)
		}
	}
	assert.ErrorIs(t, checkTarget(netip.MustParseAddrPort("192.0.2.1:1"), false), errRemote)

	_, err := parseFlags([]string{"-target", "192.0.2.1:5684"}, &bytes.Buffer{})
	assert.ErrorIs(t, err, errRemote, "the flag path refuses too")
	_, err = parseFlags([]string{"-target", "192.0.2.1:5684", "-allow-remote", "-clients", "10"}, &bytes.Buffer{})
	assert.ErrorIs(t, err, errClientAddrs, "remote targets get no loopback source addresses")
	_, err = parseFlags([]string{"-target", "192.0.2.1:5684", "-allow-remote", "-clients", "4", "-sockets", "4"}, &bytes.Buffer{})
	assert.NoError(t, err)
}

func TestClientSource(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	a, ok := clientSource(lo, 0, 1)
	require.True(t, ok)
	assert.Equal(t, "127.1.0.1", a.String())
	a, _ = clientSource(lo, 300, 1)
	assert.Equal(t, "127.1.1.45", a.String())
	a, _ = clientSource(lo, 7, 4) // client 7 of 4 sockets: second address of socket 3
	assert.Equal(t, "127.1.0.2", a.String())
	seen := map[netip.AddrPort]bool{}
	for i := range 10000 {
		a, ok := clientSource(lo, i, 3)
		require.True(t, ok)
		ap := netip.AddrPortFrom(a, uint16(i%3)) // the socket stands for the port
		require.False(t, seen[ap], "client %d repeats an address", i)
		seen[ap] = true
	}
	_, ok = clientSource(netip.MustParseAddr("::1"), 0, 1)
	assert.False(t, ok)
	_, ok = clientSource(lo, 1<<16, 1)
	assert.False(t, ok, "range exhausted")
}

func TestPacer(t *testing.T) {
	p := pacer{rate: 50000} // one every 20 µs
	assert.Equal(t, uint64(0), p.due(0))
	assert.Equal(t, uint64(0), p.due(19*time.Microsecond))
	assert.Equal(t, uint64(1), p.due(20*time.Microsecond))
	assert.Equal(t, uint64(50000), p.due(time.Second))
	assert.Equal(t, uint64(3_000_000), p.due(time.Minute))
	assert.Equal(t, 20*time.Microsecond, p.at(0), "datagram 0 is due once one interval passed")
	assert.Equal(t, 40*time.Microsecond, p.at(1))

	n, wait := p.next(50*time.Microsecond, 2, 32)
	assert.Equal(t, 0, n)
	assert.Equal(t, 10*time.Microsecond, wait)
	n, _ = p.next(time.Millisecond, 0, 32)
	assert.Equal(t, 32, n, "a late sender catches up one batch at a time")
	n, _ = p.next(time.Millisecond, 40, 32)
	assert.Equal(t, 10, n)

	// A simulated sender that sleeps exactly as told sends rate·t.
	q := pacer{rate: 7919}
	var now time.Duration
	var sent uint64
	for now < 3*time.Second {
		n, w := q.next(now, sent, 8)
		sent += uint64(n)
		if n == 0 {
			now += w
		}
	}
	assert.InDelta(t, 3*7919, float64(sent), 8)
	for sent := range uint64(1000) {
		at := q.at(sent)
		assert.Equal(t, sent+1, q.due(at), "due at its time")
		assert.Equal(t, sent, q.due(at-1), "not before")
	}
	assert.Equal(t, ^uint64(0), pacer{rate: 1 << 40}.due(1<<62), "no overflow")
}

func TestParseMix(t *testing.T) {
	p, err := parseMix("dtls-cid")
	require.NoError(t, err)
	assert.Equal(t, []shape{dtlsCID}, p)

	p, err = parseMix("dtls-cid=3,dtls-hello=1,quic-short=1")
	require.NoError(t, err)
	require.Len(t, p, 5)
	count := map[shape]int{}
	for i, s := range p {
		count[s]++
		if i > 0 {
			assert.False(t, s != dtlsCID && p[i-1] == s, "runs of rare shapes: %v", p)
		}
	}
	assert.Equal(t, map[shape]int{dtlsCID: 3, dtlsHello: 1, quicShort: 1}, count)

	p, err = parseMix("dtls-cid=0,quic-short")
	require.NoError(t, err)
	assert.Equal(t, []shape{quicShort}, p)

	for _, bad := range []string{"", "dtls", "dtls-cid=0", "dtls-cid=x", "dtls-cid=-1", "dtls-cid=1001"} {
		_, err := parseMix(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseOrdinals(t *testing.T) {
	o, err := parseOrdinals("0,3,5-7")
	require.NoError(t, err)
	assert.Equal(t, []uint8{0, 3, 5, 6, 7}, o)
	for _, bad := range []string{"", "255", "3-1", "a", "-1"} {
		_, err := parseOrdinals(bad)
		assert.Error(t, err, bad)
	}
}

// The templates are what the proxy's classifiers accept, and carry the
// ordinal where the codecs read it.
func TestTemplatesClassify(t *testing.T) {
	c := shapeConfig{size: 121, dtlsCIDLen: 8, quicCIDLen: 12}
	require.NoError(t, c.validate([]shape{dtlsCID, dtlsHello, quicShort}))
	for _, ord := range []uint8{0, 3, 254} {
		b, err := c.template(dtlsCID, ord)
		require.NoError(t, err)
		require.Len(t, b, 121)
		putStamp(b, 1, 2, 3) // the stamp keeps the record valid
		cls, err := dtls.Classify(b, 8)
		require.NoError(t, err)
		assert.Equal(t, dtls.KindEstablished, cls.Kind)
		got, ok := dtls.OrdinalFirst{}.Ordinal(cls.CID)
		assert.True(t, ok)
		assert.Equal(t, ord, got)

		b, err = c.template(dtlsHello, ord)
		require.NoError(t, err)
		require.Len(t, b, 121)
		putStamp(b, 1, 2, 3)
		cls, err = dtls.Classify(b, 8)
		require.NoError(t, err)
		assert.Equal(t, dtls.KindNew, cls.Kind)
		assert.True(t, cls.ClientHello)

		b, err = c.template(quicShort, ord)
		require.NoError(t, err)
		require.Len(t, b, 121)
		putStamp(b, 1, 2, 3)
		qc, err := quic.Classify(b, 12)
		require.NoError(t, err)
		assert.Equal(t, quic.KindEstablished, qc.Kind)
		got, ok = quic.LB{}.Ordinal(qc.DCID)
		assert.True(t, ok)
		assert.Equal(t, ord, got)
	}
	for range 100 {
		b, err := c.template(random, 0)
		require.NoError(t, err)
		require.Len(t, b, 121)
		_, err = dtls.Classify(b, 8)
		require.Error(t, err, "random bytes %x classify", b[:4])
	}
	assert.Error(t, shapeConfig{size: 40, dtlsCIDLen: 8, quicCIDLen: 12}.validate([]shape{dtlsCID}), "no room for the stamp")
	assert.Error(t, shapeConfig{size: 121, dtlsCIDLen: 8, quicCIDLen: 4}.validate([]shape{dtlsCID}), "QUIC-LB CID of 4")
	assert.Error(t, shapeConfig{size: 121, dtlsCIDLen: 2, quicCIDLen: 12}.validate([]shape{dtlsCID}), "DTLS CID of 2")
}

func TestParseProc(t *testing.T) {
	// A command name with spaces and parentheses; utime 1234, stime 56.
	stat := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 3 0 100 1000 200"
	u, s, err := parseStat([]byte(stat))
	require.NoError(t, err)
	assert.Equal(t, 12340*time.Millisecond, u)
	assert.Equal(t, 560*time.Millisecond, s)
	_, _, err = parseStat([]byte("4242 (x) S 1 2"))
	assert.Error(t, err)

	rss, err := parseVmRSS([]byte("Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t    5120 kB\nThreads: 3\n"))
	require.NoError(t, err)
	assert.Equal(t, int64(5120), rss)

	m, err := parseMallocs([]byte("heap profile: ...\n# runtime.MemStats\n# Alloc = 1\n# Mallocs = 4269\n"))
	require.NoError(t, err)
	assert.Equal(t, 4269.0, m)
	m, err = parseMallocs([]byte("# TYPE go_memstats_mallocs_total counter\ngo_memstats_mallocs_total 1.5e+06\n"))
	require.NoError(t, err)
	assert.Equal(t, 1.5e6, m)
	_, err = parseMallocs([]byte("nothing"))
	assert.Error(t, err)

	self, err := readProc(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, self.rssKB)
	assert.Positive(t, self.fds)
}

func TestPerDatagramPathDoesNotAllocate(t *testing.T) {
	b := make([]byte, 121)
	var h histogram
	allocs := testing.AllocsPerRun(100, func() {
		putStamp(b, 1, 2, 3)
		_, sent, _ := readStamp(b, 1)
		h.record(sent)
	})
	assert.Zero(t, allocs)
}

// plainEcho returns every datagram to its sender, like examples/echo
// without -proxy-protocol.
func plainEcho(t *testing.T) netip.AddrPort {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestRunAgainstEcho runs loadgen in-process against an echo, paced and
// flat out, with more clients than sockets (loopback source addresses).
func TestRunAgainstEcho(t *testing.T) {
	echo := plainEcho(t)
	for _, rate := range []string{"2000", "0"} {
		t.Run("rate="+rate, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cmd(context.Background(), []string{"-json", "-target", echo.String(), "-rate", rate,
				"-clients", "50", "-sockets", "2", "-mix", "dtls-cid=2,dtls-hello=1,quic-short=1", "-ordinals", "0-3",
				"-warmup", "100ms", "-duration", "300ms", "-drain", "300ms", "-window", "16",
				"-watch-pid", strconv.Itoa(os.Getpid())}, &out, &errb)
			require.Equal(t, 0, code, errb.String())
			var r Result
			require.NoError(t, json.Unmarshal(out.Bytes(), &r))
			assert.Positive(t, r.Sent)
			assert.Positive(t, r.Received)
			assert.LessOrEqual(t, r.Received, r.Sent)
			assert.Zero(t, r.Foreign)
			assert.Zero(t, r.SendErrors)
			assert.Positive(t, r.RTT.P50)
			assert.LessOrEqual(t, r.RTT.P50, r.RTT.P99)
			require.NotNil(t, r.Watch)
			assert.Equal(t, os.Getpid(), r.Watch.PID)
			assert.Equal(t, -1.0, r.Watch.Mallocs)
		})
	}

	// Human output.
	var out bytes.Buffer
	code := cmd(context.Background(), []string{"-target", echo.String(), "-rate", "1000", "-clients", "3",
		"-warmup", "0s", "-duration", "100ms", "-drain", "100ms"}, &out, &out)
	require.Equal(t, 0, code, out.String())
	assert.Contains(t, out.String(), "rtt µs: p50")
	assert.True(t, strings.HasPrefix(out.String(), "target "+echo.String()))
}

// TestOpenLoop: against a socket that never answers, -open keeps sending
// flat out, where the closed loop stops at -window in flight and then
// writes them off every 50 ms (at most 16 × 300 ms / 50 ms here).
func TestOpenLoop(t *testing.T) {
	hole, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer hole.Close()
	run := func(extra ...string) Result {
		var out, errb bytes.Buffer
		args := append([]string{"-json", "-target", hole.LocalAddr().String(), "-window", "16", "-sockets", "2",
			"-mix", "dtls-cid,random", "-warmup", "0s", "-duration", "300ms", "-drain", "0s"}, extra...)
		require.Equal(t, 0, cmd(context.Background(), args, &out, &errb), errb.String())
		var r Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &r))
		assert.Zero(t, r.Received)
		return r
	}
	closed, open := run(), run("-open")
	assert.False(t, closed.Open)
	assert.True(t, open.Open)
	assert.LessOrEqual(t, closed.Sent, uint64(2*16*(300/50+1)))
	assert.Greater(t, open.Sent, 10*closed.Sent, "open loop: sent %d, closed %d", open.Sent, closed.Sent)
	assert.Equal(t, open.Sent, open.Lost)
}

func TestCmdErrors(t *testing.T) {
	var errb bytes.Buffer
	assert.Equal(t, 2, cmd(context.Background(), []string{"-target", "192.0.2.1:1"}, &bytes.Buffer{}, &errb))
	assert.Contains(t, errb.String(), "-allow-remote")
	for _, args := range [][]string{
		{"-clients", "0"}, {"-sockets", "0"}, {"-duration", "0s"}, {"-size", "20"}, {"-mix", "tcp"},
		{"-ordinals", "300"}, {"-batch", "0"}, {"extra"}, {"-open", "-rate", "1000"},
	} {
		assert.Equal(t, 2, cmd(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}), "%q", args)
	}
}
