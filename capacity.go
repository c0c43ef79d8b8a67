package rrl

// The capacity mode (Config keyword capacity): request limits that apply only while
// the server is overloaded, and then share what it can take fairly.
//
// Without requests-per-second, every level of the request limiter still counts every
// query (the sketches are kept warm) but limits nothing. A controller samples the
// server every capacitySampleEvery: its receive queues (bytes queued against the
// buffer size, and the queries lost because a queue was full), what it read, and the
// limiter's own counts. It keeps no estimate of the server's capacity. It regulates
// what it sees at every sample, the receive queues' occupancy, as CoDel regulates a
// standing queue:
//
// The server is overloaded (capacity auto) when its queues stand: at least
// capacityQueueTarget full at every sample of a window (capacityWindow), or
// overflowing at two of them. Then the controller sets R, the rate the limits admit
// (what the server is to read per second), at every sample:
//
//	a queue overflowed:  R = min(R, s * (1 - k*(1 - q0)))
//	q >= q0:             R = s * (1 - k*(q - q0))
//	q <  q0:             R = min(max(s, R * exp(g(t) * (q0 - q)/q0 * dt)), max(R, 2*max(s, a)))
//	                     g(t) = g * min(1, t/1s)
//
// with q the queues' standing occupancy, the least over the window, or the last
// sample's when that is over 2*q0 (a sample that overflowed counts as full; see
// window), q0 = capacityQueueTarget, s the rate the server read over the window, a
// the rate the limiter passed, k = capacityGain, g = capacityRise and t the time
// since a queue last overflowed. What the server read is what entered the queues
// less what is still queued (capacityInput.Served): the queues' growth is not read.
// While the queue stands the server reads as fast as it can, so s is what it can
// serve at that moment, the bottleneck rate as BBR takes it from delivery: R follows
// it at once, a little under it while the queue is above its target, so that the queue
// drains to q0; an overflow says that R was over what the server reads, so its cut
// never raises R. While the queue is under its target the server could read more
// than it is given: R is never under what it read, and rises (a probe, as BBR's,
// that stops when the queue stands again), slowly just after an overflow,
// near the rate that overflowed, and faster, up to g a second, the longer the
// queues run empty (a faster server, or one back from a pause); never above twice
// what passes (no wind-up while the limits do not bind), and never under
// capacityFloor of the arrivals (a stalled server). Nothing else is remembered:
// every sample's evidence replaces the last, so a slow moment moves R only as long
// as it lasts, and a faster server shows at once (its standing queue drains
// faster) or by the rise.
//
// A controller that shares the server's processor (in its process, GOMAXPROCS=1,
// under a CPU quota) runs when the server's reader has emptied the queue or spent
// its share: its samples see a queue that stands, and little of the sawtooth in
// between, so that the overflow is often the first sign that R is over what the
// server reads. The slow rise after an overflow is for that server.
//
// With a configured capacity C (a number) R is C: the overload starts when more
// queries arrive than C, and the receive queues are not needed.
//
// Under overload every adjusted node's limit becomes its factor times one water
// level L (its factor as requests-per-second would give it: the levels' factors,
// source-port-factor for the port node), so that the admitted rate of the lattice,
// each group admitted min(rate, limit), comes to what R leaves after the queries the
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
// target whatever the traffic's shape. The sketches are read every capacityStepEvery,
// less often while the level they give holds still (see read), and L is solved again
// at every sample. Under overload L stays finite: where the cells say the arrivals
// are under the target with no limit, L holds every group at the heaviest cell's
// rate, which limits none of them now and keeps a sender that paused and then sends
// what it owes at once (or a flood that grows before the next read) from passing
// whole.
//
// The overload ends (limits lift) when fewer queries arrive than 1-k(1-q0) of R
// (what an overflow cuts R to), and no queue stands, for 2*capacityRateTau; the
// queries the limiter refuses count as arrivals, so a steady flood keeps the
// overload on and the limits lift within a second of the flood's end. The controller is pure: its inputs carry their clock
// (capacityInput), and a driver (capacity_linux.go for the kernel filter and the
// sockets, or a Go Limiter's counters) samples them every capacitySampleEvery while
// an overload is on or may come, every capacitySampleIdle otherwise (see
// sampleEvery).

import (
	"math"
	"slices"
	"sort"
	"time"
)

// The controller's constants: ten that trade one thing for another, and two
// derived from them or from the sketches. The law's other numbers are these
// constants' consequences: the window is one idle sample long; a sample over twice
// the target (half full) is met at once; the overload ends when arrivals stay
// under what an overflow cuts R to, for two of the averages' time constants; the
// rise takes a second to reach its full rate.
const (
	// capacitySampleEvery is how often a driver samples the queues and counters
	// while the server is overloaded or near it, and capacitySampleIdle otherwise:
	// a wakeup costs more than the sample (tens of microseconds of the Go
	// scheduler's in an idle process), and an idle server needs few. A shorter
	// period reacts sooner to a slower server (fewer overflows) for more wakeups
	// (see sampleEvery for the longer periods tried).
	capacitySampleEvery = 25 * time.Millisecond
	capacitySampleIdle  = 100 * time.Millisecond
	// capacityWindow is the number of samples over which the served rate and the
	// occupancy are taken: one idle sample's length (100 ms), so that an idle
	// controller's single sample and a busy one's window see the same span. A
	// longer span would smooth a server that reads in bursts (a CPU quota's period,
	// a GC) more and react later.
	capacityWindow = int(capacitySampleIdle / capacitySampleEvery)
	// capacityStepEvery is how often the sketches are read under overload (every
	// second otherwise): the cells' arrival rates behind the water level. It is the
	// sketches' half-life: reading 20,000 cells is the controller's main cost, and
	// cells read more often than they decay say little more.
	capacityStepEvery = time.Duration(halfLifeNanos)
	// capacityStepSteady is how little the cells' level may move from one read
	// to the next for the reads to space out (see read): larger reads less
	// often, and notices a flood that changes its sources later (up to a
	// second, while the queue loop holds R).
	capacityStepSteady = 0.05
	// capacityQueueTarget is the standing occupancy the queues are held at under
	// overload, a share of their buffers: higher keeps the server busy through
	// more of its own jitter (a faster moment drains the standing queue instead
	// of idling the server) and leaves less room before a slower moment overflows
	// it; it also delays every answer by its share of the buffer. One sample over
	// twice the target (a queue half full) is met at once, not a window later (a
	// 256-packet buffer holds about 20 ms at 12,000 queries a second).
	capacityQueueTarget = 0.25
	// capacityGain is how far under the served rate R goes per unit of occupancy
	// over the target: higher drains a standing queue sooner and makes R follow
	// the occupancy's noise more. An overflow cuts R to 1-k(1-q0) of the served
	// rate (0.81), and the overload ends when arrivals stay under that share of R.
	capacityGain = 0.25
	// capacityRise is how fast R grows at most, per second in the logarithm, while
	// the queues run empty under the limits; the rise quickens to it over the
	// second after the last overflow: R comes back slowly towards the rate at
	// which the queue overflowed (a server whose process runs the controller too
	// is sampled when its reader has emptied the queue, so the overflow, not the
	// occupancy, is often the only sign that R is over what it reads), and fast
	// once the queue has run empty for a second (a server that got faster, or came
	// back from a pause). Faster overshoots further past the rate that overflowed
	// before the overflow shows it again (each time, about R's excess over the
	// sampling delay, lost); slower regains a faster server later (the simulated
	// schedules' speed-ups, up to twice as fast, are served at 0.9 within 2 s).
	capacityRise = 3
	// capacityRateTau is the time constant of the arrival and admission averages
	// (for the exit and the correction): longer is steadier and later. The
	// overload ends once arrivals have stayed low for two of them (a flood that
	// hovers around R flaps less, and the limits lift later).
	capacityRateTau = 250 * time.Millisecond
	// capacityCorrection is the exponent of the model's correction towards the
	// measured admission per read: small, so that noise in one read moves the
	// level little, and the queue loop, not this, carries the fast changes.
	capacityCorrection = 0.2
	// capacityFloor is the least share of the arrivals R admits: a server that
	// stalls (reads nothing) would take R to 0, and with the Go limiter, whose
	// reads count only once passed, nothing would then show it reading again. Higher
	// keeps more of a flood through a stall; lower trims harder while it lasts.
	capacityFloor = 0.05
	// capacityMinLevel is the lowest water level, in queries per second per unit
	// of factor: the solver's floor. Lower trims a flood over very many sources
	// further (each group below a thousandth of a query a second) for a few more
	// bisection steps' precision lost at the top.
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
	hi := 2 * max(capacityTop(nodes), capacityMinLevel)
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

// capacityTop returns the least water level at which every cell is under its
// node's limit (the lattice admits all it would unlimited): the heaviest cell over
// its node's factor. +Inf: no cell.
func capacityTop(nodes []capacityNode) float64 {
	top := math.Inf(-1)
	for i := range nodes {
		n := &nodes[i]
		if n.factor <= 0 {
			continue
		}
		for _, r := range n.rows {
			if len(r.est) > 0 {
				top = max(top, r.est[0]/n.factor)
			}
		}
	}
	if math.IsInf(top, -1) {
		return math.Inf(1)
	}
	return top
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
	// Served counts the queries the server read, or, where only what entered the
	// queues is counted (the kernel filter passes them), those, with
	// QueuedPackets the estimate of how many of them are still queued at Now: the
	// server read Served less QueuedPackets. While a queue fills, what entered it
	// is more than the server reads, up to a whole buffer more in a window.
	Served        uint64
	QueuedPackets float64
	// Overflow counts the queries lost because a receive queue was full.
	Overflow uint64
	// Queued and QueueLimit are the bytes in the receive queues and the queues'
	// sizes, summed over Sockets sockets; Sockets 0: not known.
	Queued, QueueLimit uint64
	Sockets            int
}

// capacitySample is what one sample saw since the previous one.
type capacitySample struct {
	dt        int64
	served    float64 // read; less than 0 when the queue's estimate grew more than what entered
	passed    uint64  // admitted and fixed: what entered the queues or overflowed
	occupancy float64 // the queues' fill at the sample, 1 when one overflowed since the previous
	overflow  bool
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

// capacityController decides, from samples, whether the server is overloaded, the
// rate R the limits admit and the water level that admits it (see the top of this
// file for the law). Its user serialises calls.
type capacityController struct {
	configured float64 // queries per second; 0 or less: auto

	have bool
	last capacityInput

	win  [capacityWindow]capacitySample // the last samples, a ring
	nwin int                            // samples recorded

	// Rates (queries per second), averaged with capacityRateTau.
	demand, admitted, fixed, aimed float64

	rate       float64 // R: what the limits admit, queries per second; 0: no overload yet
	overflowed int64   // when a queue last overflowed
	overloaded bool
	since      int64         // start of the overload
	lowSince   int64         // since when arrivals are below the exit threshold (-1: not)
	nextRead   int64         // when the sketches are read next
	readAt     int64         // when they were read last
	readEvery  time.Duration // the time from the last read to the next
	nodes      []capacityNode
	level      float64 // in force: +Inf none
	written    float64 // last Level returned with Write
	correction float64 // multiplies the target the sketches are solved for
	target     float64 // the judged rate the level aims at (R less the fixed load)
	overloads  uint64
	// absorb is the rate of random names (the names judge's unknown tier) that
	// passed, which the names level gives up first when R is cut
	// (namesController.absorb): the source lattice aims that much over R. Set by
	// the driver before each step; 0 without a names level in force.
	absorb float64
}

func newCapacityController(configured float64) *capacityController {
	return &capacityController{configured: configured, level: math.Inf(1), written: math.Inf(1), correction: 1, lowSince: -1}
}

// step takes one sample and returns the decision. nodes is called, at most once,
// every capacityStepEvery (every second while no overload is near) and when an
// overload starts; it returns the adjusted nodes with their cells' rates at in.Now
// (see limiterParams.capacityNodes).
func (c *capacityController) step(in capacityInput, nodes func() []capacityNode) capacityDecision {
	if !c.have || in.Now <= c.last.Now {
		if !c.have || in.Now < c.last.Now {
			c.have, c.last = true, in
		}
		return capacityDecision{Level: c.level}
	}
	diff := func(now, before uint64) uint64 {
		if now < before {
			return 0 // a counter started again: no difference to take
		}
		return now - before
	}
	s := capacitySample{
		dt:       in.Now - c.last.Now,
		served:   float64(diff(in.Served, c.last.Served)) + c.last.QueuedPackets - in.QueuedPackets,
		passed:   diff(in.Admitted, c.last.Admitted) + diff(in.fixed, c.last.fixed),
		overflow: diff(in.Overflow, c.last.Overflow) > 0,
	}
	if in.QueueLimit > 0 {
		s.occupancy = min(float64(in.Queued)/float64(in.QueueLimit), 1)
	}
	if s.overflow {
		s.occupancy = 1
	}
	secs := float64(s.dt) / 1e9
	a := 1 - math.Exp(-float64(s.dt)/float64(capacityRateTau))
	avg := func(r *float64, n uint64) { *r += a * (float64(n)/secs - *r) }
	avg(&c.demand, diff(in.Demand, c.last.Demand))
	avg(&c.admitted, diff(in.Admitted, c.last.Admitted))
	avg(&c.fixed, diff(in.fixed, c.last.fixed))
	c.win[c.nwin%capacityWindow] = s
	c.nwin++
	c.last = in

	if in.Now >= c.nextRead || c.nodes == nil && !c.overloaded {
		c.read(in.Now, nodes)
	}
	out := capacityDecision{}
	switch {
	case !c.overloaded && c.entering():
		c.overloaded, c.since, c.lowSince = true, in.Now, -1
		c.overloads++
		c.correction, c.aimed = 1, 0
		c.readEvery = 0 // an overload starts with reads every capacityStepEvery
		out.Start = true
		if c.readAt != in.Now {
			c.read(in.Now, nodes) // the cells' rates now
		}
		c.regulate(in.Now, secs, true)
		c.solve(in.Now)
	case c.overloaded && c.exiting(in.Now):
		c.overloaded = false
		c.level = math.Inf(1)
		out.Stop = true
	case c.overloaded:
		c.regulate(in.Now, secs, false)
		c.solve(in.Now)
	}
	out.Level = c.level
	if changed(c.level, c.written) {
		out.Write, c.written = true, c.level
	}
	return out
}

// read reads the sketches into c.nodes and schedules the next read: after
// capacityStepEvery while an overload is on or near, and every second otherwise.
// While the level the cells give for the same target moves by less than
// capacityStepSteady from one read to the next under overload (a steady flood),
// the next read comes twice as late, up to a second: reading the cells is the
// controller's main cost, and the queue loop, which R carries, needs no new read
// (a configured capacity has no queue loop: its correction needs every read).
func (c *capacityController) read(now int64, nodes func() []capacityNode) {
	target := c.correction * c.target
	before := math.NaN()
	if c.overloaded && c.configured <= 0 && c.nodes != nil {
		before = capacitySolve(c.nodes, target) // the storage is reused by the read
	}
	c.nodes, c.readAt = nodes(), now
	every := time.Second
	if c.near() {
		every = capacityStepEvery
		if after := capacitySolve(c.nodes, target); before > 0 && (after == before || math.Abs(after-before) <= capacityStepSteady*before) {
			every = min(max(2*c.readEvery, capacityStepEvery), time.Second)
		}
	}
	c.readEvery = every
	c.nextRead = now + int64(every)
}

// window returns, over the last capacityWindow samples, the rate the server read,
// the rate that passed the limiter, the queues' occupancy as the law takes it, and
// whether they stood: every sample at least capacityQueueTarget full, or two of them
// overflowing. The occupancy is the least of the window's samples, the standing
// queue (as CoDel takes the least sojourn time over its interval: the sawtooth of
// a server that reads in bursts, a CPU quota's period, passes, a queue that stands
// does not), or the last sample's when that is over twice the target (a queue
// that fills towards overflow is met at once, not a window later).
func (c *capacityController) window() (served, passed, occupancy float64, standing bool) {
	n := min(c.nwin, capacityWindow)
	if n == 0 {
		return 0, 0, 0, false
	}
	var dt int64
	var sv float64
	var ps uint64
	full, over := true, 0
	occupancy = 1
	for i := range n {
		s := c.win[(c.nwin-1-i)%capacityWindow]
		dt += s.dt
		sv += s.served
		ps += s.passed
		occupancy = min(occupancy, s.occupancy)
		full = full && s.occupancy >= capacityQueueTarget
		if s.overflow {
			over++
		}
	}
	if last := c.win[(c.nwin-1)%capacityWindow].occupancy; last > 2*capacityQueueTarget {
		occupancy = max(occupancy, last)
	}
	secs := float64(dt) / 1e9
	return max(sv, 0) / secs, float64(ps) / secs, occupancy, n == capacityWindow && (full || over >= 2)
}

// regulate sets R from the window: the served rate scaled by the occupancy's error
// while the queues are above their target, and a rise while below (see the top of
// this file). A configured capacity is R.
func (c *capacityController) regulate(now int64, secs float64, start bool) {
	if c.configured > 0 {
		c.rate = c.configured
		return
	}
	served, passed, q, _ := c.window()
	err := q - capacityQueueTarget
	floor := capacityFloor * c.demand
	if err >= 0 || start {
		r := served * (1 - capacityGain*err)
		if start {
			c.overflowed = now
		} else if c.win[(c.nwin-1)%capacityWindow].overflow {
			// A queue overflowed since the previous sample: R was over what
			// the server reads now, so the cut never raises it.
			r = min(r, c.rate)
			c.overflowed = now
		}
		c.rate = max(r, floor)
		return
	}
	// The rise quickens with the time since a queue last overflowed: slow just
	// over the rate that overflowed (where a server whose queue the samples do
	// not see would overflow it next), up to capacityRise once none has for
	// a second.
	g := capacityRise * min(1, float64(now-c.overflowed)/float64(time.Second))
	rise := max(c.rate, floor) * math.Exp(g*(-err/capacityQueueTarget)*secs)
	c.rate = min(max(served, rise), max(c.rate, 2*max(served, passed, floor)))
}

// solve sets the water level at which the sketches' model admits R less the fixed
// load (plus the random names the names level gives up first, absorb), corrected by
// what the limits measured to admit.
func (c *capacityController) solve(now int64) {
	target := max(c.rate-c.fixed, capacityFloor*c.rate) + c.absorb
	c.target = target
	if c.aimed == 0 {
		c.aimed = target
	}
	c.aimed += (1 - math.Exp(-float64(c.lastDt())/float64(capacityRateTau))) * (target - c.aimed)
	if c.readAt == now && now-c.since >= int64(time.Second) && c.admitted > 0 {
		// At each read, from a second into the overload (the sketches' estimates
		// have risen to the flood by then): the model's error, as measured by
		// what the limits admitted against what they aimed at, unless nothing is
		// limited and the arrivals are under the target anyway.
		if ratio := c.aimed / c.admitted; !math.IsInf(c.level, 1) || ratio < 1 {
			c.correction *= min(max(math.Pow(ratio, capacityCorrection), 0.9), 1.1)
			c.correction = min(max(c.correction, 1.0/8), 8)
		}
	}
	c.level = capacitySolve(c.nodes, c.correction*target)
	if math.IsInf(c.level, 1) {
		// The cells arrive under the target unlimited: every group is held
		// at the most any sends, which limits none of them now, so that
		// senders who paused and then send what they owe at once (a stalled
		// sender catching up), or a flood that grows, are not let through
		// whole before the next read.
		c.level = capacityTop(c.nodes)
		if c.absorb > 0 {
			// Random names take the room, and the names level gives it up
			// first: the heaviest groups (the real sources, the resolvers'
			// users and other zones' clients) are held over their rate, not at
			// it, where their arrivals' own noise would trim them by a few
			// percent. A known-name source that grows is met at the next read.
			c.level *= namesTopRoom
		}
	}
}

// lastDt is the last sample's length.
func (c *capacityController) lastDt() int64 {
	if c.nwin == 0 {
		return 0
	}
	return c.win[(c.nwin-1)%capacityWindow].dt
}

// entering reports whether the overload starts: the queues stand (capacity auto), or
// more queries arrive than the configured capacity.
func (c *capacityController) entering() bool {
	if c.configured > 0 {
		return c.demand > c.configured
	}
	_, _, _, standing := c.window()
	return standing
}

// exiting reports whether the overload ends: arrivals have stayed below what an
// overflow cuts R to, 1-k(1-q0) of it (closer to 1 lifts the limits sooner after a
// flood, and flaps more when a flood hovers around R), with the queues under their
// target, for two of the averages' time constants (capacityRateTau: arrivals that
// stay low that long are not the average's lag).
func (c *capacityController) exiting(now int64) bool {
	// At most: a server that stalled has an R of 0, and nothing may arrive after.
	low := c.demand <= (1-capacityGain*(1-capacityQueueTarget))*c.rate
	if low && c.configured <= 0 {
		_, _, q, standing := c.window()
		low = !standing && q < capacityQueueTarget
	}
	if !low {
		c.lowSince = -1
		return false
	}
	if c.lowSince < 0 {
		c.lowSince = now
	}
	return now-c.lowSince >= int64(2*capacityRateTau)
}

// sampleEvery is how long until the next sample: capacitySampleEvery while an
// overload is on or may come (see near), capacitySampleIdle otherwise. A wakeup,
// not the sample's work, is most of the controller's cost, but longer periods
// under an overload were tried and not kept: twice as long while the queues stood
// under their target failed six of the 80 simulated schedules (light groups lost
// to overflows that a later sample let run), and the time the buffers' free room
// would take to fill at the rate passed, halved (a period from the buffer size),
// passed the simulation but left more overflows live (see docs/capacity.md).
func (c *capacityController) sampleEvery() time.Duration {
	if c.near() {
		return capacitySampleEvery
	}
	return capacitySampleIdle
}

// near reports whether an overload is on or may come: a queue was at its target or
// overflowed in the window, or arrivals are over half a configured capacity.
func (c *capacityController) near() bool {
	if c.overloaded || (c.configured > 0 && c.demand > c.configured/2) {
		return true
	}
	for i := range min(c.nwin, capacityWindow) {
		if c.win[i].occupancy >= capacityQueueTarget {
			return true
		}
	}
	return false
}

// changed reports whether a level differs from the one in force enough to write it:
// by 1%, or from or to none.
func changed(level, written float64) bool {
	if math.IsInf(level, 1) || math.IsInf(written, 1) {
		return math.IsInf(level, 1) != math.IsInf(written, 1)
	}
	return math.Abs(level-written) > 0.01*written
}

// capacityStatus is what the controller reports.
type capacityStatus struct {
	capacity   float64 // R; 0: no overload yet (auto)
	overloaded bool
	since      int64
	level      float64 // +Inf: none
	demand     float64
	target     float64
	overloads  uint64
}

func (c *capacityController) status() capacityStatus {
	capacity := c.rate
	if c.configured > 0 {
		capacity = c.configured
	}
	return capacityStatus{
		capacity: capacity, overloaded: c.overloaded, since: c.since, level: c.level,
		demand: c.demand, target: c.target, overloads: c.overloads,
	}
}

// reset forgets the overload and lifts the limits: the counters could not be read,
// so nothing can be judged.
func (c *capacityController) reset() capacityDecision {
	stop := c.overloaded
	c.have, c.overloaded, c.lowSince = false, false, -1
	c.nwin = 0
	c.level = math.Inf(1)
	out := capacityDecision{Level: c.level, Stop: stop}
	if changed(c.level, c.written) {
		out.Write, c.written = true, c.level
	}
	return out
}
