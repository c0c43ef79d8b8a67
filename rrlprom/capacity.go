package rrlprom

import (
	"github.com/dnsrake/rrl"
	"github.com/prometheus/client_golang/prometheus"
)

// capacityDescs are the metrics of the capacity mode (rrl.CapacityStats) of the
// kernel filter or the Go limiter, under that source's subsystem.
type capacityDescs struct {
	capacity, overloaded, level, demand, overloads, problem *prometheus.Desc
}

func newCapacityDescs(d func(sub, name, help string, labels ...string) *prometheus.Desc, sub string) capacityDescs {
	return capacityDescs{
		capacity:   d(sub, "capacity_queries_per_second", "The capacity mode's capacity: measured (the rate the server reads while its receive queues overflow; 0 until measured) or configured."),
		overloaded: d(sub, "capacity_overloaded", "1 while the server is overloaded and the request limits are at the water level."),
		level:      d(sub, "capacity_water_level", "The water level in force: the limit per group of a level of factor 1; 0 when the limits are lifted."),
		demand:     d(sub, "capacity_demand_queries_per_second", "Queries arriving per second, refused ones included, averaged over a quarter of a second."),
		overloads:  d(sub, "capacity_overloads_total", "Overloads since the capacity controller started."),
		problem:    d(sub, "capacity_problem", "1 when the capacity cannot be measured or the limits not set (no socket, unreadable counters): the static limits stay in force."),
	}
}

func (c capacityDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{c.capacity, c.overloaded, c.level, c.demand, c.overloads, c.problem}
}

// collect exports st; nothing when the capacity mode is off (st nil).
func (c capacityDescs) collect(st *rrl.CapacityStats, counter, gauge func(*prometheus.Desc, float64, ...string)) {
	if st == nil {
		return
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	gauge(c.capacity, st.Capacity)
	gauge(c.overloaded, b(st.Overloaded))
	gauge(c.level, st.Level)
	gauge(c.demand, st.Demand)
	counter(c.overloads, float64(st.Overloads))
	gauge(c.problem, b(st.Problem != ""))
}
