//go:build linux

package rrl

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestLimitedWatchTimeline: the changes between looks at the kernel's list become
// start and stop events, bounded per second with the suppressed ones counted, and a
// group whose start was suppressed reports no stop.
func TestLimitedWatchTimeline(t *testing.T) {
	a := LimitedGroup{Node: nodeTagIPv4 | 32, Group: netip.MustParsePrefix("192.0.2.1/32"), Rate: 900, Limit: 100}
	b := LimitedGroup{Node: nodeTagIPv4 | 24, Group: netip.MustParsePrefix("198.51.100.0/24"), Rate: 300, Limit: 100}
	p := LimitedGroup{Node: NodePort, Group: netip.MustParsePrefix("0.0.0.0/0"), Port: 4444, Rate: 500, Limit: 100}
	t0 := time.Unix(1000, 0)
	type want struct {
		stop       bool
		network    string
		port       uint16
		suppressed uint64
	}
	steps := []struct {
		at     time.Duration
		groups []LimitedGroup
		want   []want
	}{
		{0, []LimitedGroup{a}, []want{{false, "192.0.2.1/32", 0, 0}}},
		{time.Second, []LimitedGroup{a}, nil},                                                // still limited: nothing new
		{2 * time.Second, []LimitedGroup{a, b, p}, []want{{false, "198.51.100.0/24", 0, 0}}}, // p over the budget
		{3 * time.Second, []LimitedGroup{b, p}, []want{{true, "192.0.2.1/32", 0, 1}}},
		{4 * time.Second, nil, []want{{true, "198.51.100.0/24", 0, 0}}}, // p's start was suppressed: no stop
		{5 * time.Second, []LimitedGroup{p}, []want{{false, "invalid Prefix", 4444, 0}}},
	}
	w := limitedWatch{budget: eventBudget{perSec: 1}, started: map[limitedKey]LimitEvent{}}
	for _, s := range steps {
		got := w.changes(s.groups, t0.Add(s.at))
		if len(got) != len(s.want) {
			t.Fatalf("at %v: events %v, want %d", s.at, got, len(s.want))
		}
		for i, e := range got {
			wn := s.want[i]
			if e.Stop != wn.stop || e.Network.String() != wn.network || e.Port != wn.port || e.Suppressed != wn.suppressed || e.Account != AccountGroup {
				t.Errorf("at %v: event %+v, want %+v", s.at, e, wn)
			}
			if e.Stop && e.Duration <= 0 {
				t.Errorf("at %v: stop without a duration: %+v", s.at, e)
			}
		}
	}
}

// TestLiveWatchLimited: a flood from one address on a real socket produces one start
// event naming its /32, and one stop once it has ended.
func TestLiveWatchLimited(t *testing.T) {
	srv, f := attachLive(t, "100")
	var mu sync.Mutex
	var events []LimitEvent
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	done := make(chan error)
	go func() {
		done <- f.WatchLimited(ctx, 200*time.Millisecond, 0, func(e LimitEvent) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
			if e.Stop {
				cancel()
			}
		})
	}()
	src := netip.MustParseAddrPort("127.3.3.3:40000")
	runLive(t, srv, f, []flow{{Name: "flood", Rate: 2000, End: time.Second, Src: func(int) netip.AddrPort { return src }}}, time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Stop || !events[1].Stop {
		t.Fatalf("events %v, want one start and one stop", events)
	}
	for _, e := range events {
		if e.Network != netip.MustParsePrefix("127.3.3.3/32") || e.Node != nodeTagIPv4|32 || e.Limit != 100 {
			t.Errorf("event %+v: want 127.3.3.3/32 at ipv4/32, limit 100", e)
		}
	}
	t.Logf("%v\n%v", events[0], events[1])
}
