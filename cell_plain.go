//go:build !race

package rrl

// cmCell is one sketch cell: a Fixed count and the time of its last update in
// nanoseconds.
//
// The cells are read and written by concurrent packets without synchronisation, on
// purpose, like the kernel program's shared maps: a racing arrival may be lost,
// nothing else. Each half is one aligned machine word, which Go's memory model
// ("Implementation restrictions for programs containing data races") guarantees is
// never torn or invented by the compiler. Atomic stores would give nothing more but
// cost a locked instruction each: 16 per IPv4 packet, about 145 ns on the reference
// machine, as much as the whole rest of the limiter. Under the race detector
// (cell_atomic.go) the words are sync/atomic values instead, with the same results.
type cmCell struct {
	count Fixed
	last  uint64
}

func (c *cmCell) load() (Fixed, uint64) { return c.count, c.last }

func (c *cmCell) store(count Fixed, last uint64) {
	c.count = count
	c.last = last
}
