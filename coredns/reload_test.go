package coredns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
