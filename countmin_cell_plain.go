//go:build !race

package rrl

// cmCell is one sketch cell: a fixed count and the time of its last update in
// nanoseconds.
//
// The cells are read and written by concurrent packets without synchronisation, on
// purpose, like the kernel program's shared maps: a racing arrival may be lost,
// nothing else. Each half is one aligned machine word, which Go's memory model
// ("Implementation restrictions for programs containing data races") guarantees is
// never torn or invented by the compiler. Atomic stores would give nothing more but
// cost a locked instruction each: 16 per IPv4 packet, about 145 ns on the reference
// machine, as much as the whole rest of the limiter. Under the race detector
// (countmin_cell_atomic.go) the words are sync/atomic values instead, with the same results.
type cmCell struct {
	count fixed
	last  uint64
}

func (c *cmCell) load() (fixed, uint64) { return c.count, c.last }

func (c *cmCell) store(count fixed, last uint64) {
	c.count = count
	c.last = last
}

// ownedWord is a word that one goroutine at a time writes (the holder of an
// account's lock, or the goroutine pinned to a statistics stripe's P) and others
// may read at any time: an account's zero time, read while choosing an eviction
// victim, and the statistics counters, read by GetStats. A racing reader sees the
// old or the new value, as for cmCell. Plain words keep the locked instructions of
// atomic stores (20 to 30 cycles each, six per Debit) off the hot path; under the
// race detector (countmin_cell_atomic.go) they are sync/atomic values.
type ownedWord struct{ v uint64 }

func (w *ownedWord) load() uint64   { return w.v }
func (w *ownedWord) store(v uint64) { w.v = v }
func (w *ownedWord) inc()           { w.v++ }
