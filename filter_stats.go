//go:build linux

package rrl

import (
	"fmt"
)

// Stats returns the filter's counters. In ModeClassic the classic prefilter keeps no
// counters and only Mode is set.
func (f *Filter) Stats() (FilterStats, error) {
	if f == nil {
		return FilterStats{}, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := FilterStats{Mode: f.mode}
	if f.mode != ModeEBPF {
		return st, nil
	}
	var perCPU []filterCounters
	if err := f.objs.Counters.Lookup(uint32(0), &perCPU); err != nil {
		return st, fmt.Errorf("rrl: read counters: %w", err)
	}
	var sum [len(filterCounters{}.Value)]uint64
	for _, c := range perCPU {
		for i, v := range c.Value {
			sum[i] += v
		}
	}
	st.Seen, st.Passed, st.NotDNS = sum[counterSeen], sum[counterPassed], sum[counterNotDNS]
	st.DroppedShort, st.DroppedResponse, st.DroppedReflection = sum[counterDropShort], sum[counterDropResponse], sum[counterDropReflection]
	st.Exempt, st.ReportOnly, st.Errors = sum[counterExempt], sum[counterReportOnly], sum[counterError]
	st.CookiePassed, st.CookieInvalid = sum[counterCookiePassed], sum[counterCookieInvalid]
	st.Capacity = f.capacityStats() // capacity_linux.go
	// Each level counts in a counter of its own (limitedCounter), so a counter's
	// label never changes; which levels are in force, and their limits, are read
	// from the settings the kernel runs, whichever process wrote them.
	set, _, err := f.objs.settingsMaps().active(nil)
	if err != nil {
		return st, err
	}
	limited := sum[counterLimited0:]
	listed := map[uint32]bool{}
	for _, step := range set.activeNodes() {
		if step.Limited >= numLimited || listed[step.Limited] {
			continue
		}
		listed[step.Limited] = true
		st.Nodes = append(st.Nodes, NodeStats{
			Node:    step.limiterNode(),
			Limit:   fixed(step.Limit).Float64(),
			Limited: limited[step.Limited],
		})
	}
	// Levels no longer in force keep their counts, with no limit.
	for i := range uint32(numLimited) {
		if !listed[i] && limited[i] != 0 {
			st.Nodes = append(st.Nodes, NodeStats{Node: limitedNode(i), Limited: limited[i]})
		}
	}
	return st, nil
}

// Indexes of struct counters in filter_bpf.c (enum counter).
const (
	counterSeen = iota
	counterPassed
	counterNotDNS
	counterDropShort
	counterDropResponse
	counterDropReflection
	counterExempt
	counterReportOnly
	counterError
	counterLimited0 // the first of numLimited: see limitedCounter
)

// The cookie counters follow the limited ones (enum counter).
const (
	counterCookiePassed = counterLimited0 + numLimited + iota
	counterCookieInvalid
	counterMax
)

// numLimited is the number of limited counters: one for every IPv4 and IPv6 prefix
// length, the port node and the total node (NUM_LIMITED in filter_bpf.c).
const numLimited = 33 + 129 + 2

// The counters struct generated from filter_bpf.c must have one slot per counter.
var _ [counterMax]struct{} = [len(filterCounters{}.Value)]struct{}{}

// limitedCounter returns which limited counter (counterLimited0 + i) counts the
// packets node limited: IPv4 prefix lengths first, then IPv6 ones, then the port
// and total nodes.
func limitedCounter(node LimiterNode) uint32 {
	plen := uint32(node & 0xff)
	switch node &^ 0xff {
	case nodeTagIPv4:
		return min(plen, 32)
	case nodeTagIPv6:
		return 33 + min(plen, 128)
	case NodePort:
		return 33 + 129
	}
	return 33 + 129 + 1
}

// limitedNode is the node whose limited counter is i: the inverse of
// limitedCounter.
func limitedNode(i uint32) LimiterNode {
	switch {
	case i <= 32:
		return nodeTagIPv4 | LimiterNode(i)
	case i < 33+129:
		return nodeTagIPv6 | LimiterNode(i-33)
	case i == 33+129:
		return NodePort
	}
	return NodeTotal
}

// limiterNode names the node a step judges: a level by its family and prefix
// length, as the kernel's masks give it, or the port or total node.
func (st *filterStep) limiterNode() LimiterNode {
	switch node := int(st.Node); {
	case node < nodeIPv6First:
		return nodeTagIPv4 | LimiterNode(st.prefix())
	case node < nodePort:
		return nodeTagIPv6 | LimiterNode(st.prefix())
	case node == nodePort:
		return NodePort
	}
	return NodeTotal
}
