package rrl

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/miekg/dns"
)

// learnT0 is a time some generations after the clock's start.
const learnT0 = 100 << nameGenShift

const genNanos = 1 << nameGenShift

// testZone answers like an authoritative server for victim.test. (with a child
// zone child.victim.test. and the wildcard *.wild.victim.test.) and other.test.:
// exists holds the names with data.
type testZone struct {
	exists map[string]bool
}

func newTestZone(names ...string) *testZone {
	z := &testZone{exists: map[string]bool{}}
	for _, n := range names {
		z.exists[dns.Fqdn(n)] = true
	}
	return z
}

func soaOf(apex string) dns.RR {
	rr, err := dns.NewRR(apex + " 300 IN SOA ns." + apex + " h." + apex + " 1 2 3 4 5")
	if err != nil {
		panic(err)
	}
	return rr
}

func apexFor(name string) string {
	for _, a := range []string{"child.victim.test.", "victim.test.", "other.test."} {
		if dns.IsSubDomain(a, name) {
			return a
		}
	}
	return ""
}

// answer returns the response to a query for name and the wildcard origin the
// handler would report: data for existing names, a synthesised answer below
// wild.victim.test., NXDOMAIN otherwise, REFUSED outside the zones.
func (z *testZone) answer(name string, qtype uint16) (*dns.Msg, string) {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	m := new(dns.Msg)
	m.SetReply(q)
	apex := apexFor(name)
	switch {
	case apex == "":
		m.Rcode = dns.RcodeRefused
	case z.exists[name] && qtype == dns.TypeA:
		rr, _ := dns.NewRR(name + " 300 IN A 192.0.2.1")
		m.Answer = append(m.Answer, rr)
	case z.exists[name]:
		m.Ns = append(m.Ns, soaOf(apex)) // NODATA
	case dns.IsSubDomain("wild.victim.test.", name) && name != "wild.victim.test.":
		rr, _ := dns.NewRR(name + " 300 IN A 192.0.2.99")
		m.Answer = append(m.Answer, rr)
		return m, "wild.victim.test."
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, soaOf(apex))
	}
	return m, ""
}

// learnFrom feeds the learner the zone's response for each name.
func (z *testZone) learn(l *nameLearner, now uint64, names ...string) {
	for _, n := range names {
		m, w := z.answer(dns.Fqdn(n), dns.TypeA)
		l.observe(m, w, now)
	}
}

// classifyName reads name from a query packet, as the kernel will, and classifies it.
func classifyName(t testing.TB, l *nameLearner, name string, now uint64) (nameClass, *qname) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var qn qname
	if _, e := readQName(b, l.seed, &qn); e != nameOK {
		t.Fatalf("%s: %v", name, e)
	}
	return l.classify(&qn, now), &qn
}

func nameKeyOf(t testing.TB, seed uint64, name string) nameKey {
	t.Helper()
	var q qname
	if !qnameOf(name, seed, &q) {
		t.Fatalf("qnameOf(%s)", name)
	}
	return q.name()
}

func mustLearner(t testing.TB, apexes ...string) *nameLearner {
	t.Helper()
	l, ok := newNameLearner(testNameSeed, apexes)
	if !ok {
		t.Fatalf("newNameLearner(%q)", apexes)
	}
	return l
}

func TestNameLearnerClassifies(t *testing.T) {
	z := newTestZone("www.victim.test.", "mail.victim.test.", "text.victim.test.", "www.child.victim.test.", "www.other.test.")
	l := mustLearner(t)
	now := uint64(learnT0)
	// www answers A (data), text answers A with NODATA; nothing teaches a zone
	// but an SOA, so NXDOMAINs first.
	z.learn(l, now, "nope.victim.test.", "nope.child.victim.test.", "nope.other.test.")
	z.learn(l, now, "www.victim.test.", "www.child.victim.test.", "www.other.test.", "x1.wild.victim.test.", "a.b.wild.victim.test.", "elsewhere.test.")
	m, _ := z.answer("text.victim.test.", dns.TypeAAAA)
	l.observe(m, "", now)
	k := func(n string) nameKey { return nameKeyOf(t, l.seed, n) }
	for _, tc := range []struct {
		name        string
		zone, unit  string
		known       bool
		description string
	}{
		{"www.victim.test.", "victim.test.", "www.victim.test.", true, "answered with data"},
		{"WWW.VICTIM.TEST.", "victim.test.", "www.victim.test.", true, "case does not matter"},
		{"text.victim.test.", "victim.test.", "text.victim.test.", true, "NODATA"},
		{"mail.victim.test.", "victim.test.", "victim.test.", false, "exists but never answered yet"},
		{"x7f3k.victim.test.", "victim.test.", "victim.test.", false, "a random name: its parent is the unit"},
		{"a.x7f3k.victim.test.", "victim.test.", "x7f3k.victim.test.", false, "two random labels"},
		{"www.child.victim.test.", "child.victim.test.", "www.child.victim.test.", true, "the deepest zone"},
		{"zz.child.victim.test.", "child.victim.test.", "child.victim.test.", false, "random in the child"},
		{"x1.wild.victim.test.", "victim.test.", "wild.victim.test.", false, "synthesised: the wildcard's parent is the unit"},
		{"zz9.wild.victim.test.", "victim.test.", "wild.victim.test.", false, "any name under the wildcard"},
		{"p.q.r.wild.victim.test.", "victim.test.", "wild.victim.test.", false, "four labels under it"},
		{"www.other.test.", "other.test.", "www.other.test.", true, "another zone"},
		{"elsewhere.test.", ".", "test.", false, "refused: no zone"},
		{"www.unknown.example.", ".", "unknown.example.", false, "no zone"},
	} {
		c, _ := classifyName(t, l, tc.name, now)
		if c.zone != k(tc.zone) || c.known != tc.known || c.unit != k(tc.unit) {
			t.Errorf("%s (%s): zone %x known %v unit %x; want %s %v %s", tc.name, tc.description, c.zone, c.known, c.unit, tc.zone, tc.known, tc.unit)
		}
	}
	// Exactly these names were learnt, and three apexes.
	if n := l.names.occupied(now, 0); n != 5 {
		t.Errorf("%d names learnt, want 5 (3 with data, 1 NODATA, 1 wildcard parent)", n)
	}
	if n := l.apexes.occupied(now, apexPinned); n != 3 {
		t.Errorf("%d apexes learnt, want 3", n)
	}
	// A name the zone no longer has is forgotten at its first NXDOMAIN.
	delete(z.exists, "www.victim.test.")
	z.learn(l, now, "www.victim.test.")
	if c, _ := classifyName(t, l, "www.victim.test.", now); c.known {
		t.Error("www.victim.test. still known after an NXDOMAIN")
	}
	// A name once answered and now synthesised from a wildcard is no longer known.
	z.exists["old.wild.victim.test."] = true
	z.learn(l, now, "old.wild.victim.test.")
	delete(z.exists, "old.wild.victim.test.")
	if c, _ := classifyName(t, l, "old.wild.victim.test.", now); !c.known {
		t.Fatal("old.wild.victim.test. not learnt")
	}
	z.learn(l, now, "old.wild.victim.test.")
	if c, _ := classifyName(t, l, "old.wild.victim.test.", now); c.known || c.unit != k("wild.victim.test.") {
		t.Errorf("old.wild.victim.test. after a wildcard answer: %+v", c)
	}
}

// TestNameLearnerIgnores: what must teach nothing.
func TestNameLearnerIgnores(t *testing.T) {
	now := uint64(learnT0)
	soa := soaOf("victim.test.")
	ans, _ := dns.NewRR("www.victim.test. 300 IN A 192.0.2.1")
	ns, _ := dns.NewRR("sub.victim.test. 300 IN NS ns.sub.victim.test.")
	msg := func(name string, rcode int, answer, auth []dns.RR, edit func(*dns.Msg)) *dns.Msg {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		m := new(dns.Msg)
		m.SetReply(q)
		m.Rcode, m.Answer, m.Ns = rcode, answer, auth
		if edit != nil {
			edit(m)
		}
		return m
	}
	for _, tc := range []struct {
		what     string
		m        *dns.Msg
		wildcard string
		apexes   int
	}{
		{"a query, not a response", msg("www.victim.test.", 0, []dns.RR{ans}, nil, func(m *dns.Msg) { m.Response = false }), "", 0},
		{"a referral", msg("www.sub.victim.test.", 0, nil, []dns.RR{ns}, nil), "", 0},
		{"an empty NOERROR", msg("www.victim.test.", 0, nil, nil, nil), "", 0},
		{"SERVFAIL", msg("www.victim.test.", dns.RcodeServerFailure, []dns.RR{ans}, nil, nil), "", 0},
		{"REFUSED", msg("www.victim.test.", dns.RcodeRefused, nil, nil, nil), "", 0},
		{"NXDOMAIN (the apex only)", msg("www.victim.test.", dns.RcodeNameError, nil, []dns.RR{soa}, nil), "", 1},
		{"an NOTIFY", msg("www.victim.test.", 0, []dns.RR{ans}, nil, func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify }), "", 0},
		{"two questions", msg("www.victim.test.", 0, []dns.RR{ans}, nil, func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), "", 0},
		{"an SOA not above the name", msg("www.other.test.", dns.RcodeNameError, nil, []dns.RR{soa}, nil), "", 0},
		{"a wildcard not above the name", msg("www.victim.test.", 0, []dns.RR{ans}, nil, nil), "wild.victim.test.", 0},
		{"a wildcard at the name", msg("wild.victim.test.", 0, []dns.RR{ans}, nil, nil), "wild.victim.test.", 0},
		{"a wildcard without an answer", msg("x.wild.victim.test.", 0, nil, []dns.RR{soa}, nil), "wild.victim.test.", 1},
	} {
		l := mustLearner(t)
		l.observe(tc.m, tc.wildcard, now)
		if n := l.names.occupied(now, 0); n != 0 {
			t.Errorf("%s: %d names learnt", tc.what, n)
		}
		if n := l.apexes.occupied(now, apexPinned); n != tc.apexes {
			t.Errorf("%s: %d apexes learnt, want %d", tc.what, n, tc.apexes)
		}
	}
	for _, bad := range [][]string{{"."}, {"a..b."}} {
		if _, ok := newNameLearner(1, bad); ok {
			t.Errorf("apexes %q accepted", bad)
		}
	}
}

// randomLabel returns a random label of 5 to 12 letters and digits.
func randomLabel(r *rand.Rand) string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5+r.IntN(8))
	for i := range b {
		b[i] = chars[r.IntN(len(chars))]
	}
	return string(b)
}

// TestNameLearnerForgedFlood: a flood of queries for random names, classified as the
// kernel would, with no response or with the server's NXDOMAINs and wildcard
// answers, marks nothing as existing; the names known before stay known.
func TestNameLearnerForgedFlood(t *testing.T) {
	z := newTestZone("www.victim.test.")
	l := mustLearner(t, "other.test.")
	now := uint64(learnT0)
	z.learn(l, now, "www.victim.test.", "nope.victim.test.")
	r := rand.New(rand.NewPCG(1, 2))
	before := l.names.occupied(now, 0)
	for i := range 20000 {
		name := randomLabel(r) + ".victim.test."
		if i%2 == 1 {
			name = randomLabel(r) + ".wild.victim.test."
		}
		if c, _ := classifyName(t, l, name, now); c.known {
			t.Fatalf("%s known", name)
		}
	}
	if n := l.names.occupied(now, 0); n != before {
		t.Fatalf("queries alone changed the table: %d names, %d before", n, before)
	}
	// The server's answers to the flood: NXDOMAINs and synthesised answers.
	for i := range 20000 {
		name := randomLabel(r) + ".victim.test."
		if i%2 == 1 {
			name = randomLabel(r) + ".wild.victim.test."
		}
		z.learn(l, now+uint64(i), name)
		if c, _ := classifyName(t, l, name, now+uint64(i)); c.known {
			t.Fatalf("%s known after the server's answer", name)
		}
	}
	if n := l.names.occupied(now, 0); n != before+1 { // the wildcard parent
		t.Errorf("%d names after the answered flood, want %d", n, before+1)
	}
	if c, _ := classifyName(t, l, "www.victim.test.", now); !c.known {
		t.Error("www.victim.test. forgotten under the flood")
	}
}

// TestNameLearnerAges: names the server stops answering (a zone reload removed
// them, and nobody asks) are forgotten after nameGenLive generations; names it
// keeps answering are not; configured apexes never; learnt apexes like names.
func TestNameLearnerAges(t *testing.T) {
	z := newTestZone()
	var old, kept []string
	for i := range 200 {
		old = append(old, fmt.Sprintf("old%d.victim.test.", i))
		kept = append(kept, fmt.Sprintf("kept%d.other.test.", i))
	}
	for _, n := range append(append([]string{}, old...), kept...) {
		z.exists[n] = true
	}
	l := mustLearner(t, "victim.test.")
	t0 := uint64(learnT0) + genNanos/2
	z.learn(l, t0, "nope.other.test.", "nope.child.victim.test.")
	z.learn(l, t0, old...)
	z.learn(l, t0, kept...)
	// The reload: old names are gone, and never asked for again.
	for _, n := range old {
		delete(z.exists, n)
	}
	for g := uint64(1); g <= nameGenLive+1; g++ {
		now := t0 + g*genNanos
		l.tick(now) // the controller's tick (capacityRun.stepNames)
		z.learn(l, now, kept...)
		for _, n := range old[:10] {
			c, _ := classifyName(t, l, n, now)
			if want := g < nameGenLive; c.known != want {
				t.Fatalf("generation %d: %s known %v, want %v", g, n, c.known, want)
			}
		}
	}
	now := t0 + (nameGenLive+1)*genNanos
	if n := l.names.occupied(now, 0); n != len(kept) {
		t.Errorf("%d names live, want the %d kept", n, len(kept))
	}
	// The sweep ran: the dead entries are cleared, not only ignored.
	empty := 0
	for i := range l.names.slots {
		if l.names.slots[i].Load() == 0 {
			empty++
		}
	}
	if empty != len(l.names.slots)-len(kept) {
		t.Errorf("%d empty slots after the sweep, want %d", empty, len(l.names.slots)-len(kept))
	}
	// other.test. was learnt from one SOA and stays known while its names are
	// answered; victim.test. is configured and stays although nothing is answered
	// in it; child.victim.test., learnt and then silent, has aged out.
	if c, _ := classifyName(t, l, "kept1.other.test.", now); c.zone != nameKeyOf(t, l.seed, "other.test.") || !c.known {
		t.Errorf("kept1.other.test.: %+v; want known in other.test.", c)
	}
	if c, _ := classifyName(t, l, "x.victim.test.", now); c.zone != nameKeyOf(t, l.seed, "victim.test.") {
		t.Errorf("configured apex aged out: %+v", c)
	}
	if c, _ := classifyName(t, l, "x.child.victim.test.", now); c.zone != nameKeyOf(t, l.seed, "victim.test.") {
		t.Errorf("child.victim.test. still a zone: %+v", c)
	}
	// Time standing still or going back forgets nothing more.
	if c, _ := classifyName(t, l, kept[0], now-3*genNanos); !c.known {
		t.Error("a step back in time forgot a name")
	}
}

// TestNameLearnerConstantMemory: a flood of random names the server answers as
// existing (a zone that answers everything, without reporting a wildcard) fills the
// table and no more, allocates nothing per response beyond miekg/dns's packing, and
// evicts newcomers before names answered many times.
func TestNameLearnerConstantMemory(t *testing.T) {
	l := mustLearner(t, "victim.test.")
	now := uint64(learnT0)
	popular := make([]*dns.Msg, 1000)
	for i := range popular {
		m, _ := newTestZone(fmt.Sprintf("p%d.victim.test.", i)).answer(fmt.Sprintf("p%d.victim.test.", i), dns.TypeA)
		popular[i] = m
		for range 4 {
			l.observe(m, "", now)
		}
	}
	slots, capacity := len(l.names.slots), 1<<nameBucketShift*nameWays
	if slots != capacity || nameLearnerBytes != 8*(len(l.names.slots)+len(l.apexes.slots)) {
		t.Fatalf("%d slots; nameLearnerBytes %d", slots, nameLearnerBytes)
	}
	r := rand.New(rand.NewPCG(3, 4))
	q := new(dns.Msg)
	q.SetQuestion("x.victim.test.", dns.TypeA)
	m := new(dns.Msg)
	m.SetReply(q)
	rr, _ := dns.NewRR("x.victim.test. 300 IN A 192.0.2.1")
	m.Answer = []dns.RR{rr}
	names := make([]string, 4*capacity)
	for i := range names {
		names[i] = randomLabel(r) + ".victim.test."
	}
	i := 0
	allocs := testing.AllocsPerRun(len(names)-1, func() {
		m.Question[0].Name = names[i]
		i++
		l.observe(m, "", now+uint64(i))
	})
	if allocs != 0 {
		t.Errorf("observe allocates %v times per response", allocs)
	}
	if len(l.names.slots) != slots {
		t.Fatal("the table grew")
	}
	if n := l.names.occupied(now+uint64(i), 0); n > capacity || n < capacity*9/10 {
		t.Errorf("%d names live of %d slots", n, capacity)
	}
	lost := 0
	for _, pm := range popular {
		if c, _ := classifyName(t, l, pm.Question[0].Name, now+uint64(i)); !c.known {
			lost++
		}
	}
	if lost != 0 {
		t.Errorf("%d of %d names answered four times each were evicted by %d random names", lost, len(popular), len(names))
	}
	var qn qname
	readQName(mustPack(t, "www.victim.test."), l.seed, &qn)
	if n := testing.AllocsPerRun(100, func() { l.classify(&qn, now) }); n != 0 {
		t.Errorf("classify allocates %v times", n)
	}
}

func mustPack(t testing.TB, name string) []byte {
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func BenchmarkNameClassify(b *testing.B) {
	z := newTestZone("www.victim.test.")
	l := mustLearner(b, "victim.test.", "other.test.")
	z.learn(l, learnT0, "www.victim.test.", "x.wild.victim.test.")
	msgs := [][]byte{mustPack(b, "www.victim.test."), mustPack(b, "x7f3k.victim.test."), mustPack(b, "x7f3k.wild.victim.test.")}
	var q qname
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		readQName(msgs[i%len(msgs)], l.seed, &q)
		l.classify(&q, learnT0)
	}
}

// TestNameLearnerConcurrent: responses observed and queries classified from several
// goroutines at once (run with -race): the names answered by every goroutine are
// known afterwards, whatever races lost on the way.
func TestNameLearnerConcurrent(t *testing.T) {
	z := newTestZone()
	for i := range 64 {
		z.exists[fmt.Sprintf("n%d.victim.test.", i)] = true
	}
	l := mustLearner(t)
	now := uint64(learnT0)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			var q qname
			for i := range 2000 {
				name := fmt.Sprintf("n%d.victim.test.", r.IntN(64))
				if i%3 == 0 {
					name = randomLabel(r) + ".victim.test."
				}
				m, w := z.answer(name, dns.TypeA)
				l.observe(m, w, now+uint64(i))
				qnameOf(name, l.seed, &q)
				l.classify(&q, now+uint64(i))
			}
		}()
	}
	for range 4 {
		<-done
	}
	// Every name once more, from one goroutine: now all are known.
	for i := range 64 {
		z.learn(l, now+5000, fmt.Sprintf("n%d.victim.test.", i))
	}
	for i := range 64 {
		if c, _ := classifyName(t, l, fmt.Sprintf("n%d.victim.test.", i), now+5000); !c.known || c.zone != nameKeyOf(t, l.seed, "victim.test.") {
			t.Errorf("n%d.victim.test.: %+v", i, c)
		}
	}
	if n := l.names.occupied(now+5000, 0); n != 64 {
		t.Errorf("%d names, want 64", n)
	}
}

// TestNameLearnerWildcardOwner checks that a wildcard given by its owner name
// ("*.wild.victim.test.", as file-serving plugins report it) teaches what its
// parent does: the parent marked as the unit of the names under it, and the
// synthesised name not learnt as existing.
func TestNameLearnerWildcardOwner(t *testing.T) {
	now := uint64(learnT0)
	z := newTestZone()
	for _, form := range []string{"wild.victim.test.", "*.wild.victim.test."} {
		l := mustLearner(t)
		k := func(n string) nameKey { return nameKeyOf(t, l.seed, n) }
		z.learn(l, now, "nope.victim.test.") // the zone, from its SOA
		m, _ := z.answer("x1.wild.victim.test.", dns.TypeA)
		l.observe(m, form, now)
		c, _ := classifyName(t, l, "p.q.wild.victim.test.", now) // two labels under it: its unit is the parent only if marked
		if c.known || c.unit != k("wild.victim.test.") {
			t.Errorf("wildcard %q: a name under it classifies as %+v, want unknown with the parent as unit", form, c)
		}
		if c, _ := classifyName(t, l, "x1.wild.victim.test.", now); c.known {
			t.Errorf("wildcard %q: the synthesised name was learnt as existing", form)
		}
	}
}

// slotsInUse counts t's slots that hold an entry, live or dead (what a sweep clears).
func slotsInUse(t *nameTable) int {
	n := 0
	for i := range t.slots {
		if t.slots[i].Load() != 0 {
			n++
		}
	}
	return n
}
