package rrl

import (
	"sync/atomic"
	"time"
)

// The default clock of an RRL. Reading the monotonic clock costs 40 ns on the
// virtual machines this package is measured on (time.Now twice that), which alone is
// most of a Debit's budget. Rate limiting needs far less resolution than that: BIND
// works in whole seconds. So Debit reads a shared coarse clock, a monotonic reading
// refreshed every millisecond by one goroutine for the whole process.
//
// The goroutine runs only while the clock is used: it stops after a second in which
// no Debit read it, and the next read takes a fresh reading itself and starts it again.
// A reading may lag real time by a tick or by a scheduling delay of the goroutine; a
// lagging clock credits accounts late, never early, so it errs on the side of limiting.

// clockTick is the resolution of the coarse clock.
const clockTick = time.Millisecond

// clockIdleTicks is how many ticks without a reader stop the goroutine.
const clockIdleTicks = 1000

var coarse struct {
	now     atomic.Int64 // nanoseconds since clockBase at the last tick
	used    atomic.Bool  // read since the last tick
	running atomic.Bool  // the ticking goroutine is running
}

// clockBase carries a monotonic reading: time.Since(clockBase) is monotonic.
var clockBase = time.Now()

// coarseNanos returns the coarse clock in nanoseconds since clockBase.
func coarseNanos() int64 {
	if !coarse.used.Load() {
		coarse.used.Store(true) // written once per tick at most, not per call
	}
	if coarse.running.Load() {
		return coarse.now.Load()
	}
	n := int64(time.Since(clockBase))
	coarse.now.Store(n)
	if coarse.running.CompareAndSwap(false, true) {
		go tickClock()
	}
	return n
}

func tickClock() {
	t := time.NewTicker(clockTick)
	defer t.Stop()
	idle := 0
	for range t.C {
		coarse.now.Store(int64(time.Since(clockBase)))
		if coarse.used.Swap(false) {
			idle = 0
			continue
		}
		if idle++; idle >= clockIdleTicks {
			coarse.running.Store(false)
			return
		}
	}
}
