package cidroute

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/registry"
	"github.com/cidroute/cidroute/udpio"
)

// TestKernelDropsAndBatches: a backend floods the proxy's upstream socket,
// whose receive buffer is tiny, faster than a worker reads. The kernel's
// drops are counted, and with what the pipeline received they are
// exactly what was sent (loopback loses nothing else); the batch sizes
// account for every received datagram.
func TestKernelDropsAndBatches(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's drop count is read on Linux (SO_MEMINFO)")
	}
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	_, err = udpio.KernelDrops(probe)
	probe.Close()
	if errors.Is(err, udpio.ErrNotSupported) {
		t.Skipf("the kernel's drop count cannot be read here (%v)", err)
	}
	require.NoError(t, err)
	for _, wait := range []WaitMode{WaitNetpoller, WaitThread} {
		t.Run(wait.String(), func(t *testing.T) {
			testWait = wait
			t.Cleanup(func() { testWait = WaitNetpoller })
			be, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			defer be.Close()
			bs := []registry.Backend{{Ordinal: 0, Addr: be.LocalAddr().(*net.UDPAddr).AddrPort(), State: registry.Ready}}
			tp := startProxy(t, DTLS, bs, func(s *Service) { s.Workers, s.RecvBuffer = 1, 4096 })
			ups, _ := tp.p.UpstreamAddrs("svc")
			up := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ups[0].Port())

			// Replies to a client that is not listening: the proxy relays
			// them, the kernel discards them at the client's address.
			hdr, err := ppv2.AppendHeader(nil, ppv2.Header{Command: ppv2.Proxy, Src: publicAddr,
				Dst: netip.MustParseAddrPort("127.0.0.1:9")})
			require.NoError(t, err)
			reply := append(hdr, make([]byte, 200)...)
			out := make([]udpio.Message, 32)
			for i := range out {
				out[i] = udpio.Message{Buf: reply, Addr: up}
			}
			bc, err := udpio.NewConn(be, 32)
			require.NoError(t, err)
			const rounds = 100
			for range rounds {
				n, err := bc.WriteBatch(out)
				require.NoError(t, err)
				require.Equal(t, len(out), n)
			}
			sent := uint64(rounds * len(out))
			var s ServiceStats
			require.Eventually(t, func() bool {
				s = tp.stats()
				return s.Reverse.Received+s.Reverse.KernelDrops == sent && s.Reverse.Balanced()
			}, 5*time.Second, 10*time.Millisecond, "sent %d", sent)
			t.Logf("sent %d: received %d, kernel drops %d, batches %d %v", sent, s.Reverse.Received, s.Reverse.KernelDrops, s.Reverse.Batches(), s.Reverse.BatchSizes)
			assert.NotZero(t, s.Reverse.KernelDrops, "a 4 KiB receive buffer overflows under the flood")
			assert.Equal(t, s.Reverse.Received, s.Reverse.Forwarded+s.Reverse.DroppedTotal())

			// Bucket i holds batches of 2^(i-1) to 2^i-1 datagrams.
			var lo, hi uint64
			for i, n := range s.Reverse.BatchSizes {
				if i == 0 {
					assert.Zero(t, n)
					continue
				}
				lo += n << (i - 1)
				hi += n * (1<<i - 1)
			}
			assert.LessOrEqual(t, lo, s.Reverse.Received)
			assert.GreaterOrEqual(t, hi, s.Reverse.Received)
		})
	}
}

func TestBatchBucket(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 31: 5, 32: 6, 63: 6, 64: 7, 1024: 11} {
		assert.Equal(t, want, batchBucket(n), "batch of %d", n)
	}
	assert.Equal(t, NumBatchBuckets, batchBucket(1024)+1, "the largest batch has a bucket")
}

func TestDropSummary(t *testing.T) {
	var c Counters
	require.Empty(t, c.DropSummary())
	c.Dropped[TooBig], c.Dropped[RateLimited] = 1, 3
	require.Equal(t, "rate_limited:3,too_big:1", c.DropSummary(), "in Reason order")
}
