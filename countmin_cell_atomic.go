//go:build race

package rrl

import "sync/atomic"

// cmCell is one sketch cell: a fixed count and the time of its last update in
// nanoseconds. Under the race detector the two words are sync/atomic values, so
// that the detector checks everything else while the sketch keeps its deliberate,
// benign races (see countmin_cell_plain.go for the production build).
type cmCell struct {
	count atomic.Uint64
	last  atomic.Uint64
}

func (c *cmCell) load() (fixed, uint64) { return fixed(c.count.Load()), c.last.Load() }

func (c *cmCell) store(count fixed, last uint64) {
	c.count.Store(uint64(count))
	c.last.Store(last)
}

// ownedWord is a word that one goroutine at a time writes and others may read at
// any time (see countmin_cell_plain.go); under the race detector a sync/atomic value.
type ownedWord struct{ v atomic.Uint64 }

func (w *ownedWord) load() uint64   { return w.v.Load() }
func (w *ownedWord) store(v uint64) { w.v.Store(v) }
func (w *ownedWord) inc()           { w.v.Add(1) }
