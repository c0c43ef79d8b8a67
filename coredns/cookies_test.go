package coredns

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// cookieQuery sends one query for www.example.test carrying cookie (hexadecimal:
// a client cookie, or a client and server cookie) to port and returns the COOKIE
// option of the answer ("" without one).
func cookieQuery(t *testing.T, port int, cookie string) string {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: cookie}}
	got := burst(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), q, 1, 5*time.Second)
	if len(got) != 1 || len(got[0].Answer) != 1 {
		t.Fatalf("query with cookie %s: %v, want one answer", cookie, got)
	}
	if opt := got[0].IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if c, ok := o.(*dns.EDNS0_COOKIE); ok {
				return c.Cookie
			}
		}
	}
	return ""
}

func cookieCorefile(port, mport int, props string) string {
	return fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        responses-per-second 10
        %s
    }
    file db.example.test
}
`, port, mport, props)
}

func TestCoreDNSCookiesByDefault(t *testing.T) {
	// A coredns/rrl Corefile, which says nothing of cookies, issues server cookies;
	// the generated secret outlives a reload, so clients' cookies stay valid, and
	// another process has its own. "cookies off" issues none.
	const client = "0123456789abcdef"
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, cookieCorefile(port, mport, ""), map[string]string{"db.example.test": exampleZone})
	full := cookieQuery(t, port, client)
	if len(full) != 16+32 || full[:16] != client {
		t.Fatalf("answer's cookie %q, want the client cookie and a server cookie of 16 bytes", full)
	}
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	valid := func(what string, want float64) {
		t.Helper()
		if v := metric(t, mAddr, "coredns_rrl_handler_cookies_total", `result="valid"`); v != want {
			t.Errorf("%s: %v valid server cookies, want %v", what, v, want)
		}
	}
	cookieQuery(t, port, full)
	valid("before the reload", 1)
	reload(t, s, cookieCorefile(port, mport, "responses-per-second 20"))
	cookieQuery(t, port, full)
	valid("after the reload", 1) // a reload starts the counters afresh

	port2, mport2 := freePort(t), freePort(t)
	startCoreDNS(t, cookieCorefile(port2, mport2, ""), map[string]string{"db.example.test": exampleZone})
	if got := cookieQuery(t, port2, full); len(got) != 48 || got == full {
		t.Errorf("another process answered the first one's cookie with %q, want a cookie of its own", got)
	}
	m2 := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport2))
	if v := metric(t, m2, "coredns_rrl_handler_cookies_total", `result="valid"`); v != 0 {
		t.Errorf("another process took the first one's server cookie as valid")
	}

	port3, mport3 := freePort(t), freePort(t)
	startCoreDNS(t, cookieCorefile(port3, mport3, "cookies off"), map[string]string{"db.example.test": exampleZone})
	if got := cookieQuery(t, port3, client); got != "" {
		t.Errorf("cookies off: the answer carries the cookie %q", got)
	}
}
