package rrl

import (
	"fmt"

	"github.com/dnsrake/rrl/internal/loadgen"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// flow is one group of traffic in a live test.
type flow = loadgen.Flow

// liveRun is what one live run sent and what the server received.
type liveRun struct {
	flows    []flow
	sentAt   [][]time.Duration // per flow, when each packet was sent
	received [][]time.Duration // per flow, when each received packet arrived
	unknown  int               // received from a source no flow sent from
	filter   FilterStats
}

// runLive sends flows through raw sockets to srv for dur and collects what srv reads.
// Sources of different flows must not overlap.
func runLive(t *testing.T, srv *udpServer, f *Filter, flows []flow, dur time.Duration) *liveRun {
	t.Helper()
	return runLiveWith(t, srv, newRawSender(t, srv.addr), f, flows, dur)
}

// runLiveWith is runLive with a given raw sender (one made in a test's network
// namespace, for IPv6 sources).
func runLiveWith(t *testing.T, srv *udpServer, raw *rawSender, f *Filter, flows []flow, dur time.Duration) *liveRun {
	t.Helper()
	owner := map[netip.AddrPort]int{}
	var ownerMu sync.Mutex
	run := &liveRun{flows: flows, sentAt: make([][]time.Duration, len(flows)), received: make([][]time.Duration, len(flows))}

	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan []reception)
	stop := make(chan struct{})
	go func() { done <- srv.collect(start, stop, 300*time.Millisecond, dur+20*time.Second) }()

	var sendErr error
	run.sentAt, sendErr = loadgen.Pace(start, flows, dur, 2*time.Millisecond, func(fi int, src netip.AddrPort, payload []byte) error {
		ownerMu.Lock()
		owner[src] = fi
		ownerMu.Unlock()
		return raw.Send(loadgen.Packet(src, srv.addr, payload))
	})
	if sendErr != nil {
		t.Fatalf("send: %v", sendErr)
	}
	close(stop)
	for _, r := range <-done {
		ownerMu.Lock()
		fi, ok := owner[r.from]
		ownerMu.Unlock()
		if !ok {
			run.unknown++
			continue
		}
		run.received[fi] = append(run.received[fi], r.at)
	}
	if run.filter, err = f.Stats(); err != nil {
		t.Fatal(err)
	}
	total := run.unknown
	for _, r := range run.received {
		total += len(r)
	}
	// Every packet the filter passed must have been read: otherwise the socket
	// queue overflowed and the counts below would mistake overflow for limiting.
	if passed := run.filter.Passed - before.Passed; uint64(total) != passed {
		t.Fatalf("filter passed %d packets but the server read %d: receive buffer overflow, run not meaningful", passed, total)
	}
	return run
}

func count(ts []time.Duration, from, to time.Duration) int {
	n := 0
	for _, t := range ts {
		if t >= from && t < to {
			n++
		}
	}
	return n
}

// admitted returns the received rate of flow fi over [from, to), packets per second.
func (r *liveRun) admitted(fi int, from, to time.Duration) float64 {
	return float64(count(r.received[fi], from, to)) / (to - from).Seconds()
}

// loss is the fraction of flow fi's packets that did not arrive.
func (r *liveRun) loss(fi int) float64 {
	if len(r.sentAt[fi]) == 0 {
		return 0
	}
	return 1 - float64(len(r.received[fi]))/float64(len(r.sentAt[fi]))
}

func (r *liveRun) report(t *testing.T) {
	for fi, fl := range r.flows {
		t.Logf("%-12s sent %6d received %6d (loss %.2f%%)", fl.Name, len(r.sentAt[fi]), len(r.received[fi]), 100*r.loss(fi))
	}
	t.Logf("filter: %+v", r.filter)
}

func within(got, want, tol float64) bool { return got >= want*(1-tol) && got <= want*(1+tol) }

// liveLegitFlows are ordinary clients: n sources in distinct /16s (127.100+i.0.1), each
// on its own ephemeral-range port, at rate pps each, sending minimal queries.
func liveLegitFlows(n int, rate float64, dur time.Duration) []flow {
	var out []flow
	for i := 0; i < n; i++ {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(100 + i), 0, 1}), uint16(50000+i))
		out = append(out, flow{Name: fmt.Sprintf("legit%d", i), Rate: rate, End: dur, Src: func(int) netip.AddrPort { return src }})
	}
	return out
}

// attachLiveIPv6 is attachLive for IPv6 sources: the server socket on ::1, the raw
// sender and the filter live in a network namespace of the test's own, so that
// spoofed sources and anything sent back to them never leave it.
func attachLiveIPv6(t *testing.T, rps string) (*udpServer, *rawSender, *Filter) {
	t.Helper()
	requireBPF(t)
	ns := newTestNetns(t)
	var srv *udpServer
	var raw *rawSender
	var f *Filter
	ns.do(t, func() {
		srv = newUDPServer(t, "udp6", "[::1]:0")
		raw = newRawSender(t, srv.addr)
		cfg := NewConfig()
		if err := cfg.SetValue("requests-per-second", rps); err != nil {
			t.Fatal(err)
		}
		var err error
		if f, err = Attach(srv.conn, cfg); err != nil {
			t.Fatalf("Attach: %v", err)
		}
	})
	t.Cleanup(func() { f.Close() })
	return srv, raw, f
}

// attachLive attaches the eBPF filter, limiting each source to rps, to a new server
// socket on 127.0.0.1; the filter closes when t ends.
func attachLive(t testing.TB, rps string) (*udpServer, *Filter) {
	t.Helper()
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", rps); err != nil {
		t.Fatal(err)
	}
	f, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	if f.Mode() != ModeEBPF {
		t.Fatalf("mode %v, want ebpf", f.Mode())
	}
	return srv, f
}

// TestLiveLimiterScenarios runs the request limiter's effectiveness scenarios on a
// real socket: what the server reads is held to each attacked group's limit while
// other clients lose nothing.
func TestLiveLimiterScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood scenarios take about 20 s")
	}
	const L = 500.0
	const dur = 3500 * time.Millisecond
	const from, to = 1500 * time.Millisecond, dur // steady state, after convergence
	rng := rand.New(rand.NewPCG(7, 7))
	v4 := func(a, b, c, d byte, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{a, b, c, d}), port)
	}
	scenarios := []struct {
		name   string
		attack []flow
	}{
		{"one heavy source at 10x", []flow{{Name: "heavy", Rate: 10 * L, End: dur,
			Src: func(int) netip.AddrPort { return v4(127, 1, 1, 1, 40000) }}}},
		{"a /24 of 200 sources at 20x together", []flow{{Name: "slash24", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v4(127, 2, 2, byte(1+i%200), uint16(30000+i%200)) }}}},
		{"10 sources in a /24 at 2x each", []flow{{Name: "ten", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v4(127, 3, 3, byte(1+i%10), uint16(30000+i%10)) }}}},
		{"random sources on source port 23456 at 20x", []flow{{Name: "port", Rate: 20 * L, End: dur,
			Src: func(int) netip.AddrPort {
				return v4(127, byte(rng.IntN(100)), byte(rng.IntN(256)), byte(1+rng.IntN(254)), 23456)
			}}}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			srv, f := attachLive(t, fmt.Sprint(L))
			flows := append(sc.attack, liveLegitFlows(10, 0.05*L, dur)...)
			run := runLive(t, srv, f, flows, dur)
			run.report(t)
			got := run.admitted(0, from, to)
			if !within(got, L, 0.10) {
				t.Errorf("attack admitted at %.0f pps in steady state, want %.0f ±10%%", got, L)
			}
			for fi := 1; fi < len(flows); fi++ {
				if l := run.loss(fi); l >= 0.01 {
					t.Errorf("%s lost %.2f%% of its queries, want < 1%%", flows[fi].Name, 100*l)
				}
			}
		})
	}
}

// TestLiveLimiterScenariosIPv6 runs the scenarios with IPv6 sources grouped by /64,
// /56 and /48, inside a network namespace the test creates, so that spoofed sources
// and anything sent back to them never leave it.
func TestLiveLimiterScenariosIPv6(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood scenarios take about 20 s")
	}
	requireBPF(t)
	const L = 500.0
	const dur = 3500 * time.Millisecond
	const from, to = 1500 * time.Millisecond, dur
	rng := rand.New(rand.NewPCG(8, 8))
	// v6 builds fd00:AAAA:BBCC:DDDD::EEEE from its parts: a /48 (a), a /56 (b), a /64 (d).
	v6 := func(a uint16, b byte, d uint16, host uint16, port uint16) netip.AddrPort {
		var x [16]byte
		x[0], x[1] = 0xfd, 0x00
		x[2], x[3] = byte(a>>8), byte(a)
		x[4] = b
		x[6], x[7] = byte(d>>8), byte(d)
		x[14], x[15] = byte(host>>8), byte(host)
		return netip.AddrPortFrom(netip.AddrFrom16(x), port)
	}
	scenarios := []struct {
		name   string
		attack flow
	}{
		{"one heavy source at 10x", flow{Name: "heavy", Rate: 10 * L, End: dur,
			Src: func(int) netip.AddrPort { return v6(1, 1, 1, 1, 40000) }}},
		{"200 /64s of one /56 at 20x together", flow{Name: "slash56", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v6(2, 2, uint16(i%200), 1, uint16(30000+i%200)) }}},
		{"10 sources in a /64 at 2x each", flow{Name: "ten", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v6(3, 3, 3, uint16(1+i%10), uint16(30000+i%10)) }}},
		{"random sources on source port 23456 at 20x", flow{Name: "port", Rate: 20 * L, End: dur,
			Src: func(int) netip.AddrPort {
				return v6(uint16(0x1000+rng.IntN(1000)), byte(rng.IntN(256)), uint16(rng.IntN(65536)), uint16(rng.IntN(65536)), 23456)
			}}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			srv, raw, f := attachLiveIPv6(t, fmt.Sprint(L))
			flows := []flow{sc.attack}
			for i := 0; i < 10; i++ { // legitimate clients, each in its own /48
				src := v6(uint16(0x100+i), 0, 0, 1, uint16(50000+i))
				flows = append(flows, flow{Name: fmt.Sprintf("legit%d", i), Rate: 0.05 * L, End: dur, Src: func(int) netip.AddrPort { return src }})
			}
			run := runLiveWith(t, srv, raw, f, flows, dur)
			run.report(t)
			if got := run.admitted(0, from, to); !within(got, L, 0.10) {
				t.Errorf("attack admitted at %.0f pps in steady state, want %.0f ±10%%", got, L)
			}
			for fi := 1; fi < len(flows); fi++ {
				if l := run.loss(fi); l >= 0.01 {
					t.Errorf("%s lost %.2f%% of its queries, want < 1%%", flows[fi].Name, 100*l)
				}
			}
		})
	}
}
