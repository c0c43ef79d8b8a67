//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/miekg/dns"
)

// goCookieRPS is the request limit of the Go-limit cookie tests; their flood sends
// 20 times it from one /24.
const goCookieRPS = 200

// resolverResult is what a resolver inside a flooded /24 got.
type resolverResult struct {
	queries, answered int
	flood             int // flood packets sent
}

// resolverInFlood floods dst from 200 addresses of 127.33.net.0/24 (socketFlood),
// and meanwhile
// has a resolver on 127.x.net.201 of that /24 ask questions, one every 15 ms. With
// learn, the resolver first learns its server cookie from an answer before the
// flood, as a BIND resolver does, and sends it with every query (60 of them);
// otherwise it sends only a client cookie (20 queries, each given up after 80 ms).
// refused reads how many requests the server has refused so far: the resolver starts
// once the flood is being refused.
func resolverInFlood(t *testing.T, dst netip.AddrPort, net24 byte, learn bool, refused func() uint64) resolverResult {
	t.Helper()
	resolver := netip.AddrFrom4([4]byte{127, 33, net24, 201})
	res := resolverResult{queries: 60}
	timeout := 400 * time.Millisecond
	if !learn {
		res.queries, timeout = 20, 80*time.Millisecond
	}
	udp := &dns.Client{Net: "udp", Timeout: timeout,
		Dialer: &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(resolver, 0))}}
	cookie := []byte("resolver") // the client cookie; the full cookie once learned
	ask := func(id uint16) bool {
		q := new(dns.Msg)
		q.SetQuestion(fmt.Sprintf("q%d.example.test.", id), dns.TypeA)
		setCookie(q, cookie)
		r, _, err := udp.Exchange(q, dst.String())
		if err != nil || len(r.Answer) != 1 {
			return false
		}
		if c, ok := cookieFromMsg(r); ok && len(c) == cookieLen && learn {
			cookie = c
		}
		return true
	}
	if learn && (!ask(0) || len(cookie) != cookieLen) {
		t.Fatalf("first answer: no server cookie learned (%x)", cookie)
	}

	stopFlood := socketFlood(t, dst, net24)
	floodRefused(t, refused)
	for i := range res.queries {
		if ask(uint16(1 + i)) {
			res.answered++
		}
		time.Sleep(15 * time.Millisecond)
	}
	res.flood = stopFlood()
	return res
}

// floodRefused waits until refused (a server's count of refused requests) rises at
// half a socketFlood's rate or more over 50 ms: the flood's /24 is over its limit and
// most of its queries are refused, as they are for the rest of the flood.
func floodRefused(t *testing.T, refused func() uint64) {
	t.Helper()
	const window = 50 * time.Millisecond
	start, at, n := time.Now(), time.Now(), refused()
	for time.Since(start) < 5*time.Second {
		time.Sleep(window)
		now, m := time.Now(), refused()
		if float64(m-n) >= 0.5*20*goCookieRPS*now.Sub(at).Seconds() {
			t.Logf("the flood's /24 refused %v into the flood", now.Sub(start).Round(time.Millisecond))
			return
		}
		at, n = now, m
	}
	t.Fatalf("the flood's /24 was not refused at half its rate within %v", time.Since(start).Round(time.Millisecond))
}

// socketFlood sends 20 times goCookieRPS queries per second to dst from 200
// addresses of 127.33.net24.0/24 (ordinary bound sockets, which any user may use on
// loopback) until stop, which returns how many it sent.
func socketFlood(t *testing.T, dst netip.AddrPort, net24 byte) (stop func() int) {
	done, flooded := make(chan struct{}), make(chan int)
	go func() {
		s := loadgen.NewSocketSender(dst, 256)
		defer s.Close()
		q := dnsQuery(1, false)
		n := 0
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		for {
			select {
			case <-done:
				flooded <- n
				return
			case <-tick.C:
			}
			for ; n < int(20*goCookieRPS*time.Since(start).Seconds()); n++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 33, net24, byte(1 + n%200)}), 0)
				if err := s.Send(src, q); err != nil {
					t.Errorf("flood: %v", err)
					<-done
					flooded <- n
					return
				}
			}
		}
	}()
	return func() int {
		close(done)
		return <-flooded
	}
}

// goCookieModes are the ways a Protection ends up with the request limits in Go,
// each returning the Protection and the address it serves: by the readers of its own
// servers, or by the Handler under a host's server.
var goCookieModes = []struct {
	name string
	bpf  bool // the case injects a load failure into a process that could load eBPF
	make func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort)
}{
	{"classic filter, reader", true, func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) {
		failLoad(t, permissionError("rrl: load eBPF filter", errors.ErrUnsupported))
		return startProtected(t, cfg)
	}},
	{"classic filter, Handler", true, func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) {
		failLoad(t, permissionError("rrl: load eBPF filter", errors.ErrUnsupported))
		return attachedHost(t, cfg)
	}},
	{"no filter, reader", false, func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) {
		return startProtected(t, cfg, WithoutFilter())
	}},
	{"no filter, Handler", false, func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) {
		return attachedHost(t, cfg, WithoutFilter())
	}},
}

// attachedHost opens a loopback socket, gives it to a Protection of NewProtection
// with AttachLocal, and serves the Protection's Handler on it with a server of its
// own, as CoreDNS does.
func attachedHost(t *testing.T, cfg *Config, opts ...Option) (*Protection, netip.AddrPort) {
	t.Helper()
	conn, addr := listenLoopback(t)
	p, err := NewProtection(answerA, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.AttachLocal(addr); err != nil {
		t.Logf("AttachLocal: %v", err)
	}
	serveHost(t, conn, p.Handler())
	return p, addr
}

// checkGoCookies runs resolverInFlood against a Protection whose request limits
// run in Go: a resolver with a valid server cookie keeps at least 97% of its
// answers, judged at its own address by the Go limiter, while the flood of its /24
// is trimmed; one without a server cookie loses most of them.
func checkGoCookies(t *testing.T, p *Protection, addr netip.AddrPort, net24 byte) {
	t.Helper()
	st := p.Status()
	if st.RequestsInKernel || st.KernelSockets != 0 || !st.Cookies ||
		!strings.Contains(st.String(), "server cookies verified in Go before the request limits") {
		t.Fatalf("status %v: want the request limits and the cookie check in Go", st)
	}
	refused := func() uint64 { return p.Handler().Stats().RequestsLimited }
	res := resolverInFlood(t, addr, net24, true, refused)
	lim := p.Limiter().Stats()
	t.Logf("with a learned cookie: %d of %d answered; flood %d sent, %d refused; limiter %d passed on a cookie",
		res.answered, res.queries, res.flood, p.Handler().Stats().RequestsLimited, lim.CookiePassed)
	if float64(res.answered) < 0.97*float64(res.queries) {
		t.Errorf("resolver with a valid cookie: %d of %d answered, want 97%%", res.answered, res.queries)
	}
	if lim.CookiePassed < uint64(res.answered) {
		t.Errorf("%d queries passed on a cookie for %d answers", lim.CookiePassed, res.answered)
	}
	if refused := p.Handler().Stats().RequestsLimited; float64(refused) < 0.5*float64(res.flood) {
		t.Errorf("the flood's /24 was not trimmed: %d of %d refused", refused, res.flood)
	}
	res = resolverInFlood(t, addr, net24+1, false, refused)
	t.Logf("without a server cookie: %d of %d answered", res.answered, res.queries)
	if res.answered > res.queries/2 {
		t.Errorf("resolver without a server cookie: %d of %d answered, want it limited with the flood", res.answered, res.queries)
	}
}

// TestGoLimitsProvenResolver: in every mode where the request limits run in Go, a
// resolver that learned its server cookie keeps its answers during a flood of its
// /24, as with the kernel filter.
func TestGoLimitsProvenResolver(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	for i, m := range goCookieModes {
		t.Run(m.name, func(t *testing.T) {
			if !m.bpf {
				// The modes without a filter run side by side (each with a /24 and
				// a server of its own) once those that inject a load failure, a
				// change to the whole package, have ended.
				t.Parallel()
			}
			p, addr := m.make(t, rpsConfig(t, fmt.Sprint(goCookieRPS)))
			checkGoCookies(t, p, addr, byte(10+2*i))
		})
	}
}

// TestGoLimitsProvenResolverUnprivileged: the same, in a process as uid 65534
// without capabilities, where Protect falls back to the classic prefilter by
// itself.
func TestGoLimitsProvenResolverUnprivileged(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	// Beside the package's other parallel tests: its floods and servers are a
	// child process's, on /24s of their own.
	t.Parallel()
	if !isUnprivilegedChild() {
		runUnprivileged(t, "TestGoLimitsProvenResolverUnprivileged")
		return
	}
	checkUnprivileged(t)
	for i, m := range []struct {
		name string
		make func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort)
	}{
		{"reader", func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) { return startProtected(t, cfg) }},
		{"Handler", func(t *testing.T, cfg *Config) (*Protection, netip.AddrPort) { return attachedHost(t, cfg) }},
	} {
		t.Run(m.name, func(t *testing.T) {
			p, addr := m.make(t, rpsConfig(t, fmt.Sprint(goCookieRPS)))
			if st := p.Status(); st.Filter != ModeClassic || !errors.Is(st.Reason, ErrNotPermitted) {
				t.Fatalf("status %v: want the classic prefilter for want of CAP_BPF", st)
			}
			checkGoCookies(t, p, addr, byte(40+2*i))
		})
	}
}
