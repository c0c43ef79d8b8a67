//go:build linux

package rrl

import (
	"fmt"
)

// Stats returns the filter's counters. In ModeClassic the classic prefilter keeps no
// counters and only Mode is set.
func (f *Filter) Stats() (FilterStats, error) {
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
	p, err := newLimiterParams(f.cfg)
	if err != nil {
		return st, err
	}
	for n := 0; n < numNodes; n++ {
		limit := p.limit[n]
		if limit == 0 && sum[counterLimitedNode0+n] == 0 {
			continue
		}
		st.Nodes = append(st.Nodes, NodeStats{
			Node:    p.name[n].String(),
			Limit:   limit.Float64(),
			Limited: sum[counterLimitedNode0+n],
		})
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
	counterLimitedNode0
)

// The cookie counters follow the nodes' (enum counter).
const (
	counterCookiePassed = counterLimitedNode0 + numNodes + iota
	counterCookieInvalid
	counterMax
)

// The counters struct generated from filter_bpf.c must have one slot per counter.
var _ [counterMax]struct{} = [len(filterCounters{}.Value)]struct{}{}

// nodeName names lattice node number node, whose prefix length is prefix, as a
// LimiterNode does.
func nodeName(node int, prefix uint8) string {
	switch {
	case node < nodeIPv6First:
		return (nodeTagIPv4 | LimiterNode(prefix)).String()
	case node < nodePort:
		return (nodeTagIPv6 | LimiterNode(prefix)).String()
	case node == nodePort:
		return NodePort.String()
	}
	return NodeTotal.String()
}
