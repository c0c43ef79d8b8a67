//go:build linux

package rrl

import (
	"bufio"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// pinNamesExisting is how many names exist in the zone pinNamesServe serves:
// k0.victim.test. to k39.victim.test.
const pinNamesExisting = 40

// pinNamesServe is the "names" helper: an authoritative server of victim.test.
// (the names k0 to k39 exist, every other name is NXDOMAIN with the zone's SOA)
// behind a Protection on the filter pinned in dir, so that its Handler teaches the
// pinned tables. It serves until stdin closes; stdin's first line "WINDOW from to"
// (Unix ns) is the window whose random-name answers count in RandomSteady.
func pinNamesServe(conn *net.UDPConn, dir string, res helperResult) helperResult {
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		res.Err = err.Error()
		return res
	}
	soa, err := dns.NewRR("victim.test. 300 IN SOA ns1.victim.test. hostmaster.victim.test. 1 7200 900 1209600 300")
	if err != nil {
		res.Err = err.Error()
		return res
	}
	exists := map[string]bool{}
	for i := range pinNamesExisting {
		exists[fmt.Sprintf("k%d.victim.test.", i)] = true
	}
	var from, to atomic.Int64
	var mu sync.Mutex
	res.Known, res.KnownFirst = map[string]int{}, map[string]int64{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		now := time.Now().UnixNano()
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		name := strings.ToLower(r.Question[0].Name)
		mu.Lock()
		switch {
		case exists[name]:
			if res.Known[name] == 0 {
				res.KnownFirst[name] = now
			}
			res.Known[name]++
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 1)}}
		case strings.HasPrefix(name, "rnd-"):
			res.Random++
			if now >= from.Load() && now < to.Load() {
				res.RandomSteady++
			}
			fallthrough
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{soa}
		}
		mu.Unlock()
		w.WriteMsg(m)
	})
	p, err := Protect(conn, h, cfg, WithPinned(dir))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer p.Close()
	if st := p.Status(); st.Filter != ModeEBPF {
		res.Err = fmt.Sprintf("status %v: not on the pins", st)
		return res
	}
	res.Mode = p.Filter().Mode().String()
	srv := p.UDPServer()
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	fmt.Printf("READY %d\n", conn.LocalAddr().(*net.UDPAddr).Port)
	stdin := bufio.NewScanner(os.Stdin)
	if stdin.Scan() {
		var a, b int64
		fmt.Sscanf(stdin.Text(), "WINDOW %d %d", &a, &b)
		from.Store(a)
		to.Store(b)
	}
	for stdin.Scan() {
	}
	srv.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	out := res // the handler's maps, copied under its lock
	out.Known, out.KnownFirst = map[string]int{}, map[string]int64{}
	for k, v := range res.Known {
		out.Known[k], out.KnownFirst[k] = v, res.KnownFirst[k]
	}
	return out
}

// TestPinnedNamesTwoServers: two server processes (unprivileged, each a Protection
// on one pin directory, on one port with SO_REUSEPORT) answer and teach one names
// table and are judged by one zone budget. Each existing name is first asked once,
// from a socket of its own (the kernel spreads them over both processes); then,
// with a names level L in force, a random-subdomain flood under victim.test. from
// thousands of sources and queries for every existing name go to both: the random
// names both processes answer add up to one L, not one per process; every
// existing-name query, at either process, is counted known by the program and
// answered, those the other process learnt included.
func TestPinnedNamesTwoServers(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	const L = 200.0
	const dur = 2500 * time.Millisecond
	const from = time.Second
	e := newPinEnv(t)
	release, err := testutil.LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	dir := filepath.Join(e.mnt, "rrl")
	cfg := NewConfig()
	if err := cfg.SetValue("capacity", "auto"); err != nil {
		t.Fatal(err)
	}
	if err := LoadPinned(cfg, dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	a := e.start(t, "names", dir, nobody, nobody, 0)
	b := e.start(t, "names", dir, nobody, nobody, a.port)
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(a.port))

	// Teaching: each existing name once, from a fresh socket, and the zone.
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	for i := range pinNamesExisting + 4 {
		name := fmt.Sprintf("k%d.victim.test.", i)
		if i >= pinNamesExisting {
			name = fmt.Sprintf("nx%d.victim.test.", i)
		}
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		if _, _, err := c.Exchange(m, dst.String()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	taught := time.Now().UnixNano()

	f, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	setNamesLevel(t, f, L)
	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(32, 32))
	flows := []flow{{
		Name: "random", Rate: 15 * L, End: dur,
		Src: func(int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 8, byte(rng.IntN(256)), byte(1 + rng.IntN(254))}), uint16(20000+rng.IntN(20000)))
		},
		Payload: func(i int) []byte { return idQuery(t, i, fmt.Sprintf("rnd-%08x.victim.test.", rng.Uint32())) },
	}, {
		Name: "known", Rate: 1.5 * L, End: dur,
		Src: func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 7, byte(i % 8), 1}), uint16(30000+i%997))
		},
		Payload: func(i int) []byte { return idQuery(t, i, fmt.Sprintf("k%d.victim.test.", i%pinNamesExisting)) },
	}}
	start := time.Now()
	for _, s := range []*child{a, b} {
		fmt.Fprintf(s.stdin, "WINDOW %d %d\n", start.Add(from).UnixNano(), start.Add(dur).UnixNano())
	}
	raw := newRawSender(t, dst)
	sentAt, err := loadgen.Pace(start, flows, dur, 2*time.Millisecond, func(_ int, src netip.AddrPort, payload []byte) error {
		return raw.Send(loadgen.Packet(src, dst, payload))
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the last answers
	after, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := a.result(t), b.result(t)
	for _, r := range []helperResult{ra, rb} {
		if r.Err != "" || r.CloseErr != "" {
			t.Fatalf("server: %q, close %q", r.Err, r.CloseErr)
		}
	}
	t.Logf("a: random %d (window %d); b: random %d (window %d)", ra.Random, ra.RandomSteady, rb.Random, rb.RandomSteady)

	if sent := float64(count(sentAt[0], from, dur)) / (dur - from).Seconds(); sent < 8*L {
		t.Fatalf("random names sent at %.0f pps over [%v, %v), under 8 L: the sender fell behind, run not meaningful", sent, from, dur)
	}
	// One zone budget across both processes.
	win := (dur - from).Seconds()
	both := float64(ra.RandomSteady+rb.RandomSteady) / win
	t.Logf("random names answered from %v: a %.0f pps, b %.0f pps, together %.0f pps (level %.0f)",
		from, float64(ra.RandomSteady)/win, float64(rb.RandomSteady)/win, both, L)
	if both < 0.5*L || both > 1.4*L {
		t.Errorf("the two processes answered random names at %.0f pps together, want one level %.0f (0.5 to 1.4 times)", both, L)
	}
	if ra.RandomSteady == 0 || rb.RandomSteady == 0 {
		t.Errorf("random names did not reach both processes: %d, %d", ra.RandomSteady, rb.RandomSteady)
	}
	d := NameStats{
		Known:         after.Names.Known - before.Names.Known,
		Unknown:       after.Names.Unknown - before.Names.Unknown,
		Limited:       after.Names.Limited - before.Names.Limited,
		UnknownPassed: after.Names.UnknownPassed - before.Names.UnknownPassed,
	}
	t.Logf("names counters moved %+v, level %g", d, after.Names.Level)
	if d.Limited == 0 || d.Limited+d.UnknownPassed != d.Unknown {
		t.Errorf("names counters %+v: nothing limited, or limited and passed do not add up to the unknown", d)
	}
	if math.Abs(after.Names.Level-L) > 1e-6 {
		t.Errorf("names level %g after the run, want %g: a server process lifted it", after.Names.Level, L)
	}
	// Every existing name known at both sockets, and answered.
	sentKnown := len(sentAt[1])
	answered := 0
	for _, r := range []helperResult{ra, rb} {
		for _, n := range r.Known {
			answered += n
		}
	}
	if answered -= pinNamesExisting; answered < sentKnown*99/100 {
		t.Errorf("the processes answered %d of %d queries for existing names, want 99%%", answered, sentKnown)
	}
	if d.Known < uint64(answered) || d.Known > uint64(sentKnown) {
		t.Errorf("the program counted %d queries known; %d sent for existing names, %d answered", d.Known, sentKnown, answered)
	}
	// Names one process learnt alone were asked at the other too.
	learntBy := func(r helperResult, name string) bool {
		at, ok := r.KnownFirst[name]
		return ok && at < taught
	}
	for _, p := range []struct {
		name       string
		mine, peer helperResult
	}{{"a", ra, rb}, {"b", rb, ra}} {
		n := 0
		for name := range p.peer.KnownFirst {
			if learntBy(p.peer, name) && !learntBy(p.mine, name) && p.mine.Known[name] > 0 {
				n++
			}
		}
		t.Logf("%s answered %d names only the other process had learnt", p.name, n)
		if n == 0 {
			t.Errorf("%s answered no name that only the other process had learnt", p.name)
		}
	}
}
