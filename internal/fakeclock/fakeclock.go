// Package fakeclock is a manual clock for tests of code that takes a clock
// with Now and After (edge.Clock): time moves only when the test says so.
package fakeclock

import (
	"sync"
	"time"
)

// A Clock starts at a fixed time and moves by Advance and Fire. Its
// methods are safe for concurrent use.
type Clock struct {
	mu      sync.Mutex
	cond    *sync.Cond
	now     time.Time
	waiters []waiter
	asked   []time.Duration
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

// New returns a Clock reading start.
func New(start time.Time) *Clock {
	c := &Clock{now: start}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the time once the clock has moved
// d past now. It records d (see Asked).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.asked = append(c.asked, d)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), c: ch})
	c.cond.Broadcast()
	return ch
}

// Advance moves the clock by d and fires the waiters that are due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// Fire waits until someone waits on the clock, then moves the clock to the
// earliest waiter's time and fires it. It returns how far the clock moved.
func (c *Clock) Fire() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.waiters) == 0 {
		c.cond.Wait()
	}
	next := c.waiters[0].at
	for _, w := range c.waiters[1:] {
		if w.at.Before(next) {
			next = w.at
		}
	}
	d := next.Sub(c.now)
	if d > 0 {
		c.now = next
	}
	c.fireLocked()
	return d
}

func (c *Clock) fireLocked() {
	keep := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			keep = append(keep, w)
			continue
		}
		w.c <- c.now
	}
	c.waiters = keep
}

// Asked returns every duration After was called with, in order.
func (c *Clock) Asked() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.asked...)
}
