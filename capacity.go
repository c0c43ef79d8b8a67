package rrl

// The capacity mode (Config keyword capacity): request limits that apply only while
// the server is overloaded, and then share what it can take fairly.
//
// Without requests-per-second, every level of the request limiter still counts every
// query (the sketches are kept warm) but limits nothing. A controller watches the
// server: its receive queues (bytes queued against the buffer size, and the queries
// lost because a queue was full) and the limiter's own counts. The server is
// overloaded when its queues keep overflowing (capacity auto), or when more queries
// arrive than the configured capacity. Then the capacity C is what the server reads
// per second while its queues overflow (auto: the drain rate, measured over windows
// whose queues were full at both ends, so that what entered them is what was read),
// or the configured number. A measured C falls at once (by at most 15% a tenth of a
// second) when the queues overflow under the limits, comes back to its last
// measurement once they are calm (a pause is not a slower server) unless it falls
// again after coming back (then the server is slower: it stays), rises to what the
// server reads while its queues stay busy without growing, and creeps up
// slowly beyond it while nothing is busy, in case the server got faster.
//
// Under overload every adjusted node's limit becomes its factor times one water
// level L (its factor as requests-per-second would give it: the levels' factors,
// source-port-factor for the port node), so that the admitted rate of the lattice,
// each group admitted min(rate, limit), comes to what C leaves after the queries the
// limiter does not judge (proven clients with a valid server cookie, exempt-clients):
// those are served first. This is the max-min fair share: the heaviest groups are
// trimmed to L and lighter ones are untouched. The own-address level (/32, /128), the
// only one a proven query is judged in, keeps its static limit, so proven clients are
// never trimmed to the water level. requests-per-second, when set, stays a ceiling,
// and total-requests-per-second is left alone.
//
// L comes from the sketches: each node's cells give how much that node would admit at
// a limit x, the sum over cells of r*min(1, x/e), with e the cell's estimate (what the
// limiter compares with the limit) and r its arrivals since the previous read (the
// estimate trails a new flood); a family's lattice admits no more than the least of
// its nodes, and L is where that estimate meets the target. Shared cells make the
// estimate wrong by a factor (collisions make groups look heavier than they are), so
// a slow correction on the measured admission (the limiter's passes) brings it to the
// target whatever the traffic's shape. The target leaves a margin under C (90%, 85%
// while a queue is busy) so that the queues drain.
//
// The overload ends (limits lift) when fewer queries arrive than 80% of C for half a
// second; the queries the limiter refuses count as arrivals, so a steady flood keeps
// the overload on and the limit steady, and the limits lift within a second of the
// flood's end. The controller is pure: its inputs carry their clock (capacityInput),
// and a driver (capacity_linux.go for the kernel filter and the sockets, or a Go
// Limiter's counters) samples them every capacitySampleEvery while an overload is on
// or may come, every capacitySampleIdle otherwise (see sampleEvery).

import (
	"math"
	"slices"
	"sort"
	"time"
)

const (
	// capacitySampleEvery is how often a driver samples the queues and counters
	// while the server is overloaded or near it, and capacitySampleIdle otherwise:
	// a wakeup costs more than the sample (tens of microseconds of the Go
	// scheduler's in an idle process), and an idle server needs few.
	capacitySampleEvery = 25 * time.Millisecond
	capacitySampleIdle  = 100 * time.Millisecond
	// capacityStepEvery is how often the water level is recomputed under overload:
	// about the sketches' time constant, so each step sees the previous one's effect.
	capacityStepEvery = 200 * time.Millisecond
	// capacityRateTau is the time constant of the controller's rate averages.
	capacityRateTau = 250 * time.Millisecond
	// capacityMargin is the share of the capacity the limits aim at, so that the
	// queues drain instead of staying at the edge of overflowing; capacityDrain
	// while a queue is busy (at an overload's start it is full), so that it
	// drains in a fraction of a second.
	capacityMargin = 0.9
	capacityDrain  = 0.85
	// capacityExitBelow and capacityExitHold: the overload ends once arrivals stay
	// below this share of C for this long.
	capacityExitBelow = 0.8
	capacityExitHold  = 500 * time.Millisecond
	// capacityBusyFill is the share of its buffer a receive queue must hold for the
	// server to count as busy at a sample.
	capacityBusyFill = 0.5
	// capacityWindow is the number of consecutive busy samples, most of them
	// overflowing, over which a drain rate is measured (200 ms).
	capacityWindow = 8
	// capacityHistory is how many samples the controller keeps (one second).
	capacityHistory = 40
	// capacityQuick is the number of samples (100 ms) over which an overflow during
	// an overload lowers the capacity at once.
	capacityQuick = 4
	// capacityQuickFall is the most one such window lowers it by.
	capacityQuickFall = 0.15
	// capacityProbe is how fast a measured capacity rises while nothing is busy
	// under the limits, per second.
	capacityProbe = 0.005
	// capacityProbeHold is how long after a busy queue the probe waits.
	capacityProbeHold = 5 * time.Second
	// capacityRecover is how fast a capacity that fell on an overflow returns to
	// the last measurement, per second, after capacityRecoverHold of calm.
	capacityRecover     = 0.25
	capacityRecoverHold = 500 * time.Millisecond
	// capacityGain is the exponent of the correction towards the target per step:
	// small, so that noise in one step's measurement moves the limit little.
	capacityGain = 0.2
	// capacitySettle is how long into an overload the correction waits.
	capacitySettle = time.Second
	// capacityLowerAfter is how long into an overload an overflow under the limits
	// may lower the capacity (lower): long enough for the queues, full at the
	// start, to drain and for the sketches' estimates to rise; a fall it makes too
	// soon comes back (probe).
	capacityLowerAfter = 500 * time.Millisecond
	// capacityMinLevel is the lowest water level, in queries per second per unit
	// of factor.
	capacityMinLevel = 1e-3
)

// ---- The water level ----

// fillCurve answers, for one sketch row, how much a node admits at a limit x. A
// cell whose estimate (what the limiter compares with the limit) is e and whose
// queries arrive at r per second admits r*min(1, x/e): all of them under the limit,
// x/e of them over it. The estimate trails the arrivals by the sketches' time
// constant, so at a flood's start r is well above e; when they agree the cell admits
// min(r, x).
type fillCurve struct {
	est    []float64 // the cells' estimates, heaviest first; empty cells left out
	ratio  []float64 // ratio[i] = sum of rate/est over est[:i]; one more entry than est
	suffix []float64 // suffix[i] = sum of the rates of est[i:]; one more entry than est
	keys   []uint64  // sorting storage
}

// curveCell is one cell's estimate and arrival rate.
type curveCell struct{ est, rate float64 }

// newFillCurve makes the curve of cells (at most 4096; reordered in place), using
// buf's storage when it is large enough.
func newFillCurve(cells []curveCell, buf fillCurve) fillCurve {
	// Sorted as integers: a positive float's bits order as the float does, and the
	// low 12 bits (a 2^-40 share of the value) make room for the cell's index.
	keys := slices.Grow(buf.keys[:0], len(cells))
	for i, c := range cells {
		if c.est > 0 {
			keys = append(keys, math.Float64bits(c.est)&^0xfff|uint64(i&0xfff))
		}
	}
	slices.Sort(keys)
	n := len(keys)
	c := fillCurve{
		est:    slices.Grow(buf.est[:0], n)[:n],
		ratio:  slices.Grow(buf.ratio[:0], n+1)[:n+1],
		suffix: slices.Grow(buf.suffix[:0], n+1)[:n+1],
		keys:   keys,
	}
	c.ratio[0], c.suffix[n] = 0, 0
	// Heaviest first: the keys from the end.
	for i := range n {
		cell := cells[keys[n-1-i]&0xfff]
		c.est[i] = cell.est
		c.ratio[i+1] = c.ratio[i] + cell.rate/cell.est
	}
	for i := n - 1; i >= 0; i-- {
		c.suffix[i] = c.suffix[i+1] + cells[keys[n-1-i]&0xfff].rate
	}
	return c
}

// steadyCells returns cells whose rates equal their estimates.
func steadyCells(rates []float64) []curveCell {
	out := make([]curveCell, len(rates))
	for i, r := range rates {
		out[i] = curveCell{r, r}
	}
	return out
}

// total is what the row admits without a limit.
func (c fillCurve) total() float64 { return c.suffix[0] }

// fill returns what the row admits at limit x.
func (c fillCurve) fill(x float64) float64 {
	if math.IsInf(x, 1) {
		return c.suffix[0]
	}
	i := sort.Search(len(c.est), func(i int) bool { return c.est[i] < x })
	return x*c.ratio[i] + c.suffix[i]
}

// level returns the water level of the row for target: the x at which fill(x) is
// target; +Inf when the row sends no more than target, 0 when target is not positive.
func (c fillCurve) level(target float64) float64 {
	if target >= c.total() {
		return math.Inf(1)
	}
	if !(target > 0) {
		return 0
	}
	// The smallest i at which the limit est[i] admits no more than target (est[n]
	// counts as 0); between est[i] and est[i-1], fill(x) = x*ratio[i] + suffix[i].
	n := len(c.est)
	i := sort.Search(n+1, func(i int) bool {
		return i == n || c.est[i]*c.ratio[i]+c.suffix[i] <= target
	})
	if c.ratio[i] == 0 {
		return 0 // the cells over every limit send nothing now
	}
	return (target - c.suffix[i]) / c.ratio[i]
}

// capacityNode is one lattice node as the water level sees it.
type capacityNode struct {
	node   int     // sketch index
	fam    int     // 0 IPv4, 1 IPv6, 2 the port node (both families)
	factor float64 // its limit per unit of water level
	base   float64 // its limit without the water level (+Inf: none)
	rows   [sketchDepth]fillCurve
}

// capacityAdmitted estimates the queries per second the lattice admits at water
// level: each node admits the sum of min(cell, limit) (the larger of its rows, both
// lower bounds of the sum over its groups), a family no more than the least of its
// nodes, and the port node, which both families share, caps their sum.
func capacityAdmitted(nodes []capacityNode, level float64) float64 {
	inf := math.Inf(1)
	fam := [3]float64{inf, inf, inf}
	for i := range nodes {
		n := &nodes[i]
		limit := n.base
		if n.factor > 0 {
			limit = min(limit, level*n.factor)
		}
		a := 0.0
		for _, r := range n.rows {
			a = max(a, r.fill(limit))
		}
		fam[n.fam] = min(fam[n.fam], a)
	}
	sum := 0.0
	for _, a := range fam[:2] {
		if !math.IsInf(a, 1) {
			sum += a
		}
	}
	if math.IsInf(fam[0], 1) && math.IsInf(fam[1], 1) {
		sum = fam[2]
	} else if !math.IsInf(fam[2], 1) {
		sum = min(sum, fam[2])
	}
	if math.IsInf(sum, 1) {
		return 0 // no node: nothing the water level can change
	}
	return sum
}

// capacitySolve returns the water level at which the lattice admits target queries
// per second: +Inf when it admits no more than that unlimited, capacityMinLevel when
// it admits more even there.
func capacitySolve(nodes []capacityNode, target float64) float64 {
	if capacityAdmitted(nodes, math.Inf(1)) <= target {
		return math.Inf(1)
	}
	if capacityAdmitted(nodes, capacityMinLevel) >= target {
		return capacityMinLevel
	}
	// Above the heaviest cell over the smallest factor, every limit is above every
	// cell: the lattice admits all it would unlimited.
	hi := capacityMinLevel
	for i := range nodes {
		n := &nodes[i]
		if n.factor <= 0 {
			continue
		}
		for _, r := range n.rows {
			if len(r.est) > 0 {
				hi = max(hi, r.est[0]/n.factor)
			}
		}
	}
	hi *= 2
	lo := capacityMinLevel
	// Bisection in the logarithm: the admitted rate grows with the level.
	for range 48 {
		mid := math.Sqrt(lo * hi)
		if capacityAdmitted(nodes, mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return math.Sqrt(lo * hi)
}

// capacityScratch is what capacityNodes keeps from one read of the sketches to the
// next: storage, and every cell's count at the previous read, from which it finds
// the cells' arrival rates since.
type capacityScratch struct {
	cells  [numNodes][sketchDepth][]curveCell
	curves [numNodes][sketchDepth]fillCurve
	prev   [numNodes][]float64 // counts at prevAt, decayed to it; row-major
	name   [numNodes]LimiterNode
	prevAt uint64
	nodes  []capacityNode
}

// ---- The controller ----

// capacityInput is one sample of what the controller watches: cumulative counters
// since any start (only their differences count) and the receive queues at Now.
type capacityInput struct {
	Now int64 // nanoseconds of a monotonic clock
	// Demand counts the queries that arrived: refused ones and ones lost to a full
	// queue included, not what the stateless checks drop (responses, reflection
	// ports, runts).
	Demand uint64
	// Admitted counts the queries the request limiter judged and passed: neither
	// proven (valid server cookie) nor exempt.
	Admitted uint64
	// fixed counts the queries passed without the limiter's judgement (proven,
	// exempt, not DNS): load the water level cannot shed.
	fixed uint64
	// Served counts the queries the server read.
	Served uint64
	// Overflow counts the queries lost because a receive queue was full.
	Overflow uint64
	// Queued and QueueLimit are the bytes in the receive queues and the queues'
	// sizes, summed over Sockets sockets; Sockets 0: not known.
	Queued, QueueLimit uint64
	Sockets            int
}

// capacitySampleDelta is what happened between two samples.
type capacitySampleDelta struct {
	dt       int64
	served   uint64
	overflow uint64
	busy     bool   // a queue overflowed or was at least capacityBusyFill full
	close    bool   // begun at the close cadence (capacitySampleEvery)
	empty    bool   // every queue was empty at the sample
	queued   uint64 // bytes in the queues at the sample
}

// capacityDecision is what the driver must do after a sample.
type capacityDecision struct {
	// Level is the water level to put in force, +Inf for none.
	Level float64
	// Write: Level differs from what was last put in force.
	Write bool
	// Start and Stop: the overload started or ended at this sample.
	Start, Stop bool
}

// capacityController decides, from samples, whether the server is overloaded, what
// its capacity is and the water level. Its user serialises calls.
type capacityController struct {
	configured float64 // queries per second; 0 or less: measure

	have bool
	last capacityInput

	hist  [capacityHistory]capacitySampleDelta
	nhist int // samples recorded, for the ring's fill
	// sinceMeasure counts samples since the last drain-rate measurement, so that
	// measurements do not overlap.
	sinceMeasure int

	// Rates (queries per second), averaged with capacityRateTau.
	demand, admitted, fixed, served float64

	capacity   float64 // C: measured or configured; 0 not known yet
	overloaded bool
	since      int64   // start of the overload
	lowSince   int64   // since when arrivals are below the exit threshold (-1: not)
	nextRead   int64   // when the sketches are read next
	lastBusy   int64   // the last sample with a busy queue, for probe
	wasNear    bool    // near() at the previous sample: this one came at the close cadence
	measured   float64 // the capacity as last measured (or probed), which lower goes under
	// recovered: probe raised the capacity towards measured since lower last
	// took it down.
	recovered  bool
	level      float64 // in force: +Inf none
	written    float64 // last Level returned with Write
	correction float64 // multiplies the target the sketches are solved for
	target     float64 // the admitted rate aimed at, at the last step
	overloads  uint64
}

func newCapacityController(configured float64) *capacityController {
	c := &capacityController{configured: configured, level: math.Inf(1), written: math.Inf(1), correction: 1, lowSince: -1}
	if configured > 0 {
		c.capacity = configured
	}
	return c
}

// step takes one sample and returns the decision. nodes is called, at most once,
// every capacityStepEvery and when an overload starts; it returns the adjusted nodes
// with their cells' rates at in.Now (see limiterParams.capacityNodes).
func (c *capacityController) step(in capacityInput, nodes func() []capacityNode) capacityDecision {
	if !c.have || in.Now <= c.last.Now {
		if !c.have || in.Now < c.last.Now {
			c.have, c.last = true, in
		}
		return capacityDecision{Level: c.level}
	}
	d := capacitySampleDelta{dt: in.Now - c.last.Now, close: c.wasNear}
	diff := func(now, before uint64) uint64 {
		if now < before {
			return 0 // a counter started again: no difference to take
		}
		return now - before
	}
	d.served = diff(in.Served, c.last.Served)
	d.overflow = diff(in.Overflow, c.last.Overflow)
	d.busy = d.overflow > 0 || (in.QueueLimit > 0 && float64(in.Queued) >= capacityBusyFill*float64(in.QueueLimit))
	d.empty = in.Sockets > 0 && in.Queued == 0
	d.queued = in.Queued
	secs := float64(d.dt) / 1e9
	a := 1 - math.Exp(-float64(d.dt)/float64(capacityRateTau))
	avg := func(r *float64, n uint64) { *r += a * (float64(n)/secs - *r) }
	avg(&c.demand, diff(in.Demand, c.last.Demand))
	avg(&c.admitted, diff(in.Admitted, c.last.Admitted))
	avg(&c.fixed, diff(in.fixed, c.last.fixed))
	avg(&c.served, d.served)
	c.hist[c.nhist%capacityHistory] = d
	c.nhist++
	c.sinceMeasure++
	c.last = in

	if c.configured <= 0 {
		c.measure()
		if c.overloaded && in.Now-c.since >= int64(capacityLowerAfter) && c.lower() {
			c.nextRead = in.Now // recompute the level at once
		}
	}
	// The sketches are read every step (every second while nothing is near an
	// overload), so that the cells' arrival rates are known from the first step of
	// an overload.
	var read []capacityNode
	readNodes := func() []capacityNode {
		if read == nil {
			read = nodes()
			c.nextRead = in.Now + int64(c.readEvery())
		}
		return read
	}
	if in.Now >= c.nextRead {
		readNodes()
	}
	out := capacityDecision{}
	switch {
	case !c.overloaded && c.entering():
		c.overloaded, c.since, c.lowSince = true, in.Now, -1
		c.overloads++
		out.Start = true
		c.recompute(in.Now, readNodes(), true)
	case c.overloaded && c.exiting(in.Now):
		c.overloaded = false
		c.level = math.Inf(1)
		out.Stop = true
	case c.overloaded && read != nil:
		c.probe()
		c.recompute(in.Now, read, false)
	}
	c.wasNear = c.near()
	out.Level = c.level
	if changed(c.level, c.written) {
		out.Write, c.written = true, c.level
	}
	return out
}

// sampleEvery is how long until the next sample: capacitySampleEvery while an
// overload is on or may come (see near), capacitySampleIdle otherwise.
func (c *capacityController) sampleEvery() time.Duration {
	if c.near() {
		return capacitySampleEvery
	}
	return capacitySampleIdle
}

// near reports whether an overload is on or may come: a queue was busy or overflowed
// in the last capacityWindow samples, or arrivals are over half the capacity.
func (c *capacityController) near() bool {
	if c.overloaded || (c.capacity > 0 && c.demand > c.capacity/2) {
		return true
	}
	for _, d := range c.recent(capacityWindow) {
		if d.busy {
			return true
		}
	}
	return false
}

// readEvery is how long until the sketches are read again: a step under overload
// or when it may come (a queue was busy lately, or arrivals are over half the
// capacity), else a second, which still gives the cells' rates at an overload's
// start, over a longer time.
func (c *capacityController) readEvery() time.Duration {
	if c.near() {
		return capacityStepEvery
	}
	return time.Second
}

// changed reports whether a level differs from the one in force enough to write it:
// by 1%, or from or to none.
func changed(level, written float64) bool {
	if math.IsInf(level, 1) || math.IsInf(written, 1) {
		return math.IsInf(level, 1) != math.IsInf(written, 1)
	}
	return math.Abs(level-written) > 0.01*written
}

// recent returns the last n samples' deltas, oldest first (fewer if not recorded).
func (c *capacityController) recent(n int) []capacitySampleDelta {
	n = min(n, c.nhist, capacityHistory)
	out := make([]capacitySampleDelta, n)
	for i := range n {
		out[i] = c.hist[(c.nhist-n+i)%capacityHistory]
	}
	return out
}

// drainRate returns the rate the server read at over the last n samples, when their
// queues were full at both ends (the first and the last sample overflowed, or every
// one with all, as for the first measurement) and busy in between: it then read as
// fast as it could, and the queues held as much at the end as at the start, so what
// entered them is what it read. Only samples begun at the close cadence count: one
// begun at the idle cadence may have begun long before the queues filled.
func (c *capacityController) drainRate(n int, all bool) (float64, bool) {
	if c.nhist < n {
		return 0, false
	}
	recent := c.recent(n)
	if recent[0].overflow == 0 || recent[n-1].overflow == 0 {
		return 0, false
	}
	for _, d := range recent {
		if !d.busy || all && d.overflow == 0 || !d.close {
			return 0, false
		}
	}
	return servedRate(recent)
}

// servedRate returns what the server read per second over samples.
func servedRate(samples []capacitySampleDelta) (float64, bool) {
	var dt int64
	var served uint64
	for _, d := range samples {
		dt += d.dt
		served += d.served
	}
	if dt <= 0 {
		return 0, false
	}
	return float64(served) / (float64(dt) / 1e9), true
}

// measure takes the drain rate over capacityWindow samples (see drainRate), one
// window after the other; the first one, while the capacity is not known yet, over
// capacityQuick, so that the first overload starts sooner.
func (c *capacityController) measure() {
	n := capacityWindow
	if c.capacity == 0 {
		n = capacityQuick
	}
	if c.sinceMeasure < n {
		c.raiseBusy(capacityQuick)
		return
	}
	rate, ok := c.drainRate(n, c.capacity == 0)
	if !ok {
		return
	}
	switch {
	case c.capacity == 0:
		c.capacity = rate
	case rate < c.capacity:
		// Down fast: too high a capacity overflows the queues.
		c.capacity += 0.7 * (rate - c.capacity)
	default:
		c.capacity += 0.3 * (rate - c.capacity)
	}
	c.sinceMeasure = 0
	c.measured = c.capacity
}

// raiseBusy raises a known capacity to the rate the server read over the last n
// samples when its queues were busy at every one and at the one before, and held no
// more at the end than at the start: it then read at least what entered them
// (Served), as fast as it could. drainRate needs the queues to overflow at both
// ends, which the limits prevent once they hold, so a first measurement taken over
// a slow moment would otherwise come back only by the slow probe. It only raises:
// a rate under the capacity may be a pause.
func (c *capacityController) raiseBusy(n int) {
	if c.capacity == 0 || c.nhist < n+1 {
		return
	}
	recent := c.recent(n + 1)
	if recent[n].queued > recent[0].queued {
		return // the queues grew: some of what entered them was not read
	}
	for _, d := range recent {
		if !d.busy || !d.close {
			return
		}
	}
	if rate, ok := servedRate(recent[1:]); ok && rate > c.capacity {
		c.capacity = rate
		c.measured = max(c.measured, c.capacity)
	}
}

// lower takes the drain rate over the last capacityQuick samples during an overload
// with the limits in force, once they have settled (capacityLowerAfter: before, the
// sketches' estimates are still rising and the queues still full from the start):
// the queues overflowing means that the limits admit more
// than the server takes now (it got slower, or shares its processor), so the
// capacity falls towards what it reads at once rather than after a whole window, by
// at most capacityQuickFall (a short window can catch a pause). It reports whether
// the capacity fell.
func (c *capacityController) lower() bool {
	if c.capacity == 0 || math.IsInf(c.level, 1) {
		return false
	}
	rate, ok := c.drainRate(capacityQuick, false)
	if !ok || rate >= c.capacity {
		return false
	}
	c.capacity = max(rate, (1-capacityQuickFall)*c.capacity)
	if c.recovered {
		// It fell, came back towards the measurement, and overflowed again: the
		// server is slower, not paused, so the capacity stays down (measure and
		// probe still raise it when the server gets faster).
		c.measured, c.recovered = c.capacity, false
	}
	c.nhist, c.sinceMeasure = 0, 0 // these samples are spent
	return true
}

// probe raises a capacity that lower took down back towards the last measurement
// (capacityRecover a second, once no queue was busy for capacityRecoverHold), and a
// measured capacity slowly beyond (capacityProbe a second) while the limits hold
// and no queue has been busy for capacityProbeHold: the capacity may have been measured
// low (the server got faster, or shared its processor meanwhile). When it is too
// high, the queues fill and measure it again.
func (c *capacityController) probe() {
	if c.configured > 0 || c.capacity == 0 || math.IsInf(c.level, 1) {
		return
	}
	recent := c.recent(capacityHistory)
	if len(recent) < capacityHistory {
		return
	}
	for _, d := range recent {
		if d.busy {
			c.lastBusy = c.last.Now
		}
	}
	if c.capacity < c.measured {
		// Back towards the last measurement after a fall (lower), which may
		// have caught a pause: quickly, once the queues stayed calm a while.
		if c.last.Now-c.lastBusy >= int64(capacityRecoverHold) {
			c.capacity = min(c.measured, c.capacity*(1+capacityRecover*capacityStepEvery.Seconds()))
			c.recovered = true
		}
		return
	}
	if c.last.Now-c.lastBusy < int64(capacityProbeHold) {
		return
	}
	c.capacity *= 1 + capacityProbe*capacityStepEvery.Seconds()
	c.measured = c.capacity
}

// entering reports whether the overload starts: the queues keep overflowing (three
// of the last four samples) with the capacity measured, or more queries arrive than
// a known capacity.
func (c *capacityController) entering() bool {
	if c.capacity > 0 && c.demand > c.capacity {
		return true
	}
	if c.configured > 0 || c.capacity == 0 {
		return false
	}
	over := 0
	for _, d := range c.recent(4) {
		if d.overflow > 0 {
			over++
		}
	}
	return over >= 3
}

// exiting reports whether the overload ends: arrivals have stayed below
// capacityExitBelow of C, and (measured) no queue overflowed, for capacityExitHold.
func (c *capacityController) exiting(now int64) bool {
	low := c.demand < capacityExitBelow*c.capacity
	if low && c.configured <= 0 {
		for _, d := range c.recent(4) {
			low = low && d.overflow == 0
		}
	}
	if !low {
		c.lowSince = -1
		return false
	}
	if c.lowSince < 0 {
		c.lowSince = now
	}
	return now-c.lowSince >= int64(capacityExitHold)
}

// targetRate is the admitted rate the limits aim at: what the capacity leaves after
// the load they cannot shed, and never less than 5% of it.
func (c *capacityController) targetRate() float64 {
	margin := capacityMargin
	for _, d := range c.recent(capacityQuick) {
		if d.busy {
			margin = capacityDrain
		}
	}
	total := c.capacity * margin
	return max(total-c.fixed, 0.05*total)
}

// recompute sets the water level: the sketches' solution for the corrected target,
// half-way (in the logarithm) from the level in force so that a step's noise moves
// it little. At the start of an overload it takes the solution at once.
func (c *capacityController) recompute(now int64, nodes []capacityNode, start bool) {
	target := c.targetRate()
	c.target = target
	if !start && c.admitted > 0 && now-c.since >= int64(capacitySettle) {
		// Correct the model by what the limits actually admitted, unless nothing
		// is limited and the demand is under the target anyway. Not before the
		// sketches have settled: until then the cells' arrival rates say more.
		if ratio := target / c.admitted; !math.IsInf(c.level, 1) || ratio < 1 {
			c.correction *= min(max(math.Pow(ratio, capacityGain), 0.9), 1.1)
			c.correction = min(max(c.correction, 1.0/8), 8)
		}
	}
	level := capacitySolve(nodes, c.correction*target)
	if !start && !math.IsInf(level, 1) && !math.IsInf(c.level, 1) {
		level = math.Sqrt(level * c.level)
	}
	c.level = level
}

// capacityStatus is what the controller reports.
type capacityStatus struct {
	capacity   float64 // 0: not known
	overloaded bool
	since      int64
	level      float64 // +Inf: none
	demand     float64
	target     float64
	overloads  uint64
}

func (c *capacityController) status() capacityStatus {
	return capacityStatus{
		capacity: c.capacity, overloaded: c.overloaded, since: c.since, level: c.level,
		demand: c.demand, target: c.target, overloads: c.overloads,
	}
}

// reset forgets the overload and lifts the limits: the counters could not be read,
// so nothing can be judged. The measured capacity is kept.
func (c *capacityController) reset() capacityDecision {
	stop := c.overloaded
	c.have, c.overloaded, c.lowSince = false, false, -1
	c.nhist, c.sinceMeasure = 0, 0
	c.level = math.Inf(1)
	out := capacityDecision{Level: c.level, Stop: stop}
	if changed(c.level, c.written) {
		out.Write, c.written = true, c.level
	}
	return out
}
