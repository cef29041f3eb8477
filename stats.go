package cidroute

import (
	"fmt"
	"math/bits"
	"strings"
	"sync/atomic"
)

// Counters account for every datagram of one service and direction:
// Received = Forwarded + Σ Dropped, once the pipeline is quiescent.
type Counters struct {
	Received  uint64             // datagrams read from the direction's sockets
	Forwarded uint64             // datagrams sent on
	Dropped   [NumReasons]uint64 // indexed by Reason; Dropped[Forwarded] is 0

	// KernelDrops are the datagrams the kernel dropped on the
	// direction's receiving sockets because their receive buffers were
	// full, before the pipeline could read them (forward: the service
	// sockets; reverse: the shared upstream sockets; transparent
	// sessions' own sockets are not included). So the datagrams the
	// kernel accepted for the pipeline are Received + KernelDrops. The
	// kernel counts in 32 bits per socket, so the sum wraps there, which
	// a Prometheus rate() reads as a counter reset.
	KernelDrops uint64
	// Queued and QueueLimit are gauges of the same sockets' receive
	// queues when read: the bytes waiting now, with the kernel's
	// bookkeeping (about 1 KiB a small datagram), and what the queues may
	// hold (their receive buffers, as the kernel counts them: twice
	// recv_buffer). A queue near its limit is a worker past its capacity:
	// the kernel drops, and a datagram waits about Queued / (bytes a
	// second the worker reads).
	Queued, QueueLimit uint64
	// BatchSizes counts the receive calls that returned datagrams by how
	// many: BatchSizes[i] those of 2^(i-1) to 2^i−1 datagrams ([0] is
	// unused). Received / Batches() is the mean batch: near 1, workers
	// wake for every datagram (a light load, where the cost of waking up
	// is the cost per datagram); near Config.BatchSize they are
	// saturated.
	BatchSizes [NumBatchBuckets]uint64
}

// NumBatchBuckets is the length of Counters.BatchSizes: batches of up to
// 1024 datagrams, Pipeline's largest BatchSize.
const NumBatchBuckets = 12

// batchBucket is the BatchSizes index of a batch of n ≥ 1 datagrams.
func batchBucket(n int) int { return bits.Len(uint(n)) }

// Batches is the number of receive calls that returned datagrams.
func (c *Counters) Batches() uint64 {
	var t uint64
	for _, n := range c.BatchSizes {
		t += n
	}
	return t
}

// DroppedTotal is Σ Dropped.
func (c *Counters) DroppedTotal() uint64 {
	var t uint64
	for _, n := range c.Dropped {
		t += n
	}
	return t
}

// DropSummary lists the non-zero drops in Reason order,
// "rate_limited:3,too_big:1", or "" when there are none: for logs and
// failure messages.
func (c *Counters) DropSummary() string {
	var b strings.Builder
	for r, n := range c.Dropped {
		if n == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", Reason(r), n)
	}
	return b.String()
}

// Balanced reports whether every received datagram is accounted for.
func (c *Counters) Balanced() bool { return c.Received == c.Forwarded+c.DroppedTotal() }

func (c *Counters) add(o *Counters) {
	c.Received += o.Received
	c.Forwarded += o.Forwarded
	for i, n := range o.Dropped {
		c.Dropped[i] += n
	}
	c.KernelDrops += o.KernelDrops
	c.Queued += o.Queued
	c.QueueLimit += o.QueueLimit
	for i, n := range o.BatchSizes {
		c.BatchSizes[i] += n
	}
}

// batch counts one receive call that returned n datagrams.
func (c *Counters) batch(n int) {
	c.Received += uint64(n)
	c.BatchSizes[batchBucket(n)]++
}

// ServiceStats is a snapshot of one service's counters.
type ServiceStats struct {
	Name    string   // Service.Name
	Forward Counters // client → backend
	Reverse Counters // backend → client
	// Sessions is the number of transparent-mode sessions (0 in PPv2
	// mode, which keeps no per-client state), and MaxSessions what the
	// session tables of all the service's workers hold at most (0 in PPv2
	// mode): a datagram of a new flow finding its worker's table full is
	// dropped as SessionLimit.
	Sessions, MaxSessions int
	// SessionsEvicted counts the transparent sessions a full table
	// expired early, the quietest first, to make room for new flows.
	SessionsEvicted uint64
}

// liveCounters is one worker's counters for one direction. The worker adds
// a whole batch at once; readers load them concurrently. Each worker owns
// its own, so no cache line is shared between workers on the packet path.
type liveCounters struct {
	received, forwarded atomic.Uint64
	dropped             [NumReasons]atomic.Uint64
	batches             [NumBatchBuckets]atomic.Uint64
	_                   [64]byte // keep the next worker's counters off this line
}

func (l *liveCounters) flush(c *Counters) {
	l.received.Add(c.Received)
	if c.Forwarded != 0 {
		l.forwarded.Add(c.Forwarded)
	}
	for i, n := range c.Dropped {
		if n != 0 {
			l.dropped[i].Add(n)
		}
	}
	for i, n := range c.BatchSizes {
		if n != 0 {
			l.batches[i].Add(n)
		}
	}
	*c = Counters{}
}

func (l *liveCounters) load(c *Counters) {
	// Received last: flush adds it first, so a reader during traffic may
	// see more received than accounted for, never less.
	c.Forwarded += l.forwarded.Load()
	for i := range l.dropped {
		c.Dropped[i] += l.dropped[i].Load()
	}
	for i := range l.batches {
		c.BatchSizes[i] += l.batches[i].Load()
	}
	c.Received += l.received.Load()
}
