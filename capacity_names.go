package rrl

import (
	"math"
	"time"
)

// The names level (docs/names.md, "The controller"): under an overload the capacity
// controller's R is what the server can serve; random names (the unknown tier) get
// what R leaves after everything else that passed, less a margin, Tu =
// max((1-namesMargin)*R - other, capacityFloor*R), shared max-min fairly across zones: the level Lz is where the
// zone sketch's cells, read as the lattice's are (capacityNodes), admit Tu. While no
// overload is in force the level is none and nothing is limited by name. A
// namesController runs beside the capacity controller, from its samples and status
// (capacityRun.step); the law in capacity.go sees it only as absorb, the random
// names that passed, which its source lattice aims past (namesController.absorb).

// namesMargin is the share of R the random names leave unused, room for R's dips
// between two samples: larger trims random names harder; smaller lets the queue
// overflow (real names lost with the flood) more often at a cut of R. Measured live
// (docs/names.md, "Figures"): 0.1, 0.2, 0.25 and 0.3 with the source lattice
// aiming past the random names (namesAbsorb); 0.2 to 0.3 kept more real answers
// than 0.1, and did not differ from one another beyond the runs' spread.
const namesMargin = 0.2

// namesTopRoom is how far over the heaviest cell's rate the source lattice holds
// every group while a names level is in force and the cells arrive under the
// target unlimited (capacityController.solve): at 1, as without names, the
// arrivals' noise trimmed the heaviest real sources by 2-3% in TestNamesSimFlood;
// 1.3 and 2 kept them at 98-99.7% there, and 1.3 kept more of them live
// (docs/names.md, "Figures").
const namesTopRoom = 1.3

// namesCounts are a names judge's cumulative counters (the kernel's NAMES_*).
type namesCounts struct {
	known, unknown, limited, unknownPassed uint64
}

// namesSource is what a capacitySource with a names judge adds.
type namesSource interface {
	// namesOn reports whether the names judge is on.
	namesOn() bool
	// namesSample reads the names judge's counters.
	namesSample() namesCounts
	// zoneCell reads one cell of the zone sketch (count and time).
	zoneCell(row, col int) (fixed, uint64)
	// applyNames puts the names level in force (0: none).
	applyNames(level float64) error
	// zoneRates appends the named zones whose rate of unknown names is at least
	// min at now (for events).
	zoneRates(now int64, min float64, out []zoneRate) []zoneRate
}

// namesTicker is a namesSource whose learner's upkeep (nameLearner.tick: the sweep
// of dead entries, once per generation) the controller runs at every sample, so
// that the answer path never does. A source whose learner is the kernel filter's
// tables implements it the same way, over the learner it feeds.
type namesTicker interface {
	tickNames(now int64)
}

// namesCounter is a namesSource that counts the distinct names and client networks
// of the zones it is told to watch (names_count.go), for the events' figures. The
// Go Limiter is one; a source that is not (the kernel filter's, whose program keeps
// no such counters) has its events say that the figures are not known.
type namesCounter interface {
	// watchZone starts counting zone from nothing; false when it cannot (no
	// room: the zone's events then have no figures).
	watchZone(zone nameKey) bool
	// zoneFigures returns the distinct names and networks counted for zone since
	// watchZone.
	zoneFigures(zone nameKey) (names, networks float64, ok bool)
	// releaseZone stops counting zone.
	releaseZone(zone nameKey)
}

// namesCountWindow is how long a zone's names and networks are counted before its
// start is reported, so that the event's figures say something: a zone limited for
// less is not reported (as the RRL reports an account's start once it has gone on
// for a second).
const namesCountWindow = time.Second

// namesController computes the names level from the samples. Its user serialises
// calls.
type namesController struct {
	have       bool
	lastNow    int64
	lastPassed uint64
	last       namesCounts

	// Rates, queries per second, averaged with capacityRateTau.
	other, unknown, limited float64
	// unknownPassed is the random names that passed (both judges), which a cut of
	// R takes from first: the source lattice aims that much over R (absorb).
	unknownPassed float64

	prev     []float64 // the zone sketch's counts at prevAt, decayed to it
	prevAt   int64
	nextRead int64
	cells    [sketchDepth][]curveCell
	rows     [sketchDepth]fillCurve

	target  float64 // Tu
	level   float64 // in force: +Inf none
	written float64
	// overloadAt is the start of the overload the level belongs to (0: none).
	overloadAt int64
	nextEvents int64

	// limiting holds the zones whose random names are limited (see events; their
	// start is reported once counted for namesCountWindow), at most maxZoneNames.
	limiting map[nameKey]zoneEpisode
	rates    []zoneRate
}

// zoneEpisode is one zone's random names being limited.
type zoneEpisode struct {
	name     string
	since    int64
	counted  bool // its names and networks are counted (namesCounter.watchZone)
	tried    bool // its start was given to the events' budget
	reported bool // its start was reported, so its stop is too
}

func newNamesController() *namesController {
	return &namesController{level: math.Inf(1), written: math.Inf(1)}
}

// absorb is the rate of random names passed that the names level gives up before a
// source limit need engage, while a names level is in force (0 otherwise): the
// capacity controller's source lattice aims at R plus this (capacityController.absorb).
// The source sketches count what the names judge passed, random names included, so
// that a lattice aiming at R alone trims the heaviest real sources (resolvers with
// their users, the clients of other zones) at every cut of R before the names level,
// read one sample later, gives the cut up; aiming past them, the lattice engages
// only when what is not a random name is more than R.
func (n *namesController) absorb() float64 {
	if n == nil || math.IsInf(n.level, 1) {
		return 0
	}
	return n.unknownPassed
}

// step takes the sample in (the capacity controller's, whose Admitted and fixed
// count what passed) with the names counters c, and the capacity controller's
// status st after its own step; it returns the level and whether to write it.
func (n *namesController) step(in capacityInput, c namesCounts, st capacityStatus, cell func(row, col int) (fixed, uint64)) (float64, bool) {
	passed := in.Admitted + in.fixed
	now := in.Now
	if n.have && now > n.lastNow {
		secs := float64(now-n.lastNow) / 1e9
		a := 1 - math.Exp(-float64(now-n.lastNow)/float64(capacityRateTau))
		dPassed := float64(subFloor(passed, n.lastPassed))
		dUnknownPassed := float64(subFloor(c.unknownPassed, n.last.unknownPassed))
		n.other += a * (max(dPassed-dUnknownPassed, 0)/secs - n.other)
		n.unknown += a * (float64(subFloor(c.unknown, n.last.unknown))/secs - n.unknown)
		n.limited += a * (float64(subFloor(c.limited, n.last.limited))/secs - n.limited)
		n.unknownPassed += a * (dUnknownPassed/secs - n.unknownPassed)
	}
	n.have, n.lastNow, n.lastPassed, n.last = true, now, passed, c

	if !st.overloaded {
		// The zone sketch is read now and then, so that its rates are at hand
		// when an overload starts.
		if now >= n.nextRead {
			n.read(now, cell, time.Second)
		}
		n.overloadAt, n.level, n.target = 0, math.Inf(1), 0
	} else {
		if n.overloadAt != st.since || now >= n.nextRead {
			n.read(now, cell, capacityStepEvery)
		}
		n.overloadAt = st.since
		n.target = max((1-namesMargin)*st.capacity-n.other, capacityFloor*st.capacity)
		n.level = math.Inf(1)
		for _, r := range n.rows {
			n.level = min(n.level, r.level(n.target))
		}
		if n.level <= 0 {
			n.level = capacityMinLevel
		}
	}
	if changed(n.level, n.written) {
		n.written = n.level
		return n.level, true
	}
	return n.level, false
}

// read reads the zone sketch's cells into the fill curves, as capacityNodes reads
// a lattice node's: a cell's rate is its arrivals since the previous read (when that
// was between 50 ms and a second ago, else its estimate), its estimate where the
// decaying count will be capacityPredict later.
func (n *namesController) read(now int64, cell func(row, col int) (fixed, uint64), next time.Duration) {
	n.nextRead = now + int64(next)
	dt := now - n.prevAt
	fresh := n.prevAt == 0 || dt < int64(50*time.Millisecond) || dt > int64(time.Second) || len(n.prev) != sketchDepth*sketchWidth
	if len(n.prev) != sketchDepth*sketchWidth {
		n.prev = make([]float64, sketchDepth*sketchWidth)
	}
	tau := float64(halfLifeNanos) / math.Ln2 / 1e9
	d := math.Exp2(-float64(dt) / halfLifeNanos)
	gain := tau * (1 - d)
	ahead := math.Exp2(-float64(capacityPredict) / halfLifeNanos)
	t := uint64(max(now, 0))
	for row := range sketchDepth {
		cells := n.cells[row][:0]
		for col := range sketchWidth {
			i := row*sketchWidth + col
			count, last := cell(row, col)
			before := n.prev[i]
			if count == 0 {
				n.prev[i] = 0
				if before == 0 || fresh {
					continue
				}
			}
			if t > last {
				count = count.Mul(decayFactor(t - last))
			}
			k := count.Float64()
			n.prev[i] = k
			est := k / tau
			rate := est
			if !fresh {
				rate = max(k-before*d, 0) / gain
				est = rate + (est-rate)*ahead
			}
			if est > 0 {
				cells = append(cells, curveCell{est, rate})
			}
		}
		n.cells[row] = cells
		n.rows[row] = newFillCurve(cells, n.rows[row])
	}
	n.prevAt = now
}

// ---- The Go Limiter as a names source (capacity_go.go) ----

func (g *limiterCapacity) namesOn() bool { return g.l.params.Load().names.on }

func (g *limiterCapacity) namesSample() namesCounts {
	c := g.l.counts()
	return namesCounts{known: c.namesKnown, unknown: c.namesUnknown, limited: c.namesLimited, unknownPassed: c.unknownPassed}
}

func (g *limiterCapacity) zoneCell(row, col int) (fixed, uint64) {
	ln := g.l.names.Load()
	if ln == nil {
		return 0, 0
	}
	return ln.sketch[row][col].load()
}

func (g *limiterCapacity) tickNames(now int64) {
	if ln := g.l.names.Load(); ln != nil {
		ln.learner.Load().tick(uint64(max(now, 0)))
	}
}

func (g *limiterCapacity) applyNames(level float64) error {
	g.l.setNamesLevel(level)
	return nil
}

// stepNames steps the names controller of r over src, if src has a names judge, with
// the capacity controller's sample in and status st, and puts its level in force;
// it returns problem, or the error of that write when there was none.
func (r *capacityRun) stepNames(src capacitySource, in capacityInput, st capacityStatus, problem error) error {
	ns, ok := src.(namesSource)
	if !ok {
		return problem
	}
	if r.names == nil {
		r.names = newNamesController()
	}
	if tk, ok := src.(namesTicker); ok {
		tk.tickNames(in.Now)
	}
	if !ns.namesOn() {
		st.overloaded = false // no names level while the judge is off
	}
	if rw, ok := src.(interface{ takeNamesRewrite() bool }); ok && rw.takeNamesRewrite() && !math.IsInf(r.names.written, 1) {
		r.names.written = -1 // another process's write lifted the level: write it again
	}
	level, write := r.names.step(in, ns.namesSample(), st, ns.zoneCell)
	r.names.events(r, ns, in.Now)
	if write {
		if math.IsInf(level, 1) {
			level = 0
		}
		if err := ns.applyNames(level); err != nil {
			r.names.written = -1 // write again at the next sample
			if problem == nil {
				problem = err
			}
		}
	}
	return problem
}

// namesEventEvery is how often the zones are checked for events while a names level
// is in force: each check reads one sketch cell pair per named zone.
const namesEventEvery = 200 * time.Millisecond

// events finds the zones whose random names the level in force limits (their rate
// over it) and those no longer limited, and queues their events on r (limited by
// events-per-second, as every event): "limit random-subdomain queries under
// victim.test. (about 3,100 names from about 200 networks)" when a zone's random
// names have been over the level for namesCountWindow (at once when ns does not
// count names), "stop" when they fall under half of it or the overload ends.
func (n *namesController) events(r *capacityRun, ns namesSource, now int64) {
	r.mu.Lock()
	cfg := r.cfg
	r.mu.Unlock()
	nc, _ := ns.(namesCounter)
	if cfg == nil || cfg.eventFunc == nil {
		for k, ep := range n.limiting {
			n.stop(r, nil, nc, k, ep, now)
		}
		return
	}
	if n.limiting == nil {
		n.limiting = map[nameKey]zoneEpisode{}
	}
	if !math.IsInf(n.level, 1) && now >= n.nextEvents {
		n.nextEvents = now + int64(namesEventEvery)
		n.rates = ns.zoneRates(now, n.level/2, n.rates[:0])
		seen := map[nameKey]bool{}
		for _, z := range n.rates {
			seen[z.key] = true
			ep, on := n.limiting[z.key]
			if !on {
				if z.rate <= n.level || len(n.limiting) >= maxZoneNames {
					continue
				}
				ep = zoneEpisode{name: z.name, since: now}
				ep.counted = nc != nil && nc.watchZone(z.key)
			}
			if !ep.tried && (!ep.counted || now-ep.since >= int64(namesCountWindow)) {
				ep.tried = true
				ev := LimitEvent{Name: z.name, Limit: n.level, Rate: z.rate}
				zoneFigures(&ev, nc, z.key, ep.counted)
				ep.reported = r.queueNamesEvent(cfg, ev, now)
			}
			n.limiting[z.key] = ep
		}
		for k, ep := range n.limiting {
			if !seen[k] {
				n.stop(r, cfg, nc, k, ep, now)
			}
		}
	}
	if math.IsInf(n.level, 1) {
		for k, ep := range n.limiting {
			n.stop(r, cfg, nc, k, ep, now)
		}
	}
}

// zoneFigures puts the names and networks counted for zone in ev, when counted.
func zoneFigures(ev *LimitEvent, nc namesCounter, zone nameKey, counted bool) {
	if !counted {
		return
	}
	if names, nets, ok := nc.zoneFigures(zone); ok {
		ev.Names, ev.Networks = max(int(math.Round(names)), 1), max(int(math.Round(nets)), 1)
	}
}

// stop ends zone k's episode ep: its stop is reported (with the figures of the
// whole episode) if its start was, and its counters are released.
func (n *namesController) stop(r *capacityRun, cfg *Config, nc namesCounter, k nameKey, ep zoneEpisode, now int64) {
	delete(n.limiting, k)
	if ep.reported && cfg != nil {
		ev := LimitEvent{Stop: true, Name: ep.name, Duration: time.Duration(now - ep.since)}
		zoneFigures(&ev, nc, k, ep.counted)
		r.queueNamesEvent(cfg, ev, now)
	}
	if ep.counted {
		nc.releaseZone(k)
	}
}

// queueNamesEvent queues ev, a names event, for r's step to report, if the events
// budget allows; it reports whether it did.
func (r *capacityRun) queueNamesEvent(cfg *Config, ev LimitEvent, now int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.events.take(now) {
		return false
	}
	ev.Time, ev.Account, ev.Node, ev.ReportOnly = time.Now(), AccountNames, NodeNames, cfg.reportOnly
	r.events.stamp(&ev)
	r.pendingNames = append(r.pendingNames, ev)
	return true
}

// reportNames reports the queued names events, holding no lock (as report).
func (r *capacityRun) reportNames(fn func(LimitEvent)) {
	r.mu.Lock()
	evs := r.pendingNames
	r.pendingNames = nil
	r.mu.Unlock()
	for _, ev := range evs {
		if fn != nil {
			r.report(fn, ev)
		}
	}
}

func (g *limiterCapacity) watchZone(zone nameKey) bool {
	ln := g.l.names.Load()
	return ln != nil && ln.counters.watch(zone)
}

func (g *limiterCapacity) zoneFigures(zone nameKey) (names, networks float64, ok bool) {
	if ln := g.l.names.Load(); ln != nil {
		return ln.counters.figures(zone)
	}
	return 0, 0, false
}

func (g *limiterCapacity) releaseZone(zone nameKey) {
	if ln := g.l.names.Load(); ln != nil {
		ln.counters.release(zone)
	}
}

func (g *limiterCapacity) zoneRates(now int64, min float64, out []zoneRate) []zoneRate {
	return g.l.zoneRates(now, min, out)
}
