//go:build linux

package rrl

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// idQuery is a query for name with ID id (runLiveWith tells a flow's queries
// apart by their IDs).
func idQuery(t testing.TB, id int, name string) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = uint16(id)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// setNamesLevel writes a names level into f's settings as the capacity controller
// does (applyNames), with no controller running; 0 lifts it.
func setNamesLevel(t testing.TB, f *Filter, level float64) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.capacity.namesLevel = level
	if err := f.writeSettings(f.cfg); err != nil {
		t.Fatalf("names level %g: %v", level, err)
	}
}

// TestLiveXDPNames: the XDP program judges names by zone, with the tables the
// server's Filter taught on the pins it shares, on real packets on a veth pair
// between namespaces. With a names level L in force, random names under
// victim.test. from thousands of sources (20 L) are held to about L, while queries
// for existing victim.test. names and random names under other.test. (under L: that
// zone's own budget) all pass; the names counters say which judge did it.
func TestLiveXDPNames(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	const L = 300.0
	const dur = 3 * time.Second
	const from = time.Second
	e := newXDPEnv(t, [2]string{"capacity", "auto"}, [2]string{"slip-ratio", "2"})
	e.attach(t, nil)
	srv, f := e.srv4, e.f4
	z := newTestZone("www.victim.test.", "mail.victim.test.", "ftp.victim.test.", "www.other.test.")
	// An NXDOMAIN's SOA teaches each zone, the answers the existing names.
	for _, n := range []string{"nx.victim.test.", "nx.other.test.", "www.victim.test.", "mail.victim.test.", "ftp.victim.test.", "www.other.test."} {
		m, wild := z.answer(n, dns.TypeA)
		f.observe(m, wild)
	}
	setNamesLevel(t, f, L)
	t.Cleanup(func() { setNamesLevel(t, f, 0) })

	rng := rand.New(rand.NewPCG(31, 31))
	v4 := func(c, d byte, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, c, d}), port)
	}
	known := []string{"www.victim.test.", "mail.victim.test.", "ftp.victim.test."}
	flows := []flow{{
		Name: "random", Rate: 20 * L, End: dur,
		Src: func(int) netip.AddrPort { return v4(byte(10+rng.IntN(240)), byte(1+rng.IntN(254)), 23456) },
		Payload: func(i int) []byte {
			return idQuery(t, i, fmt.Sprintf("r%08x.victim.test.", rng.Uint32()))
		},
	}}
	for i := range 10 { // the resolvers' users asking existing names
		src := v4(1, byte(1+i), uint16(50000+i))
		flows = append(flows, flow{Name: fmt.Sprintf("known%d", i), Rate: 0.1 * L, End: dur,
			Src:     func(int) netip.AddrPort { return src },
			Payload: func(j int) []byte { return idQuery(t, j, known[j%len(known)]) }})
	}
	for i := range 5 { // random names under another zone, within its own budget
		src := v4(2, byte(1+i), uint16(51000+i))
		flows = append(flows, flow{Name: fmt.Sprintf("other%d", i), Rate: 0.1 * L, End: dur,
			Src: func(int) netip.AddrPort { return src },
			Payload: func(j int) []byte {
				return idQuery(t, j, fmt.Sprintf("o%d-%d.other.test.", i, j))
			}})
	}
	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	run := runLiveWith(t, srv, e.rawSender(t, srv.addr), f, flows, dur)
	run.report(t)

	if sent := run.sentRate(0, from, dur); sent < 10*L {
		t.Fatalf("random names sent at %.0f pps over [%v, %v), under 10 L: the sender fell behind, run not meaningful", sent, from, dur)
	}
	got := run.admitted(t, 0, from, dur)
	t.Logf("random names under victim.test.: sent %.0f pps, admitted %.0f pps (level %.0f)", run.sentRate(0, from, dur), got, L)
	if got > 1.3*L || got < 0.5*L {
		t.Errorf("random names under victim.test. admitted at %.0f pps after %v, want about the level %.0f (0.5 to 1.3 times)", got, from, L)
	}
	for fi := 1; fi < len(flows); fi++ {
		if l := run.loss(fi); l >= 0.01 {
			t.Errorf("%s lost %.2f%% of its queries, want < 1%%", flows[fi].Name, 100*l)
		}
	}
	st := run.filter
	if st.Names == nil || before.Names == nil {
		t.Fatalf("no names counters: %+v", st.Names)
	}
	var sentKnown, sentOther, sentRandom uint64
	for fi, s := range run.sentAt {
		switch {
		case fi == 0:
			sentRandom = uint64(len(s))
		case fi <= 10:
			sentKnown += uint64(len(s))
		default:
			sentOther += uint64(len(s))
		}
	}
	d := NameStats{
		Known:         st.Names.Known - before.Names.Known,
		Unknown:       st.Names.Unknown - before.Names.Unknown,
		Limited:       st.Names.Limited - before.Names.Limited,
		UnknownPassed: st.Names.UnknownPassed - before.Names.UnknownPassed,
	}
	t.Logf("names counters moved %+v; level %g", d, st.Names.Level)
	// The XDP program judged them: every existing name counted known (none lost on
	// the pair), every random name unknown, what it refused is what the names judge
	// refused, and the source lattice (no water level) refused nothing.
	var gotKnown uint64
	for fi := 1; fi <= 10; fi++ {
		gotKnown += uint64(len(run.received[fi]))
	}
	if d.Known < gotKnown || d.Known > sentKnown {
		t.Errorf("%d queries counted known; %d sent for existing names, %d received", d.Known, sentKnown, gotKnown)
	}
	if lost := uint64(len(run.sentAt[0])) + sentOther - d.Unknown; d.Unknown > sentRandom+sentOther || lost > sentRandom/100 {
		t.Errorf("%d queries counted unknown, %d random names sent", d.Unknown, sentRandom+sentOther)
	}
	if n := st.Slipped - before.Slipped; n != 0 {
		t.Errorf("XDP slipped %d refused names, want none (slip-ratio 2 slips request-limited queries only)", n)
	}
	if l := sumLimited(st) - sumLimited(before); l != 0 {
		t.Errorf("the source lattice limited %d queries with no water level", l)
	}
	if d.Limited == 0 || d.Limited+d.UnknownPassed != d.Unknown {
		t.Errorf("names counters %+v: limited and passed do not add up to the unknown", d)
	}
	if math.Abs(st.Names.Level-L) > 1e-6 {
		t.Errorf("FilterStats.Names.Level %g, want %g", st.Names.Level, L)
	}
}
