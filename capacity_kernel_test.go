//go:build linux

package rrl

import (
	"math"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"golang.org/x/sys/unix"
)

// filterLimits returns each level's limit by name, from a Filter's Stats (the
// settings the kernel runs).
func filterLimits(t *testing.T, f *Filter) map[string]float64 {
	t.Helper()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, n := range st.Nodes {
		if n.Limit != 0 {
			out[n.Node.String()] = n.Limit
		}
	}
	return out
}

// attachCapacity attaches the eBPF filter with cfg to a new server socket and returns
// the Filter and a capacity source of its running controller.
func attachCapacity(t *testing.T, cfg *Config) (*udpServer, *Filter, *kernelCapacity) {
	t.Helper()
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	f.mu.Lock()
	run := f.capacity.run
	f.mu.Unlock()
	if run == nil {
		t.Fatal("no capacity controller runs")
	}
	return srv, f, &kernelCapacity{f: f, run: run}
}

// TestFilterCapacitySettings: the kernel runs the water level as its steps' limits,
// within requests-per-second, the own-address level untouched; an Update keeps the
// level; capacity off stops the controller and the levels go.
func TestFilterCapacitySettings(t *testing.T) {
	_, f, k := attachCapacity(t, capacityConfig(t, capacityAuto))
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity == nil || !st.Capacity.Auto {
		t.Fatalf("capacity stats %+v, want auto", st.Capacity)
	}
	check := func(when string, want map[string]float64) {
		t.Helper()
		got := filterLimits(t, f)
		if len(got) != len(want) {
			t.Errorf("%s: limits %v, want %v", when, got, want)
		}
		for node, w := range want {
			if g := got[node]; math.Abs(g-w) > 1e-6*w {
				t.Errorf("%s: %s limit %v, want %v", when, node, g, w)
			}
		}
	}
	check("lifted", map[string]float64{"ipv4/32": lifted, "ipv4/24": lifted, "ipv4/16": lifted,
		"ipv6/128": lifted, "ipv6/64": lifted, "ipv6/56": lifted, "ipv6/48": lifted, "port": lifted})
	if err := k.apply(50); err != nil {
		t.Fatal(err)
	}
	check("level 50", map[string]float64{"ipv4/32": lifted, "ipv4/24": 50, "ipv4/16": 800,
		"ipv6/128": lifted, "ipv6/64": 50, "ipv6/56": 50, "ipv6/48": 200, "port": 50})
	if err := f.Update(capacityConfig(t, capacityAuto, "requests-per-second", "20")); err != nil {
		t.Fatal(err)
	}
	check("level 50 under requests-per-second 20", map[string]float64{"ipv4/32": 20, "ipv4/24": 20, "ipv4/16": 320,
		"ipv6/128": 20, "ipv6/64": 20, "ipv6/56": 20, "ipv6/48": 80, "port": 20})
	if err := k.apply(5); err != nil {
		t.Fatal(err)
	}
	check("level 5", map[string]float64{"ipv4/32": 20, "ipv4/24": 5, "ipv4/16": 80,
		"ipv6/128": 20, "ipv6/64": 5, "ipv6/56": 5, "ipv6/48": 20, "port": 5})
	if err := k.apply(0); err != nil {
		t.Fatal(err)
	}
	check("lifted to requests-per-second", map[string]float64{"ipv4/32": 20, "ipv4/24": 20, "ipv4/16": 320,
		"ipv6/128": 20, "ipv6/64": 20, "ipv6/56": 20, "ipv6/48": 80, "port": 20})
	if err := f.Update(NewConfig()); err != nil {
		t.Fatal(err)
	}
	check("capacity off", map[string]float64{})
	if st, _ := f.Stats(); st.Capacity != nil {
		t.Errorf("capacity off: stats %+v", st.Capacity)
	}
	if err := k.apply(50); err != nil || len(filterLimits(t, f)) != 0 {
		t.Errorf("a stopped controller changed the limits (%v)", err)
	}
}

// TestFilterCapacitySample: the controller's sample of a real socket: arrivals,
// what the filter refused and passed, what the full queue lost (the socket's drops
// less the filter's), and what is left to read, which is what the server then reads;
// and the sketches' cells through the memory map.
func TestFilterCapacitySample(t *testing.T) {
	srv, _, k := attachCapacity(t, capacityConfig(t, capacityAuto, "requests-per-second", "50"))
	if err := srv.conn.SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	before, err := k.sample(1)
	if err != nil {
		t.Fatal(err)
	}
	if before.Sockets != 1 || before.QueueLimit == 0 {
		t.Fatalf("sample %+v: want the socket and its buffer", before)
	}
	raw := newRawSender(t, srv.addr)
	const n = 400
	for i := range n {
		// One heavy address, limited by requests-per-second, and many light ones.
		raw.send(t, ipv4Packet(netip.AddrPortFrom(netip.MustParseAddr("127.5.5.5"), uint16(4000+i)), srv.addr, nil, dnsQuery(uint16(i), false)))
		light := netip.AddrFrom4([4]byte{127, byte(6 + i/256), byte(i), 1})
		raw.send(t, ipv4Packet(netip.AddrPortFrom(light, uint16(20000+i)), srv.addr, nil, dnsQuery(uint16(i), false)))
	}
	after, err := k.sample(2)
	if err != nil {
		t.Fatal(err)
	}
	st, err := k.f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	drops, err := loadgen.Drops(srv.conn)
	if err != nil {
		t.Fatal(err)
	}
	demand := after.Demand - before.Demand
	overflow := after.Overflow - before.Overflow
	served := after.Served - before.Served
	if demand != 2*n {
		t.Errorf("demand %d, want %d", demand, 2*n)
	}
	if got := after.Admitted - before.Admitted + sumLimited(st); got != demand {
		t.Errorf("admitted %d + limited %d = %d, want the demand %d", after.Admitted-before.Admitted, sumLimited(st), got, demand)
	}
	if want := uint64(drops) - (st.Seen - st.Passed); overflow != want || overflow == 0 {
		t.Errorf("overflow %d, want the socket's drops %d less the filter's %d (and some)", overflow, drops, st.Seen-st.Passed)
	}
	if after.Queued == 0 {
		t.Errorf("nothing queued")
	}
	nodes := k.nodes(int64(monotonicNow()))
	var busy bool
	for _, nd := range nodes {
		if nd.node == nodeIPv4First+1 && nd.rows[0].total() > 0 && nd.rows[1].total() > 0 {
			busy = true
		}
	}
	if len(nodes) != 6 || !busy {
		t.Errorf("nodes %d (want the 6 adjusted: /24, /16, /64, /56, /48, port), /24 cells busy %v", len(nodes), busy)
	}
	read := srv.collect(time.Now(), nil, 100*time.Millisecond, 5*time.Second)
	if uint64(len(read)) != served {
		t.Errorf("read %d, want what the sample says is served: %d", len(read), served)
	}
	t.Logf("demand %d, limited %d, overflow %d, served %d, queued %d of %d bytes", demand, sumLimited(st), overflow, served, after.Queued, after.QueueLimit)
}

// busyCapacity attaches a kernel filter in capacity auto mode whose sketches have
// every cell of the IPv4 levels busy and whose socket's queue is full and unread;
// drain empties the queue.
func busyCapacity(tb testing.TB) (k *kernelCapacity, drain func()) {
	srv := newUDPServer(tb, "udp4", "127.0.0.1:0")
	// A small buffer, which the flood fills (the test server's is 64 MB).
	if err := srv.conn.SetReadBuffer(64 << 10); err != nil {
		tb.Fatal(err)
	}
	cfg := NewConfig()
	cfg.capacity = capacityAuto
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		tb.Fatalf("Attach: %v", err)
	}
	tb.Cleanup(func() { f.Close() })
	raw := newRawSender(tb, srv.addr)
	for i := range 20000 {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(i * 7)}), uint16(1024+i))
		if err := raw.Send(ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false))); err != nil {
			tb.Fatal(err)
		}
	}
	f.mu.Lock()
	run := f.capacity.run
	f.mu.Unlock()
	if run == nil {
		tb.Fatal("no capacity controller runs")
	}
	return &kernelCapacity{f: f, run: run}, func() { srv.collect(time.Now(), nil, 50*time.Millisecond, 5*time.Second) }
}

// controllerShare runs the process idle but for k's controller for dur and returns
// the CPU it used (getrusage: the whole process) and the samples it took.
func controllerShare(tb testing.TB, k *kernelCapacity, dur time.Duration) (cpu, wall time.Duration, samples uint64) {
	usage := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			tb.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	runtime.GC() // the sends' garbage is not the controller's
	before, start, n := usage(), time.Now(), k.run.samples.Load()
	time.Sleep(dur)
	return usage() - before, time.Since(start), k.run.samples.Load() - n
}

// waitCalm waits until k's overload has ended (the server read nothing while its
// queue was full, so its R is small and the arrivals' average decays under it in
// about a second), and out of the busy samples' window.
func waitCalm(tb testing.TB, k *kernelCapacity) {
	for deadline := time.Now().Add(10 * time.Second); k.run.stats().Overloaded; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("the overload did not end with the queue drained: %+v", *k.run.stats())
		}
	}
	time.Sleep(300 * time.Millisecond)
}

// TestFilterCapacityControllerPace: the controller of a kernel filter, running on
// its own with the sketches' cells busy, keeps its pace and does not spin: with the
// socket's queue full and unread (an overload is near: a sample every 25 ms, the
// sketches read every 200 ms) and drained (every 100 ms), it takes no more samples
// than its period allows (a timer is late on a loaded machine, never early), at
// least a quarter of them, and the process spends under 5 ms of CPU per sample
// (a sample costs tens of microseconds, a read of the sketches about a
// millisecond: BenchmarkCapacityControllerCPU reports the share of a core).
func TestFilterCapacityControllerPace(t *testing.T) {
	requireBPF(t)
	k, drain := busyCapacity(t)
	const dur = 2 * time.Second
	check := func(what string, every time.Duration) {
		cpu, wall, n := controllerShare(t, k, dur)
		most := uint64(wall/every) + 2
		t.Logf("%s: %d samples in %v (at most %d), %v of CPU: %v a sample", what, n, wall.Round(time.Millisecond), most, cpu, cpu/time.Duration(max(n, 1)))
		if n > most || n < most/4 {
			t.Errorf("%s: %d samples in %v, want between %d and %d (one every %v)", what, n, wall, most/4, most, every)
		}
		if n > 0 && cpu/time.Duration(n) > 5*time.Millisecond {
			t.Errorf("%s: %v of CPU a sample, want under 5 ms", what, cpu/time.Duration(n))
		}
	}
	check("queue full", capacitySampleEvery)
	drain()
	waitCalm(t, k)
	check("queue drained", capacitySampleIdle)
}
