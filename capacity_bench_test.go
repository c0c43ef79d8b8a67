//go:build linux

package rrl

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkFilterTestRunCapacity measures the program per packet under
// BPF_PROG_TEST_RUN with and without the capacity mode, as BenchmarkFilterTestRun
// does: "none" has no request limit (no level counts), "capacity" the mode alone
// (every level counts, none limits until an overload), "static" a requests-per-second
// limit (benchRPS), "capacity+static" both, and "capacity-level" the mode with a water
// level of benchRPS in force (as under overload). The mode adds no work per packet to
// the same levels: the limits it sets are the steps' own, so "static",
// "capacity+static" and "capacity-level" judge alike. (The test-run packets arrive
// at millions a second, over benchRPS: those three also draw and refuse, which
// "capacity", with no limit, never does.)
func BenchmarkFilterTestRunCapacity(b *testing.B) {
	pkt := ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("192.0.2.1:40000"), netip.MustParseAddrPort("127.0.0.1:53"), nil, dnsQuery(1, false)))
	cases := []struct {
		name     string
		capacity float64
		rps      string
		level    float64
	}{
		{"none", 0, "0", 0},
		{"capacity", capacityAuto, "0", 0},
		{"static", 0, benchRPS, 0},
		{"capacity+static", capacityAuto, benchRPS, 0},
		{"capacity-level", capacityAuto, "0", 1e6}, // benchRPS's default
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			requireBPF(b)
			objs, err := loadKernelObjects()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { objs.Close() })
			cfg := NewConfig()
			cfg.SetValue("requests-per-second", c.rps)
			cfg.capacity = c.capacity
			f := &Filter{objs: objs, mode: ModeEBPF, seed: 42}
			f.capacity.level = c.level
			if err := f.writeSettings(cfg); err != nil {
				b.Fatal(err)
			}
			benchTestRun(b, func() (time.Duration, error) {
				_, per, err := objs.Program.Benchmark(pkt, 100000, nil)
				return per, err
			})
			f.cfg = cfg
			st, err := f.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if st.Seen == 0 || st.Seen != st.Passed+sumLimited(st) || st.Errors != 0 {
				b.Fatalf("benchmark packet not judged: %+v", st)
			}
		})
	}
}

// BenchmarkCapacityController measures what the controller of a kernel filter costs:
// one sample of the counters and the socket's queue (every 25 ms), one read of the
// sketches through the memory map with the water level solved (every 200 ms), and the
// share of a core both take at those rates, with every cell of the adjusted levels
// busy (a spread flood), which is the most the read costs.
func BenchmarkCapacityController(b *testing.B) {
	requireBPF(b)
	srv := newUDPServer(b, "udp4", "127.0.0.1:0")
	cfg := NewConfig()
	cfg.capacity = capacityAuto
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	// Fill the sketches: every cell of every IPv4 level sees arrivals.
	raw := newRawSender(b, srv.addr)
	for i := range 20000 {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(i * 7)}), uint16(1024+i))
		if err := raw.Send(ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false))); err != nil {
			b.Fatal(err)
		}
	}
	k := &kernelCapacity{f: f, run: f.capacity.run}
	b.Run("sample", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.sample(monotonicNow()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read+solve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			nodes := k.nodes(monotonicNow())
			if len(nodes) == 0 {
				b.Fatal("no nodes")
			}
			capacitySolve(nodes, 1000)
		}
	})
	// One second of the controller's work: a sample every capacitySampleEvery, and
	// the sketches read (and solved) every step under overload, every second else.
	for _, c := range []struct {
		name  string
		reads int
	}{{"second-overloaded", int(time.Second / capacityStepEvery)}, {"second-idle", 1}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				for range time.Second / capacitySampleEvery {
					if _, err := k.sample(monotonicNow()); err != nil {
						b.Fatal(err)
					}
				}
				for range c.reads {
					capacitySolve(k.nodes(monotonicNow()), 1000)
				}
			}
			b.ReportMetric(100*float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e9, "%core")
		})
	}
}

// BenchmarkCapacityControllerCPU reports the share of a core the process spends
// while only the controller of a kernel filter runs, with the sketches' cells busy:
// with the socket's queue full and unread (an overload whose server stalled: the
// samples every 25 ms, the sketches read every 200 ms to a second) and drained
// (every 100 ms, the sketches every second), with the samples taken a second and
// the process's CPU per sample, from which %core@25ms is the share at a sample
// every 25 ms.
// The bound is 1% of a core; a loaded machine measures more (the same work
// costs more time in a shared cache).
func BenchmarkCapacityControllerCPU(b *testing.B) {
	requireBPF(b)
	k, drain := busyCapacity(b)
	measure := func(name string) {
		b.Run(name, func(b *testing.B) {
			var cpu, wall time.Duration
			var samples uint64
			for b.Loop() {
				c, w, n := controllerShare(b, k, time.Second)
				cpu, wall, samples = cpu+c, wall+w, samples+n
			}
			b.ReportMetric(100*float64(cpu)/float64(wall), "%core")
			b.ReportMetric(float64(samples)/wall.Seconds(), "samples/s")
			// The process's CPU per sample, and what it comes to at a sample
			// every capacitySampleEvery.
			per := float64(cpu) / float64(max(samples, 1))
			b.ReportMetric(per/1e3, "µs/sample")
			b.ReportMetric(100*per/float64(capacitySampleEvery), "%core@25ms")
		})
	}
	measure("queue-full")
	drain()
	waitCalm(b, k)
	measure("queue-drained")
}
