package rrl

import (
	"sync"
	"sync/atomic"
	"time"
)

// How an RRL follows limiting episodes (see events.go for what it reports).
//
// The account table keeps 16 bytes per account and no names, so an account that
// starts being limited gets a record here, holding what the events name (client
// network, category, name, type) and a count of its debits, and the record's index is
// kept in the account's tag (rrl_table.go). Debits of accounts that are not limited, and
// limited debits of accounts already followed, take no lock here: the first only test
// the tag's record bits, the second also add one to the record's counter. Only the
// transitions take the tracker's mutex. The table calls the tracker through
// episodeFollower, and the tracker knows the table, not the RRL: the RRL (rrl.go)
// builds the events' contents and gives it its clock.
//
// Start: the first limited debit of an account without a record gets one (or, when all
// maxTracked records are taken, the untracked mark, and counts as suppressed). The
// start event is reported once the episode has gone on for a second, so that its Rate
// is measured over a second, or when the episode ends sooner.
//
// Stop: an episode ends when the account is back at full credit (one second of credit,
// no debt) — the same moment BIND resets the slip countdown. That is discovered
// lazily, whichever comes first: by the account's next debit, which finds it at full
// credit; or by the sweep, which runs at most once per second of the RRL's clock and
// looks up every followed account in the table. The sweep also ends the episodes of
// accounts that were evicted or whose table Update replaced (Evicted).
//
// Time drives the sweep as well as traffic: a Debit call runs it when it is due, and
// so does a timer (time.AfterFunc), armed only while episodes are open and events are
// on, for when the next start is due or the next sweep, at most a second ahead. So a
// start is reported about a second after the first limited response and a stop at most
// about a second after the account has recovered, whether or not queries keep coming.
// The timer is the only goroutine events add; Update turning events off stops it. An
// RRL on a clock of its own (Config.SetNowFunc) has no timer: time passes when that
// clock says, which only a Debit call reads, so its events come with Debit calls. A
// pending timer keeps the RRL alive only until its episodes have ended (an account
// recovers at most window seconds after its last debit), so an RRL dropped by its user
// is not kept forever.

// maxTracked is the number of limiting episodes an RRL follows at once; the tag's
// record field also holds the untracked mark, untracked.
const maxTracked = 1024

// untracked is the tag record of an account being limited without a record.
const untracked = trackBits >> trackShift

// eventTracker follows an RRL's limiting episodes. wall converts the RRL's times to
// the wall clock's; tick is the sweep its timer runs.
type eventTracker struct {
	next atomic.Uint64 // fixed time of the next sweep

	mu     sync.Mutex
	fn     func(LimitEvent)
	budget eventBudget
	free   []uint16 // unused record indices
	recs   [maxTracked]trackRecord
	ticks  eventTicks
	wall   func(fixed) time.Time
	tick   func()
}

// trackRecord is one limiting episode. count is written by debits holding the
// account's entry lock; the rest under the tracker's mutex.
type trackRecord struct {
	// count is only ever written atomically, also when the record is emptied or
	// reused: a debit that read the account's episode index before the episode
	// ended may still add to it.
	count atomic.Uint64
	trackEpisode
}

// trackEpisode is what a trackRecord knows of its episode besides the count; it is
// written under the tracker's lock.
type trackEpisode struct {
	used, filled bool
	reported     bool // the start was reported
	suppressed   bool // the start was suppressed: no stop will be reported
	ended        bool
	evicted      bool
	key          uint64
	table        *shard // the first shard of the account's table: which table it is
	shard        *shard
	cost         fixed
	start, end   fixed
	ev           LimitEvent
}

// newEventTracker returns a tracker for cfg, or nil when cfg sets no event function;
// timed tells whether it has a timer (the RRL is on the default clock), which calls
// tick; wall converts the RRL's times.
func newEventTracker(cfg *Config, timed bool, wall func(fixed) time.Time, tick func(*eventTracker)) *eventTracker {
	if cfg.eventFunc == nil {
		return nil
	}
	ev := &eventTracker{fn: cfg.eventFunc, budget: eventBudget{perSec: cfg.eventsPerSec()}, wall: wall}
	ev.tick = func() { tick(ev) }
	if timed {
		ev.ticks.after = afterFunc
	}
	ev.free = make([]uint16, 0, maxTracked-1)
	for i := maxTracked - 1; i >= 1; i-- { // index 0 means no record
		ev.free = append(ev.free, uint16(i))
	}
	return ev
}

// follow is called by a debit, holding the account's entry lock, when the account
// had a record (old, the tag bits before the debit) or the debit limited it. It counts
// the debit, notes that the account recovered (charge cleared the record bits) and
// starts an episode for a limited account without one, setting its record in the tag
// it returns.
func (ev *eventTracker) follow(tag, old uint64, limited bool, now fixed) (uint64, transition) {
	idx := old >> trackShift
	if old != 0 && tag&trackBits != 0 { // the episode goes on
		if idx != untracked {
			ev.recs[idx].count.Add(1)
		}
		return tag, 0
	}
	var t transition
	if old != 0 && idx != untracked {
		t = transition(idx << 16)
	}
	if limited {
		ev.mu.Lock()
		n := uint64(untracked)
		if k := len(ev.free); k > 0 {
			n = uint64(ev.free[k-1])
			ev.free = ev.free[:k-1]
			ev.recs[n].trackEpisode = trackEpisode{used: true, start: now}
			ev.recs[n].count.Store(1)
		} else {
			ev.budget.suppressed++
		}
		ev.mu.Unlock()
		tag |= n << trackShift
		if n != untracked {
			t |= transition(n)
		}
	}
	return tag, t
}

// transition records what the debit of account key (in shard s of the table whose
// first shard is table) changed; e is the event an episode that began reports.
func (ev *eventTracker) transition(t transition, key uint64, table, s *shard, cost, now fixed, e *LimitEvent) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if i := t.ended(); i != 0 {
		if ev.recs[i].key == key { // not a record of an account tracked before an Update
			ev.endLocked(i, now, false)
		}
	}
	if i := t.began(); i != 0 {
		rec := &ev.recs[i]
		rec.filled, rec.key, rec.table, rec.shard, rec.cost = true, key, table, s, cost
		rec.ev = *e
		ev.armLocked(now)
	}
}

// endLocked ends record i's episode at now.
func (ev *eventTracker) endLocked(i uint64, now fixed, evicted bool) {
	rec := &ev.recs[i]
	if rec.used && !rec.ended {
		rec.ended, rec.end, rec.evicted = true, now, evicted
	}
}

// sweep reports the events that are due at now and, when the once-a-second sweep is
// due too, first looks up every followed account to find those that recovered or left
// the table, whose first shard is table now. Event functions are called after the
// tracker's mutex is released.
func (ev *eventTracker) sweep(now fixed, table *shard) {
	if next := ev.next.Load(); uint64(now) >= next && ev.next.CompareAndSwap(next, uint64(now+fixedOne)) {
		ev.checkAccounts(now, table)
	}
	ev.mu.Lock()
	out := ev.dueLocked(now)
	ev.armLocked(now)
	fn := ev.fn
	ev.mu.Unlock()
	for _, e := range out {
		fn(e)
	}
}

// armLocked arms ev's timer, unless it is armed already or events are off, when an
// episode is open: for the earliest of the next sweep, the next start due and, when
// events wait for the per-second bound, the next second. ev.mu is held.
func (ev *eventTracker) armLocked(now fixed) {
	if ev.ticks.armed || ev.ticks.off || ev.ticks.after == nil {
		return
	}
	due, open := fixed(ev.next.Load()), false
	for i := range ev.recs {
		rec := &ev.recs[i]
		if !rec.used {
			continue
		}
		open = true
		switch {
		case rec.ended:
			// Waiting for the budget: the next second of the clock.
			sec := (fixedNanos(now-clockOffset)/int64(time.Second) + 1) * int64(time.Second)
			due = min(due, fixedFromNanos(sec)+clockOffset)
		case rec.filled && !rec.reported && !rec.suppressed:
			due = min(due, rec.start+fixedOne)
		}
	}
	if !open {
		return
	}
	var d time.Duration
	if due > now {
		d = time.Duration(fixedNanos(due - now))
	}
	ev.ticks.arm(d, ev.tick)
}

// ticked notes that the timer went off: it is no longer armed.
func (ev *eventTracker) ticked() {
	ev.mu.Lock()
	ev.ticks.armed = false
	ev.mu.Unlock()
}

// setTimer turns the timer on (with events on; now is the RRL's time) or off, for
// Update.
func (ev *eventTracker) setTimer(on bool, now fixed) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if !on {
		ev.ticks.stop()
		return
	}
	ev.ticks.off = false
	ev.armLocked(now)
}

// checkAccounts ends the episodes of followed accounts that are back at full credit,
// were evicted, or belong to a table other than the current one (table, its first
// shard).
func (ev *eventTracker) checkAccounts(now fixed, table *shard) {
	type look struct {
		i     uint64
		key   uint64
		table *shard
		shard *shard
		cost  fixed
	}
	var looks []look
	ev.mu.Lock()
	for i := range ev.recs {
		if rec := &ev.recs[i]; rec.used && rec.filled && !rec.ended {
			looks = append(looks, look{uint64(i), rec.key, rec.table, rec.shard, rec.cost})
		}
	}
	ev.mu.Unlock()
	if len(looks) == 0 {
		return
	}
	type result struct {
		i       uint64
		evicted bool
	}
	var ended []result
	for _, l := range looks {
		if l.table != table { // Update replaced the table
			ended = append(ended, result{l.i, true})
			continue
		}
		switch l.shard.recovered(l.key, l.i, now, l.cost) {
		case accountGone:
			ended = append(ended, result{l.i, true})
		case accountRecovered:
			ended = append(ended, result{l.i, false})
		}
	}
	ev.mu.Lock()
	for _, e := range ended {
		ev.endLocked(e.i, now, e.evicted)
	}
	ev.mu.Unlock()
}

// dueLocked returns the events due at now and frees the records of ended episodes
// whose events are out.
func (ev *eventTracker) dueLocked(now fixed) []LimitEvent {
	var out []LimitEvent
	nanos := fixedNanos(now - clockOffset)
	for i := range ev.recs {
		rec := &ev.recs[i]
		if !rec.used || !rec.filled {
			continue
		}
		if !rec.reported && !rec.suppressed && (rec.ended || now-rec.start >= fixedOne) {
			if ev.budget.take(nanos) {
				e := rec.ev
				until := now
				if rec.ended {
					until = rec.end
				}
				e.Time = ev.wall(now)
				e.Count = rec.count.Load()
				e.Rate = rateOver(e.Count, until-rec.start)
				ev.budget.stamp(&e)
				out = append(out, e)
				rec.reported = true
			} else {
				rec.suppressed = true
			}
		}
		if !rec.ended {
			continue
		}
		if rec.reported {
			if !ev.budget.take(nanos) {
				continue // reported when the budget allows
			}
			e := rec.ev
			e.Stop = true
			e.Time = ev.wall(now)
			e.Count = rec.count.Load()
			e.Duration = time.Duration(fixedNanos(rec.end - rec.start))
			e.Rate = rateOver(e.Count, rec.end-rec.start)
			e.Evicted = rec.evicted
			ev.budget.stamp(&e)
			out = append(out, e)
		}
		rec.trackEpisode = trackEpisode{}
		rec.count.Store(0)
		ev.free = append(ev.free, uint16(i))
	}
	return out
}

// fixedNanos converts a fixed number of seconds to nanoseconds.
func fixedNanos(t fixed) int64 {
	return int64(t.Int())*int64(time.Second) + int64(t.Frac().Float64()*float64(time.Second))
}

// rateOver is count per d seconds, d at least one second.
func rateOver(count uint64, d fixed) float64 {
	return float64(count) / max(d, fixedOne).Float64()
}
