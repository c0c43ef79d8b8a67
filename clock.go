package rrl

import (
	"runtime/metrics"
	"sync"
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
//   - When a sampling reader finds the shared reading more than two ticks behind
//     while other goroutines wait for a P, or the goroutine, woken late while other
//     goroutines wait for a P, finds it so twice in a row, the clock is late: every read reads
//     the monotonic clock until the goroutine's ticks have come without such a wait
//     for a hundred ticks' time (100 ms). This covers readers that just got a P back
//     after other goroutines held it, and readers too rare to sample.
//
// Goroutines waiting for a P are counted with the runtime's metrics, and "other" means
// more than one: when the goroutine's tick comes late, it has taken the P of a
// goroutine the scheduler preempted for it, which then waits; when a reader finds the
// reading two ticks old, the goroutine's timer has fired and it is likely the one
// waiting. One goroutine that reads the clock all the time on the only P (a server
// flooded with GOMAXPROCS 1) starves the ticking goroutine but keeps the reading fresh
// itself, and reading the monotonic clock on every call would cost it a third of a
// Debit for nothing. A sampling reader whose thread lost its CPU to another process
// finds the reading stale with no goroutine waiting: the operating system's doing,
// which the sampling repairs, and which makes the clock late no more than a late tick
// with none waiting does.
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

// clockRecoverTicks is how many ticks' time without a starved tick ends lateness.
const clockRecoverTicks = 100

var coarse struct {
	now   atomic.Int64  // nanoseconds since clockBase at the last refresh
	state atomic.Uint32 // clockUsed | clockRunning | clockLate: one load tells a read what to do
}

// The bits of coarse.state.
const (
	clockUsed    = 1 << iota // read since the last tick
	clockRunning             // the ticking goroutine is running
	clockLate                // the goroutine has fallen behind: readers read the clock
)

// clockIsLate reports whether the clock is late.
func clockIsLate() bool { return coarse.state.Load()&clockLate != 0 }

// clockBase carries a monotonic reading: time.Since(clockBase) is monotonic.
var clockBase = time.Now()

// cheaprand is the runtime's per-thread random generator: a few instructions, no
// shared state. (The runtime keeps it for packages that link to it.)
//
//go:linkname cheaprand runtime.cheaprand
func cheaprand() uint32

// coarseNanos returns the coarse clock in nanoseconds since clockBase. The common
// case (running, read already this tick, not late) costs one load of the state, the
// draw and the load of the reading.
func coarseNanos() int64 {
	if coarse.state.Load() == clockUsed|clockRunning {
		if cheaprand()&clockSampleMask != 0 {
			return coarse.now.Load()
		}
		return sampleClock()
	}
	return coarseNanosSlow()
}

// coarseNanosSlow is coarseNanos for the first read of a tick, a read while the clock
// is late, and a read that finds the goroutine stopped (which starts it).
func coarseNanosSlow() int64 {
	st := coarse.state.Load()
	if st&clockUsed == 0 {
		coarse.state.Or(clockUsed) // written once per tick at most, not per call
	}
	if st&clockRunning != 0 {
		if st&clockLate == 0 && cheaprand()&clockSampleMask != 0 {
			return coarse.now.Load()
		}
		return sampleClock()
	}
	n := refreshClock(int64(time.Since(clockBase)))
	for st&clockRunning == 0 {
		if coarse.state.CompareAndSwap(st, st|clockRunning|clockUsed) {
			go tickClock()
			break
		}
		st = coarse.state.Load()
	}
	return n
}

// sampleClock reads the monotonic clock for a reader, refreshing the shared reading
// if it is more than a tick behind and marking the clock late if it is more than
// clockLateTicks behind.
func sampleClock() int64 {
	n := int64(time.Since(clockBase))
	if behind := n - coarse.now.Load(); behind > int64(clockTick) {
		if behind > clockLateTicks*int64(clockTick) && !clockIsLate() && goroutinesWaiting() > 1 {
			// Nobody refreshed the reading for two ticks, the goroutine included,
			// while others than it wait for a P: it is starved, or about to be
			// found so. Readers read the clock until its ticks come on time again.
			coarse.state.Or(clockLate)
		}
		return refreshClock(n)
	}
	return n
}

// waiting holds the sample of goroutinesWaiting.
var waiting struct {
	mu     sync.Mutex
	sample [1]metrics.Sample
}

// goroutinesWaiting returns the number of goroutines waiting for a P. It costs about
// a microsecond: for the rare reads and ticks that find the clock behind.
func goroutinesWaiting() uint64 {
	waiting.mu.Lock()
	defer waiting.mu.Unlock()
	s := &waiting.sample[0]
	s.Name = "/sched/goroutines/runnable:goroutines"
	metrics.Read(waiting.sample[:])
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
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
	idle, stale := 0, 0
	prev := int64(time.Since(clockBase))
	calmSince := prev // the end of the last starved tick
	for range t.C {
		n := int64(time.Since(clockBase))
		// The tick came late while goroutines wait for a P: the Go scheduler held
		// this goroutine back, and holds readers back the same way. A late tick
		// with none waiting is the operating system's doing (or a pause of the
		// whole process), which reading the clock on every call would not cure for
		// the readers, which waited as well. One waiting is the goroutine whose P
		// this one took, if it had to be preempted for it.
		starved := n-prev > clockLateTicks*int64(clockTick) && goroutinesWaiting() > 1
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
				coarse.state.Or(clockLate)
			}
			calmSince = n
		case starved:
			stale, calmSince = 0, n
		default:
			stale = 0
			if n-calmSince >= clockRecoverTicks*int64(clockTick) && clockIsLate() {
				coarse.state.And(^uint32(clockLate))
			}
		}
		refreshClock(n)
		if coarse.state.And(^uint32(clockUsed))&clockUsed != 0 {
			idle = 0
			continue
		}
		if idle++; idle >= clockIdleTicks {
			coarse.state.And(^uint32(clockRunning))
			return
		}
	}
}
