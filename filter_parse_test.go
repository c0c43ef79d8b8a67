package rrl

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The packet parser, kernel ≡ Go model: the program and parseModel sort every
// packet into the same verdict class. The model follows filter_bpf.c's parse and the
// stateless checks before the request limiter; the tests run packets through the
// program with BPF_PROG_TEST_RUN, where the data starts at the IP header, and read the
// class from the counters the packet moved.

// parseClass is what the filter does with a packet before any rate is looked at.
type parseClass int

const (
	classUnfollowed parseClass = iota // headers it cannot follow to UDP: dropped (NotDNS)
	classShort                        // DroppedShort
	classResponse                     // DroppedResponse
	classReflection                   // DroppedReflection
	classExempt                       // passed, not counted (Exempt)
	classJudged                       // judged by the request limiter
)

func (c parseClass) String() string {
	return [...]string{"unfollowed", "short", "response", "reflection", "exempt", "judged"}[c]
}

// IPv6 extension headers the program walks, and how many (MAX_IPV6_EXT_HEADERS).
const maxIPv6ExtHeaders = 6

// parseModel is the Go model of the program's parse and stateless checks for pkt,
// an IPv4 (v6 false) or IPv6 packet from its IP header on, under cfg's reflection
// ports and exempt clients.
func parseModel(cfg *Config, v6 bool, pkt []byte) parseClass {
	var off int
	var src netip.Addr
	if !v6 {
		if len(pkt) < 20 {
			return classUnfollowed
		}
		if pkt[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(pkt[6:])&0x1fff != 0 {
			return classUnfollowed // not UDP, or a later fragment
		}
		if off = int(pkt[0]&0x0f) * 4; off < 20 {
			return classUnfollowed
		}
		src = netip.AddrFrom4([4]byte(pkt[12:16]))
	} else {
		if len(pkt) < 40 {
			return classUnfollowed
		}
		next := pkt[6]
		off = 40
		for range maxIPv6ExtHeaders {
			switch next {
			case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS, unix.IPPROTO_FRAGMENT, unix.IPPROTO_AH:
			default:
				goto walked
			}
			if off+8 > len(pkt) {
				return classUnfollowed
			}
			e := pkt[off:]
			switch next {
			case unix.IPPROTO_FRAGMENT:
				if binary.BigEndian.Uint16(e[2:])&0xfff8 != 0 {
					return classUnfollowed // a later fragment
				}
				off += 8
			case unix.IPPROTO_AH:
				off += (int(e[1]) + 2) * 4
			default:
				off += (int(e[1]) + 1) * 8
			}
			next = e[0]
		}
	walked:
		if next != unix.IPPROTO_UDP {
			return classUnfollowed // more headers than walked, or not UDP
		}
		src = netip.AddrFrom16([16]byte(pkt[8:24])).Unmap()
	}
	if off+8 > len(pkt) {
		return classUnfollowed
	}
	sport := binary.BigEndian.Uint16(pkt[off:])
	dnsLen := max(int(binary.BigEndian.Uint16(pkt[off+4:]))-8, 0)
	dns := off + 8
	var flags byte
	switch {
	case dnsLen >= 12:
		if dns+12 > len(pkt) {
			return classUnfollowed
		}
		flags = pkt[dns+2]
	case dnsLen >= 3:
		if dns+3 > len(pkt) {
			return classUnfollowed
		}
		flags = pkt[dns+2]
	}
	switch {
	case dnsLen < 17:
		return classShort
	case flags&0x80 != 0:
		return classResponse
	case slices.Contains(cfg.reflectionPorts, sport):
		return classReflection
	case slices.ContainsFunc(cfg.exempt, func(p netip.Prefix) bool { return p.Contains(src) }):
		return classExempt
	}
	return classJudged
}

// parseRig runs packets through the test program with settings under which nothing
// is limited, so that a judged packet passes.
type parseRig struct {
	objs  *testObjects
	cfg   *Config
	stats *Filter
}

func newParseRig(t testing.TB) *parseRig {
	t.Helper()
	objs := loadTestObjects(t)
	cfg := NewConfig()
	for _, kv := range [][2]string{{"requests-per-second", "0"}, {"exempt-clients", "192.0.2.128/25 2001:db8:0:8000::/49"}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := objs.settingsMaps().apply(cfg, 1, nil); err != nil {
		t.Fatal(err)
	}
	f := &Filter{objs: &kernelObjects{Counters: objs.Counters, Settings: objs.Settings}, mode: ModeEBPF, cfg: cfg}
	return &parseRig{objs: objs, cfg: cfg, stats: f}
}

// run returns the class the program sorted pkt into, and whether it passed it.
func (r *parseRig) run(t testing.TB, v6 bool, pkt []byte) (parseClass, bool) {
	t.Helper()
	before, err := r.stats.Stats()
	if err != nil {
		t.Fatal(err)
	}
	proto := uint16(unix.ETH_P_IP)
	if v6 {
		proto = unix.ETH_P_IPV6
	}
	if err := r.objs.TestInput.Put(uint32(0), &filterTestInput{Now: 1e9}); err != nil {
		t.Fatal(err)
	}
	ret, err := r.objs.FilterTest.Run(&ebpf.RunOptions{Data: ethFrame(proto, pkt)})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	after, err := r.stats.Stats()
	if err != nil {
		t.Fatal(err)
	}
	d := statsDelta(after, before)
	var got []parseClass
	for _, c := range []struct {
		n     uint64
		class parseClass
	}{{d.NotDNS, classUnfollowed}, {d.DroppedShort, classShort}, {d.DroppedResponse, classResponse},
		{d.DroppedReflection, classReflection}, {d.Exempt, classExempt}} {
		if c.n != 0 {
			got = append(got, c.class)
		}
	}
	if d.Seen != 1 || len(got) > 1 {
		t.Fatalf("packet %x: counters %+v", pkt, d)
	}
	if d.Errors != 0 {
		t.Errorf("packet %x: an internal error: counters %+v", pkt, d)
	}
	if len(got) == 0 {
		return classJudged, ret != 0
	}
	return got[0], ret != 0
}

// check fails t unless the program and the model agree on pkt, and the program
// passes exactly the exempt and judged packets (nothing is limited here).
func (r *parseRig) check(t testing.TB, name string, v6 bool, pkt []byte) parseClass {
	t.Helper()
	got, pass := r.run(t, v6, pkt)
	want := parseModel(r.cfg, v6, pkt)
	if got != want {
		t.Errorf("%s: kernel %v, model %v; packet %x", name, got, want, pkt)
	}
	if pass != (got == classJudged || got == classExempt) {
		t.Errorf("%s: class %v, passed %v", name, got, pass)
	}
	return got
}

// extChain returns an IPv6 datagram from src to dst whose UDP header follows the
// extension headers types (each of the smallest size for its kind), with payload.
func extChain(src, dst netip.AddrPort, types []byte, payload []byte) []byte {
	plain := ipv6Packet(src, dst, false, payload)
	var ext []byte
	for i, typ := range types {
		next := byte(unix.IPPROTO_UDP)
		if i+1 < len(types) {
			next = types[i+1]
		}
		h := make([]byte, 8)
		h[0] = next
		switch typ {
		case unix.IPPROTO_AH:
			h = make([]byte, 12) // (1 + 2) * 4 bytes
			h[0], h[1] = next, 1
		case unix.IPPROTO_FRAGMENT: // the first and only fragment: offset 0, M clear
		default:
			h[2], h[3] = 1, 4 // PadN of 4 bytes
		}
		ext = append(ext, h...)
	}
	if len(types) == 0 {
		return plain
	}
	b := append(append(append([]byte(nil), plain[:40]...), ext...), plain[40:]...)
	b[6] = types[0]
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)-40))
	return b
}

// parserCorpus is the hand-made corpus: every case the issue lists, beside plain
// queries of both families.
func parserCorpus() []struct {
	name string
	v6   bool
	pkt  []byte
} {
	src4 := netip.MustParseAddrPort("198.51.100.7:40000")
	ex4 := netip.MustParseAddrPort("192.0.2.200:40000")
	dst4 := netip.MustParseAddrPort("198.51.100.1:53")
	src6 := netip.MustParseAddrPort("[2001:db8::7]:40000")
	ex6 := netip.MustParseAddrPort("[2001:db8:0:8001::7]:40000")
	mapped := netip.MustParseAddrPort("[::ffff:192.0.2.201]:40000")
	dst6 := netip.MustParseAddrPort("[2001:db8::1]:53")
	q := dnsQuery(1, false)
	type c = struct {
		name string
		v6   bool
		pkt  []byte
	}
	cases := []c{
		{"IPv4 query", false, ipv4Packet(src4, dst4, nil, q)},
		{"IPv4 exempt", false, ipv4Packet(ex4, dst4, nil, q)},
		{"IPv4 response", false, ipv4Packet(src4, dst4, nil, qr(q))},
		{"IPv4 from NTP", false, ipv4Packet(netip.MustParseAddrPort("198.51.100.7:123"), dst4, nil, q)},
		{"IPv6 query", true, ipv6Packet(src6, dst6, false, q)},
		{"IPv6 exempt", true, ipv6Packet(ex6, dst6, false, q)},
		{"IPv6 mapped exempt", true, ipv6Packet(mapped, dst6, false, q)},
		{"IPv6 response from NTP", true, ipv6Packet(netip.MustParseAddrPort("[2001:db8::7]:123"), dst6, false, qr(q))},
	}
	// IPv4 options of every length, and an IHL below 5.
	for words := 0; words <= 10; words++ {
		opts := make([]byte, 4*words)
		for i := range opts {
			opts[i] = 1 // NOP
		}
		cases = append(cases, c{fmt.Sprintf("IPv4 %d option words", words), false, ipv4Packet(src4, dst4, opts, q)})
	}
	for ihl := range 5 {
		p := ipv4Packet(src4, dst4, nil, q)
		p[0] = 0x40 | byte(ihl)
		cases = append(cases, c{fmt.Sprintf("IPv4 IHL %d", ihl), false, p})
	}
	// IPv4 fragments: the first carries the UDP header, later ones do not.
	for _, frag := range []uint16{0x2000, 0x0001, 0x2001, 0x1fff, 0x4000} {
		p := ipv4Packet(src4, dst4, nil, q)
		binary.BigEndian.PutUint16(p[6:], frag)
		cases = append(cases, c{fmt.Sprintf("IPv4 flags/offset %#x", frag), false, p})
	}
	for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_ICMP, 0, 255} {
		p := ipv4Packet(src4, dst4, nil, q)
		p[9] = proto
		cases = append(cases, c{fmt.Sprintf("IPv4 protocol %d", proto), false, p})
	}
	// IPv6 extension header chains of every length up to and past the walk, of
	// each kind and mixed.
	kinds := []byte{unix.IPPROTO_DSTOPTS, unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_FRAGMENT, unix.IPPROTO_AH}
	for n := 0; n <= maxIPv6ExtHeaders+3; n++ {
		for _, k := range kinds {
			types := slices.Repeat([]byte{k}, n)
			cases = append(cases, c{fmt.Sprintf("IPv6 %d headers %d", n, k), true, extChain(src6, dst6, types, q)})
			cases = append(cases, c{fmt.Sprintf("IPv6 %d headers %d, response", n, k), true, extChain(src6, dst6, types, qr(q))})
		}
		mixed := make([]byte, n)
		for i := range mixed {
			mixed[i] = kinds[i%len(kinds)]
		}
		cases = append(cases, c{fmt.Sprintf("IPv6 %d mixed headers", n), true, extChain(src6, dst6, mixed, q)})
		cases = append(cases, c{fmt.Sprintf("IPv6 %d headers, exempt", n), true, extChain(ex6, dst6, mixed, q)})
	}
	// IPv6 fragments, and upper layers other than UDP behind a header.
	for _, fo := range []uint16{0x0001, 0x0008, 0x0009, 0xfff8} {
		p := extChain(src6, dst6, []byte{unix.IPPROTO_FRAGMENT}, q)
		binary.BigEndian.PutUint16(p[42:], fo)
		cases = append(cases, c{fmt.Sprintf("IPv6 fragment offset field %#x", fo), true, p})
	}
	for _, next := range []byte{unix.IPPROTO_TCP, 59, 135, 139, 140, unix.IPPROTO_ESP} {
		p := extChain(src6, dst6, []byte{unix.IPPROTO_DSTOPTS}, q)
		p[40] = next
		cases = append(cases, c{fmt.Sprintf("IPv6 next header %d", next), true, p})
		p = ipv6Packet(src6, dst6, false, q)
		p[6] = next
		cases = append(cases, c{fmt.Sprintf("IPv6 first next header %d", next), true, p})
	}
	// A header cut short: the chain runs past the packet.
	long := extChain(src6, dst6, []byte{unix.IPPROTO_DSTOPTS}, q)
	long[41] = 200
	cases = append(cases, c{"IPv6 header longer than the packet", true, long})
	// UDP lengths that disagree with the IP length.
	for _, ulen := range []int{0, 1, 7, 8, 9, 20, 24, 25, 26, 100, 65535} {
		p4 := ipv4Packet(src4, dst4, nil, q)
		binary.BigEndian.PutUint16(p4[24:], uint16(ulen))
		p6 := ipv6Packet(src6, dst6, false, q)
		binary.BigEndian.PutUint16(p6[44:], uint16(ulen))
		cases = append(cases, c{fmt.Sprintf("IPv4 UDP length %d", ulen), false, p4},
			c{fmt.Sprintf("IPv6 UDP length %d", ulen), true, p6})
	}
	// DNS headers cut at every byte, with the UDP length saying so or not.
	for n := 0; n <= len(q); n++ {
		for _, r := range []bool{false, true} {
			m := q
			if r {
				m = qr(q)
			}
			p4 := ipv4Packet(src4, dst4, nil, m[:n])
			p6 := extChain(src6, dst6, []byte{unix.IPPROTO_DSTOPTS}, m[:n])
			cut4 := ipv4Packet(src4, dst4, nil, m)[:20+8+n]
			cut6 := ipv6Packet(src6, dst6, false, m)[:40+8+n]
			cases = append(cases,
				c{fmt.Sprintf("IPv4 DNS of %d bytes (QR %v)", n, r), false, p4},
				c{fmt.Sprintf("IPv6 DNS of %d bytes behind a header (QR %v)", n, r), true, p6},
				c{fmt.Sprintf("IPv4 cut after %d DNS bytes (QR %v)", n, r), false, cut4},
				c{fmt.Sprintf("IPv6 cut after %d DNS bytes (QR %v)", n, r), true, cut6})
		}
	}
	for n := 0; n < 28; n++ {
		cases = append(cases, c{fmt.Sprintf("IPv4 headers cut at %d", n), false, ipv4Packet(src4, dst4, nil, q)[:max(n, 20)]})
	}
	// OPT records at odd offsets (odd-length names) with cookies before and after
	// byte 512 of the message.
	for _, nameLen := range []int{1, 4, 6, 9, 255} {
		for _, padLen := range []int{0, 401, 500, 1001} {
			rng := nameLen*1000 + padLen
			name := wireName()
			if nameLen > 1 {
				name = randomName(rand.New(rand.NewPCG(uint64(rng), 1)), nameLen)
			}
			msg := cookieQuery(1, name, ednsOption(12, make([]byte, padLen)), ednsOption(10, make([]byte, 24)))
			cases = append(cases,
				c{fmt.Sprintf("IPv4 name %d, padding %d, cookie", nameLen, padLen), false, ipv4Packet(src4, dst4, nil, msg)},
				c{fmt.Sprintf("IPv6 name %d, padding %d, cookie", nameLen, padLen), true, ipv6Packet(src6, dst6, true, msg)})
		}
	}
	return cases
}

// TestParserKernelMatchesModel: the hand-made corpus sorts into the same classes in
// the program and the model, and no packet of an IPv6 chain past the walk passes.
func TestParserKernelMatchesModel(t *testing.T) {
	rig := newParseRig(t)
	seen := map[parseClass]int{}
	for _, tc := range parserCorpus() {
		seen[rig.check(t, tc.name, tc.v6, tc.pkt)]++
	}
	t.Logf("classes: %v", seen)
	for c := classUnfollowed; c <= classJudged; c++ {
		if seen[c] == 0 {
			t.Errorf("no case of class %v", c)
		}
	}
}

// FuzzParserKernelMatchesModel: arbitrary bytes as an IPv4 or IPv6 packet sort into
// the same class in the program and in the model; the corpus seeds it.
func FuzzParserKernelMatchesModel(f *testing.F) {
	for _, tc := range parserCorpus() {
		if len(tc.pkt) <= 1500 {
			f.Add(tc.v6, tc.pkt)
		}
	}
	rig := newParseRig(f)
	f.Fuzz(func(t *testing.T, v6 bool, pkt []byte) {
		// BPF_PROG_TEST_RUN refuses less than the IP header the protocol promises
		// and more than a page.
		pkt = pkt[:min(len(pkt), 1500)]
		if need := map[bool]int{false: 20, true: 40}[v6]; len(pkt) < need {
			pkt = append(pkt, make([]byte, need-len(pkt))...)
		}
		rig.check(t, "fuzz", v6, pkt)
	})
}
