package rrl

import (
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// handlerZone is the inner handler of the middleware tests: a tiny authoritative
// server for example.test. that answers like a real one.
type handlerZone struct {
	calls atomic.Int64
}

func (z *handlerZone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	z.calls.Add(1)
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	soa := mustRR("example.test. 300 IN SOA ns.example.test. host.example.test. 1 7200 3600 1209600 300")
	switch {
	case name == "www.example.test.":
		m.Answer = append(m.Answer, mustRR(q.Name+" 300 IN A 192.0.2.1"))
	case strings.HasSuffix(name, ".wild.example.test."):
		SetWildcardOrigin(w, "wild.example.test.")
		m.Answer = append(m.Answer, mustRR(q.Name+" 300 IN A 192.0.2.2"))
	case name == "refused.example.test.":
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
	case name == "raw.example.test.":
		m.Answer = append(m.Answer, mustRR(q.Name+" 300 IN A 192.0.2.4"))
		if req.IsEdns0() != nil {
			m.SetEdns0(1232, false)
		}
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		w.Write(b)
		return
	default:
		m.Rcode = dns.RcodeNameError
		m.Ns = append(m.Ns, soa)
	}
	if req.IsEdns0() != nil {
		m.SetEdns0(1232, false)
	}
	w.WriteMsg(m)
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

// startDNS serves h over UDP and TCP on 127.0.0.1 and returns the two addresses.
func startDNS(t testing.TB, h dns.Handler) (udpAddr, tcpAddr string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		go func() { errc <- srv.ActivateAndServe() }()
		select {
		case <-started:
		case err := <-errc:
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Shutdown() })
	}
	return pc.LocalAddr().String(), l.Addr().String()
}

// fixedClock returns a Config whose RRL clock stands still, so that no account
// earns credit back during a test.
func fixedConfig(t testing.TB, kv ...string) *Config {
	t.Helper()
	cfg := NewConfig()
	cfg.SetNowFunc(func() time.Time { return testEpoch })
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

var testEpoch = time.Unix(1_750_000_000, 0)

func query(name string, qtype uint16, edns bool) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	if edns {
		q.SetEdns0(1232, false)
	}
	return q
}

// exchange sends q and returns the response, or nil when none came within wait.
func exchange(t testing.TB, network, addr string, q *dns.Msg, wait time.Duration) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: wait, UDPSize: 1232}
	r, _, err := c.Exchange(q, addr)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		// A TCP server that writes nothing closes the connection after its
		// read timeout; the client may see EOF instead of a timeout.
		if network == "tcp" && (errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "EOF")) {
			return nil
		}
		t.Fatalf("%s %s: %v", network, q.Question[0].Name, err)
	}
	return r
}

const (
	answerWait  = 5 * time.Second        // for responses that must come
	silenceWait = 250 * time.Millisecond // for responses that must not
)

// outcome names what a response is, for the tables.
func outcome(r *dns.Msg) string {
	switch {
	case r == nil:
		return "drop"
	case r.Rcode == dns.RcodeBadCookie:
		return "badcookie"
	case r.Truncated:
		return "tc"
	}
	return "send"
}

func TestHandlerUDPSendSlipDrop(t *testing.T) {
	// responses-per-second 1 and a clock that stands still: the first response
	// spends the account's credit, then BIND's slip sequence follows.
	for _, tc := range []struct {
		name  string
		slip  string
		qname string
		want  []string
	}{
		{"slip-2", "2", "www.example.test.", []string{"send", "tc", "drop", "tc", "drop"}},
		{"slip-1", "1", "www.example.test.", []string{"send", "tc", "tc", "tc"}},
		{"slip-0", "0", "www.example.test.", []string{"send", "drop", "drop"}},
		// NXDOMAIN slips keep their rcode; every random name is one account.
		{"nxdomain", "2", "nope.example.test.", []string{"send", "tc", "drop"}},
		// Raw writes are unpacked and judged like messages.
		{"raw", "1", "raw.example.test.", []string{"send", "tc"}},
		// Errors are never slipped (BIND 9): a would-be slip is dropped.
		{"refused", "1", "refused.example.test.", []string{"send", "drop", "drop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", tc.slip))
			zone := new(handlerZone)
			h := NewHandler(zone, r)
			udp, tcp := startDNS(t, h)
			var got []string
			for i, want := range tc.want {
				name := tc.qname
				if strings.HasPrefix(name, "nope") {
					name = strings.Replace(name, "nope", "nope"+string(rune('a'+i)), 1)
				}
				wait := answerWait
				if want == "drop" {
					wait = silenceWait
				}
				resp := exchange(t, "udp", udp, query(name, dns.TypeA, true), wait)
				got = append(got, outcome(resp))
				if resp == nil {
					continue
				}
				switch outcome(resp) {
				case "tc":
					if len(resp.Answer)+len(resp.Ns) != 0 || len(resp.Extra) != 1 || resp.IsEdns0() == nil {
						t.Errorf("query %d: truncated response keeps records: %v", i, resp)
					}
				case "send":
					if tc.name != "refused" && tc.name != "nxdomain" && len(resp.Answer) != 1 {
						t.Errorf("query %d: no answer: %v", i, resp)
					}
				}
				wantRcode := dns.RcodeSuccess
				switch tc.name {
				case "nxdomain":
					wantRcode = dns.RcodeNameError
				case "refused":
					wantRcode = dns.RcodeRefused
				}
				if resp.Rcode != wantRcode {
					t.Errorf("query %d: rcode %s, want %s", i, dns.RcodeToString[resp.Rcode], dns.RcodeToString[wantRcode])
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if n := zone.calls.Load(); n != int64(len(tc.want)) {
				t.Errorf("inner handler called %d times, want %d", n, len(tc.want))
			}
			// The slipped client retries over TCP, where only
			// requests-per-second applies: answered however often.
			for range 3 {
				if resp := exchange(t, "tcp", tcp, query(tc.qname, dns.TypeA, true), answerWait); outcome(resp) != "send" {
					t.Fatalf("TCP retry: %s", outcome(resp))
				}
			}
			st := h.Stats()
			var slips, drops uint64
			for _, c := range st.Responses[Slip] {
				slips += c
			}
			for _, c := range st.Responses[Drop] {
				drops += c
			}
			if int(slips) != strings.Count(strings.Join(tc.want, " "), "tc") ||
				int(drops) != strings.Count(strings.Join(tc.want, " "), "drop") {
				t.Errorf("stats: %d slips, %d drops for %v", slips, drops, tc.want)
			}
		})
	}
}

// clientCookie sets a client cookie, or a full cookie, on q.
func withCookie(q *dns.Msg, cookie []byte) *dns.Msg {
	setCookie(q, cookie)
	return q
}

func TestHandlerCookies(t *testing.T) {
	now := time.Unix(1_750_000_000, 0)
	cookies := NewCookies(CookieSecret{7})
	r := NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", "1"))
	h := NewHandler(new(handlerZone), r, WithCookies(cookies), withClock(func() time.Time { return now }))
	udp, tcp := startDNS(t, h)
	client := netip.MustParseAddr("127.0.0.1")
	cc := []byte{1, 2, 3, 4, 5, 6, 7, 8}

	// verifyServerCookie checks that resp carries cc and a server cookie made for
	// the client now, and returns the full cookie.
	verifyServerCookie := func(what string, resp *dns.Msg) []byte {
		t.Helper()
		full, ok := cookieFromMsg(resp)
		if !ok || len(full) != cookieLen || string(full[:8]) != string(cc) {
			t.Fatalf("%s: cookie %x in %v", what, full, resp)
		}
		if v := cookies.Verify(full, client, now); v != CookieValid {
			t.Fatalf("%s: server cookie %x verifies as %v", what, full, v)
		}
		return full
	}

	// A client cookie alone: the response is limited as any other, and
	// carries a server cookie; the slip is BADCOOKIE with a fresh one.
	resp := exchange(t, "udp", udp, withCookie(query("www.example.test.", dns.TypeA, true), cc), answerWait)
	if outcome(resp) != "send" || len(resp.Answer) != 1 {
		t.Fatalf("first response: %v", resp)
	}
	verifyServerCookie("answer", resp)
	resp = exchange(t, "udp", udp, withCookie(query("www.example.test.", dns.TypeA, true), cc), answerWait)
	if outcome(resp) != "badcookie" || len(resp.Answer)+len(resp.Ns) != 0 || resp.Authoritative {
		t.Fatalf("slip: %v", resp)
	}
	full := verifyServerCookie("BADCOOKIE", resp)

	// With the server cookie the client is exempt over UDP: always answered.
	for i := range 5 {
		resp = exchange(t, "udp", udp, withCookie(query("www.example.test.", dns.TypeA, true), full), answerWait)
		if outcome(resp) != "send" || len(resp.Answer) != 1 {
			t.Fatalf("exempt query %d: %v", i, resp)
		}
		verifyServerCookie("exempt answer", resp)
	}

	// A bad server cookie is not exempt, but still gets a good one.
	bad := append([]byte(nil), full...)
	bad[cookieLen-1] ^= 1
	resp = exchange(t, "udp", udp, withCookie(query("www.example.test.", dns.TypeA, true), bad), answerWait)
	if outcome(resp) != "badcookie" {
		t.Fatalf("bad cookie: %s", outcome(resp))
	}
	verifyServerCookie("bad cookie slip", resp)

	// TCP responses carry the cookie too.
	resp = exchange(t, "tcp", tcp, withCookie(query("www.example.test.", dns.TypeA, true), cc), answerWait)
	verifyServerCookie("TCP answer", resp)

	// Without a COOKIE option nothing is added.
	resp = exchange(t, "tcp", tcp, query("www.example.test.", dns.TypeA, true), answerWait)
	if _, ok := cookieFromMsg(resp); ok {
		t.Fatalf("cookie in a response to a query without one: %v", resp)
	}

	st := h.Stats()
	want := HandlerStats{SlippedBadCookie: 2, CookieExempt: 5}
	want.Cookies[CookieClientOnly] = 3
	want.Cookies[CookieValid] = 5
	want.Cookies[CookieBad] = 1
	want.Cookies[CookieNone] = 1
	want.Responses[Send][AllowanceAnswer] = 1 + 5 + 2
	want.Responses[Slip][AllowanceAnswer] = 2
	want.Malformed = map[string]uint64{}
	for r := range malformedLast {
		want.Malformed[r.String()] = 0
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("stats\n got %+v\nwant %+v", st, want)
	}
}

func TestHandlerMalformedCookie(t *testing.T) {
	for _, n := range []int{0, 1, 7, 9, 15, 41} {
		zone := new(handlerZone)
		h := NewHandler(zone, NewRRL(fixedConfig(t)), WithCookies(NewCookies(CookieSecret{1})))
		udp, tcp := startDNS(t, h)
		for _, network := range []string{"udp", "tcp"} {
			addr := udp
			if network == "tcp" {
				addr = tcp
			}
			q := query("www.example.test.", dns.TypeA, true)
			opt := q.IsEdns0()
			opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: strings.Repeat("ab", n)})
			resp := exchange(t, network, addr, q, answerWait)
			if resp == nil || resp.Rcode != dns.RcodeFormatError || len(resp.Answer) != 0 {
				t.Errorf("%d-byte cookie over %s: %v", n, network, resp)
			}
		}
		if zone.calls.Load() != 0 {
			t.Errorf("%d-byte cookie: inner handler called", n)
		}
		if st := h.Stats(); st.Cookies[CookieMalformed] != 2 || st.Responses[Send][AllowanceError] != 2 {
			t.Errorf("%d-byte cookie: stats %+v", n, st)
		}
	}
}

func TestHandlerTCPOnlyRequestsPerSecond(t *testing.T) {
	// Response accounts do not apply over TCP; requests-per-second does, over
	// both transports.
	r := NewRRL(fixedConfig(t, "responses-per-second", "1", "requests-per-second", "3"))
	h := NewHandler(new(handlerZone), r)
	_, tcp := startDNS(t, h)
	var got []string
	for range 4 {
		resp := exchange(t, "tcp", tcp, query("www.example.test.", dns.TypeA, false), map[bool]time.Duration{true: answerWait, false: silenceWait}[len(got) < 3])
		got = append(got, outcome(resp))
	}
	if strings.Join(got, " ") != "send send send drop" {
		t.Errorf("TCP: %v, want three answers then a drop", got)
	}
	st := r.GetStats(false)
	if st.RTReasons[RTNotUDP] != 3 || st.IPReasons[IPRateLimit] != 1 {
		t.Errorf("stats %v", st)
	}
}

func TestHandlerReportOnly(t *testing.T) {
	r := NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", "2", "report-only", ""))
	h := NewHandler(new(handlerZone), r)
	udp, _ := startDNS(t, h)
	for i := range 5 {
		resp := exchange(t, "udp", udp, query("www.example.test.", dns.TypeA, false), answerWait)
		if outcome(resp) != "send" || len(resp.Answer) != 1 {
			t.Fatalf("query %d: %v", i, resp)
		}
	}
	st := r.GetStats(false)
	if st.Actions[Send] != 5 || st.ReportOnly[Send] != 1 || st.ReportOnly[Slip] != 2 || st.ReportOnly[Drop] != 2 {
		t.Errorf("report-only stats %v", st)
	}
}

func TestHandlerWildcard(t *testing.T) {
	// All names synthesised from one wildcard share one account: the inner handler
	// says so with SetWildcardOrigin.
	r := NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", "1"))
	udp, _ := startDNS(t, NewHandler(new(handlerZone), r))
	var got []string
	for _, label := range []string{"a", "b", "c"} {
		got = append(got, outcome(exchange(t, "udp", udp, query(label+".wild.example.test.", dns.TypeA, false), answerWait)))
	}
	if strings.Join(got, " ") != "send tc tc" {
		t.Errorf("%v, want one account for the wildcard", got)
	}
}

// fakeWriter keeps what the Handler writes (internal/testutil).
type fakeWriter = testutil.ResponseWriter

// staticHandler writes one prepared response.
type staticHandler struct{ resp *dns.Msg }

func (s staticHandler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) { w.WriteMsg(s.resp) }

func TestHandlerUnwrap(t *testing.T) {
	// The inner handler reaches the writer the Handler was given through Unwrap,
	// and writing through the Handler's writer still goes to it.
	outer := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5300}}
	var got dns.ResponseWriter
	var kept interface{ Unwrap() dns.ResponseWriter }
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		u, ok := w.(interface{ Unwrap() dns.ResponseWriter })
		if !ok {
			t.Fatalf("%T has no Unwrap method", w)
		}
		got, kept = u.Unwrap(), u
		m := new(dns.Msg)
		m.SetReply(req)
		w.WriteMsg(m)
	})
	h := NewHandler(inner, NewRRL(fixedConfig(t, "responses-per-second", "5")))
	h.ServeDNS(outer, query("www.example.test.", dns.TypeA, false))
	if got != dns.ResponseWriter(outer) {
		t.Errorf("Unwrap returned %v, want the writer given to ServeDNS", got)
	}
	if outer.Msgs != 1 {
		t.Errorf("%d messages written, want 1", outer.Msgs)
	}
	if w := kept.Unwrap(); w != nil {
		t.Errorf("Unwrap after ServeDNS returned %v, want nil", w)
	}
}

func TestHandlerLimiter(t *testing.T) {
	// The Go request limiter drops a flood from one address before the inner
	// handler sees it; another address is untouched.
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "10"); err != nil {
		t.Fatal(err)
	}
	lim, err := NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	zone := new(handlerZone)
	h := NewHandler(zone, NewRRL(NewConfig()), withLimiter(lim))
	flood := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4000}}
	const n = 2000
	for range n {
		h.ServeDNS(flood, query("www.example.test.", dns.TypeA, false))
	}
	st := h.Stats()
	if flood.Msgs+int(st.RequestsLimited) != n || int(zone.calls.Load()) != flood.Msgs {
		t.Fatalf("%d written, %d limited, %d handled of %d", flood.Msgs, st.RequestsLimited, zone.calls.Load(), n)
	}
	// A burst arrives in far less than a second: at 10 per second, only the
	// first few pass while the estimate builds up.
	if flood.Msgs > n/10 {
		t.Errorf("%d of %d flood queries passed the limiter", flood.Msgs, n)
	}
	// TCP queries are not the Limiter's (the kernel filter sees only UDP).
	tcp := &fakeWriter{Remote: &net.TCPAddr{IP: net.IPv4(198, 51, 100, 7), Port: 4001}}
	h.ServeDNS(tcp, query("www.example.test.", dns.TypeA, false))
	// (Another source port: sources sharing one port are a group of their own.)
	other := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(203, 0, 113, 9), Port: 4002}}
	h.ServeDNS(other, query("www.example.test.", dns.TypeA, false))
	if tcp.Msgs != 1 || other.Msgs != 1 {
		t.Errorf("unrelated queries limited: tcp %d, other %d", tcp.Msgs, other.Msgs)
	}
}

func TestHandlerDoesNotModifyResponse(t *testing.T) {
	// The inner handler's message may be shared between queries: the cookie and
	// the slips are written from copies.
	resp := new(dns.Msg)
	resp.SetReply(query("www.example.test.", dns.TypeA, false))
	resp.Answer = append(resp.Answer, mustRR("www.example.test. 300 IN A 192.0.2.1"))
	resp.SetEdns0(1232, false)
	before := resp.String()
	r := NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", "1"))
	h := NewHandler(staticHandler{resp}, r, WithCookies(NewCookies(CookieSecret{3})))
	w := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}}
	for _, cookie := range [][]byte{nil, {1, 2, 3, 4, 5, 6, 7, 8}, nil, {1, 2, 3, 4, 5, 6, 7, 8}} {
		q := query("www.example.test.", dns.TypeA, true)
		if cookie != nil {
			setCookie(q, cookie)
		}
		h.ServeDNS(w, q)
		if w.Last == resp && (cookie != nil || w.Last.Truncated) {
			t.Fatal("the inner handler's message was written modified")
		}
	}
	if resp.String() != before {
		t.Errorf("response modified:\n%s\nwas\n%s", resp, before)
	}
	if w.Msgs != 4 {
		t.Errorf("%d messages written, want 4 (send, then slips)", w.Msgs)
	}
}

func TestHandlerSendAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	h, w, q := benchHandler(t, false)
	h.ServeDNS(w, q)
	if a := testing.AllocsPerRun(1000, func() { h.ServeDNS(w, q) }); a != 0 {
		t.Errorf("%v allocations per Send without cookies, want 0", a)
	}
}

func TestCookieOption(t *testing.T) {
	// cookieOption agrees with cookieFromMsg on every length and on bad hex.
	for _, hexs := range []string{"", "ab", "0102030405060708", "0102030405060708" + strings.Repeat("cd", 16),
		strings.Repeat("ab", 40), strings.Repeat("ab", 41), "0102030405060708zz", "abc"} {
		q := query("x.", dns.TypeA, true)
		q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: hexs})
		var buf [clientCookieLen + maxServerCookieLen]byte
		got, ok := cookieOption(q, &buf)
		want, wok := cookieFromMsg(q)
		if len(want) > len(buf) {
			// Too long for the buffer: returned empty, malformed all the same.
			c := NewCookies(CookieSecret{})
			a := netip.MustParseAddr("192.0.2.1")
			if !ok || got == nil || c.Verify(got, a, testEpoch) != c.Verify(want, a, testEpoch) {
				t.Errorf("%q: got %x %v, want malformed", hexs, got, ok)
			}
			continue
		}
		if ok != wok || string(got) != string(want) || (got == nil) != (want == nil) {
			t.Errorf("%q: got %x %v, want %x %v", hexs, got, ok, want, wok)
		}
	}
	var buf [clientCookieLen + maxServerCookieLen]byte
	if got, ok := cookieOption(query("x.", dns.TypeA, true), &buf); ok || got != nil {
		t.Errorf("no COOKIE option: %x %v", got, ok)
	}
	if got, ok := cookieOption(query("x.", dns.TypeA, false), &buf); ok || got != nil {
		t.Errorf("no OPT record: %x %v", got, ok)
	}
}

// benchHandler returns a Handler whose inner handler answers www.example.test. A,
// a writer and the query; with cookie the query carries a valid server cookie.
func benchHandler(tb testing.TB, cookie bool) (*Handler, *fakeWriter, *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(query("www.example.test.", dns.TypeA, false))
	resp.Authoritative = true
	resp.Answer = append(resp.Answer, mustRR("www.example.test. 300 IN A 192.0.2.1"))
	cfg := NewConfig()
	// The highest allowance there is, so that no loop runs out of credit.
	if err := cfg.SetValue("responses-per-second", "10000000"); err != nil {
		tb.Fatal(err)
	}
	w := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1).To4(), Port: 5000}}
	q := query("www.example.test.", dns.TypeA, cookie)
	var opts []Option
	if cookie {
		c := NewCookies(CookieSecret{9})
		opts = append(opts, WithCookies(c))
		setCookie(q, c.Generate([]byte{1, 2, 3, 4, 5, 6, 7, 8}, netip.MustParseAddr("192.0.2.1"), time.Now()))
	}
	return NewHandler(staticHandler{resp}, NewRRL(cfg), opts...), w, q
}

func BenchmarkHandlerSend(b *testing.B) {
	for _, tc := range []struct {
		name   string
		cookie bool
	}{{"no-cookie", false}, {"valid-cookie", true}} {
		b.Run(tc.name, func(b *testing.B) {
			h, w, q := benchHandler(b, tc.cookie)
			b.ReportAllocs()
			for b.Loop() {
				h.ServeDNS(w, q)
			}
			if w.Last == nil || len(w.Last.Answer) != 1 {
				b.Fatal("no answer written")
			}
		})
	}
}

func TestHandlerConcurrentSharedResponse(t *testing.T) {
	// Many queries at once writing one shared message, with cookies and slips:
	// the race detector finds any write to the shared message.
	resp := new(dns.Msg)
	resp.SetReply(query("www.example.test.", dns.TypeA, false))
	resp.Answer = append(resp.Answer, mustRR("www.example.test. 300 IN A 192.0.2.1"))
	resp.SetEdns0(1232, false)
	before := resp.String()
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "2")
	cookies := NewCookies(CookieSecret{4})
	h := NewHandler(staticHandler{resp}, NewRRL(cfg), WithCookies(cookies))
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			w := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, byte(g)), Port: 5000}}
			for i := range 200 {
				q := query("www.example.test.", dns.TypeA, true)
				if i%2 == 0 {
					setCookie(q, []byte{1, 2, 3, 4, 5, 6, 7, byte(g)})
				}
				h.ServeDNS(w, q)
			}
		}()
	}
	for range 4 {
		<-done
	}
	if resp.String() != before {
		t.Errorf("shared response modified:\n%s", resp)
	}
	st := h.Stats()
	var total uint64
	for a := range st.Responses {
		for _, n := range st.Responses[a] {
			total += n
		}
	}
	if total != 800 || st.Responses[Slip][AllowanceAnswer] == 0 || st.SlippedBadCookie == 0 {
		t.Errorf("stats %+v", st)
	}
}

// FuzzHandler feeds arbitrary queries and arbitrary responses of the inner handler,
// written raw, through the middleware: it must not panic, and whatever it writes
// must be a DNS message whose slips carry no records.
func FuzzHandler(f *testing.F) {
	q := query("www.example.test.", dns.TypeA, true)
	setCookie(q, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	qb, _ := q.Pack()
	r := new(dns.Msg)
	r.SetReply(q)
	r.Answer = append(r.Answer, mustRR("www.example.test. 300 IN A 192.0.2.1"))
	rb, _ := r.Pack()
	f.Add(qb, rb)
	f.Add(qb, []byte{1, 2, 3})
	r.Truncated = true // truncated by the inner handler itself: not a slip
	rb, _ = r.Pack()
	f.Add(qb, rb)
	r.Rcode = dns.RcodeRefused
	rb, _ = r.Pack()
	f.Add(qb, rb)
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "1")
	cfg.SetValue("slip-ratio", "1")
	rr := NewRRL(cfg)
	cookies := NewCookies(CookieSecret{1})
	f.Fuzz(func(t *testing.T, query, response []byte) {
		req := new(dns.Msg)
		if req.Unpack(query) != nil {
			return
		}
		inner := dns.HandlerFunc(func(w dns.ResponseWriter, _ *dns.Msg) { w.Write(response) })
		innerTC := false // a response the inner handler truncated itself is no slip
		if m := new(dns.Msg); m.Unpack(response) == nil {
			innerTC = m.Truncated
		}
		for _, remote := range []net.Addr{
			&net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000},
			&net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000},
		} {
			w := &fakeWriter{Remote: remote}
			NewHandler(inner, rr, WithCookies(cookies)).ServeDNS(w, req)
			if w.Last != nil && w.Last.Truncated && !innerTC && len(w.Last.Answer)+len(w.Last.Ns) != 0 {
				t.Fatalf("slip with records: %v", w.Last)
			}
			if w.Last != nil {
				if _, err := w.Last.Pack(); err != nil && w.Last.Rcode == dns.RcodeBadCookie {
					t.Fatalf("BADCOOKIE slip does not pack: %v", err)
				}
			}
		}
	})
}

// floodServer serves a counting handler on UDP with the Go request limiter in the
// Handler (reader false) or in the reader (reader true), and returns the address,
// the handler's call counter and the limiter.
func floodServer(tb testing.TB, reader bool) (*net.UDPAddr, *atomic.Int64, *Limiter, *Handler) {
	tb.Helper()
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "10"); err != nil {
		tb.Fatal(err)
	}
	lim, err := NewLimiter(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	calls := new(atomic.Int64)
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		calls.Add(1)
		m := new(dns.Msg)
		m.SetReply(req)
		w.WriteMsg(m)
	})
	var opts []Option
	if !reader {
		opts = append(opts, withLimiter(lim))
	}
	h := NewHandler(inner, NewRRL(NewConfig()), opts...)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	pc.SetReadBuffer(4 << 20)
	srv := &dns.Server{PacketConn: pc, Handler: h}
	if reader {
		srv.DecorateReader = decorateLimit(lim)
	}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	tb.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().(*net.UDPAddr), calls, lim, h
}

// judged returns how many packets lim has seen.
func judged(lim *Limiter) uint64 { s := lim.Stats(); return (s.Seen - s.Exempt) }

func TestLimitReader(t *testing.T) {
	addr, calls, lim, _ := floodServer(t, true)
	flood, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 99, 0, 3)}, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	q, _ := query("www.example.test.", dns.TypeA, false).Pack()
	const n = 500
	for i := range n {
		flood.Write(q)
		// Keep the socket queue short so that none is lost to a full buffer.
		for deadline := time.Now().Add(5 * time.Second); judged(lim)+32 < uint64(i) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	}
	// Another client is answered.
	if resp := exchange(t, "udp", addr.String(), query("www.example.test.", dns.TypeA, false), answerWait); resp == nil {
		t.Fatal("no answer for another client")
	}
	for deadline := time.Now().Add(5 * time.Second); judged(lim) < n+1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	st := lim.Stats()
	if judged(lim) != n+1 || st.limited() == 0 || uint64(calls.Load())+st.limited() != n+1 {
		t.Errorf("%d judged, %d limited, %d handled; want %d judged, handled + limited", judged(lim), st.limited(), calls.Load(), n+1)
	}
	if calls.Load() > n/5 {
		t.Errorf("%d of %d flood queries reached the handler", calls.Load(), n)
	}
}

// BenchmarkLimiterDrop measures what a flood costs the server when the Go request
// limiter drops nearly all of it, in the Handler (after miekg/dns has unpacked the
// query in a goroutine of its own) or in the reader (before). ns/op is the wall
// time per flood packet with the sender keeping at most 64 packets queued, so it is
// bounded by the server's cost per packet; cpu-ns/op is the process's CPU time per
// packet (sender, server and kernel together).
func BenchmarkLimiterDrop(b *testing.B) {
	for _, tc := range []struct {
		name   string
		reader bool
	}{{"handler", false}, {"reader", true}} {
		b.Run(tc.name, func(b *testing.B) {
			addr, _, lim, _ := floodServer(b, tc.reader)
			flood, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 99, 0, 3)}, addr)
			if err != nil {
				b.Fatal(err)
			}
			defer flood.Close()
			q, _ := query("www.example.test.", dns.TypeA, false).Pack()
			wait := func(n int) { // until the server has judged all but the last few
				for judged(lim)+64 < uint64(n) {
					time.Sleep(20 * time.Microsecond)
				}
			}
			cpu0 := processCPUNanos()
			n := 0
			for b.Loop() {
				flood.Write(q)
				if n++; n%64 == 0 {
					wait(n)
				}
			}
			wait(n + 64)
			b.ReportMetric(float64(processCPUNanos()-cpu0)/float64(n), "cpu-ns/op")
			b.ReportMetric(float64(lim.Stats().limited())/float64(n), "dropped/op")
		})
	}
}

// processCPUNanos returns the process's CPU time, user and system, in nanoseconds.
func processCPUNanos() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
