package rrlprom

import (
	"github.com/dnsrake/rrl/tcplimit"
	"net"
	"testing"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

func TestCollectorMalformedAndTCPReasons(t *testing.T) {
	h := rrl.NewHandler(new(handlerZone), rrl.NewRRL(rrl.NewConfig()))
	q := query("www.example.test.", dns.TypeA, true)
	q.Extra = append(q.Extra, &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 512}})
	h.ServeDNS(&fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}}, q)
	q = query("www.example.test.", dns.TypeA, true)
	q.IsEdns0().SetVersion(2)
	h.ServeDNS(&fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}}, q)

	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tcplimit.LimitListenerTotal(inner, 1, 1)
	defer tl.Close()
	ch := testutil.AcceptLoop(tl)
	a, b := net.IPv4(127, 0, 5, 1), net.IPv4(127, 0, 5, 2)
	testutil.ExpectAccepted(t, ch, testutil.DialFrom(t, "tcp4", a, tl.Addr()))
	testutil.ExpectAccepted(t, ch, testutil.DialFrom(t, "tcp4", b, tl.Addr())) // evicts a's
	testutil.ExpectRefused(t, ch, "tcp4", b, tl.Addr())

	c := NewCollector("", nil, CollectHandler(h), CollectTCPLimiter(tl))
	checkSeries(t, c, map[string]float64{
		`handler_malformed_total{reason="opt-count"}`:             1,
		`handler_malformed_total{reason="edns-version"}`:          1,
		`handler_malformed_total{reason="name"}`:                  0,
		`handler_responses_total{action="send",category="error"}`: 2,
		`tcp_refused_total{reason="client-limit"}`:                1,
		`tcp_refused_total{reason="total-limit"}`:                 1,
		`tcp_accept_errors_total{reason="descriptors"}`:           0,
		`tcp_max_connections`:                                     1,
		`tcp_open_connections`:                                    1,
	})
	lint(t, c)
}
