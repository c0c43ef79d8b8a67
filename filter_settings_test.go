package rrl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// configOf returns NewConfig with the keyword=value pairs kv applied.
func configOf(t testing.TB, kv ...string) *Config {
	t.Helper()
	cfg := NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// sendQueries sends n queries from src to dst through raw and waits until f has
// judged them all; it returns f's stats before and after.
func sendQueries(t *testing.T, f *Filter, raw *rawSender, src, dst netip.AddrPort, n int) (before, after FilterStats) {
	t.Helper()
	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		raw.send(t, ipv4Packet(src, dst, nil, dnsQuery(uint16(i), false)))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if after, err = f.Stats(); err != nil {
			t.Fatal(err)
		}
		if after.Seen >= before.Seen+uint64(n) || time.Now().After(deadline) {
			return before, after
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nodeLimited returns the Limited count of node in st, and whether st lists it.
func nodeLimited(st FilterStats, node string) (uint64, bool) {
	for _, n := range st.Nodes {
		if n.Node.String() == node {
			return n.Limited, true
		}
	}
	return 0, false
}

// TestUpdateAllOrNothing: an Update that fails, whether a check refuses the new
// Config or a map write fails half-way, leaves the filter running the old one: the
// settings in force, Config, and on real packets the old limit, not the new
// configuration's exemption and limits.
func TestUpdateAllOrNothing(t *testing.T) {
	requireBPF(t)
	var tooMany []string
	for i := range exemptPerSlot + 1 {
		tooMany = append(tooMany, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	// Every new Config would pass the flood: its source is exempt, the limit high.
	next := func(t *testing.T, exempt string) *Config {
		return configOf(t, "requests-per-second", "10000000", "exempt-clients", exempt)
	}
	cases := []struct {
		name  string
		next  func(t *testing.T) *Config
		spoil func(t *testing.T, f *Filter) // breaks a map before the Update
	}{
		{"too many IPv4 exempt prefixes", func(t *testing.T) *Config {
			return next(t, "127.0.0.0/8 "+strings.Join(tooMany, " "))
		}, nil},
		{"too many IPv6 exempt prefixes", func(t *testing.T) *Config {
			var six []string
			for i := range exemptPerSlot + 1 {
				six = append(six, fmt.Sprintf("fd00:%x:%x::/48", i/256, i%256))
			}
			return next(t, "127.0.0.0/8 "+strings.Join(six, " "))
		}, nil},
		{"invalid exempt prefix", func(t *testing.T) *Config {
			cfg := next(t, "127.0.0.0/8")
			cfg.exempt = append(cfg.exempt, netip.Prefix{})
			return cfg
		}, nil},
		{"too many request levels", func(t *testing.T) *Config {
			cfg := next(t, "127.0.0.0/8")
			cfg.ipv4Levels = []requestLevel{{32, 1}, {28, 1}, {24, 1}, {20, 1}, {16, 1}, {12, 1}}
			return cfg
		}, nil},
		{"IPv6 exempt write fails after the settings and IPv4 prefixes", func(t *testing.T) *Config {
			return next(t, "127.0.0.0/8 fd00::/8")
		}, func(t *testing.T, f *Filter) {
			// A frozen map refuses writes from user space.
			if err := f.objs.Exempt6.Freeze(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, f := attachLive(t, "20")
			old := f.Config()
			raw := newRawSender(t, srv.addr)
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 11, byte(1 + i)}), 40000)
			set0, hdr0, err := f.objs.settingsMaps().active(nil)
			if err != nil {
				t.Fatal(err)
			}
			if c.spoil != nil {
				c.spoil(t, f)
			}
			if err := f.Update(c.next(t)); err == nil {
				t.Fatal("Update succeeded")
			} else {
				t.Logf("Update: %v", err)
			}
			set1, hdr1, err := f.objs.settingsMaps().active(nil)
			if err != nil {
				t.Fatal(err)
			}
			if hdr1.Generation != hdr0.Generation || !reflect.DeepEqual(set0, set1) {
				t.Errorf("settings in force changed: generation %d to %d", hdr0.Generation, hdr1.Generation)
			}
			if !sameConfig(f.Config(), old) {
				t.Errorf("Config after the failed Update: %s, want %s", configText(f.Config()), configText(old))
			}
			before, after := sendQueries(t, f, raw, src, srv.addr, 300)
			l0, _ := nodeLimited(before, "ipv4/32")
			l1, _ := nodeLimited(after, "ipv4/32")
			limited := l1 - l0
			if after.Seen-before.Seen != 300 || limited < 200 || after.Exempt != before.Exempt {
				t.Errorf("300 queries at once from %v: %d judged, %d limited at ipv4/32, %d exempt; want the old limit of 20/s",
					src, after.Seen-before.Seen, limited, after.Exempt-before.Exempt)
			}
		})
	}
}

// slotConfigs are two Configs whose mix a packet would show. Under a, every IPv4
// query passes its /32 level (10,000,000 per second) and is dropped at its /24 (a
// hundred-thousandth of a query per second); under b, whose only IPv4 level is /32
// at that tiny limit, it is dropped at its /32. A packet that took its step count
// from one and its steps from the other, or a step's trip count from one and its
// limit from the other, passes: no query may pass under either.
func slotConfigs(t testing.TB) (a, b *Config) {
	a = configOf(t, "requests-per-second", "10000000", "source-port-factor", "0",
		"ipv4-prefix-length", "24", "ipv6-request-levels", "")
	a.ipv4Levels = []requestLevel{{32, 1}, {24, 1e-12}}
	b = configOf(t, "requests-per-second", "10000000", "source-port-factor", "0",
		"ipv4-prefix-length", "32", "ipv4-request-levels", "", "ipv6-request-levels", "",
		"exempt-clients", "10.99.0.0/16")
	b.ipv4Levels = []requestLevel{{32, 1e-12}}
	return a, b
}

// TestSettingsSlots runs the program under BPF_PROG_TEST_RUN while the slot not in
// force holds another configuration: packets are judged by the slot the header
// names, with that slot's exempt prefixes, and the flip alone switches them; a slot
// is written again only settingsGrace after it went out of force.
func TestSettingsSlots(t *testing.T) {
	objs := loadTestObjects(t)
	m := objs.settingsMaps()
	a, b := slotConfigs(t)
	if err := m.apply(a, 7, nil); err != nil {
		t.Fatal(err)
	}
	// b, and b's exempt prefixes, in the other slot without the flip: what an Update
	// has written when packets arrive before its flip.
	s := kernelSettings(b, 7)
	s.Slot = 1
	if err := objs.Settings.Put(uint32(2), s); err != nil {
		t.Fatal(err)
	}
	if err := replaceExempt(objs.Exempt4, objs.Exempt6, 1, b.exempt); err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort("127.0.0.1:53")
	judge := func(src string) (pass bool, st FilterStats) {
		t.Helper()
		pkt := ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort(src), dst, nil, dnsQuery(1, false)))
		if err := objs.TestInput.Put(uint32(0), &filterTestInput{Now: 1e9, Rnd: ^uint32(0)}); err != nil {
			t.Fatal(err)
		}
		ret, err := objs.FilterTest.Run(&ebpf.RunOptions{Data: pkt})
		if err != nil {
			t.Fatal(err)
		}
		f := &Filter{objs: &kernelObjects{Counters: objs.Counters, Settings: objs.Settings}, mode: ModeEBPF}
		st, err = f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return ret != 0, st
	}
	steps := []struct {
		name       string
		flip       bool // write the header to the other slot first
		src        string
		pass       bool
		wantNode   string // the node whose limited count went up
		wantExempt uint64 // the exempt count after the packet
	}{
		{"a in force: dropped at /24", false, "10.1.2.3:4000", false, "ipv4/24", 0},
		{"a in force: b's exempt prefix is not exempt", false, "10.99.1.1:4000", false, "ipv4/24", 0},
		{"flipped to b: dropped at /32", true, "10.1.2.3:4000", false, "ipv4/32", 0},
		{"b in force: its exempt prefix passes", false, "10.99.1.1:4000", true, "", 1},
	}
	var prev FilterStats
	gen := uint64(0)
	for _, step := range steps {
		if step.flip {
			h, err := m.header()
			if err != nil {
				t.Fatal(err)
			}
			gen = h.Generation + 1
			flip := filterSettings{LayoutVersion: layoutVersion, Slot: 1 - h.Slot, Generation: gen}
			if err := objs.Settings.Put(uint32(settingsHeaderKey), &flip); err != nil {
				t.Fatal(err)
			}
		}
		pass, st := judge(step.src)
		if pass != step.pass || st.Exempt != step.wantExempt {
			t.Errorf("%s: pass %v exempt %d, want %v %d", step.name, pass, st.Exempt, step.pass, step.wantExempt)
		}
		for _, n := range st.Nodes {
			was, _ := nodeLimited(prev, n.Node.String())
			if up := n.Limited > was; up != (n.Node.String() == step.wantNode) {
				t.Errorf("%s: %s limited %d, was %d", step.name, n.Node, n.Limited, was)
			}
		}
		if _, ok := nodeLimited(st, step.wantNode); step.wantNode != "" && !ok {
			t.Errorf("%s: no %s in %+v", step.name, step.wantNode, st.Nodes)
		}
		prev = st
	}

	// Updates in a row: each writes the slot that went out of force at the previous
	// flip, not before settingsGrace has passed since.
	var flips []uint64
	for _, cfg := range []*Config{a, b, a} {
		if err := m.apply(cfg, 7, nil); err != nil {
			t.Fatal(err)
		}
		h, err := m.header()
		if err != nil {
			t.Fatal(err)
		}
		flips = append(flips, h.FlippedNs)
	}
	for i := 1; i < len(flips); i++ {
		if d := time.Duration(flips[i] - flips[i-1]); d < settingsGrace {
			t.Errorf("flip %d came %v after the one before, within the grace period %v", i, d, settingsGrace)
		}
	}
	// The exempt tries hold each slot's prefixes, and only its current ones: after
	// a, b, a slot 0 is in force with a's (none), slot 1 keeps b's until it is
	// written again.
	if h, err := m.header(); err != nil || h.Slot != 0 {
		t.Fatalf("after a, b, a the header names slot %d (%v)", h.Slot, err)
	}
	perSlot := [2]int{}
	var k filterExempt4Key
	var v uint8
	for it := objs.Exempt4.Iterate(); it.Next(&k, &v); {
		perSlot[k.Slot&1]++
	}
	if perSlot != [2]int{0, 1} {
		t.Errorf("IPv4 exempt entries per slot %v, want [0 1]", perSlot)
	}
}

// TestUpdateAtomicForPacketsInFlight floods a real socket while Update switches the
// filter between the two slotConfigs as fast as it can: every query is dropped, at
// the level of one configuration or the other, and none passes as a mix of both
// would. The per-level counters Stats reports never go down meanwhile.
func TestUpdateAtomicForPacketsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	a, b := slotConfigs(t)
	f, err := Attach(srv.conn, a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw := newRawSender(t, srv.addr)

	const sendFor = 1500 * time.Millisecond
	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pkts := make([][]byte, 256)
		for i := range pkts {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 12, byte(i)}), uint16(20000+i))
			pkts[i] = ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false))
		}
		for i := 0; i < 2_000_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := raw.Send(pkts[i%len(pkts)]); err != nil {
				t.Errorf("send: %v", err)
				return
			}
			sent.Add(1)
		}
	}()
	updates := 0
	last := map[LimiterNode]uint64{}
	deadline := time.Now().Add(sendFor)
	for cfg := b; time.Now().Before(deadline); updates++ {
		if err := f.Update(cfg); err != nil {
			t.Fatal(err)
		}
		cfg = map[bool]*Config{true: a, false: b}[cfg == b]
		st, err := f.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for n, v := range last {
			got, ok := nodeLimited(st, n.String())
			if !ok || got < v {
				t.Fatalf("after update %d: %s limited %d (listed %v), was %d", updates, n, got, ok, v)
			}
		}
		for _, n := range st.Nodes {
			last[n.Node] = n.Limited
		}
	}
	close(stop)
	wg.Wait()
	got := srv.collect(time.Now(), nil, 200*time.Millisecond, 3*time.Second)
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	l24, _ := nodeLimited(st, "ipv4/24")
	l32, _ := nodeLimited(st, "ipv4/32")
	t.Logf("%d updates, %d queries sent: %d judged, %d limited at /24 (a), %d at /32 (b), %d passed, %d read",
		updates, sent.Load(), st.Seen, l24, l32, st.Passed, len(got))
	if updates < 20 || l24 == 0 || l32 == 0 {
		t.Fatalf("the flood did not meet both configurations: %d updates, %d and %d limited", updates, l24, l32)
	}
	if st.Passed != 0 || len(got) != 0 || st.Errors != 0 || l24+l32 != st.Seen {
		t.Errorf("%d queries passed and %d were read, %d errors; %d judged, %d limited: a packet was judged by a mix of two configurations",
			st.Passed, len(got), st.Errors, st.Seen, l24+l32)
	}
}

// TestPinnedStatsFollowUpdate: a server attached to pins and a tool that changes
// the limits through the same pins (as rrlctl set does). The server's Config, Stats
// and collector follow the change: each level's drops stay under that level's name,
// and no counter goes down.
func TestPinnedStatsFollowUpdate(t *testing.T) {
	e := newPinEnv(t)
	dir := e.mnt + "/rrl"
	loadPinnedForTest(t, dir, "20", -1, -1)
	t.Cleanup(func() { Unpin(dir) })
	srv, server := attachPinnedServer(t, dir)
	tool, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tool.Close()
	raw := newRawSender(t, srv.addr)
	src := netip.MustParseAddrPort("127.0.13.1:40000")

	// Defaults: levels /32, /24 (the client network) and /16; the flood of one
	// address is limited at /32.
	_, st1 := sendQueries(t, server, raw, src, srv.addr, 300)
	l32, ok := nodeLimited(st1, "ipv4/32")
	if !ok || l32 < 200 {
		t.Fatalf("flood before the change: %+v", st1.Nodes)
	}

	// rrlctl set ipv4-request-levels "32:0 16:16": the /32 level goes, /24 judges
	// first and takes over the node /32 had.
	cfg := tool.Config()
	if err := cfg.SetValue("ipv4-request-levels", "32:0 16:16"); err != nil {
		t.Fatal(err)
	}
	if err := tool.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := server.Config(); !sameConfig(got, cfg) {
		t.Errorf("server's Config after the tool's Update: %s, want %s", configText(got), configText(cfg))
	}
	st2, err := server.Stats()
	if err != nil {
		t.Fatal(err)
	}
	checkMonotonic(t, st1, st2)
	if n, ok := nodeLimited(st2, "ipv4/32"); !ok || n != l32 {
		t.Errorf("ipv4/32 after the change: %d (listed %v), want its %d drops kept", n, ok, l32)
	}
	for _, n := range st2.Nodes {
		switch n.Node.String() {
		case "ipv4/32":
			if n.Limit != 0 {
				t.Errorf("ipv4/32 is out of force but reports limit %v", n.Limit)
			}
		case "ipv4/24":
			if n.Limit != 20 {
				t.Errorf("ipv4/24 limit %v, want 20", n.Limit)
			}
		}
	}

	// A second flood from a fresh /24 is now limited at /24, and counted there.
	_, st3 := sendQueries(t, server, raw, netip.MustParseAddrPort("127.0.14.1:40000"), srv.addr, 300)
	checkMonotonic(t, st2, st3)
	l24a, _ := nodeLimited(st2, "ipv4/24")
	l24b, _ := nodeLimited(st3, "ipv4/24")
	if n, _ := nodeLimited(st3, "ipv4/32"); n != l32 {
		t.Errorf("ipv4/32, out of force, counted %d more drops", n-l32)
	}
	if l24b-l24a < 200 {
		t.Errorf("ipv4/24 counted %d of 300 queries from one address at 20/s", l24b-l24a)
	}
	// A fresh Stats, which the collector (package rrlprom, whose tests check that it
	// reports Stats as they are) reads at each scrape, says the same.
	st4, err := server.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]float64{"ipv4/32": {float64(l32), 0}, "ipv4/24": {float64(l24b), 20}}
	for _, n := range st4.Nodes {
		if w, ok := want[n.Node.String()]; ok {
			if float64(n.Limited) < w[0] || n.Limit != w[1] {
				t.Errorf("%s: limited %d, limit %v; want at least %v, %v", n.Node, n.Limited, n.Limit, w[0], w[1])
			}
			delete(want, n.Node.String())
		}
	}
	if len(want) != 0 {
		t.Errorf("Stats lacks %v", want)
	}
}

// checkMonotonic fails t if a level listed in a is missing from b or counts less.
func checkMonotonic(t *testing.T, a, b FilterStats) {
	t.Helper()
	for _, n := range a.Nodes {
		got, ok := nodeLimited(b, n.Node.String())
		if !ok || got < n.Limited {
			t.Errorf("%s limited went from %d to %d (listed %v)", n.Node, n.Limited, got, ok)
		}
	}
}

// TestLimitedCounters: every node has a limited counter of its own, and the
// counter names its node back.
func TestLimitedCounters(t *testing.T) {
	nodes := []LimiterNode{NodePort, NodeTotal}
	for p := range 33 {
		nodes = append(nodes, nodeTagIPv4|LimiterNode(p))
	}
	for p := range 129 {
		nodes = append(nodes, nodeTagIPv6|LimiterNode(p))
	}
	seen := map[uint32]LimiterNode{}
	for _, n := range nodes {
		i := limitedCounter(n)
		if i >= numLimited {
			t.Errorf("%s: counter %d out of %d", n, i, numLimited)
		}
		if o, dup := seen[i]; dup {
			t.Errorf("%s and %s share counter %d", n, o, i)
		}
		seen[i] = n
		if back := limitedNode(i); back != n {
			t.Errorf("%s: counter %d names %s", n, i, back)
		}
	}
	if len(seen) != numLimited {
		t.Errorf("%d counters used of %d", len(seen), numLimited)
	}
}

// TestLimiterNodeText: nodes are written and read by their String form, in JSON too.
func TestLimiterNodeText(t *testing.T) {
	for _, c := range []struct {
		text string
		node LimiterNode
		bad  bool
	}{
		{"ipv4/24", nodeTagIPv4 | 24, false},
		{"ipv4/0", nodeTagIPv4, false},
		{"ipv6/128", nodeTagIPv6 | 128, false},
		{"port", NodePort, false},
		{"total", NodeTotal, false},
		{"none", NodeNone, false},
		{"ipv4/33", 0, true},
		{"ipv6/129", 0, true},
		{"ipv4/024", 0, true},
		{"ipv4/+1", 0, true},
		{"ipv4/", 0, true},
		{"IPv4/24", 0, true},
		{"", 0, true},
	} {
		var n LimiterNode
		err := n.UnmarshalText([]byte(c.text))
		if (err != nil) != c.bad || !c.bad && n != c.node {
			t.Errorf("%q: %v, %v", c.text, n, err)
		}
		if c.bad {
			continue
		}
		b, err := json.Marshal(GroupRate{Node: c.node})
		if err != nil {
			t.Fatal(err)
		}
		var back GroupRate
		if err := json.Unmarshal(b, &back); err != nil || back.Node != c.node || !strings.Contains(string(b), `"node":"`+c.text+`"`) {
			t.Errorf("%s: JSON %s read back as %v, %v", c.node, b, back.Node, err)
		}
	}
}

// TestApplyNoticesConcurrentFlip: when the header moved while apply wrote its slot
// (another process updating the same pins), apply fails and does not flip over the
// other writer's configuration.
func TestApplyNoticesConcurrentFlip(t *testing.T) {
	objs := loadTestObjects(t)
	m := objs.settingsMaps()
	a, b := slotConfigs(t)
	if err := m.apply(a, 7, nil); err != nil {
		t.Fatal(err)
	}
	var theirs *filterSettings
	err := m.apply(b, 7, func(slot uint8) error {
		// The other process flips to the slot this one is writing.
		h, err := m.header()
		if err != nil {
			return err
		}
		theirs = &filterSettings{LayoutVersion: layoutVersion, Slot: slot, Generation: h.Generation + 1, FlippedNs: uint64(monotonicNow())}
		return objs.Settings.Put(uint32(settingsHeaderKey), theirs)
	})
	if !errors.Is(err, errConcurrentUpdate) {
		t.Fatalf("apply over a concurrent flip: %v, want errConcurrentUpdate", err)
	}
	if h, err := m.header(); err != nil || !reflect.DeepEqual(h, theirs) {
		t.Errorf("header %+v (%v), want the other writer's %+v", h, err, theirs)
	}
}
