//go:build linux

package rrl

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/dnsrake/rrl/internal/loadgen"
	"golang.org/x/sys/unix"
)

// BenchmarkXDPFlood measures how many flood packets the receiving side discards per
// CPU-second, side by side in one run: a trivial XDP program dropping UDP to port 53
// (the floor), XDP mode, and the socket filter. One source floods the receiver of a
// veth pair with queries generated in the kernel (BPF_PROG_TEST_RUN with live XDP
// frames) on CPU 0; the receiver's NAPI thread, threaded and pinned to CPU 1, does
// all of the receiving work (for the socket filter: the XDP pass program, the socket
// buffer, IP, UDP, the socket lookup and the filter), and its run time is what is
// measured. The limit is 100 per second and slips are off, so nearly every packet
// is discarded. Modes take turns, rounds times, and each reports its median, since
// the machine's speed drifts over minutes.
func BenchmarkXDPFlood(b *testing.B) {
	requireBPF(b)
	e := &xdpEnv{pin: newPinEnv(b).mnt + "/rrl"}
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "100")
	cfg.SetValue("slip-ratio", "0")
	if err := LoadPinned(cfg, e.pin, -1, -1); err != nil {
		b.Fatal(err)
	}
	var err error
	if e.veth, err = loadgen.NewVeth(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.veth.Close() })
	if e.flood, err = loadgen.NewFlood(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.flood.Close() })
	e.veth.Receiver.Do(func() error {
		e.srv4 = newUDPServer(b, "udp4", netip.AddrPortFrom(e.veth.Receiver4, 53).String())
		return nil
	})
	if e.f4, err = AttachPinned(e.srv4.conn, e.pin); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.f4.Close() })
	go func() { // the few packets the filter passes
		buf := make([]byte, 512)
		for {
			if _, err := e.srv4.conn.Read(buf); err != nil {
				return
			}
		}
	}()
	src := netip.MustParseAddrPort("198.19.1.1:40000")
	frame := e.veth.Frame(loadgen.Packet(src, e.srv4.addr, dnsQuery(1, false)))

	type mode struct {
		name   string
		attach func() (detach func())
		count  func() uint64 // packets discarded so far
	}
	pinnedDropped := func() uint64 {
		st, err := e.f4.Stats()
		if err != nil {
			b.Fatal(err)
		}
		return st.Dropped()
	}
	attachXDPProgram := func(which string) func() {
		var l link.Link
		e.veth.Receiver.Do(func() error {
			var err error
			prog := e.flood.DropProgram()
			switch which {
			case "pass":
				prog = e.flood.PassProgram()
			case "work":
				prog = e.flood.WorkDropProgram()
			}
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: e.veth.ReceiverIndex, Flags: link.XDPDriverMode})
			if err != nil {
				b.Fatal(err)
			}
			return nil
		})
		return func() { l.Close() }
	}
	modes := []mode{
		{"floor", func() func() { return attachXDPProgram("drop") }, func() uint64 {
			n, err := e.flood.Dropped()
			if err != nil {
				b.Fatal(err)
			}
			return n
		}},
		{"xdp", func() func() {
			e.veth.Receiver.Do(func() error {
				if _, err := AttachXDP(e.pin, e.veth.ReceiverDev, nil); err != nil {
					b.Fatal(err)
				}
				return nil
			})
			return func() {
				e.veth.Receiver.Do(func() error { return DetachXDP(e.pin, e.veth.ReceiverDev) })
			}
		}, pinnedDropped},
		// The pass program gives the veth the NAPI the other modes have.
		{"socket", func() func() { return attachXDPProgram("pass") }, pinnedDropped},
	}
	// With RRL_BENCH_WORK=N, the floor spending N rounds of arithmetic in registers
	// on each packet (loadgen.Flood.WorkDropProgram): set N so that its own time
	// (RRL_BENCH_PROG_STATS=1) matches XDP mode's, and the two differ only in what
	// XDP mode's memory traffic costs the rest of the receiving path.
	if v := os.Getenv("RRL_BENCH_WORK"); v != "" {
		var rounds uint32
		if _, err := fmt.Sscan(v, &rounds); err != nil {
			b.Fatalf("RRL_BENCH_WORK=%s: %v", v, err)
		}
		if err := e.flood.SetWork(rounds); err != nil {
			b.Fatal(err)
		}
		modes = append(modes, mode{"work", func() func() { return attachXDPProgram("work") }, modes[0].count})
	}
	// With RRL_BENCH_CAPBPF=1, XDP mode loaded as a process with CAP_BPF and
	// CAP_NET_ADMIN alone loads it: with the verifier's Spectre mitigations.
	if os.Getenv("RRL_BENCH_CAPBPF") == "1" {
		modes = append(modes, mode{"xdp-capbpf", func() func() {
			e.veth.Receiver.Do(func() error {
				withoutPerfmon(b, func() {
					if _, err := AttachXDP(e.pin, e.veth.ReceiverDev, nil); err != nil {
						b.Fatal(err)
					}
				})
				return nil
			})
			return func() {
				e.veth.Receiver.Do(func() error { return DetachXDP(e.pin, e.veth.ReceiverDev) })
			}
		}, pinnedDropped})
	}
	// The programs' own run time, beside the NAPI thread's, with
	// RRL_BENCH_PROG_STATS=1: the kernel then reads the clock twice around every
	// run, which costs as much as a trivial program on a virtual machine.
	if os.Getenv("RRL_BENCH_PROG_STATS") == "1" {
		if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
			defer st.Close()
		}
	}
	progTime := func() (time.Duration, uint64) {
		var d time.Duration
		var n uint64
		e.veth.Receiver.Do(func() error {
			id, err := xdpAttachedProgram(e.veth.ReceiverIndex)
			if err != nil || id == 0 {
				return err
			}
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
			if err != nil {
				return err
			}
			defer p.Close()
			if s, err := p.Stats(); err == nil {
				d, n = s.Runtime, s.RunCount
			}
			return nil
		})
		return d, n
	}
	progNs := make([][]float64, len(modes))
	if only := os.Getenv("RRL_BENCH_XDP_MODE"); only != "" { // for profiling one
		modes = slices.DeleteFunc(modes, func(m mode) bool { return m.name != only })
	}
	const rounds = 3
	const frames = 2_000_000
	lost0, _ := e.veth.SenderTxDropped()
	results := make([][]float64, len(modes))
	perPacket := make([][]float64, len(modes))
	for b.Loop() {
		for r := 0; r < rounds; r++ {
			for mi, m := range modes {
				detach := m.attach()
				napi, err := e.veth.ThreadedNAPI()
				if err != nil {
					b.Fatal(err)
				}
				if err := loadgen.PinTask(napi, 1); err != nil {
					b.Fatal(err)
				}
				// Warm up: the first frames find cold caches and a new thread.
				if err := e.flood.Send(e.veth, frame, 10000, 0); err != nil {
					b.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
				c0, t0 := m.count(), taskTime(b, napi)
				pt0, pn0 := progTime()
				if err := e.flood.SendPaced(e.veth, frame, frames, floodBatch, floodPause, 0); err != nil {
					b.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // the ring drains
				c1, t1 := m.count(), taskTime(b, napi)
				pt1, pn1 := progTime()
				detach()
				if pn1 > pn0 {
					progNs[mi] = append(progNs[mi], float64((pt1-pt0).Nanoseconds())/float64(pn1-pn0))
				}
				if t1 <= t0 || c1 <= c0 {
					b.Fatalf("%s: discarded %d in %v of the NAPI thread", m.name, c1-c0, t1-t0)
				}
				results[mi] = append(results[mi], float64(c1-c0)/(t1-t0).Seconds())
				perPacket[mi] = append(perPacket[mi], float64((t1-t0).Nanoseconds())/float64(c1-c0))
			}
		}
	}
	lost1, _ := e.veth.SenderTxDropped()
	b.Logf("frames the sender could not queue: %d", lost1-lost0)
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for mi, m := range modes {
		b.ReportMetric(med(results[mi])/1e6, "Mpps/CPU-"+m.name)
		b.ReportMetric(med(perPacket[mi]), "ns/pkt-"+m.name)
		b.Logf("%-7s discarded per CPU-second: %s; ns a packet: %.0f; the XDP program's own ns a run: %.0f", m.name, fmtRates(results[mi]), perPacket[mi], progNs[mi])
	}
	if len(modes) >= 3 && modes[2].name == "socket" {
		floor, xdp, sock := med(results[0]), med(results[1]), med(results[2])
		b.Logf("XDP mode: %.1fx the socket filter, %.2fx the floor", xdp/sock, xdp/floor)
	}
}

// The flood's pacing: all at once by default, or RRL_BENCH_FLOOD=batch/pause (e.g.
// 200/100us). Paced, the receiver wakes for a few frames at a time and its per-poll
// costs dominate (a trivial drop program then discards a quarter of what it does
// unpaced); unpaced, most frames are freed at the sender for want of room (the
// benchmark logs how many) and the receiver pays for contention on the generator's
// page pool. Neither is a NIC; compare modes within one run.
var floodBatch, floodPause = func() (uint32, time.Duration) {
	batch, pause := uint32(0), time.Duration(0)
	if v := os.Getenv("RRL_BENCH_FLOOD"); v != "" {
		var p string
		if _, err := fmt.Sscanf(strings.Replace(v, "/", " ", 1), "%d %s", &batch, &p); err == nil {
			pause, _ = time.ParseDuration(p)
		}
	}
	if batch == 0 {
		batch = 2_000_000
	}
	return batch, pause
}()

func fmtRates(v []float64) string {
	s := ""
	for _, x := range v {
		s += fmt.Sprintf(" %.2fM", x/1e6)
	}
	return s
}

func taskTime(b *testing.B, pid int) time.Duration {
	d, err := loadgen.TaskRunTime(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkXDPTestRun measures the XDP program per packet under BPF_PROG_TEST_RUN
// beside the socket filter, on the same packet with the same settings (one flow
// within its limit, cells in cache, the full default lattice).
func BenchmarkXDPTestRun(b *testing.B) {
	dst4 := netip.MustParseAddrPort("127.0.0.1:53")
	pkt := ethFrame(unix.ETH_P_IP, ipv4Packet(netip.MustParseAddrPort("192.0.2.1:40000"), dst4, nil, dnsQuery(1, false)))
	b.Run("socket", func(b *testing.B) {
		objs := loadBenchFilter(b, benchRPS)
		benchTestRun(b, func() (time.Duration, error) {
			_, per, err := objs.Program.Benchmark(pkt, 100000, nil)
			return per, err
		})
	})
	for _, capbpf := range []bool{false, true} {
		name := "xdp"
		if capbpf {
			// Loaded as by a process with CAP_BPF and CAP_NET_ADMIN alone: the
			// verifier's Spectre mitigations included.
			name = "xdp-capbpf"
		}
		b.Run(name, func(b *testing.B) { benchXDPTestRun(b, pkt, capbpf) })
	}
}

// benchXDPTestRun is BenchmarkXDPTestRun's XDP program, loaded without CAP_PERFMON
// if capbpf.
func benchXDPTestRun(b *testing.B, pkt []byte, capbpf bool) {
	{
		x := loadBenchXDP(b, benchRPS, capbpf)
		runs, _ := benchTestRun(b, func() (time.Duration, error) {
			_, per, err := x.program.Benchmark(pkt, 100000, nil)
			return per, err
		})
		st, err := x.stats()
		if err != nil {
			b.Fatal(err)
		}
		// Every run judged by the lattice: no shortcut measured.
		if st.Seen < uint64(runs) || st.Seen != st.Passed+sumLimited(st) || st.Errors != 0 {
			b.Fatalf("%d runs, but the counters say %+v", runs, st)
		}
	}
}

// benchTestRun reports run's time per packet (100,000 a call) and returns the
// number of packets and that time in nanoseconds.
func benchTestRun(b *testing.B, run func() (time.Duration, error)) (int, float64) {
	var total time.Duration
	runs := 0
	for b.Loop() {
		per, err := run()
		if err != nil {
			b.Fatal(err)
		}
		total += per * 100000
		runs += 100000
	}
	ns := float64(total.Nanoseconds()) / float64(runs)
	b.ReportMetric(ns, "ns/packet")
	return runs, ns
}

// benchXDP is the XDP program loaded with a bench filter's maps.
type benchXDP struct {
	program *ebpf.Program
	objs    *kernelObjects
}

func (x *benchXDP) stats() (FilterStats, error) {
	f := &Filter{objs: x.objs, mode: ModeEBPF, cfg: NewConfig()}
	return f.Stats()
}

// loadBenchXDP loads the production XDP program with the maps of a bench filter
// (loadBenchFilter) and lists UDP port 53 of the loopback interface, where test runs'
// frames arrive, as its destination.
func loadBenchXDP(b *testing.B, rps string, capbpf bool) *benchXDP {
	objs := loadBenchFilter(b, rps)
	// No slips: a test run repeats on one buffer, which a slip turns into a
	// response that the following runs would pass unjudged.
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", rps)
	cfg.SetValue("slip-ratio", "0")
	if err := (&Filter{objs: objs, mode: ModeEBPF, seed: 42}).writeSettings(cfg); err != nil {
		b.Fatal(err)
	}
	spec, err := xdpSpec([]uint16{53}, true)
	if err != nil {
		b.Fatal(err)
	}
	repl := map[string]*ebpf.Map{
		"rrl_cells": objs.Cells, "rrl_settings": objs.Settings, "rrl_counters": objs.Counters,
		"rrl_exempt4": objs.Exempt4, "rrl_exempt6": objs.Exempt6, "rrl_cookie_secrets": objs.CookieSecrets,
		"rrl_limited": objs.Limited, "rrl_xdp_dests": objs.XDPDests, "rrl_xdp_state": objs.XDPState,
	}
	var prog *ebpf.Program
	load := func() { prog, err = loadXDPProgram(spec, repl) }
	if capbpf {
		withoutPerfmon(b, load)
	} else {
		load()
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prog.Close() })
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		b.Fatal(err)
	}
	a := &xdpAttachment{dests: objs.XDPDests, state: objs.XDPState}
	if err := a.addDests(lo.Index, []uint16{53}, nil); err != nil {
		b.Fatal(err)
	}
	return &benchXDP{program: prog, objs: objs}
}

// withoutPerfmon runs fn on a thread whose effective capabilities lack CAP_PERFMON
// and CAP_SYS_ADMIN, and restores them after: credentials are per thread, so the
// verifier treats what fn loads as a process with CAP_BPF (and CAP_NET_ADMIN), but
// not CAP_PERFMON, would have it (Spectre v1 masking and v4 barriers included).
func withoutPerfmon(tb testing.TB, fn func()) {
	tb.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data, saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		tb.Fatal(err)
	}
	saved = data
	for _, c := range []int{unix.CAP_PERFMON, unix.CAP_SYS_ADMIN} {
		data[c/32].Effective &^= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			panic(fmt.Sprintf("restore the thread's capabilities: %v", err))
		}
	}()
	fn()
}
