//go:build linux

package rrl

// Who is being limited. The kernel program records, for a sample of the packets its
// request limiter refuses, the group that refused them (the source prefix at the
// deciding level, the source port at the port level, or the total node) in
// rrl_limited, an LRU hash the kernel keeps bounded by itself: when it is full the
// least recently recorded group goes, so a flood of spoofed sources cannot grow it.
// Passed packets never touch it.

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
)

const (
	// limitedSample is LIMITED_SAMPLE in bpf/limited.h: one refused packet in
	// limitedSample is recorded, so a recorded drop stands for limitedSample.
	limitedSample = 16
	// limitedGroupsMax is LIMITED_GROUPS in bpf/limited.h.
	limitedGroupsMax = 4096
	// limitedFresh is how recent a group's last recorded drop must be for it to
	// count as limited now. At one drop in limitedSample recorded, a group refused
	// five packets a second or more is almost always recorded within it.
	limitedFresh = 5 * time.Second
)

// LimitedGroups returns the source groups the kernel filter is limiting now, heaviest
// (by current rate) first: every group at least one of whose refused packets was
// recorded in the last five seconds. A group is the deciding level's prefix of the
// source (the first level, finest first, that refused the packet), or the source port
// for the port level, or all sources for the total level. The program records one
// refused packet in sixteen, chosen at random, so Dropped is an estimate and a group
// refused less than a few times a second may be missing; at most 4096 groups are kept,
// the least recently recorded leaving first. In report-only mode it lists the groups
// the filter would limit. It works for pinned filters with read access to the pins.
func (f *Filter) LimitedGroups() ([]GroupRate, error) {
	groups, _, err := f.limitedLook()
	return groups, err
}

// limitedLook is LimitedGroups and whether the filter is in report-only mode, read
// together.
func (f *Filter) limitedLook() (groups []GroupRate, reportOnly bool, err error) {
	if f == nil {
		return nil, false, ErrClosed
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, now, err := f.readSettings()
	if err != nil {
		return nil, false, err
	}
	groups, err = f.limitedGroupsAt(s, now, time.Now())
	return groups, s.ReportOnly != 0, err
}

// limitedGroupsAt is LimitedGroups at kernel clock now, which is wall time wall. f.mu
// must be held.
func (f *Filter) limitedGroupsAt(s *filterSettings, now uint64, wall time.Time) ([]GroupRate, error) {
	if f.objs == nil || f.objs.Limited == nil {
		return nil, fmt.Errorf("rrl: read limited groups: %w", ErrClosed)
	}
	recs, err := readLimited(f.objs.Limited)
	if err != nil {
		return nil, err
	}
	// The step in force for each limited counter: its node's cells give the
	// group's current rate, as GroupRates reads them.
	steps := map[uint32]filterStep{}
	for _, st := range s.activeNodes() {
		steps[st.Limited] = st
	}
	at := func(t uint64) time.Time {
		if t >= now {
			return wall
		}
		return wall.Add(-time.Duration(now - t))
	}
	var out []GroupRate
	for _, r := range recs {
		if r.v.Last+uint64(limitedFresh) < now || r.k.Limited >= numLimited {
			continue
		}
		node := limitedNode(r.k.Limited)
		g := GroupRate{
			Node:    node,
			Group:   limitedPrefix(node, r.k.Hi, r.k.Lo),
			Dropped: r.v.Drops * limitedSample,
			Rate:    cellRate(fixed(r.v.Count), r.v.Last, now).Float64(),
			Limit:   fixed(r.v.Limit).Float64(),
			First:   at(r.v.First),
			Last:    at(r.v.Last),
		}
		if node == NodePort {
			g.Port = uint16(r.k.Lo)
		}
		if st, ok := steps[r.k.Limited]; ok {
			rate, err := f.groupRate(s.Seed, &st, r.k.Hi, r.k.Lo, now)
			if err != nil {
				return nil, err
			}
			g.Rate, g.Limit = rate, fixed(st.Limit).Float64()
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GroupRate) int {
		if c := cmpRate(a.Rate, b.Rate); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Dropped, a.Dropped); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Node, b.Node), a.Group.Addr().Compare(b.Group.Addr()), cmp.Compare(a.Port, b.Port))
	})
	return out, nil
}

// limitedPrefix turns a recorded key into the group's prefix: the masked source at a
// level, 0.0.0.0/0 for the port and total nodes.
func limitedPrefix(node LimiterNode, hi, lo uint64) netip.Prefix {
	plen := int(node & 0xff)
	switch node &^ 0xff {
	case nodeTagIPv4:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(lo >> 24), byte(lo >> 16), byte(lo >> 8), byte(lo)}), plen)
	case nodeTagIPv6:
		var b [16]byte
		for i := range 8 {
			b[i] = byte(hi >> (56 - 8*i))
			b[8+i] = byte(lo >> (56 - 8*i))
		}
		return netip.PrefixFrom(netip.AddrFrom16(b), plen)
	}
	return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
}

type limitedRecord struct {
	k filterLimitedKey
	v filterLimitedValue
}

// readLimited reads every entry of the limited-groups map. A batch lookup walks the
// hash bucket by bucket, so entries the program adds or evicts meanwhile cannot make
// it loop or skip the rest; kernels without batch operations are walked key by key.
func readLimited(m *ebpf.Map) ([]limitedRecord, error) {
	n := int(m.MaxEntries())
	keys := make([]filterLimitedKey, n)
	vals := make([]filterLimitedValue, n)
	var out []limitedRecord
	seen := map[filterLimitedKey]bool{}
	var cursor ebpf.MapBatchCursor
	for {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < got; i++ {
			if !seen[keys[i]] {
				seen[keys[i]] = true
				out = append(out, limitedRecord{keys[i], vals[i]})
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("rrl: read limited groups: %w", err)
		}
	}
	out = out[:0]
	clear(seen)
	var r limitedRecord
	it := m.Iterate()
	for len(out) < n && it.Next(&r.k, &r.v) {
		if !seen[r.k] {
			seen[r.k] = true
			out = append(out, r)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("rrl: read limited groups: %w", err)
	}
	return out, nil
}
