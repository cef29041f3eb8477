package cidroute

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestYielder: a loop whose batches keep coming yields once every
// yieldEvery; one that waited 2×yieldEvery or more starts again without
// yielding.
func TestYielder(t *testing.T) {
	yields := 0
	y := yielder{yield: func() { yields++ }}
	t0 := time.Now()
	at := func(d time.Duration) { y.batch(t0.Add(d)) }

	for d := time.Duration(0); d <= 3*yieldEvery; d += yieldEvery / 10 {
		at(d) // busy: a batch every 0.5 ms
	}
	assert.Equal(t, 3, yields, "at 5, 10 and 15 ms")

	yields = 0
	base := 10 * yieldEvery
	for i := range 5 {
		at(base + time.Duration(i)*2*yieldEvery) // idle: a batch every 10 ms
	}
	assert.Zero(t, yields, "no yield after an idle wait")

	last := base + 8*yieldEvery // the last idle wait ended here
	at(last + yieldEvery/2)     // busy again
	assert.Zero(t, yields, "2.5 ms into the busy spell")
	at(last + yieldEvery)
	assert.Equal(t, 1, yields, "5 ms into it")
	assert.Equal(t, uint64(1+3), y.n.Load(), "the count the worker keeps")
}

// TestWaitThreadYields: a WaitThread worker kept busy yields its
// goroutine (yieldEvery), which keeps the runtime's sysmon from taking
// its P at each syscall.
func TestWaitThreadYields(t *testing.T) {
	tp := startThreadProxy(t)
	w := tp.p.services[0].workers[0]
	require.NotNil(t, w.poll)
	c := newClient(t)
	rec := dtlsCIDRecord(ordinalCID(t, tp.router().Codec(), 0), 1, []byte("ping"))
	deadline := time.Now().Add(10 * time.Second)
	for w.yield.n.Load() == 0 && time.Now().Before(deadline) {
		require.Equal(t, 0, c.ask(tp.addr(), rec))
	}
	assert.NotZero(t, w.yield.n.Load(), "round trips for 10 s without a yield")
}
