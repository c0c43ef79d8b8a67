package rrlprom

import (
	"github.com/dnsrake/rrl/tcplimit"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/dnscookie"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollectorRRLAndHandler(t *testing.T) {
	r := rrl.NewRRL(fixedConfig(t, "responses-per-second", "1", "slip-ratio", "2"))
	cookies := rrl.NewCookies(rrl.CookieSecret{5})
	h := rrl.NewHandler(new(handlerZone), r, rrl.WithCookies(cookies))
	w := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}}
	// Answers: send, slip (truncated), drop, slip (BADCOOKIE, client cookie).
	for i := range 4 {
		q := query("www.example.test.", dns.TypeA, true)
		if i == 3 {
			dnscookie.Set(q, []byte{1, 2, 3, 4, 5, 6, 7, 8})
		}
		h.ServeDNS(w, q)
	}
	// A valid server cookie: exempt.
	q := query("www.example.test.", dns.TypeA, true)
	dnscookie.Set(q, cookies.Generate([]byte{1, 2, 3, 4, 5, 6, 7, 8}, netip.MustParseAddr("192.0.2.1"), time.Now()))
	h.ServeDNS(w, q)
	// NXDOMAIN over TCP: not a response account's business.
	h.ServeDNS(&fakeWriter{Remote: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5001}}, query("nx.example.test.", dns.TypeA, false))

	c := NewCollector("dns", r, CollectHandler(h))
	const want = `
# HELP dns_rrl_actions_total Debit verdicts.
# TYPE dns_rrl_actions_total counter
dns_rrl_actions_total{action="drop"} 1
dns_rrl_actions_total{action="send"} 2
dns_rrl_actions_total{action="slip"} 2
# HELP dns_rrl_debits_total Debit calls by response category.
# TYPE dns_rrl_debits_total counter
dns_rrl_debits_total{category="answer"} 4
dns_rrl_debits_total{category="error"} 0
dns_rrl_debits_total{category="nodata"} 0
dns_rrl_debits_total{category="nxdomain"} 1
dns_rrl_debits_total{category="referral"} 0
# HELP dns_rrl_rt_reasons_total Debit calls by the response account's reason.
# TYPE dns_rrl_rt_reasons_total counter
dns_rrl_rt_reasons_total{reason="cache-full"} 0
dns_rrl_rt_reasons_total{reason="not-configured"} 0
dns_rrl_rt_reasons_total{reason="not-reached"} 0
dns_rrl_rt_reasons_total{reason="not-udp"} 1
dns_rrl_rt_reasons_total{reason="ok"} 1
dns_rrl_rt_reasons_total{reason="rate-limit"} 3
# HELP dns_rrl_accounts Accounts in the response rate limiting table.
# TYPE dns_rrl_accounts gauge
dns_rrl_accounts 1
# HELP dns_handler_badcookie_slips_total Slips written as BADCOOKIE rather than truncated.
# TYPE dns_handler_badcookie_slips_total counter
dns_handler_badcookie_slips_total 1
# HELP dns_handler_cookie_exempt_total UDP responses sent unlimited because the query had a valid server cookie.
# TYPE dns_handler_cookie_exempt_total counter
dns_handler_cookie_exempt_total 1
# HELP dns_handler_cookies_total Queries by the verdict on their COOKIE option.
# TYPE dns_handler_cookies_total counter
dns_handler_cookies_total{result="bad"} 0
dns_handler_cookies_total{result="client-only"} 1
dns_handler_cookies_total{result="expired"} 0
dns_handler_cookies_total{result="malformed"} 0
dns_handler_cookies_total{result="none"} 4
dns_handler_cookies_total{result="valid"} 1
dns_handler_cookies_total{result="valid-reissue"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"dns_rrl_actions_total", "dns_rrl_debits_total", "dns_rrl_rt_reasons_total", "dns_rrl_accounts",
		"dns_handler_badcookie_slips_total", "dns_handler_cookie_exempt_total", "dns_handler_cookies_total"); err != nil {
		t.Error(err)
	}
	// Responses by action and category: 3 answers sent (first, exempt; the TCP
	// NXDOMAIN is the third), one dropped, two slipped.
	checkSeries(t, c, map[string]float64{
		`dns_handler_responses_total{action="send",category="answer"}`:   2,
		`dns_handler_responses_total{action="send",category="nxdomain"}`: 1,
		`dns_handler_responses_total{action="drop",category="answer"}`:   1,
		`dns_handler_responses_total{action="slip",category="answer"}`:   2,
	})
	lint(t, c)
	// 7 RRL series + 15 by action and category... every label set is bounded:
	// the count does not depend on how many clients there were.
	before := testutil.CollectAndCount(c)
	for i := range 200 {
		h.ServeDNS(&fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(10, byte(i), 0, 1), Port: 5000}}, query("www.example.test.", dns.TypeA, false))
	}
	if after := testutil.CollectAndCount(c); after != before {
		t.Errorf("%d series after 200 more clients, %d before", after, before)
	}
}

// checkSeries checks the values of some series of c, given in the text format's
// "name{labels}" form.
func checkSeries(t *testing.T, c prometheus.Collector, want map[string]float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// lint fails t on any problem promlint finds in c's metrics.
func lint(t *testing.T, c prometheus.Collector) {
	t.Helper()
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestCollectorLimiters(t *testing.T) {
	cfg := rrl.NewConfig()
	if err := cfg.SetValue("requests-per-second", "10"); err != nil {
		t.Fatal(err)
	}
	lim, err := rrl.NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddrPort("198.51.100.7:4000")
	for range 1000 {
		lim.Allow(src)
	}
	ls := lim.Stats()

	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tcplimit.LimitListener(inner, 1)
	defer tl.Close()

	c := NewCollector("", nil, CollectLimiter(lim), CollectTCPLimiter(tl))
	want := map[string]float64{
		`limiter_packets_total`: 1000,
		`tcp_accepted_total`:    0,
		`tcp_open_connections`:  0,
	}
	for _, n := range ls.Nodes {
		want[`limiter_limited_total{node="`+n.Node.String()+`"}`] = float64(n.Limited)
		want[`limiter_limit_packets_per_second{node="`+n.Node.String()+`"}`] = n.Limit
	}
	if ls.Dropped() == 0 || len(ls.Nodes) < 3 {
		t.Fatalf("limiter stats %+v: nothing limited", ls)
	}
	checkSeries(t, c, want)
	lint(t, c)
}

func TestCollectorFilter(t *testing.T) {
	requirePrivilege(t)
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := rrl.NewConfig()
	if err := cfg.SetValue("requests-per-second", "10"); err != nil {
		t.Fatal(err)
	}
	f, err := rrl.Attach(conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	client, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Three packets too short to be queries, then queries until the kernel
	// counts them all.
	for range 3 {
		client.Write([]byte{1, 2, 3})
	}
	q, _ := query("www.example.test.", dns.TypeA, false).Pack()
	const queries = 200
	for range queries {
		client.Write(q)
	}
	deadline := time.Now().Add(5 * time.Second)
	var st rrl.FilterStats
	for {
		if st, err = f.Stats(); err != nil {
			t.Fatal(err)
		}
		if st.Seen == 3+queries || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c := NewCollector("dns", nil, CollectFilter(f))
	want := map[string]float64{
		`dns_filter_mode{mode="ebpf"}`:                1,
		`dns_filter_mode{mode="classic"}`:             0,
		`dns_filter_packets_total`:                    3 + queries,
		`dns_filter_passed_total`:                     float64(st.Passed),
		`dns_filter_dropped_total{reason="short"}`:    3,
		`dns_filter_dropped_total{reason="response"}`: 0,
	}
	var limited uint64
	for _, n := range st.Nodes {
		want[`dns_filter_limited_total{node="`+n.Node.String()+`"}`] = float64(n.Limited)
		want[`dns_filter_limit_packets_per_second{node="`+n.Node.String()+`"}`] = n.Limit
		// The one client is limited at its address, and no other group anywhere.
		want[`dns_filter_limited_groups{node="`+n.Node.String()+`"}`] = map[bool]float64{true: 1}[n.Node.String() == "ipv4/32"]
		limited += n.Limited
	}
	want[`dns_filter_dropped_total{reason="limited"}`] = float64(limited)
	if limited == 0 || st.Passed+limited+3 != 3+queries {
		t.Errorf("filter stats %+v: a burst of %d queries from one address at 10 per second", st, queries)
	}
	checkSeries(t, c, want)
	lint(t, c)
}

// TestCollectorFilterCookies: the collector exports the kernel filter's counters of
// queries passed on a valid server cookie and of server cookies that did not verify.
func TestCollectorFilterCookies(t *testing.T) {
	requirePrivilege(t)
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := rrl.Attach(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cookies := rrl.NewCookies(rrl.CookieSecret{1, 2, 3})
	if err := f.UseCookies(cookies); err != nil {
		t.Fatal(err)
	}
	client, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	from := client.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
	send := func(c *rrl.Cookies) {
		q := query("www.example.test.", dns.TypeA, true)
		dnscookie.Set(q, c.Generate([]byte("metricsc"), from, time.Now()))
		b, _ := q.Pack()
		client.Write(b)
	}
	for range 3 {
		send(cookies)
	}
	send(rrl.NewCookies(rrl.CookieSecret{9}))
	var st rrl.FilterStats
	for deadline := time.Now().Add(5 * time.Second); st.Seen < 4 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, err = f.Stats(); err != nil {
			t.Fatal(err)
		}
	}
	checkSeries(t, NewCollector("dns", nil, CollectFilter(f)), map[string]float64{
		"dns_filter_packets_total":        4,
		"dns_filter_cookie_passed_total":  3,
		"dns_filter_cookie_invalid_total": 1,
	})
}
