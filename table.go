package rrl

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// The account table. Accounts live in shards, each a mutex and an open-addressing
// hash table with linear probing over fixed-size 16-byte entries: no pointers, so the
// garbage collector never scans it, and no allocation once a shard has grown. A
// client network always maps to the same shard, so one Debit takes one lock.
//
// An entry is the account's 64-bit keyed hash, whose low 4 bits hold the slip
// countdown, and the account's zero time (see charge). A shard holds its share of
// max-table-size at a load of at most 3/4; at that share it evicts before it
// inserts. Tables of up to preallocBytes are allocated at full size at once, in one
// piece for all shards (creating an account then never pays for growth); larger
// ones grow by doubling, shard by shard. Every new account costs a cache miss in a
// table larger than the caches, and on virtual machines a TLB miss costs several
// more: on Linux a preallocated table is therefore offered transparent huge pages
// (madvise MADV_HUGEPAGE), which cut the cost of creating an account in a table of
// a million by a fifth in the package's benchmarks.
//
// Eviction takes the account that loses least from a sample of the first
// evictSample accounts of the new key's probe sequence: the one with the earliest
// zero time, which is the one nearest full credit. An account that has recovered to
// full credit loses nothing (a new account starts where it stands), and among those
// the earliest zero time is the one that recovered first: for accounts last debited
// to equal balances, the least recently used. An account under attack has the
// latest zero times of all and is the last to go. The sample makes eviction constant
// time; the keyed hash keeps an attacker from choosing which slots are sampled.

// entry is one account.
type entry struct {
	tag  uint64 // account key | slip countdown; 0 means empty
	zero Fixed  // time at which the balance is zero; balance = now - zero
}

const (
	slipMask     = 0xf // low bits of tag: the slip countdown (slip-ratio <= 10)
	evictSample  = 8   // accounts examined per eviction
	initialSlots = 64  // slots of a shard's first table
	// preallocBytes: tables up to this size are allocated in full by New; the
	// default max-table-size of 100000 takes 2.1 MB.
	preallocBytes = 32 << 20
	maxShards     = 64
	// minShardAccounts: a table uses fewer shards rather than shards of fewer
	// accounts than this, so that a small max-table-size is not cut into shards too
	// small to hold an attacked account and its neighbours. The shards' shares
	// round down: the table never holds more than max-table-size accounts.
	minShardAccounts = 64
)

// shard is one lock's worth of the table, with the statistics of the Debit calls
// that landed on it.
type shard struct {
	mu       sync.Mutex
	slots    []entry
	live     int   // accounts in slots
	limit    int   // accounts allowed in this shard
	maxSlots int   // len(slots) never exceeds this
	last     Fixed // latest time seen: the shard's clock never runs backwards

	stats     counters
	evictions int64

	// qps-scale query counting: written under mu, read by any goroutine.
	qsec  atomic.Int64  // the second qcur counts
	qcur  atomic.Uint64 // queries in second qsec
	qprev atomic.Uint64 // queries in second qsec-1

	_ [64]byte // keeps neighbouring shards' hot fields off each other's cache lines
}

// init sizes s for limit accounts.
func (s *shard) init(limit int) {
	s.limit = max(limit, 1)
	s.maxSlots = s.limit + s.limit/3 + 1 // load factor at most 3/4, always one slot free
	s.last = clockOffset
}

// home is the first slot of key's probe sequence in a table of n slots.
func home(key uint64, n int) int {
	hi, _ := bits.Mul64(key, uint64(n))
	return int(hi)
}

// lookup returns the entry of key, inserting a new zeroed one (fresh true) when it
// is missing, evicting another account if the shard is full. The pointer is valid
// until the next lookup.
func (s *shard) lookup(key uint64) (e *entry, fresh bool) {
	if s.slots == nil {
		s.slots = make([]entry, min(initialSlots, s.maxSlots))
	}
	n := len(s.slots)
	i := home(key, n)
	for {
		t := s.slots[i].tag
		if t == 0 {
			break
		}
		if t&^slipMask == key {
			return &s.slots[i], false
		}
		if i++; i == n {
			i = 0
		}
	}
	switch {
	case s.live >= s.limit:
		return s.evict(key, i), true
	case (s.live+1)*4 > n*3 && n < s.maxSlots:
		s.grow()
		i = s.free(key)
	}
	s.slots[i] = entry{tag: key}
	s.live++
	return &s.slots[i], true
}

// free returns the first empty slot of key's probe sequence.
func (s *shard) free(key uint64) int {
	n := len(s.slots)
	i := home(key, n)
	for s.slots[i].tag != 0 {
		if i++; i == n {
			i = 0
		}
	}
	return i
}

// grow moves the entries into a table twice as large, or maxSlots.
func (s *shard) grow() {
	old := s.slots
	s.slots = make([]entry, min(2*len(old), s.maxSlots))
	for _, e := range old {
		if e.tag != 0 {
			s.slots[s.free(e.tag&^slipMask)] = e
		}
	}
}

// evict makes room for key, whose probe sequence reaches its first empty slot at
// gap, by evicting the account that loses least among the first evictSample
// accounts of key's probe sequence (see the top of this file), and returns key's
// new entry. Starting the sample at key's home slot means the run the new key joins
// loses an entry, so runs stay as short as at the same load without deletions; and
// a victim within that run (the common case) is simply overwritten in place.
func (s *shard) evict(key uint64, gap int) *entry {
	n := len(s.slots)
	victim, seen := -1, 0
	pastGap, victimPastGap := false, false
	for i, k := home(key, n), 0; seen < evictSample && k < n; k++ {
		if i == gap {
			pastGap = true
		} else if e := &s.slots[i]; e.tag != 0 {
			seen++
			if victim < 0 || e.zero < s.slots[victim].zero {
				victim, victimPastGap = i, pastGap
			}
		}
		if i++; i == n {
			i = 0
		}
	}
	s.evictions++
	if !victimPastGap { // in key's run: every slot from home to it is full
		s.slots[victim] = entry{tag: key}
		return &s.slots[victim]
	}
	// Beyond the gap. Removing it may shift an entry of key's run back to its
	// own home across the end of the table, so look for key's first empty slot
	// again.
	s.remove(victim)
	gap = s.free(key)
	s.slots[gap] = entry{tag: key}
	s.live++
	return &s.slots[gap]
}

// remove empties slot i and shifts later entries of its probe run back, so that
// every entry stays reachable from its home slot without tombstones.
func (s *shard) remove(i int) {
	n := len(s.slots)
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		t := s.slots[j].tag
		if t == 0 {
			break
		}
		h := home(t&^slipMask, n)
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = entry{}
	s.live--
}

// clock advances the shard's clock to now, unless now is earlier: time stepping
// backwards stands still instead, so it can never add credit.
func (s *shard) clock(now Fixed) Fixed {
	if now > s.last {
		s.last = now
	}
	return s.last
}

// countQuery counts a query for qps-scale in the second of now.
func (s *shard) countQuery(sec int64) {
	switch cur := s.qsec.Load(); {
	case sec == cur:
	case sec == cur+1:
		s.qprev.Store(s.qcur.Load())
		s.qcur.Store(0)
		s.qsec.Store(sec)
	default:
		s.qprev.Store(0)
		s.qcur.Store(0)
		s.qsec.Store(sec)
	}
	s.qcur.Add(1)
}

// queriesIn returns the shard's query count of second sec, as far as it knows it.
func (s *shard) queriesIn(sec int64) uint64 {
	switch s.qsec.Load() {
	case sec:
		return s.qcur.Load()
	case sec + 1:
		return s.qprev.Load()
	}
	return 0
}

// charge debits cost from the account e at time now (fresh when just created) and
// reports whether the balance is negative afterwards. The balance is not stored: an
// account holds the time at which its balance is zero, so the balance at time now is
// now - zero, credit accrues at one second per second without any update, and a
// debit moves zero later by its cost. Before the debit the balance is clamped to one
// second (zero >= now - 1 s); a fresh account starts there, so its first debit leaves
// one second minus the cost. (For an allowance below one per second the cap is the
// cost of one response instead, so that the account admits one response per
// 1/allowance seconds rather than none.) After it the balance is clamped to -window
// (zero <= now + window). Reaching full credit resets the slip countdown, as in BIND.
func charge(e *entry, fresh bool, now, cost, window Fixed) (limited bool) {
	full := now - max(FixedOne, cost) // now >= clockOffset > maxCost >= cost
	if fresh || e.zero <= full {
		e.zero = full
		e.tag &^= slipMask
	}
	z := e.zero + cost // cost <= window + 1 s and times stay far below 2^63
	if z > now+window {
		z = now + window
	}
	e.zero = z
	return z > now // a balance of exactly zero is not limited
}

// slip advances the slip countdown of a limited response account and reports
// whether this response slips: the first limited response after the account was at
// full credit slips, then every ratio-th (0 never, 1 always).
func slip(e *entry, ratio uint64) bool {
	if ratio == 0 {
		return false
	}
	if e.tag&slipMask == 0 {
		e.tag |= ratio - 1
		return true
	}
	e.tag--
	return false
}
