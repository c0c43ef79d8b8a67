package rrl

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// checkShard verifies a shard's invariants: live counts the entries, every entry is
// found from its home slot before any empty slot, and the load stays within bounds.
func checkShard(t *testing.T, s *shard) {
	t.Helper()
	live := 0
	slots := s.entries()
	for i := range slots {
		tag := slots[i].tag.Load()
		if tag == 0 {
			continue
		}
		if tag&lockBit != 0 {
			t.Fatalf("entry in slot %d left locked", i)
		}
		live++
		n := len(slots)
		for j := home(tag&keyMask, n); j != i; j = (j + 1) % n {
			if slots[j].tag.Load() == 0 {
				t.Fatalf("entry in slot %d unreachable: empty slot %d in its probe run", i, j)
			}
		}
	}
	if live != s.live || live > s.limit || len(slots) > s.maxSlots || live >= len(slots) {
		t.Fatalf("live %d counted %d, limit %d, %d slots of at most %d", live, s.live, s.limit, len(slots), s.maxSlots)
	}
}

// TestShardModel runs random lookups against a shard and a map holding the same
// accounts, evicting from the map whatever the shard evicted. Under the race
// detector the largest shard runs without it only (exhaustive_test.go): the
// check of every eviction against the model is one goroutine's arithmetic,
// quadratic in the limit.
func TestShardModel(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 63, 200, 1000} {
		t.Run(fmt.Sprint("limit", limit), func(t *testing.T) {
			if limit > 200 {
				exhaustiveOnly(t, "TestShardModel/limit200")
			}
			var s shard
			s.init(limit)
			if limit%2 == 0 { // preallocated, as New does for small tables
				s.setSlots(make([]entry, s.maxSlots))
			}
			model := map[uint64]fixed{} // key -> zero time
			rng := rand.New(rand.NewPCG(uint64(limit), 1))
			keys := make([]uint64, 3*limit+5)
			for i := range keys {
				keys[i] = accountKey(rng.Uint64(), 0)
			}
			for step := range 6000 {
				key := keys[rng.IntN(len(keys))]
				e, tag, fresh := s.acquire(key)
				if _, ok := model[key]; ok == fresh {
					t.Fatalf("limit %d step %d: fresh %v but in model %v", limit, step, fresh, ok)
				}
				if tag&keyMask != key || tag&lockBit == 0 || e.tag.Load() != tag {
					t.Fatalf("acquire returned another key's entry, or not locked: %x for %x", tag, key)
				}
				if z := fixed(e.zero.load()); !fresh && z != model[key] {
					t.Fatalf("entry lost its state: %v, want %v", z, model[key])
				}
				e.release(tag, fixed(step+1))
				model[key] = fixed(step + 1)
				if len(model) > s.live { // the shard evicted one: find which
					for k := range model {
						if f, _ := findKey(&s, k); !f {
							delete(model, k)
						}
					}
				}
				if len(model) != s.live {
					t.Fatalf("limit %d step %d: model %d accounts, shard %d", limit, step, len(model), s.live)
				}
				if step%997 == 0 {
					checkShard(t, &s)
				}
			}
			checkShard(t, &s)
			if s.live != limit {
				t.Errorf("limit %d: %d live at the end", limit, s.live)
			}
		})
	}
}

// findKey looks key up without inserting.
func findKey(s *shard, key uint64) (bool, *entry) {
	slots := s.entries()
	n := len(slots)
	for i := home(key, n); slots[i].tag.Load() != 0; i = (i + 1) % n {
		if slots[i].tag.Load()&keyMask == key {
			return true, &slots[i]
		}
	}
	return false, nil
}

// setZero acquires key's account (creating it if need be) and releases it with
// zero time z.
func setZero(s *shard, key uint64, z fixed) {
	e, tag, _ := s.acquire(key)
	e.release(tag, z)
}

func TestEvictLosesLeast(t *testing.T) {
	// With 5 accounts in 7 slots the sample of 8 sees them all: the one with the
	// earliest zero time (nearest full credit, or recovered longest ago) goes, and
	// an account deep in debt stays, whatever the insertion order.
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var s shard
		s.init(5)
		if round%2 == 0 {
			s.setSlots(make([]entry, s.maxSlots))
		}
		var keys []uint64
		for range 5 {
			k := accountKey(rng.Uint64(), 0)
			setZero(&s, k, fixed(1000+rng.IntN(1000)))
			keys = append(keys, k)
		}
		oldest := keys[rng.IntN(5)]
		setZero(&s, oldest, 1)
		setZero(&s, accountKey(rng.Uint64(), 0), 2000)
		if found, _ := findKey(&s, oldest); found {
			t.Fatalf("round %d: the account nearest full credit survived", round)
		}
		for _, k := range keys {
			if found, _ := findKey(&s, k); !found && k != oldest {
				t.Fatalf("round %d: another account was evicted", round)
			}
		}
		if s.evictions != 1 {
			t.Fatalf("%d evictions", s.evictions)
		}
	}
}

func TestCharge(t *testing.T) {
	// charge on its own, in fixed seconds (times include clockOffset).
	half, window := fixedOne/2, fixedFromInt(2)
	now := clockOffset
	var tag uint64
	var zero fixed
	steps := []struct {
		dt      fixed // time advance before the debit
		fresh   bool
		limited bool
		balance float64 // after the debit
	}{
		{0, true, false, 0.5},
		{0, false, false, 0},
		{0, false, true, -0.5},
		{0, false, true, -1},
		{0, false, true, -1.5},
		{0, false, true, -2},
		{0, false, true, -2}, // clamped at -window
		{fixedFromInt(3), false, false, 0.5},
		{fixedFromInt(100), false, false, 0.5}, // clamped at 1 before the debit
	}
	for i, st := range steps {
		now += st.dt
		if got := charge(&tag, &zero, st.fresh, now, half, window); got != st.limited {
			t.Errorf("step %d: limited %v", i, got)
		}
		if b := now.Float64() - zero.Float64(); b != st.balance {
			t.Errorf("step %d: balance %v, want %v", i, b, st.balance)
		}
	}
}

func TestEvictAcrossTheEnd(t *testing.T) {
	// A regression found by TestShardModel: evicting an account beyond the new
	// key's first empty slot shifted an entry of the key's run back across the end
	// of the table, which left the key unreachable from its home slot. Keys are
	// chosen by their home slot in a 3-slot table: home(k, 3) is k*3 >> 64.
	const homeOf0, homeOf2a, homeOf2b = 0x1000000000000000, 0xe000000000000000, 0xf000000000000000
	var s shard
	s.init(2)
	s.setSlots(make([]entry, s.maxSlots))
	setZero(&s, homeOf2a, 1) // slot 2
	setZero(&s, homeOf2b, 5) // slot 0, wrapped
	slots := s.entries()
	if slots[0].tag.Load() != homeOf2b || slots[2].tag.Load() != homeOf2a {
		t.Fatalf("setup: %x %x %x", slots[0].tag.Load(), slots[1].tag.Load(), slots[2].tag.Load())
	}
	e, tag, fresh := s.acquire(homeOf0) // evicts homeOf2a (earliest zero), beyond the empty slot 1
	if !fresh || tag != homeOf0|lockBit {
		t.Fatalf("insert: %x %v", tag, fresh)
	}
	e.release(tag, 9)
	for _, k := range []uint64{homeOf0, homeOf2b} {
		if found, _ := findKey(&s, k); !found {
			t.Errorf("key %x unreachable", k)
		}
	}
	if found, _ := findKey(&s, homeOf2a); found {
		t.Errorf("the evicted key is still there")
	}
	checkShard(t, &s)
}

// TestShardConcurrentGrowth debits a few hundred accounts from several goroutines at
// once in a shard that starts small and grows four times over: every debit must
// land on the live copy of its account (none lost in a copy that growth left
// behind), and no entry may be duplicated or left locked.
func TestShardConcurrentGrowth(t *testing.T) {
	const keys, workers, rounds = 300, 4, 2000
	var s shard
	s.init(keys) // room for all: no evictions, growth from initialSlots
	key := func(i int) uint64 { return accountKey(uint64(i)*0x9e3779b97f4a7c15, 7) }
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for range rounds {
				e, tag, _ := s.acquire(key(rng.IntN(keys)))
				e.release(tag, fixed(e.zero.load()+1))
			}
		})
	}
	wg.Wait()
	checkShard(t, &s)
	var total uint64
	seen := map[uint64]bool{}
	for i := range s.entries() {
		e := &s.entries()[i]
		if tag := e.tag.Load(); tag != 0 {
			if seen[tag] {
				t.Fatalf("key %x twice in the table", tag)
			}
			seen[tag] = true
			total += e.zero.load()
		}
	}
	if len(s.entries()) != s.maxSlots {
		t.Errorf("table has %d slots, want it grown to %d", len(s.entries()), s.maxSlots)
	}
	if total != workers*rounds {
		t.Errorf("%d debits counted, want %d", total, workers*rounds)
	}
}

// TestShardConcurrentEvictions debits far more accounts than a small shard holds
// from several goroutines at once, so that nearly every call inserts and evicts
// (in place and by shifting entries back) while others debit existing accounts:
// afterwards the table must be consistent, hold every key at most once and have
// no entry left locked.
func TestShardConcurrentEvictions(t *testing.T) {
	for _, prealloc := range []bool{false, true} {
		var s shard
		s.init(50)
		if prealloc {
			s.setSlots(make([]entry, s.maxSlots))
		}
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 11))
				for step := range 5000 {
					e, tag, _ := s.acquire(accountKey(uint64(rng.IntN(200)), 3))
					e.release(tag, fixed(step))
				}
			})
		}
		wg.Wait()
		checkShard(t, &s)
		seen := map[uint64]bool{}
		for i := range s.entries() {
			if tag := s.entries()[i].tag.Load(); tag != 0 {
				if seen[tag&keyMask] {
					t.Fatalf("key %x twice in the table", tag)
				}
				seen[tag&keyMask] = true
			}
		}
		if s.live != s.limit || s.evictions == 0 {
			t.Errorf("prealloc %v: %d live of %d, %d evictions", prealloc, s.live, s.limit, s.evictions)
		}
	}
}
