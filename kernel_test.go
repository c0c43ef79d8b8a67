package rrl

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// requireBPF skips t when the process may not load eBPF programs, send raw packets
// or make network namespaces, unless RRL_REQUIRE_BPF=1 asks for such tests to fail
// instead.
func requireBPF(t testing.TB) {
	t.Helper()
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_NET_ADMIN, unix.CAP_NET_RAW, unix.CAP_SYS_ADMIN)
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatalf("remove memlock limit: %v", err)
	}
}

// testObjects are the test-only programs and maps, loaded only by tests.
type testObjects struct {
	FilterTest *ebpf.Program `ebpf:"rrl_filter_test"`
	FPTest     *ebpf.Program `ebpf:"rrl_fp_test"`
	TestInput  *ebpf.Map     `ebpf:"rrl_test_input"`
	TestFP     *ebpf.Map     `ebpf:"rrl_test_fp"`
	Cells      *ebpf.Map     `ebpf:"rrl_cells"`
	Settings   *ebpf.Map     `ebpf:"rrl_settings"`
	Counters   *ebpf.Map     `ebpf:"rrl_counters"`
	Exempt4    *ebpf.Map     `ebpf:"rrl_exempt4"`
	Exempt6    *ebpf.Map     `ebpf:"rrl_exempt6"`
	Secrets    *ebpf.Map     `ebpf:"rrl_cookie_secrets"`
	Limited    *ebpf.Map     `ebpf:"rrl_limited"`
	XDPDests   *ebpf.Map     `ebpf:"rrl_xdp_dests"`
	XDPState   *ebpf.Map     `ebpf:"rrl_xdp_state"`
	NamesTest  *ebpf.Program `ebpf:"rrl_names_test"`
	TestNames  *ebpf.Map     `ebpf:"rrl_test_names"`
	Names      *ebpf.Map     `ebpf:"rrl_names"`
	Apexes     *ebpf.Map     `ebpf:"rrl_apexes"`
}

func (o *testObjects) Close() {
	for _, c := range []interface{ Close() error }{o.FilterTest, o.FPTest, o.TestInput, o.TestFP, o.Cells, o.Settings, o.Counters, o.Exempt4, o.Exempt6, o.Secrets, o.Limited, o.XDPDests, o.XDPState, o.NamesTest, o.TestNames, o.Names, o.Apexes} {
		c.Close()
	}
}

func (o *testObjects) settingsMaps() settingsMaps {
	return settingsMaps{o.Settings, o.Exempt4, o.Exempt6}
}

func loadTestObjects(t testing.TB) *testObjects {
	t.Helper()
	requireBPF(t)
	spec, err := loadFilter()
	if err != nil {
		t.Fatal(err)
	}
	var objs testObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load test objects: %v", err)
	}
	t.Cleanup(objs.Close)
	return &objs
}

// ethFrame prefixes payload with the Ethernet header BPF_PROG_TEST_RUN expects.
func ethFrame(etherType uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	f[12], f[13] = byte(etherType>>8), byte(etherType)
	return append(f, payload...)
}

func TestKernelFixedPointMatchesGo(t *testing.T) {
	objs := loadTestObjects(t)
	r := rand.New(rand.NewPCG(1, 2))
	edge := []uint64{0, 1, 2, 1 << 31, 1 << 32, 1<<32 + 1, 1<<63 - 1, 1 << 63, ^uint64(0), 0xffffffff, 12345678901234}
	pkt := ethFrame(0x0800, make([]byte, 40))
	for i := 0; i < 3000; i++ {
		var a, b uint64
		switch {
		case i < len(edge)*len(edge):
			a, b = edge[i/len(edge)], edge[i%len(edge)]
		case i%3 == 0:
			a, b = r.Uint64(), r.Uint64()
		case i%3 == 1:
			a, b = r.Uint64N(1<<40), r.Uint64N(1<<36)
		default:
			a, b = r.Uint64N(1<<34), r.Uint64N(1<<33)
		}
		in := filterTestFp{A: a, B: b}
		if err := objs.TestFP.Put(uint32(0), &in); err != nil {
			t.Fatal(err)
		}
		if _, err := objs.FPTest.Run(&ebpf.RunOptions{Data: pkt}); err != nil {
			t.Fatal(err)
		}
		var out filterTestFp
		if err := objs.TestFP.Lookup(uint32(0), &out); err != nil {
			t.Fatal(err)
		}
		fa, fb := fixed(a), fixed(b)
		checks := []struct {
			name      string
			got, want uint64
		}{
			{"mul", out.Mul, uint64(kernelMul(fa, fb))},
			{"mul_frac", out.MulFrac, uint64(fa.Mul(fb & 0xffffffff))},
			{"div", out.Div, uint64(fa.Div(fb))},
			{"add", out.Add, uint64(fa.Add(fb))},
			{"sub", out.Sub, uint64(fa.Sub(fb))},
			{"decay", out.Decay, uint64(decayFactor(a))},
			{"rate", out.Rate, uint64(kernelMul(fa.Sub(fixedHalf), rateScale))},
			{"hash", out.Hash, sketchHash(a, b, a^b)},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Fatalf("%s(%#x, %#x): kernel %#x, Go %#x", c.name, a, b, c.got, c.want)
			}
		}
		// Where the products fit, the kernel's results are Mul's and arrivalRate's.
		if _, ok := refMul(fa, fb); ok && out.Mul != uint64(fa.Mul(fb)) {
			t.Fatalf("mul(%#x, %#x): kernel %#x, Mul %#x", a, b, out.Mul, uint64(fa.Mul(fb)))
		}
		if _, ok := refMul(fa.Sub(fixedHalf), rateScale); ok && out.Rate != uint64(arrivalRate(fa)) {
			t.Fatalf("rate(%#x): kernel %#x, arrivalRate %#x", a, out.Rate, uint64(arrivalRate(fa)))
		}
	}
}

// kernelMul is fp_mul: floor(a*b/2^32) modulo 2^64. It is fixed.Mul where the
// product fits; beyond, Mul saturates and fp_mul wraps (its callers stay within).
func kernelMul(a, b fixed) fixed {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return fixed(hi<<32 | lo>>32)
}

// TestLayoutVersionMatchesProgram: the version the Go side writes into the settings
// (and checks in pins) is the one the programs' shared headers declare.
func TestLayoutVersionMatchesProgram(t *testing.T) {
	src, err := os.ReadFile("bpf/common.h")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define LAYOUT_VERSION (\d+)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("bpf/common.h: no #define LAYOUT_VERSION")
	}
	if v, _ := strconv.Atoi(string(m[1])); v != layoutVersion {
		t.Fatalf("bpf/common.h LAYOUT_VERSION %d, layoutVersion %d", v, layoutVersion)
	}
}

// TestKernelReflectionPortsAllPorts: the program drops a query from every source
// port on the reflection list and passes one from every other port, for lists of
// ports in one 1024-port block, spread over all blocks, and at both ends. The
// 327,680 program runs (two system calls each) take 6 to 8 s of a core, four to
// five times that when another process holds one; the race detector adds nothing
// to checking a program's verdicts. Under it the test checks a sample (every
// listed port and its neighbours, both sides of every block boundary and 4,096
// random ports), and scripts/test runs all ports without it (exhaustive_test.go).
func TestKernelReflectionPortsAllPorts(t *testing.T) {
	objs := loadTestObjects(t)
	rng := rand.New(rand.NewPCG(3, 4))
	spread := []uint16{0, 1, 1023, 1024, 32767, 32768, 65534, 65535}
	for len(spread) < maxReflectionPorts {
		spread = append(spread, uint16(rng.IntN(65536)))
	}
	adjacent := make([]uint16, maxReflectionPorts)
	for i := range adjacent {
		adjacent[i] = uint16(40000 + i)
	}
	src := netip.MustParseAddrPort("192.0.2.7:0")
	dst := netip.MustParseAddrPort("192.0.2.1:53")
	frame := ethFrame(unix.ETH_P_IP, ipv4Packet(src, dst, nil, dnsQuery(1, false)))
	const sportOffset = 14 + 20 // Ethernet and IPv4 headers
	for _, tc := range []struct {
		name  string
		ports []uint16
	}{
		{"default", defaultReflectionPorts[:]},
		{"empty", nil},
		{"only 65535", []uint16{65535}},
		{"64 spread", spread},
		{"64 adjacent", adjacent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NewConfig()
			if err := cfg.SetValue("requests-per-second", "10000000"); err != nil {
				t.Fatal(err)
			}
			cfg.reflectionPorts = tc.ports
			if err := objs.settingsMaps().apply(cfg, 1, nil); err != nil {
				t.Fatal(err)
			}
			listed := map[uint16]bool{}
			for _, p := range tc.ports {
				listed[p] = true
			}
			for _, sport := range portsToCheck(tc.ports, exhaustive()) {
				binary.BigEndian.PutUint16(frame[sportOffset:], uint16(sport))
				if err := objs.TestInput.Put(uint32(0), &filterTestInput{Now: uint64(sport) * 1e6, Rnd: 0}); err != nil {
					t.Fatal(err)
				}
				ret, err := objs.FilterTest.Run(&ebpf.RunOptions{Data: frame})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := ret != 0, !listed[uint16(sport)]; got != want {
					t.Fatalf("source port %d: pass = %v, want %v", sport, got, want)
				}
			}
		})
	}
}

// portsToCheck returns the source ports TestKernelReflectionPortsAllPorts checks
// for the list listed: all 65,536 if all, else every listed port and its two
// neighbours, the last and first port of every 1024-port block, and 4,096 ports
// drawn from a fixed seed, in order and without repeats.
func portsToCheck(listed []uint16, all bool) []int {
	var set [65536]bool
	if all {
		for p := range set {
			set[p] = true
		}
	}
	for _, p := range listed {
		for _, q := range []int{int(p) - 1, int(p), int(p) + 1} {
			if q >= 0 && q < len(set) {
				set[q] = true
			}
		}
	}
	for b := 0; b < len(set); b += 1024 {
		set[b] = true
		set[b+1023] = true
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 4096 {
		set[rng.IntN(len(set))] = true
	}
	var out []int
	for p, ok := range set {
		if ok {
			out = append(out, p)
		}
	}
	return out
}
