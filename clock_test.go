package rrl

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// clockSlack is what the saturated-clock test allows beyond one tick: the time
// between a sampling read and the reads it refreshes for, and timer jitter.
const clockSlack = time.Millisecond

// clockSample is one checked reading: the coarse clock read between two readings of
// the monotonic clock.
type clockSample struct {
	before, coarse, after int64
}

// readClockSample reads the coarse clock between two monotonic readings.
func readClockSample() clockSample {
	b := int64(time.Since(clockBase))
	c := coarseNanos()
	return clockSample{b, c, int64(time.Since(clockBase))}
}

// TestCoarseClockSaturated: with GOMAXPROCS goroutines reading the clock in a loop,
// as many reading it between slices of work, one reading it between sleeps, and
// 2×GOMAXPROCS goroutines that only burn CPU (so the clock's goroutine gets a P only
// when the scheduler preempts one, every 20 to 80 ms here), every reading stays
// within a tick plus clockSlack of the monotonic clock and never runs ahead of it.
// A sample whose two monotonic readings are more than clockSlack apart (the reader
// lost its P or its thread in between) says nothing and is skipped.
//
// Samples count from the moment the starving has been seen (by a sampling reader or
// a late tick; the test waits at most a second for it): until then a reader that has
// just got its P back may read a time as old as its wait for the P.
func TestCoarseClockSaturated(t *testing.T) {
	coarseNanos() // the ticking goroutine runs
	procs := runtime.GOMAXPROCS(0)
	const runFor = 300 * time.Millisecond
	var stop atomic.Bool
	var from atomic.Int64 // when checking begins
	from.Store(1 << 62)
	var wg sync.WaitGroup
	defer func() { stop.Store(true); wg.Wait() }()

	spin := func(n int) {
		x := uint64(n)
		for range n {
			x = x*6364136223846793005 + 1442695040888963407
		}
		_ = x
	}
	for range 2 * procs { // burn CPU without blocking or reading the clock
		wg.Go(func() {
			for !stop.Load() {
				spin(1000)
			}
		})
	}

	type result struct {
		checked, skipped int
		worst            clockSample
		worstLag         int64
		ahead            *clockSample
	}
	results := make([]result, 2*procs+1)
	reader := func(res *result, between func()) {
		for !stop.Load() {
			s := readClockSample()
			if s.after-s.before > int64(clockSlack) {
				res.skipped++
			} else if s.before >= from.Load() {
				res.checked++
				if s.coarse > s.after {
					res.ahead = &s
				}
				if lag := s.before - s.coarse; lag > res.worstLag {
					res.worstLag, res.worst = lag, s
				}
			}
			between()
		}
	}
	for i := range procs {
		wg.Go(func() { reader(&results[i], func() {}) })
		wg.Go(func() { reader(&results[procs+i], func() { spin(2000) }) }) // about 20 µs of work
	}
	wg.Go(func() { reader(&results[2*procs], func() { time.Sleep(200 * time.Microsecond) }) })

	// Until the starving is first seen, a reader that has just got its P back may
	// read an old time; it is seen at the first sampled read or late tick. If it is
	// not seen within a second, the reading was kept fresh all along, and the check
	// below holds from then on anyway.
	for deadline := time.Now().Add(time.Second); !clockIsLate() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	t.Logf("clock late: %v", clockIsLate())
	from.Store(int64(time.Since(clockBase)))
	time.Sleep(runFor)
	stop.Store(true)
	wg.Wait()

	limit := int64(clockTick + clockSlack)
	for i, r := range results {
		t.Logf("reader %d: %d samples checked, %d skipped, worst lag %v", i, r.checked, r.skipped, time.Duration(r.worstLag))
		if r.checked == 0 {
			t.Errorf("reader %d: no sample checked", i)
		}
		if r.ahead != nil {
			t.Errorf("reader %d: coarse clock %d ahead of the monotonic clock %d", i, r.ahead.coarse, r.ahead.after)
		}
		if r.worstLag > limit {
			t.Errorf("reader %d: coarse clock %v behind the monotonic clock (sample %+v), want at most %v",
				i, time.Duration(r.worstLag), r.worst, time.Duration(limit))
		}
	}
}

// TestCoarseClockLateEndsUnharmed: one goroutine reading the clock all the time on
// the only P starves the clock's goroutine but keeps the reading fresh itself, so a
// late clock ends (after clockRecoverTicks ticks' time, 100 ms) instead of having
// every read read the monotonic clock for as long as the load lasts.
func TestCoarseClockLateEndsUnharmed(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	coarseNanos() // the ticking goroutine runs
	coarse.state.Or(clockLate)
	start := time.Now()
	var sink int64
	for clockIsLate() {
		if time.Since(start) > 2*time.Second {
			t.Fatal("the clock is still late after 2 s of one goroutine reading it")
		}
		for range 10_000 {
			sink += coarseNanos()
		}
	}
	t.Logf("late for %v", time.Since(start))
	_ = sink
}

// BenchmarkCoarseClock: what a read of the coarse clock costs, next to reading the
// monotonic clock each time.
func BenchmarkCoarseClock(b *testing.B) {
	var sink int64
	b.Run("coarse", func(b *testing.B) {
		coarseNanos()
		start := cpuTime()
		for b.Loop() {
			sink += coarseNanos()
		}
		reportCPU(b, start, 1)
	})
	b.Run("monotonic", func(b *testing.B) {
		start := cpuTime()
		for b.Loop() {
			sink += int64(time.Since(clockBase))
		}
		reportCPU(b, start, 1)
	})
	_ = sink
}
