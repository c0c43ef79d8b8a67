package main

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
)

// sources hands out the source addresses of one address family. Every group of
// traffic has its own part of the address space, so that no two groups share a node
// of the limiter by accident:
//
//	IPv4                      IPv6                    what
//	127.N.N.H                 fd00:00NN:0:00HH::1     host H of client network N (N < 100)
//	127.100+i.0.1             fd00:01ii::1            legitimate client i (its own /16, /48)
//	127.R.R.R                 fd00:1RRR:R:R:R:R:R:R   random sources (R random)
//
// With a pool (unprivileged senders, which must bind a socket per source), random
// sources are drawn from the pool instead of the whole space.
type sources struct {
	v6   bool
	rng  *rand.Rand
	pool []netip.Addr
}

func newSources(v6 bool, seed uint64, poolSize int) *sources {
	s := &sources{v6: v6, rng: rand.New(rand.NewPCG(seed, seed))}
	for range poolSize {
		s.pool = append(s.pool, s.anyRandom())
	}
	return s
}

// host is host h (0..253) of client network n (1..99): IPv4 /24 127.n.n.0, IPv6 /56
// fd00:n::/56 with each host in its own /64.
func (s *sources) host(n, h int) netip.Addr {
	if s.v6 {
		var a [16]byte
		a[0], a[3], a[7], a[15] = 0xfd, byte(n), byte(h), 1
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{127, byte(n), byte(n), byte(1 + h)})
}

// legit is the address of legitimate client i.
func (s *sources) legit(i int) netip.Addr {
	if s.v6 {
		var a [16]byte
		a[0], a[2], a[3], a[15] = 0xfd, 1, byte(i), 1
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{127, byte(100 + i), 0, 1})
}

func (s *sources) anyRandom() netip.Addr {
	if s.v6 {
		var a [16]byte
		a[0] = 0xfd
		for i := 2; i < 16; i++ {
			a[i] = byte(s.rng.Uint32())
		}
		a[2] = 0x10 | a[2]&0x0f
		return netip.AddrFrom16(a)
	}
	return netip.AddrFrom4([4]byte{127, byte(s.rng.IntN(256)), byte(s.rng.IntN(256)), byte(1 + s.rng.IntN(254))})
}

// random is a random source address.
func (s *sources) random() netip.Addr {
	if s.pool != nil {
		return s.pool[s.rng.IntN(len(s.pool))]
	}
	return s.anyRandom()
}

// randomPort is a random source port an ordinary client could use (none of the
// reflection ports), or 0 (an ephemeral port) with a pool.
func (s *sources) randomPort() uint16 {
	if s.pool != nil {
		return 0
	}
	for {
		p := uint16(1024 + s.rng.IntN(65536-1024))
		if !slices.Contains([]uint16{1900, 11211}, p) {
			return p
		}
	}
}

// plan is the attack group's traffic in one scenario.
type plan struct {
	flows                  []loadgen.Flow
	length                 time.Duration // of the whole run
	attackStart, attackEnd time.Duration
	attackRate             float64 // packets per second while attacking
	releases               bool    // the group goes on within its limit after attackEnd
}

// scenario is one flood. L is requests-per-second, d the -duration.
type scenario struct {
	name, desc string
	// limitedBy names the limiter node that holds the attack group (by family),
	// "stateless" when the stateless checks drop all of it, "none" when nothing
	// should limit it.
	limitedBy func(v6 bool) string
	// groupLimit is that node's limit.
	groupLimit func(L float64) float64
	// totalFactor sets total-requests-per-second to totalFactor*L (0: off); the
	// group is then all traffic, legitimate included.
	totalFactor       float64
	legitWithinLimits bool
	plan              func(s *sources, L float64, d time.Duration) plan
	note              string
}

const attackStart = 500 * time.Millisecond

// steady is the attack group from attackStart to the end at rate, from src(i).
func steady(d time.Duration, rate float64, src func(i int) netip.AddrPort) plan {
	return plan{
		flows:       []loadgen.Flow{{Name: "attack", Rate: rate, Start: attackStart, End: d, Src: src}},
		length:      d,
		attackStart: attackStart, attackEnd: d,
		attackRate: rate,
	}
}

func byFamily(v4, v6 string) func(bool) string {
	return func(is6 bool) string {
		if is6 {
			return v6
		}
		return v4
	}
}

func times(f float64) func(float64) float64 { return func(L float64) float64 { return f * L } }

var scenarios = []scenario{
	{
		name: "heavy", desc: "one source at 10x the limit",
		limitedBy: byFamily("ipv4/32", "ipv6/128"), groupLimit: times(1), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			src := netip.AddrPortFrom(s.host(1, 0), 40000)
			return steady(d, 10*L, func(int) netip.AddrPort { return src })
		},
	},
	{
		name: "network", desc: "200 sources of one client network, 20x the limit together",
		limitedBy: byFamily("ipv4/24", "ipv6/56"), groupLimit: times(1), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 20*L, func(i int) netip.AddrPort {
				return netip.AddrPortFrom(s.host(2, i%200), uint16(30000+i%200))
			})
		},
	},
	{
		name: "network-2x", desc: "10 sources of one client network, each at 2x the limit",
		limitedBy: byFamily("ipv4/24", "ipv6/56"), groupLimit: times(1), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 10*2*L, func(i int) netip.AddrPort {
				return netip.AddrPortFrom(s.host(3, i%10), uint16(31000+i%10))
			})
		},
	},
	{
		name: "port-23456", desc: "random sources, one source port (23456), 20x the limit",
		limitedBy: byFamily("port", "port"), groupLimit: times(1), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 20*L, func(int) netip.AddrPort { return netip.AddrPortFrom(s.random(), 23456) })
		},
	},
	{
		name: "port-11211", desc: "random sources from the memcached port (11211), 20x the limit",
		limitedBy: byFamily("stateless", "stateless"), groupLimit: times(0), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 20*L, func(int) netip.AddrPort { return netip.AddrPortFrom(s.random(), 11211) })
		},
	},
	{
		name: "volumetric", desc: "random sources, random ports, 20x the limit",
		limitedBy: byFamily("none", "none"), groupLimit: times(0), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 20*L, func(int) netip.AddrPort { return netip.AddrPortFrom(s.random(), s.randomPort()) })
		},
		note: "the flood is spread so thin over sources and ports that each stays within every per-source limit: the filter cannot tell it from many clients and passes it whole (total-requests-per-second, see capacity, is the defence)",
	},
	{
		name: "capacity", desc: "volumetric, with total-requests-per-second at 4x the limit",
		limitedBy: byFamily("total", "total"), groupLimit: times(4), totalFactor: 4,
		plan: func(s *sources, L float64, d time.Duration) plan {
			return steady(d, 20*L, func(int) netip.AddrPort { return netip.AddrPortFrom(s.random(), s.randomPort()) })
		},
		note: "total-requests-per-second caps what reaches the server, attack and legitimate clients alike: clients keep the share capacity/offered and the server stays up; admitted counts all traffic",
	},
	{
		name: "start-stop", desc: "one source: 0.5x the limit, then 10x, then 0.5x again",
		limitedBy: byFamily("ipv4/32", "ipv6/128"), groupLimit: times(1), legitWithinLimits: true,
		plan: func(s *sources, L float64, d time.Duration) plan {
			src := netip.AddrPortFrom(s.host(9, 0), 41100)
			at := func(int) netip.AddrPort { return src }
			start := time.Second
			end := start + max(d-time.Second, time.Second)
			return plan{
				flows: []loadgen.Flow{
					{Name: "before", Rate: L / 2, Start: 0, End: start, Src: at},
					{Name: "attack", Rate: 10 * L, Start: start, End: end, Src: at},
					{Name: "after", Rate: L / 2, Start: end, End: end + 2*time.Second, Src: at},
				},
				length:      end + 2*time.Second,
				attackStart: start, attackEnd: end,
				attackRate: 10 * L,
				releases:   true,
			}
		},
	},
}

// legitFlows are the legitimate clients: n clients, each in its own /16 or /48,
// sending at rate from an ephemeral port of a socket the runner binds; even ones
// send minimal queries, odd ones EDNS queries.
const legitClients = 10

func legitRate(L float64) float64 { return L / 20 }
