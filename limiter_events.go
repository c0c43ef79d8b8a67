package rrl

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// How a Limiter reports limiting events (see events.go), per source group: a node
// (prefix level, source port or total) and the packet's group at that node.
//
// A group starts being limited when a packet is limited by its node (the first node,
// finest first, whose limit the packet's draw exceeded, as limiterVerdict.Limited).
// The start is reported at once, with the group's estimated rate. It stops when the
// group's estimated rate has fallen under its limit, found by a sweep that runs at
// most once per second of the packets' clock: run by a call of Allow, allowAt or
// decideAt when it is due, and by a timer (time.AfterFunc) armed only while groups are
// followed and events are on, so that a stop is reported at most about a second after
// the rate fell, whether or not packets keep coming. The timer reads the packets' clock
// as the last start or sweep read it plus the time the coarse clock says has passed
// since. Update turning events off stops it; a pending timer keeps the Limiter alive
// only until its groups' rates have fallen. The sketches hold no addresses, so the
// group is named from the packet that started it.
//
// Packets limited in a group already followed cost one atomic load of a small
// direct-mapped cache of recent groups; the tracker's mutex is taken only when that
// misses. At most maxGroups groups are followed at once; starts beyond are suppressed.
// A suppressed group is not followed, so it may be counted as suppressed again once it
// has left the cache: under a flood of many groups, Suppressed counts starts, not
// distinct groups.

// maxGroups is the number of limited groups a Limiter follows at once.
const maxGroups = 1024

// groupCacheSize is the size of the direct-mapped cache of followed groups.
const groupCacheSize = 256

// groupTracker follows a Limiter's limited groups.
type groupTracker struct {
	next  atomic.Int64                  // packet time (ns) of the next sweep
	cache [groupCacheSize]atomic.Uint64 // keys of followed groups, by key % size

	mu     sync.Mutex
	fn     func(LimitEvent)
	budget eventBudget
	groups map[uint64]*groupRecord
	ticks  eventTicks
	// The packets' clock and the coarse clock at the last start or sweep, from which
	// a tick reckons the packets' time.
	pktAt, realAt int64
	realNow       func() int64 // coarseNanos; tests replace it
	// src reads the groups' rates for the sweeps: the Limiter.
	src groupSource
}

// groupSource is what a groupTracker reads from the limiter it follows.
type groupSource interface {
	// groupRate returns the estimated rate of the group with sketch hash h at
	// node n, at time t (ns), and the node's limit (0: off).
	groupRate(n int, h uint64, t uint64) (rate, limit fixed)
	// following reports whether ev still follows the limiter's groups (an Update
	// may have turned events off, or replaced ev).
	following(ev *groupTracker) bool
}

// groupNode is what an event says about the node that limited a group.
type groupNode struct {
	name       LimiterNode
	limit      fixed
	prefixLen  int
	reportOnly bool
}

// groupRecord is one limited group.
type groupRecord struct {
	node     int
	hash     uint64 // the group's sketch hash at node
	start    int64
	reported bool
	ended    bool
	end      int64
	rate     fixed
	ev       LimitEvent
}

func newGroupTracker(cfg *Config, src groupSource) *groupTracker {
	if cfg.eventFunc == nil {
		return nil
	}
	return &groupTracker{
		src:     src,
		fn:      cfg.eventFunc,
		budget:  eventBudget{perSec: cfg.eventsPerSec()},
		groups:  make(map[uint64]*groupRecord),
		ticks:   eventTicks{after: afterFunc},
		realNow: coarseNanos,
	}
}

// groupKey is a group's key: its sketch hash mixed with its node, since groups of
// different nodes can share a hash (an IPv4 /32 ending in .0 and its /24).
func groupKey(node int, h uint64) uint64 {
	k := mix64(h ^ uint64(node+1)*nameMul)
	if k == 0 {
		k = 1
	}
	return k
}

// limited notes that a packet from src was limited at node n (described by node),
// whose group has sketch hash h and estimated rate rate, at time now.
func (ev *groupTracker) limited(n int, node groupNode, h uint64, src netip.AddrPort, now int64, rate fixed) {
	k := groupKey(n, h)
	slot := &ev.cache[k%groupCacheSize]
	if slot.Load() == k {
		return
	}
	ev.mu.Lock()
	if g := ev.groups[k]; g != nil {
		g.ended = false // limited again before its stop was reported: the episode goes on
		slot.Store(k)
		ev.mu.Unlock()
		return
	}
	if len(ev.groups) >= maxGroups {
		ev.budget.suppressed++
		slot.Store(k) // counted once while it stays in the cache
		ev.mu.Unlock()
		return
	}
	g := &groupRecord{node: n, hash: h, start: now}
	e := &g.ev
	e.Account, e.Node, e.Limit, e.ReportOnly = AccountGroup, node.name, node.limit.Float64(), node.reportOnly
	switch {
	case n == nodePort:
		e.Port = src.Port()
	case n == nodeTotal:
	default:
		e.Network, _ = src.Addr().Unmap().Prefix(node.prefixLen)
	}
	ev.groups[k] = g
	slot.Store(k)
	ev.pktAt, ev.realAt = now, ev.realNow()
	ev.armLocked()
	var out []LimitEvent
	if ev.budget.take(now) {
		s := g.ev
		s.Time = clockBase.Add(time.Duration(now))
		s.Rate = rate.Float64()
		ev.budget.stamp(&s)
		out = append(out, s)
		g.reported = true
	} else {
		// Suppressed: no stop either. The cache keeps it from being counted again
		// while it stays there; after that it may be counted, or reported, again.
		delete(ev.groups, k)
	}
	fn := ev.fn
	ev.mu.Unlock()
	for _, e := range out {
		fn(e)
	}
}

// sweep ends the episodes of groups whose estimated rate fell under their limit and
// reports the stops the budget allows.
func (ev *groupTracker) sweep(now int64) {
	next := ev.next.Load()
	if now < next || !ev.next.CompareAndSwap(next, now+int64(time.Second)) {
		return
	}
	t := uint64(max(now, 0))
	var out []LimitEvent
	ev.mu.Lock()
	for k, g := range ev.groups {
		if !g.ended {
			if rate, limit := ev.src.groupRate(g.node, g.hash, t); limit == 0 || rate < limit {
				g.ended, g.end, g.rate = true, now, rate
				ev.cache[k%groupCacheSize].CompareAndSwap(k, 0)
			}
		}
		if !g.ended || !ev.budget.take(now) {
			continue // still limited, or reported when the budget allows
		}
		e := g.ev
		e.Stop = true
		e.Time = clockBase.Add(time.Duration(now))
		e.Duration = time.Duration(g.end - g.start)
		e.Rate = g.rate.Float64()
		ev.budget.stamp(&e)
		out = append(out, e)
		delete(ev.groups, k)
	}
	ev.pktAt, ev.realAt = now, ev.realNow()
	ev.armLocked()
	fn := ev.fn
	ev.mu.Unlock()
	for _, e := range out {
		fn(e)
	}
}

// armLocked arms ev's timer for the next sweep, unless it is armed already, events
// are off or no group is followed. ev.mu is held.
func (ev *groupTracker) armLocked() {
	if ev.ticks.armed || ev.ticks.off || len(ev.groups) == 0 {
		return
	}
	d := time.Duration(ev.next.Load() - ev.tickNowLocked())
	ev.ticks.arm(d, ev.eventTick)
}

// tickNowLocked is the packets' clock now as a tick reckons it. ev.mu is held.
func (ev *groupTracker) tickNowLocked() int64 {
	return ev.pktAt + max(ev.realNow()-ev.realAt, 0)
}

// eventTick is the timer's sweep, for when no packet came to run it.
func (ev *groupTracker) eventTick() {
	ev.mu.Lock()
	ev.ticks.armed = false
	now := ev.tickNowLocked()
	ev.mu.Unlock()
	if !ev.src.following(ev) { // events are off; Update stopped the timer
		return
	}
	ev.sweep(now)
	ev.mu.Lock()
	ev.armLocked() // when the sweep was not due yet, or another one ran it
	ev.mu.Unlock()
}

// stopTicks stops ev's timer for good: Update turned events off.
func (ev *groupTracker) stopTicks() {
	ev.mu.Lock()
	ev.ticks.stop()
	ev.mu.Unlock()
}

// stopEventTicks turns the events' timer off (a Protection's Close): events come
// only with packets judged from now on, until an Update.
func (l *Limiter) stopEventTicks() {
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	if ev := l.events.Load(); ev != nil {
		ev.stopTicks()
	}
}
