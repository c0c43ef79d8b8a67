package rrl

import (
	"math/rand/v2"
	"testing"
)

// checkShard verifies a shard's invariants: live counts the entries, every entry is
// found from its home slot before any empty slot, and the load stays within bounds.
func checkShard(t *testing.T, s *shard) {
	t.Helper()
	live := 0
	for i, e := range s.slots {
		if e.tag == 0 {
			continue
		}
		live++
		n := len(s.slots)
		for j := home(e.tag&^slipMask, n); j != i; j = (j + 1) % n {
			if s.slots[j].tag == 0 {
				t.Fatalf("entry in slot %d unreachable: empty slot %d in its probe run", i, j)
			}
		}
	}
	if live != s.live || live > s.limit || len(s.slots) > s.maxSlots || live >= len(s.slots) {
		t.Fatalf("live %d counted %d, limit %d, %d slots of at most %d", live, s.live, s.limit, len(s.slots), s.maxSlots)
	}
}

// TestShardModel runs random lookups against a shard and a map holding the same
// accounts, evicting from the map whatever the shard evicted.
func TestShardModel(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 63, 200, 1000} {
		var s shard
		s.init(limit)
		if limit%2 == 0 { // preallocated, as New does for small tables
			s.slots = make([]entry, s.maxSlots)
		}
		model := map[uint64]Fixed{} // key -> zero time
		rng := rand.New(rand.NewPCG(uint64(limit), 1))
		keys := make([]uint64, 3*limit+5)
		for i := range keys {
			keys[i] = accountKey(rng.Uint64(), 0)
		}
		for step := range 6000 {
			key := keys[rng.IntN(len(keys))]
			e, fresh := s.lookup(key)
			if _, ok := model[key]; ok == fresh {
				t.Fatalf("limit %d step %d: fresh %v but in model %v", limit, step, fresh, ok)
			}
			if e.tag&^slipMask != key {
				t.Fatalf("lookup returned another key's entry")
			}
			if !fresh && e.zero != model[key] {
				t.Fatalf("entry lost its state: %v, want %v", e.zero, model[key])
			}
			e.zero = Fixed(step + 1)
			model[key] = e.zero
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
	}
}

// findKey looks key up without inserting.
func findKey(s *shard, key uint64) (bool, *entry) {
	n := len(s.slots)
	for i := home(key, n); s.slots[i].tag != 0; i = (i + 1) % n {
		if s.slots[i].tag&^slipMask == key {
			return true, &s.slots[i]
		}
	}
	return false, nil
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
			s.slots = make([]entry, s.maxSlots)
		}
		var keys []uint64
		for range 5 {
			k := accountKey(rng.Uint64(), 0)
			e, _ := s.lookup(k)
			e.zero = Fixed(1000 + rng.IntN(1000))
			keys = append(keys, k)
		}
		oldest := keys[rng.IntN(5)]
		_, e := findKey(&s, oldest)
		e.zero = 1
		s.lookup(accountKey(rng.Uint64(), 0))
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
	// charge on its own, in Fixed seconds (times include clockOffset).
	half, window := FixedOne/2, FixedFromInt(2)
	now := clockOffset
	var e entry
	steps := []struct {
		dt      Fixed // time advance before the debit
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
		{FixedFromInt(3), false, false, 0.5},
		{FixedFromInt(100), false, false, 0.5}, // clamped at 1 before the debit
	}
	for i, st := range steps {
		now += st.dt
		if got := charge(&e, st.fresh, now, half, window); got != st.limited {
			t.Errorf("step %d: limited %v", i, got)
		}
		if b := now.Float64() - e.zero.Float64(); b != st.balance {
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
	s.slots = make([]entry, s.maxSlots)
	y, _ := s.lookup(homeOf2a) // slot 2
	y.zero = 1
	x, _ := s.lookup(homeOf2b) // slot 0, wrapped
	x.zero = 5
	if s.slots[0].tag != homeOf2b || s.slots[2].tag != homeOf2a {
		t.Fatalf("setup: %v", s.slots)
	}
	e, fresh := s.lookup(homeOf0) // evicts y (earliest zero), beyond the empty slot 1
	if !fresh || e.tag != homeOf0 {
		t.Fatalf("insert: %v %v", e, fresh)
	}
	for _, k := range []uint64{homeOf0, homeOf2b} {
		if found, _ := findKey(&s, k); !found {
			t.Errorf("key %x unreachable: %v", k, s.slots)
		}
	}
	if found, _ := findKey(&s, homeOf2a); found {
		t.Errorf("the evicted key is still there")
	}
	checkShard(t, &s)
}
