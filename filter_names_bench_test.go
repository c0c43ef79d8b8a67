//go:build linux

package rrl

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// setNamesSettings rewrites the settings slot in force with f applied: the test's
// way of turning names on and giving them a level, which the Go side's
// configuration does not do yet.
func setNamesSettings(t testing.TB, settings *ebpf.Map, f func(*filterSettings)) {
	t.Helper()
	m := settingsMaps{settings: settings}
	h, err := m.header()
	if err != nil {
		t.Fatal(err)
	}
	var s filterSettings
	key := uint32(1 + h.Slot&1)
	if err := settings.Lookup(key, &s); err != nil {
		t.Fatal(err)
	}
	f(&s)
	if err := settings.Put(key, &s); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkFilterNamesTestRun measures the production program per packet under
// BPF_PROG_TEST_RUN with names off (today's program) and on: for a name the tables
// know, and for a random name (unknown: counted in the zone sketch), in a learnt
// zone. "names-cost" is the difference from names off, which the issue wants within
// 25 ns. The "capbpf" cases load the programs as a process with CAP_BPF but not
// CAP_PERFMON does: with the verifier's Spectre mitigations (docs/xdp.md).
func BenchmarkFilterNamesTestRun(b *testing.B) {
	b.Run("root", func(b *testing.B) { benchNamesTestRun(b, false) })
	b.Run("capbpf", func(b *testing.B) { benchNamesTestRun(b, true) })
}

func benchNamesTestRun(b *testing.B, capbpf bool) {
	dst := netip.MustParseAddrPort("127.0.0.1:53")
	src := netip.MustParseAddrPort("192.0.2.1:40000")
	frame := func(name string) []byte {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		msg, err := q.Pack()
		if err != nil {
			b.Fatal(err)
		}
		return ethFrame(unix.ETH_P_IP, ipv4Packet(src, dst, nil, msg))
	}
	objs := loadBenchFilterCaps(b, benchRPS, capbpf)
	tables, err := mapNameTables(objs.Names, objs.Apexes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tables.close() })
	var s filterSettings
	setNamesSettings(b, objs.Settings, func(fs *filterSettings) { s = *fs })
	l, ok := tables.learner(s.NameSeed, nil)
	if !ok {
		b.Fatal("learner")
	}
	now := uint64(monotonicNow())
	z := newTestZone("www.victim.test.", "victim.test.")
	z.learn(l, now, "www.victim.test.")
	base := map[string]float64{}
	for _, c := range []struct {
		name, qname string
		on          bool
		counter     int
	}{
		{"off/known", "www.victim.test.", false, -1},
		{"off/random", "x7f3k.victim.test.", false, -1},
		{"on/known", "www.victim.test.", true, counterNamesKnown},
		{"on/random", "x7f3k.victim.test.", true, counterNamesUnknown},
	} {
		b.Run(c.name, func(b *testing.B) {
			setNamesSettings(b, objs.Settings, func(fs *filterSettings) { fs.NamesOn = map[bool]uint8{false: 0, true: 1}[c.on] })
			before, err := sumCounters(objs.Counters)
			if err != nil {
				b.Fatal(err)
			}
			pkt := frame(c.qname)
			_, ns := benchTestRun(b, func() (time.Duration, error) {
				_, per, err := objs.Program.Benchmark(pkt, 100000, nil)
				return per, err
			})
			after, err := sumCounters(objs.Counters)
			if err != nil {
				b.Fatal(err)
			}
			// The packets must have taken the path measured.
			judged := after[counterSeen] - before[counterSeen]
			if judged == 0 || after[counterError] != before[counterError] {
				b.Fatalf("counters before %v after %v", before, after)
			}
			for _, k := range []int{counterNamesKnown, counterNamesUnknown} {
				moved := after[k] - before[k]
				if (k == c.counter) != (moved == judged) || k != c.counter && moved != 0 {
					b.Fatalf("%s: counter %d moved %d of %d judged", c.name, k, moved, judged)
				}
			}
			kind := c.name[len(c.name)-5:]
			if !c.on {
				base[kind] = ns
			} else if off, ok := base[kind]; ok {
				b.ReportMetric(ns-off, "names-cost-ns")
			}
		})
	}
}
