package rrl

import (
	"math/bits"
	"strings"
	"sync/atomic"

	"github.com/miekg/dns"
)

// Which names exist, learned from the server's own responses only
// (docs/names.md). The per-packet path (nameLearner.classify) only reads; the only
// writer is nameLearner.observe, fed the responses the server's handler wrote, so a
// flood of forged queries teaches nothing: an attacker can make the server answer,
// and it learns what the answers say, which is the truth about the zone. The
// Handler and a Protection feed it (handler.go, protect.go); the Go Limiter
// classifies with it (limiter_names.go), the kernel program with the same tables as
// BPF maps (filter_names.go).
//
// The layout is that of two BPF array maps of u64 that the kernel program reads and
// the Go side writes, so every entry is one 64-bit word:
//
//	bits 63..24  tag: the top 40 bits of the key (0 is made 1; 0 is an empty slot)
//	bits 23..16  value: for names, flags (exists, wildcard parent) and a hit count;
//	             for apexes, the apex's depth in labels and whether it is configured
//	bits 15..0   generation of the last refresh: the time >> nameGenShift
//
// A key's bucket is its low bits; a bucket is nameWays consecutive words. An entry
// not refreshed for nameGenLive generations is dead: lookups ignore it and inserts
// take its place first. Ages are differences of 16-bit generations read as signed,
// so an entry from a generation ahead (another CPU's clock) is young, and an entry
// would come back to life after 2^15 generations (13 days); the sweep, run once per
// generation by the capacity controller's tick (tick, called from capacity_names.go),
// clears dead entries long before that. Neither observe nor classify sweeps, so a
// server's answer path never pays for the scan.

const (
	// nameWays is the number of entries in a bucket.
	nameWays = 4
	// nameGenShift: a generation is 2^35 ns, 34.4 s.
	nameGenShift = 35
	// nameGenLive: an entry refreshed in generation g is live until generation
	// g+nameGenLive, so an entry unseen for 103 s to 137 s is forgotten.
	nameGenLive = 4
	// nameBucketShift and apexBucketShift size the two tables of a nameLearner:
	// 2^14 buckets of 4 names (65,536 names, 512 KiB) and 2^8 buckets of 4 apexes
	// (1,024 zones, 8 KiB). Nothing else grows: nameLearnerBytes in all.
	nameBucketShift  = 14
	apexBucketShift  = 8
	nameLearnerBytes = (1<<nameBucketShift + 1<<apexBucketShift) * nameWays * 8

	// Flags of a name entry's value.
	nameExists   = 1 << 0 // answered with data or NODATA
	nameWildcard = 1 << 1 // answers below it were synthesised from its wildcard
	nameHitShift = 2      // bits 2..7: refreshes, saturating at 63
	nameHitMax   = 0xff >> nameHitShift

	// Fields of an apex entry's value.
	apexDepthMask = 0x3f   // labels of the apex, 1 to 63
	apexPinned    = 1 << 6 // configured: never ages, never evicted
)

func nameGen(now uint64) uint64 { return now >> nameGenShift & 0xffff }

// nameTag is the tag a key is stored under, never 0.
func nameTag(k nameKey) uint64 {
	t := uint64(k) &^ 0xffffff
	if t == 0 {
		t = 1 << 24
	}
	return t
}

// nameTable is a set-associative table of packed entries (see above). Safe for
// concurrent use: a write is a compare-and-swap of one word; one of two racing
// writes to a word may be lost, as in the kernel's maps, which only costs a
// refresh.
type nameTable struct {
	slots []atomic.Uint64
	mask  uint64 // buckets - 1
}

// entryAge returns the generations since e was refreshed, as seen at gen. An entry
// from a later generation (a clock read a little earlier on another CPU, or time
// stepping back) has age 0.
func entryAge(e, gen uint64) uint64 {
	return uint64(max(int16(gen-e), 0))
}

// entryLive reports whether entry e, read at generation gen, is live.
func entryLive(e, gen uint64, pinned bool) bool {
	return e != 0 && (pinned || entryAge(e, gen) < nameGenLive)
}

func entryVal(e uint64) uint64 { return e >> 16 & 0xff }

// bucket returns the first slot of k's bucket.
func (t *nameTable) bucket(k nameKey) []atomic.Uint64 {
	i := (uint64(k) & t.mask) * nameWays
	return t.slots[i : i+nameWays : i+nameWays]
}

// lookup returns the value of k's live entry. pinnedBit, when not 0, is the value
// bit that keeps an entry live whatever its age.
func (t *nameTable) lookup(k nameKey, now uint64, pinnedBit uint64) (uint64, bool) {
	tag, gen := nameTag(k), nameGen(now)
	b := t.bucket(k)
	for i := range b {
		e := b[i].Load()
		if e&^0xffffff == tag && entryLive(e, gen, entryVal(e)&pinnedBit != 0) {
			return entryVal(e), true
		}
	}
	return 0, false
}

// update refreshes k's entry with the value f returns for its current value (0 and
// false for a new or dead one), inserting it if absent. A new entry takes an empty
// slot, else a dead one, else the live one with the fewest hits among the oldest (a
// name's hits are in the value's hit bits; apexes have none, and pinned entries are
// never taken). When f returns 0 the entry is removed instead. It gives up, losing
// the update, when a racing writer changed the slot.
func (t *nameTable) update(k nameKey, now uint64, pinnedBit uint64, f func(val uint64, found bool) uint64) {
	tag, gen := nameTag(k), nameGen(now)
	b := t.bucket(k)
	victim, worst := -1, uint64(0)
	var victimOld uint64
	for i := range b {
		e := b[i].Load()
		pinned := entryVal(e)&pinnedBit != 0
		live := entryLive(e, gen, pinned)
		if e&^0xffffff == tag {
			val := f(entryVal(e), live)
			if val == 0 {
				b[i].CompareAndSwap(e, 0)
				return
			}
			b[i].CompareAndSwap(e, tag|val<<16|gen)
			return
		}
		if pinned && live {
			continue
		}
		// Badness: empty beats dead beats old beats few hits.
		var bad uint64
		switch {
		case e == 0:
			bad = 3 << 32
		case !live:
			bad = 2 << 32
		default:
			bad = 1<<32 | entryAge(e, gen)<<8 | uint64(nameHitMax-(entryVal(e)>>nameHitShift)&nameHitMax)
		}
		if victim < 0 || bad > worst {
			victim, worst, victimOld = i, bad, e
		}
	}
	val := f(0, false)
	if val == 0 || victim < 0 {
		return
	}
	b[victim].CompareAndSwap(victimOld, tag|val<<16|gen)
}

// sweep clears the dead entries, and returns the OR of f over the live ones'
// values.
func (t *nameTable) sweep(now uint64, pinnedBit uint64, f func(val uint64) uint64) uint64 {
	gen, acc := nameGen(now), uint64(0)
	for i := range t.slots {
		e := t.slots[i].Load()
		if e == 0 {
			continue
		}
		if !entryLive(e, gen, entryVal(e)&pinnedBit != 0) {
			t.slots[i].CompareAndSwap(e, 0)
			continue
		}
		acc |= f(entryVal(e))
	}
	return acc
}

// occupied counts the live entries (for tests and reports).
func (t *nameTable) occupied(now uint64, pinnedBit uint64) int {
	n, gen := 0, nameGen(now)
	for i := range t.slots {
		e := t.slots[i].Load()
		if entryLive(e, gen, entryVal(e)&pinnedBit != 0) {
			n++
		}
	}
	return n
}

// nameLearner learns which names exist and which zones they belong to from the
// server's responses (observe) and classifies query names by it (classify).
type nameLearner struct {
	seed   uint64
	names  *nameTable
	apexes *nameTable
	// depths has bit d set when an apex of d labels may be in apexes: classify
	// looks up only those depths (a server with zones at one depth pays one
	// lookup). Bits are set on insert and recomputed by the sweep.
	// It is the word after the apexes' table when the tables are the kernel
	// filter's (filter_names.go), so that the program reads it too.
	depths   *atomic.Uint64
	sweptGen atomic.Uint64 // generation+1 of the last sweep
}

// newNameLearner returns a learner keyed by seed that knows the configured apexes
// from the start and never forgets them. An apex of more than 63 labels, or one
// that does not pack, is refused.
func newNameLearner(seed uint64, apexes []string) (*nameLearner, bool) {
	return newNameLearnerOn(seed, apexes, make([]atomic.Uint64, nameTableWords), make([]atomic.Uint64, apexTableWords+1))
}

// nameTableWords and apexTableWords are the words of the two tables.
const (
	nameTableWords = nameWays << nameBucketShift
	apexTableWords = nameWays << apexBucketShift
)

// newNameLearnerOn is newNameLearner with its tables in the memory given:
// nameTableWords words of names, and apexTableWords of apexes followed by the word
// of their depths (the kernel filter's maps, filter_names.go, or the heap). The
// memory is written as it is, not cleared: a pinned filter's tables are shared.
func newNameLearnerOn(seed uint64, apexes []string, names, apexTable []atomic.Uint64) (*nameLearner, bool) {
	if len(names) != nameTableWords || len(apexTable) != apexTableWords+1 {
		return nil, false
	}
	l := &nameLearner{
		seed:   seed,
		names:  &nameTable{slots: names, mask: 1<<nameBucketShift - 1},
		apexes: &nameTable{slots: apexTable[:apexTableWords], mask: 1<<apexBucketShift - 1},
		depths: &apexTable[apexTableWords],
	}
	var q qname
	for _, a := range apexes {
		if !qnameOf(a, seed, &q) || q.labels == 0 || q.labels > apexDepthMask {
			return nil, false
		}
		l.addApex(q.name(), q.labels, 0, true)
	}
	return l, true
}

func (l *nameLearner) addApex(k nameKey, depth int, now uint64, pinned bool) {
	val := uint64(depth)
	if pinned {
		val |= apexPinned
	}
	l.apexes.update(k, now, apexPinned, func(old uint64, found bool) uint64 { return val | old&apexPinned })
	l.depths.Or(1 << depth)
}

// zoneOf returns the key and depth of the deepest known apex at or above q's name,
// or the root's key and 0 when none is known.
func (l *nameLearner) zoneOf(q *qname, now uint64) (nameKey, int) {
	m := l.depths.Load() &^ 1
	if q.labels < 63 {
		m &= 1<<(q.labels+1) - 1
	}
	for m != 0 {
		d := 63 - bits.LeadingZeros64(m)
		m &^= 1 << d
		k := q.suffix[q.labels-d]
		if v, ok := l.apexes.lookup(k, now, apexPinned); ok && int(v&apexDepthMask) == d {
			return k, d
		}
	}
	return q.suffix[q.labels], 0
}

// nameWildUp bounds how many labels above a name classify looks for a wildcard
// parent: four lookups at most.
const nameWildUp = 4

// nameClass is what classify says of a query name: its zone, whether the server has
// answered the name as existing, and the unit its queries are counted under: the
// name itself when known, the wildcard parent whose wildcard answers it, or else its
// parent (random names under one parent are one unit).
type nameClass struct {
	zone  nameKey
	known bool
	unit  nameKey
}

// classify classifies the query name q at now. It only reads.
func (l *nameLearner) classify(q *qname, now uint64) nameClass {
	zone, depth := l.zoneOf(q, now)
	c := nameClass{zone: zone, unit: q.parent()}
	if v, ok := l.names.lookup(q.name(), now, 0); ok && v&nameExists != 0 {
		c.known, c.unit = true, q.name()
		return c
	}
	for i := 1; i <= nameWildUp && q.labels-i >= depth; i++ {
		if v, ok := l.names.lookup(q.suffix[i], now, 0); ok && v&nameWildcard != 0 {
			c.unit = q.suffix[i]
			break
		}
	}
	return c
}

// observe learns from resp, a response the server wrote, and wildcard, the origin
// the handler reported with SetWildcardOrigin ("" for none), at now:
//   - NOERROR with answers: the name exists, unless the answer was synthesised from
//     a wildcard: then the wildcard's parent is marked as one (and the name, which
//     does not exist as such, unmarked);
//   - NOERROR without answers but with the zone's SOA (NODATA): the name exists;
//   - NXDOMAIN: the name is forgotten;
//   - a referral (no SOA) and every other rcode teach nothing.
//
// The zone is learnt from the SOA in the authority section, which must be at or
// above the name; an answer without one refreshes the known apex above its name, so
// a zone stays known while the server answers in it.
func (l *nameLearner) observe(resp *dns.Msg, wildcard string, now uint64) {
	if !resp.Response || resp.Opcode != dns.OpcodeQuery || len(resp.Question) != 1 {
		return
	}
	var q qname
	if !qnameOf(resp.Question[0].Name, l.seed, &q) {
		return
	}
	soa := false
	for _, rr := range resp.Ns {
		if s, ok := rr.(*dns.SOA); ok {
			var a qname
			if qnameOf(s.Hdr.Name, l.seed, &a) && a.labels > 0 && a.labels <= apexDepthMask {
				if k, ok := q.ancestor(a.labels); ok && k == a.name() {
					l.addApex(k, a.labels, now, false)
					soa = true
				}
			}
			break
		}
	}
	if !soa && resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0 {
		// An answer of a known zone keeps the zone known, as its SOAs do.
		if k, d := l.zoneOf(&q, now); d > 0 {
			l.addApex(k, d, now, false)
		}
	}
	switch resp.Rcode {
	case dns.RcodeSuccess:
		if wildcard != "" {
			// The wildcard's owner ("*.wild.example.", as file-serving plugins
			// report it) stands for its parent, as SetWildcardOrigin takes it.
			wildcard = strings.TrimPrefix(wildcard, "*.")
			var w qname
			if len(resp.Answer) == 0 || !qnameOf(wildcard, l.seed, &w) || w.labels >= q.labels {
				return
			}
			if k, _ := q.ancestor(w.labels); k != w.name() {
				return
			}
			l.mark(w.name(), nameWildcard, now)
			l.names.update(q.name(), now, 0, func(v uint64, found bool) uint64 {
				if rest := v &^ nameExists; found && rest&(1<<nameHitShift-1) != 0 {
					return rest
				}
				return 0
			})
			return
		}
		if len(resp.Answer) > 0 || soa {
			l.mark(q.name(), nameExists, now)
		}
	case dns.RcodeNameError:
		l.names.update(q.name(), now, 0, func(uint64, bool) uint64 { return 0 })
	}
}

// mark sets flag on k's entry, refreshing it and counting a hit.
func (l *nameLearner) mark(k nameKey, flag uint64, now uint64) {
	l.names.update(k, now, 0, func(v uint64, found bool) uint64 {
		if !found {
			return flag
		}
		hits := min(v>>nameHitShift+1, nameHitMax)
		return v&(1<<nameHitShift-1) | flag | hits<<nameHitShift
	})
}

// tick sweeps the tables once per generation, at the first call of each: the
// capacity controller calls it at every sample (capacityRun.stepNames), off the
// query and answer paths. It reports whether it swept.
func (l *nameLearner) tick(now uint64) bool {
	if g := nameGen(now) + 1; l.sweptGen.Load() != g && l.sweptGen.Swap(g) != g {
		l.sweep(now)
		return true
	}
	return false
}

// sweep clears both tables' dead entries and recomputes the apex depths (an apex
// added while it runs may lose its bit until its zone's next SOA sets it again).
func (l *nameLearner) sweep(now uint64) {
	l.names.sweep(now, 0, func(uint64) uint64 { return 0 })
	d := l.apexes.sweep(now, apexPinned, func(v uint64) uint64 { return 1 << (v & apexDepthMask) })
	l.depths.Store(d)
}
