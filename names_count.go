package rrl

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
	"sync/atomic"
)

// How many names, and from how many client networks, a limited zone's random names
// come (docs/names.md, "Events"): the figures of "random-subdomain queries under
// victim.test. (about 3,100 names from about 200 networks)". While the names judge
// limits a zone, the capacity controller gives it one of zoneCounterSlots counters
// (watch), and the judge feeds that counter every unknown-tier query of the zone
// (count): two fixed-size distinct counters, one over the names' keys and one over
// the source's client network. The memory is constant (zoneCountersBytes per Limiter,
// whatever the flood), and a query pays one atomic load when no zone is watched, a
// few more when one is; nothing allocates.

// distinctBits is the log2 of a distinctCounter's registers: 1,024 registers of 8
// bits, 1 KiB, a standard error of 1.04/sqrt(1024), 3.3%.
const (
	distinctBits  = 10
	distinctRegs  = 1 << distinctBits
	distinctWords = distinctRegs / 8
)

// distinctCounter estimates how many distinct 64-bit hashes it was given: a
// HyperLogLog (Flajolet et al., 2007) whose registers are bytes packed eight to a
// word, raised with compare-and-swap so that CPUs counting at once lose nothing but
// a race's rare retry. While its estimate is under 2.5 times its registers and some
// register is still empty, it counts by the empty registers instead (linear
// counting), which is the more accurate for small sets.
type distinctCounter struct {
	regs [distinctWords]atomic.Uint64
}

// add counts h, a well mixed 64-bit hash: its top distinctBits bits choose the
// register, the rank of the first set bit below them is the register's candidate.
func (c *distinctCounter) add(h uint64) {
	i := h >> (64 - distinctBits)
	rank := uint64(bits.LeadingZeros64(h<<distinctBits|1<<(distinctBits-1))) + 1
	w, sh := &c.regs[i/8], i%8*8
	for {
		old := w.Load()
		if old>>sh&0xff >= rank || w.CompareAndSwap(old, old&^(0xff<<sh)|rank<<sh) {
			return
		}
	}
}

// estimate returns the estimated number of distinct hashes added since the last
// reset.
func (c *distinctCounter) estimate() float64 {
	sum, zeros := 0.0, 0
	for i := range c.regs {
		w := c.regs[i].Load()
		for range 8 {
			r := int(w & 0xff)
			w >>= 8
			sum += math.Ldexp(1, -r)
			if r == 0 {
				zeros++
			}
		}
	}
	const m = float64(distinctRegs)
	e := 0.7213 / (1 + 1.079/m) * m * m / sum
	if e <= 2.5*m && zeros > 0 {
		e = m * math.Log(m/float64(zeros))
	}
	return e
}

func (c *distinctCounter) reset() {
	for i := range c.regs {
		c.regs[i].Store(0)
	}
}

// zoneCounterSlots is how many zones are counted at once: the zones limited beyond
// it are reported without figures.
const zoneCounterSlots = 8

// zoneCountersBytes is the memory of a Limiter's zone counters.
const zoneCountersBytes = zoneCounterSlots * (8 + 2*distinctWords*8)

// zoneCounters counts, for up to zoneCounterSlots zones, the distinct names and
// client networks of their unknown-tier queries. Safe for concurrent use; watch and
// release are the controller's (one writer), count is the judge's.
type zoneCounters struct {
	watched atomic.Uint32 // bit i: slot i counts for its zone
	slots   [zoneCounterSlots]zoneCounterSlot
}

type zoneCounterSlot struct {
	zone        atomic.Uint64 // the nameKey counted
	names, nets distinctCounter
}

// slot returns the counters of zone, nil when it is not watched: the judge adds
// the query's name key to its names and its client network's hash to its nets.
func (z *zoneCounters) slot(zone nameKey) *zoneCounterSlot {
	for m := z.watched.Load(); m != 0; m &= m - 1 {
		s := &z.slots[bits.TrailingZeros32(m)]
		if s.zone.Load() == uint64(zone) {
			return s
		}
	}
	return nil
}

// watch starts counting zone from nothing; false when every slot is taken (or the
// zone is counted already, which goes on).
func (z *zoneCounters) watch(zone nameKey) bool {
	m := z.watched.Load()
	if z.find(zone) >= 0 || m == 1<<zoneCounterSlots-1 {
		return false
	}
	i := bits.TrailingZeros32(^m)
	s := &z.slots[i]
	s.names.reset()
	s.nets.reset()
	s.zone.Store(uint64(zone))
	z.watched.Or(1 << i)
	return true
}

// release stops counting zone.
func (z *zoneCounters) release(zone nameKey) {
	if i := z.find(zone); i >= 0 {
		z.watched.And(^uint32(1 << i))
	}
}

// figures returns the distinct names and networks counted for zone since watch.
func (z *zoneCounters) figures(zone nameKey) (names, nets float64, ok bool) {
	i := z.find(zone)
	if i < 0 {
		return 0, 0, false
	}
	return z.slots[i].names.estimate(), z.slots[i].nets.estimate(), true
}

func (z *zoneCounters) find(zone nameKey) int {
	for m := z.watched.Load(); m != 0; m &= m - 1 {
		i := bits.TrailingZeros32(m)
		if z.slots[i].zone.Load() == uint64(zone) {
			return i
		}
	}
	return -1
}

// networkHash is the hash of addr's client network (its first bits4 or bits6 bits,
// the Config's ipv4-prefix-length and ipv6-prefix-length), keyed by mix.
func networkHash(addr netip.Addr, bits4, bits6 int, mix uint64) uint64 {
	if addr.Is4() {
		a := addr.As4()
		return mix64(mix ^ uint64(binary.BigEndian.Uint32(a[:])&^(1<<(32-bits4)-1)) ^ 4<<32)
	}
	a := addr.As16()
	hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	if bits6 <= 64 {
		hi &^= 1<<(64-bits6) - 1
		lo = 0
	} else {
		lo &^= 1<<(128-bits6) - 1
	}
	return mix64(mix64(mix^hi^6<<56) ^ lo)
}
