package rrl

import (
	"fmt"
	"strings"
)

// Stats counts the outcomes of Debit calls, as markdingo/rrl's Stats does, with
// arrays indexed by the AllowanceCategory, Action, IPReason and RTReason constants.
// RRL.GetStats returns a snapshot. A Stats value itself is not safe for concurrent
// modification.
type Stats struct {
	RPS       [AllowanceLast]int64 // Debit calls per category of the tuple
	Actions   [ActionLast]int64    // what Debit returned
	IPReasons [IPLast]int64
	RTReasons [RTLast]int64

	// ReportOnly counts, in report-only mode, the actions Debit would have returned
	// had the mode been off (Actions then counts only Send). Zero otherwise.
	ReportOnly [ActionLast]int64

	CacheLength int   // accounts in the table at the time of GetStats
	Evictions   int64 // accounts evicted to make room for new ones
}

// counters is one stripe's part of Stats (see rrl_stripes.go), written only by the
// goroutine pinned to the stripe's P and read by GetStats at any time.
type counters struct {
	rps        [AllowanceLast]ownedWord
	actions    [ActionLast]ownedWord
	ipReasons  [IPLast]ownedWord
	rtReasons  [RTLast]ownedWord
	reportOnly [ActionLast]ownedWord
}

// count records one Debit call. would is the action before report-only turned it
// into Send (equal to act otherwise).
func (c *counters) count(cat AllowanceCategory, act, would Action, ipr IPReason, rtr RTReason, reportOnly bool) {
	if cat < AllowanceLast {
		c.rps[cat].inc()
	}
	c.actions[act].inc()
	c.ipReasons[ipr].inc()
	c.rtReasons[rtr].inc()
	if reportOnly {
		c.reportOnly[would].inc()
	}
}

// groups returns c's per-constant counter arrays, in the order of Stats.groups.
func (c *counters) groups() [5][]ownedWord {
	return [5][]ownedWord{c.rps[:], c.actions[:], c.ipReasons[:], c.rtReasons[:], c.reportOnly[:]}
}

// addTo adds c into st.
func (c *counters) addTo(st *Stats) {
	to := st.groups()
	for g, from := range c.groups() {
		for i := range from {
			to[g][i] += int64(from[i].load())
		}
	}
}

// groups returns s's per-constant count arrays (RPS, Actions, IPReasons, RTReasons,
// ReportOnly): what Add, GetStats and the per-P counters go through together.
func (s *Stats) groups() [5][]int64 {
	return [5][]int64{s.RPS[:], s.Actions[:], s.IPReasons[:], s.RTReasons[:], s.ReportOnly[:]}
}

// addCounts adds k times the counts of from (every array and Evictions, not
// CacheLength) to s: Add with k 1, GetStats's baseline with k -1.
func (s *Stats) addCounts(from *Stats, k int64) {
	to := s.groups()
	for g, f := range from.groups() {
		for i := range f {
			to[g][i] += k * f[i]
		}
	}
	s.Evictions += k * from.Evictions
}

// Copy returns a copy of s and, when zeroAfter is true, zeroes s.
func (s *Stats) Copy(zeroAfter bool) Stats {
	c := *s
	if zeroAfter {
		*s = Stats{}
	}
	return c
}

// Add adds the counts of from into s. CacheLength is a level, not a count: s takes
// from's value.
func (s *Stats) Add(from *Stats) {
	s.addCounts(from, 1)
	s.CacheLength = from.CacheLength
}

// String returns the counts on one line, each group's values separated by slashes
// in the order of their constants, for logs:
//
//	RPS 1/0/0/0/0 Actions 1/0/0 IPR 0/1/0/0/0/0/0 RTR 1/0/0/0/0/0 L=1/0
//
// A report-only RRL adds " RO=send/drop/slip".
func (s Stats) String() string {
	var b strings.Builder
	group := func(name string, v []int64) {
		b.WriteString(name)
		for i, x := range v {
			if i == 0 {
				b.WriteByte(' ')
			} else {
				b.WriteByte('/')
			}
			fmt.Fprint(&b, x)
		}
		b.WriteByte(' ')
	}
	group("RPS", s.RPS[:])
	group("Actions", s.Actions[:])
	group("IPR", s.IPReasons[:])
	group("RTR", s.RTReasons[:])
	fmt.Fprintf(&b, "L=%d/%d", s.CacheLength, s.Evictions)
	if s.ReportOnly != [ActionLast]int64{} {
		fmt.Fprintf(&b, " RO=%d/%d/%d", s.ReportOnly[Send], s.ReportOnly[Drop], s.ReportOnly[Slip])
	}
	return b.String()
}
