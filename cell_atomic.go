//go:build race

package rrl

import "sync/atomic"

// cmCell is one sketch cell: a Fixed count and the time of its last update in
// nanoseconds. Under the race detector the two words are sync/atomic values, so
// that the detector checks everything else while the sketch keeps its deliberate,
// benign races (see cell_plain.go for the production build).
type cmCell struct {
	count atomic.Uint64
	last  atomic.Uint64
}

func (c *cmCell) load() (Fixed, uint64) { return Fixed(c.count.Load()), c.last.Load() }

func (c *cmCell) store(count Fixed, last uint64) {
	c.count.Store(uint64(count))
	c.last.Store(last)
}
