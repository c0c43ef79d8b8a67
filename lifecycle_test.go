//go:build linux

package rrl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// The lifecycle of what protects a server: an event function may call anything on
// what reported the event, Close included, whichever goroutine it runs on (a query's,
// a timer's, the kernel watch's, a capacity controller's); Update and Close are safe
// in any interleaving; and nothing they started runs once Close has returned.

// eventRig is a source of limiting events made for a test: what its event function
// calls back, and what makes the events happen.
type eventRig struct {
	read, update, close func() error // Stats and the like, an Update, Close
	drive               func(stop <-chan struct{})
	// ended, when set, is called once the event function's Close returned: it
	// checks that what ran the source (a goroutine of the test's) has ended.
	ended func(t *testing.T)
}

// eventSource makes an eventRig whose Config has event function fn.
type eventSource struct {
	name    string
	bpf     bool
	account AccountKind // the events whose first one calls back
	start   func(t *testing.T, fn func(LimitEvent)) eventRig
}

// lifecycleConfig returns a Config with the given settings and event function fn.
func lifecycleConfig(t testing.TB, fn func(LimitEvent), kv ...string) *Config {
	t.Helper()
	cfg := NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	cfg.SetEventFunc(fn)
	return cfg
}

// queryLoop sends queries from many sources of 192.0.2.0/24 through h's ServeDNS
// until stop is closed, as fast as it can, pausing every 64 of them.
func queryLoop(h dns.Handler, pause time.Duration) func(stop <-chan struct{}) {
	return func(stop <-chan struct{}) {
		q := new(dns.Msg)
		q.SetQuestion("www.example.test.", dns.TypeA)
		for i := 0; ; i++ {
			if i%64 == 63 {
				select {
				case <-stop:
					return
				case <-time.After(pause):
				}
			}
			w := &testutil.ResponseWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, byte(1+i%4)), Port: 5300}}
			q.Id = uint16(i)
			h.ServeDNS(w, q)
		}
	}
}

// rawFlood sends spoofed queries from four addresses of 127.0.70.0/24 to dst at
// about perSec until stop is closed.
func rawFlood(t *testing.T, dst netip.AddrPort, perSec int) func(stop <-chan struct{}) {
	raw := newRawSender(t, dst)
	return func(stop <-chan struct{}) {
		start, sent := time.Now(), 0
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for due := int(float64(perSec)*time.Since(start).Seconds()) - sent; due > 0; due-- {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 70, byte(1 + sent%4)}), 40000)
				raw.Send(ipv4Packet(src, dst, nil, dnsQuery(uint16(sent), false)))
				sent++
			}
		}
	}
}

// loopbackUDP is a new UDP socket on 127.0.0.1, closed when t ends.
func loopbackUDP(t *testing.T) *net.UDPConn {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// protectionRig is the eventRig of a Protection made by mk with Config cfg.
func protectionRig(t *testing.T, cfg *Config, mk func(*Config) (*Protection, error)) (*Protection, eventRig) {
	t.Helper()
	p, err := mk(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, eventRig{
		read: func() error {
			_ = p.Status()
			_ = p.RRL().GetStats(false)
			if l := p.Limiter(); l != nil {
				_ = l.Stats()
			}
			if f := p.Filter(); f != nil {
				if _, err := f.Stats(); err != nil {
					return fmt.Errorf("Filter.Stats: %w", err)
				}
			}
			return nil
		},
		update: func() error { _, err := p.Update(cfg); return err },
		close:  p.Close,
	}
}

// filterRig is the eventRig of Filter f, updated to cfg.
func filterRig(f *Filter, cfg *Config) eventRig {
	return eventRig{
		read: func() error {
			if _, err := f.Stats(); err != nil {
				return fmt.Errorf("Filter.Stats: %w", err)
			}
			_ = f.Config()
			return nil
		},
		update: func() error { return f.Update(cfg) },
		close:  f.Close,
	}
}

// endsWithin checks that ch delivers within d, and returns what it delivers.
func endsWithin(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
	return nil
}

var eventSources = []eventSource{
	{
		name: "RRL responses", account: AccountResponses,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			cfg := lifecycleConfig(t, fn, "responses-per-second", "5")
			p, rig := protectionRig(t, cfg, func(c *Config) (*Protection, error) {
				return NewProtection(answerA, c, WithoutFilter(), WithoutCookies())
			})
			// A second's burst, then silence: the start (and the stop) come from
			// the RRL's timer as well as from queries.
			rig.drive = queryLoop(p.Handler(), 20*time.Millisecond)
			return rig
		},
	},
	{
		name: "Go Limiter groups", account: AccountGroup,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			cfg := lifecycleConfig(t, fn, "requests-per-second", "20")
			p, rig := protectionRig(t, cfg, func(c *Config) (*Protection, error) {
				return NewProtection(answerA, c, WithoutFilter(), WithoutCookies())
			})
			rig.drive = queryLoop(p.Handler(), 5*time.Millisecond)
			return rig
		},
	},
	{
		name: "Go Limiter capacity", account: AccountCapacity,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			cfg := lifecycleConfig(t, fn, "capacity", "200")
			p, rig := protectionRig(t, cfg, func(c *Config) (*Protection, error) {
				return NewProtection(answerA, c, WithoutFilter(), WithoutCookies())
			})
			rig.drive = queryLoop(p.Handler(), time.Millisecond)
			return rig
		},
	},
	{
		name: "kernel groups", account: AccountGroup, bpf: true,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			conn := loopbackUDP(t)
			cfg := lifecycleConfig(t, fn, "requests-per-second", "20")
			p, rig := protectionRig(t, cfg, func(c *Config) (*Protection, error) {
				return Protect(conn, answerA, c, WithoutCookies())
			})
			if p.Status().Filter != ModeEBPF {
				t.Fatalf("status %v, want the eBPF filter", p.Status())
			}
			p.watch.mu.Lock()
			p.watch.interval = 100 * time.Millisecond // its goroutine reads it at its start, a tick away
			p.watch.mu.Unlock()
			rig.drive = rawFlood(t, localOf(conn), 2000)
			return rig
		},
	},
	{
		name: "kernel capacity", account: AccountCapacity, bpf: true,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			conn := loopbackUDP(t)
			cfg := lifecycleConfig(t, fn, "capacity", "200")
			p, rig := protectionRig(t, cfg, func(c *Config) (*Protection, error) {
				return Protect(conn, answerA, c, WithoutCookies())
			})
			f := p.Filter()
			f.mu.Lock()
			running := f.capacity.run != nil
			f.mu.Unlock()
			if p.Status().Filter != ModeEBPF || !running {
				t.Fatalf("status %v, want the eBPF filter and its controller", p.Status())
			}
			rig.drive = rawFlood(t, localOf(conn), 2000)
			return rig
		},
	},
	{
		name: "Filter.WatchLimited", account: AccountGroup, bpf: true,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			conn := loopbackUDP(t)
			cfg := lifecycleConfig(t, nil, "requests-per-second", "20")
			f, err := Attach(conn, cfg)
			if err != nil {
				t.Fatal(err)
			}
			rig := filterRig(f, cfg)
			watched := make(chan error, 1)
			go func() { watched <- f.WatchLimited(context.Background(), 100*time.Millisecond, 0, fn) }()
			rig.drive = rawFlood(t, localOf(conn), 2000)
			rig.ended = func(t *testing.T) {
				if err := endsWithin(t, watched, 5*time.Second, "WatchLimited after Close"); !errors.Is(err, ErrClosed) {
					t.Errorf("WatchLimited returned %v, want ErrClosed", err)
				}
			}
			return rig
		},
	},
	{
		name: "pinned capacity (RunCapacity)", account: AccountCapacity, bpf: true,
		start: func(t *testing.T, fn func(LimitEvent)) eventRig {
			e := newPinEnv(t)
			dir := filepath.Join(e.mnt, "rrl")
			if err := LoadPinned(lifecycleConfig(t, nil, "capacity", "200"), dir, -1, -1); err != nil {
				t.Fatal(err)
			}
			conn := loopbackUDP(t)
			f, err := AttachPinned(conn, dir)
			if err != nil {
				t.Fatal(err)
			}
			cfg := lifecycleConfig(t, fn, "capacity", "200")
			if err := f.Update(cfg); err != nil { // the event function is this process's
				t.Fatal(err)
			}
			rig := filterRig(f, cfg)
			ran := make(chan error, 1)
			go func() { ran <- f.RunCapacity(context.Background(), conn) }()
			rig.drive = rawFlood(t, localOf(conn), 2000)
			rig.ended = func(t *testing.T) {
				if err := endsWithin(t, ran, 5*time.Second, "RunCapacity after Close"); err != nil {
					t.Errorf("RunCapacity: %v", err)
				}
			}
			return rig
		},
	},
}

// TestEventFunctionCallsBack: for every kind of limiting event, an event function
// that calls Stats, Update and Close of what reported it returns, on whatever
// goroutine it runs; later NewProtection and Close (which share a lock with every
// Protection's Close) return; and nothing is left running.
func TestEventFunctionCallsBack(t *testing.T) {
	for _, src := range eventSources {
		t.Run(src.name, func(t *testing.T) {
			if src.bpf {
				requireBPF(t)
			}
			base := runtime.NumGoroutine()
			var rig atomic.Pointer[eventRig]
			result := make(chan error, 1)
			var once sync.Once
			fn := func(e LimitEvent) {
				r := rig.Load()
				if r == nil || e.Account != src.account {
					return
				}
				once.Do(func() {
					var errs []error
					if err := r.read(); err != nil {
						errs = append(errs, fmt.Errorf("read: %w", err))
					}
					if err := r.update(); err != nil {
						errs = append(errs, fmt.Errorf("Update: %w", err))
					}
					if err := r.close(); err != nil {
						errs = append(errs, fmt.Errorf("Close: %w", err))
					}
					result <- errors.Join(errs...)
				})
			}
			r := src.start(t, fn)
			rig.Store(&r)
			stop := make(chan struct{})
			driven := make(chan error, 1)
			go func() { r.drive(stop); driven <- nil }()
			stopped := false
			defer func() {
				if !stopped {
					close(stop)
				}
			}()

			if err := endsWithin(t, result, 15*time.Second, "an event function that calls Close"); err != nil {
				t.Errorf("from the event function: %v", err)
			}
			close(stop)
			stopped = true
			endsWithin(t, driven, 5*time.Second, "the test's traffic")
			if r.ended != nil {
				r.ended(t)
			}
			if err := r.update(); !errors.Is(err, ErrClosed) {
				t.Errorf("Update after Close: %v, want ErrClosed", err)
			}
			later := make(chan error, 1)
			go func() {
				q, err := NewProtection(answerA, nil, WithoutFilter())
				if err == nil {
					err = q.Close()
				}
				later <- err
			}()
			if err := endsWithin(t, later, 5*time.Second, "NewProtection and Close after it"); err != nil {
				t.Error(err)
			}
			waitGoroutines(t, base, 5*time.Second)
		})
	}
}

// waitGoroutines waits up to d for the number of goroutines to fall to base, and
// fails t with their stacks if it does not.
func waitGoroutines(t *testing.T, base int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	n := runtime.NumGoroutine()
	for ; n > base && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if n > base {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines %v after Close, %d before:\n%s", n, d, base, b.String())
	}
}

// raceCase makes a Protection or Filter and returns the two calls to race: the
// first (an Update, or a first query) against the second (Close), and a check of
// what remains once both returned.
type raceCase struct {
	name  string
	bpf   bool
	pairs int
	make  func(t *testing.T) (first, second func() error, after func() error)
}

// TestUpdateCloseRace: hundreds of Updates (and first queries, and RunCapacity)
// racing Close under -race, each pair released at once: every call returns, an
// Update either succeeds or finds the Protection closed, and once all have returned
// no capacity controller (or any other goroutine) is left running.
func TestUpdateCloseRace(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	query := func(h dns.Handler) func() error {
		return func() error {
			h.ServeDNS(&testutil.ResponseWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5300}}, q.Copy())
			return nil
		}
	}
	capOn := func(t testing.TB, v string) *Config { return lifecycleConfig(t, nil, "capacity", v) }
	updated := func(err error) error {
		if err != nil && !errors.Is(err, ErrClosed) {
			return err
		}
		return nil
	}
	protUpdate := func(p *Protection, cfg *Config) func() error {
		return func() error { _, err := p.Update(cfg); return updated(err) }
	}
	closedProtection := func(p *Protection) func() error {
		return func() error {
			if _, err := p.Update(NewConfig()); !errors.Is(err, ErrClosed) {
				return fmt.Errorf("Update after Close: %v, want ErrClosed", err)
			}
			return nil
		}
	}
	// Each kernel pair loads the program (about 0.25 s under -race); on the code before
	// the closed flag most kernel pairs leaked a controller, so a few dozen find it.
	var pinDir string
	cases := []raceCase{
		{name: "Go limiter: Update and Close", pairs: 300, make: func(t *testing.T) (func() error, func() error, func() error) {
			p, err := NewProtection(answerA, capOn(t, "1000"), WithoutFilter())
			if err != nil {
				t.Fatal(err)
			}
			query(p.Handler())() // the Go limiter and its controller
			return protUpdate(p, capOn(t, "2000")), p.Close, closedProtection(p)
		}},
		{name: "Go limiter: first query and Close", pairs: 300, make: func(t *testing.T) (func() error, func() error, func() error) {
			p, err := NewProtection(answerA, capOn(t, "1000"), WithoutFilter())
			if err != nil {
				t.Fatal(err)
			}
			return query(p.Handler()), p.Close, closedProtection(p)
		}},
		{name: "Go limiter: Update turning capacity on, and Close", pairs: 300, make: func(t *testing.T) (func() error, func() error, func() error) {
			p, err := NewProtection(answerA, NewConfig(), WithoutFilter())
			if err != nil {
				t.Fatal(err)
			}
			query(p.Handler())() // the Go limiter, no controller
			return protUpdate(p, capOn(t, "auto")), p.Close, closedProtection(p)
		}},
		{name: "kernel filter: Protection Update and Close", bpf: true, pairs: 40, make: func(t *testing.T) (func() error, func() error, func() error) {
			p, err := Protect(loopbackUDP(t), answerA, capOn(t, "1000"))
			if err != nil || p.Status().Filter != ModeEBPF {
				t.Fatalf("Protect: %v, %v", err, p.Status())
			}
			return protUpdate(p, capOn(t, "2000")), p.Close, closedProtection(p)
		}},
		{name: "kernel filter: Filter Update and Close", bpf: true, pairs: 30, make: func(t *testing.T) (func() error, func() error, func() error) {
			f, err := Attach(loopbackUDP(t), NewConfig())
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Update(capOn(t, "1000")); err != nil {
				t.Fatal(err)
			}
			return func() error { return updated(f.Update(capOn(t, "auto"))) }, f.Close, func() error {
				if f.Mode() != ModeNone {
					return fmt.Errorf("mode %v after Close", f.Mode())
				}
				return nil
			}
		}},
		{name: "pinned filter: RunCapacity and Close", bpf: true, pairs: 30, make: func(t *testing.T) (func() error, func() error, func() error) {
			if pinDir == "" {
				e := newPinEnv(t)
				pinDir = filepath.Join(e.mnt, "rrl")
				if err := LoadPinned(capOn(t, "1000"), pinDir, -1, -1); err != nil {
					t.Fatal(err)
				}
			}
			f, err := OpenPinned(pinDir)
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			run := func() error {
				go func() { ran <- f.RunCapacity(context.Background()) }()
				return nil
			}
			return run, f.Close, func() error {
				// RunCapacity either started and saw Close, or found the Filter
				// closed; either way it returns.
				select {
				case err := <-ran:
					if err != nil && !errors.Is(err, ErrClosed) {
						return fmt.Errorf("RunCapacity: %w", err)
					}
					return nil
				case <-time.After(5 * time.Second):
					return errors.New("RunCapacity did not return within 5s of Close")
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.bpf {
				requireBPF(t)
			}
			base := runtime.NumGoroutine()
			for i := range c.pairs {
				first, second, after := c.make(t)
				start := make(chan struct{})
				errs := make(chan error, 2)
				for _, call := range []func() error{first, second} {
					go func() {
						<-start
						errs <- call()
					}()
				}
				close(start)
				for range 2 {
					if err := endsWithin(t, errs, 5*time.Second, fmt.Sprintf("pair %d", i)); err != nil {
						t.Fatalf("pair %d: %v", i, err)
					}
				}
				if err := after(); err != nil {
					t.Fatalf("pair %d: %v", i, err)
				}
			}
			waitGoroutines(t, base, 10*time.Second)
		})
	}
}
