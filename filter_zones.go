//go:build linux

package rrl

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
)

// ZoneRates reads what the names judge holds about zones (see ZoneRates, the type):
// the zone sketch's summary, the learner's tables' occupancy, and the estimates of
// the zones it can name: the configured zones (Config keyword zones, in the pins
// for a pinned filter), the names given, and the root. A name that is not a domain
// name is an error.
func (f *Filter) ZoneRates(names ...string) (*ZoneRates, error) {
	if f == nil {
		return nil, ErrClosed
	}
	cfg := f.Config()
	candidates := []string{"."}
	if cfg != nil {
		candidates = append(candidates, cfg.zones...)
	}
	for _, n := range names {
		z := strings.ToLower(dns.Fqdn(n))
		if _, ok := dns.IsDomainName(z); !ok {
			return nil, fmt.Errorf("rrl: zone rates: %q is not a domain name", n)
		}
		candidates = append(candidates, z)
	}
	s, cells, now, err := f.readSketches()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	lr, err := f.readNameTables(s.NameSeed)
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := &ZoneRates{On: s.NamesOn != 0, Zones: []ZoneRate{}}
	if limit := fixed(s.NamesLimit); out.On && limit != fixedMax {
		out.Limit = limit.Float64()
	}
	block := cells[nodeZones*sketchDepth*sketchWidth : (nodeZones+1)*sketchDepth*sketchWidth]
	var rowMax [sketchDepth]float64
	for i, c := range block {
		rate := cellRate(fixed(c.Count), c.Last, now).Float64()
		if rate == 0 {
			continue
		}
		out.BusyCells++
		rowMax[i/sketchWidth] = max(rowMax[i/sketchWidth], rate)
		if out.Limit > 0 && rate > out.Limit {
			out.OverLimit++
		}
	}
	out.Heaviest = min(rowMax[0], rowMax[1])
	out.Apexes = lr.apexes.occupied(now, apexPinned)
	out.ConfiguredApexes = countPinned(lr, now)
	out.Names = lr.names.occupied(now, 0)
	seen := map[string]bool{}
	var q qname
	for _, z := range candidates {
		if seen[z] || !qnameOf(z, s.NameSeed, &q) {
			continue
		}
		seen[z] = true
		key := q.name()
		h := sketchHash(s.Seed, 0, uint64(key))
		rate := ^fixed(0)
		for row := range sketchDepth {
			c := block[row*sketchWidth+int(sketchIndex(h, row))]
			rate = min(rate, cellRate(fixed(c.Count), c.Last, now))
		}
		zr := ZoneRate{Zone: z, Rate: rate.Float64()}
		if v, ok := lr.apexes.lookup(key, now, apexPinned); ok && int(v&apexDepthMask) == q.labels {
			zr.Known, zr.Configured = true, v&apexPinned != 0
		}
		out.Zones = append(out.Zones, zr)
	}
	slices.SortStableFunc(out.Zones, func(a, b ZoneRate) int { return cmp.Compare(b.Rate, a.Rate) })
	return out, nil
}

// nodeZones is the zone sketch's block of rrl_cells (NODE_ZONES): after the
// lattice's nodes.
const nodeZones = numNodes

// countPinned counts the live configured apexes of lr.
func countPinned(lr *nameLearner, now uint64) int {
	n := 0
	for i := range lr.apexes.slots {
		e := lr.apexes.slots[i].Load()
		if entryVal(e)&apexPinned != 0 && entryLive(e, nameGen(now), true) {
			n++
		}
	}
	return n
}

// readNameTables copies the filter's names tables into a learner keyed by seed,
// for reading (the copy is never written back): a descriptor opened read-only
// reads them as well as one that may write. f.mu is held.
func (f *Filter) readNameTables(seed uint64) (*nameLearner, error) {
	names := make([]atomic.Uint64, nameTableWords)
	apexes := make([]atomic.Uint64, apexTableWords+1)
	for _, t := range []struct {
		m     *ebpf.Map
		words []atomic.Uint64
	}{{f.objs.Names, names}, {f.objs.Apexes, apexes}} {
		if t.m == nil {
			return nil, fmt.Errorf("rrl: names tables: %w", ErrLayoutMismatch)
		}
		const chunk = 1024
		keys := make([]uint32, chunk)
		vals := make([][nameWays]uint64, chunk)
		var cursor ebpf.MapBatchCursor
		for {
			n, err := t.m.BatchLookup(&cursor, keys, vals, nil)
			for i := range n {
				for w, v := range vals[i] {
					if j := int(keys[i])*nameWays + w; j < len(t.words) {
						t.words[j].Store(v)
					}
				}
			}
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("rrl: read names table: %w", err)
			}
		}
	}
	lr, ok := newNameLearnerOn(seed, nil, names, apexes)
	if !ok {
		return nil, fmt.Errorf("rrl: names tables: %w", ErrLayoutMismatch)
	}
	return lr, nil
}
