package rrlprom

import (
	"net"
	"testing"

	"github.com/dnsrake/rrl"
)

// TestCollectorCapacity: the capacity mode of a Go limiter (a Protection's, whose
// request limits run in Go) is exported: its configured capacity, no overload, no
// problem.
func TestCollectorCapacity(t *testing.T) {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	p, err := rrl.Protect(udp, handlerZone{}, fixedConfig(t, "capacity", "3000"), rrl.WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := NewCollector("dns", nil, CollectLimiter(p.Limiter()))
	checkSeries(t, c, map[string]float64{
		"dns_limiter_capacity_queries_per_second": 3000,
		"dns_limiter_capacity_overloaded":         0,
		"dns_limiter_capacity_water_level":        0,
		"dns_limiter_capacity_overloads_total":    0,
		"dns_limiter_capacity_problem":            0,
		// The names judge, on with the capacity mode: nothing judged yet.
		"dns_limiter_names_limited_total":            0,
		"dns_limiter_names_level_queries_per_second": 0,
	})
	lint(t, c)
}
