package rrl

// ZoneRates is what a kernel filter's names judge holds about zones (docs/names.md),
// as Filter.ZoneRates reads it: the zone sketch, which counts by zone the queries
// for names the server has not answered as existing (random names), and the
// learner's tables of names and zones. Both hold keyed hashes, not names: a zone
// can be named only when its name is known to the reader (a configured zone, a name
// asked for, or the root, where the queries of names in no known zone count).
type ZoneRates struct {
	// On reports that the names judge is on in the settings in force.
	On bool `json:"on"`
	// Limit is the limit in force per zone on random names, queries per second;
	// 0 when none (no overload, or names off).
	Limit float64 `json:"limit"`
	// Zones are the named zones' estimates, heaviest first.
	Zones []ZoneRate `json:"zones"`
	// Heaviest bounds the heaviest zone, named or not: the smaller of the zone
	// sketch rows' heaviest cells. BusyCells counts the cells not empty, in both
	// rows, and OverLimit those over Limit (when one is in force).
	Heaviest  float64 `json:"heaviest"`
	BusyCells int     `json:"busy_cells"`
	OverLimit int     `json:"cells_over_limit"`
	// Apexes counts the zones the learner's table holds (ConfiguredApexes of them
	// configured, never forgotten), Names the names it has learnt exist.
	Apexes           int `json:"apexes"`
	ConfiguredApexes int `json:"configured_apexes"`
	Names            int `json:"names"`
}

// ZoneRate is the names judge's estimate for one zone.
type ZoneRate struct {
	// Zone is the zone's name, lower case and fully qualified; "." stands for the
	// queries of names under no zone the learner knows.
	Zone string `json:"zone"`
	// Rate is the arrival rate of queries for the zone's random names, queries per
	// second: the smaller of its two cells, an upper bound (zones hashing to the
	// same cells add to them).
	Rate float64 `json:"rate"`
	// Known reports that the learner's table holds the zone (Configured: as a
	// configured zone); a zone it does not hold is not judged as one: its
	// queries count under the known zone above it, or the root.
	Known      bool `json:"known"`
	Configured bool `json:"configured"`
}
