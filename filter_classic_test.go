package rrl

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/net/bpf"
)

// Packets as a UDP socket filter sees them: from the UDP header on.

// udpDatagram returns a UDP header (checksum 0) followed by payload.
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}

// minimalQuery returns the shortest query there is: a 12-byte header with RD set
// and one question for the root name, type NS, class IN: 17 bytes.
func minimalQuery(id uint16) []byte {
	return []byte{
		byte(id >> 8), byte(id), 0x01, 0x00, // ID, flags: RD
		0, 1, 0, 0, 0, 0, 0, 0, // QDCOUNT 1
		0,    // root name
		0, 2, // NS
		0, 1, // IN
	}
}

// ednsQuery returns a query for www.example.test/A with an OPT record, as resolvers
// send them.
func ednsQuery(t testing.TB, id uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion("www.example.test.", dns.TypeA)
	m.Id = id
	m.SetEdns0(1232, true)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// minimalResponse is minimalQuery with QR set, as a reflected response arrives.
func minimalResponse(id uint16) []byte {
	b := minimalQuery(id)
	b[2] |= 0x80
	return b
}

// classicVerdict is the prefilter's rule written plainly: the reference the program
// is checked against.
func classicVerdict(pkt []byte, reflectionPorts []uint16) bool {
	if len(pkt) < 8+17 {
		return false
	}
	if pkt[8+2]&0x80 != 0 {
		return false
	}
	return !slices.Contains(reflectionPorts, binary.BigEndian.Uint16(pkt))
}

// classicVM returns a VM running exactly the instructions attachClassic would
// attach for cfg, decoded back from their raw form.
func classicVM(t testing.TB, cfg *Config) *bpf.VM {
	t.Helper()
	raw, err := classicProgram(cfg)
	if err != nil {
		t.Fatal(err)
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("classic program does not disassemble: %v", insns)
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatalf("classic program rejected by the VM: %v", err)
	}
	return vm
}

// runClassicVM returns whether vm passes pkt, failing t on an error or a verdict other than
// drop (0) or pass whole.
func runClassicVM(t testing.TB, vm *bpf.VM, pkt []byte) bool {
	t.Helper()
	n, err := vm.Run(pkt)
	if err != nil {
		t.Fatalf("VM: %v", err)
	}
	if n != 0 && n != classicPass {
		t.Fatalf("VM verdict %#x, want 0 or %#x", n, classicPass)
	}
	return n == classicPass
}

func newConfigWith(t testing.TB, kv ...string) *Config {
	t.Helper()
	cfg := NewConfig()
	for i := 0; i < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

func TestClassicProgramVM(t *testing.T) {
	const dport = 53
	query := minimalQuery(0x1234)
	type tc struct {
		name string
		cfg  *Config // nil: NewConfig()
		pkt  []byte
		pass bool
	}
	tests := []tc{
		{"minimal 17-byte query", nil, udpDatagram(40000, dport, query), true},
		{"EDNS query", nil, udpDatagram(40000, dport, ednsQuery(t, 7)), true},
		{"minimal query, every other flag set", nil,
			udpDatagram(40000, dport, append([]byte{0, 1, 0x7f, 0xff}, query[4:]...)), true},
		{"minimal query plus one byte", nil, udpDatagram(40000, dport, append(query, 0)), true},
		{"16-byte truncated query", nil, udpDatagram(40000, dport, query[:16]), false},
		{"12-byte header only", nil, udpDatagram(40000, dport, query[:12]), false},
		{"8-byte UDP header only", nil, udpDatagram(40000, dport, nil), false},
		{"empty", nil, nil, false},
		{"3 bytes", nil, []byte{0x9c, 0x40, 0}, false},
		{"QR set", nil, udpDatagram(40000, dport, minimalResponse(1)), false},
		{"QR set, EDNS size", nil, udpDatagram(40000, dport, append(minimalResponse(1), make([]byte, 500)...)), false},
		{"source port 23456", nil, udpDatagram(23456, dport, query), true},
		{"source port 53", nil, udpDatagram(53, dport, query), true},
		{"source port 65535", nil, udpDatagram(65535, dport, query), true},
		{"source port 122", nil, udpDatagram(122, dport, query), true},
		{"source port 124", nil, udpDatagram(124, dport, query), true},
		{"source port 11210", nil, udpDatagram(11210, dport, query), true},
		{"source port 11212", nil, udpDatagram(11212, dport, query), true},
		// The port's two bytes are compared whole: 11211 is 0x2bcb.
		{"source port 0xcb2b (11211 swapped)", nil, udpDatagram(0xcb2b, dport, query), true},
		{"custom list: listed port", newConfigWith(t, "reflection-ports", "11211 20202"),
			udpDatagram(20202, dport, query), false},
		{"custom list: other listed port", newConfigWith(t, "reflection-ports", "11211 20202"),
			udpDatagram(11211, dport, query), false},
		{"custom list: default port not listed", newConfigWith(t, "reflection-ports", "11211 20202"),
			udpDatagram(123, dport, query), true},
		{"custom list: ephemeral", newConfigWith(t, "reflection-ports", "11211 20202"),
			udpDatagram(40000, dport, query), true},
		{"custom list: QR still dropped", newConfigWith(t, "reflection-ports", "11211 20202"),
			udpDatagram(40000, dport, minimalResponse(1)), false},
		{"empty list: port 0 passes", newConfigWith(t, "reflection-ports", ""),
			udpDatagram(0, dport, query), true},
		{"empty list: short still dropped", newConfigWith(t, "reflection-ports", ""),
			udpDatagram(40000, dport, query[:16]), false},
	}
	for _, p := range defaultReflectionPorts[:] {
		tests = append(tests, tc{"default reflection port " + strconv.Itoa(int(p)), nil,
			udpDatagram(p, dport, query), false})
		tests = append(tests, tc{"default reflection port " + strconv.Itoa(int(p)) + ", EDNS", nil,
			udpDatagram(p, dport, ednsQuery(t, 9)), false})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg == nil {
				cfg = NewConfig()
			}
			if got := runClassicVM(t, classicVM(t, cfg), tt.pkt); got != tt.pass {
				t.Errorf("pass = %v, want %v for % x", got, tt.pass, tt.pkt)
			}
			if model := classicVerdict(tt.pkt, cfg.reflectionPorts); model != tt.pass {
				t.Errorf("reference model says %v, want %v", model, tt.pass)
			}
		})
	}
}

// Every source port against lists of every shape the port search takes: empty, one
// linear run, the largest linear run, the smallest split, and the longest list.
func TestClassicProgramAllPorts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randomPorts := func(n int, extra ...uint16) []uint16 {
		set := map[uint16]bool{}
		for _, p := range extra {
			set[p] = true
		}
		for len(set) < n {
			set[uint16(rng.IntN(65536))] = true
		}
		var out []uint16
		for p := range set {
			out = append(out, p)
		}
		return out // unsorted: classicProgram must not depend on order
	}
	lists := map[string][]uint16{
		"default":    defaultReflectionPorts[:],
		"empty":      nil,
		"only 0":     {0},
		"only 65535": {65535},
		"8 ports":    randomPorts(classicLeafSize),
		"9 ports":    randomPorts(classicLeafSize+1, 0),
		"17 ports":   randomPorts(17, 65535),
		"64 ports":   randomPorts(maxReflectionPorts, 0, 1, 65534, 65535),
		"64 adjacent": func() []uint16 {
			p := make([]uint16, 64)
			for i := range p {
				p[i] = uint16(1000 + i)
			}
			return p
		}(),
		"duplicates 3": {11211, 123, 11211, 123, 19},
	}
	query := minimalQuery(1)
	for name, ports := range lists {
		t.Run(name, func(t *testing.T) {
			cfg := NewConfig()
			cfg.reflectionPorts = ports
			vm := classicVM(t, cfg)
			pkt := udpDatagram(0, 53, query)
			for sport := range 65536 {
				binary.BigEndian.PutUint16(pkt, uint16(sport))
				want := !slices.Contains(ports, uint16(sport))
				if got := runClassicVM(t, vm, pkt); got != want {
					t.Fatalf("source port %d: pass = %v, want %v", sport, got, want)
				}
			}
		})
	}
}

// A nil Config means the defaults.
func TestClassicProgramNilConfig(t *testing.T) {
	fromNil, err := classicProgram(nil)
	if err != nil {
		t.Fatal(err)
	}
	fromDefault, err := classicProgram(NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fromNil, fromDefault) {
		t.Errorf("classicProgram(nil) = %v, want the default program %v", fromNil, fromDefault)
	}
}

func TestClassicProgramSize(t *testing.T) {
	cfg := NewConfig()
	cfg.reflectionPorts = make([]uint16, maxReflectionPorts)
	for i := range cfg.reflectionPorts {
		cfg.reflectionPorts[i] = uint16(i * 1000)
	}
	raw, err := classicProgram(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 64 comparisons in leaves of 8, 7 binary-search splits, 4 checks, 2 returns, a load.
	if want := 4 + 1 + maxReflectionPorts + 7 + 2; len(raw) != want {
		t.Errorf("64-port program has %d instructions, want %d", len(raw), want)
	}
	def, err := classicProgram(NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 + 1 + len(defaultReflectionPorts[:]) + 2; len(def) != want {
		t.Errorf("default program has %d instructions, want %d", len(def), want)
	}

	cfg.reflectionPorts = append(cfg.reflectionPorts, 65535)
	_, err = classicProgram(cfg)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Keyword != "reflection-ports" {
		t.Fatalf("65 ports: error %v, want a reflection-ports ConfigError", err)
	}
	// Duplicates do not count against the limit.
	cfg.reflectionPorts = append(cfg.reflectionPorts[:64], cfg.reflectionPorts[:10]...)
	if _, err := classicProgram(cfg); err != nil {
		t.Errorf("64 ports with duplicates: %v", err)
	}
}

// The program against the reference model on arbitrary packets and port lists.
func FuzzClassicProgram(f *testing.F) {
	q := minimalQuery(1)
	for _, pkt := range [][]byte{
		nil, udpDatagram(40000, 53, nil), udpDatagram(40000, 53, q),
		udpDatagram(40000, 53, q[:16]), udpDatagram(123, 53, q),
		udpDatagram(40000, 53, minimalResponse(2)), udpDatagram(0, 53, ednsQuery(f, 3)),
	} {
		f.Add(pkt, []byte{0, 0, 0, 19, 0, 123, 0x2b, 0xcb})
		f.Add(pkt, []byte{})
		f.Add(pkt, []byte{0x9c, 0x40, 0, 123, 0x2b, 0xcb, 0x9c, 0x41, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	}
	f.Fuzz(func(t *testing.T, pkt, portBytes []byte) {
		var ports []uint16
		for i := 0; i+1 < len(portBytes) && len(ports) < maxReflectionPorts+4; i += 2 {
			ports = append(ports, binary.BigEndian.Uint16(portBytes[i:]))
		}
		cfg := NewConfig()
		cfg.reflectionPorts = ports
		unique := len(slices.Compact(slices.Sorted(slices.Values(ports))))
		if unique > maxReflectionPorts {
			if _, err := classicProgram(cfg); err == nil {
				t.Fatalf("%d ports accepted", unique)
			}
			return
		}
		if got, want := runClassicVM(t, classicVM(t, cfg), pkt), classicVerdict(pkt, ports); got != want {
			t.Fatalf("ports %v, packet % x: pass = %v, model says %v", ports, pkt, got, want)
		}
	})
}
