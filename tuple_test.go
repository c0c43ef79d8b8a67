package rrl

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// rrs parses records in zone-file syntax.
func rrs(t testing.TB, lines ...string) []dns.RR {
	t.Helper()
	out := make([]dns.RR, 0, len(lines))
	for _, l := range lines {
		rr, err := dns.NewRR(l)
		if err != nil {
			t.Fatalf("NewRR(%q): %v", l, err)
		}
		out = append(out, rr)
	}
	return out
}

// testResponse builds a response to qname/qtype (no question when qname is "").
func testResponse(t testing.TB, qname string, qtype uint16, rcode int, aa bool, answer, ns []string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if qname != "" {
		m.SetQuestion(qname, qtype)
	}
	m.Response = true
	m.Rcode = rcode
	m.Authoritative = aa
	m.Answer = rrs(t, answer...)
	m.Ns = rrs(t, ns...)
	return m
}

const (
	soaRR   = "example.test. 3600 IN SOA ns1.example.test. host.example.test. 1 7200 3600 1209600 300"
	apexNS  = "example.test. 3600 IN NS ns1.example.test."
	delegNS = "Sub.Example.Test. 3600 IN NS ns.sub.example.test."
	deleg2  = "sub.example.test. 3600 IN NS ns2.sub.example.test."
	dsRR    = "sub.example.test. 3600 IN DS 12345 13 2 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestResponseTupleFromMsg(t *testing.T) {
	tests := []struct {
		name     string
		qname    string
		qtype    uint16
		rcode    int
		aa       bool
		answer   []string
		ns       []string
		wildcard string
		want     ResponseTuple
	}{
		{
			name: "answer", qname: "www.example.test.", qtype: dns.TypeA, aa: true,
			answer: []string{"www.example.test. 300 IN A 192.0.2.1"},
			ns:     []string{apexNS},
			want:   ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "www.example.test."},
		},
		{
			name: "answer, 0x20 mixed case question", qname: "WwW.eXaMpLe.TeSt.", qtype: dns.TypeA, aa: true,
			answer: []string{"WwW.eXaMpLe.TeSt. 300 IN A 192.0.2.1"},
			want:   ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "www.example.test."},
		},
		{
			name: "answer, CNAME only", qname: "alias.example.test.", qtype: dns.TypeAAAA, aa: true,
			answer: []string{"alias.example.test. 300 IN CNAME elsewhere.test."},
			want:   ResponseTuple{dns.ClassINET, dns.TypeAAAA, AllowanceAnswer, "alias.example.test."},
		},
		{
			name: "answer synthesised from a wildcard", qname: "Random123.wild.example.test.", qtype: dns.TypeA, aa: true,
			answer:   []string{"random123.wild.example.test. 300 IN A 192.0.2.7"},
			wildcard: "Wild.Example.Test.",
			want:     ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "*.wild.example.test."},
		},
		{
			name: "wildcard origin not fully qualified", qname: "x.wild.example.test.", qtype: dns.TypeA, aa: true,
			answer:   []string{"x.wild.example.test. 300 IN A 192.0.2.7"},
			wildcard: "wild.example.test",
			want:     ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "*.wild.example.test."},
		},
		{
			name: "wildcard given as its owner", qname: "x.wild.example.test.", qtype: dns.TypeA, aa: true,
			answer:   []string{"x.wild.example.test. 300 IN A 192.0.2.7"},
			wildcard: "*.WILD.example.test.",
			want:     ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "*.wild.example.test."},
		},
		{
			name: "wildcard at the root", qname: "x.", qtype: dns.TypeA, aa: true,
			answer:   []string{"x. 300 IN A 192.0.2.7"},
			wildcard: ".",
			want:     ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceAnswer, "*."},
		},
		{
			name: "NODATA from a wildcard", qname: "x.wild.example.test.", qtype: dns.TypeMX, aa: true,
			ns:       []string{soaRR},
			wildcard: "wild.example.test.",
			want:     ResponseTuple{dns.ClassINET, dns.TypeMX, AllowanceNoData, "*.wild.example.test."},
		},
		{
			name: "NODATA with SOA, authoritative", qname: "www.example.test.", qtype: dns.TypeMX, aa: true,
			ns:   []string{soaRR},
			want: ResponseTuple{dns.ClassINET, dns.TypeMX, AllowanceNoData, "www.example.test."},
		},
		{
			// The count-based rule calls this a referral; the SOA says otherwise.
			name: "NODATA with SOA, not authoritative (from a cache)", qname: "www.example.test.", qtype: dns.TypeMX,
			ns:   []string{soaRR},
			want: ResponseTuple{dns.ClassINET, dns.TypeMX, AllowanceNoData, "www.example.test."},
		},
		{
			name: "NODATA with SOA and NS, not authoritative", qname: "www.example.test.", qtype: dns.TypeMX,
			ns:   []string{apexNS, soaRR},
			want: ResponseTuple{dns.ClassINET, dns.TypeMX, AllowanceNoData, "www.example.test."},
		},
		{
			name: "NODATA, empty authority", qname: "www.example.test.", qtype: dns.TypeTXT, aa: true,
			want: ResponseTuple{dns.ClassINET, dns.TypeTXT, AllowanceNoData, "www.example.test."},
		},
		{
			name: "NODATA, authoritative with only the apex NS", qname: "example.test.", qtype: dns.TypeTXT, aa: true,
			ns:   []string{apexNS},
			want: ResponseTuple{dns.ClassINET, dns.TypeTXT, AllowanceNoData, "example.test."},
		},
		{
			name: "NODATA, not authoritative, authority without NS", qname: "www.example.test.", qtype: dns.TypeTXT,
			ns:   []string{dsRR},
			want: ResponseTuple{dns.ClassINET, dns.TypeTXT, AllowanceNoData, "www.example.test."},
		},
		{
			name: "referral", qname: "host.sub.example.test.", qtype: dns.TypeA,
			ns:   []string{delegNS, deleg2},
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceReferral, "sub.example.test."},
		},
		{
			name: "signed referral, DS first", qname: "a.b.sub.example.test.", qtype: dns.TypeAAAA,
			ns:   []string{dsRR, delegNS},
			want: ResponseTuple{dns.ClassINET, dns.TypeAAAA, AllowanceReferral, "sub.example.test."},
		},
		{
			name: "NXDOMAIN", qname: "nope.example.test.", qtype: dns.TypeA, rcode: dns.RcodeNameError, aa: true,
			ns:   []string{"Example.TEST. 3600 IN SOA ns1.example.test. host.example.test. 1 7200 3600 1209600 300"},
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceNXDomain, "example.test."},
		},
		{
			name: "NXDOMAIN without authority", qname: "nope.example.test.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceNXDomain, ""},
		},
		{
			name: "NXDOMAIN ignores the wildcard origin", qname: "nope.example.test.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
			ns: []string{soaRR}, wildcard: "wild.example.test.",
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceNXDomain, "example.test."},
		},
		{
			name: "REFUSED", qname: "other.test.", qtype: dns.TypeA, rcode: dns.RcodeRefused,
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceError, "other.test."},
		},
		{
			name: "SERVFAIL with records", qname: "www.example.test.", qtype: dns.TypeA, rcode: dns.RcodeServerFailure,
			answer: []string{"www.example.test. 300 IN A 192.0.2.1"},
			want:   ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceError, "www.example.test."},
		},
		{
			name: "FORMERR", qname: "www.example.test.", qtype: dns.TypeA, rcode: dns.RcodeFormatError,
			want: ResponseTuple{dns.ClassINET, dns.TypeA, AllowanceError, "www.example.test."},
		},
		{
			name: "BADCOOKIE, cookie only", rcode: dns.RcodeBadCookie,
			want: ResponseTuple{AllowanceCategory: AllowanceError},
		},
		{
			name: "NOERROR, cookie only", rcode: dns.RcodeSuccess,
			want: ResponseTuple{AllowanceCategory: AllowanceNoData},
		},
		{
			name: "no question, NXDOMAIN with authority: only the category", rcode: dns.RcodeNameError,
			ns:   []string{soaRR},
			want: ResponseTuple{AllowanceCategory: AllowanceNXDomain},
		},
		{
			name: "class CHAOS", qname: "version.bind.", qtype: dns.TypeTXT, aa: true,
			answer: []string{"version.bind. 0 CH TXT \"x\""},
			want:   ResponseTuple{dns.ClassCHAOS, dns.TypeTXT, AllowanceAnswer, "version.bind."},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := testResponse(t, tt.qname, tt.qtype, tt.rcode, tt.aa, tt.answer, tt.ns)
			if tt.want.Class == dns.ClassCHAOS {
				m.Question[0].Qclass = dns.ClassCHAOS
			}
			if tt.rcode == dns.RcodeBadCookie || tt.qname == "" {
				m.SetEdns0(1232, false)
				o := m.IsEdns0()
				o.Option = append(o.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "2464c4abcf10c957010000005cf79f111f8130c3eee29480"})
			}
			// Through the wire and back, as a server's response would be seen.
			wire, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			var back dns.Msg
			if err := back.Unpack(wire); err != nil {
				t.Fatal(err)
			}
			for _, msg := range []*dns.Msg{m, &back} {
				if got := ResponseTupleFromMsg(msg, tt.wildcard); got != tt.want {
					t.Errorf("got %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

// TestResponseTupleCountRuleDiffers pins down the one case where
// ResponseTupleFromMsg and the count-based NewAllowanceCategory (kept unchanged for
// markdingo/rrl compatibility) must disagree.
func TestResponseTupleCountRuleDiffers(t *testing.T) {
	m := testResponse(t, "www.example.test.", dns.TypeMX, dns.RcodeSuccess, true, nil, []string{soaRR})
	if got := NewAllowanceCategory(m.Rcode, len(m.Answer), len(m.Ns)); got != AllowanceReferral {
		t.Errorf("NewAllowanceCategory = %v, want the count rule's AllowanceReferral", got)
	}
	if got := ResponseTupleFromMsg(m, "").AllowanceCategory; got != AllowanceNoData {
		t.Errorf("ResponseTupleFromMsg category = %v, want AllowanceNoData", got)
	}
}

func TestLowerName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{".", "."},
		{"www.example.test.", "www.example.test."},
		{"WWW.EXAMPLE.TEST.", "www.example.test."},
		{"wWw.ExAmPlE.tEsT.", "www.example.test."},
		{"az.AZ.@[`{.", "az.az.@[`{."},   // bytes next to the letter ranges are not letters
		{"\xc3\x84x.Y.", "\xc3\x84x.y."}, // non-ASCII bytes are kept as they are
		{"\xff\xfeA.", "\xff\xfea."},     // even when not valid UTF-8
		{`a\.B.c.`, `a\.b.c.`},
	}
	for _, tt := range tests {
		if got := lowerName(tt.in); got != tt.want {
			t.Errorf("lowerName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestResponseTupleNoAllocLowerCase(t *testing.T) {
	m := testResponse(t, "www.example.test.", dns.TypeA, dns.RcodeSuccess, true,
		[]string{"www.example.test. 300 IN A 192.0.2.1"}, nil)
	nx := testResponse(t, "nope.example.test.", dns.TypeA, dns.RcodeNameError, true, nil, []string{soaRR})
	wild := testResponse(t, "x.wild.example.test.", dns.TypeA, dns.RcodeSuccess, true,
		[]string{"x.wild.example.test. 300 IN A 192.0.2.1"}, nil)
	var sink ResponseTuple
	allocs := testing.AllocsPerRun(100, func() {
		sink = ResponseTupleFromMsg(m, "")
		sink = ResponseTupleFromMsg(nx, "")
		sink = ResponseTupleFromMsg(wild, "*.wild.example.test.")
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run for lower-case names, want 0", allocs)
	}
	_ = sink
}

// FuzzResponseTupleFromMsg feeds arbitrary bytes through dns.Msg.Unpack and checks
// that ResponseTupleFromMsg never panics and keeps its invariants.
func FuzzResponseTupleFromMsg(f *testing.F) {
	seed := func(m *dns.Msg) {
		if b, err := m.Pack(); err == nil {
			f.Add(b, "")
			f.Add(b, "Wild.Example.Test.")
		}
	}
	seed(testResponse(f, "www.example.test.", dns.TypeA, 0, true, []string{"www.example.test. 300 IN A 192.0.2.1"}, nil))
	seed(testResponse(f, "www.example.test.", dns.TypeMX, 0, true, nil, []string{soaRR}))
	seed(testResponse(f, "h.sub.example.test.", dns.TypeA, 0, false, nil, []string{delegNS, dsRR}))
	seed(testResponse(f, "NOPE.example.test.", dns.TypeA, 3, true, nil, []string{soaRR}))
	seed(testResponse(f, "", 0, dns.RcodeBadCookie, false, nil, nil))
	f.Add([]byte{}, "")
	f.Fuzz(func(t *testing.T, wire []byte, origin string) {
		var m dns.Msg
		if err := m.Unpack(wire); err != nil {
			return
		}
		got := ResponseTupleFromMsg(&m, origin)
		if got.AllowanceCategory >= AllowanceLast {
			t.Fatalf("category %d out of range", got.AllowanceCategory)
		}
		for i := 0; i < len(got.SalientName); i++ {
			if c := got.SalientName[i]; 'A' <= c && c <= 'Z' {
				t.Fatalf("salient name %q not lower case", got.SalientName)
			}
		}
		if len(m.Question) == 0 && (got.Class != 0 || got.Type != 0 || got.SalientName != "") {
			t.Fatalf("no question but tuple %+v", got)
		}
		// The count rule agrees everywhere except where an authority section
		// without a delegation made it say "referral".
		count := NewAllowanceCategory(m.Rcode, len(m.Answer), len(m.Ns))
		if count != got.AllowanceCategory && !(count == AllowanceReferral && got.AllowanceCategory == AllowanceNoData) {
			t.Fatalf("category %v, count rule %v", got.AllowanceCategory, count)
		}
		if origin != "" && len(m.Question) > 0 &&
			(got.AllowanceCategory == AllowanceAnswer || got.AllowanceCategory == AllowanceNoData) &&
			!strings.HasPrefix(got.SalientName, "*.") {
			t.Fatalf("wildcard origin %q gave salient name %q", origin, got.SalientName)
		}
		// Case must not matter: the same message with the names upper-cased
		// yields the same tuple.
		upper := m.Copy()
		for i := range upper.Question {
			upper.Question[i].Name = upperASCII(upper.Question[i].Name)
		}
		for _, rr := range upper.Ns {
			if rr != nil {
				rr.Header().Name = upperASCII(rr.Header().Name)
			}
		}
		if again := ResponseTupleFromMsg(upper, upperASCII(origin)); again != got {
			t.Fatalf("upper-cased message: %+v, want %+v", again, got)
		}
	})
}

// upperASCII maps a-z to A-Z and keeps every other byte, unlike strings.ToUpper,
// which maps Unicode and rewrites invalid UTF-8.
func upperASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}

func BenchmarkResponseTupleFromMsg(b *testing.B) {
	cases := []struct {
		name   string
		m      *dns.Msg
		origin string
	}{
		{"answer", testResponse(b, "www.example.test.", dns.TypeA, 0, true, []string{"www.example.test. 300 IN A 192.0.2.1"}, []string{apexNS}), ""},
		{"answer-0x20", testResponse(b, "wWw.ExAmPlE.tEsT.", dns.TypeA, 0, true, []string{"www.example.test. 300 IN A 192.0.2.1"}, nil), ""},
		{"nodata-soa", testResponse(b, "www.example.test.", dns.TypeMX, 0, true, nil, []string{soaRR}), ""},
		{"referral", testResponse(b, "h.sub.example.test.", dns.TypeA, 0, false, nil, []string{deleg2, dsRR}), ""},
		{"nxdomain", testResponse(b, "nope.example.test.", dns.TypeA, 3, true, nil, []string{soaRR}), ""},
		{"wildcard", testResponse(b, "x.wild.example.test.", dns.TypeA, 0, true, []string{"x.wild.example.test. 300 IN A 192.0.2.1"}, nil), "wild.example.test."},
		{"wildcard-owner", testResponse(b, "x.wild.example.test.", dns.TypeA, 0, true, []string{"x.wild.example.test. 300 IN A 192.0.2.1"}, nil), "*.wild.example.test."},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var sink ResponseTuple
			for b.Loop() {
				sink = ResponseTupleFromMsg(c.m, c.origin)
			}
			_ = sink
		})
	}
}
