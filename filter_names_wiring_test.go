//go:build linux

package rrl

import (
	"fmt"
	"math"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The kernel names judge wired (docs/names.md): a Protection with the eBPF filter
// in force teaches the filter's tables from the Handler's responses, the program
// classifies the next queries by them, and FilterStats.Names reports its counters;
// a pinned filter's tables are the pins', taught by every Filter on them.

// askNames sends each query to addr over UDP and waits for its answer.
func askNames(t *testing.T, addr string, names ...string) {
	t.Helper()
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	for _, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n, dns.TypeA)
		if _, _, err := c.Exchange(m, addr); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
}

// TestProtectTeachesKernelNames: with capacity on (names on by default) and a
// configured zone, the program counts a name unknown until the server answered it
// as existing and known after, in the configured zone and in a zone learnt from an
// answer's SOA; no level is in force without an overload. With names off the
// program counts none.
func TestProtectTeachesKernelNames(t *testing.T) {
	requireBPF(t)
	for _, names := range []string{"on", "off"} {
		t.Run("names "+names, func(t *testing.T) {
			cfg := NewConfig()
			for _, kv := range [][2]string{{"capacity", "auto"}, {"zones", "other.test."}, {"names", names}} {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer udp.Close()
			p, err := Protect(udp, namesZoneHandler(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if st := p.Status(); st.Filter != ModeEBPF || !st.RequestsInKernel {
				t.Fatalf("status %v: the test needs the eBPF filter", st)
			}
			srv := p.UDPServer()
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			go srv.ActivateAndServe()
			defer srv.Shutdown()
			<-started
			// nx teaches the zone victim.test. (its NXDOMAIN's SOA); www is
			// unknown until answered; other.test. is configured.
			askNames(t, udp.LocalAddr().String(), "nx.victim.test.", "www.victim.test.", "www.victim.test.", "WWW.victim.test.", "www.other.test.", "www.other.test.", "x1.victim.test.")
			st, err := p.Filter().Stats()
			if err != nil {
				t.Fatal(err)
			}
			if names == "off" {
				if st.Names != nil {
					t.Fatalf("names off: %+v", *st.Names)
				}
				return
			}
			want := NameStats{Known: 3, Unknown: 4, UnknownPassed: 4}
			if st.Names == nil || *st.Names != want {
				t.Fatalf("names counters %+v, want %+v", st.Names, want)
			}
			f := p.Filter()
			f.names.mu.RLock()
			lr := f.names.learner
			f.names.mu.RUnlock()
			for _, c := range []struct{ name, zone string }{{"r.victim.test.", "victim.test."}, {"r.other.test.", "other.test."}} {
				var q qname
				if !qnameOf(c.name, lr.seed, &q) {
					t.Fatal(c.name)
				}
				if got := lr.classify(&q, uint64(monotonicNow())); got.zone != nameKeyOf(t, lr.seed, c.zone) {
					t.Errorf("%s: zone %x, want %s", c.name, got.zone, c.zone)
				}
			}
		})
	}
}

// TestPinnedNamesShared: two Filters on one pin directory (as two server processes
// are: each maps the pinned tables itself) teach one table: a name one of them
// learnt is known to the program on the other's socket, and to the other's learner.
func TestPinnedNamesShared(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		t.Fatal(err)
	}
	if err := LoadPinned(cfg, dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	srv, f1 := attachPinnedServer(t, dir)
	f2, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	z := newTestZone("www.victim.test.", "mail.victim.test.")
	for _, c := range []struct {
		f    *Filter
		name string
	}{{f2, "www.victim.test."}, {f1, "mail.victim.test."}} {
		m, wild := z.answer(c.name, dns.TypeA)
		c.f.observe(m, wild)
	}
	// The program on f1's socket knows what f2 learnt.
	client := newUDPServer(t, "udp4", "127.0.0.1:0")
	before, err := f1.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"www.victim.test.", "zz.victim.test."} {
		if _, err := client.conn.WriteToUDPAddrPort(queryBytes(t, n), srv.addr); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	var after FilterStats
	for {
		if after, err = f1.Stats(); err != nil {
			t.Fatal(err)
		}
		if after.Seen-before.Seen >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after.Names == nil || after.Names.Known-before.Names.Known != 1 || after.Names.Unknown-before.Names.Unknown != 1 {
		t.Fatalf("names counters %+v -> %+v, want one known and one unknown", before.Names, after.Names)
	}
	// And f2's learner knows what f1 learnt.
	f2.names.mu.RLock()
	lr := f2.names.learner
	f2.names.mu.RUnlock()
	var q qname
	if !qnameOf("mail.victim.test.", lr.seed, &q) || !lr.classify(&q, uint64(monotonicNow())).known {
		t.Fatal("mail.victim.test., learnt through one Filter, is not known to the other's learner")
	}
}

// TestKernelNamesSource: the kernel filter's capacity source reads what the program
// counted (the names counters, the zone sketch's cells, a named zone's rate) and
// writes the names level into the settings the program runs, as the Go Limiter's
// params have it, and lifts it.
func TestKernelNamesSource(t *testing.T) {
	f, k, srv := kernelNamesSource(t)
	var _ namesSource = k
	if !k.namesOn() {
		t.Fatal("names off with capacity on")
	}
	z := newTestZone("www.victim.test.")
	m, wild := z.answer("nx.victim.test.", dns.TypeA) // teaches the zone and names it
	f.observe(m, wild)
	client := newUDPServer(t, "udp4", "127.0.0.1:0")
	const n = 50
	for i := range n {
		if _, err := client.conn.WriteToUDPAddrPort(queryBytes(t, fmt.Sprintf("r%d.victim.test.", i)), srv.addr); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := k.sample(monotonicNow()); err != nil {
			t.Fatal(err)
		}
		if k.namesSample().unknown >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := k.namesSample(); c.unknown != n || c.known != 0 || c.unknownPassed != n {
		t.Fatalf("names counters %+v, want %d unknown passed", c, n)
	}
	var total [sketchDepth]float64
	for row := range sketchDepth {
		for col := range sketchWidth {
			count, _ := k.zoneCell(row, col)
			total[row] += count.Float64()
		}
	}
	// One zone: each row holds its arrivals in one cell, a little decayed.
	for row, v := range total {
		if v < n*0.9 || v > n {
			t.Errorf("zone sketch row %d holds %.2f, want about %d", row, v, n)
		}
	}
	rates := k.zoneRates(monotonicNow(), 1, nil)
	if len(rates) != 1 || rates[0].name != "victim.test." {
		t.Errorf("zone rates %+v, want victim.test.", rates)
	}
	for _, level := range []float64{300, 0} {
		if err := k.applyNames(level); err != nil {
			t.Fatal(err)
		}
		set, _, err := f.objs.settingsMaps().active(nil)
		if err != nil {
			t.Fatal(err)
		}
		p := latticeOf(f.cfg)
		p.applyNamesLevel(level)
		if set.NamesOn != 1 || set.NamesLimit != uint64(p.names.limit) || set.NamesTrip != uint64(p.names.trip) {
			t.Errorf("level %g: settings names (on %d, limit %d, trip %d), Go params %+v", level, set.NamesOn, set.NamesLimit, set.NamesTrip, p.names)
		}
		st, err := f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.Names == nil || math.Abs(st.Names.Level-level) > 1e-6 {
			t.Errorf("level %g: FilterStats.Names %+v", level, st.Names)
		}
	}
}

// TestFilterNamesOffLearnsNothing: a Filter whose Config turns names off keeps its
// tables but learns nothing more from responses; turned on again it learns.
func TestFilterNamesOffLearnsNothing(t *testing.T) {
	requireBPF(t)
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		t.Fatal(err)
	}
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := newTestZone("www.victim.test.", "mail.victim.test.")
	known := func(name string) bool {
		f.names.mu.RLock()
		defer f.names.mu.RUnlock()
		lr := f.names.learner
		var q qname
		if !qnameOf(name, lr.seed, &q) {
			t.Fatal(name)
		}
		return lr.classify(&q, uint64(monotonicNow())).known
	}
	for _, c := range []struct {
		names, name string
		learnt      bool
	}{{"off", "www.victim.test.", false}, {"on", "mail.victim.test.", true}} {
		if err := cfg.SetValue("names", c.names); err != nil {
			t.Fatal(err)
		}
		if err := f.Update(cfg); err != nil {
			t.Fatal(err)
		}
		m, wild := z.answer(c.name, dns.TypeA)
		f.observe(m, wild)
		if got := known(c.name); got != c.learnt {
			t.Errorf("names %s: %s known %v, want %v", c.names, c.name, got, c.learnt)
		}
	}
}

// TestKernelNamesSweepInTick checks that the kernel capacity source sweeps the
// filter's names tables from the controller's tick (namesTicker), once the names
// learnt are dead, as the Go Limiter's source does its own: the answer path no
// longer sweeps, so without it the kernel's tables would fill with dead entries.
func TestKernelNamesSweepInTick(t *testing.T) {
	f, k, _ := kernelNamesSource(t)
	var _ namesTicker = k
	f.names.mu.RLock()
	lr := f.names.learner
	f.names.mu.RUnlock()
	if lr == nil {
		t.Fatal("no learner on the kernel tables with capacity on")
	}
	used := func() int { return slotsInUse(lr.names) }
	t0 := monotonicNow()
	z := newTestZone()
	for i := range 100 {
		n := fmt.Sprintf("old%d.victim.test.", i)
		z.exists[n] = true
		m, w := z.answer(n, dns.TypeA)
		lr.observe(m, w, uint64(t0))
	}
	before := used()
	if before < 100 {
		t.Fatalf("%d slots of the kernel table used after learning 100 names", before)
	}
	later := t0 + (nameGenLive+1)*genNanos
	if n := lr.names.occupied(uint64(later), 0); n != 0 {
		t.Fatalf("%d live names %d generations on, want 0", n, nameGenLive+1)
	}
	k.tickNames(later)
	if n := used(); n != 0 {
		t.Fatalf("%d slots used after the tick %d generations on, want 0 (%d before)", n, nameGenLive+1, before)
	}
}

// TestHandlerWithFilterTeachesKernelNames: a server that attaches a Filter itself
// and serves with NewHandler teaches the filter's tables when the Handler is given
// the Filter (WithFilter), as a Protection's Handler teaches its own: the program
// counts a name known once the server answered it as existing. Without the option
// nothing teaches them, and every name stays unknown.
func TestHandlerWithFilterTeachesKernelNames(t *testing.T) {
	requireBPF(t)
	for _, c := range []struct {
		name  string
		with  bool
		known uint64
	}{{"WithFilter", true, 3}, {"without", false, 0}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := NewConfig()
			for _, kv := range [][2]string{{"capacity", "auto"}, {"zones", "other.test."}} {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer udp.Close()
			f, err := Attach(udp, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Mode() != ModeEBPF {
				t.Fatalf("mode %v: the test needs the eBPF filter", f.Mode())
			}
			r, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var opts []Option
			if c.with {
				opts = append(opts, WithFilter(f))
			}
			serveHost(t, udp, NewHandler(namesZoneHandler(), r, opts...))
			askNames(t, udp.LocalAddr().String(), "nx.victim.test.", "www.victim.test.", "www.victim.test.", "WWW.victim.test.", "www.other.test.", "www.other.test.", "x1.victim.test.")
			st, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			want := NameStats{Known: c.known, Unknown: 7 - c.known, UnknownPassed: 7 - c.known}
			if st.Names == nil || *st.Names != want {
				t.Fatalf("names counters %+v, want %+v", st.Names, want)
			}
		})
	}
}

// kernelNamesSource attaches an eBPF filter with the capacity mode (names on by
// default) to a new loopback socket, closed at the test's end, and returns it with
// its capacity controller's source and the socket.
func kernelNamesSource(t *testing.T) (*Filter, *kernelCapacity, *udpServer) {
	t.Helper()
	requireBPF(t)
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		t.Fatal(err)
	}
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	f.mu.Lock()
	k := &kernelCapacity{f: f, run: f.capacity.run}
	f.mu.Unlock()
	return f, k, srv
}
