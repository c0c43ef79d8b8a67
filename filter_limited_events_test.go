//go:build linux

package rrl

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLimitedWatchTimeline: the changes between looks at the kernel's list become
// start and stop events: a stop when a group is no longer listed or its rate has
// fallen under its limit, a new start only for a refusal recorded after that; events
// are bounded per second with the suppressed ones counted, a group whose start was
// suppressed reports no stop, and report-only is carried from the start to its stop.
func TestLimitedWatchTimeline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	group := func(node LimiterNode, prefix string, port uint16, rate float64, last time.Duration) GroupRate {
		return GroupRate{Node: node, Group: netip.MustParsePrefix(prefix), Port: port, Rate: rate, Limit: 100, Last: at(last)}
	}
	a := group(nodeTagIPv4|32, "192.0.2.1/32", 0, 900, 0)
	b := group(nodeTagIPv4|24, "198.51.100.0/24", 0, 300, 0)
	p := group(NodePort, "0.0.0.0/0", 4444, 500, 0)
	c := group(nodeTagIPv4|32, "192.0.2.3/32", 0, 900, 10*time.Second)
	d := group(nodeTagIPv4|32, "192.0.2.4/32", 0, 900, 10*time.Second)
	with := func(g GroupRate, rate float64, last time.Duration) GroupRate {
		g.Rate, g.Last = rate, at(last)
		return g
	}
	type want struct {
		stop       bool
		network    string
		port       uint16
		suppressed uint64
		reportOnly bool
	}
	steps := []struct {
		at         time.Duration
		groups     []GroupRate
		reportOnly bool
		want       []want
	}{
		{0, []GroupRate{a}, false, []want{{false, "192.0.2.1/32", 0, 0, false}}},
		{time.Second, []GroupRate{a}, false, nil},                                                       // still limited: nothing new
		{2 * time.Second, []GroupRate{a, b, p}, false, []want{{false, "198.51.100.0/24", 0, 0, false}}}, // p over the budget
		{3 * time.Second, []GroupRate{b, p}, false, []want{{true, "192.0.2.1/32", 0, 1, false}}},
		{4 * time.Second, nil, false, []want{{true, "198.51.100.0/24", 0, 0, false}}}, // p's start was suppressed: no stop
		{5 * time.Second, []GroupRate{p}, false, []want{{false, "invalid Prefix", 4444, 0, false}}},
		// Under its limit while still listed: stopped, and not started again by
		// the refusals already recorded.
		{6 * time.Second, []GroupRate{with(p, 50, 5*time.Second)}, false, []want{{true, "invalid Prefix", 4444, 0, false}}},
		{7 * time.Second, []GroupRate{with(p, 50, 5*time.Second)}, false, nil},
		{8 * time.Second, []GroupRate{with(p, 500, 7500*time.Millisecond)}, true, []want{{false, "invalid Prefix", 4444, 0, true}}},
		{9 * time.Second, []GroupRate{with(p, 20, 7500*time.Millisecond)}, false, []want{{true, "invalid Prefix", 4444, 0, true}}},
		// A suppressed start that recovers may start again on a later refusal.
		{10 * time.Second, []GroupRate{c, d}, false, []want{{false, "192.0.2.3/32", 0, 0, false}}},
		{11 * time.Second, []GroupRate{c, with(d, 10, 10*time.Second)}, false, nil},
		{12 * time.Second, []GroupRate{c, with(d, 900, 11500*time.Millisecond)}, false, []want{{false, "192.0.2.4/32", 0, 1, false}}},
	}
	w := newLimitedWatch(1)
	for _, s := range steps {
		got := w.changes(s.groups, s.reportOnly, at(s.at))
		if len(got) != len(s.want) {
			t.Fatalf("at %v: events %v, want %d", s.at, got, len(s.want))
		}
		for i, e := range got {
			wn := s.want[i]
			if e.Stop != wn.stop || e.Network.String() != wn.network || e.Port != wn.port || e.Suppressed != wn.suppressed || e.ReportOnly != wn.reportOnly || e.Account != AccountGroup {
				t.Errorf("at %v: event %+v, want %+v", s.at, e, wn)
			}
			if e.Stop && e.Duration <= 0 {
				t.Errorf("at %v: stop without a duration: %+v", s.at, e)
			}
		}
	}
}

// attachLiveCfg attaches the eBPF filter with the settings kv (keyword, value, ...)
// to a new server socket on 127.0.0.1; the filter closes when t ends.
func attachLiveCfg(t *testing.T, kv ...string) (*udpServer, *Filter) {
	t.Helper()
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	cfg := NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if f.Mode() != ModeEBPF {
		t.Fatalf("mode %v, want ebpf", f.Mode())
	}
	return srv, f
}

// timedEvent is an event and when the event function received it.
type timedEvent struct {
	LimitEvent
	at time.Time
}

// watchLive runs WatchLimited on f every interval until the first stop event or
// ctx's end, and returns a function that waits for it and returns the events.
func watchLive(t *testing.T, ctx context.Context, f *Filter, interval time.Duration) func() []timedEvent {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	var events []timedEvent
	done := make(chan error, 1)
	go func() {
		done <- f.WatchLimited(ctx, interval, 0, func(e LimitEvent) {
			mu.Lock()
			events = append(events, timedEvent{e, time.Now()})
			mu.Unlock()
			if e.Stop {
				cancel()
			}
		})
	}()
	return func() []timedEvent {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		cancel()
		mu.Lock()
		defer mu.Unlock()
		return events
	}
}

// TestLiveWatchLimited: a flood from one address on a real socket produces one start
// event naming its /32, and one stop once it has ended; in report-only mode the same
// events say that the filter would limit, and every packet reaches the server.
func TestLiveWatchLimited(t *testing.T) {
	for _, reportOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("report-only=%v", reportOnly), func(t *testing.T) {
			srv, f := attachLiveCfg(t, "requests-per-second", "100", "report-only", strconv.FormatBool(reportOnly))
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			wait := watchLive(t, ctx, f, 200*time.Millisecond)
			src := netip.MustParseAddrPort("127.3.3.3:40000")
			run := runLive(t, srv, f, []flow{{Name: "flood", Rate: 2000, End: time.Second, Src: func(int) netip.AddrPort { return src }}}, time.Second)
			events := wait()
			if len(events) != 2 || events[0].Stop || !events[1].Stop {
				t.Fatalf("events %v, want one start and one stop", events)
			}
			verb := map[bool][2]string{false: {"limit ", "stop limiting "}, true: {"would limit ", "would stop limiting "}}[reportOnly]
			for i, e := range events {
				if e.Network != netip.MustParsePrefix("127.3.3.3/32") || e.Node != nodeTagIPv4|32 || e.Limit != 100 || e.ReportOnly != reportOnly {
					t.Errorf("event %+v: want 127.3.3.3/32 at ipv4/32, limit 100, report-only %v", e.LimitEvent, reportOnly)
				}
				if s := e.String(); !strings.HasPrefix(s, verb[i]) {
					t.Errorf("event %q: want it to begin %q", s, verb[i])
				}
			}
			sent, got := len(run.sentAt[0]), len(run.received[0])
			switch {
			case reportOnly && (got != sent || run.filter.ReportOnly == 0):
				t.Errorf("report-only: %d of %d packets read, %d counted report-only; want all, and some", got, sent, run.filter.ReportOnly)
			case !reportOnly && got > sent/2:
				t.Errorf("enforcing: %d of %d packets read, want the flood limited", got, sent)
			}
			t.Logf("%v\n%v", events[0].LimitEvent, events[1].LimitEvent)
		})
	}
}

// TestLiveWatchLimitedBurstThenSilence: a short burst from one /24 over its limit,
// then nothing: with the default interval, WatchLimited reports the start within 2 s
// of the burst and the stop within 2 s of the group's recovery, with no later
// traffic to find either.
func TestLiveWatchLimitedBurstThenSilence(t *testing.T) {
	const limit, sources, perSource = 50, 100, 4
	srv, f := attachLiveCfg(t, "requests-per-second", strconv.Itoa(limit), "ipv4-request-levels", "32:1")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	wait := watchLive(t, ctx, f, 0)
	go srv.collect(time.Now(), ctx.Done(), time.Hour, 15*time.Second) // keep the queue empty

	raw := newRawSender(t, srv.addr)
	start := time.Now()
	for i := range sources * perSource {
		// Each source stays far under the /32 limit, and each has its own port:
		// only the /24 is over its limit.
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 9, 9, byte(1 + i%sources)}), uint16(30000+i%sources))
		raw.send(t, ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false)))
	}
	end := time.Now()
	events := wait()
	if len(events) != 2 || events[0].Stop || !events[1].Stop {
		t.Fatalf("events %v, want one start and one stop", events)
	}
	for _, e := range events {
		if e.Network != netip.MustParsePrefix("127.9.9.0/24") || e.Node != nodeTagIPv4|24 {
			t.Errorf("event %v: want 127.9.9.0/24 at ipv4/24", e.LimitEvent)
		}
	}
	// The /24's estimate counts every packet, decaying with half-life H: at the
	// burst's end it lies between n*2^(-d/H) and n packets' worth, rate count*ln2/H,
	// and the filter refuses none of the group's packets once it is under the limit.
	n, h, d := float64(sources*perSource), float64(halfLifeNanos)/1e9, end.Sub(start).Seconds()
	recoveredAfter := func(count float64) time.Time {
		return end.Add(time.Duration(h * math.Log2(count*math.Ln2/h/limit) * float64(time.Second)))
	}
	earliest, latest := recoveredAfter(n*math.Exp2(-d/h)), recoveredAfter(n)
	if got := events[0].at.Sub(start); got > 2*time.Second {
		t.Errorf("start reported %v after the burst began, want within 2s", got)
	}
	if events[1].at.Before(earliest) {
		t.Errorf("stop reported %v before the group could have recovered", earliest.Sub(events[1].at))
	}
	if got := events[1].at.Sub(latest); got > 2*time.Second {
		t.Errorf("stop reported %v after the group had recovered, want within 2s", got)
	}
	t.Logf("burst of %v; start after %v; recovery %v to %v after the burst; stop after %v\n%v\n%v",
		end.Sub(start), events[0].at.Sub(start), earliest.Sub(end), latest.Sub(end), events[1].at.Sub(end), events[0].LimitEvent, events[1].LimitEvent)
}
