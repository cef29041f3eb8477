package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// These tests pin down defects of transparent.go found (and fixed) while
// proving transparent mode: a Close racing the forward loop, a relay ended
// by an ICMP error, replies from the wrong source address on a wildcard
// listener, and replies capped below MaxDatagram.

// transparentRecord is a DTLS tls12_cid record of size bytes whose CID
// names ordinal.
func transparentRecord(t testing.TB, ordinal uint8, size int) []byte {
	t.Helper()
	cid, err := dtls.OrdinalFirst{}.AppendCID(nil, ordinal)
	require.NoError(t, err)
	rec, err := dtls.AppendRecord(nil, dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 1, CID: cid,
		Fragment: make([]byte, size-dtls.HeaderLen-len(cid))})
	require.NoError(t, err)
	return rec
}

// transparentEcho is a plain UDP echo backend (no PPv2) that remembers the
// last source it answered.
type transparentEcho struct {
	conn *net.UDPConn
	mu   sync.Mutex
	last netip.AddrPort
}

func startTransparentEcho(t *testing.T) *transparentEcho {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	e := &transparentEcho{conn: c}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.last = from
			e.mu.Unlock()
			c.WriteToUDPAddrPort(buf[:n], from)
		}
	})
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return e
}

func (e *transparentEcho) addr() netip.AddrPort { return e.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (e *transparentEcho) lastSource() netip.AddrPort {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

// startTransparentPipeline runs one single-worker service in front of
// backends; mod adjusts it. It is closed when the test ends (or earlier,
// by the test: Close is idempotent).
func startTransparentPipeline(t *testing.T, mod func(*cidroute.Service), backends ...netip.AddrPort) *cidroute.Pipeline {
	t.Helper()
	p, errc := runTransparentPipeline(t, mod, backends...)
	t.Cleanup(func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-errc)
	})
	return p
}

// runTransparentPipeline is startTransparentPipeline without the Close at
// the end; Run's result arrives on errc.
func runTransparentPipeline(t *testing.T, mod func(*cidroute.Service), backends ...netip.AddrPort) (*cidroute.Pipeline, chan error) {
	t.Helper()
	reg, err := registry.New(registry.Config{Service: "svc", Seed: hrwSeed, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(reg.Close)
	require.NoError(t, reg.Update(transparentBackends(backends...)))
	sc := cidroute.Service{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		RouterConfig: cidroute.RouterConfig{Protocol: cidroute.DTLS, Backends: reg, Transparent: true}}
	if mod != nil {
		mod(&sc)
	}
	p, err := cidroute.New(cidroute.Config{Services: []cidroute.Service{sc}, Logger: quiet()})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	return p, errc
}

// transparentExchange sends b from c to to and returns the reply and its
// source, or ok false after a second of silence.
func transparentExchange(t *testing.T, c *net.UDPConn, to netip.AddrPort, b []byte) (reply []byte, from netip.AddrPort, ok bool) {
	t.Helper()
	_, err := c.WriteToUDPAddrPort(b, to)
	require.NoError(t, err)
	buf := make([]byte, 65536)
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil, from, false
	}
	return buf[:n], from, true
}

func transparentClientSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestTransparentWildcardReplySource: a service listening on a wildcard
// address (the usual way to serve a VIP) must answer from the address the
// client sent to, as PPv2 mode does (worker.reverse sets Local to the
// measured destination). Without a source address (the defect) the
// kernel picks one: a client that sent to 127.0.0.5 gets its reply from
// 127.0.0.1, and a connected client socket (OpenSSL's, libcoap's) or a NAT
// drops it. The relay sends through the service socket's batch writer with
// Local set to the address the client used.
func TestTransparentWildcardReplySource(t *testing.T) {
	e := startTransparentEcho(t)
	p := startTransparentPipeline(t, func(s *cidroute.Service) {
		s.Listen = netip.MustParseAddrPort("0.0.0.0:0")
	}, e.addr())
	port, _ := p.Addr("svc")
	vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 5}), port.Port())
	c := transparentClientSocket(t)
	_, from, ok := transparentExchange(t, c, vip, transparentRecord(t, 0, 100))
	require.True(t, ok, "no reply")
	assert.Equal(t, vip, from, "the reply comes from the address the client sent to")
}

// TestTransparentCloseLeavesNoSessions: Pipeline.Close must end every
// session and return, even while the forward goroutine finishes a batch
// that would open sessions; a session opened then would outlive the
// Pipeline or make Close wait forever for its relay. Clients flood from
// fresh addresses while Close runs.
func TestTransparentCloseLeavesNoSessions(t *testing.T) {
	e := startTransparentEcho(t)
	ld := startTransparentFlood(t)
	for i := range 20 {
		p, errc := runTransparentPipeline(t, nil, e.addr())
		to, _ := p.Addr("svc")
		ld.aim(to)
		for ld.sent.Load() < 2000 {
			runtime.Gosched()
		}
		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		select {
		case err := <-closed:
			require.NoError(t, err)
			if err := <-errc; !errors.Is(err, cidroute.ErrClosed) { // ErrClosed: Close won the race with Run's start
				require.NoError(t, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("pipeline %d: Close has not returned after 5 s (stuck in sessionTable.close's wg.Wait)", i)
		}
		ld.aim(netip.AddrPort{})
	}
	ld.stop()
	require.Eventually(t, func() bool { return transparentRelays() == 0 }, 2*time.Second, 20*time.Millisecond,
		"relay goroutines of closed pipelines: %d", transparentRelays())
}

// transparentRelays counts the goroutines serving a transparent session.
func transparentRelays() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "(*sessionTable).relay(")
}

// transparentFlood sends tls12_cid records from ever new loopback source
// addresses (IP_PKTINFO on one wildcard-bound socket) to the current
// target, until stopped.
type transparentFlood struct {
	conn   *net.UDPConn
	target atomic.Pointer[netip.AddrPort]
	sent   atomic.Int64
	done   chan struct{}
	wg     sync.WaitGroup
}

func startTransparentFlood(t *testing.T) *transparentFlood {
	t.Helper()
	g, err := udpio.ListenGroup("udp4", "0.0.0.0:0", 1, udpio.ListenConfig{})
	require.NoError(t, err)
	io, err := udpio.NewConn(g[0], 32)
	require.NoError(t, err)
	f := &transparentFlood{conn: g[0], done: make(chan struct{})}
	rec := transparentRecord(t, 0, 64)
	f.wg.Go(func() {
		out := make([]udpio.Message, 32)
		for k := 1; ; k++ {
			select {
			case <-f.done:
				return
			default:
			}
			to := f.target.Load()
			if to == nil || !to.IsValid() {
				time.Sleep(time.Millisecond)
				continue
			}
			for i := range out {
				k++
				out[i] = udpio.Message{Buf: rec, Addr: *to,
					Local: netip.AddrFrom4([4]byte{127, 3, byte(k >> 8), byte(k)})}
			}
			io.WriteBatch(out)
			f.sent.Add(int64(len(out)))
		}
	})
	t.Cleanup(f.stop)
	return f
}

func (f *transparentFlood) aim(to netip.AddrPort) {
	f.sent.Store(0)
	f.target.Store(&to)
}

func (f *transparentFlood) stop() {
	select {
	case <-f.done:
	default:
		close(f.done)
	}
	f.wg.Wait()
	f.conn.Close()
}

// TestTransparentRelaySurvivesICMP: an ICMP "communication
// administratively prohibited" (type 3 code 13, what a firewall's REJECT
// sends; firewalld's default, code 10, acts the same) for an upstream
// socket makes the socket's next read fail with EHOSTUNREACH: a hard error
// on a connected UDP socket, unlike a plain host unreachable. A relay that
// returned on it (the defect) left its session in the table: the client's
// datagrams still reached the backend, its replies were never read again,
// and the session never expired since the client kept it busy. relay now
// reads on after an errno (fewer than 64 in a row). Needs a raw socket (root
// or CAP_NET_RAW).
func TestTransparentRelaySurvivesICMP(t *testing.T) {
	raw, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP)
	if err != nil {
		t.Skipf("raw ICMP socket: %v (needs CAP_NET_RAW)", err)
	}
	defer syscall.Close(raw)
	e := startTransparentEcho(t)
	p := startTransparentPipeline(t, nil, e.addr())
	to, _ := p.Addr("svc")
	c := transparentClientSocket(t)
	_, _, ok := transparentExchange(t, c, to, transparentRecord(t, 0, 100))
	require.True(t, ok, "no reply before the ICMP error")
	up := e.lastSource() // the session's upstream socket

	// ICMP destination unreachable, code 13, quoting a datagram from the
	// upstream socket to the backend.
	icmp := []byte{3, 13, 0, 0, 0, 0, 0, 0}
	ip := []byte{0x45, 0, 0, 128, 0, 0, 0x40, 0, 64, syscall.IPPROTO_UDP, 0, 0}
	ip = append(ip, up.Addr().AsSlice()...)
	ip = append(ip, e.addr().Addr().AsSlice()...)
	binary.BigEndian.PutUint16(ip[10:], transparentChecksum(ip))
	icmp = append(icmp, ip...)
	icmp = binary.BigEndian.AppendUint16(icmp, up.Port())
	icmp = binary.BigEndian.AppendUint16(icmp, e.addr().Port())
	icmp = append(icmp, 0, 108, 0, 0)
	binary.BigEndian.PutUint16(icmp[2:], transparentChecksum(icmp))
	relays := transparentRelays()
	require.NoError(t, syscall.Sendto(raw, icmp, 0, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	// Give the relay, woken by the error, the first read of it (the
	// forward path's next write could take it instead, and lose only that
	// datagram).
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end) && transparentRelays() == relays; {
		time.Sleep(5 * time.Millisecond)
	}

	// The session goes on: the next exchanges are answered (a resend is
	// allowed, as a DTLS stack would).
	for i := range 3 {
		_, _, ok = transparentExchange(t, c, to, transparentRecord(t, 0, 100))
		if ok {
			break
		}
		t.Logf("try %d unanswered", i+1)
	}
	for _, s := range p.Stats() {
		t.Logf("sessions %d, forward drops %v, reverse drops %v", s.Sessions, dropList(&s.Forward), dropList(&s.Reverse))
	}
	assert.True(t, ok, "the client's session answers again after an ICMP error")
}

func transparentChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// TestTransparentLargeReply: Config.MaxDatagram (default 9216) is "the
// largest datagram accepted in either direction", and PPv2 mode relays a
// 4000-byte reply. Transparent mode once dropped every reply above a fixed
// 2048-byte session buffer as malformed, although it forwarded the
// 4000-byte request; each session's buffer is now MaxDatagram bytes. A
// DTLS server on a link with a larger MTU (loopback, jumbo frames) sends
// such datagrams.
func TestTransparentLargeReply(t *testing.T) {
	for _, transparent := range []bool{false, true} {
		name := "ppv2"
		if transparent {
			name = "transparent"
		}
		t.Run(name, func(t *testing.T) {
			var backend netip.AddrPort
			if transparent {
				backend = startTransparentEcho(t).addr()
			} else {
				backend = testecho.PPv2(t)
			}
			p := startTransparentPipeline(t, func(s *cidroute.Service) { s.Transparent = transparent }, backend)
			to, _ := p.Addr("svc")
			c := transparentClientSocket(t)
			req := transparentRecord(t, 0, 4000)
			reply, _, ok := transparentExchange(t, c, to, req)
			require.True(t, ok, "no reply to a 4000-byte request")
			assert.Equal(t, req, reply)
		})
	}
}
