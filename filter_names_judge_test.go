//go:build linux

package rrl

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The names judge, kernel ≡ Go: the program's verdicts, counters and zone sketch for
// a stream of queries equal those of the Go Limiter's own judge (decideQueryAt, the
// production code of the Go-only mode), run beside it with the same seed, the same
// draws and times, and a learner on the same tables. Both sides get their settings
// from one Config through the production paths: kernelSettings for the program,
// newLimiterParams for the Limiter (names on with capacity, the level as the capacity
// controller writes it).

// namesVerdict's names for the test's tallies.
func (v namesVerdict) String() string {
	return [...]string{"not judged", "known", "unknown passed", "unknown refused"}[v]
}

// verdictOfCounts is what the names judge did with one query, read from how its four
// counters (known, unknown, limited, unknown passed) moved; report-only is whether
// the query was counted as passed in report-only mode.
func verdictOfCounts(t testing.TB, what string, moved [4]uint64, reportOnly bool) namesVerdict {
	t.Helper()
	switch moved {
	case [4]uint64{}:
		return namesNotJudged
	case [4]uint64{1, 0, 0, 0}:
		return namesKnown
	case [4]uint64{0, 1, 0, 1}:
		return namesUnknown
	case [4]uint64{0, 1, 1, 0}:
		return namesRefused
	case [4]uint64{0, 1, 1, 1}:
		// Refused, and passed in report-only mode: counted as both.
		if !reportOnly {
			t.Fatalf("%s: names counters %v without report-only", what, moved)
		}
		return namesRefused
	}
	t.Fatalf("%s: names counters (known, unknown, limited, unknown passed) %v", what, moved)
	return 0
}

// namesJudgeRig runs packets through rrl_filter_test with names on at the level
// limit (queries per second per zone), and nothing limited by the source lattice,
// and the same queries through a Go Limiter set up alike (golim).
type namesJudgeRig struct {
	*namesRig
	golim *Limiter
	xdp   *xdpTestObjects // when not nil, packets go through XDP's test program
}

// namesJudgeConfig is the Config both sides run: the capacity mode (names on by
// default with it), no request limit, the names level as a capacity controller
// puts it in force.
func namesJudgeConfig(t testing.TB, limit float64, reportOnly bool) *Config {
	t.Helper()
	cfg := NewConfig()
	for _, kv := range [][2]string{{"requests-per-second", "0"}, {"capacity", "auto"}, {"report-only", fmt.Sprint(reportOnly)}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	cfg.namesLevel = limit
	return cfg
}

func newNamesJudgeRig(t testing.TB, limit float64, reportOnly bool) *namesJudgeRig {
	t.Helper()
	r := newNamesRig(t)
	cfg := namesJudgeConfig(t, limit, reportOnly)
	if err := r.objs.settingsMaps().apply(cfg, namesTestSeed, nil); err != nil {
		t.Fatal(err)
	}
	set, _, err := r.objs.settingsMaps().active(nil)
	if err != nil {
		t.Fatal(err)
	}
	golim, err := newLimiterSeed(cfg, namesTestSeed)
	if err != nil {
		t.Fatal(err)
	}
	p := golim.params.Load()
	if set.NamesOn != 1 || set.NamesLimit != uint64(p.names.limit) || set.NamesTrip != uint64(p.names.trip) || set.NameSeed != golim.names.Load().seed {
		t.Fatalf("kernel settings names (on %d, limit %d, trip %d, seed %#x), Go Limiter's %+v seed %#x", set.NamesOn, set.NamesLimit, set.NamesTrip, set.NameSeed, p.names, golim.names.Load().seed)
	}
	// One table, written by the rig's learner, read by both judges.
	golim.names.Load().learner.Store(r.l)
	return &namesJudgeRig{namesRig: r, golim: golim}
}

// goJudge runs msg through the Go Limiter from the rig's source address at now
// with the draw rnd: the verdict, from its counters, and whether it passed.
func (r *namesJudgeRig) goJudge(t testing.TB, msg []byte, v6 bool, now uint64, rnd uint32) (namesVerdict, bool) {
	t.Helper()
	src := netip.MustParseAddrPort("198.51.100.7:40000")
	if v6 {
		src = netip.MustParseAddrPort("[2001:db8::7]:40000")
	}
	before := r.golim.counts()
	var q qname
	qp := &q
	if !r.golim.readName(msg, qp) {
		qp = nil
	}
	v := r.golim.decideQueryAt(src, qp, false, int64(now), rnd)
	after := r.golim.counts()
	moved := [4]uint64{after.namesKnown - before.namesKnown, after.namesUnknown - before.namesUnknown, after.namesLimited - before.namesLimited, after.unknownPassed - before.unknownPassed}
	return verdictOfCounts(t, fmt.Sprintf("Go, message %x", msg), moved, after.report != before.report), v.Allowed
}

// judge runs msg at now with the draw rnd and returns what the program did, read
// from the counters it moved, and whether it passed the packet.
func (r *namesJudgeRig) judge(t testing.TB, msg []byte, v6 bool, now uint64, rnd uint32) (namesVerdict, bool) {
	t.Helper()
	before, err := sumCounters(r.objs.Counters)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.objs.TestInput.Put(uint32(0), &filterTestInput{Now: now, Rnd: rnd}); err != nil {
		t.Fatal(err)
	}
	var frame []byte
	if v6 {
		frame = ethFrame(unix.ETH_P_IPV6, ipv6Packet(netip.MustParseAddrPort("[2001:db8::7]:40000"), netip.MustParseAddrPort("[2001:db8::1]:53"), false, msg))
	} else {
		frame = ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("198.51.100.7:40000"), netip.MustParseAddrPort("198.51.100.1:53"), nil, msg))
	}
	prog := r.objs.FilterTest
	if r.xdp != nil {
		prog = r.xdp.Test
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	if r.xdp != nil {
		// XDP passes or drops: a query the names judge refused is never slipped.
		if ret != xdpPass && ret != xdpDrop {
			t.Fatalf("message %x: XDP returned %d", msg, ret)
		}
		ret = map[bool]uint32{false: 0, true: 1}[ret == xdpPass]
	}
	after, err := sumCounters(r.objs.Counters)
	if err != nil {
		t.Fatal(err)
	}
	d := func(i int) uint64 { return after[i] - before[i] }
	if d(counterSeen) != 1 || d(counterError) != 0 {
		t.Fatalf("message %x: seen %d, errors %d", msg, d(counterSeen), d(counterError))
	}
	moved := [...]uint64{d(counterNamesKnown), d(counterNamesUnknown), d(counterNamesLimited), d(counterNamesUnknownPassed)}
	v := verdictOfCounts(t, fmt.Sprintf("kernel, message %x", msg), moved, d(counterReportOnly) == 1)
	if d(counterPassed) != map[bool]uint64{false: 0, true: 1}[ret != 0] {
		t.Fatalf("message %x: returned %d, passed counter moved %d", msg, ret, d(counterPassed))
	}
	return v, ret != 0
}

// zoneCells fails t unless the program's zone sketch holds the cells of want (the
// Go Limiter's zone sketch).
func (r *namesJudgeRig) zoneCells(t testing.TB, want *countMin) int {
	t.Helper()
	busy := 0
	for row := range sketchDepth {
		for col := range sketchWidth {
			var c filterCell
			idx := uint32((numNodes*sketchDepth+row)*sketchWidth + col)
			if err := r.objs.Cells.Lookup(idx, &c); err != nil {
				t.Fatal(err)
			}
			count, last := want[row][col].load()
			if uint64(count) != c.Count || last != c.Last {
				t.Fatalf("zone sketch row %d col %d: kernel (%d, %d), Go (%d, %d)", row, col, c.Count, c.Last, count, last)
			}
			if c.Count != 0 {
				busy++
			}
		}
	}
	return busy
}

// TestNamesJudgeKernelMatchesLimiter: a random-subdomain flood on victim.test. beside
// its known names, a lighter one on other.test., queries outside any zone and
// names that do not read, at a level of 300 queries per second per zone: the
// socket filter and the XDP program judge every query as the Go Limiter does (verdict,
// counters, pass or drop, in report-only mode too; XDP slips none of the names
// judge's refusals), and the zone sketch holds the Limiter's cells, bit for bit.
func TestNamesJudgeKernelMatchesLimiter(t *testing.T) {
	for _, c := range []struct{ xdp, reportOnly bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		reportOnly := c.reportOnly
		t.Run(fmt.Sprintf("xdp=%v/report-only=%v", c.xdp, reportOnly), func(t *testing.T) {
			r := newNamesJudgeRig(t, 300, reportOnly)
			if c.xdp {
				r.xdp = loadXDPTest(t, r.objs)
				// Slip every query the source lattice refuses: none are here, and
				// the names judge's refusals must not be slipped.
				setNamesSettings(t, r.objs.Settings, func(s *filterSettings) { s.SlipRatio = 1 })
			}
			const start = 1 << 40
			z := newTestZone("www.victim.test.", "mail.victim.test.", "www.other.test.")
			z.learn(r.l, start, "www.victim.test.", "mail.victim.test.", "www.other.test.", "nx.other.test.")
			rng := rand.New(rand.NewPCG(3, uint64(map[bool]int{false: 1, true: 2}[reportOnly])))
			count := map[string]map[namesVerdict]int{}
			now := uint64(start)
			queries := 4000 // each a test-run of the program and the Limiter's judge
			if !exhaustive() {
				queries = 1000 // a sample under the race detector (exhaustive_test.go)
			}
			for i := range queries {
				now += uint64(rng.IntN(200_000)) // 10,000 queries per second
				var kind, name string
				switch p := rng.IntN(100); {
				case p < 55:
					kind, name = "victim random", randomLabel(rng)+".victim.test."
				case p < 70:
					kind, name = "victim known", []string{"www.victim.test.", "MAIL.victim.test."}[rng.IntN(2)]
				case p < 85:
					kind, name = "other random", randomLabel(rng)+"."+randomLabel(rng)+".other.test."
				case p < 92:
					kind, name = "other known", "www.other.test."
				case p < 97:
					kind, name = "no zone", randomLabel(rng)+".example."
				default:
					kind = "unreadable"
				}
				msg := append(wireQuery(nil)[:12], 1, 'a', 0xc0, 12, 0, 1, 0, 1)
				if name != "" {
					msg = namesQuery(t, name)
				}
				rnd := rng.Uint32()
				want, goPass := r.goJudge(t, msg, i%2 == 1, now, rnd)
				got, pass := r.judge(t, msg, i%2 == 1, now, rnd)
				if got != want || pass != goPass {
					t.Fatalf("query %d (%s %s) at %d, draw %#x: kernel %v (passed %v), Go %v (passed %v)", i, kind, name, now, rnd, got, pass, want, goPass)
				}
				if pass != (want != namesRefused || reportOnly) {
					t.Fatalf("query %d (%s %s): %v and passed %v", i, kind, name, want, pass)
				}
				if count[kind] == nil {
					count[kind] = map[namesVerdict]int{}
				}
				count[kind][want]++
			}
			busy := r.zoneCells(t, &r.golim.names.Load().sketch)
			t.Logf("verdicts by kind: %v; zone sketch cells in use: %d", count, busy)
			// The stream must have shown every verdict: random names of both zones
			// limited, known names never.
			for _, k := range []string{"victim random", "other random"} {
				if count[k][namesRefused] == 0 || count[k][namesUnknown] == 0 {
					t.Errorf("%s: %v, want some refused and some passed", k, count[k])
				}
			}
			for _, k := range []string{"victim known", "other known"} {
				if count[k][namesKnown] == 0 || len(count[k]) != 1 {
					t.Errorf("%s: %v, want known only", k, count[k])
				}
			}
			if count["unreadable"][namesNotJudged] == 0 {
				t.Errorf("unreadable: %v", count["unreadable"])
			}
		})
	}
}

// TestNamesJudgeOffUntouched: with names off the program reads no name, counts
// nothing of them and leaves the zone sketch alone, whatever the tables know.
func TestNamesJudgeOffUntouched(t *testing.T) {
	r := newNamesJudgeRig(t, 1, false)
	// The names keyword off, written by kernelSettings.
	cfg := namesJudgeConfig(t, 1, false)
	if err := cfg.SetValue("names", "off"); err != nil {
		t.Fatal(err)
	}
	if err := r.objs.settingsMaps().apply(cfg, namesTestSeed, nil); err != nil {
		t.Fatal(err)
	}
	z := newTestZone("www.victim.test.")
	z.learn(r.l, 1<<40, "www.victim.test.")
	for i := range 200 {
		name := []string{"www.victim.test.", "r.victim.test."}[i%2]
		if v, pass := r.judge(t, namesQuery(t, name), false, 1<<40+uint64(i)*1000, uint32(i)); v != namesNotJudged || !pass {
			t.Fatalf("%s with names off: %v, passed %v", name, v, pass)
		}
	}
	if busy := r.zoneCells(t, new(countMin)); busy != 0 {
		t.Fatalf("%d zone sketch cells counted with names off", busy)
	}
}

// TestNamesProductionTailCall: the production program hands a packet to the names
// judge's program when names are on, which counts it; off, or with the program
// array emptied (its last user space reference closed), it judges without names.
func TestNamesProductionTailCall(t *testing.T) {
	requireBPF(t)
	objs, err := loadKernelObjects()
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	f := &Filter{objs: objs, mode: ModeEBPF, seed: 42}
	if err := f.writeSettings(NewConfig()); err != nil {
		t.Fatal(err)
	}
	frame := ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("198.51.100.7:40000"), netip.MustParseAddrPort("198.51.100.1:53"), nil, namesQuery(t, "r.victim.test.")))
	unknown := func() uint64 {
		t.Helper()
		before, err := sumCounters(objs.Counters)
		if err != nil {
			t.Fatal(err)
		}
		ret, err := objs.Program.Run(&ebpf.RunOptions{Data: frame})
		if err != nil || ret == 0 {
			t.Fatalf("run: %d, %v", ret, err)
		}
		after, err := sumCounters(objs.Counters)
		if err != nil {
			t.Fatal(err)
		}
		if after[counterSeen]-before[counterSeen] != 1 || after[counterPassed]-before[counterPassed] != 1 {
			t.Fatalf("the packet was not judged once and passed: %v -> %v", before, after)
		}
		return after[counterNamesUnknown] - before[counterNamesUnknown]
	}
	if n := unknown(); n != 0 {
		t.Errorf("names off: %d unknown names counted", n)
	}
	setNamesSettings(t, objs.Settings, func(s *filterSettings) { s.NamesOn = 1 })
	if n := unknown(); n != 1 {
		t.Errorf("names on: %d unknown names counted, want 1", n)
	}
	if err := objs.NamesProg.Delete(uint32(0)); err != nil {
		t.Fatal(err)
	}
	if n := unknown(); n != 0 {
		t.Errorf("names on without the names program: %d unknown names counted", n)
	}
}
