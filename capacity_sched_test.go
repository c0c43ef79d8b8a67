package rrl

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The capacity controller's properties over many seeded schedules of the simulated
// server's speed: it gets faster or slower for good, slows for 1.5 s, pauses for
// 300 ms, and jitters by up to 30% every 100 ms throughout, as a real server does
// (GC, a neighbour, a reload, CPU frequency). A flood of one /24 overloads it; 50
// light /24s send evenly. The thresholds are the issue's.

// speedChange is one change of a schedule.
type speedChange struct {
	at, until time.Duration // until 0: for good
	factor    float64
	kind      string
}

// speedSchedule is a server speed over time: the product of its changes in force
// and a jitter drawn every 100 ms.
type speedSchedule struct {
	changes []speedChange
	jitter  []float64 // per tenth of a second
}

func (s *speedSchedule) at(t time.Duration) float64 {
	f := s.jitter[min(int(t/(100*time.Millisecond)), len(s.jitter)-1)]
	for _, c := range s.changes {
		if t >= c.at && (c.until == 0 || t < c.until) {
			f *= c.factor
		}
	}
	return f
}

// settled reports the times at which the speed last changed (not counting jitter)
// at or before t: the latest start or end of a change.
func (s *speedSchedule) lastChange(t time.Duration) time.Duration {
	last := time.Duration(0)
	for _, c := range s.changes {
		if c.at <= t {
			last = max(last, c.at)
		}
		if c.until != 0 && c.until <= t {
			last = max(last, c.until)
		}
	}
	return last
}

// nextChange is the first start or end of a change after t (end if none).
func (s *speedSchedule) nextChange(t, end time.Duration) time.Duration {
	next := end
	for _, c := range s.changes {
		if c.at > t {
			next = min(next, c.at)
		}
		if c.until > t {
			next = min(next, c.until)
		}
	}
	return next
}

// randomSchedule draws changes every 3 to 4.5 s from 3 s until before end-4 s, of
// the four kinds (a speed 1.4 to 2 times faster or slower for good, between half and
// three times the first; a slow moment of 1.5 s at 0.3 to 0.6; a pause of 300 ms),
// and a jitter of ±30% per 100 ms.
func randomSchedule(r *rand.Rand, end time.Duration) *speedSchedule {
	s := &speedSchedule{jitter: make([]float64, int(end/(100*time.Millisecond))+1)}
	for i := range s.jitter {
		s.jitter[i] = 0.7 + 0.6*r.Float64()
	}
	speed := 1.0
	for at := 3*time.Second + time.Duration(r.IntN(1000))*time.Millisecond; at < end-4*time.Second; at += 3*time.Second + time.Duration(r.IntN(1500))*time.Millisecond {
		switch f := 1.4 + 0.6*r.Float64(); r.IntN(4) {
		case 0:
			if speed*f > 3 {
				f = 1 / f
			}
			speed *= f
			s.changes = append(s.changes, speedChange{at: at, factor: f, kind: map[bool]string{true: "faster", false: "slower"}[f > 1]})
		case 1:
			if speed/f < 0.5 {
				f = 1 / f
			}
			speed /= f
			s.changes = append(s.changes, speedChange{at: at, factor: 1 / f, kind: map[bool]string{true: "faster", false: "slower"}[f < 1]})
		case 2:
			s.changes = append(s.changes, speedChange{at: at, until: at + 1500*time.Millisecond, factor: 0.3 + 0.3*r.Float64(), kind: "slow moment"})
		case 3:
			s.changes = append(s.changes, speedChange{at: at, until: at + 300*time.Millisecond, factor: 0, kind: "pause"})
		}
	}
	return s
}

// factors returns the smallest and largest speed factors the schedule's lasting
// changes reach.
func (s *speedSchedule) factors() (least, most float64) {
	f, least, most := 1.0, 1.0, 1.0
	for _, c := range s.changes {
		if c.until == 0 {
			f *= c.factor
			least, most = min(least, f), max(most, f)
		}
	}
	return least, most
}

func (s *speedSchedule) String() string {
	var b strings.Builder
	for _, c := range s.changes {
		fmt.Fprintf(&b, " %s×%.2f@%v", c.kind, c.factor, c.at)
	}
	return b.String()
}

// evenNets sends rate evenly over n /24s in turn (10.i.1.x), each at rate/n.
func evenNets(n int) func(r *rand.Rand) netip.AddrPort {
	i := 0
	return func(r *rand.Rand) netip.AddrPort {
		i++
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i % n), 1, byte(1 + r.IntN(254))}), uint16(1024+r.IntN(60000)))
	}
}

// scheduleVerdict is what one seeded schedule gave: its failures and its worst
// figures.
type scheduleVerdict struct {
	errs                  []string
	util, light, overflow float64
	lift                  time.Duration
}

// Thresholds of TestCapacitySimSchedules (the issue's).
const (
	schedFloodFrom      = time.Second
	schedFloodTo        = 15 * time.Second
	schedEnd            = schedFloodTo + 3*time.Second
	schedTenth          = 100 * time.Millisecond
	schedMinUtilisation = 0.9
	schedMinLight       = 0.99
	schedMaxLightSwing  = 0.1
	schedMaxOverflow    = 0.01
	schedMaxLift        = 2 * time.Second
	schedJudgeAfter     = 2 * time.Second
	schedWindowTenths   = 10
)

// TestCapacitySimSchedules: over seeded speed schedules, with a flood of one /24
// above every speed the server reaches, from 2 s after the last change (not counting
// jitter) and over every 1 s window until the next: the server reads at least 90% of
// what it could, light /24s get 99% of their answers and their answered rate moves
// by less than 10% from one second to the next; from 1 s into the flood fewer than
// 1% of the offered queries are lost to the full queue, changes included; the limits
// lift within 2 s of the flood's end. The seeds run in parallel (about 60 ms of CPU
// each).
func TestCapacitySimSchedules(t *testing.T) {
	// RRL_SIM_SEEDS sweeps more (or fewer) seeds than the 80 of the default run.
	// Under the race detector, which slows the simulation some twentyfold (80 seeds
	// took 100 s of a 2-core machine, 8 seeds 22 s of the test command), 2 seeds
	// side by side check the controller's memory accesses (each seed is one
	// goroutine's simulation: more seeds find no other access); scripts/test runs
	// all 80 without it, beside the race run.
	seeds := 80
	if raceDetector {
		seeds = 2
	}
	if n, err := strconv.Atoi(os.Getenv("RRL_SIM_SEEDS")); err == nil && n > 0 {
		seeds = n
	}
	var (
		mu                                              sync.Mutex
		worstUtil, worstLight, worstOverflow, worstLift = 1.0, 1.0, 0.0, time.Duration(0)
	)
	t.Run("seeds", func(t *testing.T) {
		for seed := range uint64(seeds) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				v := runSchedule(t, seed)
				for _, e := range v.errs {
					t.Error(e)
				}
				mu.Lock()
				defer mu.Unlock()
				worstUtil, worstLight = min(worstUtil, v.util), min(worstLight, v.light)
				worstOverflow, worstLift = max(worstOverflow, v.overflow), max(worstLift, v.lift)
			})
		}
	})
	t.Logf("%d schedules: worst utilisation %.3f, light %.4f, overflow share %.4f, lift %v", seeds, worstUtil, worstLight, worstOverflow, worstLift)
}

// runSchedule simulates seed's schedule and judges it.
func runSchedule(t testing.TB, seed uint64) scheduleVerdict {
	v := scheduleVerdict{util: 1, light: 1}
	r := rand.New(rand.NewPCG(seed, 31))
	sched := randomSchedule(r, schedEnd)
	c0 := 2000 + 3000*r.Float64()
	srv := simServer{capacity: c0, queueLen: 256, speed: sched.at}
	if seed%2 == 1 {
		// Reads in bursts, as a server under a CPU quota does.
		srv.period, srv.quota = 10*time.Millisecond, 2*time.Millisecond
	}
	// The flood is over every speed the server reaches; the light load a
	// quarter of its least lasting one.
	least, most := sched.factors()
	flood := 2.5 * c0 * most * 1.3
	res := srv.run(t, schedEnd, []simSource{
		{name: "light", rate: c0 * least / 4, addr: evenNets(50), regular: true},
		{name: "flood", rate: flood, from: schedFloodFrom, to: schedFloodTo, addr: subnet24(10, 200, 7)},
	})
	name := fmt.Sprintf("seed %d (C %.0f, quota %v):%s", seed, c0, srv.quota, sched)
	fail := func(format string, args ...any) { v.errs = append(v.errs, name+": "+fmt.Sprintf(format, args...)) }
	// Every 1 s window from 2 s after a change until the next one, in tenths.
	judged := 0
	prevLight := -1.0
	for w := int(schedFloodFrom/schedTenth) + 1; (w+schedWindowTenths)*int(schedTenth) <= int(schedFloodTo); w++ {
		from, to := time.Duration(w)*schedTenth, time.Duration(w+schedWindowTenths)*schedTenth
		if from < sched.lastChange(from)+schedJudgeAfter || sched.nextChange(from, schedFloodTo) < to {
			prevLight = -1
			continue
		}
		judged++
		read, possible, lightSent, lightServed := 0, 0.0, 0, 0
		for i := w; i < w+schedWindowTenths; i++ {
			read += res.readTenth[i]
			possible += res.possible[i]
			lightSent += res.sentTenth["light"][i]
			lightServed += res.servedTenth["light"][i]
		}
		util := float64(read) / possible
		light := float64(lightServed) / float64(lightSent)
		v.util, v.light = min(v.util, util), min(v.light, light)
		if util < schedMinUtilisation {
			fail("read %.3f of what it could in [%v, %v), want >= %.2f", util, from, to, schedMinUtilisation)
		}
		if light < schedMinLight {
			fail("light /24s answered %.4f in [%v, %v), want >= %.2f", light, from, to, schedMinLight)
		}
		// Second to second: windows a second apart.
		if (w-int(schedFloodFrom/schedTenth)-1)%schedWindowTenths == 0 {
			if prevLight >= 0 && math.Abs(float64(lightServed)-prevLight) > schedMaxLightSwing*prevLight {
				fail("light load answered %.0f then %d in consecutive seconds to %v: more than %.0f%% apart", prevLight, lightServed, to, 100*schedMaxLightSwing)
			}
			prevLight = float64(lightServed)
		}
	}
	if judged == 0 {
		fail("no window judged")
	}
	offered, lost := 0, 0
	for i := int((schedFloodFrom + time.Second) / schedTenth); i < int(schedFloodTo/schedTenth); i++ {
		offered += res.sentTenth["light"][i] + res.sentTenth["flood"][i]
		lost += res.overflowTenth[i]
	}
	v.overflow = float64(lost) / float64(offered)
	if v.overflow > schedMaxOverflow {
		fail("%d of %d offered queries lost to the full queue from 1 s into the flood (%.4f), want under %.2f", lost, offered, v.overflow, schedMaxOverflow)
	}
	v.lift = -1
	for i, at := range res.levelAt {
		if at >= schedFloodTo && math.IsInf(res.level[i], 1) && !res.overloaded[i] {
			v.lift = at - schedFloodTo
			break
		}
	}
	if v.lift < 0 || v.lift > schedMaxLift {
		fail("limits lifted %v after the flood, want within %v", v.lift, schedMaxLift)
		v.lift = max(v.lift, schedEnd)
	}
	return v
}
