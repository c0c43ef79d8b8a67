package rrlprom

import (
	"github.com/dnsrake/rrl"
	"github.com/prometheus/client_golang/prometheus"
)

// namesDescs are the metrics of the names judge (rrl.NameStats) of the kernel
// filter or the Go limiter, under that source's subsystem.
type namesDescs struct {
	queries, limited, level *prometheus.Desc
}

func newNamesDescs(d func(sub, name, help string, labels ...string) *prometheus.Desc, sub string) namesDescs {
	return namesDescs{
		queries: d(sub, "names_queries_total", "Queries the names judge classified: known (names the server answered as existing) or unknown (random names, names under a wildcard, names not yet learnt).", "tier"),
		limited: d(sub, "names_limited_total", "Queries for unknown names refused by zone under overload."),
		level:   d(sub, "names_level_queries_per_second", "The limit per zone on queries for unknown names in force; 0 when none."),
	}
}

func (c namesDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{c.queries, c.limited, c.level}
}

// collect exports st; nothing when the names judge is off (st nil).
func (c namesDescs) collect(st *rrl.NameStats, counter, gauge func(*prometheus.Desc, float64, ...string)) {
	if st == nil {
		return
	}
	counter(c.queries, float64(st.Known), "known")
	counter(c.queries, float64(st.Unknown), "unknown")
	counter(c.limited, float64(st.Limited))
	gauge(c.level, st.Level)
}
