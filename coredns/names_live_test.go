package coredns

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The names judge through CoreDNS (docs/names.md): a random-subdomain flood under
// victim.test. forwarded by resolvers that also forward their users' queries for
// names that exist, beside the clients of other.test., against CoreDNS serving both
// zones from files with the capacity mode at a configured capacity. CoreDNS runs
// as uid 65534, so the plugin's Protection holds the classic prefilter and judges
// in Go (the kernel program's names judge is not turned on yet): the mode in which
// CoreDNS without CAP_BPF runs, and in which a reload hands the Go Limiter over.

const victimZone = `$ORIGIN victim.test.
@	300 IN SOA ns1.victim.test. hostmaster.victim.test. 1 7200 900 1209600 300
	300 IN NS ns1.victim.test.
ns1	300 IN A 192.0.2.53
www	300 IN A 192.0.2.1
mail	300 IN A 192.0.2.2
api	300 IN A 192.0.2.3
cdn	300 IN A 192.0.2.4
shop	300 IN A 192.0.2.5
*.wild	300 IN A 192.0.2.9
`

const otherTestZone = `$ORIGIN other.test.
@	300 IN SOA ns1.other.test. hostmaster.other.test. 1 7200 900 1209600 300
	300 IN NS ns1.other.test.
ns1	300 IN A 198.51.100.53
www	300 IN A 198.51.100.1
mail	300 IN A 198.51.100.2
`

var (
	victimNames = []string{"www", "mail", "api", "cdn", "shop", "ns1"}
	otherNames  = []string{"www", "mail", "ns1"}
)

// The scenario: namesCapacity is the configured capacity (queries per second);
// namesResolvers resolvers, each in a /16 of its own, forward namesFlood random
// names per second in all and their users' namesKnown queries for existing
// victim.test. names; two clients ask namesOther for other.test. names. With names
// off the source limits share the capacity max-min: each resolver is trimmed to
// about 9 a second of its 52, and with it its users; the other clients, at 30 a
// second each, to the same 9.
const (
	namesCapacity  = 300
	namesResolvers = 30
	namesFlood     = 1500
	namesKnown     = 60
	namesOther     = 60
)

func namesCorefile(port, mport int, props string) string {
	return fmt.Sprintf(`victim.test:%d other.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    metadata
    rrl {
        capacity %d
        %s
    }
    file db.victim.test victim.test
    file db.other.test other.test
}
`, port, port, mport, namesCapacity, props)
}

// probe is a client socket whose queries' answers are counted: query i has ID i.
type probe struct {
	conn *net.UDPConn
	sent []time.Duration // when query i was sent, since the flood began
	ok   []atomic.Bool   // query i was answered with data
}

const probeMax = 8192 // queries per probe, at most

func newProbe(t *testing.T, src netip.Addr) *probe {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &probe{conn: c, ok: make([]atomic.Bool, probeMax)}
}

// read marks the answers until the socket's deadline.
func (p *probe) read(wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, 2048)
	for {
		n, err := p.conn.Read(buf)
		if err != nil {
			return
		}
		var m dns.Msg
		if m.Unpack(buf[:n]) == nil && m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0 && int(m.Id) < probeMax {
			p.ok[m.Id].Store(true)
		}
	}
}

// share returns the answered share of the probes' queries sent in [from, until),
// and how many were sent then.
func share(probes []*probe, from, until time.Duration) (float64, int) {
	sent, ok := 0, 0
	for _, p := range probes {
		for i, at := range p.sent {
			if at >= from && at < until {
				sent++
				if p.ok[i].Load() {
					ok++
				}
			}
		}
	}
	if sent == 0 {
		return 0, 0
	}
	return float64(ok) / float64(sent), sent
}

// namesRun is one flood's probes.
type namesRun struct {
	known, other []*probe
	start        time.Time
}

// runNamesFlood sends the scenario's traffic to 127.0.0.1:port for dur, the random
// names under parent, and returns once the last answers are in. during, if not nil,
// runs beside the flood.
func runNamesFlood(t *testing.T, port int, parent string, dur time.Duration, during func(r *namesRun)) *namesRun {
	t.Helper()
	dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	r := &namesRun{}
	var flood []*net.UDPConn
	for i := range namesResolvers {
		src := netip.AddrFrom4([4]byte{127, byte(20 + i), 0, 1})
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		flood = append(flood, c)
		r.known = append(r.known, newProbe(t, src))
	}
	for i := range 2 {
		r.other = append(r.other, newProbe(t, netip.AddrFrom4([4]byte{127, byte(200 + i), 0, 1})))
	}
	var wg sync.WaitGroup
	for _, p := range append(append([]*probe{}, r.known...), r.other...) {
		wg.Add(1)
		go p.read(&wg)
	}
	send := func(c *net.UDPConn, id uint16, name string) {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		q.Id = id
		b, _ := q.Pack()
		if _, err := c.WriteToUDP(b, dst); err != nil {
			t.Errorf("send: %v", err)
		}
	}
	query := func(p *probe, name string, now time.Duration) {
		if len(p.sent) < probeMax {
			p.sent = append(p.sent, now)
			send(p.conn, uint16(len(p.sent)-1), name)
		}
	}
	r.start = time.Now()
	done := make(chan struct{})
	if during != nil {
		go func() {
			defer close(done)
			during(r)
		}()
	} else {
		close(done)
	}
	var nFlood, nKnown, nOther int
	rnd := rand.New(rand.NewPCG(1, 2))
	for now := time.Since(r.start); now < dur; now = time.Since(r.start) {
		for due := int(namesFlood * now.Seconds()); nFlood < due; nFlood++ {
			send(flood[nFlood%namesResolvers], uint16(nFlood), fmt.Sprintf("r%08x.%s", rnd.Uint32(), parent))
		}
		for due := int(namesKnown * now.Seconds()); nKnown < due; nKnown++ {
			query(r.known[nKnown%namesResolvers], victimNames[nKnown%len(victimNames)]+".victim.test.", now)
		}
		for due := int(namesOther * now.Seconds()); nOther < due; nOther++ {
			query(r.other[nOther%2], otherNames[nOther%len(otherNames)]+".other.test.", now)
		}
		time.Sleep(2 * time.Millisecond)
	}
	<-done
	for _, p := range append(append([]*probe{}, r.known...), r.other...) {
		p.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	}
	wg.Wait()
	return r
}

// startNamesServer runs CoreDNS with the scenario's zones and props, as uid 65534
// (the classic prefilter, or none with kernel-filter off) unless root is set (the
// eBPF filter, the names judged in the kernel), and waits for its filter on the
// socket.
func startNamesServer(t *testing.T, props string, root ...bool) (s *server, port, mport int) {
	t.Helper()
	asRoot := len(root) > 0 && root[0]
	cred, mode := &syscall.Credential{Uid: 65534, Gid: 65534}, "classic"
	if asRoot {
		requirePrivilege(t, unix.CAP_BPF, unix.CAP_NET_ADMIN)
		cred, mode = nil, "ebpf"
	} else {
		requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	}
	port, mport = freePort(t), freePort(t)
	s = startCoreDNSAs(t, cred, namesCorefile(port, mport, props),
		map[string]string{"db.victim.test": victimZone, "db.other.test": otherTestZone})
	if !strings.Contains(props, "kernel-filter off") {
		waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": "+mode, 1)
	}
	return s, port, mport
}

func lockLive(t *testing.T) {
	t.Helper()
	release, err := testutil.LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}

// TestCoreDNSNames: under the flood, with the names judge on (the capacity mode's
// default) the existing names of the attacked zone and the other zone's names are
// answered, and many times better than with names off, where the capacity is shared
// by source and each resolver's users lose their answers with its random names; the
// same with the random names under the wildcard *.wild.victim.test., which the file
// plugin answers (reported through the metadata plugin).
func TestCoreDNSNames(t *testing.T) {
	lockLive(t)
	const dur, from = 3 * time.Second, time.Second
	cases := []struct{ props, parent string }{
		{"names on", "victim.test."},
		{"names on", "wild.victim.test."},
		{"names off", "victim.test."},
	}
	var known, other [3]float64
	for i, tc := range cases {
		props := tc.props + ", random names under " + tc.parent
		_, port, mport := startNamesServer(t, tc.props)
		r := runNamesFlood(t, port, tc.parent, dur, nil)
		var nk, no int
		known[i], nk = share(r.known, from, dur)
		other[i], no = share(r.other, from, dur)
		lateKnown, _ := share(r.known, 2*from, dur)
		lateOther, _ := share(r.other, 2*from, dur)
		t.Logf("%s, from %v: existing victim.test. names %.1f%%, other.test. %.1f%%", props, 2*from, 100*lateKnown, 100*lateOther)
		mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
		limited := metric(t, mAddr, "coredns_rrl_limiter_limited_total")
		t.Logf("%s: existing victim.test. names %.1f%% of %d answered, other.test. %.1f%% of %d; the Go limiter refused %.0f",
			props, 100*known[i], nk, 100*other[i], no, limited)
		if nk < namesKnown || no < namesOther {
			t.Fatalf("%s: %d and %d queries measured: the flood did not run", props, nk, no)
		}
		if limited == 0 {
			t.Errorf("%s: nothing refused: no overload", props)
		}
	}
	// The other clients, at 30 a second each the heaviest sources once the random
	// names are held, lose a little to the source limits while the levels settle.
	for i, tc := range cases[:2] {
		if known[i] < 0.8 || other[i] < 0.7 {
			t.Errorf("names on, random names under %s: existing names %.1f%%, other.test. %.1f%% answered, want at least 80%% and 70%%",
				tc.parent, 100*known[i], 100*other[i])
		}
		for _, c := range []struct {
			what    string
			on, off float64
		}{{"existing victim.test. names", known[i], known[2]}, {"other.test.", other[i], other[2]}} {
			t.Logf("random names under %s, %s: names on / names off = %.1f", tc.parent, c.what, c.on/max(c.off, 1e-3))
			if c.on < 2*c.off {
				t.Errorf("random names under %s, %s: %.1f%% answered with names on, %.1f%% with names off: want at least twice as many",
					tc.parent, c.what, 100*c.on, 100*c.off)
			}
		}
	}
}

// TestCoreDNSNamesReload: a reload in the middle of the flood hands the Go Limiter
// to the new load's Protection (with the classic prefilter, rrl's takeOver; with
// kernel-filter off, by the sockets the plugin gives it), or as root the eBPF
// filter with its names tables and counters (takeOver): the names judge's counters
// carry on, the names level stays in force, the existing names are judged known at
// once, and they and the other zone's names stay answered.
func TestCoreDNSNamesReload(t *testing.T) {
	lockLive(t)
	for _, m := range []struct {
		name, props string
		root        bool
	}{
		{"names-on", "names on", false},
		{"kernel-filter-off", "kernel-filter off", false},
		{"ebpf", "names on", true}, // as root: judged in the kernel, the tables pass with the filter
	} {
		t.Run(m.name, func(t *testing.T) { namesReload(t, m.props, m.root) })
	}
}

func namesReload(t *testing.T, props string, root bool) {
	s, port, mport := startNamesServer(t, props, root)
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	// The judge's metrics are the Go limiter's, or with the eBPF filter the
	// kernel program's.
	sub := "limiter"
	if root {
		sub = "filter"
	}
	knownCount := func() float64 {
		return metric(t, mAddr, "coredns_rrl_"+sub+"_names_queries_total", `tier="known"`)
	}
	const dur, reloadAt = 4500 * time.Millisecond, 2 * time.Second
	var before, after, end, level float64
	var reloaded, endAt time.Duration
	r := runNamesFlood(t, port, "victim.test.", dur, func(r *namesRun) {
		time.Sleep(reloadAt - time.Since(r.start))
		before = knownCount()
		reload(t, s, namesCorefile(port, mport, props+"\n        events-per-second 50"))
		reloaded = time.Since(r.start)
		after = knownCount()
		level = metric(t, mAddr, "coredns_rrl_"+sub+"_names_level_queries_per_second")
		time.Sleep(dur - 300*time.Millisecond - time.Since(r.start))
		end, endAt = knownCount(), time.Since(r.start)
	})
	t.Logf("known names counted: %.0f before the reload, %.0f after it (at %v), %.0f at %v; names level after it %.1f/s",
		before, after, reloaded.Round(time.Millisecond), end, endAt.Round(time.Millisecond), level)
	if after < before || before < namesKnown {
		t.Errorf("known names counted %.0f before the reload and %.0f after it: want the count to carry on", before, after)
	}
	if level <= 0 {
		t.Errorf("names level %v right after the reload: want the limit still in force", level)
	}
	// Every existing name, of both zones, is known to the judge from the first
	// query after the reload (the count is read after the query is answered: the
	// last 300 ms are left out, and a few answers in flight are allowed for).
	_, sentAfter := share(append(append([]*probe{}, r.known...), r.other...), reloaded, endAt)
	if judged := end - after; judged < 0.8*float64(sentAfter) {
		t.Errorf("%.0f of the %d existing-name queries sent after the reload were judged known: want them known at once", judged, sentAfter)
	}
	known, nk := share(r.known, reloaded, dur)
	other, no := share(r.other, reloaded, dur)
	t.Logf("after the reload: existing victim.test. names %.1f%% of %d answered, other.test. %.1f%% of %d", 100*known, nk, 100*other, no)
	if known < 0.8 || other < 0.8 {
		t.Errorf("after the reload: existing names %.1f%%, other.test. %.1f%% answered, want both at least 80%%", 100*known, 100*other)
	}
	if st := metric(t, mAddr, "coredns_rrl_"+sub+"_names_limited_total"); st == 0 {
		t.Error("no random name refused across the reload")
	}
}
