//go:build linux

package rrl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Reading the sketches back. A sketch cell holds the summed, decayed rate of every
// source group that hashes to it, keyed by a secret seed: cells cannot be turned
// back into addresses. What can be read is how heavy the heaviest cells of each
// level are (an upper bound on the heaviest group there), and, for a source one
// names, the estimate the filter is applying to each of its groups.

// HeavyCells returns, for every active level, its n heaviest cells in each sketch
// row, heaviest first within each level; levels in lattice order. The heaviest group
// of a level sends at most the smaller of its two rows' heaviest rates.
func (f *Filter) HeavyCells(n int) ([]SketchCell, error) {
	if f == nil {
		return nil, ErrClosed
	}
	s, cells, now, err := f.readSketches()
	if err != nil {
		return nil, err
	}
	var out []SketchCell
	for _, st := range s.activeNodes() {
		node := int(st.Node)
		var level []SketchCell
		for row := 0; row < sketchDepth; row++ {
			var r []SketchCell
			for col := 0; col < sketchWidth; col++ {
				c := cells[(node*sketchDepth+row)*sketchWidth+col]
				rate := cellRate(fixed(c.Count), c.Last, now)
				if rate == 0 {
					continue
				}
				r = append(r, SketchCell{Row: row, Column: col, Rate: rate.Float64()})
			}
			slices.SortFunc(r, func(a, b SketchCell) int { return cmpRate(a.Rate, b.Rate) })
			level = append(level, r[:min(n, len(r))]...)
		}
		slices.SortStableFunc(level, func(a, b SketchCell) int { return cmpRate(a.Rate, b.Rate) })
		for i := range level {
			level[i].Node = st.limiterNode()
			level[i].Limit = fixed(st.Limit).Float64()
		}
		out = append(out, level...)
	}
	return out, nil
}

// cmpRate orders heavier first.
func cmpRate(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// GroupRates returns the filter's current estimate for every group src belongs to
// at the active levels of its family, then the port and total levels: the same
// numbers the filter compares with the limits for src's next packet.
func (f *Filter) GroupRates(src netip.AddrPort) ([]GroupRate, error) {
	if f == nil {
		return nil, ErrClosed
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, now, err := f.readSettings()
	if err != nil {
		return nil, err
	}
	addr := src.Addr().Unmap()
	b := addr.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	fam := 0
	if addr.Is4() {
		fam, hi, lo = 1, 0, uint64(binary.BigEndian.Uint32(b[12:]))
	}
	// Only the group's own cells are read: one per row and level, keyed as the
	// filter keys them.
	var lookupErr error
	estimate := func(st *filterStep, port uint16) float64 {
		rate, err := f.groupRate(s.Seed, st, hi&st.MaskHi, lo&st.MaskLo|uint64(port)&st.PortMask, now)
		if err != nil && lookupErr == nil {
			lookupErr = err
		}
		return rate
	}
	var out []GroupRate
	any4 := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	for _, st := range s.steps(fam) {
		limit := fixed(st.Limit).Float64()
		switch node := int(st.Node); node {
		case nodePort:
			if src.Port() != 0 {
				out = append(out, GroupRate{Node: NodePort, Group: any4, Port: src.Port(),
					Rate: estimate(&st, src.Port()), Limit: limit})
			}
		case nodeTotal:
			out = append(out, GroupRate{Node: NodeTotal, Group: any4, Rate: estimate(&st, 0), Limit: limit})
		default:
			out = append(out, GroupRate{Node: st.limiterNode(),
				Group: netip.PrefixFrom(addr, int(st.prefix())).Masked(),
				Rate:  estimate(&st, 0), Limit: limit})
		}
	}
	if lookupErr != nil {
		return nil, lookupErr
	}
	return out, nil
}

// readSketches reads the settings, every sketch cell and the kernel clock.
func (f *Filter) readSketches() (*filterSettings, []filterCell, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, now, err := f.readSettings()
	if err != nil {
		return nil, nil, 0, err
	}
	cells := make([]filterCell, f.objs.Cells.MaxEntries())
	const chunk = 4096
	keys := make([]uint32, chunk)
	vals := make([]filterCell, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := f.objs.Cells.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			if int(keys[i]) < len(cells) {
				cells[keys[i]] = vals[i]
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, nil, 0, fmt.Errorf("rrl: read sketches: %w", err)
		}
	}
	return s, cells, now, nil
}

// readSettings reads the settings slot in force and the clock the cells' times are
// on: CLOCK_MONOTONIC, which the program reads at tick resolution. f.mu must be held.
func (f *Filter) readSettings() (*filterSettings, uint64, error) {
	if f.mode != ModeEBPF {
		return nil, 0, fmt.Errorf("rrl: read sketches: %w", ErrClosed)
	}
	s, _, err := f.objs.settingsMaps().active(nil)
	if err != nil {
		return nil, 0, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, 0, fmt.Errorf("rrl: clock: %w", err)
	}
	return s, uint64(ts.Nano()), nil
}

// groupRate is the current estimate of the node st for the group keyed (hi, lo) as
// the program keys it: the smaller of its cells, decayed to now.
func (f *Filter) groupRate(seed uint64, st *filterStep, hi, lo, now uint64) (float64, error) {
	h := sketchHash(seed, hi, lo)
	m := ^fixed(0)
	for row := 0; row < sketchDepth; row++ {
		var c filterCell
		idx := uint32((int(st.Node)*sketchDepth+row)*sketchWidth) + sketchIndex(h, row)
		if err := f.objs.Cells.Lookup(idx, &c); err != nil {
			return 0, fmt.Errorf("rrl: read sketch cell %d: %w", idx, err)
		}
		m = min(m, cellRate(fixed(c.Count), c.Last, now))
	}
	return m.Float64(), nil
}
