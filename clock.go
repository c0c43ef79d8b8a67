package rrl

import (
	"runtime/metrics"
	"sync/atomic"
	"time"
	_ "unsafe" // for go:linkname
)

// The default clock of an RRL and of a Limiter. Reading the monotonic clock costs
// about as much as the rest of a Debit on the virtual machines this package is
// measured on, and reading the timestamp counter directly half that. Rate limiting
// needs far less resolution: BIND works in whole seconds. So Debit reads a shared
// coarse clock, a monotonic reading refreshed every millisecond by one goroutine for
// the whole process.
//
// That goroutine needs a P to run, and a process whose every P runs goroutines that
// do not block (a flood of CPU-bound work) gives it one only when the scheduler
// preempts one of them, every 10 ms or so: time would stand still in between, and
// accounts earn no credit exactly under load. Two things keep the clock within a
// tick of real time then:
//
//   - Readers sample: about one read in 64 (a cheap per-thread random draw decides)
//     reads the monotonic clock itself and, if the shared reading has fallen more
//     than a tick behind, stores the fresh one. A goroutine reading often (a server
//     under load) thus keeps the clock fresh for everyone.
//   - When a sampling reader finds the shared reading more than two ticks behind, or
//     the goroutine, woken late while goroutines wait for a P, finds it so twice in
//     a row, the clock is late: every read reads the monotonic clock until the
//     goroutine's ticks have come without such a wait for a hundred ticks in a row. This covers readers that just got
//     a P back after other goroutines held it, and readers too rare to sample.
//
// Until the clock is first found late, a reader that has just got its P back may
// read a time as old as the goroutine's wait for a P (tens of milliseconds under
// such a load); so may one whose thread waited for a CPU (a host with more runnable
// threads than cores), until the sampling catches up.
//
// The goroutine runs only while the clock is used: it stops after a second in which
// no read happened, and the next read takes a fresh reading itself and starts it
// again. The shared reading never runs backwards, but a read that sampled the clock
// may return a time up to a tick later than the next read returns (an RRL keeps its
// own clock from running backwards; the Limiter takes such a step as time standing
// still).

// clockTick is the resolution of the coarse clock.
const clockTick = time.Millisecond

// clockIdleTicks is how many ticks without a reader stop the goroutine.
const clockIdleTicks = 1000

// clockSampleMask selects the reads that check the clock: one in clockSampleMask+1.
const clockSampleMask = 63

// clockLateTicks is how far behind, in ticks, the shared reading may fall before the
// clock counts as late.
const clockLateTicks = 2

// clockRecoverTicks is how many ticks in a row without starving end lateness.
const clockRecoverTicks = 100

var coarse struct {
	now     atomic.Int64 // nanoseconds since clockBase at the last refresh
	used    atomic.Bool  // read since the last tick
	running atomic.Bool  // the ticking goroutine is running
	late    atomic.Bool  // the goroutine has fallen behind: readers read the clock
}

// clockBase carries a monotonic reading: time.Since(clockBase) is monotonic.
var clockBase = time.Now()

// cheaprand is the runtime's per-thread random generator: a few instructions, no
// shared state. (The runtime keeps it for packages that link to it.)
//
//go:linkname cheaprand runtime.cheaprand
func cheaprand() uint32

// coarseNanos returns the coarse clock in nanoseconds since clockBase.
func coarseNanos() int64 {
	if !coarse.used.Load() {
		coarse.used.Store(true) // written once per tick at most, not per call
	}
	if coarse.running.Load() {
		if !coarse.late.Load() && cheaprand()&clockSampleMask != 0 {
			return coarse.now.Load()
		}
		return sampleClock()
	}
	n := refreshClock(int64(time.Since(clockBase)))
	if coarse.running.CompareAndSwap(false, true) {
		go tickClock()
	}
	return n
}

// sampleClock reads the monotonic clock for a reader, refreshing the shared reading
// if it is more than a tick behind and marking the clock late if it is more than
// clockLateTicks behind.
func sampleClock() int64 {
	n := int64(time.Since(clockBase))
	if behind := n - coarse.now.Load(); behind > int64(clockTick) {
		if behind > clockLateTicks*int64(clockTick) && !coarse.late.Load() {
			// Nobody refreshed the reading for two ticks, the goroutine included:
			// it is starved, or about to be found so. Readers read the clock
			// until its ticks come on time again.
			coarse.late.Store(true)
		}
		return refreshClock(n)
	}
	return n
}

// refreshClock stores n as the shared reading unless a later one is there already,
// and returns the shared reading.
func refreshClock(n int64) int64 {
	for {
		old := coarse.now.Load()
		if n <= old {
			return old
		}
		if coarse.now.CompareAndSwap(old, n) {
			return n
		}
	}
}

func tickClock() {
	t := time.NewTicker(clockTick)
	defer t.Stop()
	runnable := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	idle, calm, stale := 0, 0, 0
	prev := int64(time.Since(clockBase))
	for range t.C {
		n := int64(time.Since(clockBase))
		// The tick came late while goroutines wait for a P: the Go scheduler held
		// this goroutine back, and holds readers back the same way. A late tick
		// with none waiting is the operating system's doing (or a pause of the
		// whole process), which reading the clock on every call would not cure for
		// the readers, which waited as well.
		starved := false
		if n-prev > clockLateTicks*int64(clockTick) {
			metrics.Read(runnable)
			starved = runnable[0].Value.Kind() == metrics.KindUint64 && runnable[0].Value.Uint64() > 0
		}
		prev = n
		// Starved with the shared reading stale makes the clock late: readers that
		// sample often enough keep the reading fresh without this goroutine, and
		// then nothing needs to change. While late, readers keep the reading fresh
		// themselves, so only the ticks tell when the starving is over.
		switch {
		case starved && n-coarse.now.Load() > clockLateTicks*int64(clockTick):
			// Twice in a row: once is a pause of the whole process, such as a
			// garbage collection's.
			if stale++; stale >= 2 {
				coarse.late.Store(true)
			}
			calm = 0
		case starved:
			stale, calm = 0, 0
		default:
			stale = 0
			if calm++; calm >= clockRecoverTicks && coarse.late.Load() {
				coarse.late.Store(false)
			}
		}
		refreshClock(n)
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
