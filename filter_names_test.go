//go:build linux

package rrl

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The names judge's reading and classifying of query names, kernel ≡ Go: the
// program's name_read and name_classify (bpf/names.h), run on a packet by
// rrl_names_test under BPF_PROG_TEST_RUN, give the keys readQName gives for the
// packet's DNS message and the class nameLearner.classify gives, with the tables
// the learner wrote in place (filter_names.go).

const namesTestSeed = 0x6e61_6d65_7365_6564

// namesRig runs packets through rrl_names_test, with a learner writing the
// program's tables.
type namesRig struct {
	objs *testObjects
	seed uint64 // the names' seed: nameSeed of the settings' seed
	l    *nameLearner
}

func newNamesRig(t testing.TB, apexes ...string) *namesRig {
	t.Helper()
	objs := loadTestObjects(t)
	if err := objs.settingsMaps().apply(NewConfig(), namesTestSeed, nil); err != nil {
		t.Fatal(err)
	}
	tables, err := mapNameTables(objs.Names, objs.Apexes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tables.close() })
	l, ok := tables.learner(nameSeed(namesTestSeed), apexes)
	if !ok {
		t.Fatalf("learner(%q)", apexes)
	}
	return &namesRig{objs: objs, seed: nameSeed(namesTestSeed), l: l}
}

// run returns what the program read and classified of msg, a DNS message sent
// over IPv4 (v6 false) or IPv6, at now.
func (r *namesRig) run(t testing.TB, msg []byte, v6 bool, now uint64) filterTestNames {
	t.Helper()
	if err := r.objs.TestInput.Put(uint32(0), &filterTestInput{Now: now}); err != nil {
		t.Fatal(err)
	}
	var frame []byte
	if v6 {
		frame = ethFrame(unix.ETH_P_IPV6, ipv6Packet(netip.MustParseAddrPort("[2001:db8::7]:40000"), netip.MustParseAddrPort("[2001:db8::1]:53"), false, msg))
	} else {
		frame = ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("198.51.100.7:40000"), netip.MustParseAddrPort("198.51.100.1:53"), nil, msg))
	}
	ret, err := r.objs.NamesTest.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	var out filterTestNames
	if err := r.objs.TestNames.Lookup(uint32(0), &out); err != nil {
		t.Fatal(err)
	}
	if ret == 0 {
		t.Fatalf("message %x: the test program failed: %+v", msg, out)
	}
	return out
}

// check fails t unless the program reads and classifies msg at now as readQName and
// classify do; it returns the model's verdict on the name, and its class.
func (r *namesRig) check(t testing.TB, what string, msg []byte, v6 bool, now uint64) (nameErr, nameClass) {
	t.Helper()
	got := r.run(t, msg, v6, now)
	var q qname
	_, e := readQName(msg, r.seed, &q)
	if e != nameOK {
		if got.Labels != -int32(e) {
			t.Errorf("%s: kernel read %d, model refuses: %v; message %x", what, got.Labels, e, msg)
		}
		return e, nameClass{}
	}
	if got.Labels != int32(q.labels) {
		t.Errorf("%s: kernel read %d labels, model %d; message %x", what, got.Labels, q.labels, msg)
		return e, nameClass{}
	}
	for i := 0; i <= q.labels; i++ {
		if nameKey(got.Suffix[i]) != q.suffix[i] {
			t.Errorf("%s: suffix %d: kernel %x, model %x", what, i, got.Suffix[i], q.suffix[i])
		}
	}
	c := r.l.classify(&q, now)
	_, depth := r.l.zoneOf(&q, now)
	if got.Known != map[bool]int32{false: 0, true: 1}[c.known] || nameKey(got.Zone) != c.zone || nameKey(got.Unit) != c.unit || int(got.Depth) != depth {
		t.Errorf("%s at %d: kernel known %d zone %x depth %d unit %x; model %+v depth %d", what, now, got.Known, got.Zone, got.Depth, got.Unit, c, depth)
	}
	return e, c
}

// namesReadCorpus is the hand-made corpus of the reader: every refusal, the
// longest names, case folding, every label length and bytes a label may hold.
func namesReadCorpus() []struct {
	name string
	msg  []byte
} {
	long4 := [][]byte{repeatLabel('a', 63), repeatLabel('B', 63), repeatLabel('c', 63), repeatLabel('D', 61)}
	many := make([][]byte, 127)
	for i := range many {
		many[i] = []byte{'a' + byte(i%26)}
	}
	type c = struct {
		name string
		msg  []byte
	}
	cases := []c{
		{"root", wireQuery(nil)},
		{"one label", wireQuery(splitName("test."))},
		{"an OPT record after", wireQuery(splitName("a.test."), 0, 0, 41, 4, 208, 0, 0, 0, 0, 0, 0)},
		{"255 bytes, four labels", wireQuery(long4)},
		{"255 bytes, 127 labels", wireQuery(many)},
		{"256 bytes", wireQuery(append(long4[:3:3], repeatLabel('d', 62)))},
		{"128 labels", wireQuery(append(many[:127:127], []byte("z")))},
		{"a 64-byte length (01 type)", wireQuery([][]byte{repeatLabel('x', 64)})},
		{"label type 10", append(wireQuery(nil)[:12], 0x80, 0, 0, 1, 0, 1)},
		{"pointer first", append(wireQuery(nil)[:12], 0xc0, 12, 0, 1, 0, 1)},
		{"pointer after a label", append(wireQuery(nil)[:12], 1, 'a', 0xc0, 12, 0, 1, 0, 1)},
		{"no question", func() []byte { b := wireQuery(nil); b[5] = 0; return b }()},
		{"two questions", func() []byte { b := wireQuery(nil); b[5] = 2; return b }()},
		{"256 questions", func() []byte { b := wireQuery(nil); b[4] = 1; return b }()},
		{"capitals", wireQuery(splitName("WwW.ViCtIm.TeSt."))},
		{"every byte in a label", wireQuery([][]byte{{0, '.', 'A', 'Z', '@', '[', 0x7f, 0x80, 0xc1, 0xda, 0xff}, []byte("test")})},
	}
	for n := 1; n <= 63; n++ {
		cases = append(cases, c{fmt.Sprintf("a %d-byte label", n), wireQuery([][]byte{repeatLabel('Q', n), []byte("victim"), []byte("test")})})
	}
	// Cut at every byte, the UDP length saying so.
	for _, m := range []c{cases[2], cases[3], cases[4], cases[14]} {
		for n := 0; n < len(m.msg); n++ {
			cases = append(cases, c{fmt.Sprintf("%s cut at %d", m.name, n), m.msg[:n]})
		}
	}
	return cases
}

// TestNamesKernelReadsAsModel: the program reads every message of the corpus, over
// IPv4 and IPv6, as readQName does: the same refusals, the same keys for every
// suffix.
func TestNamesKernelReadsAsModel(t *testing.T) {
	r := newNamesRig(t)
	verdicts := map[nameErr]int{}
	for _, tc := range namesReadCorpus() {
		for _, v6 := range []bool{false, true} {
			e, _ := r.check(t, tc.name, tc.msg, v6, 1e9)
			verdicts[e]++
		}
	}
	t.Logf("verdicts: %v", verdicts)
	for e := nameOK; e <= nameTooLong; e++ {
		if verdicts[e] == 0 {
			t.Errorf("no case of %v", e)
		}
	}
}

// namesLearnt returns a rig whose learner has learnt the test zones (names_learn_test.go's
// testZone: victim.test. with a child zone and a wildcard, other.test.), a deep zone
// and a configured one, at now.
func namesLearnt(t testing.TB, now uint64) (*namesRig, *testZone) {
	r := newNamesRig(t, "conf.example.", "d.c.b.a.deep.test.", "wz.test.")
	z := newTestZone("www.victim.test.", "mail.victim.test.", "victim.test.", "a.child.victim.test.",
		"www.other.test.", "wild.victim.test.", "sib.wild.victim.test.")
	z.learn(r.l, now, "www.victim.test.", "mail.victim.test.", "a.child.victim.test.", "www.other.test.",
		"x1.wild.victim.test.", "sib.wild.victim.test.", "gone.victim.test.")
	// A wildcard at a zone's apex (*.wz.test.): its parent is the apex.
	m := new(dns.Msg)
	m.SetQuestion("r.wz.test.", dns.TypeA)
	m.Response = true
	rr, _ := dns.NewRR("r.wz.test. 60 IN A 192.0.2.7")
	m.Answer = append(m.Answer, rr)
	r.l.observe(m, "wz.test.", now)
	return r, z
}

// namesClassifyNames are the query names the classification tests ask for.
var namesClassifyNames = []string{
	".", "test.", "victim.test.", "www.victim.test.", "WWW.Victim.TEST.", "mail.victim.test.", "nope.victim.test.",
	"a.b.c.nope.victim.test.", "gone.victim.test.", "child.victim.test.", "a.child.victim.test.", "b.child.victim.test.",
	"wild.victim.test.", "sib.wild.victim.test.", "x1.wild.victim.test.", "r.wild.victim.test.", "r.s.wild.victim.test.",
	"r.s.t.wild.victim.test.", "r.s.t.u.wild.victim.test.", "r.s.t.u.v.wild.victim.test.",
	"www.other.test.", "x.other.test.", "elsewhere.example.", "conf.example.", "x.conf.example.", "d.c.b.a.deep.test.",
	"x.d.c.b.a.deep.test.", "c.b.a.deep.test.", "q.wz.test.", "q.r.wz.test.", "a.b.c.d.wz.test.", "a.b.c.d.e.wz.test.",
}

func namesQuery(t testing.TB, name string) []byte {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNamesKernelClassifiesAsModel: with tables the Go learner filled from the
// zones' responses, the program classifies every name as classify does (zone and
// its depth, known, unit), when learnt, after an NXDOMAIN forgets a name, and as
// the entries age out; the cases cover every kind of class.
func TestNamesKernelClassifiesAsModel(t *testing.T) {
	const now = 1 << 40
	r, z := namesLearnt(t, now)
	kinds := map[string]int{}
	classifyAll := func(at uint64) {
		for _, n := range namesClassifyNames {
			_, c := r.check(t, n, namesQuery(t, n), false, at)
			var q qname
			qnameOf(n, r.seed, &q)
			switch {
			case c.known:
				kinds["known"]++
			case c.unit != q.parent():
				kinds["wildcard unit"]++
			case c.zone == q.suffix[q.labels]:
				kinds["no zone"]++
			default:
				kinds["unknown in a zone"]++
			}
		}
	}
	classifyAll(now)
	classifyAll(now + 2<<nameGenShift) // older, still live
	// An NXDOMAIN forgets a name at once.
	z.exists["www.victim.test."] = false
	z.learn(r.l, now+1, "www.victim.test.")
	classifyAll(now + 1)
	// Past their life every learnt entry is dead; the configured apexes stay.
	classifyAll(now + (nameGenLive+1)<<nameGenShift)
	t.Logf("classes: %v", kinds)
	for _, k := range []string{"known", "wildcard unit", "no zone", "unknown in a zone"} {
		if kinds[k] == 0 {
			t.Errorf("no case of %s", k)
		}
	}
}

// TestNamesKernelFullTables: tables the learner filled past their capacity (names
// evicting each other, zones at many depths) classify alike in the program and in
// Go, for the names learnt and for random ones.
func TestNamesKernelFullTables(t *testing.T) {
	const now = 1 << 41
	r := newNamesRig(t)
	rng := rand.New(rand.NewPCG(7, 31))
	var names []string
	for i := range 1200 {
		// Zones of 1 to 6 labels, each answering a few names.
		depth := 1 + i%6
		labels := make([]string, depth)
		for j := range labels {
			labels[j] = randomLabel(rng)
		}
		apex := strings.Join(labels, ".") + "."
		soa := soaOf(apex)
		for range 60 {
			name := randomLabel(rng) + "." + apex
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.Response = true
			if rng.IntN(4) == 0 {
				m.Rcode = dns.RcodeNameError
			} else {
				// Built, not parsed: 54,000 answers to fill the tables.
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: netip.AddrFrom4([4]byte{192, 0, 2, 1}).AsSlice()})
			}
			m.Ns = append(m.Ns, soa)
			r.l.observe(m, "", now+uint64(rng.IntN(1<<30)))
			names = append(names, name)
		}
	}
	t.Logf("names %d live of %d learnt, apexes %d live", r.l.names.occupied(now, 0), len(names), r.l.apexes.occupied(now, apexPinned))
	// Every query is one check of the program against the model (two system
	// calls and a comparison): the tables are full either way, so under the race
	// detector a sample of them (exhaustive_test.go).
	checks := 3000
	if !exhaustive() {
		checks = 600
	}
	known := 0
	for i := range checks {
		n := names[rng.IntN(len(names))]
		if i%3 == 0 {
			n = randomLabel(rng) + "." + n
		}
		if i%5 == 0 {
			n = strings.ToUpper(n)
		}
		if _, c := r.check(t, n, namesQuery(t, n), i%2 == 0, now+1<<30); c.known {
			known++
		}
	}
	if known == 0 || known == checks {
		t.Errorf("%d of %d names known: the tables were not exercised", known, checks)
	}
}

// FuzzNamesKernelMatchesModel: any DNS message reads and classifies alike in the
// program and in Go, against learnt tables; the corpus seeds it.
func FuzzNamesKernelMatchesModel(f *testing.F) {
	for _, tc := range namesReadCorpus() {
		f.Add(tc.msg, false)
	}
	for _, n := range namesClassifyNames {
		f.Add(namesQuery(f, n), true)
	}
	r, _ := namesLearnt(f, 1<<40)
	f.Fuzz(func(t *testing.T, msg []byte, v6 bool) {
		msg = msg[:min(len(msg), 1400)]
		r.check(t, "fuzz", msg, v6, 1<<40)
	})
}
