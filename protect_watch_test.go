//go:build linux

package rrl

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// watchedProtection protects a served loopback socket with requests-per-second 50
// and no event function, its kernel events looked at every 100 ms once an Update
// gives one; it returns the Protection and a sender of bursts to it.
func watchedProtection(t *testing.T) (*Protection, func(src netip.AddrPort, n int)) {
	t.Helper()
	requireBPF(t)
	p, addr := startProtected(t, protectWatchConfig(nil, 0))
	if p.Status().Filter != ModeEBPF {
		t.Fatalf("status %v, want the eBPF filter", p.Status())
	}
	// No event function yet, so the goroutine has not started: it reads the
	// interval when Update starts it.
	p.watch.mu.Lock()
	p.watch.interval = 100 * time.Millisecond
	p.watch.mu.Unlock()
	raw := newRawSender(t, addr)
	var mu sync.Mutex // the raw sender is not for concurrent use
	var id uint16
	return p, func(src netip.AddrPort, n int) {
		mu.Lock()
		defer mu.Unlock()
		for range n {
			id++
			if err := raw.Send(ipv4Packet(src, addr, nil, dnsQuery(id, false))); err != nil {
				t.Errorf("raw send: %v", err)
				return
			}
		}
	}
}

// protectWatchConfig is the Config of watchedProtection with event function fn and
// events-per-second perSec (the default when 0).
func protectWatchConfig(fn func(LimitEvent), perSec int) *Config {
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "50"); err != nil {
		panic(err)
	}
	cfg.SetEventFunc(fn)
	if perSec > 0 {
		if err := cfg.SetValue("events-per-second", strconv.Itoa(perSec)); err != nil {
			panic(err)
		}
	}
	return cfg
}

// groupEvents is an event function passing the kernel's group events to a channel.
func groupEvents() (chan LimitEvent, func(LimitEvent)) {
	ch := make(chan LimitEvent, 64)
	return ch, func(e LimitEvent) {
		if e.Account == AccountGroup {
			ch <- e
		}
	}
}

// nextEvent waits up to d for an event on ch.
func nextEvent(t *testing.T, ch chan LimitEvent, d time.Duration, what string) LimitEvent {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(d):
		t.Fatalf("no event within %v: want %s", d, what)
	}
	return LimitEvent{}
}

// quiet checks that no event reaches any of chs for d.
func quiet(t *testing.T, d time.Duration, why string, chs ...chan LimitEvent) {
	t.Helper()
	deadline := time.After(d)
	for {
		for i, ch := range chs {
			select {
			case e := <-ch:
				t.Fatalf("%s: event function %d got %v", why, i, e)
			default:
			}
		}
		select {
		case <-deadline:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestProtectWatchFollowsUpdate: a Protection's kernel events follow Update: an
// event function given by Update turns them on, another redirects them, none turns
// them off, and the events-per-second bound of the latest Config applies.
func TestProtectWatchFollowsUpdate(t *testing.T) {
	p, burst := watchedProtection(t)
	update := func(fn func(LimitEvent), perSec int) {
		t.Helper()
		if _, err := p.Update(protectWatchConfig(fn, perSec)); err != nil {
			t.Fatal(err)
		}
	}
	a, fnA := groupEvents()
	b, fnB := groupEvents()
	net32 := func(s string) netip.Prefix { return netip.MustParsePrefix(s + "/32") }

	burst(netip.MustParseAddrPort("127.0.51.1:45100"), 400)
	update(fnA, 0)
	if e := nextEvent(t, a, 2*time.Second, "the start of 127.0.51.1 after events were turned on"); e.Stop || e.Network != net32("127.0.51.1") {
		t.Fatalf("event %v, want the start of limiting 127.0.51.1/32", e)
	}

	update(fnB, 0)
	if e := nextEvent(t, b, 3*time.Second, "the stop of 127.0.51.1 at the new function"); !e.Stop || e.Network != net32("127.0.51.1") {
		t.Fatalf("event %v, want the stop of 127.0.51.1/32", e)
	}
	burst(netip.MustParseAddrPort("127.0.52.1:45200"), 400)
	if e := nextEvent(t, b, 2*time.Second, "the start of 127.0.52.1"); e.Stop || e.Network != net32("127.0.52.1") {
		t.Fatalf("event %v, want the start of 127.0.52.1/32", e)
	}
	quiet(t, 0, "after the redirect", a)

	update(nil, 0)
	burst(netip.MustParseAddrPort("127.0.53.1:45300"), 400)
	quiet(t, time.Second, "events turned off", a, b)

	// On again, at most one event a second: of the groups listed now (127.0.52.1
	// and 127.0.53.1 at least, and two more), one starts and the others are
	// suppressed, counted in its stop.
	burst(netip.MustParseAddrPort("127.0.54.1:45400"), 400)
	burst(netip.MustParseAddrPort("127.0.55.1:45500"), 400)
	update(fnA, 1)
	start := nextEvent(t, a, 2*time.Second, "a start after events were turned on again")
	if start.Stop {
		t.Fatalf("event %v, want a start", start)
	}
	stop := nextEvent(t, a, 3*time.Second, "the stop of "+start.Network.String())
	if !stop.Stop || stop.Network != start.Network || stop.Suppressed == 0 {
		t.Fatalf("event %v after %v: want its stop, counting the suppressed starts", stop, start)
	}
	quiet(t, 0, "after the redirect back", b)
	if err := p.Status().Events; err != nil {
		t.Errorf("Status().Events: %v", err)
	}
}

// TestProtectWatchCallbackRace: under -race, an event function that calls back
// into the Protection (Status, Update, or Close) while other goroutines Update and
// Close it neither races nor deadlocks, and no event is reported once Close has
// returned.
func TestProtectWatchCallbackRace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close bool // the event function closes the Protection
	}{
		{"calls Status and Update", false},
		{"calls Close", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, burst := watchedProtection(t)
			var calls, updated atomic.Int64
			closedByFn := make(chan error, 1)
			var closeOnce sync.Once
			var cfgs [2]*Config
			// closing is set before the test's own Close: an event delivered while
			// that Close runs may find the filter gone already, which is no fault.
			var closing atomic.Bool
			fn := func(e LimitEvent) {
				calls.Add(1)
				// Status first, closing second: a Status that saw the Close saw it
				// after closing was set.
				if s := p.Status(); s.Filter != ModeEBPF && !closing.Load() {
					t.Errorf("Status from the event function: %v", s)
				}
				if tc.close {
					closeOnce.Do(func() { closedByFn <- p.Close() })
					return
				}
				if _, err := p.Update(cfgs[calls.Load()%2]); err == nil {
					updated.Add(1)
				} else if !errors.Is(err, ErrClosed) {
					t.Errorf("Update from the event function: %v", err)
				}
			}
			cfgs[0], cfgs[1] = protectWatchConfig(fn, 0), protectWatchConfig(fn, 3)
			if _, err := p.Update(cfgs[0]); err != nil {
				t.Fatal(err)
			}

			// A flood from ever new sources, and Updates that turn events off and on.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(3)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					burst(netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 60 + byte(i/250%4), byte(1 + i%250)}), uint16(40000+i%1000)), 200)
				}
			}()
			for g := range 2 {
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						case <-time.After(time.Duration(7+g) * time.Millisecond):
						}
						cfg := cfgs[i%2]
						if i%5 == 4 {
							cfg = protectWatchConfig(nil, 0)
						}
						if _, err := p.Update(cfg); err != nil && !errors.Is(err, ErrClosed) {
							t.Errorf("Update: %v", err)
						}
					}
				}()
			}
			defer func() {
				close(stop)
				wg.Wait()
			}()

			if tc.close {
				select {
				case err := <-closedByFn:
					if err != nil {
						t.Fatalf("Close from the event function: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%d calls of the event function, none whose Close returned within 5s", calls.Load())
				}
			} else {
				deadline := time.Now().Add(5 * time.Second)
				for calls.Load() < 5 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if calls.Load() < 5 {
					t.Fatalf("%d calls of the event function in 5s, want 5", calls.Load())
				}
			}
			closing.Store(true)
			closed := make(chan error, 1)
			go func() { closed <- p.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not return")
			}
			after := calls.Load()
			if _, err := p.Update(cfgs[0]); !errors.Is(err, ErrClosed) {
				t.Errorf("Update after Close: %v, want ErrClosed", err)
			}
			time.Sleep(500 * time.Millisecond) // five looks' worth, the flood going on
			if got := calls.Load(); got != after {
				t.Errorf("%d calls of the event function after Close returned", got-after)
			}
			if !tc.close && updated.Load() == 0 {
				t.Error("no Update from the event function succeeded")
			}
			t.Logf("%d calls of the event function, %d of its Updates succeeded", calls.Load(), updated.Load())
		})
	}
}

// TestProtectWatchErrorInStatus: when the filter's limited groups cannot be read,
// Status says why, instead of the events stopping without a word.
func TestProtectWatchErrorInStatus(t *testing.T) {
	p, _ := watchedProtection(t)
	_, fn := groupEvents()
	if _, err := p.Update(protectWatchConfig(fn, 0)); err != nil {
		t.Fatal(err)
	}
	// Break the map the looks read: every later look fails with EBADF.
	f := p.Filter()
	f.mu.Lock()
	err := f.objs.Limited.Close()
	f.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for p.Status().Events == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	s := p.Status()
	if s.Events == nil || !strings.Contains(s.String(), "kernel limiting events unreadable: "+s.Events.Error()) {
		t.Fatalf("Status %q, Events %v: want the looks' error", s, s.Events)
	}
	// Events off: nothing is looked at, so nothing is wrong.
	if _, err := p.Update(protectWatchConfig(nil, 0)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Second)
	for p.Status().Events != nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Status().Events; err != nil {
		t.Errorf("Status().Events with events off: %v", err)
	}
}
