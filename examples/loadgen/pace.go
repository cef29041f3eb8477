package main

import (
	"math/bits"
	"time"
)

// A pacer spreads datagrams evenly at rate per second from the start of
// the run: after elapsed, due(elapsed) datagrams should have gone. A sender
// that fell behind catches up in batches; one that is ahead waits.
type pacer struct {
	rate uint64 // datagrams per second, > 0
}

// due returns floor(elapsed·rate / 1 s), exactly (128-bit product).
func (p pacer) due(elapsed time.Duration) uint64 {
	if elapsed <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(elapsed), p.rate)
	if hi >= uint64(time.Second) {
		return ^uint64(0) // beyond any run's length
	}
	q, _ := bits.Div64(hi, lo, uint64(time.Second))
	return q
}

// at returns when datagram number n (counting from 0) is due: the first
// elapsed with due(elapsed) > n.
func (p pacer) at(n uint64) time.Duration {
	hi, lo := bits.Mul64(n+1, uint64(time.Second))
	q, r := bits.Div64(hi, lo, p.rate)
	if r != 0 {
		q++
	}
	return time.Duration(q)
}

// next returns how many datagrams to send now (at most limit) after sent
// have gone, or, when none is due yet, how long to wait for the next one.
func (p pacer) next(elapsed time.Duration, sent uint64, limit int) (n int, wait time.Duration) {
	d := p.due(elapsed)
	if d > sent {
		return int(min(d-sent, uint64(limit))), 0
	}
	return 0, p.at(sent) - elapsed
}
