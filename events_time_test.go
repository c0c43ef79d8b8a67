package rrl

import (
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Events driven by time: bursts followed by silence, on clocks the tests control
// (a fake clock and an events timer whose ticks the test fires) and on the real one.

// manualTimers stands in for time.AfterFunc in an events timer: a tick fires when the
// test says, in the test's goroutine.
type manualTimers struct {
	mu      sync.Mutex
	pending []*manualTimer
}

type manualTimer struct {
	m *manualTimers
	d time.Duration
	f func()
}

func (m *manualTimers) after(d time.Duration, f func()) eventTimer {
	t := &manualTimer{m, d, f}
	m.mu.Lock()
	m.pending = append(m.pending, t)
	m.mu.Unlock()
	return t
}

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	for i, p := range t.m.pending {
		if p == t {
			t.m.pending = append(t.m.pending[:i], t.m.pending[i+1:]...)
			return true
		}
	}
	return false
}

// next removes the pending tick and returns it; false when none is pending. The events
// timer has at most one pending at a time, which next checks.
func (m *manualTimers) next(t *testing.T) (*manualTimer, bool) {
	t.Helper()
	tm, ok := m.peek(t)
	if ok {
		m.mu.Lock()
		m.pending = nil
		m.mu.Unlock()
	}
	return tm, ok
}

// peek is next leaving the tick pending.
func (m *manualTimers) peek(t *testing.T) (*manualTimer, bool) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	switch len(m.pending) {
	case 0:
		return nil, false
	case 1:
		return m.pending[0], true
	}
	t.Fatalf("%d ticks pending, want at most one", len(m.pending))
	return nil, false
}

// manualTicks has r's events timer tick only when the test fires it.
func manualTicks(r *RRL) *manualTimers {
	m := &manualTimers{}
	r.tracker.mu.Lock()
	r.tracker.ticks.after = m.after
	r.tracker.mu.Unlock()
	return m
}

// manualLimiterTicks has l's events timer tick only when the test fires it, and the
// timer read the returned clock (nanoseconds) instead of the coarse clock.
func manualLimiterTicks(l *Limiter) (*manualTimers, *int64) {
	m := &manualTimers{}
	clock := new(int64)
	ev := l.events.Load()
	ev.mu.Lock()
	ev.ticks.after = m.after
	ev.realNow = func() int64 { return *clock }
	ev.mu.Unlock()
	return m, clock
}

// runTicks fires the pending ticks of m one after another, each after advancing the
// clock by the delay it asked for, until none is pending or the clock has passed
// until. It fails the test if a tick asked for more than a second.
func runTicks(t *testing.T, m *manualTimers, advance func(time.Duration) time.Duration, until time.Duration) {
	t.Helper()
	for range 10_000 {
		tm, ok := m.next(t)
		if !ok {
			return
		}
		if tm.d > time.Second || tm.d <= 0 {
			t.Fatalf("tick after %v, want within (0, 1s]", tm.d)
		}
		if advance(tm.d) > until {
			return
		}
		tm.f()
	}
	t.Fatal("ticks never stop")
}

// TestEventsBurstThenSilence: 60 identical queries from one /24 under
// responses-per-second 5, then nothing: the start is reported within 2 s of the first
// limited response, the stop within 2 s of the account's recovery, both by the timer,
// and then no tick is left pending.
func TestEventsBurstThenSilence(t *testing.T) {
	r, c, log := newEventRRL(t, 0, "responses-per-second", "5")
	ticks := manualTicks(r)
	acts := map[Action]int{}
	for range 60 {
		a, _, _ := r.Debit(udp("192.0.2.7"), &www)
		acts[a]++
	}
	if acts[Send] != 5 || acts[Slip] != 28 || acts[Drop] != 27 {
		t.Fatalf("actions %v, want 5 sent, 28 slipped, 27 dropped", acts)
	}
	if ev := log.take(); len(ev) != 0 {
		t.Fatalf("events during the burst: %v", ev)
	}
	// The burst costs 12 s of credit from one second: full credit again at t0+12s.
	recovered := t0.Add(12 * time.Second)
	elapsed := time.Duration(0)
	var got []LimitEvent
	runTicks(t, ticks, func(d time.Duration) time.Duration {
		elapsed += d
		c.now = t0.Add(elapsed)
		return elapsed
	}, time.Minute)
	got = log.take()
	if len(got) != 2 || got[0].Stop || !got[1].Stop {
		t.Fatalf("events %+v, want a start and a stop", got)
	}
	start, stop := got[0], got[1]
	if d := start.Time.Sub(t0); d < time.Second || d > 2*time.Second {
		t.Errorf("start reported %v after the first limited response, want within [1s, 2s]", d)
	}
	if start.Count != 55 || start.Rate != 55 || start.Network != netip.MustParsePrefix("192.0.2.0/24") {
		t.Errorf("start %+v, want 55 limited responses at 55/s from 192.0.2.0/24", start)
	}
	if d := stop.Time.Sub(recovered); d < 0 || d > 2*time.Second {
		t.Errorf("stop reported %v after recovery (%v), want within [0, 2s]", d, recovered)
	}
	if stop.Count != 55 || stop.Evicted || stop.Duration != stop.Time.Sub(t0) {
		t.Errorf("stop %+v", stop)
	}
	if _, ok := ticks.next(t); ok {
		t.Error("a tick is still pending with no episode open")
	}
}

// TestEventsBurstThenSilenceBound: ten networks limited at once, then silence, under
// events-per-second 3: three starts in the first second and the other seven counted
// as suppressed, reported with the next event; the three stops after recovery; never
// more than three events in a second of the clock.
func TestEventsBurstThenSilenceBound(t *testing.T) {
	r, c, log := newEventRRL(t, 3, "responses-per-second", "5")
	ticks := manualTicks(r)
	for n := range 10 {
		src := udpAddrs(10)[n]
		for range 20 {
			r.Debit(src, &www)
		}
	}
	elapsed := time.Duration(0)
	runTicks(t, ticks, func(d time.Duration) time.Duration {
		elapsed += d
		c.now = t0.Add(elapsed)
		return elapsed
	}, time.Minute)
	ev := log.take()
	perSecond := map[time.Duration]int{}
	var starts, stops int
	var suppressed uint64
	for _, e := range ev {
		perSecond[e.Time.Sub(t0)/time.Second]++
		suppressed += e.Suppressed
		if e.Stop {
			stops++
			// 20 debits cost 4 s: full credit at t0+4s.
			if d := e.Time.Sub(t0.Add(4 * time.Second)); d < 0 || d > 2*time.Second {
				t.Errorf("stop %v after recovery, want within [0, 2s]", d)
			}
		} else {
			starts++
			if d := e.Time.Sub(t0); d > 2*time.Second {
				t.Errorf("start %v after the burst", d)
			}
		}
	}
	for s, n := range perSecond {
		if n > 3 {
			t.Errorf("second %d: %d events, at most 3", s, n)
		}
	}
	if starts != 3 || stops != 3 || suppressed != 7 {
		t.Errorf("%d starts, %d stops, %d suppressed (events %+v); want 3, 3, 7", starts, stops, suppressed, ev)
	}
	if _, ok := ticks.next(t); ok {
		t.Error("a tick is still pending with no episode open")
	}
}

// TestEventsTimerFollowsUpdate: Update turning events off stops the timer, and
// turning them on again arms it for the episodes still open.
func TestEventsTimerFollowsUpdate(t *testing.T) {
	r, c, log := newEventRRL(t, 0, "responses-per-second", "5")
	ticks := manualTicks(r)
	for range 20 {
		r.Debit(udp("192.0.2.7"), &www)
	}
	tm, ok := ticks.peek(t)
	if !ok {
		t.Fatal("no tick armed for an open episode")
	}
	off := NewConfig()
	off.SetValue("responses-per-second", "5")
	if _, err := r.Update(off); err != nil {
		t.Fatal(err)
	}
	if _, ok := ticks.next(t); ok {
		t.Fatal("a tick is pending with events off")
	}
	tm.f() // a tick that was already running when Update stopped the timer
	if _, ok := ticks.next(t); ok {
		t.Fatal("a tick that ran with events off armed another")
	}
	on := NewConfig()
	on.SetValue("responses-per-second", "5")
	on.SetEventFunc(log.add)
	if _, err := r.Update(on); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Duration(0)
	runTicks(t, ticks, func(d time.Duration) time.Duration {
		elapsed += d
		c.now = t0.Add(elapsed)
		return elapsed
	}, time.Minute)
	if ev := log.take(); len(ev) != 2 || ev[0].Stop || !ev[1].Stop {
		t.Fatalf("events after events came back on: %+v", ev)
	}
}

// TestLimiterEventsBurstThenSilence: a burst from one address over its limit, then
// nothing: the start is reported at the first limited packet, the stop by the timer
// within 2 s of the group's estimated rate falling under its limit; under
// events-per-second 3, a burst of ten groups reports three starts, three stops and
// the others as suppressed, never more than three events in a second.
func TestLimiterEventsBurstThenSilence(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sources int
		perSec  int
	}{
		{"one", 1, 0},
		{"bound", 10, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &eventLog{}
			cfg := NewConfig()
			cfg.SetValue("requests-per-second", "100")
			cfg.SetValue("source-port-factor", "0")
			cfg.SetValue("ipv4-request-levels", "32:1")
			cfg.SetEventFunc(log.add)
			if tc.perSec > 0 {
				mustSet(t, cfg, "events-per-second", strconv.Itoa(tc.perSec))
			}
			l, err := newLimiterSeed(cfg, 3)
			if err != nil {
				t.Fatal(err)
			}
			ticks, clock := manualLimiterTicks(l)
			// 300 packets from each source within 30 ms, starting at 5 s on the
			// packets' clock, which the timer's clock follows.
			const begin = int64(5 * time.Second)
			now := begin
			firstLimited := int64(-1)
			srcs := make([]netip.AddrPort, tc.sources)
			for i := range srcs {
				srcs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}), 4000)
			}
			for k := range 300 {
				now = begin + int64(k)*int64(100*time.Microsecond)
				*clock = now
				for i, src := range srcs {
					v := l.decideAt(src, now, uint32(k*7919+i)*2654435761)
					if !v.Allowed && firstLimited < 0 {
						firstLimited = now
					}
				}
			}
			if firstLimited < 0 {
				t.Fatal("the burst was not limited")
			}
			// When each group's estimate falls under the limit, read as the sweep does.
			p := l.params.Load()
			recovered := map[netip.Prefix]int64{}
			for _, g := range l.events.Load().groups {
				for at := now; ; at += int64(time.Millisecond) {
					if l.sketch[g.node].rate(g.hash, uint64(at)) < p.limit[g.node] {
						recovered[g.ev.Network] = at
						break
					}
				}
			}
			runTicks(t, ticks, func(d time.Duration) time.Duration {
				*clock += int64(d)
				return time.Duration(*clock - begin)
			}, time.Minute)
			ev := log.take()
			pktTime := func(e LimitEvent) int64 { return int64(e.Time.Sub(clockBase)) }
			perSecond := map[int64]int{}
			var starts, stops int
			var suppressed uint64
			for _, e := range ev {
				perSecond[pktTime(e)/int64(time.Second)]++
				suppressed += e.Suppressed
				if !e.Stop {
					starts++
					if d := time.Duration(pktTime(e) - firstLimited); d < 0 || d > 2*time.Second {
						t.Errorf("start %v after the first limited packet", d)
					}
					continue
				}
				stops++
				at, ok := recovered[e.Network]
				if !ok {
					t.Errorf("stop of %v, which was not followed", e.Network)
				}
				if d := time.Duration(pktTime(e) - at); d < 0 || d > 2*time.Second {
					t.Errorf("stop %v after the rate fell under the limit, want within [0, 2s]", d)
				}
			}
			for s, n := range perSecond {
				if tc.perSec > 0 && n > tc.perSec {
					t.Errorf("second %d: %d events, at most %d", s, n, tc.perSec)
				}
			}
			want := tc.sources
			if tc.perSec > 0 {
				want = tc.perSec
			}
			if starts != want || stops != want || suppressed < uint64(tc.sources-want) {
				t.Errorf("%d starts, %d stops, %d suppressed (%+v); want %d, %d, at least %d",
					starts, stops, suppressed, ev, want, want, tc.sources-want)
			}
			if _, ok := ticks.next(t); ok {
				t.Error("a tick is still pending with no group followed")
			}
		})
	}
}

// TestLimiterEventsTimerFollowsUpdate: Update turning the Limiter's events off stops
// its timer.
func TestLimiterEventsTimerFollowsUpdate(t *testing.T) {
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "100")
	cfg.SetEventFunc(func(LimitEvent) {})
	l, err := newLimiterSeed(cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	ticks, clock := manualLimiterTicks(l)
	src := netip.MustParseAddrPort("192.0.2.1:53")
	for k := range 300 {
		*clock = int64(time.Second) + int64(k)*int64(100*time.Microsecond)
		l.decideAt(src, *clock, uint32(k)*2654435761)
	}
	tm, ok := ticks.peek(t)
	if !ok {
		t.Fatal("no tick armed for a followed group")
	}
	off := NewConfig()
	off.SetValue("requests-per-second", "100")
	if err := l.Update(off); err != nil {
		t.Fatal(err)
	}
	if _, ok := ticks.next(t); ok {
		t.Fatal("a tick is pending with events off")
	}
	tm.f()
	if _, ok := ticks.next(t); ok {
		t.Fatal("a tick that ran with events off armed another")
	}
}

// TestEventsRealTime: on the real clock and timers, with no query after the burst,
// 60 identical queries under responses-per-second 5 are reported within 2 s, and a
// short burst (25 queries under 20 per second, full credit again 1.25 s after it) has
// its start and stop reported, the stop within 2 s of recovery. The Limiter's start
// and stop of a burst through Allow come within the same bounds. At most 3 s.
func TestEventsRealTime(t *testing.T) {
	type seen struct {
		e  LimitEvent
		at time.Time
	}
	watch := func() (func(LimitEvent), chan seen) {
		ch := make(chan seen, 16)
		return func(e LimitEvent) {
			select {
			case ch <- seen{e, time.Now()}:
			default:
			}
		}, ch
	}
	newRRL := func(fn func(LimitEvent), rate string) *RRL {
		cfg := NewConfig()
		cfg.SetValue("responses-per-second", rate)
		cfg.SetEventFunc(fn)
		return NewRRL(cfg)
	}
	longFn, long := watch()
	shortFn, short := watch()
	limFn, lim := watch()
	rLong, rShort := newRRL(longFn, "5"), newRRL(shortFn, "20")
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "100")
	cfg.SetEventFunc(limFn)
	l, err := NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	burst := time.Now()
	for range 60 {
		rLong.Debit(udp("192.0.2.7"), &www)
	}
	for range 25 {
		rShort.Debit(udp("198.51.100.7"), &www)
	}
	limitedAt := time.Time{}
	for range 300 {
		if !l.Allow(netip.MustParseAddrPort("203.0.113.9:4000")) && limitedAt.IsZero() {
			limitedAt = time.Now()
		}
	}
	if limitedAt.IsZero() {
		t.Fatal("the Limiter's burst was not limited")
	}
	deadline := time.After(3 * time.Second)
	var gotLong, gotShort, gotLim []seen
	for len(gotLong) < 1 || len(gotShort) < 2 || len(gotLim) < 2 {
		select {
		case s := <-long:
			gotLong = append(gotLong, s)
		case s := <-short:
			gotShort = append(gotShort, s)
		case s := <-lim:
			gotLim = append(gotLim, s)
		case <-deadline:
			t.Fatalf("after 3 s: %d, %d and %d events, want 1, 2 and 2: %+v %+v %+v",
				len(gotLong), len(gotShort), len(gotLim), gotLong, gotShort, gotLim)
		}
	}
	if s := gotLong[0]; s.e.Stop || s.at.Sub(burst) > 2*time.Second {
		t.Errorf("60 queries: %v %v after the burst, want a start within 2 s", s.e, s.at.Sub(burst))
	}
	if s := gotShort[0]; s.e.Stop || s.at.Sub(burst) > 2*time.Second {
		t.Errorf("25 queries: first event %v %v after the burst, want a start within 2 s", s.e, s.at.Sub(burst))
	}
	if s := gotShort[1]; !s.e.Stop || s.at.Sub(burst.Add(1250*time.Millisecond)) > 2*time.Second {
		t.Errorf("25 queries: second event %v %v after the burst, want a stop within 2 s of recovery", s.e, s.at.Sub(burst))
	}
	if s := gotLim[0]; s.e.Stop || s.at.Sub(limitedAt) > 2*time.Second {
		t.Errorf("Limiter: first event %v %v after the first limited packet, want a start", s.e, s.at.Sub(limitedAt))
	}
	// 300 packets read as about 1000 per second, under 100 after 0.7 s.
	if s := gotLim[1]; !s.e.Stop || s.at.Sub(burst) > 3*time.Second {
		t.Errorf("Limiter: second event %v %v after the burst, want a stop", s.e, s.at.Sub(burst))
	}
	t.Logf("RRL 60 queries: start after %v; 25 queries: start after %v, stop after %v; Limiter: start after %v, stop after %v",
		gotLong[0].at.Sub(burst), gotShort[0].at.Sub(burst), gotShort[1].at.Sub(burst),
		gotLim[0].at.Sub(limitedAt), gotLim[1].at.Sub(burst))
}
