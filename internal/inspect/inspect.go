// Package inspect reaches into a kernel filter's sketches for rrlctl top: the
// busiest cells of every level and the estimates for one source's groups. They are
// tools for looking at the filter's working, not part of package rrl's API, which
// registers the functions here on Linux.
package inspect

import "net/netip"

// Cell is one sketch cell and its current rate estimate.
type Cell struct {
	Node   uint16  // the level, an rrl.LimiterNode
	Row    int     // sketch row (every group counts once in each row)
	Column int     // column within the row
	Rate   float64 // packets per second of all groups hashing here, decayed to now
	Limit  float64 // the level's limit per group
}

// Group is the filter's current rate estimate for one source group.
type Group struct {
	Node  uint16       // the level, an rrl.LimiterNode
	Group netip.Prefix // the source masked to the level (0.0.0.0/0 for port and total)
	Port  uint16       // the source port, for the port level
	Rate  float64      // packets per second: the smaller of the group's cells, an upper bound
	Limit float64      // the level's limit per group
}

var (
	// HeavyCells returns, for every active level of filter (an *rrl.Filter), its n
	// heaviest cells in each sketch row, heaviest first within each level; nil
	// where the kernel filter is not supported.
	HeavyCells func(filter any, n int) ([]Cell, error)
	// GroupRates returns filter's current estimate for every group src belongs to.
	GroupRates func(filter any, src netip.AddrPort) ([]Group, error)
)
