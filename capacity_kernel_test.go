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

// TestFilterCapacityControllerCPU: the controller of a kernel filter, running on its
// own with the sketches' cells busy, costs the process under 1% of a core
// (getrusage): with the socket's queue full and unread (the controller then reads
// the sketches every step, as under overload) and with it drained (every second).
func TestFilterCapacityControllerCPU(t *testing.T) {
	if handlerRace {
		t.Skip("the race detector multiplies the CPU time measured")
	}
	srv, _, _ := attachCapacity(t, capacityConfig(t, capacityAuto))
	raw := newRawSender(t, srv.addr)
	for i := range 20000 {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(i * 7)}), uint16(1024+i))
		raw.send(t, ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false)))
	}
	cpu := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	measure := func(what string) {
		runtime.GC() // the sends' garbage is not the controller's
		const dur = 2 * time.Second
		before, start := cpu(), time.Now()
		time.Sleep(dur)
		used, wall := cpu()-before, time.Since(start)
		share := float64(used) / float64(wall)
		t.Logf("%s: the process used %v of CPU in %v: %.3f%% of a core", what, used, wall.Round(time.Millisecond), 100*share)
		if share > 0.01 {
			t.Errorf("%s: controller at %.2f%% of a core, want at most 1%%", what, 100*share)
		}
	}
	measure("queue full")
	srv.collect(time.Now(), nil, 50*time.Millisecond, 5*time.Second)
	time.Sleep(300 * time.Millisecond) // out of the busy samples' memory
	measure("queue drained")
}
