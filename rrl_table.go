package rrl

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

// The account table. Accounts live in shards, each an open-addressing hash table
// with linear probing over fixed-size 16-byte entries: no pointers, so the garbage
// collector never scans it, and no allocation once a shard has grown. A client
// network always maps to the same shard.
//
// An entry is a tag, the account's keyed hash in its upper 48 bits with the slip
// countdown in the low 4, the entry's lock in bit 4 and, while the account is being
// limited and limiting events are on, its record in the event tracker in bits 5 to
// 15 (see rrl_events.go), and the account's zero time
// (see charge). Debiting an existing account takes no shard lock: the caller finds the
// entry by probing and locks the entry alone by setting its lock bit, so two cores
// serving different clients write no cache line in common. (A shard mutex taken by
// every call moved its cache line between the cores on most calls, which cost more
// than the debit itself and kept two cores at the speed of one.) Only changes of the
// table's structure take the shard's mutex: inserting an account, evicting one, and
// growing. They lock every entry they move or overwrite first, so a debit in
// progress always finishes on the live copy of its account. A caller that finds its
// key missing or locked, or that runs into a change in progress, takes the mutex
// and looks again; an entry that a structural change left behind stays locked, so
// nobody debits a stale copy.
//
// A shard holds its share of max-table-size at a load of at most 3/4; at that share
// it evicts before it inserts. Tables of up to preallocBytes are allocated at full
// size at once, in one piece for all shards (creating an account then never pays
// for growth); larger ones grow by doubling, shard by shard. Every new account costs
// a cache miss in a table larger than the caches, and on virtual machines a TLB miss
// costs several more: on Linux a preallocated table is therefore offered
// transparent huge pages (madvise MADV_HUGEPAGE), which cut the cost of creating an
// account in a table of a million by a fifth in the package's benchmarks.
//
// Eviction takes the account that loses least from a sample of the first
// evictSample accounts of the new key's probe sequence: the one with the earliest
// zero time, which is the one nearest full credit. An account that has recovered to
// full credit loses nothing (a new account starts where it stands), and among those
// the earliest zero time is the one that recovered first: for accounts last debited
// to equal balances, the least recently used. An account under attack has the
// latest zero times of all and is the last to go. The sample makes eviction constant
// time; the keyed hash keeps an attacker from choosing which slots are sampled.

// clockOffset is added to every time so that zero times, which run up to maxCost
// (at most 3601 s) behind, stay positive.
const clockOffset = 4096 * fixedOne

// entry is one account. The tag is read and written atomically by anyone probing;
// the zero time is written by the holder of the entry's lock (and read, for
// choosing an eviction victim, by the holder of the shard's mutex).
type entry struct {
	tag  atomic.Uint64 // account key | event record | lock bit | slip countdown; 0 means empty
	zero ownedWord     // fixed time at which the balance is zero; balance = now - zero
}

const (
	slipMask         = 0xf             // low bits of tag: the slip countdown (slip-ratio <= 10)
	lockBit          = 0x10            // tag bit: the entry is locked
	keyMask          = ^uint64(0xffff) // tag bits that hold the key
	trackShift       = 5               // tag bits 5..15: the account's event record, 0 for none
	trackBits        = 0x7ff << trackShift
	evictSample      = 8  // accounts examined per eviction
	initialSlots     = 64 // slots of a shard's first table
	spinsBeforeYield = 64 // failed attempts to lock an entry before yielding the processor
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

// slotTable is a shard's array of entries, replaced as a whole when it grows.
type slotTable struct{ slots []entry }

// shard is one mutex's worth of the table.
type shard struct {
	table atomic.Pointer[slotTable] // read without the mutex, replaced under it

	mu        sync.Mutex
	live      int // accounts in the table
	limit     int // accounts allowed in this shard
	maxSlots  int // the table never has more slots than this
	evictions int64

	_ [64]byte // keeps neighbouring shards' fields off each other's cache lines
}

// init sizes s for limit accounts.
func (s *shard) init(limit int) {
	s.limit = max(limit, 1)
	s.maxSlots = s.limit + s.limit/3 + 1 // load factor at most 3/4, always one slot free
	s.table.Store(&slotTable{})
}

// setSlots gives s the table slots (empty entries), as New does for preallocated
// tables.
func (s *shard) setSlots(slots []entry) { s.table.Store(&slotTable{slots: slots}) }

// entries returns the shard's current table.
func (s *shard) entries() []entry { return s.table.Load().slots }

// home is the first slot of key's probe sequence in a table of n slots.
func home(key uint64, n int) int {
	hi, _ := bits.Mul64(key, uint64(n))
	return int(hi)
}

// lockEntry locks e, waiting for whoever holds it, and returns its tag with the
// lock bit set. Holders keep an entry for a few dozen nanoseconds, unless their
// goroutine is preempted inside: then waiting yields the processor.
func lockEntry(e *entry) uint64 {
	for spins := 0; ; spins++ {
		if t := e.tag.Load(); t&lockBit == 0 && e.tag.CompareAndSwap(t, t|lockBit) {
			return t | lockBit
		}
		if spins >= spinsBeforeYield {
			runtime.Gosched()
		}
	}
}

// release stores the account's new zero time and tag (whose lock bit it clears),
// unlocking e. It also publishes the copy of a moved entry.
func (e *entry) release(tag uint64, zero fixed) {
	e.zero.store(uint64(zero))
	e.tag.Store(tag &^ lockBit)
}

// claim gives e, empty or locked by the caller, to a new account key, locked and
// zeroed.
func (e *entry) claim(key uint64) {
	e.zero.store(0)
	e.tag.Store(key | lockBit)
}

// probe looks for key in slots along its probe sequence and returns the slot
// holding it (found true, with its tag) or the first empty slot.
func probe(slots []entry, key uint64) (i int, tag uint64, found bool) {
	n := len(slots)
	for i = home(key, n); ; {
		t := slots[i].tag.Load()
		if t == 0 {
			return i, 0, false
		}
		if t&keyMask == key {
			return i, t, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// acquire returns key's entry locked, with its tag (lock bit set), inserting a new
// zeroed one (fresh true) when it is missing, evicting another account if the shard
// is full. The caller must release it before acquiring another entry.
func (s *shard) acquire(key uint64) (e *entry, tag uint64, fresh bool) {
	// The common case: the account exists and nobody holds it.
	if slots := s.entries(); len(slots) > 0 {
		if i, t, found := probe(slots, key); found && t&lockBit == 0 && slots[i].tag.CompareAndSwap(t, t|lockBit) {
			return &slots[i], t | lockBit, false
		}
	}
	s.mu.Lock()
	e, tag, fresh = s.lookup(key)
	s.mu.Unlock()
	return e, tag, fresh
}

// lookup is acquire under s.mu. Keys change only under the mutex, so the probe
// sees a stable table; entries may still be locked by debits in progress, which
// lookup waits for.
func (s *shard) lookup(key uint64) (e *entry, tag uint64, fresh bool) {
	if len(s.entries()) == 0 {
		s.setSlots(make([]entry, min(initialSlots, s.maxSlots)))
	}
	slots := s.entries()
	i, _, found := probe(slots, key)
	if found {
		return &slots[i], lockEntry(&slots[i]), false
	}
	switch n := len(slots); {
	case s.live >= s.limit:
		return s.evict(key, i), key | lockBit, true
	case (s.live+1)*4 > n*3 && n < s.maxSlots:
		s.grow()
		slots = s.entries()
		i = free(slots, key)
	}
	e = &slots[i]
	e.claim(key)
	s.live++
	return e, key | lockBit, true
}

// free returns the first empty slot of key's probe sequence in slots.
func free(slots []entry, key uint64) int {
	n := len(slots)
	i := home(key, n)
	for slots[i].tag.Load() != 0 {
		if i++; i == n {
			i = 0
		}
	}
	return i
}

// grow moves the entries into a table twice as large, or maxSlots. Each entry is
// locked before it is copied and left locked in the old table, so a debit that
// still probes the old table finds its entry locked and looks again under the
// mutex, in the new one.
func (s *shard) grow() {
	old := s.entries()
	slots := make([]entry, min(2*len(old), s.maxSlots))
	for k := range old {
		if old[k].tag.Load() == 0 {
			continue
		}
		t := lockEntry(&old[k])
		slots[free(slots, t&keyMask)].release(t, fixed(old[k].zero.load()))
	}
	s.setSlots(slots)
}

// evict makes room for key, whose probe sequence reaches its first empty slot at
// gap, by evicting the account that loses least among the first evictSample
// accounts of key's probe sequence (see the top of this file), and returns key's
// new entry, locked. Starting the sample at key's home slot means the run the new
// key joins loses an entry, so runs stay as short as at the same load without
// deletions; and a victim within that run (the common case) is simply overwritten
// in place.
func (s *shard) evict(key uint64, gap int) *entry {
	slots := s.entries()
	n := len(slots)
	victim, seen := -1, 0
	var victimZero uint64
	pastGap, victimPastGap := false, false
	for i, k := home(key, n), 0; seen < evictSample && k < n; k++ {
		if i == gap {
			pastGap = true
		} else if slots[i].tag.Load() != 0 {
			seen++
			if z := slots[i].zero.load(); victim < 0 || z < victimZero {
				victim, victimZero, victimPastGap = i, z, pastGap
			}
		}
		if i++; i == n {
			i = 0
		}
	}
	s.evictions++
	if !victimPastGap { // in key's run: every slot from home to it is full
		e := &slots[victim]
		lockEntry(e)
		e.claim(key)
		return e
	}
	// Beyond the gap. Removing it shifts entries back only from the victim up to
	// the next empty slot; unless that stretch wraps round the table to key's
	// home, key's run and the gap are as they were. (If it does, an entry of
	// key's run may have moved back across the end of the table: look for key's
	// first empty slot again.)
	at := gap
	if scanned := s.remove(victim); scanned >= (home(key, n)-victim+n)%n {
		at = free(slots, key)
	}
	e := &slots[at]
	e.claim(key)
	s.live++
	return e
}

// remove empties slot i and shifts later entries of its probe run back, so that
// every entry stays reachable from its home slot without tombstones. Every entry
// it overwrites or moves is locked first; a moved entry's copy is complete before
// its tag makes it visible, and its old slot stays locked until it is overwritten
// or emptied in turn. It returns how many slots after i it looked at.
func (s *shard) remove(i int) (scanned int) {
	slots := s.entries()
	n := len(slots)
	lockEntry(&slots[i])
	j := i
	for {
		scanned++
		if j++; j == n {
			j = 0
		}
		t := slots[j].tag.Load()
		if t == 0 {
			break
		}
		h := home(t&keyMask, n)
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t = lockEntry(&slots[j])
			slots[i].release(t, fixed(slots[j].zero.load()))
			i = j
		}
	}
	slots[i].zero.store(0)
	slots[i].tag.Store(0)
	s.live--
	return scanned
}

// charge debits cost from an account whose tag and zero time are given (fresh when
// just created) at time now and reports whether the balance is negative afterwards.
// The balance is not stored: an account holds the time at which its balance is
// zero, so the balance at time now is now - zero, credit accrues at one second per
// second without any update, and a debit moves zero later by its cost. Before the
// debit the balance is clamped to one second (zero >= now - 1 s); a fresh account
// starts there, so its first debit leaves one second minus the cost. (For an
// allowance below one per second the cap is the cost of one response instead, so
// that the account admits one response per 1/allowance seconds rather than none.)
// After it the balance is clamped to -window (zero <= now + window). Reaching full
// credit resets the slip countdown, as in BIND, and ends a limiting episode (clears the
// event record).
func charge(tag *uint64, zero *fixed, fresh bool, now, cost, window fixed) (limited bool) {
	full := now - max(fixedOne, cost) // now >= clockOffset > maxCost >= cost
	if fresh || *zero <= full {
		*zero = full
		*tag &^= slipMask | trackBits
	}
	z := *zero + cost // cost <= window + 1 s and times stay far below 2^63
	if z > now+window {
		z = now + window
	}
	*zero = z
	return z > now // a balance of exactly zero is not limited
}

// slip advances the slip countdown held in a limited response account's tag and
// reports whether this response slips: the first limited response after the
// account was at full credit slips, then every ratio-th (0 never, 1 always).
func slip(tag *uint64, ratio uint64) bool {
	if ratio == 0 {
		return false
	}
	if *tag&slipMask == 0 {
		*tag |= ratio - 1
		return true
	}
	*tag--
	return false
}

// debit charges cost to the account key at time now, reporting whether it is
// limited and, for a limited account with a slip ratio, whether the response slips.
// With ev, the event tracker, it also follows limiting episodes: it counts the debits
// of an account being tracked, reports in t that the account has recovered (ended)
// and, when a debit limits an account that has no episode going, starts one (began).
// Without ev, or when neither happens, t is 0; without ev the account also loses any
// record it kept from when events were on.
func (s *shard) debit(key uint64, now, cost, window fixed, slipRatio uint64, ev episodeFollower) (limited, slipped bool, t transition) {
	e, tag, fresh := s.acquire(key)
	zero := fixed(e.zero.load())
	old := tag & trackBits
	if limited = charge(&tag, &zero, fresh, now, cost, window); limited {
		slipped = slip(&tag, slipRatio)
	}
	switch {
	case ev != nil && (old != 0 || limited):
		tag, t = ev.follow(tag, old, limited, now)
	case ev == nil:
		tag &^= trackBits // events were turned off by Update
	}
	e.release(tag, zero)
	return limited, slipped, t
}

// episodeFollower is the event tracker (rrl_events.go) as a debit sees it. follow
// is called holding the account's entry lock when the account had a record (old, the
// tag's record bits before the debit) or the debit limited it: it returns the tag
// with the record bits it keeps, and what began or ended. Its arguments are values,
// so that the call lets the tag stay on the stack.
type episodeFollower interface {
	follow(tag, old uint64, limited bool, now fixed) (uint64, transition)
}

// transition is what a debit changed in the limiting episodes: the index of a record
// that began (low 16 bits) and of one whose account recovered (high 16 bits).
type transition uint32

func (t transition) began() uint64 { return uint64(t & 0xffff) }
func (t transition) ended() uint64 { return uint64(t >> 16) }

// What recovered found of a followed account.
const (
	accountLimited = iota
	accountRecovered
	accountGone
)

// recovered looks up the account key followed by record idx: gone (not in the table,
// or holding another record: evicted), recovered (back at full credit: its record bits
// are cleared) or still limited.
func (s *shard) recovered(key, idx uint64, now, cost fixed) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	slots := s.entries()
	if len(slots) == 0 {
		return accountGone
	}
	i, t, found := probe(slots, key)
	if !found || (t&trackBits)>>trackShift != idx {
		return accountGone
	}
	e := &slots[i]
	tag := lockEntry(e)
	zero := fixed(e.zero.load())
	res := accountLimited
	if tag&trackBits != idx<<trackShift { // changed while we waited
		res = accountGone
	} else if zero <= now-max(fixedOne, cost) {
		tag &^= trackBits
		res = accountRecovered
	}
	e.release(tag, zero)
	return res
}
