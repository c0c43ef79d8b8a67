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
	sum, err := sumCounters(f.objs.Counters)
	if err != nil {
		return st, fmt.Errorf("rrl: read counters: %w", err)
	}
	st.Seen, st.Passed, st.NotDNS = sum[counterSeen], sum[counterPassed], sum[counterDropUnfollowed]
	st.DroppedShort, st.DroppedResponse, st.DroppedReflection = sum[counterDropShort], sum[counterDropResponse], sum[counterDropReflection]
	st.Exempt, st.ReportOnly, st.Errors = sum[counterExempt], sum[counterReportOnly], sum[counterError]
	st.CookiePassed, st.CookieInvalid = sum[counterCookiePassed], sum[counterCookieInvalid]
	st.Slipped = sum[counterSlipped]
	st.Capacity = f.capacityStats() // capacity_linux.go
	// Each level counts in a counter of its own (limitedCounter), so a counter's
	// label never changes; which levels are in force, and their limits, are read
	// from the settings the kernel runs, whichever process wrote them.
	var read func(slot uint8) error
	if f.pin != nil && f.pin.config != nil {
		read = func(slot uint8) error {
			flags, _, err := readConfigMap(f.pin.config, slot)
			st.CookieSecrets = secretCount(flags)
			return err
		}
	} else if k, err := f.secretsInForce(); err == nil {
		st.CookieSecrets = secretCount(cookieFlags(k))
	}
	set, _, err := f.objs.settingsMaps().active(read)
	if err != nil {
		return st, err
	}
	if set.NamesOn != 0 {
		// The names judge's counters, and its level as the settings in force
		// have it (whichever process wrote it).
		st.Names = &NameStats{Known: sum[counterNamesKnown], Unknown: sum[counterNamesUnknown],
			Limited: sum[counterNamesLimited], UnknownPassed: sum[counterNamesUnknownPassed]}
		if set.NamesLimit != uint64(fixedMax) {
			st.Names.Level = fixed(set.NamesLimit).Float64()
		}
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
