package rrl

import (
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// namesLimiter returns a Limiter with the capacity mode on and the names judge as
// names says ("on", "off"), seeded 1, that has learnt victim.test. (www and mail
// exist), other.test. (www exists) and the wildcard *.wild.victim.test. from
// answers at now.
func namesLimiter(t testing.TB, names string, now int64, more ...string) *Limiter {
	t.Helper()
	cfg := NewConfig()
	args := append([]string{"capacity", "auto", "names", names}, more...)
	for i := 0; i+1 < len(args); i += 2 {
		if err := cfg.SetValue(args[i], args[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	l, err := newLimiterSeed(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	z := newTestZone("www.victim.test.", "mail.victim.test.", "www.other.test.")
	for _, n := range []string{"www.victim.test.", "mail.victim.test.", "www.other.test.", "nx.victim.test.", "nx.other.test.", "a.wild.victim.test."} {
		m, wild := z.answer(n, dns.TypeA)
		l.observeAt(m, wild, now)
	}
	return l
}

func queryBytes(t testing.TB, name string) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// judgeRaw judges the query b from src at now as a Protection's reader does.
func judgeRaw(l *Limiter, src netip.AddrPort, b []byte, now int64, rnd uint32) limiterVerdict {
	var q qname
	qp := &q
	if !l.readName(b, &q) {
		qp = nil
	}
	return l.decideQueryAt(src, qp, false, now, rnd)
}

// TestLimiterNamesJudge floods a Limiter with random names under victim.test. from
// 200 resolvers while they and others ask existing names: with a names level in
// force, every query for an existing name passes, the random names pass at about the
// level, and the resolvers' source sketches count only the random names that passed.
// With the level lifted, or names off, everything passes.
func TestLimiterNamesJudge(t *testing.T) {
	const (
		level   = 200.0 // random names per second admitted for victim.test.
		seconds = 3
		random  = 6000 // random names per second in all
		real    = 600  // existing names per second in all
	)
	for _, tc := range []struct {
		name    string
		names   string
		level   float64
		limited bool
		wild    bool
	}{
		{"level", "on", level, true, false},
		{"level, wildcard", "on", level, true, true},
		{"no level", "on", 0, false, false},
		{"names off", "off", level, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := coarseNanos()
			l := namesLimiter(t, tc.names, t0)
			l.setNamesLevel(tc.level)
			r := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			step := int64(1e9) / (random + real)
			var unknownPassed, unknownLate, known, knownPassed int
			for i := range seconds * (random + real) {
				now := t0 + int64(i)*step
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(i % 200), 0, 1}), 40000)
				var name string
				isKnown := i%((random+real)/real) == 0
				switch {
				case isKnown:
					name = []string{"www.victim.test.", "mail.victim.test.", "www.other.test."}[i%3]
				case tc.wild:
					name = randomLabel(r) + ".wild.victim.test."
				default:
					name = randomLabel(r) + ".victim.test."
				}
				v := judgeRaw(l, src, queryBytes(t, name), now, r.Uint32())
				switch {
				case isKnown:
					known++
					if v.Allowed {
						knownPassed++
					}
				case v.Allowed:
					unknownPassed++
					if now-t0 >= 1e9 {
						unknownLate++
					}
				}
			}
			if knownPassed != known {
				t.Errorf("%d of %d queries for existing names passed", knownPassed, known)
			}
			c := l.counts()
			if !tc.limited {
				if unknownPassed != seconds*random {
					t.Errorf("%d of %d random names passed with nothing limited", unknownPassed, seconds*random)
				}
				if c.namesLimited != 0 {
					t.Errorf("namesLimited %d", c.namesLimited)
				}
				if tc.names == "off" && c.namesKnown+c.namesUnknown != 0 {
					t.Errorf("names off, yet %d known and %d unknown counted", c.namesKnown, c.namesUnknown)
				}
				return
			}
			// After the sketch's estimate has risen (a second), about level a second.
			got := float64(unknownLate) / (seconds - 1)
			if got < 0.8*level || got > 1.2*level {
				t.Errorf("random names passed at %.0f/s from 1 s on, want about %v", got, level)
			}
			if c.namesKnown != uint64(known) || c.namesUnknown != uint64(seconds*random) {
				t.Errorf("counted %d known and %d unknown, want %d and %d", c.namesKnown, c.namesUnknown, known, seconds*random)
			}
			if c.namesLimited+c.unknownPassed != c.namesUnknown || c.unknownPassed != uint64(unknownPassed) {
				t.Errorf("limited %d + passed %d, unknown %d (passed seen %d)", c.namesLimited, c.unknownPassed, c.namesUnknown, unknownPassed)
			}
			st := l.Stats()
			if st.Seen != uint64(seconds*(random+real)) || st.Passed != uint64(knownPassed+unknownPassed) {
				t.Errorf("Stats Seen %d Passed %d, want %d and %d", st.Seen, st.Passed, seconds*(random+real), knownPassed+unknownPassed)
			}
			// The resolvers' /32 node counted only what passed: one resolver
			// sent (random+real)/200 a second, and passed far less.
			src := netip.AddrFrom4([4]byte{127, 5, 0, 1})
			h := mix64(l.mix0 ^ uint64(0x7f050001))
			rate := l.sketch[nodeIPv4First].rate(h, uint64(t0+seconds*1e9)).Float64()
			want := (level + real) / 200
			t.Logf("random names passed at %.0f/s; source %v counted at %.1f/s", got, src, rate)
			if rate > 2*want {
				t.Errorf("source %v counted at %.1f/s, want about %.1f (what passed), not %v (what it sent)", src, rate, want, (random+real)/200)
			}
		})
	}
}

// TestLimiterNamesReportOnly: in report-only mode a query the names judge would
// refuse passes, counted as limited and as report-only.
func TestLimiterNamesReportOnly(t *testing.T) {
	t0 := coarseNanos()
	l := namesLimiter(t, "on", t0, "report-only", "true")
	l.setNamesLevel(1)
	r := rand.New(rand.NewPCG(1, 2))
	src := netip.MustParseAddrPort("127.0.0.1:5300")
	refused := 0
	for i := range 2000 {
		v := judgeRaw(l, src, queryBytes(t, randomLabel(r)+".victim.test."), t0+int64(i)*1e6, r.Uint32())
		if !v.Allowed {
			t.Fatal("report-only refused a query")
		}
		if v.Limited == NodeNames {
			refused++
		}
	}
	c := l.counts()
	if refused == 0 || c.namesLimited != uint64(refused) || c.report != uint64(refused) || c.unknownPassed != 2000 {
		t.Errorf("would refuse %d; namesLimited %d, report %d, unknownPassed %d", refused, c.namesLimited, c.report, c.unknownPassed)
	}
}

// TestLimiterNamesProven: a query with a valid server cookie is judged by name too
// (docs/names.md, "When the names judge runs").
func TestLimiterNamesProven(t *testing.T) {
	t0 := coarseNanos()
	l := namesLimiter(t, "on", t0)
	l.setNamesLevel(1)
	r := rand.New(rand.NewPCG(3, 4))
	src := netip.MustParseAddrPort("127.0.0.1:5300")
	passed := 0
	for i := range 2000 {
		b := queryBytes(t, randomLabel(r)+".victim.test.")
		var q qname
		if !l.readName(b, &q) {
			t.Fatal("name not read")
		}
		if l.decideQueryAt(src, &q, true, t0+int64(i)*1e6, r.Uint32()).Allowed {
			passed++
		}
	}
	if passed > 200 {
		t.Errorf("%d of 2000 proven random names passed a level of 1/s over 2 s", passed)
	}
}

// TestLimiterNamesAllocs: judging a query by name allocates nothing, from the
// datagram (a Protection's reader) or from the unpacked question (the Handler).
func TestLimiterNamesAllocs(t *testing.T) {
	t0 := coarseNanos()
	l := namesLimiter(t, "on", t0)
	l.setNamesLevel(10)
	src := netip.MustParseAddrPort("127.0.0.1:5300")
	b := queryBytes(t, "x7f3k.victim.test.")
	req := new(dns.Msg)
	req.SetQuestion("x7f3k.victim.test.", dns.TypeA)
	// First no zone counted, then victim.test.'s names and networks counted
	// (names_count.go), as while it is limited.
	for _, counted := range []bool{false, true} {
		if counted && !l.names.Load().counters.watch(nameKeyOf(t, l.names.Load().seed, "victim.test.")) {
			t.Fatal("victim.test. not watched")
		}
		for name, f := range map[string]func(){
			"raw": func() { allowQuery(l, src, false, nil, b) },
			"msg": func() { allowQuery(l, src, false, req, nil) },
		} {
			if n := testing.AllocsPerRun(1000, f); n != 0 {
				t.Errorf("%s (zone counted %v): %v allocations per query", name, counted, n)
			}
		}
	}
	if n, _, _ := l.names.Load().counters.figures(nameKeyOf(t, l.names.Load().seed, "victim.test.")); math.Round(n) != 1 {
		t.Errorf("victim.test. counted %v names, want the 1 asked", n)
	}
}

// TestLimiterNamesUpdate: an Update keeps the names level in force and what was
// learnt, and configured zones classify from the start.
func TestLimiterNamesUpdate(t *testing.T) {
	t0 := coarseNanos()
	l := namesLimiter(t, "on", t0)
	l.setNamesLevel(5)
	cfg := NewConfig()
	for _, kv := range [][2]string{{"capacity", "auto"}, {"zones", "conf.test."}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Update(cfg); err != nil {
		t.Fatal(err)
	}
	p := l.params.Load()
	if p.names.level != 5 || p.names.limit != fixedFromFloat(5) {
		t.Errorf("after Update level %v limit %v", p.names.level, p.names.limit)
	}
	var q qname
	if !l.readName(queryBytes(t, "a.b.conf.test."), &q) {
		t.Fatal("name not read")
	}
	ln := l.names.Load()
	c := ln.learner.Load().classify(&q, uint64(t0))
	if want := nameKeyOf(t, ln.seed, "conf.test."); c.zone != want {
		t.Errorf("zone of a.b.conf.test. is %x, want conf.test.'s %x", c.zone, want)
	}
	cfg.SetValue("names", "off")
	if err := l.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if l.readName(queryBytes(t, "www.victim.test."), &q) {
		t.Error("names off, yet a name was read")
	}
}

// zoneHandler answers from a testZone, reporting wildcard answers as a server does.
type zoneHandler struct{ z *testZone }

func (h zoneHandler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m, wild := h.z.answer(req.Question[0].Name, req.Question[0].Qtype)
	m.Id = req.Id
	if wild != "" {
		SetWildcardOrigin(w, wild)
	}
	w.WriteMsg(m)
}

// TestHandlerTeachesNames: the Handler teaches its limiter's learner from every
// response its inner handler computes, those response rate limiting withholds or
// slips included, with the wildcard origin reported.
func TestHandlerTeachesNames(t *testing.T) {
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		t.Fatal(err)
	}
	lim, err := newLimiterSeed(cfg, 9)
	if err != nil {
		t.Fatal(err)
	}
	z := newTestZone("www.victim.test.", "mail.victim.test.")
	h := NewHandler(zoneHandler{z}, NewRRL(fixedConfig(t, "responses-per-second", "1", "all-per-second", "1", "slip-ratio", "2")), withLimiter(lim))
	w := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5300}}
	// Many queries for each name: after the first, RRL withholds or slips them.
	for range 5 {
		for _, n := range []string{"nx.victim.test.", "a.wild.victim.test.", "www.victim.test."} {
			h.ServeDNS(w, query(n, dns.TypeA, false))
		}
	}
	// mail.victim.test. is asked after the network's all-per-second account is
	// spent: withheld or slipped, never sent, and still learnt.
	before := h.Stats().Responses[Send]
	h.ServeDNS(w, query("mail.victim.test.", dns.TypeA, false))
	h.ServeDNS(w, query("mail.victim.test.", dns.TypeA, false))
	if h.Stats().Responses[Send] != before {
		t.Fatal("mail.victim.test. was sent: the test needs it withheld")
	}
	ln := lim.names.Load()
	lr := ln.learner.Load()
	now := uint64(coarseNanos())
	for _, tc := range []struct {
		name, zone, unit string
		known            bool
	}{
		{"www.victim.test.", "victim.test.", "www.victim.test.", true},
		{"mail.victim.test.", "victim.test.", "mail.victim.test.", true},
		{"nx.victim.test.", "victim.test.", "victim.test.", false},
		{"zz.wild.victim.test.", "victim.test.", "wild.victim.test.", false},
	} {
		var q qname
		if !qnameOf(tc.name, ln.seed, &q) {
			t.Fatal(tc.name)
		}
		c := lr.classify(&q, now)
		if c.known != tc.known || c.zone != nameKeyOf(t, ln.seed, tc.zone) || c.unit != nameKeyOf(t, ln.seed, tc.unit) {
			t.Errorf("%s: known %v, zone %x unit %x; want %v, %s, %s", tc.name, c.known, c.zone, c.unit, tc.known, tc.zone, tc.unit)
		}
	}
}

// BenchmarkLimiterNames is the Go limiter's cost per query read from the socket,
// with the names judge off and on (a known name; a random one under a level).
func BenchmarkLimiterNames(b *testing.B) {
	src := netip.MustParseAddrPort("127.0.0.1:5300")
	for _, bc := range []struct {
		name, names, qname string
		counted            bool // victim.test.'s names and networks counted (names_count.go)
	}{
		{"names off", "off", "www.victim.test.", false},
		{"known name", "on", "www.victim.test.", false},
		{"random name", "on", "x7f3k.victim.test.", false},
		{"random name counted", "on", "x7f3k.victim.test.", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := namesLimiter(b, bc.names, coarseNanos())
			l.setNamesLevel(1000)
			if bc.counted {
				l.names.Load().counters.watch(nameKeyOf(b, l.names.Load().seed, "victim.test."))
			}
			q := queryBytes(b, bc.qname)
			b.ReportAllocs()
			for b.Loop() {
				allowQuery(l, src, false, nil, q)
			}
		})
	}
}
