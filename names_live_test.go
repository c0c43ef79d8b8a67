//go:build linux

package rrl

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The names judge, live (docs/names.md): the capped server of the capacity tests
// (capacity_live_test.go: namespace, CPU quota, C measured), serving victim.test.
// (with the wildcard *.wild.victim.test.) and other.test. as an authoritative
// server does: answers for the names that exist, NXDOMAIN with the SOA for the
// others. 200 resolvers, each in a /16 of its own, forward their users' queries
// for existing victim.test. names (real sockets that count their answers) and a
// random-subdomain flood under victim.test. (spoofed from their /16s); 20 clients
// of other.test. ask its existing names.

const namesChildEnv = "RRL_NAMES_CHILD" // keyword=value;... and filter=off

// namesVictim and namesOther are the existing names of the two zones.
var (
	namesVictim = []string{"www", "mail", "ns1", "ns2", "api", "cdn", "shop", "blog", "img", "vpn"}
	namesOther  = []string{"www", "mail", "ns1", "ns2"}
)

// namesZoneHandler answers as the authoritative server of victim.test. and
// other.test.
func namesZoneHandler() dns.Handler {
	exists := map[string]bool{}
	for _, n := range namesVictim {
		exists[n+".victim.test."] = true
	}
	for _, n := range namesOther {
		exists[n+".other.test."] = true
	}
	soa := map[string]dns.RR{}
	for _, apex := range []string{"victim.test.", "other.test."} {
		rr, _ := dns.NewRR(apex + " 300 IN SOA ns1." + apex + " hostmaster." + apex + " 1 7200 900 1209600 300")
		soa[apex] = rr
	}
	return dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		name := strings.ToLower(r.Question[0].Name)
		apex := ""
		for a := range soa {
			if dns.IsSubDomain(a, name) {
				apex = a
			}
		}
		a := func() {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}}
		}
		switch {
		case apex == "":
			m.Rcode = dns.RcodeRefused
		case exists[name]:
			a()
		case dns.IsSubDomain("wild.victim.test.", name) && name != "wild.victim.test.":
			a()
			SetWildcardOrigin(w, "wild.victim.test.")
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{soa[apex]}
		}
		w.WriteMsg(m)
	})
}

// TestNamesServerChild is the server of the live names tests; it runs only as their
// child (namesChildEnv set), as TestCapacityServerChild does.
func TestNamesServerChild(t *testing.T) {
	spec, ok := os.LookupEnv(namesChildEnv)
	if !ok {
		t.Skip("the live names tests' server: it runs only as their child")
	}
	cfg := NewConfig()
	var opts []Option
	pinned := false
	for kv := range strings.SplitSeq(spec, ";") {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
		case k == "filter" && v == "off":
			opts = append(opts, WithoutFilter())
		case k == "pin" && v == "on":
			pinned = true
		default:
			if err := cfg.SetValue(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if pinned {
		// The filter loaded and pinned first (rrlctl load's step), the server
		// attached to the pins, the controller run by the server (RunCapacity).
		// The bpffs is mounted in the child's own mount namespace (ip netns exec
		// makes one), so it goes with the child.
		const mnt = "/sys/fs/bpf"
		if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
			t.Fatalf("mount bpffs: %v", err)
		}
		dir := mnt + "/rrl-names"
		if err := LoadPinned(cfg, dir, 0, 0); err != nil {
			t.Fatal(err)
		}
		opts = append(opts, WithPinned(dir))
	}
	udp, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(capServerAddr)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Protect(udp, namesZoneHandler(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if pinned {
		go p.Filter().RunCapacity(context.Background(), udp)
	}
	serveCapChild(p)
}

// namesStatus is a names status line of the server child.
type namesStatus struct {
	Wall         int64 `json:"wall"`
	Names        NameStats
	Seen, Passed uint64
}

// namesLog collects a child's names status lines.
type namesLog struct {
	mu  sync.Mutex
	sts []namesStatus
}

// timeline logs the names judge's counts per quarter second from start.
func (n *namesLog) timeline(t testing.TB, start time.Time, end time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var b strings.Builder
	at := func(d time.Duration) (namesStatus, bool) {
		for _, s := range n.sts {
			if time.Unix(0, s.Wall).Sub(start) >= d {
				return s, true
			}
		}
		return namesStatus{}, false
	}
	for d := time.Duration(0); d < end; d += 250 * time.Millisecond {
		a, ok1 := at(d)
		c, ok2 := at(d + 250*time.Millisecond)
		if !ok1 || !ok2 {
			break
		}
		secs := float64(c.Wall-a.Wall) / 1e9
		r := func(x, y uint64) float64 { return float64(y-x) / secs }
		fmt.Fprintf(&b, "\n  %4.2fs judged %6.0f/s passed %6.0f/s known %6.0f/s unknown %6.0f/s names-limited %6.0f/s unknown passed %6.0f/s names level %7.1f",
			d.Seconds(), r(a.Seen, c.Seen), r(a.Passed, c.Passed), r(a.Names.Known, c.Names.Known), r(a.Names.Unknown, c.Names.Unknown),
			r(a.Names.Limited, c.Names.Limited), r(a.Names.UnknownPassed, c.Names.UnknownPassed), c.Names.Level)
	}
	t.Log(b.String())
}

// startNames runs the names server child with settings in l's namespace and cgroup.
func (l *capLive) startNames(t testing.TB, settings string) (*capChild, *namesLog) {
	t.Helper()
	nl := &namesLog{}
	c := l.startChild(t, "TestNamesServerChild", namesChildEnv, settings, func(line string) {
		if s, ok := strings.CutPrefix(line, "namestat "); ok {
			var st namesStatus
			if json.Unmarshal([]byte(s), &st) == nil {
				nl.mu.Lock()
				nl.sts = append(nl.sts, st)
				nl.mu.Unlock()
			}
		}
	})
	return c, nl
}

// liveNameQuery packs a query for name with ID 0.
func liveNameQuery(name string) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = 0
	b, _ := m.Pack()
	return b
}

// randomNames returns n queries for distinct random names under parent.
func randomNames(n int, parent string, seed uint64) [][]byte {
	out := make([][]byte, n)
	x := seed
	for i := range out {
		x = mix64(x + uint64(i))
		out[i] = liveNameQuery(fmt.Sprintf("r%011x.%s", x&0xfffffffffff, parent))
	}
	return out
}

// namesScenario is the outcome of one run of the scenario.
type namesScenario struct {
	victim, other float64 // shares of existing names answered from 1 s into the flood
	answered      float64 // server's answers per second then, in C
}

// runNames runs the scenario against a server with settings: from 0 s to end the
// resolvers' users ask existing victim.test. names at 0.2 C in all and the other.test.
// clients its names at 0.1 C; from floodFrom the resolvers forward random names
// under parent at 3 C in all (flood false: none).
func (l *capLive) runNames(t testing.TB, C float64, settings, parent string, flood bool) namesScenario {
	const floodFrom, end = 1 * time.Second, 5 * time.Second
	child, nl := l.startNames(t, settings)
	if !strings.Contains(settings, "filter=off") && !strings.Contains(child.ready, "request limits in the kernel") {
		t.Fatalf("server (%s): %s; the eBPF mode needs the filter in force", settings, child.ready)
	}
	w := watchRcvbuf(t, child.cmd.Process.Pid)
	var clients []*capClient
	for k := range 200 {
		c := l.newClient(t, fmt.Sprintf("victim%d", k), netip.AddrFrom4([4]byte{127, byte(20 + k), 0, 1}), 0.2*C/200, 0, end, false)
		c.query = liveNameQuery(namesVictim[k%len(namesVictim)] + ".victim.test.")
		clients = append(clients, c)
	}
	for k := range 20 {
		c := l.newClient(t, fmt.Sprintf("other%d", k), netip.AddrFrom4([4]byte{127, byte(230 + k), 0, 1}), 0.1*C/20, 0, end, false)
		c.query = liveNameQuery(namesOther[k%len(namesOther)] + ".other.test.")
		clients = append(clients, c)
	}
	var flows []loadgen.Flow
	for _, c := range clients {
		flows = append(flows, loadgen.Flow{Name: c.name, Rate: c.rate, Start: c.from, End: c.to, Src: func(int) netip.AddrPort { return netip.AddrPort{} }, Payload: func(i int) []byte {
			q := append([]byte(nil), c.query...)
			binary.BigEndian.PutUint16(q, uint16(i))
			return q
		}})
	}
	if flood {
		pool := randomNames(1<<16, parent, uint64(time.Now().UnixNano()))
		flows = append(flows, loadgen.Flow{Rate: 3 * C, Start: floodFrom, End: end,
			Src: func(i int) netip.AddrPort {
				k := i % 200
				return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(20 + k), byte(1 + i/200%200), byte(2 + i%250)}), uint16(1024+(i*7919)%60000))
			},
			Payload: func(i int) []byte {
				q := append([]byte(nil), pool[i%len(pool)]...)
				binary.BigEndian.PutUint16(q, uint16(i))
				return q
			}})
	}
	r := &capRun{clients: clients}
	err := l.ns.Do(func() error {
		raw, err := loadgen.NewRawSender(l.dst)
		if err != nil {
			return err
		}
		defer raw.Close()
		r.start = time.Now()
		sent, err := loadgen.Pace(r.start, flows, end, time.Millisecond, func(fi int, src netip.AddrPort, payload []byte) error {
			if fi < len(clients) {
				_, err := clients[fi].conn.Write(payload)
				return err
			}
			return raw.Send(loadgen.Packet(src, l.dst, payload))
		})
		r.sent = sent[:len(clients)]
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	w.stop()
	sts := child.statuses()
	child.stop()
	var out namesScenario
	from := floodFrom + time.Second
	if !flood {
		from = 0
	}
	out.victim, _ = r.share(prefixed("victim"), from, end)
	out.other, _ = r.share(prefixed("other"), from, end)
	out.answered = answeredRate(sts, r.start, from, end) / C
	// Without a flood the timelines are logged only when a query went
	// unanswered: they show whether the controller saw an overload (the capped
	// server stalling) or the names judge limited.
	if flood || out.victim < 1 || out.other < 1 {
		logTimeline(t, sts, w, r.start, end)
		nl.timeline(t, r.start, end)
	}
	return out
}

// measureNames returns C of the names server: what it answers per second when
// saturated with queries for existing names, without limits.
func (l *capLive) measureNames(t testing.TB) float64 {
	child, _ := l.startNames(t, "filter=off")
	pool := [][]byte{liveNameQuery("www.victim.test."), liveNameQuery("mail.victim.test.")}
	flows := []loadgen.Flow{{Rate: 20000, End: 2500 * time.Millisecond, Src: spreadNets(), Payload: func(i int) []byte { return pool[i%2] }}}
	var start time.Time
	err := l.ns.Do(func() error {
		raw, err := loadgen.NewRawSender(l.dst)
		if err != nil {
			return err
		}
		defer raw.Close()
		start = time.Now()
		_, err = loadgen.Pace(start, flows, 2500*time.Millisecond, time.Millisecond, func(_ int, src netip.AddrPort, payload []byte) error {
			return raw.Send(loadgen.Packet(src, l.dst, payload))
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the last status lines
	c := answeredRate(child.statuses(), start, time.Second, 2500*time.Millisecond)
	child.stop()
	if !(c > 0) {
		t.Fatalf("capacity measurement: answered %.0f/s", c)
	}
	t.Logf("C = %.0f answered per second when saturated", c)
	return c
}

// namesModes are the modes the live names tests run the server in: the Go-only
// mode (no eBPF filter; the Go limiter judges in the server's reader), the eBPF
// mode (the names judge in the kernel, taught by the Handler's answers), and the
// pinned mode (the same filter loaded and pinned first, the server attached to the
// pins, teaching the pinned tables, and running the pins' controller).
var namesModes = []struct{ name, settings string }{
	{"go", "filter=off;"},
	{"ebpf", ""},
	{"pinned", "pin=on;"},
}

// TestLiveNames runs the scenario against the capped server with capacity
// auto and the names judge on, in each mode (namesModes, one measured C for both;
// the kernel modes' wildcard variants are BenchmarkLiveNames's, and the pinned mode
// runs the flood under victim.test. only):
// at least half the existing names of the attacked zone answered from 1 s into the
// flood (names off: 6-26% in the Go-only mode), the same with the random names under
// a wildcard, and without a flood every query answered. The figures with names off
// are logged beside them (RRL_NAMES_COMPARE=1); BenchmarkLiveNames reports them
// against the bars.
func TestLiveNames(t *testing.T) {
	l := newCapLive(t)
	release, err := testutil.LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	C := l.measureNames(t)
	for _, mode := range namesModes {
		t.Run(mode.name, func(t *testing.T) {
			on, off := mode.settings+"capacity=auto", mode.settings+"capacity=auto;names=off"
			for _, tc := range []struct {
				name, parent string
			}{
				{"random names", "victim.test."},
				{"random names under a wildcard", "wild.victim.test."},
			} {
				if mode.name != "go" && tc.parent != "victim.test." {
					// The kernel's wildcard classification is the Go one's bit for
					// bit (TestNamesJudgeKernelMatchesLimiter); the kernel modes'
					// runs under the wildcard are BenchmarkLiveNames's, to keep
					// the suite's time.
					continue
				}
				t.Run(tc.name, retryLive(func(t *testing.T, errorf func(string, ...any)) {
					if os.Getenv("RRL_NAMES_COMPARE") != "" {
						was := l.runNames(t, C, off, tc.parent, true)
						t.Logf("names off: existing victim.test. names %.4f, other.test. %.4f, answered %.2f C", was.victim, was.other, was.answered)
					}
					got := l.runNames(t, C, on, tc.parent, true)
					t.Logf("names on: existing victim.test. names %.4f, other.test. %.4f, answered %.2f C", got.victim, got.other, got.answered)
					// The bars (99%, 99%, 0.85 C) are not asserted in a
					// timed test: a loaded two-core machine moves them.
					// BenchmarkLiveNames reports them. In the Go-only mode the
					// flood is read before it is judged, and reading it takes
					// most of the capped server (docs/names.md, "Figures"); what
					// either mode holds on a loaded machine is most of the
					// attacked zone's real answers, where names off keeps 6-26%.
					if got.victim < 0.5 {
						errorf("existing victim.test. names %.4f answered (want >= 0.5; other.test. %.4f, answered %.2f C)", got.victim, got.other, got.answered)
					}
				}))
			}
			if mode.name == "pinned" {
				return // the same program and settings as the eBPF mode's: no flood is its
			}
			t.Run("no flood", retryLive(func(t *testing.T, errorf func(string, ...any)) {
				got := l.runNames(t, C, on, "", false)
				t.Logf("no flood: existing victim.test. names %.4f, other.test. %.4f", got.victim, got.other)
				if got.victim < 1 || got.other < 1 {
					// What the run was measured against, to tell a loss of the server's
					// from a C measured in a fast moment (0.3 C offered then exceeds it).
					load, _ := os.ReadFile("/proc/loadavg")
					errorf("without a flood: victim.test. %.4f, other.test. %.4f answered, want every query (0.3 C offered, C %.0f/s measured before; answered %.2f C; load average %s)",
						got.victim, got.other, C, got.answered, strings.TrimSpace(string(load)))
					// The capped server's C moves by half and more between runs of
					// this machine (3,192 and 6,617 in two runs an hour apart): a C
					// taken in a fast moment makes this load an overload, and every
					// attempt after it would fail alike. The next attempt (and the
					// modes after it) use C measured again, now.
					C = l.measureNames(t)
				}
			}))
		})
	}
}

// BenchmarkLiveNames runs the scenario with the names judge off and on, in
// each mode (namesModes), for the figures side by side (docs/names.md): the shares of
// existing victim.test. and other.test. names answered from 1 s into the flood, and
// what the server answered, in C. Run it with -benchtime 1x; RRL_NAMES_MODES=ebpf
// (or go) runs one mode.
func BenchmarkLiveNames(b *testing.B) {
	l := newCapLive(b)
	release, err := testutil.LockLive()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(release)
	C := l.measureNames(b)
	for _, mode := range namesModes {
		if m := os.Getenv("RRL_NAMES_MODES"); m != "" && !strings.Contains(m, mode.name) {
			continue
		}
		for _, parent := range []string{"victim.test.", "wild.victim.test."} {
			for _, names := range []string{"off", "on"} {
				b.Run(mode.name+" under "+parent+" names "+names, func(b *testing.B) {
					var got namesScenario
					for b.Loop() {
						got = l.runNames(b, C, mode.settings+"capacity=auto;names="+names, parent, true)
					}
					b.ReportMetric(100*got.victim, "%victim")
					b.ReportMetric(100*got.other, "%other")
					b.ReportMetric(got.answered, "C")
				})
			}
		}
	}
}
