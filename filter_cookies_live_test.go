package rrl

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/miekg/dns"
)

// cookieProbe sends single queries to a filtered socket from a real client socket
// and reports how the filter counted each.
type cookieProbe struct {
	t      *testing.T
	f      *Filter
	server *net.UDPConn
	client *net.UDPConn
}

func newCookieProbe(t *testing.T, f *Filter, server *net.UDPConn, network, from string) *cookieProbe {
	t.Helper()
	dst := server.LocalAddr().(*net.UDPAddr).AddrPort()
	if network == "udp6" || from == "::1" {
		dst = netip.AddrPortFrom(netip.MustParseAddr(from), dst.Port())
	} else if dst.Addr().IsUnspecified() {
		dst = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dst.Port())
	}
	client, err := net.DialUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(from), 0)), net.UDPAddrFromAddrPort(dst))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &cookieProbe{t: t, f: f, server: server, client: client}
}

func (p *cookieProbe) addr() netip.Addr { return p.client.LocalAddr().(*net.UDPAddr).AddrPort().Addr() }

// send sends a query carrying cookie (nil: none) and returns what the filter
// counted for it: the verdict, and whether the server received it.
func (p *cookieProbe) send(cookie []byte) (kernelVerdict, bool) {
	p.t.Helper()
	m := query("www.example.test.", dns.TypeA, true)
	if cookie != nil {
		setCookie(m, cookie)
	}
	b, err := m.Pack()
	if err != nil {
		p.t.Fatal(err)
	}
	before, err := p.f.Stats()
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := p.client.Write(b); err != nil {
		p.t.Fatal(err)
	}
	var st FilterStats
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, err = p.f.Stats(); err != nil {
			p.t.Fatal(err)
		}
		if st.Seen > before.Seen {
			break
		}
		if time.Now().After(deadline) {
			p.t.Fatal("the filter did not see the query")
		}
	}
	received := false
	if st.Passed > before.Passed {
		buf := make([]byte, 2048)
		p.server.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := p.server.Read(buf); err != nil {
			p.t.Fatalf("read a passed query: %v", err)
		}
		received = true
	}
	passed, invalid := st.CookiePassed-before.CookiePassed, st.CookieInvalid-before.CookieInvalid
	switch {
	case passed == 1 && invalid == 0:
		return verdictProven, received
	case passed == 0 && invalid == 1:
		return verdictInvalid, received
	case passed == 0 && invalid == 0:
		return verdictNone, received
	}
	p.t.Fatalf("cookie counters moved by %d passed, %d invalid", passed, invalid)
	return 0, false
}

// expect sends cookie and fails unless the filter's verdict is want and it passed.
func (p *cookieProbe) expect(step string, cookie []byte, want kernelVerdict) {
	p.t.Helper()
	if got, ok := p.send(cookie); got != want || !ok {
		p.t.Errorf("%s: kernel verdict %v (received %v), want %v", step, got, ok, want)
	}
}

func listenUDPAt(t *testing.T, network, addr string) *net.UDPConn {
	t.Helper()
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestUseCookiesFollowsCookies: on a real socket, the filter proves queries carrying
// a cookie of the Cookies it was given, and Rotate, ClearPrevious, SetPrevious,
// Update and UseCookies(nil) change its verdicts as they change Verify's.
func TestUseCookiesFollowsCookies(t *testing.T) {
	requireBPF(t)
	server := listenUDPAt(t, "udp4", "127.0.0.1:0")
	f, err := Attach(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newCookieProbe(t, f, server, "udp4", "127.0.0.1")
	client := []byte("8bytes!!")
	now := time.Now()
	a, b := NewCookies(testSecretA), NewCookies(testSecretB)
	cookieA, cookieB := a.Generate(client, p.addr(), now), b.Generate(client, p.addr(), now)

	p.expect("before UseCookies", cookieA, verdictNone)
	c := NewCookies(testSecretA)
	if err := f.UseCookies(c); err != nil {
		t.Fatal(err)
	}
	p.expect("no cookie", nil, verdictNone)
	p.expect("client cookie only", client, verdictNone)
	p.expect("current secret", cookieA, verdictProven)
	p.expect("unknown secret", cookieB, verdictInvalid)
	p.expect("stale", a.Generate(client, p.addr(), now.Add(-2*time.Hour)), verdictInvalid)
	// The program's wall clock: the ends of the freshness window, a few seconds in.
	for _, w := range []struct {
		age  time.Duration
		want kernelVerdict
	}{{3595 * time.Second, verdictProven}, {3605 * time.Second, verdictInvalid}, {-295 * time.Second, verdictProven}, {-305 * time.Second, verdictInvalid}} {
		p.expect(fmt.Sprintf("made %v ago", w.age), a.Generate(client, p.addr(), time.Now().Add(-w.age)), w.want)
	}
	p.expect("for another address", a.Generate(client, netip.MustParseAddr("127.0.0.2"), now), verdictInvalid)
	c.Rotate(testSecretB)
	p.expect("after Rotate, the new secret", cookieB, verdictProven)
	p.expect("after Rotate, the old secret", cookieA, verdictProven)
	c.ClearPrevious()
	p.expect("after ClearPrevious, the old secret", cookieA, verdictInvalid)
	c.SetPrevious(testSecretA)
	p.expect("after SetPrevious", cookieA, verdictProven)
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "200"); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(cfg); err != nil {
		t.Fatal(err)
	}
	p.expect("after Update", cookieB, verdictProven)
	if err := f.UseCookies(nil); err != nil {
		t.Fatal(err)
	}
	p.expect("after UseCookies(nil)", cookieB, verdictNone)
	c.Rotate(testSecretC) // no longer subscribed: must not reach the filter
	p.expect("Rotate after UseCookies(nil)", NewCookies(testSecretC).Generate(client, p.addr(), now), verdictNone)

	if err := f.UseCookies(c); err != nil {
		t.Fatal(err)
	}
	p.expect("UseCookies again", NewCookies(testSecretC).Generate(client, p.addr(), now), verdictProven)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	c.Rotate(testSecretA) // after Close: nothing to write, nothing to fail
	if err := f.UseCookies(c); err == nil {
		t.Error("UseCookies on a closed filter: no error")
	}
}

// TestUseCookiesDualStack: on a dual-stack socket, an IPv4 client's cookie is made for
// its IPv4 address and an IPv6 client's for its IPv6 address, as Cookies does.
func TestUseCookiesDualStack(t *testing.T) {
	requireBPF(t)
	server := listenUDPAt(t, "udp", "[::]:0")
	f, err := Attach(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := NewCookies(testSecretA)
	if err := f.UseCookies(c); err != nil {
		t.Fatal(err)
	}
	client := []byte("dualstak")
	for _, from := range []string{"127.0.0.1", "::1"} {
		p := newCookieProbe(t, f, server, "udp", from)
		a := p.addr()
		p.expect(from+" valid", c.Generate(client, a, time.Now()), verdictProven)
		if a.Is4() {
			// The same cookie computed over the mapped form would be another one.
			mapped := c.Generate(client, netip.AddrFrom16(a.As16()), time.Now())
			p.expect(from+" made for the mapped address", mapped, verdictProven)
		}
		p.expect(from+" stale", c.Generate(client, a, time.Now().Add(-3601*time.Second)), verdictInvalid)
	}
}

// TestPinnedCookieSecrets: the cookie secrets pin is write-only for its group (mode
// 0220); through it an unprivileged member gives the pinned filter its secrets and
// rotates them, and cannot read them back (TestPinnedCookieSecretsChild).
func TestPinnedCookieSecrets(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", nobody, nobody)
	fi, err := os.Stat(filepath.Join(dir, pinCookieSecrets))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o220 {
		t.Errorf("%s: mode %04o, want 0220", pinCookieSecrets, fi.Mode().Perm())
	}
	out, err := unprivilegedRun(t, "TestPinnedCookieSecretsChild", "RRL_COOKIE_PIN_DIR="+dir)
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	// What the child wrote is what a Cookies rotated the same way holds.
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinCookieSecrets), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got filterCookieSecrets
	if err := m.Lookup(uint32(0), &got); err != nil {
		t.Fatal(err)
	}
	want := NewCookies(testSecretA)
	want.Rotate(testSecretB)
	w := cookieSecretsValue(want.keys.Load(), 0)
	if got.HasCurrent != 1 || got.HasPrevious != 1 || got.Current != w.Current || got.Previous != w.Previous || got.LayoutVersion != layoutVersion {
		t.Errorf("pinned secrets %+v, want %+v", got, w)
	}

	// A filter opened by root after the owner exited still proves those cookies.
	server := listenUDPAt(t, "udp4", "127.0.0.1:0")
	f, err := AttachPinned(server, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newCookieProbe(t, f, server, "udp4", "127.0.0.1")
	p.expect("cookie of the rotated secret", want.Generate([]byte("pinnedcl"), p.addr(), time.Now()), verdictProven)
}

// TestPinnedCookieSecretsChild is the unprivileged side of TestPinnedCookieSecrets.
func TestPinnedCookieSecretsChild(t *testing.T) {
	dir := os.Getenv("RRL_COOKIE_PIN_DIR")
	if !isUnprivilegedChild() || dir == "" {
		t.Skip("child of TestPinnedCookieSecrets")
	}
	checkUnprivileged(t)
	f, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := NewCookies(testSecretA)
	if err := f.UseCookies(c); err != nil {
		t.Fatalf("UseCookies as a member of the group: %v", err)
	}
	c.Rotate(testSecretB)
	path := filepath.Join(dir, pinCookieSecrets)
	for _, opts := range []*ebpf.LoadPinOptions{nil, {ReadOnly: true}} {
		if m, err := ebpf.LoadPinnedMap(path, opts); err == nil {
			m.Close()
			t.Errorf("opened %s with %+v", path, opts)
		}
	}
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{WriteOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v filterCookieSecrets
	if err := m.Lookup(uint32(0), &v); err == nil {
		t.Errorf("read the secrets through a write-only descriptor: %+v", v)
	}
}

// TestLiveCookieScenarios: a spoofed flood of 20 times the limit from one network
// (an IPv4 /24; an IPv6 /64 in a namespace of the test's own) and five resolvers in
// that network at 5% of the limit each. With valid server cookies the resolvers get
// their queries through while the flood is still trimmed to the network's limit; with
// stale cookies, or cookies made for another address of the network, they are
// limited like the flood; and a proven source at 10 times the limit is trimmed to
// its own address's limit.
func TestLiveCookieScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood scenarios take about 30 s")
	}
	requireBPF(t)
	const L = 500.0
	const dur = liveScenarioDur
	c := NewCookies(testSecretA)
	name := wireName("www", "example", "net")
	for _, family := range []string{"ipv4", "ipv6"} {
		// host is the network's address number h.
		host := func(h int) netip.Addr {
			if family == "ipv4" {
				return netip.AddrFrom4([4]byte{127, 31, 7, byte(h)})
			}
			return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x31, 0, 0, 0, 7, 14: byte(h >> 8), 15: byte(h)})
		}
		withCookie := func(cookie []byte) func(int) []byte {
			return func(i int) []byte { return cookieQuery(uint16(i), name, ednsOption(10, cookie)) }
		}
		resolvers := func(cookieFor func(r int) []byte) []flow {
			var out []flow
			for r := range 5 {
				src := netip.AddrPortFrom(host(201+r), uint16(41000+r))
				out = append(out, flow{Name: fmt.Sprintf("resolver%d", r), Rate: 0.05 * L, End: dur,
					Src: func(int) netip.AddrPort { return src }, Payload: withCookie(cookieFor(r))})
			}
			return out
		}
		// Each scenario's flood draws its sources from a generator of its own: the
		// scenarios run in parallel.
		seed := uint64(21)
		flood := func() flow {
			seed++
			rng := rand.New(rand.NewPCG(seed, 22))
			return flow{Name: "flood", Rate: 20 * L, End: dur, Src: func(int) netip.AddrPort {
				return netip.AddrPortFrom(host(1+rng.IntN(200)), uint16(1024+rng.IntN(60000)))
			}}
		}
		client := []byte("resolver")
		valid := func(r int) []byte { return c.Generate(client, host(201+r), time.Now()) }
		stale := func(r int) []byte { return c.Generate(client, host(201+r), time.Now().Add(-2*time.Hour)) }
		other := func(r int) []byte { return c.Generate(client, host(100+r), time.Now()) }
		proven := host(250)

		// group is the flows counted against the limit flow 0 is held to: the
		// network's, for the flood and for resolvers whose cookies do not prove them;
		// the proven source's address alone.
		resolversToo := []int{0, 1, 2, 3, 4, 5}
		scenarios := []struct {
			name  string
			flows []flow
			group []int
			check func(t *testing.T, run *liveRun)
		}{
			{"resolvers with valid cookies", append([]flow{flood()}, resolvers(valid)...), []int{0}, func(t *testing.T, run *liveRun) {
				for fi := 1; fi < len(run.flows); fi++ {
					if l := run.loss(fi); l > 0.005 {
						t.Errorf("%s lost %.2f%% of its queries, want at most 0.5%%", run.flows[fi].Name, 100*l)
					}
				}
				if run.filter.CookiePassed == 0 {
					t.Errorf("no query passed on a cookie: %+v", run.filter)
				}
			}},
			{"resolvers with stale cookies", append([]flow{flood()}, resolvers(stale)...), resolversToo, limitedLikeFlood},
			{"resolvers with cookies of other addresses", append([]flow{flood()}, resolvers(other)...), resolversToo, limitedLikeFlood},
			{"one proven source at 10x", []flow{{Name: "proven", Rate: 10 * L, End: dur,
				Src:     func(int) netip.AddrPort { return netip.AddrPortFrom(proven, 42000) },
				Payload: withCookie(c.Generate(client, proven, time.Now()))}}, []int{0}, nil},
		}
		for _, sc := range scenarios {
			t.Run(family+"/"+sc.name, func(t *testing.T) {
				t.Parallel() // see TestLiveLimiterScenarios
				var srv *udpServer
				var raw *rawSender
				var f *Filter
				if family == "ipv4" {
					srv, f = attachLive(t, fmt.Sprint(L))
					raw = newRawSender(t, srv.addr)
				} else {
					srv, raw, f = attachLiveIPv6(t, fmt.Sprint(L))
				}
				if err := f.UseCookies(c); err != nil {
					t.Fatal(err)
				}
				run := runLiveWith(t, srv, raw, f, sc.flows, dur)
				run.report(t)
				// The flood (or the single proven source) is held to its limit.
				run.checkHeld(t, 0, sc.group, L, liveSteadyFrom, dur)
				if sc.check != nil {
					sc.check(t, run)
				}
			})
		}
	}
}

// limitedLikeFlood fails t unless every resolver (flows 1..) lost about the flood's
// (flow 0) share of its queries and the program saw their cookies as invalid.
func limitedLikeFlood(t *testing.T, run *liveRun) {
	t.Helper()
	floodDelivered := 1 - run.loss(0)
	for fi := 1; fi < len(run.flows); fi++ {
		if d := 1 - run.loss(fi); d > 2*floodDelivered+0.02 {
			t.Errorf("%s delivered %.1f%%, the flood %.1f%%: want it limited like the flood", run.flows[fi].Name, 100*d, 100*floodDelivered)
		}
	}
	if run.filter.CookieInvalid == 0 || run.filter.CookiePassed != 0 {
		t.Errorf("cookies counted %d invalid, %d passed; want invalid ones only", run.filter.CookieInvalid, run.filter.CookiePassed)
	}
}

// TestProtectResolverLearnsCookie: through Protect, a resolver inside a network under
// a spoofed flood of 20 times the limit starts with only a client cookie, learns its
// server cookie from the first answer and goes on with it: every later query is
// answered during the flood, as the kernel filter (given the Handler's cookies by
// Protect) judges it only at its own address's limit.
func TestProtectResolverLearnsCookie(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	requireBPF(t)
	const L = 200.0
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", fmt.Sprint(L)); err != nil {
		t.Fatal(err)
	}
	p, addr := startProtected(t, cfg)
	if st := p.Status(); !st.KernelCookies || !strings.Contains(st.String(), "server cookies verified in the kernel") {
		t.Fatalf("status %v: want server cookies verified in the kernel", st)
	}
	resolver := netip.MustParseAddr("127.32.9.201")
	udp := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond,
		Dialer: &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(resolver, 0))}}
	cookie := []byte("learnme!") // the client cookie; the full cookie once learned
	ask := func() bool {
		q := new(dns.Msg)
		q.SetQuestion("www.example.test.", dns.TypeA)
		setCookie(q, cookie)
		r, _, err := udp.Exchange(q, addr.String())
		if err != nil || len(r.Answer) != 1 {
			return false
		}
		if c, ok := cookieFromMsg(r); ok && len(c) == cookieLen {
			cookie = c
		}
		return true
	}
	if !ask() || len(cookie) != cookieLen {
		t.Fatalf("first answer: no server cookie learned (%x)", cookie)
	}

	raw := newRawSender(t, addr)
	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		rng := rand.New(rand.NewPCG(31, 32))
		q := dnsQuery(1, false)
		n := 0
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		for {
			select {
			case <-stop:
				flooded <- n
				return
			case <-tick.C:
			}
			for ; n < int(20*L*time.Since(start).Seconds()); n++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 32, 9, byte(1 + rng.IntN(200))}), uint16(1024+rng.IntN(60000)))
				raw.Send(loadgen.Packet(src, addr, q))
			}
		}
	}()
	time.Sleep(time.Second) // the flood is trimmed to the /24's limit by now
	before, err := p.Filter().Stats()
	if err != nil {
		t.Fatal(err)
	}
	const queries = 40
	answered := 0
	for range queries {
		if ask() {
			answered++
		}
		time.Sleep(25 * time.Millisecond)
	}
	close(stop)
	sent := <-flooded
	after, err := p.Filter().Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flood: %d sent; resolver: %d/%d answered; filter: %+v", sent, answered, queries, after)
	if answered != queries {
		t.Errorf("resolver with a learned cookie: %d of %d answered during the flood", answered, queries)
	}
	if got := after.CookiePassed - before.CookiePassed; got < queries {
		t.Errorf("%d queries passed on a cookie, want %d", got, queries)
	}
	if sumLimited(after) == 0 {
		t.Error("the flood was not limited")
	}
}
