package rrl

import (
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Draws that refuse a packet over its limit (any draw close to 1 does): the low bits
// decide whether the program records the drop (LIMITED_SAMPLE).
const (
	drawRecord = 0xfffffff0 // low bits 0: recorded
	drawSkip   = 0xfffffff1 // not recorded
)

// testRun feeds packets to the test entry point with the clock and draw given.
type testRun struct {
	t        *testing.T
	objs     *testObjects
	destOpts bool // IPv6 packets carry a destination options header
}

// send judges one query from src at kernel time now with draw rnd; it reports
// whether the program passed it.
func (r testRun) send(src netip.AddrPort, now uint64, rnd uint32) bool {
	r.t.Helper()
	var pkt []byte
	if src.Addr().Is4() {
		pkt = ethFrame(unix.ETH_P_IP, ipv4Packet(src, netip.MustParseAddrPort("192.0.2.53:53"), nil, dnsQuery(1, false)))
	} else {
		pkt = ethFrame(unix.ETH_P_IPV6, ipv6Packet(src, netip.MustParseAddrPort("[fd00::53]:53"), r.destOpts, dnsQuery(1, false)))
	}
	if err := r.objs.TestInput.Put(uint32(0), &filterTestInput{Now: now, Rnd: rnd}); err != nil {
		r.t.Fatal(err)
	}
	ret, err := r.objs.FilterTest.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		r.t.Fatal(err)
	}
	return ret != 0
}

// filter is a Filter over the test objects' maps (not to be closed: the test
// objects own them).
func (r testRun) filter() *Filter {
	o := r.objs
	return &Filter{mode: ModeEBPF, cfg: NewConfig(), objs: &kernelObjects{
		Cells: o.Cells, Settings: o.Settings, Counters: o.Counters, Exempt4: o.Exempt4, Exempt6: o.Exempt6, Limited: o.Limited,
	}}
}

// groupsAt is LimitedGroups at kernel time now, which is wall time wall.
func (r testRun) groupsAt(now uint64, wall time.Time) []GroupRate {
	r.t.Helper()
	f := r.filter()
	s, _, err := f.objs.settingsMaps().active(nil)
	if err != nil {
		r.t.Fatal(err)
	}
	g, err := f.limitedGroupsAt(s, now, wall)
	if err != nil {
		r.t.Fatal(err)
	}
	return g
}

// TestKernelRecordsLimitedGroups replays packets through the program under
// BPF_PROG_TEST_RUN with chosen clock readings and draws, and checks what it records
// of the groups it refuses: the deciding level's prefix (or port), the sampled drop
// count, the first and last times, and nothing for packets it passes or drops it does
// not sample.
func TestKernelRecordsLimitedGroups(t *testing.T) {
	const t0 = uint64(10_000_000_000)
	const later = t0 + uint64(30*time.Millisecond)
	v4 := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	// With requests-per-second 100 a group's estimate passes its limit at the 30th
	// packet of one instant; 40 packets put every node that sees them all over it.
	type packet struct {
		src netip.AddrPort
		at  uint64
		rnd uint32
	}
	burst := func(n int, at uint64, rnd uint32, src func(i int) netip.AddrPort) []packet {
		var out []packet
		for i := range n {
			out = append(out, packet{src(i), at, rnd})
		}
		return out
	}
	one := func(s string) func(int) netip.AddrPort { return func(int) netip.AddrPort { return v4(s) } }
	cases := []struct {
		name       string
		reportOnly bool
		destOpts   bool
		packets    []packet
		want       []GroupRate // Rate and Limit are checked separately
	}{
		{"one address, two recorded drops", false, false,
			append(append(burst(40, t0, drawSkip, one("192.0.2.7:40000")), packet{v4("192.0.2.7:40000"), t0, drawRecord}),
				packet{v4("192.0.2.7:40000"), later, drawRecord}),
			[]GroupRate{{Node: nodeTagIPv4 | 32, Group: netip.MustParsePrefix("192.0.2.7/32"), Dropped: 2 * limitedSample,
				First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(later))}}},
		{"a /24 of many sources", false, false,
			append(burst(40, t0, drawSkip, func(i int) netip.AddrPort {
				return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), uint16(30000+i))
			}), packet{v4("198.51.100.250:1234"), t0, drawRecord}),
			[]GroupRate{{Node: nodeTagIPv4 | 24, Group: netip.MustParsePrefix("198.51.100.0/24"), Dropped: limitedSample,
				First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(t0))}}},
		{"one source port from everywhere", false, false,
			burst(41, t0, drawRecord, func(i int) netip.AddrPort {
				return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 1}), 23456)
			})[:41],
			nil}, // filled below: the port node refuses from the 30th packet on
		{"an IPv6 address", false, false,
			append(burst(40, t0, drawSkip, one("[fd00:1:2:3::7]:5353")), packet{v4("[fd00:1:2:3::7]:5353"), t0, drawRecord}),
			[]GroupRate{{Node: nodeTagIPv6 | 128, Group: netip.MustParsePrefix("fd00:1:2:3::7/128"), Dropped: limitedSample,
				First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(t0))}}},
		{"an IPv6 address behind a destination options header", false, true,
			append(burst(40, t0, drawSkip, one("[fd00:1:2:3::7]:5353")), packet{v4("[fd00:1:2:3::7]:5353"), t0, drawRecord}),
			[]GroupRate{{Node: nodeTagIPv6 | 128, Group: netip.MustParsePrefix("fd00:1:2:3::7/128"), Dropped: limitedSample,
				First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(t0))}}},
		{"report-only records what it would drop", true, false,
			append(burst(40, t0, drawSkip, one("192.0.2.8:40000")), packet{v4("192.0.2.8:40000"), t0, drawRecord}),
			[]GroupRate{{Node: nodeTagIPv4 | 32, Group: netip.MustParsePrefix("192.0.2.8/32"), Dropped: limitedSample,
				First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(t0))}}},
		{"drops the sample skips", false, false, burst(60, t0, drawSkip, one("192.0.2.9:40000")), nil},
		{"a source within its limit", false, false, burst(20, t0, drawRecord, one("192.0.2.10:40000")), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := loadTestObjects(t)
			cfg := NewConfig()
			for _, kv := range [][2]string{{"requests-per-second", "100"}, {"report-only", map[bool]string{true: "true", false: "false"}[tc.reportOnly]}} {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			if err := objs.settingsMaps().apply(cfg, 42, nil); err != nil {
				t.Fatal(err)
			}
			r := testRun{t, objs, tc.destOpts}
			recorded := uint64(0)
			for _, p := range tc.packets {
				if !r.send(p.src, p.at, p.rnd) && p.rnd == drawRecord {
					recorded++
				}
			}
			want := tc.want
			if tc.name == "one source port from everywhere" {
				// Each source is new and its /32, /24 and /16 stay light: only the
				// port node refuses, and every drop was drawn to be recorded.
				if recorded == 0 {
					t.Fatal("the port flood was never refused")
				}
				want = []GroupRate{{Node: NodePort, Group: netip.MustParsePrefix("0.0.0.0/0"), Port: 23456,
					Dropped: recorded * limitedSample, First: time.Unix(0, int64(t0)), Last: time.Unix(0, int64(t0))}}
			}
			// Read at the last packet's time; kernel time is taken as Unix time.
			now := tc.packets[len(tc.packets)-1].at
			got := r.groupsAt(now, time.Unix(0, int64(now)))
			if len(got) != len(want) {
				t.Fatalf("LimitedGroups = %+v, want %d groups %+v", got, len(want), want)
			}
			for i, g := range got {
				w := want[i]
				if g.Node != w.Node || g.Group != w.Group || g.Port != w.Port || g.Dropped != w.Dropped || !g.First.Equal(w.First) || !g.Last.Equal(w.Last) {
					t.Errorf("group %d = %+v, want %+v", i, g, w)
				}
				// The rate is the node's estimate for the group, over its limit.
				if g.Limit != 100 || g.Rate < g.Limit {
					t.Errorf("group %v: rate %.1f limit %.1f, want limit 100 and the rate above it", g.Group, g.Rate, g.Limit)
				}
			}
			st, err := r.filter().Stats()
			if err != nil {
				t.Fatal(err)
			}
			// Every case but the light source has the limiter refuse packets,
			// recorded or not.
			if light := tc.name == "a source within its limit"; (sumLimited(st) == 0) != light {
				t.Errorf("limited %d packets: %+v", sumLimited(st), st)
			}
			if tc.reportOnly {
				if st.Passed != st.Seen || st.ReportOnly == 0 {
					t.Errorf("report-only stats %+v: want everything passed", st)
				}
			}
			// A group whose last recorded drop is older than limitedFresh is no
			// longer limited.
			stale := now + uint64(limitedFresh) + 1
			if g := r.groupsAt(stale, time.Unix(0, int64(stale))); len(g) != 0 {
				t.Errorf("%v later: %+v, want no group", limitedFresh, g)
			}
		})
	}
}

// TestKernelLimitedGroupsBounded: a flood of distinct sources, every one of them
// refused and recorded, leaves at most LIMITED_GROUPS entries, the latest ones.
func TestKernelLimitedGroupsBounded(t *testing.T) {
	objs := loadTestObjects(t)
	cfg := NewConfig()
	// At 1 per second a source's first packet is already over its limit.
	if err := cfg.SetValue("requests-per-second", "1"); err != nil {
		t.Fatal(err)
	}
	if err := objs.settingsMaps().apply(cfg, 7, nil); err != nil {
		t.Fatal(err)
	}
	if objs.Limited.MaxEntries() != limitedGroupsMax {
		t.Fatalf("rrl_limited holds %d entries, limitedGroupsMax is %d", objs.Limited.MaxEntries(), limitedGroupsMax)
	}
	r := testRun{t: t, objs: objs}
	const sources = 3 * limitedGroupsMax
	now := uint64(5_000_000_000)
	var last netip.AddrPort
	dropped := 0
	for i := range sources {
		last = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 40000)
		if !r.send(last, now, drawRecord) {
			dropped++
		}
	}
	if dropped < sources*9/10 {
		t.Fatalf("only %d of %d sources were refused", dropped, sources)
	}
	recs, err := readLimited(objs.Limited)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) > limitedGroupsMax || len(recs) < limitedGroupsMax/2 {
		t.Fatalf("%d entries after %d limited groups, want at most %d (and not nearly empty)", len(recs), dropped, limitedGroupsMax)
	}
	groups := r.groupsAt(now, time.Unix(0, int64(now)))
	if len(groups) != len(recs) {
		t.Fatalf("LimitedGroups lists %d groups, the map holds %d", len(groups), len(recs))
	}
	found := false
	for _, g := range groups {
		found = found || g.Group == netip.PrefixFrom(last.Addr(), 32)
	}
	if !found {
		t.Errorf("the latest limited source %v is not listed", last.Addr())
	}
	t.Logf("%d sources refused, %d groups kept", dropped, len(recs))
}

// TestLimitedConstantsMatchProgram: the sampling rate and capacity LimitedGroups
// assumes are those the programs' header bpf/limited.h declares.
func TestLimitedConstantsMatchProgram(t *testing.T) {
	src, err := os.ReadFile("bpf/limited.h")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"LIMITED_SAMPLE": limitedSample, "LIMITED_GROUPS": limitedGroupsMax} {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)$`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("bpf/limited.h: no #define %s", name)
		}
		if v, _ := strconv.Atoi(string(m[1])); v != want {
			t.Errorf("bpf/limited.h %s %d, Go %d", name, v, want)
		}
	}
}
