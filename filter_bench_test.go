package rrl

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// loadBenchFilter loads the production program and maps with cfg's settings.
func loadBenchFilter(b *testing.B, rps string) *kernelObjects {
	b.Helper()
	return loadBenchFilterCaps(b, rps, false)
}

// loadBenchFilterCaps is loadBenchFilter, loaded as a process with CAP_BPF but not
// CAP_PERFMON would load it if capbpf: with the verifier's Spectre mitigations.
func loadBenchFilterCaps(b *testing.B, rps string, capbpf bool) *kernelObjects {
	b.Helper()
	requireBPF(b)
	var objs *kernelObjects
	var err error
	load := func() { objs, err = loadKernelObjects() }
	if capbpf {
		withoutPerfmon(b, load)
	} else {
		load()
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { objs.Close() })
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", rps)
	f := &Filter{objs: objs, mode: ModeEBPF, seed: 42}
	if err := f.writeSettings(cfg); err != nil {
		b.Fatal(err)
	}
	return objs
}

var benchRPS = cmp.Or(os.Getenv("RRL_BENCH_RPS"), "1000000")

// BenchmarkFilterTestRun measures the production program per packet under
// BPF_PROG_TEST_RUN (one flow, cells in cache), with the full default lattice.
func BenchmarkFilterTestRun(b *testing.B) {
	dst4 := netip.MustParseAddrPort("127.0.0.1:53")
	dst6 := netip.MustParseAddrPort("[fd00::1]:53")
	cases := []struct {
		name string
		pkt  []byte
	}{
		{"ipv4", ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("192.0.2.1:40000"), dst4, nil, dnsQuery(1, false)))},
		{"ipv6", ethFrame(unix.ETH_P_IPV6, ipv6Packet(netip.MustParseAddrPort("[fd00:1::1]:40000"), dst6, false, dnsQuery(1, false)))},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			objs := loadBenchFilter(b, benchRPS)
			benchTestRun(b, func() (time.Duration, error) {
				_, per, err := objs.Program.Benchmark(c.pkt, 100000, nil)
				return per, err
			})
			// The packet must have gone through the whole lattice, not a shortcut.
			f := &Filter{objs: objs, mode: ModeEBPF, cfg: NewConfig()}
			st, err := f.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if st.Seen == 0 || st.Seen != st.Passed+sumLimited(st) || st.Errors != 0 || st.DroppedShort != 0 {
				b.Fatalf("benchmark packet not judged by the lattice: %+v", st)
			}
		})
	}
}

// BenchmarkFilterTestRunCookie is BenchmarkFilterTestRun with the filter using
// cookies (UseCookies), for queries without an additional record (the cost of the
// section-count test), with an OPT record but no cookie, with a client cookie only
// (the option lookup), and with a valid server cookie (lookup and SipHash; the
// query is then judged in its address's node only).
func BenchmarkFilterTestRunCookie(b *testing.B) {
	c := NewCookies(CookieSecret{9, 8, 7, 6, 5, 4, 3, 2, 1})
	client := []byte("benchcli")
	name := wireName("www", "example", "com")
	dst4 := netip.MustParseAddrPort("127.0.0.1:53")
	dst6 := netip.MustParseAddrPort("[fd00::1]:53")
	src4 := netip.MustParseAddrPort("192.0.2.1:40000")
	src6 := netip.MustParseAddrPort("[fd00:1::1]:40000")
	frame := func(src netip.AddrPort, payload []byte) []byte {
		if src.Addr().Is4() {
			return ethFrame(unix.ETH_P_IP, ipv4Packet(src, dst4, nil, payload))
		}
		return ethFrame(unix.ETH_P_IPV6, ipv6Packet(src, dst6, false, payload))
	}
	for _, src := range []netip.AddrPort{src4, src6} {
		fam := "ipv4"
		if src.Addr().Is6() {
			fam = "ipv6"
		}
		cases := []struct {
			name   string
			pkt    []byte
			proven bool
		}{
			{"plain", frame(src, dnsQuery(1, false)), false},
			{"edns", frame(src, cookieQuery(1, name)), false},
			{"client-cookie", frame(src, cookieQuery(1, name, ednsOption(10, client))), false},
			{"server-cookie", frame(src, cookieQuery(1, name, ednsOption(10, c.Generate(client, src.Addr(), time.Now())))), true},
		}
		for _, tc := range cases {
			b.Run(fam+"/"+tc.name, func(b *testing.B) {
				objs := loadBenchFilter(b, benchRPS)
				if err := writeCookieSecrets(objs.CookieSecrets, c.keys.Load()); err != nil {
					b.Fatal(err)
				}
				benchTestRun(b, func() (time.Duration, error) {
					_, per, err := objs.Program.Benchmark(tc.pkt, 100000, nil)
					return per, err
				})
				f := &Filter{objs: objs, mode: ModeEBPF, cfg: NewConfig()}
				st, err := f.Stats()
				if err != nil {
					b.Fatal(err)
				}
				// A proven query passes on its cookie or is limited in its own node.
				proven := st.CookiePassed > 0 && st.CookiePassed+sumLimited(st) == st.Seen
				if st.Seen == 0 || st.Errors != 0 || st.CookieInvalid != 0 || proven != tc.proven || !tc.proven && st.CookiePassed != 0 {
					b.Fatalf("benchmark packet not judged as intended: %+v", st)
				}
			})
		}
	}
}

// BenchmarkFilterLiveSocket floods a real socket from 500 sources and reports the
// program's own run time per packet (BPF_STATS_RUN_TIME) and what the server read. The
// "trivial" case attaches a program that only passes the packet, measured the same
// way: the floor the accounting and the hook itself put under any filter.
func BenchmarkFilterLiveSocket(b *testing.B) {
	for _, name := range []string{"rrl", "trivial"} {
		b.Run(name, func(b *testing.B) {
			var srv *udpServer
			var prog *ebpf.Program
			if name == "rrl" {
				var f *Filter
				srv, f = attachLive(b, "100")
				prog = f.objs.Program
			} else {
				requireBPF(b)
				srv = newUDPServer(b, "udp4", "127.0.0.1:0")
				prog = passOnlyProgram(b)
				attachProgram(b, srv, prog)
			}
			benchLiveRuns(b, srv, prog)
		})
	}
}

func benchLiveRuns(b *testing.B, srv *udpServer, prog *ebpf.Program) {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Skipf("BPF_STATS_RUN_TIME: %v", err)
	}
	defer stats.Close()
	raw := newRawSender(b, srv.addr)
	pkts := make([][]byte, 500)
	for i := range pkts {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 20, byte(i / 250), byte(1 + i%250)}), uint16(20000+i))
		pkts[i] = ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false))
	}
	stop := make(chan struct{})
	done := make(chan []reception)
	go func() { done <- srv.collect(time.Now(), stop, 100*time.Millisecond, time.Minute) }()
	s0, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for b.Loop() {
		raw.send(b, pkts[n%len(pkts)])
		n++
	}
	close(stop)
	got := len(<-done)
	s1, err := prog.Stats()
	if err != nil {
		b.Fatal(err)
	}
	runs := s1.RunCount - s0.RunCount
	if runs > 0 {
		b.ReportMetric(float64((s1.Runtime-s0.Runtime).Nanoseconds())/float64(runs), "ns/run")
	}
	b.ReportMetric(float64(runs), "runs")
	b.ReportMetric(float64(got)/float64(n), "delivered")
}

// BenchmarkReceiveThroughput compares what one reader gets through a real socket
// with no filter and with the filter attached but no attack (all traffic within its
// limits): the filter should cost the server next to nothing.
func BenchmarkReceiveThroughput(b *testing.B) {
	for _, attach := range []bool{false, true} {
		name := "nofilter"
		if attach {
			name = "filter"
		}
		b.Run(name, func(b *testing.B) {
			var srv *udpServer
			if attach {
				srv, _ = attachLive(b, "10000000")
			} else {
				srv = newUDPServer(b, "udp4", "127.0.0.1:0")
			}
			op := pingPong(b, srv)
			for b.Loop() {
				op()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "packets/s")
		})
	}
}

// pingPong returns a function that sends one minimal query to srv from a plain UDP
// socket and reads it on srv: one op of the throughput benchmarks.
func pingPong(b *testing.B, srv *udpServer) func() {
	b.Helper()
	client, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(client) })
	dst := &unix.SockaddrInet4{Port: int(srv.addr.Port()), Addr: [4]byte{127, 0, 0, 1}}
	q := dnsQuery(1, false)
	buf := make([]byte, 512)
	srv.conn.SetReadDeadline(time.Now().Add(10 * time.Minute))
	return func() {
		if err := unix.Sendto(client, q, 0, dst); err != nil {
			b.Fatal(err)
		}
		if _, _, err := srv.conn.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func sumLimited(st FilterStats) uint64 {
	var n uint64
	for _, l := range st.Nodes {
		n += l.Limited
	}
	return n
}

// BenchmarkReceiveThroughputRatio measures the filter's effect on what one reader
// gets through a real socket, with little noise: four server sockets take turns in
// blocks of 256 ping-pongs (about half a millisecond), so that whatever else the
// machine does falls on all of them alike. One has no filter, one the filter (no
// attack: all traffic within its limits), one a program that only passes packets
// (the cost of the hook itself), and one the floor program: the memory work any
// program of this design does per packet (reading the headers, the clock, a counter
// and eight sketch cells) without hashing or deciding anything. It reports the
// ratio of the median block times without a filter and with each program (1 means
// no cost; the filter's target is at least 0.95), and the filter's over the floor
// program's. Run it with -benchtime 400x or more.
func BenchmarkReceiveThroughputRatio(b *testing.B) {
	requireBPF(b)
	plain := newUDPServer(b, "udp4", "127.0.0.1:0")
	filtered, _ := attachLive(b, "10000000")
	passOnly := newUDPServer(b, "udp4", "127.0.0.1:0")
	floor := newUDPServer(b, "udp4", "127.0.0.1:0")
	attachProgram(b, passOnly, passOnlyProgram(b))
	attachProgram(b, floor, floorProgram(b))
	const block = 256
	ops := []func(){pingPong(b, plain), pingPong(b, filtered), pingPong(b, passOnly), pingPong(b, floor)}
	times := make([][]time.Duration, len(ops))
	for b.Loop() {
		for i, op := range ops {
			start := time.Now()
			for range block {
				op()
			}
			times[i] = append(times[i], time.Since(start))
		}
	}
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2])
	}
	without := median(times[0])
	b.ReportMetric(without/median(times[1]), "throughput-ratio")
	b.ReportMetric(without/median(times[2]), "pass-only-ratio")
	b.ReportMetric(without/median(times[3]), "floor-ratio")
	// What the filter costs beyond the floor: its parsing, hashing and judging.
	b.ReportMetric(median(times[3])/median(times[1]), "over-floor-ratio")
	b.ReportMetric(block*float64(time.Second)/without, "packets/s")
}

// attachProgram attaches prog to srv's socket.
func attachProgram(b *testing.B, srv *udpServer, prog *ebpf.Program) {
	b.Helper()
	err := sockopt.Control(srv.conn, func(fd int) error {
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, prog.FD())
	})
	if err != nil {
		b.Fatal(err)
	}
}

// floorProgram loads a socket filter that does, per packet, the memory work of the
// filter's design and nothing else: it reads the packet's headers relative to the
// network header, reads the clock in jiffies, counts the packet in a per-CPU counter
// and updates one cell in each of eight sketch rows (the default IPv4 lattice: four
// nodes, two rows each) of a map shaped like the filter's, then passes the packet.
func floorProgram(b *testing.B) *ebpf.Program {
	b.Helper()
	cells, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: cellBytes,
		MaxEntries: numNodes * sketchDepth * sketchWidth})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cells.Close() })
	counters, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { counters.Close() })
	const hdrStartNet = 1 // BPF_HDR_START_NET
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// 32 bytes of headers onto the stack.
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -32),
		asm.Mov.Imm(asm.R4, 32),
		asm.Mov.Imm(asm.R5, hdrStartNet),
		asm.FnSkbLoadBytesRelative.Call(),
		asm.FnJiffies64.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		// The per-CPU counter.
		asm.StoreImm(asm.RFP, -36, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, counters.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -36),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "row0"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
	}
	// One cell in each of eight rows: count += 1.0, last = now. A failed lookup
	// jumps to the next row.
	for row := range 8 {
		insns = append(insns,
			asm.StoreImm(asm.RFP, -40, int64(row*sketchWidth+17), asm.Word).WithSymbol(fmt.Sprintf("row%d", row)),
			asm.LoadMapPtr(asm.R1, cells.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -40),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, fmt.Sprintf("row%d", row+1)),
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.LoadImm(asm.R2, 1<<32, asm.DWord),
			asm.Add.Reg(asm.R1, asm.R2),
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
			asm.StoreMem(asm.R0, 8, asm.R7, asm.DWord),
		)
	}
	insns = append(insns,
		asm.LoadMem(asm.R0, asm.R6, 0, asm.Word).WithSymbol("row8"), // skb->len: pass the packet whole
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "Dual BSD/GPL", Instructions: insns})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}

// passOnlyProgram loads a socket filter that passes every packet whole.
func passOnlyProgram(b *testing.B) *ebpf.Program {
	b.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		License:      "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0xffff, asm.DWord), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	return prog
}
