package rrl

import (
	"math"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// capacityConfig returns a Config with capacity set (auto for capacityAuto) and the
// given extra settings.
func capacityConfig(t testing.TB, capacity float64, kv ...string) *Config {
	t.Helper()
	cfg := NewConfig()
	cfg.capacity = capacity
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// nodeLimits returns each node's limit by name, from a Limiter's Stats.
func limiterLimits(l *Limiter) map[string]float64 {
	out := map[string]float64{}
	for _, n := range l.Stats().Nodes {
		out[n.Node.String()] = n.Limit
	}
	return out
}

// lifted is the limit a node shows with none: the largest fixed.
var lifted = fixedMax.Float64()

// TestLimiterCapacityLevel: with capacity on every level counts, unlimited without
// requests-per-second; the water level sets each adjusted node to its factor times
// the level, within requests-per-second; the own-address levels keep their static
// limits; an Update keeps the level in force; capacity off ignores it.
func TestLimiterCapacityLevel(t *testing.T) {
	cases := []struct {
		name  string
		kv    []string
		level float64
		want  map[string]float64
	}{
		{"lifted", nil, 0, map[string]float64{
			"ipv4/32": lifted, "ipv4/24": lifted, "ipv4/16": lifted,
			"ipv6/128": lifted, "ipv6/64": lifted, "ipv6/56": lifted, "ipv6/48": lifted, "port": lifted,
		}},
		{"level", nil, 50, map[string]float64{
			"ipv4/32": lifted, "ipv4/24": 50, "ipv4/16": 800,
			"ipv6/128": lifted, "ipv6/64": 50, "ipv6/56": 50, "ipv6/48": 200, "port": 50,
		}},
		{"ceiling", []string{"requests-per-second", "20"}, 50, map[string]float64{
			"ipv4/32": 20, "ipv4/24": 20, "ipv4/16": 320,
			"ipv6/128": 20, "ipv6/64": 20, "ipv6/56": 20, "ipv6/48": 80, "port": 20,
		}},
		{"under the ceiling", []string{"requests-per-second", "100"}, 50, map[string]float64{
			"ipv4/32": 100, "ipv4/24": 50, "ipv4/16": 800,
			"ipv6/128": 100, "ipv6/64": 50, "ipv6/56": 50, "ipv6/48": 200, "port": 50,
		}},
		{"no port node", []string{"source-port-factor", "0", "ipv4-request-levels", "24:1 8:100"}, 2, map[string]float64{
			"ipv4/24": 2, "ipv4/8": 200, "ipv6/128": lifted, "ipv6/64": 2, "ipv6/56": 2, "ipv6/48": 8,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := capacityConfig(t, capacityAuto, c.kv...)
			l, err := NewLimiter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			l.setCapacityLevel(c.level)
			check := func(when string) {
				t.Helper()
				got := limiterLimits(l)
				if len(got) != len(c.want) {
					t.Errorf("%s: nodes %v, want %v", when, got, c.want)
				}
				for node, want := range c.want {
					if g, ok := got[node]; !ok || math.Abs(g-want) > 1e-6*want {
						t.Errorf("%s: %s limit %v, want %v", when, node, g, want)
					}
				}
			}
			check("set")
			if err := l.Update(cfg); err != nil {
				t.Fatal(err)
			}
			check("after Update")
		})
	}
	// Without capacity, a water level changes nothing.
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "10")
	l, _ := NewLimiter(cfg)
	l.setCapacityLevel(1)
	if got := limiterLimits(l)["ipv4/24"]; got != 10 {
		t.Errorf("capacity off: /24 limit %v after a water level, want 10", got)
	}
}

// TestLimiterCapacityLevelJudges: the Limiter judges by the water level in force: a
// /24 sending 1000 per second gets its level's share, its /32 sources are left to
// the /24's limit.
func TestLimiterCapacityLevelJudges(t *testing.T) {
	l, err := newLimiterSeed(capacityConfig(t, capacityAuto), 3)
	if err != nil {
		t.Fatal(err)
	}
	run := func(from, to time.Duration) float64 {
		passed, n := 0, 0
		for i := int64(0); from+time.Duration(i)*time.Millisecond < to; i++ {
			now := int64(from) + i*int64(time.Millisecond)
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 200)}), 1000+uint16(i%50000))
			if l.allowAt(src, now, uint32(i*2654435761)) {
				passed++
			}
			n++
		}
		return float64(passed) / float64(n)
	}
	if got := run(0, 2*time.Second); got != 1 {
		t.Fatalf("lifted: passed %.3f, want all", got)
	}
	l.setCapacityLevel(100)
	if got := run(2*time.Second, 5*time.Second); got < 0.07 || got > 0.14 {
		t.Errorf("level 100: passed %.3f of 1000/s from one /24, want about 0.1", got)
	}
	l.setCapacityLevel(0)
	if got := run(5*time.Second, 6*time.Second); got != 1 {
		t.Errorf("lifted again: passed %.3f, want all", got)
	}
}

// TestProtectCapacityGoLimiter: a Protection whose request limits run in Go runs the
// capacity controller over its Limiter, reports it in the Limiter's Stats, follows
// Update and stops at Close.
func TestProtectCapacityGoLimiter(t *testing.T) {
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	cfg := capacityConfig(t, 3000)
	p, err := Protect(udp, dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {}), cfg, WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitCapacity := func(want func(*CapacityStats) bool) *CapacityStats {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			st := p.Limiter().Stats().Capacity
			if want(st) || time.Now().After(deadline) {
				return st
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	st := waitCapacity(func(s *CapacityStats) bool { return s != nil && s.Capacity == 3000 })
	if st == nil || st.Auto || st.Capacity != 3000 || st.Overloaded || st.Problem != "" {
		t.Fatalf("capacity stats %+v, want configured 3000, not overloaded, no problem", st)
	}
	auto := capacityConfig(t, capacityAuto)
	if _, err := p.Update(auto); err != nil {
		t.Fatal(err)
	}
	st = waitCapacity(func(s *CapacityStats) bool { return s != nil && s.Auto })
	if st == nil || !st.Auto || st.Problem != "" {
		t.Fatalf("after Update to auto: %+v, want auto with the socket watched", st)
	}
	if _, err := p.Update(NewConfig()); err != nil {
		t.Fatal(err)
	}
	if st := p.Limiter().Stats().Capacity; st != nil {
		t.Errorf("capacity off: stats %+v, want nil", st)
	}
}
