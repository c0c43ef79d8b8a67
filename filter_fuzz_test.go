package rrl

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// FuzzFilterPackets feeds arbitrary bytes to the kernel program as IPv4 or IPv6
// packets (BPF_PROG_TEST_RUN) and checks its accounting: every packet is either
// passed whole or dropped for exactly one counted reason (what it cannot follow to
// a UDP header in NotDNS), and none passes unjudged.
func FuzzFilterPackets(f *testing.F) {
	src := netip.MustParseAddrPort("192.0.2.7:40000")
	dst := netip.MustParseAddrPort("192.0.2.1:53")
	src6 := netip.MustParseAddrPort("[2001:db8::7]:40000")
	dst6 := netip.MustParseAddrPort("[2001:db8::1]:53")
	f.Add(false, ipv4Packet(src, dst, nil, dnsQuery(1, false)))
	f.Add(false, ipv4Packet(src, dst, []byte{1, 1, 1, 0}, dnsQuery(1, true)))
	f.Add(false, ipv4Packet(src, dst, nil, dnsQuery(1, false)[:5]))
	f.Add(false, ipv4Packet(src, dst, nil, nil)[:24])
	f.Add(true, ipv6Packet(src6, dst6, true, dnsQuery(2, false)))
	f.Add(true, ipv6Packet(src6, dst6, false, qr(dnsQuery(2, false))))
	f.Add(true, []byte{0x60, 0, 0, 0, 0, 8, 60, 64})
	f.Add(false, []byte{0x4f})
	objs := loadTestObjects(f)
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "1")
	if err := objs.settingsMaps().apply(cfg, 1, nil); err != nil {
		f.Fatal(err)
	}
	counters := &Filter{objs: &kernelObjects{Counters: objs.Counters, Settings: objs.Settings}, mode: ModeEBPF, cfg: cfg}
	f.Fuzz(func(t *testing.T, v6 bool, pkt []byte) {
		before, err := counters.Stats()
		if err != nil {
			t.Fatal(err)
		}
		proto := uint16(unix.ETH_P_IP)
		if v6 {
			proto = unix.ETH_P_IPV6
		}
		// BPF_PROG_TEST_RUN refuses anything shorter than the IP header its
		// protocol promises (and the kernel never delivers such a packet to a socket),
		// and anything larger than a page.
		pkt = pkt[:min(len(pkt), 1500)]
		if need := map[bool]int{false: 20, true: 40}[v6]; len(pkt) < need {
			pkt = append(pkt, make([]byte, need-len(pkt))...)
		}
		frame := ethFrame(proto, pkt)
		if err := objs.TestInput.Put(uint32(0), &filterTestInput{Now: 1e9, Rnd: 0x80000000}); err != nil {
			t.Fatal(err)
		}
		ret, err := objs.FilterTest.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatalf("test run: %v", err)
		}
		after, err := counters.Stats()
		if err != nil {
			t.Fatal(err)
		}
		st := statsDelta(after, before)
		dropped := st.NotDNS + st.DroppedShort + st.DroppedResponse + st.DroppedReflection + sumLimited(st)
		if st.Seen != 1 || st.Passed+dropped != 1 {
			t.Fatalf("packet %x: counters %+v do not account for it exactly once", pkt, st)
		}
		if (ret == 0) != (dropped == 1) {
			t.Fatalf("packet %x: returned %d but counters %+v", pkt, ret, st)
		}
		if ret != 0 && ret != uint32(len(frame)-14) {
			t.Fatalf("packet %x: passed %d bytes of %d: a pass keeps the whole packet", pkt, ret, len(frame)-14)
		}
	})
}

// statsDelta returns what the counters of b counted since a.
func statsDelta(b, a FilterStats) FilterStats {
	d := FilterStats{
		Seen: b.Seen - a.Seen, Passed: b.Passed - a.Passed, NotDNS: b.NotDNS - a.NotDNS,
		DroppedShort: b.DroppedShort - a.DroppedShort, DroppedResponse: b.DroppedResponse - a.DroppedResponse,
		DroppedReflection: b.DroppedReflection - a.DroppedReflection, Exempt: b.Exempt - a.Exempt,
		ReportOnly: b.ReportOnly - a.ReportOnly, Errors: b.Errors - a.Errors,
	}
	for i, n := range b.Nodes {
		if i < len(a.Nodes) {
			n.Limited -= a.Nodes[i].Limited
		}
		d.Nodes = append(d.Nodes, n)
	}
	return d
}
