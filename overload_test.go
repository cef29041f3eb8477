package cidroute

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/internal/testecho"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// The overload tests run one worker past its capacity with open-loop
// senders, which send at their rate whatever comes back. The worker is
// made slower than them on any machine by a stall after each batch (8
// datagrams, then 2 ms: at most 4,000 datagrams a second), so that the
// service or upstream socket overflows while the tests offer 5× that.

const (
	overloadBatch = 8
	overloadStall = 2 * time.Millisecond
	overloadRate  = 20000 // datagrams/s offered: 5× the stalled worker
	overloadFor   = time.Second
)

// startSlowProxy starts a one-worker DTLS pipeline of batch
// overloadBatch whose worker stalls after each batch as st says, with
// small socket buffers so that overload shows as kernel drops at once.
func startSlowProxy(t *testing.T, wait WaitMode, transparent bool, st stall, bs []registry.Backend, mod ...func(*Service)) *testProxy {
	t.Helper()
	needKernelDrops(t)
	reg := newRegistry(t, 42, bs...)
	s := Service{Name: "svc", Listen: netip.MustParseAddrPort("127.0.0.1:0"), Workers: 1,
		RecvBuffer: 64 << 10, stall: &st,
		RouterConfig: RouterConfig{Protocol: DTLS, PublicAddr: publicAddr, Backends: reg, Transparent: transparent}}
	for _, m := range mod {
		m(&s)
	}
	p, err := New(Config{Services: []Service{s}, BatchSize: overloadBatch, Logger: quietLog, Wait: wait})
	require.NoError(t, err)
	runPipeline(t, p)
	return &testProxy{reg: reg, p: p}
}

// needKernelDrops skips where the kernel's drop counts, which show the
// overload, cannot be read: off Linux, or under an emulator (qemu-user)
// that does not pass SO_MEMINFO through.
func needKernelDrops(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's drop counts are read on Linux")
	}
	c := listenLoopback(t)
	if _, err := udpio.KernelDrops(c); err != nil {
		t.Skipf("the kernel's drop count cannot be read here: %v", err)
	}
}

// openLoop calls send(i) for i = 0, 1, … at rate per second, evenly
// spread, for d, whatever comes back, and returns how many it sent. A
// sender that falls behind catches up at once.
func openLoop(rate int, d time.Duration, send func(i int)) int {
	start := time.Now()
	sent := 0
	for {
		el := time.Since(start)
		if el >= d {
			return sent
		}
		for due := int(int64(rate) * int64(el) / int64(time.Second)); sent < due; sent++ {
			send(sent)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// replyCounter counts the datagrams arriving on c until it is closed.
func replyCounter(t *testing.T, c *net.UDPConn) *atomic.Int64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return &n
}

func listenLoopback(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// echoBackends starts two echo backends, ordinals 0 and 1, PPv2 or plain.
func echoBackends(t *testing.T, proxyProtocol bool) ([]*testecho.Echo, []registry.Backend) {
	var es []*testecho.Echo
	var bs []registry.Backend
	for i := range 2 {
		e := testecho.Start(t, testecho.Config{PPv2: proxyProtocol})
		es = append(es, e)
		bs = append(bs, registry.Backend{Ordinal: uint8(i), Addr: e.Addr(), State: registry.Ready})
	}
	return es, bs
}

func overloadModes(t *testing.T, f func(t *testing.T, wait WaitMode)) {
	for _, wait := range []WaitMode{WaitNetpoller, WaitThread} {
		t.Run(wait.String(), func(t *testing.T) { f(t, wait) })
	}
}

// TestOverloadRepliesRelayed: clients offer 5× what the worker forwards.
// The service socket overflows, and every reply the backends send for
// what was forwarded is relayed to its client: the reply socket is read
// while the client socket stays full. Before the thread loop read both
// sockets in every busy round, it relayed one socket buffer of replies
// and then none.
func TestOverloadRepliesRelayed(t *testing.T) {
	overloadModes(t, func(t *testing.T, wait WaitMode) {
		for _, transparent := range []bool{false, true} {
			name := "ppv2"
			if transparent {
				name = "transparent"
			}
			t.Run(name, func(t *testing.T) {
				es, bs := echoBackends(t, !transparent)
				tp := startSlowProxy(t, wait, transparent, stall{overloadStall, 0}, bs)
				codec := tp.router().Codec()
				var clients []*net.UDPConn
				var got []*atomic.Int64
				var msgs [][]byte
				for i := range 4 {
					c := listenLoopback(t)
					clients = append(clients, c)
					got = append(got, replyCounter(t, c))
					msgs = append(msgs, dtlsCIDRecord(ordinalCID(t, codec, uint8(i%2)), 1, make([]byte, 64)))
				}
				var during ServiceStats
				sent := openLoop(overloadRate, overloadFor, func(i int) {
					k := i % len(clients)
					clients[k].WriteToUDPAddrPort(msgs[k], tp.addr())
					if i == overloadRate/2 {
						during = tp.stats()
					}
				})
				// The full client queue shows in its gauge, and is gone
				// once the worker caught up (the slowed worker reads a
				// full queue in about 0.1 s, longer on a loaded machine).
				require.Eventually(t, func() bool { return tp.stats().Forward.Queued == 0 }, 10*time.Second, 10*time.Millisecond,
					"the client queue drains once the load stops")
				s := tp.quiet(t)
				assert.Greater(t, during.Forward.Queued, during.Forward.QueueLimit/2, "queue in the middle of the run")
				assert.LessOrEqual(t, during.Forward.Queued, during.Forward.QueueLimit+4096)
				echoed := es[0].Echoed() + es[1].Echoed()
				var received int64
				for _, n := range got {
					received += n.Load()
				}
				t.Logf("sent %d; forward: forwarded %d, kernel drops %d; backends echoed %d; reverse: relayed %d, kernel drops %d; clients got %d",
					sent, s.Forward.Forwarded, s.Forward.KernelDrops, echoed, s.Reverse.Forwarded, s.Reverse.KernelDrops, received)
				require.Positive(t, s.Forward.KernelDrops, "the worker was not past its capacity")
				require.Positive(t, echoed)
				assert.GreaterOrEqual(t, float64(s.Reverse.Forwarded), 0.9*float64(echoed), "replies relayed of those the backends sent")
				assert.LessOrEqual(t, s.Reverse.KernelDrops, echoed/10, "replies dropped at the upstream socket")
				assert.GreaterOrEqual(t, float64(received), 0.9*float64(s.Reverse.Forwarded), "replies that reached the clients")
			})
		}
	})
}

// TestOverloadReplyFlood: a backend floods replies at 5× what the worker
// relays; a client's datagrams at a modest rate are all forwarded, and
// its replies keep a share of what the worker relays.
func TestOverloadReplyFlood(t *testing.T) {
	overloadModes(t, func(t *testing.T, wait WaitMode) {
		echo := testecho.Start(t, testecho.Config{PPv2: true})
		flooder := listenLoopback(t)
		bs := []registry.Backend{
			{Ordinal: 0, Addr: echo.Addr(), State: registry.Ready},
			{Ordinal: 1, Addr: flooder.LocalAddr().(*net.UDPAddr).AddrPort(), State: registry.Ready},
		}
		tp := startSlowProxy(t, wait, false, stall{0, overloadStall}, bs)
		ups, _ := tp.p.UpstreamAddrs("svc")
		up := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ups[0].Port())
		sink := listenLoopback(t) // the flood's client, which never reads
		hdr, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: publicAddr, Dst: sink.LocalAddr().(*net.UDPAddr).AddrPort()})
		require.NoError(t, err)
		flood := append(hdr, make([]byte, 64)...)

		client := listenLoopback(t)
		got := replyCounter(t, client)
		msg := dtlsCIDRecord(ordinalCID(t, tp.router().Codec(), 0), 1, make([]byte, 64))
		const clientRate = overloadRate / 20
		var sent int
		done := make(chan struct{})
		go func() {
			defer close(done)
			sent = openLoop(clientRate, overloadFor, func(int) { client.WriteToUDPAddrPort(msg, tp.addr()) })
		}()
		flooded := openLoop(overloadRate, overloadFor, func(int) { flooder.WriteToUDPAddrPort(flood, up) })
		<-done
		s := tp.quiet(t)
		echoed := echo.Echoed()
		t.Logf("client sent %d, forwarded %d (kernel drops %d); backend echoed %d, flood %d; reverse received %d, relayed %d, kernel drops %d; client got %d",
			sent, s.Forward.Forwarded, s.Forward.KernelDrops, echoed, flooded, s.Reverse.Received, s.Reverse.Forwarded, s.Reverse.KernelDrops, got.Load())
		require.Positive(t, s.Reverse.KernelDrops, "the worker was not past its capacity")
		assert.GreaterOrEqual(t, float64(s.Forward.Forwarded), 0.95*float64(sent), "client datagrams forwarded under the reply flood")
		share := float64(s.Reverse.Received) / float64(echoed+uint64(flooded))
		// Measured 0.57–0.75 of the share on the netpoller, 1.1–1.4 on the
		// thread (12 runs each on a quiet 2-core machine); a starved
		// direction gets none.
		assert.GreaterOrEqual(t, float64(got.Load()), 0.3*share*float64(echoed), "the client's replies: at least 0.3 of their proportional share (%.2f)", share)
	})
}

// TestOverloadJunkFlood: three senders flood the worker at 5× its
// capacity with CID records of an ordinal no backend has, random bytes
// and ClientHellos, while a client sends at a twentieth of the flood's
// rate. The worker processes what it can; the client's round trips keep
// their share of what it processed (measured 0.56–1.3 of the proportional
// share on a quiet and a loaded 2-core machine: the kernel frees a full
// socket's room in chunks, which bursts fill; asserted at 0.4), and its
// replies are relayed. With EarlyDrop the socket filter takes the first
// two kinds before they queue, so the client shares the worker with the
// ClientHellos alone.
func TestOverloadJunkFlood(t *testing.T) {
	overloadModes(t, func(t *testing.T, wait WaitMode) {
		for _, early := range []bool{false, true} {
			name := "sockets"
			if early {
				name = "early-drop"
			}
			t.Run(name, func(t *testing.T) {
				if early {
					needFilters(t)
				}
				junkFlood(t, wait, early)
			})
		}
	})
}

func junkFlood(t *testing.T, wait WaitMode, early bool) {
	es, bs := echoBackends(t, true)
	tp := startSlowProxy(t, wait, false, stall{overloadStall, 0}, bs, func(s *Service) { s.EarlyDrop = early })
	codec := tp.router().Codec()
	junk := [3][]byte{
		dtlsCIDRecord(ordinalCID(t, codec, 7), 1, make([]byte, 64)),
		make([]byte, 90),
		dtlsClientHello(1),
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range junk[1] {
		junk[1][i] = byte(rnd.Uint32())
	}
	junk[1][0] = 0xff // never a record type
	var junkers []*net.UDPConn
	for range 3 {
		c := listenLoopback(t)
		replyCounter(t, c) // the ClientHellos' echoes
		junkers = append(junkers, c)
	}
	client := listenLoopback(t)
	got := replyCounter(t, client)
	msg := dtlsCIDRecord(ordinalCID(t, codec, 0), 1, make([]byte, 64))

	var sent int
	done := make(chan struct{})
	go func() {
		defer close(done)
		sent = openLoop(overloadRate/20, overloadFor, func(int) { client.WriteToUDPAddrPort(msg, tp.addr()) })
	}()
	flooded := openLoop(overloadRate, overloadFor, func(i int) {
		junkers[i%3].WriteToUDPAddrPort(junk[i%3], tp.addr())
	})
	<-done
	s := tp.quiet(t)
	// What reached the socket's queue: without the filter every
	// datagram, with it the client's and the ClientHellos.
	reached := sent + flooded
	if early {
		reached = sent + flooded/3
	}
	processed := float64(s.Forward.Received) / float64(reached)
	t.Logf("client sent %d, got %d (%.2f); junk %d; forward: received %d (%.2f of what reached the socket), dropped %s, kernel drops %d; reverse relayed %d, kernel drops %d",
		sent, got.Load(), float64(got.Load())/float64(sent), flooded, s.Forward.Received, processed, s.Forward.DropSummary(), s.Forward.KernelDrops, s.Reverse.Forwarded, s.Reverse.KernelDrops)
	require.Positive(t, s.Forward.KernelDrops, "the worker was not past its capacity")
	assert.GreaterOrEqual(t, float64(got.Load()), 0.4*processed*float64(sent), "the client's round trips: at least 0.4 of their proportional share")
	assert.LessOrEqual(t, s.Reverse.KernelDrops, (es[0].Echoed()+es[1].Echoed())/10, "replies dropped at the upstream socket")
	if early {
		assert.Zero(t, s.Forward.Dropped[Malformed]+s.Forward.Dropped[UnknownOrdinal], "the filter drops these before they queue")
	}
}
