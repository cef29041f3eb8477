//go:build linux

package udpio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/cidroute/cidroute/internal/testtool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundTripMixedSizes(t *testing.T) {
	for _, tc := range []struct{ name, network, addr string }{
		{"v4", "udp4", "127.0.0.1:0"},
		{"v6", "udp6", "[::1]:0"},
		{"dualstack-v6", "udp", "[::]:0"}, // v6 socket, sent to over ::1
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := listen(t, tc.network, tc.addr, ListenConfig{})
			sc := listen(t, tc.network, tc.addr, ListenConfig{})
			r, s := newConn(t, rc, 8), newConn(t, sc, 8) // batch 8: 3 sendmmsg chunks
			dst := addrOf(rc)
			if dst.Addr().IsUnspecified() {
				dst = netip.AddrPortFrom(netip.IPv6Loopback(), dst.Port())
			}
			sizes := []int{0, 1, 4, 17, 100, 1200, 1500, 9000, 65000, 3, 28, 52, 1400, 7, 512, 60000, 2, 33, 1000, 64}
			var ms []Message
			var want [][]byte
			for i, size := range sizes {
				p := seqMsg(uint32(i), size)[:size]
				m := Message{Buf: p, Addr: dst}
				if i%3 == 1 && size >= 2 { // prefix + payload as one datagram
					m.Prefix, m.Buf = p[:size/2], p[size/2:]
				}
				ms = append(ms, m)
				want = append(want, p)
			}
			n, err := s.WriteBatch(ms)
			require.NoError(t, err)
			require.Equal(t, len(ms), n)
			for i := range ms {
				require.NoError(t, ms[i].Err)
			}
			got := readAll(t, r, rc, len(ms))
			src := addrOf(sc)
			for i, m := range got {
				assert.Equal(t, want[i], m.Buf, "datagram %d", i)
				assert.Equal(t, src.Port(), m.Addr.Port())
				assert.NoError(t, m.Err)
				assert.False(t, m.Addr.Addr().Is4In6())
			}
		})
	}
}

func TestDualStackUnmapped(t *testing.T) {
	rc := listen(t, "udp", "[::]:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newConn(t, rc, 0), newConn(t, sc, 0)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), addrOf(rc).Port())
	_, err := s.WriteBatch([]Message{{Buf: []byte("ping"), Addr: dst}})
	require.NoError(t, err)
	got := readAll(t, r, rc, 1)
	require.Equal(t, addrOf(sc), got[0].Addr, "IPv4 peer of a dual-stack socket is reported unmapped")

	// Replying to the unmapped address from the IPv6 socket works too, as
	// does an explicitly mapped one.
	mapped := netip.AddrPortFrom(netip.AddrFrom16(got[0].Addr.Addr().As16()), got[0].Addr.Port())
	n, err := r.WriteBatch([]Message{{Buf: []byte("a"), Addr: got[0].Addr}, {Buf: []byte("b"), Addr: mapped}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	back := readAll(t, s, sc, 2)
	assert.Equal(t, "a", string(back[0].Buf))
	assert.Equal(t, "b", string(back[1].Buf))
	assert.Equal(t, dst, back[0].Addr)
}

func TestPacketInfo(t *testing.T) {
	for _, tc := range []struct {
		name, network, bind, client string
		to                          netip.Addr
	}{
		{"v4", "udp4", "0.0.0.0:0", "127.0.0.1:0", netip.MustParseAddr("127.0.0.2")},
		{"dualstack-v4", "udp", "[::]:0", "127.0.0.1:0", netip.MustParseAddr("127.0.0.3")},
		{"v6", "udp6", "[::]:0", "[::1]:0", netip.IPv6Loopback()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := listen(t, tc.network, tc.bind, ListenConfig{PacketInfo: true})
			cc := listen(t, "udp", tc.client, ListenConfig{})
			r, c := newConn(t, rc, 0), newConn(t, cc, 0)
			require.True(t, r.PacketInfo())
			require.False(t, c.PacketInfo())
			dst := netip.AddrPortFrom(tc.to, addrOf(rc).Port())
			_, err := c.WriteBatch([]Message{{Buf: []byte("hello"), Addr: dst}})
			require.NoError(t, err)
			got := readAll(t, r, rc, 1)
			require.Equal(t, tc.to, got[0].Local, "destination reported")

			// Reply from the address the client used, then from the
			// kernel's choice; the client sees the difference.
			n, err := r.WriteBatch([]Message{
				{Buf: []byte("with"), Addr: got[0].Addr, Local: got[0].Local},
				{Buf: []byte("without"), Addr: got[0].Addr},
			})
			require.NoError(t, err)
			require.Equal(t, 2, n)
			back := readAll(t, c, cc, 2)
			assert.Equal(t, dst, back[0].Addr, "reply leaves from Local")
			if tc.to != netip.IPv6Loopback() {
				assert.NotEqual(t, dst.Addr(), back[1].Addr.Addr(), "control: without Local the kernel picks another source")
			}
		})
	}
}

func TestTruncated(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newConn(t, rc, 0), newConn(t, sc, 0)
	_, err := s.WriteBatch([]Message{{Buf: bytes.Repeat([]byte{7}, 100), Addr: addrOf(rc)}, {Buf: []byte{1, 2}, Addr: addrOf(rc)}})
	require.NoError(t, err)
	ms := []Message{{Buf: make([]byte, 10)}, {Buf: make([]byte, 10)}}
	require.NoError(t, rc.SetReadDeadline(time.Now().Add(5*time.Second)))
	got := 0
	for got < 2 {
		n, err := r.ReadBatch(ms[got:])
		require.NoError(t, err)
		got += n
	}
	assert.ErrorIs(t, ms[0].Err, ErrTruncated)
	assert.Equal(t, 10, ms[0].N)
	assert.NoError(t, ms[1].Err)
	assert.Equal(t, []byte{1, 2}, ms[1].Buf[:ms[1].N])
}

func TestOversizedDatagramMidBatch(t *testing.T) {
	// A real partial sendmmsg: the kernel sends the datagrams before the
	// oversized one, returns EMSGSIZE for it on the next call, and the rest
	// still go.
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newConn(t, rc, 0), newConn(t, sc, 0)
	calls, partial := countCalls(s)
	var ms []Message
	for i := range 10 {
		ms = append(ms, Message{Buf: seqMsg(uint32(i), 100), Addr: addrOf(rc)})
	}
	ms[4].Buf = make([]byte, 70000)
	ms[7].Addr = netip.MustParseAddrPort("[2001:db8::1]:9") // IPv6 on an IPv4 socket
	n, err := s.WriteBatch(ms)
	require.NoError(t, err)
	assert.Equal(t, 8, n)
	assert.ErrorIs(t, ms[4].Err, syscall.EMSGSIZE)
	assert.ErrorIs(t, ms[7].Err, ErrAddress)
	assert.Equal(t, 3, *calls, "sendmmsg: 4 sent, EMSGSIZE, 4 sent")
	assert.Equal(t, 1, *partial)
	got := readAll(t, r, rc, 8)
	var seqs []uint32
	for _, m := range got {
		seqs = append(seqs, binary.BigEndian.Uint32(m.Buf))
	}
	assert.Equal(t, []uint32{0, 1, 2, 3, 5, 6, 8, 9}, seqs)
}

// countCalls wraps c's send seam, counting syscalls and partial returns.
func countCalls(c *Conn) (calls, partial *int) {
	calls, partial = new(int), new(int)
	real := c.tx.call
	c.tx.call = func(hs []mmsghdr) (int, error) {
		n, err := real(hs)
		*calls++
		if err == nil && n < len(hs) {
			*partial++
		}
		return n, err
	}
	return calls, partial
}

// payloadOf returns the bytes a send header points at (prefix + payload).
func payloadOf(h *mmsghdr) []byte {
	iov := unsafeIovs(h)
	var b []byte
	for _, v := range iov {
		b = append(b, unsafeBytes(v)...)
	}
	return b
}

func TestFakedPartialSendsAndRejections(t *testing.T) {
	// The seam turns the real sendmmsg into one that accepts at most 3
	// datagrams per call and refuses (ECONNREFUSED, EPERM) datagrams whose
	// payload says so, the way the kernel reports the error of the first
	// datagram of a call.
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r, s := newConn(t, rc, 16), newConn(t, sc, 16)
	real := s.tx.call
	var calls int
	s.tx.call = func(hs []mmsghdr) (int, error) {
		calls++
		for i := range hs {
			var errno syscall.Errno
			switch p := payloadOf(&hs[i]); {
			case bytes.HasSuffix(p, []byte("refused")):
				errno = syscall.ECONNREFUSED
			case bytes.HasSuffix(p, []byte("perm")):
				errno = syscall.EPERM
			default:
				continue
			}
			if i == 0 {
				return 0, errno
			}
			hs = hs[:i]
			break
		}
		return real(hs[:min(len(hs), 3)])
	}
	var ms []Message
	var want []uint32
	for i := range 40 {
		m := Message{Prefix: []byte{0xAA}, Buf: seqMsg(uint32(i), 20+i), Addr: addrOf(rc)}
		switch {
		case i%7 == 3:
			m.Buf = append(m.Buf, "refused"...)
		case i == 16 || i == 17:
			m.Buf = append(m.Buf, "perm"...)
		default:
			want = append(want, uint32(i))
		}
		ms = append(ms, m)
	}
	n, err := s.WriteBatch(ms)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	for i, m := range ms {
		switch {
		case i%7 == 3:
			assert.ErrorIs(t, m.Err, syscall.ECONNREFUSED, "message %d", i)
		case i == 16 || i == 17:
			assert.ErrorIs(t, m.Err, syscall.EPERM, "message %d", i)
		default:
			assert.NoError(t, m.Err, "message %d", i)
		}
	}
	got := readAll(t, r, rc, len(want))
	var seqs []uint32
	for _, m := range got {
		require.Equal(t, byte(0xAA), m.Buf[0], "prefix in front of payload")
		seqs = append(seqs, binary.BigEndian.Uint32(m.Buf[1:]))
	}
	assert.Equal(t, want, seqs, "nothing lost, nothing duplicated, order kept")
	t.Logf("%d seam calls for %d datagrams", calls, len(ms))
}

func TestSocketFailureMarksUnsent(t *testing.T) {
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	s := newConn(t, sc, 4)
	real := s.tx.call
	calls := 0
	s.tx.call = func(hs []mmsghdr) (int, error) {
		if calls++; calls == 3 {
			sc.Close()
		}
		return real(hs[:min(len(hs), 3)])
	}
	ms := make([]Message, 10)
	for i := range ms {
		ms[i] = Message{Buf: []byte{byte(i)}, Addr: addrOf(rc)}
	}
	n, err := s.WriteBatch(ms)
	require.ErrorIs(t, err, net.ErrClosed)
	require.Equal(t, 4, n) // 3, then 1 (chunk of 4), then closed
	for i, m := range ms {
		if i < n {
			assert.NoError(t, m.Err)
		} else {
			assert.ErrorIs(t, m.Err, net.ErrClosed, "message %d", i)
		}
	}
}

func TestTinySendBufferNonDrainingReceiver(t *testing.T) {
	// Blast bursts at a receiver that does not read, from a socket with the
	// smallest send buffer the kernel allows; then drain and check sequence
	// numbers. On plain loopback the kernel frees the send buffer when it
	// hands the datagram to the receiving queue (loopback_xmit orphans the
	// skb), so sendmmsg does not stop early here (the count of short returns
	// is logged); TestPartialSendsUnderBackpressure puts a shaping qdisc in
	// the way so that it does. Either way nothing may be lost or duplicated.
	st := blastTinySendBuffer(t)
	t.Logf("%d sendmmsg calls, %d returned short, %d would-blocks", st.calls, st.partial, st.wouldBlock)
}

// shapedEnv marks the child process TestPartialSendsUnderBackpressure runs
// in its own network namespace.
const shapedEnv = "UDPIO_TEST_SHAPED_LOOPBACK"

// shapedSetup makes loopback slow (20 Mbit/s token bucket) in a fresh
// network namespace, so that datagrams wait in the qdisc, still charged to
// the sender's SO_SNDBUF, and sendmmsg really stops part-way.
const shapedSetup = `ip link set lo up && tc qdisc add dev lo root tbf rate 20mbit burst 4kb limit 256kb && exec "$0" "$@"`

func TestPartialSendsUnderBackpressure(t *testing.T) {
	// A real partial sendmmsg: a tiny SO_SNDBUF, a receiver that does not
	// read during the burst and a loopback that drains the send buffer
	// slowly. The kernel returns short, the next call would block and parks
	// on the netpoller until the qdisc has sent some, and WriteBatch goes on
	// from the first unsent datagram: every datagram arrives exactly once.
	if os.Getenv(shapedEnv) == "1" {
		st := blastTinySendBuffer(t)
		t.Logf("%d sendmmsg calls, %d returned short, %d would-blocks", st.calls, st.partial, st.wouldBlock)
		require.Positive(t, st.partial, "sendmmsg returned short under backpressure")
		// Each would-block parks until the socket is writable again, so the
		// next attempt goes through: a spinning writer would retry
		// thousands of times per short return.
		assert.LessOrEqual(t, st.wouldBlock, 2*st.calls+10, "sendmmsg attempts that would block")
		return
	}
	unshare := testtool.Look(t, "util-linux", "unshare")
	testtool.Look(t, "iproute2", "ip")
	testtool.Look(t, "iproute2", "tc")
	cmd := exec.Command(unshare, "--net", "--map-root-user", "sh", "-c", shapedSetup,
		os.Args[0], "-test.run=^TestPartialSendsUnderBackpressure$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), shapedEnv+"=1")
	out, err := cmd.CombinedOutput()
	if !bytes.Contains(out, []byte("=== RUN")) {
		t.Skipf("cannot create a shaped network namespace (%v): %s", err, out)
	}
	t.Logf("in a network namespace with a 20 Mbit/s loopback:\n%s", out)
	require.NoError(t, err)
	require.Contains(t, string(out), "--- PASS: TestPartialSendsUnderBackpressure")
}

type blastStats struct{ calls, partial, wouldBlock int }

// blastTinySendBuffer sends 2000 numbered datagrams in bursts that fit the
// receiver's buffer, from a socket with the smallest send buffer, reading
// only after each burst's WriteBatch has returned, and checks that every
// datagram arrived exactly once.
func blastTinySendBuffer(t *testing.T) blastStats {
	const total, size = 2000, 200
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{RecvBuffer: 8 << 20})
	sc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{SendBuffer: 1})
	rb, _, err := BufferSizes(rc)
	require.NoError(t, err)
	_, sndbuf, err := BufferSizes(sc)
	require.NoError(t, err)
	burst := min(total, rb/2048) // skb truesize of a 200-byte datagram ≤ 2 KiB
	t.Logf("receiver SO_RCVBUF %d, sender SO_SNDBUF %d (requested 1), bursts of %d", rb, sndbuf, burst)
	r, s := newConn(t, rc, 64), newConn(t, sc, 64)
	calls, partial := countCalls(s)
	var st blastStats
	try := s.tx.fn
	s.tx.fn = func(fd uintptr) bool {
		done := try(fd)
		if !done {
			st.wouldBlock++
		}
		return done
	}
	var seqs []uint32
	ms := make([]Message, 0, burst)
	for next := 0; next < total; {
		ms = ms[:0]
		for ; len(ms) < burst && next < total; next++ {
			ms = append(ms, Message{Buf: seqMsg(uint32(next), size), Addr: addrOf(rc)})
		}
		n, err := s.WriteBatch(ms)
		require.NoError(t, err)
		require.Equal(t, len(ms), n)
		for i := range ms {
			require.NoError(t, ms[i].Err)
		}
		for _, m := range readAll(t, r, rc, len(ms)) {
			seqs = append(seqs, binary.BigEndian.Uint32(m.Buf))
		}
	}
	// Each datagram exactly once. Not necessarily in order: behind the
	// shaped qdisc the kernel sends some from the sender's CPU and some from
	// the qdisc's timer on another, and loopback queues them per CPU, so
	// neighbours can swap (seen 1 run in ~10 under -race). A resend from the
	// wrong datagram would show as a duplicate and a gap.
	require.Len(t, seqs, total)
	seen := make([]int, total)
	swapped := 0
	for i, q := range seqs {
		require.Less(t, q, uint32(total), "sequence number")
		seen[q]++
		if q != uint32(i) {
			swapped++
		}
	}
	for q, n := range seen {
		require.Equal(t, 1, n, "datagram %d received %d times", q, n)
	}
	if swapped > 0 {
		t.Logf("%d datagrams arrived out of place (kernel reordering), none lost or duplicated", swapped)
	}
	st.calls, st.partial = *calls, *partial
	return st
}

func TestReadParksOnNetpoller(t *testing.T) {
	rc := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	r := newConn(t, rc, 0)
	real := r.rx.fn
	attempts := 0
	r.rx.fn = func(fd uintptr) bool { attempts++; return real(fd) }
	require.NoError(t, rc.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	ms := []Message{{Buf: make([]byte, 10)}}
	n, err := r.ReadBatch(ms)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Zero(t, n)
	// A spinning reader would have tried thousands of times.
	assert.LessOrEqual(t, attempts, 3, "recvmmsg attempts while waiting")

	done := make(chan error)
	require.NoError(t, rc.SetReadDeadline(time.Time{}))
	go func() { _, err := r.ReadBatch(ms); done <- err }()
	time.Sleep(20 * time.Millisecond)
	rc.Close()
	assert.ErrorIs(t, <-done, net.ErrClosed)
}

func TestNoAllocs(t *testing.T) {
	for _, tc := range []struct {
		name, network, addr string
		detach              bool
	}{
		{"v4", "udp4", "127.0.0.1:0", false},
		{"v6-pktinfo", "udp6", "[::1]:0", false},
		{"v4 detached", "udp4", "127.0.0.1:0", true},
		{"v6-pktinfo detached", "udp6", "[::1]:0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ListenConfig{PacketInfo: tc.network == "udp6", RecvBuffer: 1 << 20}
			rc := listen(t, tc.network, tc.addr, cfg)
			sc := listen(t, tc.network, tc.addr, cfg)
			r, s := newConn(t, rc, 32), newConn(t, sc, 32)
			if tc.detach {
				require.NoError(t, r.Detach())
				require.NoError(t, s.Detach())
				t.Cleanup(func() { r.Close(); s.Close() })
			}
			out, in := make([]Message, 32), make([]Message, 32)
			for i := range out {
				out[i] = Message{Prefix: []byte("hdr"), Buf: make([]byte, 100+i), Addr: addrOf(rc)}
				if cfg.PacketInfo {
					out[i].Local = addrOf(sc).Addr()
				}
				in[i].Buf = make([]byte, 2048)
			}
			allocs := testing.AllocsPerRun(50, func() {
				if n, err := s.WriteBatch(out); err != nil || n != len(out) {
					panic(fmt.Sprint(n, err))
				}
				for got := 0; got < len(out); {
					n, err := r.ReadBatch(in)
					if errors.Is(err, ErrWouldBlock) {
						continue // detached: not all there yet
					}
					if err != nil {
						panic(err)
					}
					got += n
				}
			})
			assert.Zero(t, allocs, "allocations per 32-datagram round")
			if cfg.PacketInfo {
				assert.Equal(t, addrOf(rc).Addr(), in[0].Local)
			}
		})
	}
}

func TestListenGroupSharesPort(t *testing.T) {
	g, err := ListenGroup("udp4", "127.0.0.1:0", 4, ListenConfig{RecvBuffer: 1 << 20, SendBuffer: 1 << 20})
	require.NoError(t, err)
	defer closeAll(g)
	port := addrOf(g[0]).Port()
	for _, c := range g {
		assert.Equal(t, port, addrOf(c).Port())
		r, s, err := BufferSizes(c)
		require.NoError(t, err)
		if os.Geteuid() == 0 { // SO_RCVBUFFORCE: granted in full, doubled
			assert.Equal(t, 2<<20, r)
			assert.Equal(t, 2<<20, s)
		} else {
			assert.Positive(t, r)
			assert.Positive(t, s)
		}
	}
	_, err = ListenGroup("udp4", "127.0.0.1:0", 0, ListenConfig{})
	assert.ErrorIs(t, err, ErrConfig)
	_, err = NewConn(g[0], -1)
	assert.ErrorIs(t, err, ErrConfig)
}

func closeAll(g []*net.UDPConn) {
	for _, c := range g {
		c.Close()
	}
}

func TestListenGroupOfOneIsPlain(t *testing.T) {
	c := listen(t, "udp4", "127.0.0.1:0", ListenConfig{})
	_, err := ListenGroup("udp4", addrOf(c).String(), 1, ListenConfig{})
	assert.Error(t, err, "a single socket does not share its port")
	g, err := ListenGroup("udp4", "127.0.0.1:0", 2, ListenConfig{})
	require.NoError(t, err)
	defer closeAll(g)
	more, err := ListenGroup("udp4", addrOf(g[0]).String(), 1, ListenConfig{})
	if err == nil {
		closeAll(more)
	}
	assert.Error(t, err, "nor joins a group")
}
