package rrl

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// eventLog collects the events of a limiter under test.
type eventLog struct {
	mu     sync.Mutex
	events []LimitEvent
}

func (l *eventLog) add(e LimitEvent) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) take() []LimitEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// newEventRRL is newTestRRL with events going to the returned log.
func newEventRRL(t testing.TB, perSec int, kv ...string) (*RRL, *fakeClock, *eventLog) {
	t.Helper()
	c := &fakeClock{now: t0}
	log := &eventLog{}
	cfg := NewConfig()
	cfg.SetNowFunc(func() time.Time { return c.now })
	cfg.SetEventFunc(log.add)
	if perSec > 0 {
		mustSet(t, cfg, "events-per-second", strconv.Itoa(perSec))
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	manualTicks(r) // no timer reads the fake clock behind the test's back
	return r, c, log
}

func TestEventsStartStop(t *testing.T) {
	attacker := udp("192.0.2.7")
	other := udp("198.51.100.1")
	for _, tc := range []struct {
		name       string
		reportOnly bool
		// wake is the client whose debit, after recovery, reveals the stop: the
		// account's own next debit, or another client's (the sweep).
		wake      net.Addr
		wakeTuple ResponseTuple
	}{
		{"own-debit", false, attacker, www},
		{"sweep", false, other, answer(28, "other.example.test.")},
		{"report-only", true, other, www},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c, log := newEventRRL(t, 0, "responses-per-second", "5", "report-only", map[bool]string{true: "true", false: "false"}[tc.reportOnly])
			// 20 responses at t0: five fit, the 6th starts limiting.
			for range 20 {
				r.Debit(attacker, &www)
			}
			if ev := log.take(); len(ev) != 0 {
				t.Fatalf("events before the episode lasted a second: %v", ev)
			}
			// One second later the start is reported with the rate seen: 15
			// limited debits at t0 and one at t0+1s, over one second.
			c.now = t0.Add(time.Second)
			r.Debit(attacker, &www)
			ev := log.take()
			if len(ev) != 1 {
				t.Fatalf("after 1 s: %d events %v, want one start", len(ev), ev)
			}
			want := LimitEvent{
				Time: t0.Add(time.Second), Account: AccountResponses,
				Network:  netip.MustParsePrefix("192.0.2.0/24"),
				Category: AllowanceAnswer, Name: "www.example.test.", Type: 1,
				Limit: 5, Rate: 16, Count: 16, ReportOnly: tc.reportOnly,
			}
			if ev[0] != want {
				t.Errorf("start event\n got %+v\nwant %+v", ev[0], want)
			}
			// Still limited two seconds later: no event.
			c.now = t0.Add(2 * time.Second)
			r.Debit(attacker, &www)
			if ev := log.take(); len(ev) != 0 {
				t.Fatalf("while limited: %v", ev)
			}
			// The balance after 22 debits of 0.2 s is back at full credit 5.4 s
			// after t0. At t0+8s the stop is found.
			c.now = t0.Add(8 * time.Second)
			r.Debit(tc.wake, &tc.wakeTuple)
			ev = log.take()
			if len(ev) != 1 || !ev[0].Stop {
				t.Fatalf("after recovery: %v, want one stop", ev)
			}
			s := ev[0]
			if s.Network != want.Network || s.Name != want.Name || s.Type != 1 || s.Count != 17 ||
				s.Duration != 8*time.Second || s.Evicted || s.ReportOnly != tc.reportOnly {
				t.Errorf("stop event %+v", s)
			}
			// Once each: nothing more, whoever debits later.
			for i := range 5 {
				c.now = t0.Add(time.Duration(9+i) * time.Second)
				r.Debit(attacker, &www)
				r.Debit(other, &www)
			}
			if ev := log.take(); len(ev) != 0 {
				t.Errorf("after the stop: %v", ev)
			}
		})
	}
}

func TestEventsCategories(t *testing.T) {
	r, c, log := newEventRRL(t, 0, "responses-per-second", "1", "requests-per-second", "0",
		"nxdomains-per-second", "1", "errors-per-second", "1")
	nx := ResponseTuple{Class: 1, Type: 28, AllowanceCategory: AllowanceNXDomain, SalientName: "example.test."}
	serv := ResponseTuple{Class: 1, Type: 16, AllowanceCategory: AllowanceError, SalientName: "x.example.test."}
	v6 := &net.UDPAddr{IP: net.ParseIP("2001:db8:1:2:3::9")}
	for range 3 {
		r.Debit(v6, &nx)
		r.Debit(v6, &serv)
	}
	c.now = t0.Add(time.Second)
	r.Debit(udp("203.0.113.1"), &www)
	ev := log.take()
	if len(ev) != 2 {
		t.Fatalf("%d events: %v", len(ev), ev)
	}
	got := map[AllowanceCategory]LimitEvent{}
	for _, e := range ev {
		got[e.Category] = e
	}
	net56 := netip.MustParsePrefix("2001:db8:1::/56")
	if e := got[AllowanceNXDomain]; e.Network != net56 || e.Name != "example.test." || e.Type != 0 {
		t.Errorf("NXDOMAIN event %+v", e)
	}
	if e := got[AllowanceError]; e.Network != net56 || e.Name != "" || e.Type != 0 {
		t.Errorf("error event %+v", e)
	}
}

func TestEventsRequestsAccount(t *testing.T) {
	r, c, log := newEventRRL(t, 0, "requests-per-second", "2")
	for range 5 {
		r.Debit(tcp("192.0.2.9"), nil)
	}
	c.now = t0.Add(time.Second)
	r.Debit(tcp("192.0.2.200"), nil) // same /24: still limited, the sweep reports
	ev := log.take()
	if len(ev) != 1 || ev[0].Account != AccountRequests || ev[0].Network != netip.MustParsePrefix("192.0.2.0/24") || ev[0].Limit != 2 {
		t.Fatalf("events %+v", ev)
	}
}

// TestEventsFlood: a flood from 100,000 networks, each limited, reports at most the
// configured number of events in every second, and the count of the others. Under
// the race detector the flood comes from 10,000 networks, still ten times what the
// events track (exhaustive_test.go).
func TestEventsFlood(t *testing.T) {
	const perSec, seconds = 7, 3
	sources := floodSources(100_000)
	r, c, log := newEventRRL(t, perSec, "responses-per-second", "1", "max-table-size", "200000")
	src := &net.UDPAddr{IP: make(net.IP, 4), Port: 1}
	for sec := range seconds {
		for i := range sources {
			c.now = t0.Add(time.Duration(sec)*time.Second + time.Duration(i)*(time.Second/time.Duration(sources)))
			setIP(src.IP, uint32(i))
			r.Debit(src, &www)
			r.Debit(src, &www) // the second of a new account at 1/s is limited
		}
	}
	ev := log.take()
	perSecond := map[int64]int{}
	var suppressed uint64
	for _, e := range ev {
		perSecond[e.Time.Unix()]++
		suppressed += e.Suppressed
	}
	for s, n := range perSecond {
		if n > perSec {
			t.Errorf("second %d: %d events, at most %d allowed", s, n, perSec)
		}
	}
	if len(ev) == 0 || len(ev) > perSec*(seconds+1) {
		t.Errorf("%d events in %d s", len(ev), seconds)
	}
	// Every account was limited: all but the reported ones were suppressed (the
	// last suppressions wait for the next event).
	if suppressed < uint64(sources)/2 {
		t.Errorf("suppressed count reported %d, want most of %d", suppressed, sources)
	}
	t.Logf("%d events, %d suppressed reported", len(ev), suppressed)
}

func TestEventsString(t *testing.T) {
	e := LimitEvent{Account: AccountResponses, Network: netip.MustParsePrefix("192.0.2.0/24"),
		Category: AllowanceAnswer, Name: "www.example.", Type: 1, Limit: 5, Rate: 40, Suppressed: 3}
	if got, want := e.String(), "limit responses to 192.0.2.0/24 for www.example. A (rate 40/s, limit 5/s); 3 events suppressed"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	e.Stop, e.Duration, e.Suppressed = true, 3*time.Second, 0
	if got, want := e.String(), "stop limiting responses to 192.0.2.0/24 for www.example. A (rate 40/s, limit 5/s, for 3s)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	var buf bytes.Buffer
	SlogEvents(slog.New(slog.NewTextHandler(&buf, nil)))(e)
	for _, s := range []string{"network=192.0.2.0/24", "name=www.example.", "type=A", "event=stop", "duration=3s"} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("slog line %q lacks %q", buf.String(), s)
		}
	}
}

func TestLimiterEvents(t *testing.T) {
	for _, reportOnly := range []bool{false, true} {
		log := &eventLog{}
		cfg := NewConfig()
		cfg.SetValue("requests-per-second", "100")
		cfg.SetValue("report-only", map[bool]string{true: "true", false: "false"}[reportOnly])
		cfg.SetEventFunc(log.add)
		l, err := newLimiterSeed(cfg, 1)
		if err != nil {
			t.Fatal(err)
		}
		manualLimiterTicks(l) // the packets' clock is the test's: no real ticks
		heavy := netip.MustParseAddrPort("192.0.2.77:4000")
		light := netip.MustParseAddrPort("198.51.100.1:4001")
		// 1000 packets per second from one address for 2 s; a light source alongside.
		const step = int64(time.Millisecond)
		now := int64(time.Second)
		for i := range 2000 {
			now += step
			l.decideAt(heavy, now, uint32(i*2654435761))
			if i%100 == 0 {
				l.decideAt(light, now, uint32(i))
			}
		}
		ev := log.take()
		if len(ev) != 1 || ev[0].Stop || ev[0].Node != nodeTagIPv4|32 ||
			ev[0].Network != netip.MustParsePrefix("192.0.2.77/32") || ev[0].Limit != 100 || ev[0].ReportOnly != reportOnly {
			t.Fatalf("report-only %v: flood events %+v", reportOnly, ev)
		}
		if ev[0].Rate < 100 {
			t.Errorf("start rate %v", ev[0].Rate)
		}
		// The flood stops; the light source goes on and its packets run the sweep.
		for range 30 {
			now += 100 * step
			l.decideAt(light, now, 7)
		}
		ev = log.take()
		if len(ev) != 1 || !ev[0].Stop || ev[0].Network != netip.MustParsePrefix("192.0.2.77/32") || ev[0].Rate >= 100 {
			t.Fatalf("after the flood: %+v", ev)
		}
	}
}

// TestLimiterEventsFlood: a flood from 100,000 sources, each limited, reports at
// most the configured number of events in every second, and counts the others.
// Under the race detector the flood comes from 10,000 sources over the same two
// seconds, still ten times the groups the events track (exhaustive_test.go).
func TestLimiterEventsFlood(t *testing.T) {
	const perSec = 5
	sources := floodSources(100_000)
	log := &eventLog{}
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "10")
	cfg.SetValue("source-port-factor", "0")
	cfg.SetValue("ipv4-request-levels", "32:1")
	cfg.SetEventFunc(log.add)
	mustSet(t, cfg, "events-per-second", strconv.Itoa(perSec))
	l, err := newLimiterSeed(cfg, 2)
	if err != nil {
		t.Fatal(err)
	}
	manualLimiterTicks(l)
	// 100,000 sources (256 per /24), each sending a burst of 10 packets within 10
	// microseconds, over two seconds.
	now := int64(time.Second)
	for i := range sources {
		var b [4]byte
		b[0], b[1], b[2], b[3] = 10, byte(i>>16), byte(i>>8), byte(i)
		src := netip.AddrPortFrom(netip.AddrFrom4(b), 5000)
		for k := range 10 {
			l.decideAt(src, now+int64(k)*1000, uint32(k)*0x9e3779b9)
		}
		now += 2 * int64(time.Second) / int64(sources)
	}
	ev := log.take()
	perSecond := map[int64]int{}
	var suppressed uint64
	for _, e := range ev {
		perSecond[int64(e.Time.Sub(clockBase)/time.Second)]++ // the packets' clock
		suppressed += e.Suppressed
	}
	for s, n := range perSecond {
		if n > perSec {
			t.Errorf("second %d: %d events", s, n)
		}
	}
	if len(ev) == 0 || suppressed == 0 {
		t.Errorf("%d events, %d suppressed reported", len(ev), suppressed)
	}
	t.Logf("%d events, %d suppressed reported", len(ev), suppressed)
}
