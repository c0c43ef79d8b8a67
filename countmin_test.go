package rrl

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"
)

const second = nanosPerSecond

// TestSteadyFlow feeds one cell a perfectly periodic flow for one second and checks
// the estimate taken at the arrival that ends the second, then stops the flow and
// checks the read-only estimate two seconds later.
func TestSteadyFlow(t *testing.T) {
	for _, pps := range []uint64{10, 100, 1_000, 10_000, 100_000} {
		interval := uint64(second) / pps
		start := uint64(5 * second) // not zero: a realistic monotonic clock
		var count fixed
		var last uint64
		now := start
		for ; now <= start+second; now += interval {
			count, last = cellArrive(count, last, now)
		}
		est := arrivalRate(count).Float64()
		if rel := est/float64(pps) - 1; math.Abs(rel) > 0.10 {
			t.Errorf("%d pps: estimate after 1 s = %.1f (%+.1f%%)", pps, est, 100*rel)
		}
		// Converged: the estimate settles at the rate (the -1/2 in arrivalRate removes
		// the sawtooth's bias).
		for end := now + 4*second; now <= end; now += interval {
			count, last = cellArrive(count, last, now)
		}
		est = arrivalRate(count).Float64()
		if rel := est/float64(pps) - 1; math.Abs(rel) > 0.01 {
			t.Errorf("%d pps: converged estimate = %.2f (%+.2f%%)", pps, est, 100*rel)
		}
		// After the flow stops, the read-only estimate starts from the count just
		// after the last arrival (up to 1/2 count above the converged arrival
		// estimate: 1/(2*pps*tau) of the rate, 17% at 10 pps) and halves every H.
		stop := last
		tau := halfLifeNanos / math.Ln2 / second
		sawtooth := 1.01 + 0.6/(float64(pps)*tau) // 1% for the converged estimate
		for _, c := range []struct {
			after        uint64
			above, below float64 // bounds as fractions of the rate
		}{
			{0, 0.99, sawtooth},
			{second / 2, 0.99 * math.Exp2(-0.5/0.2), sawtooth * math.Exp2(-0.5/0.2)},
			{second, 0.99 * math.Exp2(-1/0.2), sawtooth * math.Exp2(-1/0.2)},
			{2 * second, 0, 0.1},   // the bound: below 10% within 2 s
			{60 * second, 0, 1e-9}, // gone
		} {
			got := cellRate(count, last, stop+c.after).Float64() / float64(pps)
			if got < c.above || got >= c.below {
				t.Errorf("%d pps, %v s after stop: estimate is %.4f of the rate, want [%g, %g)",
					pps, float64(c.after)/second, got, c.above, c.below)
			}
		}
	}
}

// TestPoissonFlowUnbiased checks the estimator on random (Poisson) arrivals: a single
// estimate is noisy (relative standard deviation 1/sqrt(2*rate*tau), 36% at 10 pps,
// 3.6% at 1000 pps), but its mean over arrivals is the rate plus 1/(2 tau) = 1.3 pps.
func TestPoissonFlowUnbiased(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 11))
	for _, pps := range []float64{10, 100, 1_000, 10_000} {
		var count fixed
		var last uint64
		now := float64(second)
		sum, n := 0.0, 0
		for now < 21*second {
			now += r.ExpFloat64() / pps * second
			count, last = cellArrive(count, last, uint64(now))
			if now > 2*second {
				sum += arrivalRate(count).Float64()
				n++
			}
		}
		mean := sum / float64(n)
		want := pps + math.Ln2*second/halfLifeNanos/2
		if rel := mean/want - 1; math.Abs(rel) > 0.03 {
			t.Errorf("%g pps Poisson: mean estimate %.2f, want %.2f (%+.1f%%)", pps, mean, want, 100*rel)
		}
	}
}

// TestBurstySource is rakelimit's bad case: 20 packets per second sent as bursts of
// 10 back to back (1 µs apart) every 500 ms. rakelimit's inter-arrival EWMA reads
// this as hundreds of thousands of packets per second. The decayed count reads the
// burst's packets at 11 to 34 pps (the count climbs by one per packet, 2.6 pps each,
// from the 3.8 left of the previous burst), 22.6 pps on average over the packets, and
// 20 pps on average over time.
func TestBurstySource(t *testing.T) {
	var count fixed
	var last uint64
	first := true
	maxEst, sum, n := 0.0, 0.0, 0
	timeSum, timeN := 0.0, 0
	for burst := range 40 { // 20 s
		t0 := uint64(second) + uint64(burst)*second/2
		for i := range uint64(10) {
			count, last = cellArrive(count, last, t0+i*1000)
			est := arrivalRate(count).Float64()
			if first {
				// A fresh source's first packet: 1/2 count over tau.
				if want := 0.5 * math.Ln2 * second / halfLifeNanos; math.Abs(est-want) > 0.01 {
					t.Errorf("first packet estimate = %.3f, want %.3f", est, want)
				}
				first = false
			}
			if burst >= 4 { // after 2 s
				maxEst = max(maxEst, est)
				sum += est
				n++
			}
		}
		for ms := uint64(0); ms < 500 && burst >= 4; ms += 5 {
			timeSum += cellRate(count, last, t0+ms*1_000_000).Float64()
			timeN++
		}
	}
	mean, timeMean := sum/float64(n), timeSum/float64(timeN)
	t.Logf("bursts of 10 at 20 pps: per-packet estimate max %.1f, mean %.1f; time-average %.1f", maxEst, mean, timeMean)
	if maxEst < 30 || maxEst > 45 {
		t.Errorf("max estimate in a burst = %.1f pps, want 30..45 (about twice the real 20)", maxEst)
	}
	if mean < 21 || mean > 26 {
		t.Errorf("mean per-packet estimate = %.1f pps, want 21..26", mean)
	}
	if math.Abs(timeMean-20) > 1 {
		t.Errorf("time-averaged estimate = %.1f pps, want 20±1", timeMean)
	}
}

// TestCellTimeline is a timeline table for one cell, including time standing still and
// stepping backwards: those decay nothing, keep the cell's time, and count the arrival.
func TestCellTimeline(t *testing.T) {
	const h = halfLifeNanos
	type step struct {
		now       uint64
		wantCount fixed
		wantLast  uint64
	}
	steps := []step{
		{10 * h, fixedOne, 10 * h},
		{10 * h, 2 * fixedOne, 10 * h},                                // same instant: no decay
		{9 * h, 3 * fixedOne, 10 * h},                                 // backwards: no decay, time kept
		{0, 4 * fixedOne, 10 * h},                                     // far backwards
		{11 * h, 3 * fixedOne, 11 * h},                                // one half-life later: 4/2 + 1
		{11*h + h/64, fixed(decayTable[1]*3) + fixedOne, 11*h + h/64}, // one table step
		{11 * h, fixed(decayTable[1]*3) + 2*fixedOne, 11*h + h/64},    // backwards again
		{200 * h, fixedOne, 200 * h},                                  // long idle: the old count is gone
	}
	var count fixed
	var last uint64
	for i, s := range steps {
		count, last = cellArrive(count, last, s.now)
		if count != s.wantCount || last != s.wantLast {
			t.Errorf("step %d (now %d): count %#x last %d, want %#x %d", i, s.now, uint64(count), last, uint64(s.wantCount), s.wantLast)
		}
		// Reading at or before the cell's time is the count itself; later, less.
		for _, at := range []uint64{0, last - 1, last} {
			if got, want := cellRate(count, last, at), count.Mul(rateScale); got != want {
				t.Errorf("step %d: cellRate at %d = %#x, want %#x", i, at, uint64(got), uint64(want))
			}
		}
		if got := cellRate(count, last, last+1000); got > count.Mul(rateScale) {
			t.Errorf("step %d: cellRate later is larger", i)
		}
	}
}

// TestCellBackwardsProperty checks, on random timelines with clock steps in both
// directions, that an arrival at a time before the cell's is exactly an arrival at the
// cell's own time: a clock stepping back can neither inflate nor deflate a rate.
func TestCellBackwardsProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		var count, ref fixed
		var last, refLast uint64
		now := uint64(r.Int64N(1 << 40))
		for range 300 {
			switch r.IntN(4) {
			case 0: // standing still
			case 1: // backwards
				now -= min(now, r.Uint64N(1<<30))
			default:
				now += r.Uint64N(1 << 28)
			}
			before := count
			count, last = cellArrive(count, last, now)
			ref, refLast = cellArrive(ref, refLast, max(now, refLast))
			if count != ref || last != refLast {
				t.Fatalf("arrival at %d: (%#x, %d), monotonic reference (%#x, %d)", now, uint64(count), last, uint64(ref), refLast)
			}
			if count > before.Add(fixedOne) {
				t.Fatalf("arrival at %d grew the count by more than one", now)
			}
		}
	}
}

// TestStandingStill sends many arrivals at one instant: the count grows by exactly
// one per arrival (a burst of n reads as n/tau, never as 1/0).
func TestStandingStill(t *testing.T) {
	s := new(countMin)
	const n = 100_000
	now := uint64(3 * second)
	var prev fixed
	for i := 1; i <= n; i++ {
		c := s.arrive(12345, now)
		if c != fixedFromInt(uint64(i)) {
			t.Fatalf("arrival %d at a fixed time: count %v", i, c.Float64())
		}
		if r := arrivalRate(c); r < prev {
			t.Fatalf("rate fell at a fixed time")
		} else {
			prev = r
		}
	}
	if got, want := arrivalRate(fixedFromInt(n)).Float64(), (n-0.5)*rateScale.Float64(); math.Abs(got-want) > 1e-3 {
		t.Errorf("rate after %d arrivals at one instant = %g, want %g", n, got, want)
	}
}

// refSketch is a CountMin sketch of any power-of-two width up to 1<<16 and any depth
// up to 4, written as plainly as possible: the reference for countMin (which is
// refSketch at sketchDepth x sketchWidth, unrolled) and the means to check the
// accuracy bound at sizes where collisions are common.
type refSketch struct {
	depth, width int
	cells        []cmCell // row*width + col
}

func newRefSketch(depth, width int) *refSketch {
	if depth < 1 || depth > 4 || width < 1 || width > 1<<16 || width&(width-1) != 0 {
		panic("bad sketch dimensions")
	}
	return &refSketch{depth, width, make([]cmCell, depth*width)}
}

// column generalises sketchIndex to any width: each row takes its own 16 hash bits.
func (s *refSketch) column(h uint64, row int) int {
	return int(uint32(h>>(16*row)) & uint32(s.width-1))
}

func (s *refSketch) arrive(h, now uint64) fixed {
	least := fixedMax
	for row := range s.depth {
		c := &s.cells[row*s.width+s.column(h, row)]
		count, last := c.load()
		count, last = cellArrive(count, last, now)
		c.store(count, last)
		least = min(least, count)
	}
	return least
}

func (s *refSketch) rate(h, now uint64) fixed {
	least := fixedMax
	for row := range s.depth {
		count, last := s.cells[row*s.width+s.column(h, row)].load()
		least = min(least, cellRate(count, last, now))
	}
	return least
}

type sketch interface {
	arrive(h, now uint64) fixed
	rate(h, now uint64) fixed
}

// TestCountMinMatchesReference runs countMin and refSketch of the same size on one
// random sequence (clock jumps included) and compares every result and cell.
func TestCountMinMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	s, ref := new(countMin), newRefSketch(sketchDepth, sketchWidth)
	now := uint64(second)
	keys := make([]uint64, 5000)
	for i := range keys {
		keys[i] = sketchHash(r.Uint64(), 0, uint64(i))
	}
	for i := range 200_000 {
		now += r.Uint64N(100_000)
		if i%1000 == 0 {
			now -= r.Uint64N(1_000_000) // a step back now and then
		}
		h := keys[r.IntN(len(keys))&^(r.IntN(2)*4095)] // half the arrivals on a few keys
		if got, want := s.arrive(h, now), ref.arrive(h, now); got != want {
			t.Fatalf("arrival %d: countMin %#x, reference %#x", i, uint64(got), uint64(want))
		}
		if got, want := s.rate(h, now+1e6), ref.rate(h, now+1e6); got != want {
			t.Fatalf("arrival %d: countMin rate %#x, reference %#x", i, uint64(got), uint64(want))
		}
	}
	for row := range sketchDepth {
		for col := range sketchWidth {
			c1, l1 := s[row][col].load()
			c2, l2 := ref.cells[row*sketchWidth+col].load()
			if c1 != c2 || l1 != l2 {
				t.Fatalf("cell (%d, %d) differs", row, col)
			}
		}
	}
	s.reset()
	if s.rate(keys[0], now) != 0 {
		t.Errorf("reset left a count")
	}
	if got := unsafe.Sizeof(countMin{}); got != 64<<10 {
		t.Errorf("countMin is %d bytes, want 64 KiB", got)
	}
	if sketchBytes != 768<<10 {
		t.Errorf("sketchBytes = %d, want 768 KiB", sketchBytes)
	}
	if unsafe.Sizeof(cmCell{}) != cellBytes {
		t.Errorf("cell is %d bytes, want %d", unsafe.Sizeof(cmCell{}), cellBytes)
	}
}

// TestCountMinBound is the reference-model test: many keys with skewed rates share
// one sketch, each also counted exactly on its own (the same decayed count in float64
// arithmetic). Per key the sketch must never under-estimate (up to fixed-point
// truncation), and its over-estimate must stay within (e/width) x (sum of all rates)
// for at least a fraction 1-e^-depth of the keys. The small widths make collisions
// common so that the bound is actually exercised. Under the race detector only the
// Limiter's own sketch runs (exhaustive_test.go): the others are the test's
// reference sketch, one goroutine's arithmetic.
func TestCountMinBound(t *testing.T) {
	for _, c := range []struct {
		depth, width, keys int
	}{
		{1, 64, 2000},
		{2, 64, 2000},
		{2, 256, 2000},
		{3, 256, 3000},
		{sketchDepth, sketchWidth, 20000}, // the Limiter's own sketch, below
	} {
		t.Run(fmt.Sprintf("depth%d-width%d", c.depth, c.width), func(t *testing.T) {
			var s sketch = newRefSketch(c.depth, c.width)
			if c.depth == sketchDepth && c.width == sketchWidth {
				s = new(countMin)
			} else {
				exhaustiveOnly(t, fmt.Sprintf("TestCountMinBound/depth%d-width%d", sketchDepth, sketchWidth))
			}
			checkCountMinBound(t, s, c.depth, c.width, c.keys, uint64(c.depth*1000+c.width))
		})
	}
}

func checkCountMinBound(t *testing.T, s sketch, depth, width, keys int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 99))
	hashSeed := r.Uint64()
	// Rates follow a Zipf-like law: key k at 2000/(k+1) pps, a few heavy keys and a
	// long tail, total about 2000*ln(keys).
	rates := make([]float64, keys)
	hashes := make([]uint64, keys)
	next := make([]float64, keys)
	exact := make([]float64, keys)
	lastT := make([]float64, keys)
	total := 0.0
	for k := range keys {
		rates[k] = 2000 / float64(k+1)
		total += rates[k]
		hashes[k] = sketchHash(hashSeed, 0, uint64(k))
		next[k] = float64(second) + r.ExpFloat64()/rates[k]*second
	}
	// Run 3 s of merged Poisson arrivals in time order (a simple scan per event is
	// too slow; a bucketed timeline in 1 ms steps keeps order within 1 ms, and within
	// a step arrivals are applied at the step's time).
	const step = second / 1000
	const tau = (halfLifeNanos) / math.Ln2
	end := float64(4 * second)
	for now := float64(second); now < end; now += step {
		for k := range keys {
			for next[k] < now+step {
				at := now
				exact[k] = exact[k]*math.Exp(-(at-lastT[k])/tau) + 1
				lastT[k] = at
				s.arrive(hashes[k], uint64(at))
				next[k] += r.ExpFloat64() / rates[k] * second
			}
		}
	}
	read := uint64(end)
	sumExact := 0.0
	rateOf := make([]float64, keys)
	for k := range keys {
		rateOf[k] = exact[k] * math.Exp(-(float64(read)-lastT[k])/tau) * float64(second) / tau
		sumExact += rateOf[k]
	}
	bound := math.E / float64(width) * sumExact
	over, worst := 0, 0.0
	for k := range keys {
		est := s.rate(hashes[k], read).Float64()
		// fixed-point truncation loses at most an ulp per update of a cell, a few
		// hundred thousand ulps in all at most: far below 1e-3 pps.
		if est < rateOf[k]*(1-1e-5)-1e-3 {
			t.Fatalf("depth %d width %d: key %d under-estimated: %.4f < exact %.4f", depth, width, k, est, rateOf[k])
		}
		if d := est - rateOf[k]; d > bound {
			over++
			worst = max(worst, d)
		}
	}
	frac := float64(over) / float64(keys)
	t.Logf("depth %d width %d keys %d: total %.0f pps, bound e/w*total = %.2f pps, %d keys (%.2f%%) beyond it (allowed %.1f%%)",
		depth, width, keys, sumExact, bound, over, 100*frac, 100*math.Exp(-float64(depth)))
	if frac > math.Exp(-float64(depth)) {
		t.Errorf("depth %d width %d: %.2f%% of keys over-estimated by more than %.2f pps (worst %.2f), want at most %.1f%%",
			depth, width, 100*frac, bound, worst, 100*math.Exp(-float64(depth)))
	}
}

// TestCountMinConcurrent hammers one sketch from several goroutines (for the race
// detector) and checks that lost updates stay rare: the count is a decayed count,
// so with the clock standing still it is the number of arrivals minus lost ones.
func TestCountMinConcurrent(t *testing.T) {
	s := new(countMin)
	const workers, n = 4, 20000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				s.arrive(uint64(w*n+i), uint64(second)) // spread over the sketch
				s.arrive(42, uint64(second))            // one hot key shared by all
				s.rate(42, uint64(second))
			}
		}()
	}
	wg.Wait()
	got := s.rate(42, uint64(second)).Float64() / rateScale.Float64()
	// The hot key's cells also hold whichever spread keys collided with them.
	if got > workers*n*1.01+1 || got < 1 {
		t.Errorf("hot key count %.0f after %d arrivals", got, workers*n)
	}
	t.Logf("hot key counted %.0f of %d arrivals under contention", got, workers*n)
}

// TestTripCount checks the kernel program's shortcut: below tripCount(limit) the
// arrival rate is below limit, so every draw passes; at it the rate reaches limit.
func TestTripCount(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	limits := []fixed{1, fixedOne, fixedFromInt(100), fixedFromInt(1600), fixedFromRatio(1, 3), rateScale, rateScale + 1, ^fixed(0)}
	for range 200 {
		limits = append(limits, fixed(r.Uint64N(1<<50)))
	}
	for _, limit := range limits {
		trip := tripCount(limit)
		if trip != ^fixed(0) && arrivalRate(trip) < limit {
			t.Fatalf("limit %v: rate at trip count %v is %v, below the limit", limit, trip, arrivalRate(trip))
		}
		if trip > 0 && arrivalRate(trip-1) >= limit {
			t.Fatalf("limit %v: rate %v just below trip count %v reaches the limit", limit, arrivalRate(trip-1), trip)
		}
		for _, c := range []fixed{0, trip / 2, trip - min(trip, 1), trip - min(trip, fixedOne)} {
			if c < trip && (^fixed(0)>>32).Mul(arrivalRate(c)) >= limit {
				t.Fatalf("limit %v: count %v below the trip count would be limited by the largest draw", limit, c)
			}
		}
	}
}
