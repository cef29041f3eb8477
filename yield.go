package cidroute

import (
	"runtime"
	"sync/atomic"
	"time"
)

// yieldEvery is how often a busy WaitThread loop yields its goroutine.
// The runtime's sysmon treats a goroutine that has not been rescheduled
// for 10 ms as running too long, even one blocked in a syscall: from then
// on it takes the P from under the worker's thread at the thread's
// syscalls, again and again, and polls every 20 µs while it does,
// preempting the worker on its CPU: at 25k datagrams/s, counted per
// thread, about 3,000 wake-ups a second and a tenth of cidproxy's CPU
// (docs/performance.md). A yield every half of those 10 ms keeps the
// goroutine's schedule fresh, and sysmon backs off to its 10 ms sleeps.
// A yield still wakes the thread of the spare P (the runtime's wakep),
// which on one CPU often takes the goroutine: some 200 thread changes a
// second, one futex wake each. Leaving no spare P (GOMAXPROCS = workers)
// stops that but lets sysmon take the P at every wait longer than its
// 20 µs tick, which costs more (docs/performance.md).
const yieldEvery = 5 * time.Millisecond

// A yielder decides when a thread loop yields (runtime.Gosched): once
// every yieldEvery while batches keep coming. A gap of 2×yieldEvery or
// more between two batches starts the count again without a yield: the
// thread was idle, sysmon has taken its P already, and a yield right then
// only adds wake-ups (measured at 50 datagrams/s: 5× the CPU).
type yielder struct {
	last  time.Time     // the last batch
	since time.Time     // the last yield, or the start of this busy spell
	n     atomic.Uint64 // yields so far
	yield func()        // nil: runtime.Gosched; a test's own
}

// batch is called before each batch, with the time.
func (y *yielder) batch(now time.Time) {
	switch {
	case now.Sub(y.last) >= 2*yieldEvery:
		y.since = now
	case now.Sub(y.since) >= yieldEvery:
		if y.yield != nil {
			y.yield()
		} else {
			runtime.Gosched()
		}
		y.n.Add(1)
		y.since = now
	}
	y.last = now
}
