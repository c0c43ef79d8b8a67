//go:build linux

package rrl

import (
	"encoding/binary"
)

// The kernel filter as a names source (capacity_names.go's namesSource): the capacity
// controller of a Filter reads the program's names counters and the zone sketch
// (block NODE_ZONES of rrl_cells, after the lattice's numNodes blocks) and writes the
// names level into the settings, beside the water level (filterCapacity.namesLevel,
// written by kernelSettings as names_limit and names_trip). The law is the
// namesController's, the same code as for the Go Limiter; only the source differs.

// namesCountsOf picks the names judge's counters out of the program's.
func namesCountsOf(sum *[counterMax]uint64) namesCounts {
	return namesCounts{
		known: sum[counterNamesKnown], unknown: sum[counterNamesUnknown],
		limited: sum[counterNamesLimited], unknownPassed: sum[counterNamesUnknownPassed],
	}
}

// zoneBlockOffset is the byte offset of the zone sketch (block nodeZones) in rrl_cells.
const zoneBlockOffset = nodeZones * sketchDepth * sketchWidth * cellBytes

func (k *kernelCapacity) namesOn() bool {
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	return k.mine() && namesOnIn(k.f.cfg)
}

// namesSample returns the counters the last sample read (sample precedes it in
// every step).
func (k *kernelCapacity) namesSample() namesCounts {
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	return k.namesCounts
}

// zoneCell reads one cell of the zone sketch. The namesController reads every cell
// in order from (0, 0): that first one reads the whole block, the others read the
// copy.
func (k *kernelCapacity) zoneCell(row, col int) (fixed, uint64) {
	if row == 0 && col == 0 {
		k.readZoneBlock()
	}
	return k.zoneBlockCell(row, col)
}

// zoneBlockCell decodes one cell of k.zoneBlock, the zone sketch as last read.
func (k *kernelCapacity) zoneBlockCell(row, col int) (fixed, uint64) {
	i := (row*sketchWidth + col) * cellBytes
	if i+cellBytes > len(k.zoneBlock) {
		return 0, 0
	}
	c := k.zoneBlock[i:]
	return fixed(binary.NativeEndian.Uint64(c)), binary.NativeEndian.Uint64(c[8:])
}

// readZoneBlock copies the zone sketch's cells into k.zoneBlock (cleared when they
// cannot be read).
func (k *kernelCapacity) readZoneBlock() {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	n := sketchDepth * sketchWidth * cellBytes
	if len(k.zoneBlock) != n {
		k.zoneBlock = make([]byte, n)
	}
	switch {
	case !k.mine() || !k.readCells():
		clear(k.zoneBlock)
	case k.ro != nil && zoneBlockOffset+n <= len(k.ro):
		copy(k.zoneBlock, k.ro[zoneBlockOffset:])
	case k.mem != nil:
		if _, err := k.mem.ReadAt(k.zoneBlock, zoneBlockOffset); err != nil {
			clear(k.zoneBlock)
		}
	default:
		clear(k.zoneBlock)
	}
}

// applyNames writes the names level into the settings (0: none), with the water
// level in force: one more slot flip.
func (k *kernelCapacity) applyNames(level float64) error {
	return k.writeLevel(&k.f.capacity.namesLevel, level, "the names level")
}

// takeNamesRewrite reports once that another process's write lifted the names
// level, which must then be written again (as takeRewrite for the water level).
func (k *kernelCapacity) takeNamesRewrite() bool {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	rw := k.namesRewrite
	k.namesRewrite = false
	return rw
}

// zoneRates appends the zones this process named (configured, or learnt from the
// SOA of an answer it taught the tables) whose rate of unknown names in the zone
// sketch is at least atLeast at now, read as the Go Limiter's zoneRates reads its own
// (from the block read afresh: a cleared one, unreadable, gives no zone).
func (k *kernelCapacity) zoneRates(now int64, atLeast float64, out []zoneRate) []zoneRate {
	k.readZoneBlock()
	t := uint64(max(now, 0))
	k.f.names.zoneNames.Range(func(key, name any) bool {
		h := sketchHash(k.f.seed, 0, uint64(key.(nameKey)))
		least := fixedMax
		for row := range sketchDepth {
			count, last := k.zoneBlockCell(row, int(sketchIndex(h, row)))
			least = min(least, cellRate(count, last, t))
		}
		if r := least.Float64(); r >= atLeast {
			out = append(out, zoneRate{key.(nameKey), name.(string), r})
		}
		return true
	})
	return out
}

// tickNames sweeps the filter's names tables once per generation (namesTicker), as
// the Go Limiter's source does its own: the learner on the tables no longer sweeps
// on the answer path. now is the sample's time, CLOCK_MONOTONIC as the learner's.
func (k *kernelCapacity) tickNames(now int64) {
	n := &k.f.names
	if !n.on.Load() {
		return
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.learner != nil {
		n.learner.tick(uint64(max(now, 0)))
	}
}
