package rrl_test

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

func ExampleResponseTupleFromMsg() {
	q := new(dns.Msg)
	q.SetQuestion("WwW.ExAmPlE.TeSt.", dns.TypeMX) // a resolver randomising case

	// NODATA: no MX at the name, the zone's SOA in the authority section.
	resp := new(dns.Msg)
	resp.SetReply(q)
	resp.Authoritative = true
	soa, _ := dns.NewRR("example.test. 3600 IN SOA ns1.example.test. host.example.test. 1 7200 3600 1209600 300")
	resp.Ns = append(resp.Ns, soa)

	t := rrl.ResponseTupleFromMsg(resp, "")
	fmt.Println(t.AllowanceCategory == rrl.AllowanceNoData, t.SalientName, dns.TypeToString[t.Type])

	// NXDOMAIN is accounted to the zone, whatever name was asked.
	resp.Rcode = dns.RcodeNameError
	t = rrl.ResponseTupleFromMsg(resp, "")
	fmt.Println(t.AllowanceCategory == rrl.AllowanceNXDomain, t.SalientName)

	// An answer synthesised from *.wild.example.test. is accounted to the wildcard.
	q.SetQuestion("a1b2c3.wild.example.test.", dns.TypeA)
	resp.SetReply(q)
	a, _ := dns.NewRR("a1b2c3.wild.example.test. 300 IN A 192.0.2.80")
	resp.Answer = append(resp.Answer, a)
	t = rrl.ResponseTupleFromMsg(resp, "wild.example.test.")
	fmt.Println(t.AllowanceCategory == rrl.AllowanceAnswer, t.SalientName)
	// Output:
	// true www.example.test. MX
	// true example.test.
	// true *.wild.example.test.
}

// A server answering a query that carries a COOKIE option: verify it, then return
// the client cookie with a server cookie. The secret, client and time are those of
// RFC 9018 Appendix A.1.
func ExampleCookies() {
	secret, _ := hex.DecodeString("e5e973e5a6b2a43f48e7dc849e37bfcf")
	cookies := rrl.NewCookies(rrl.CookieSecret(secret))
	client := netip.MustParseAddr("198.51.100.100")
	now := time.Unix(1559731985, 0)

	// The content of the query's COOKIE option (dns.EDNS0_COOKIE, in hex there).
	cookie, _ := hex.DecodeString("2464c4abcf10c957")
	fmt.Println(cookies.Verify(cookie, client, now))

	// The response carries the full cookie in its COOKIE option.
	full := cookies.Generate(cookie, client, now)
	fmt.Printf("%x\n", full)

	// The client sends the full cookie back with its next queries.
	fmt.Println(cookies.Verify(full, client, now.Add(10*time.Minute)))
	fmt.Println(cookies.Verify(full, client, now.Add(40*time.Minute)))
	fmt.Println(cookies.Verify(full, client, now.Add(2*time.Hour)))
	fmt.Println(cookies.Verify(full, netip.MustParseAddr("192.0.2.1"), now))
	// Output:
	// client-only
	// 2464c4abcf10c957010000005cf79f111f8130c3eee29480
	// valid
	// valid-reissue
	// expired
	// bad
}

// Rolling the secret over: cookies made with the old one stay valid, and are
// replaced by cookies made with the new one.
func ExampleCookies_Rotate() {
	client := netip.MustParseAddr("2001:db8::53")
	now := time.Unix(1559741961, 0)
	clientCookie := []byte{1, 2, 3, 4, 5, 6, 7, 8}

	cookies := rrl.NewCookies(rrl.CookieSecret{1})
	old := cookies.Generate(clientCookie, client, now)
	cookies.Rotate(rrl.CookieSecret{2})
	fmt.Println(cookies.Verify(old, client, now))
	cookies.ClearPrevious()
	fmt.Println(cookies.Verify(old, client, now))
	// Output:
	// valid-reissue
	// bad
}
