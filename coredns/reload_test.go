package coredns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The tests in this file flood a CoreDNS from one real UDP socket on 127.0.0.1 and
// measure the rate at which it answers, across reloads and with several server
// blocks on one address; they need root for the kernel filter.

// floodRate is the one-source flood's rate: four times the highest limit below.
const floodRate = 800

// answered sends queries for www.example.test from one UDP socket to port at
// floodRate for warm+measure and returns the answers per second that arrived during
// the last measure (the first warm lets a fresh filter's estimate rise).
func answered(t *testing.T, port int, warm, measure time.Duration) float64 {
	t.Helper()
	rate, _ := answeredName(t, port, "www.example.test.", warm, measure)
	return rate
}

// answeredName is answered with queries for name; it also returns the number of
// answers of the whole flood.
func answeredName(t *testing.T, port int, name string, warm, measure time.Duration) (float64, int64) {
	t.Helper()
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	start := time.Now()
	from, until := start.Add(warm), start.Add(warm+measure)
	var counted, total atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			conn.SetReadDeadline(until.Add(200 * time.Millisecond))
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			// An answer counts when it arrives in the window (on loopback, within a
			// millisecond or so of its query).
			var m dns.Msg
			if m.Unpack(buf[:n]) != nil || len(m.Answer) != 1 {
				continue
			}
			total.Add(1)
			if now := time.Now(); !now.Before(from) && now.Before(until) {
				counted.Add(1)
			}
		}
	}()
	sent := 0
	for time.Now().Before(until) {
		due := int(time.Since(start).Seconds() * floodRate)
		for ; sent < due; sent++ {
			q.Id = uint16(sent)
			b, _ := q.Pack()
			if _, err := conn.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	<-done
	return float64(counted.Load()) / measure.Seconds(), total.Load()
}

// checkRate fails t unless got, an answered rate, is within [lo, hi] times want.
func checkRate(t *testing.T, what string, got, want, lo, hi float64) {
	t.Helper()
	t.Logf("%s: %.0f answers per second (flood %d per second, limit %.0f)", what, got, floodRate, want)
	if got < lo*want || got > hi*want {
		t.Errorf("%s: %.0f answers per second, want %.0f-%.0f", what, got, lo*want, hi*want)
	}
}

// reload replaces s's Corefile with corefile and reloads it (SIGUSR1), returning
// once CoreDNS has finished: the new servers run and the old instance has shut
// down.
func reload(t *testing.T, s *server, corefile string) {
	t.Helper()
	n := strings.Count(s.log(), "Reloading complete")
	if err := os.WriteFile(filepath.Join(s.cmd.Dir, "Corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	s.cmd.Process.Signal(syscall.SIGUSR1)
	waitLog(t, s, "Reloading complete", n+1)
}

// socketFilter returns what is on CoreDNS's UDP sockets on 127.0.0.1:port (one
// of procsock's filter kinds), seen through copies of its descriptors.
func socketFilter(t *testing.T, s *server, port int) string {
	t.Helper()
	conns, _, err := procsock.Copy(s.cmd.Process.Pid, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, c := range conns {
		k, err := procsock.AttachedFilter(c)
		if err != nil {
			t.Fatal(err)
		}
		kinds[k] = true
		c.Close()
	}
	if len(kinds) != 1 {
		t.Fatalf("the sockets on port %d carry %v, want one kind", port, kinds)
	}
	for k := range kinds {
		return k
	}
	return ""
}

// limitCorefile serves example.test on 127.0.0.1:port with the rrl properties in
// rrl (no rrl directive when rrl is "-").
func limitCorefile(port int, rrl string) string {
	directive := "rrl {\n        " + rrl + "\n    }"
	if rrl == "-" {
		directive = ""
	}
	return fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    %s
    file db.example.test
}
`, port, directive)
}

func TestCoreDNSReloadLimits(t *testing.T) {
	// Three reloads change requests-per-second in the kernel filter, which keeps
	// its estimates (so the flood is trimmed to each new limit at once); a reload
	// without rrl takes the filter off the socket and lets the flood through.
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_SYS_PTRACE)
	port := freePort(t)
	s := startCoreDNS(t, limitCorefile(port, "requests-per-second 200"), map[string]string{"db.example.test": exampleZone})
	attached := "kernel filter for dns://127.0.0.1:" + strconv.Itoa(port) + ": "
	waitLog(t, s, attached+"ebpf", 1)
	rates := []float64{answered(t, port, 500*time.Millisecond, time.Second)}
	checkRate(t, "requests-per-second 200", rates[0], 200, 0.7, 1.7)
	for i, limit := range []float64{50, 100} {
		reload(t, s, limitCorefile(port, fmt.Sprintf("requests-per-second %.0f", limit)))
		// The new servers take the filter over as they start, which may be
		// after CoreDNS has said the reload is complete.
		waitLog(t, s, attached, i+2)
		what := fmt.Sprintf("reloaded with requests-per-second %.0f", limit)
		rates = append(rates, answered(t, port, 100*time.Millisecond, time.Second))
		checkRate(t, what, rates[i+1], limit, 0.7, 1.7)
		if k := socketFilter(t, s, port); k != procsock.EBPFFilter {
			t.Errorf("%s: the socket carries %s, want the eBPF filter", what, k)
		}
	}
	// Each limit, not a neighbour's: the bounds above overlap.
	if rates[1] > 0.5*rates[0] || rates[2] < 1.4*rates[1] {
		t.Errorf("answers per second %.0f, %.0f, %.0f at limits 200, 50, 100: want each to follow its limit", rates[0], rates[1], rates[2])
	}
	reload(t, s, limitCorefile(port, "-"))
	checkRate(t, "reloaded without rrl", answered(t, port, 100*time.Millisecond, time.Second), floodRate, 0.9, 1.1)
	if k := socketFilter(t, s, port); k != procsock.NoFilter {
		t.Errorf("reloaded without rrl: the socket carries %s, want no filter", k)
	}
}

func TestCoreDNSReloadKernelFilterOff(t *testing.T) {
	// A reload that turns the kernel filter off takes it off the socket: the new
	// limit applies in Go, not the old one in the kernel.
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_SYS_PTRACE)
	port := freePort(t)
	s := startCoreDNS(t, limitCorefile(port, "requests-per-second 50"), map[string]string{"db.example.test": exampleZone})
	waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": ebpf", 1)
	checkRate(t, "requests-per-second 50", answered(t, port, 500*time.Millisecond, time.Second), 50, 0.7, 1.7)
	reload(t, s, limitCorefile(port, "requests-per-second 200\n        kernel-filter off"))
	checkRate(t, "reloaded with kernel-filter off, requests-per-second 200", answered(t, port, 500*time.Millisecond, time.Second), 200, 0.7, 1.7)
	if k := socketFilter(t, s, port); k != procsock.NoFilter {
		t.Errorf("reloaded with kernel-filter off: the socket carries %s, want no filter", k)
	}
}

// twoBlocks serves example.test and other.test in two server blocks on one
// address, 127.0.0.1:port, with the rrl properties a and b and, when mport is not
// 0, metrics on it.
func twoBlocks(port, mport int, a, b string) string {
	prom := ""
	if mport != 0 {
		prom = fmt.Sprintf("prometheus 127.0.0.1:%d", mport)
	}
	return fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    %s
    rrl {
        %s
    }
    file db.example.test
}
other.test:%d {
    bind 127.0.0.1
    %s
    rrl {
        %s
    }
    file db.other.test
}
`, port, prom, a, port, prom, b)
}

const otherZone = `$ORIGIN other.test.
@	300 IN SOA ns.other.test. host.other.test. 1 7200 3600 1209600 300
	300 IN NS ns.other.test.
ns	300 IN A 192.0.2.53
www	300 IN A 192.0.2.3
`

func TestCoreDNSTwoBlocksDisagree(t *testing.T) {
	// Two blocks on one address share its sockets, so one kernel filter: a
	// Corefile in which they disagree on what it does is refused, naming both.
	// (TestDisagreement has the other cases.)
	for _, tc := range []struct{ a, b, want string }{
		{"requests-per-second 100", "requests-per-second 50", `requests-per-second ("100" and "50")`},
		{"cookies 000102030405060708090a0b0c0d0e0f", "cookies", "the cookie secrets (not shown)"},
	} {
		port := freePort(t)
		s := runCoreDNS(t, twoBlocks(port, 0, tc.a, tc.b), map[string]string{"db.example.test": exampleZone, "db.other.test": otherZone})
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s / %s: CoreDNS still running after a minute:\n%s", tc.a, tc.b, s.log())
		}
		log := s.log()
		want := fmt.Sprintf(`server blocks "dns://example.test.:%d" (Corefile:4) and "dns://other.test.:%d" (Corefile:12) share the sockets of dns://127.0.0.1:%d`, port, port, port)
		if s.err == nil || !strings.Contains(log, want) || !strings.Contains(log, "disagree on "+tc.want) {
			t.Errorf("%s / %s: exit %v, output:\n%s\nwant a failure with %q and %q", tc.a, tc.b, s.err, log, want, tc.want)
		}
		if strings.Contains(log, "0001020304") {
			t.Errorf("the output shows the cookie secret:\n%s", log)
		}
	}
}

func TestCoreDNSTwoBlocksOneLimit(t *testing.T) {
	// Two blocks on one address that agree share one set of request limits: a
	// one-source flood of either block's zone is trimmed once, in the kernel, to
	// requests-per-second, and not again in Go by its block: every query the
	// kernel passes is answered. (Limited twice at one limit, the rate drops only
	// by a fifth or so, but a share of what the kernel passed goes unanswered.)
	requirePrivilege(t, unix.CAP_BPF)
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, twoBlocks(port, mport, "requests-per-second 100", "requests-per-second 100\n        responses-per-second 1000"),
		map[string]string{"db.example.test": exampleZone, "db.other.test": otherZone})
	waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": ebpf", 1)
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	for i, zone := range []string{"example.test", "other.test"} {
		// Both blocks show the socket's filter; the last one's for certain.
		passed := metric(t, mAddr, "coredns_rrl_filter_passed_total", `zone="other.test."`)
		rate, total := answeredName(t, port, "www."+zone+".", time.Duration(500-400*i)*time.Millisecond, time.Second)
		passed = metric(t, mAddr, "coredns_rrl_filter_passed_total", `zone="other.test."`) - passed
		checkRate(t, zone, rate, 100, 0.7, 1.7)
		t.Logf("%s: %d answered of %.0f the kernel passed", zone, total, passed)
		if float64(total) < 0.97*passed || float64(total) > passed {
			t.Errorf("%s: %d answered of %.0f the kernel passed: want all, limited once", zone, total, passed)
		}
	}
}

// kernelUnfit is a list of exempt-clients that the kernel filter cannot hold
// (1025 IPv4 prefixes, one more than it takes) and the Go limiter can: a Config
// that every filter take-over and attach refuses.
func kernelUnfit() string {
	var b strings.Builder
	b.WriteString("exempt-clients")
	for i := range 1025 {
		fmt.Fprintf(&b, " 10.0.%d.%d", i/256, i%256)
	}
	return b.String()
}

func TestCoreDNSReloadTakeOverFails(t *testing.T) {
	// A reload whose settings the kernel filter cannot take (its take-over of the
	// running filter fails) enforces the new request limits in Go: neither the old
	// limit stays in the kernel nor does the flood go unlimited, and the log says so.
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_SYS_PTRACE)
	port := freePort(t)
	s := startCoreDNS(t, limitCorefile(port, "requests-per-second 50"), map[string]string{"db.example.test": exampleZone})
	attached := "kernel filter for dns://127.0.0.1:" + strconv.Itoa(port) + ": "
	waitLog(t, s, attached+"ebpf", 1)
	checkRate(t, "requests-per-second 50", answered(t, port, 500*time.Millisecond, time.Second), 50, 0.7, 1.7)
	reload(t, s, limitCorefile(port, "requests-per-second 200\n        "+kernelUnfit()))
	waitLog(t, s, attached, 2)
	var last string
	for l := range strings.Lines(s.log()) {
		if strings.Contains(l, attached) {
			last = l
		}
	}
	if !strings.Contains(last, "request limits in Go") {
		t.Errorf("the log's last line on the filter is %q, want it to say the request limits are in Go", last)
	}
	checkRate(t, "reloaded with settings the kernel cannot take", answered(t, port, 500*time.Millisecond, time.Second), 200, 0.7, 1.7)
}

// twoZones serves example.test on 127.0.0.1:port with rrl properties a and, when
// port2 is not 0, other.test on 127.0.0.1:port2 with rrl properties b.
func twoZones(port int, a string, port2 int, b string) string {
	s := fmt.Sprintf("example.test:%d {\n    bind 127.0.0.1\n    rrl {\n        %s\n    }\n}\n", port, a)
	if port2 != 0 {
		s += fmt.Sprintf("other.test:%d {\n    bind 127.0.0.1\n    rrl {\n        %s\n    }\n}\n", port2, b)
	}
	return s
}

func TestReloadFailsAfterStartup(t *testing.T) {
	// A reload that fails once the new load's OnStartup has run (its second
	// block's port is taken, so its servers cannot start) leaves the running
	// protection exactly as it was: same Protection, same filter with the same
	// settings, still the newest load (so its shutdown hands the filter to none of
	// the failed load's blocks) and still the one whose metrics are exported; and
	// nothing of the failed load stays open. A later reload works as usual. CoreDNS
	// runs in this process, so that the plugin's state can be looked at.
	oldDirectives := dnsserver.Directives
	dnsserver.Directives = Directives(dnsserver.Directives)
	var mu sync.Mutex
	var made []*RRL
	testHookSetup = func(p *RRL) {
		mu.Lock()
		made = append(made, p)
		mu.Unlock()
	}
	t.Cleanup(func() { dnsserver.Directives, testHookSetup = oldDirectives, nil })
	plugins := func() []*RRL {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(made)
	}
	input := func(corefile string) caddy.Input {
		return caddy.CaddyfileInput{Contents: []byte(corefile), Filepath: "Corefile", ServerTypeName: "dns"}
	}
	served := func(p *RRL) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for p.prot.Load().Status().Sockets == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("no socket handed to the Protection within 5s: %v", p.prot.Load().Status())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// closed reports whether p's Protection is closed, updating it when it is not.
	closed := func(p *RRL) bool {
		_, err := p.prot.Load().Update(rrl.NewConfig())
		return errors.Is(err, rrl.ErrClosed)
	}
	requests := func(f *rrl.Filter) string {
		for _, kv := range f.Config().Values() {
			if kv[0] == "requests-per-second" {
				return kv[1]
			}
		}
		return ""
	}

	port, port2 := freePort(t), freePort(t)
	addr := "dns://127.0.0.1:" + strconv.Itoa(port)
	inst, err := caddy.Start(input(twoZones(port, "requests-per-second 100", 0, "")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		inst.Stop()
		inst.ShutdownCallbacks()
	}()
	if len(plugins()) != 1 {
		t.Fatalf("%d blocks set up, want 1", len(plugins()))
	}
	running := plugins()[0]
	served(running)
	prot := running.prot.Load()
	status, f := prot.Status().String(), prot.Filter()
	load.Lock()
	runningLoad := load.cur
	load.Unlock()
	if f == nil || requests(f) != "100" {
		t.Fatalf("the running filter %v has requests-per-second %q, want 100 (%s)", f, requests(f), status)
	}

	// The failing reload: other.test's port is taken (by a socket without
	// SO_REUSEPORT), and example.test's limit would change.
	taken, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port2))
	if err != nil {
		t.Fatal(err)
	}
	next, err := inst.Restart(input(twoZones(port, "requests-per-second 50", port2, "requests-per-second 50")))
	if err == nil || next != inst {
		t.Fatalf("reload with port %d taken: %v, want it to fail and keep the running instance", port2, err)
	}
	t.Logf("reload failed as it should: %v", err)
	failed := plugins()[1:]
	if len(failed) != 2 {
		t.Fatalf("the failed reload set up %d blocks, want 2", len(failed))
	}
	for i, p := range failed {
		if p.prot.Load() == nil {
			t.Fatalf("block %d of the failed reload has no Protection: its OnStartup did not run, so the reload failed too early to test", i)
		}
		if !closed(p) {
			t.Errorf("block %d of the failed reload: its Protection is still open", i)
		}
	}
	if running.prot.Load() != prot {
		t.Fatal("the running block's Protection was replaced")
	}
	// Close would have taken the filter off: the same status, filter and limit
	// say the Protection is open and unchanged.
	if got := prot.Status().String(); got != status || prot.Filter() != f || requests(f) != "100" {
		t.Errorf("running protection after the failed reload: %q with filter %p (requests-per-second %q), want %q with %p (100)", got, prot.Filter(), requests(f), status, f)
	}
	load.Lock()
	cur := load.cur
	load.Unlock()
	if cur != runningLoad {
		t.Error("the newest load is the failed one, not the running one")
	}
	if s, _ := successors(addr); len(s) != 1 || s[0] != running {
		t.Errorf("the blocks that would take the filter over on %s are %v, want the running one", addr, s)
	}
	if running.src.cur.Load() != running {
		t.Error("the running block's metrics are not exported")
	}

	// A reload that works afterwards: the new block takes the filter over, and
	// the running one's Close leaves it on the socket.
	taken.Close()
	next, err = inst.Restart(input(twoZones(port, "requests-per-second 50", port2, "requests-per-second 50")))
	if err != nil {
		t.Fatalf("reload with the port free again: %v", err)
	}
	inst = next
	fresh := plugins()[3:]
	if len(fresh) != 2 {
		t.Fatalf("the second reload set up %d blocks, want 2", len(fresh))
	}
	served(fresh[0])
	if !closed(running) {
		t.Error("the block the reload replaced: its Protection is still open")
	}
	if s, _ := successors(addr); len(s) != 1 || s[0] != fresh[0] {
		t.Errorf("after the second reload the blocks on %s are %v, want the new one", addr, s)
	}
	if nf := fresh[0].prot.Load().Filter(); nf == nil || requests(nf) != "50" {
		t.Errorf("after the second reload the filter on %s is %v with requests-per-second %q, want 50", addr, nf, requests(nf))
	}
}
