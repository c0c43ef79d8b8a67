package rrlprom

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// testEpoch is the time of the tests' fixed clocks.
var testEpoch = time.Unix(1_750_000_000, 0)

// fixedConfig returns a Config whose RRL clock stands still, with keyword, value
// pairs applied.
func fixedConfig(t testing.TB, kv ...string) *rrl.Config {
	t.Helper()
	cfg := rrl.NewConfig()
	cfg.SetNowFunc(func() time.Time { return testEpoch })
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

func query(name string, qtype uint16, edns bool) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	if edns {
		q.SetEdns0(1232, false)
	}
	return q
}

// handlerZone answers www.example.test. with an A record and any other name with
// NXDOMAIN.
type handlerZone struct{}

func (handlerZone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	q := req.Question[0]
	if q.Name == "www.example.test." {
		rr, _ := dns.NewRR(q.Name + " 300 IN A 192.0.2.1")
		m.Answer = append(m.Answer, rr)
	} else {
		m.Rcode = dns.RcodeNameError
		soa, _ := dns.NewRR("example.test. 300 IN SOA ns.example.test. host.example.test. 1 7200 3600 1209600 300")
		m.Ns = append(m.Ns, soa)
	}
	if req.IsEdns0() != nil {
		m.SetEdns0(1232, false)
	}
	w.WriteMsg(m)
}

// fakeWriter keeps what the Handler writes (internal/testutil).
type fakeWriter = testutil.ResponseWriter

// requirePrivilege skips t unless the process may load the eBPF filter (Attach
// reports ErrNotPermitted otherwise); with RRL_REQUIRE_BPF=1 it fails t instead.
func requirePrivilege(t testing.TB) {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := rrl.Attach(conn, rrl.NewConfig())
	if f != nil {
		f.Close()
	}
	if !errors.Is(err, rrl.ErrNotPermitted) {
		return
	}
	if os.Getenv("RRL_REQUIRE_BPF") == "1" {
		t.Fatalf("needs CAP_BPF, and RRL_REQUIRE_BPF=1 forbids skipping: %v", err)
	}
	t.Skipf("needs CAP_BPF (run as root; set RRL_REQUIRE_BPF=1 to fail instead): %v", err)
}
