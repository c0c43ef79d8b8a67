package rrl

import "testing"

// TestFilterStatsDropped: Dropped is Seen - Passed, and 0 when a copy of counters
// being written shows a packet passed before it shows it seen.
func TestFilterStatsDropped(t *testing.T) {
	for _, c := range []struct{ seen, passed, want uint64 }{
		{10, 4, 6},
		{10, 10, 0},
		{3, 5, 0},
	} {
		if got := (FilterStats{Seen: c.seen, Passed: c.passed}).Dropped(); got != c.want {
			t.Errorf("seen %d, passed %d: Dropped %d, want %d", c.seen, c.passed, got, c.want)
		}
	}
}
