package coredns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// newTestPlugin parses the rrl directive in corefile for a block of keys and
// returns the plugin in front of next.
func newTestPlugin(t *testing.T, corefile string, keys []string, next plugin.Handler) *RRL {
	t.Helper()
	c := caddy.NewTestController("dns", corefile)
	c.ServerBlockKeys = keys
	s, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	p := newPlugin(s)
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	p.Next = next
	t.Cleanup(func() { p.close() })
	return p
}

// answer is a next plugin answering every query with one A record; wildcard, when
// set, is reported as the metadata zone/wildcard.
func answer(wildcard string) plugin.Handler {
	return plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		if wildcard != "" {
			metadata.SetValueFunc(ctx, "zone/wildcard", func() string { return wildcard })
		}
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		m.Answer = []dns.RR{test.A(r.Question[0].Name + " 300 IN A 192.0.2.1")}
		w.WriteMsg(m)
		return dns.RcodeSuccess, nil
	})
}

// serve sends a query for name through p over UDP (or TCP) from 10.240.0.1 to
// 127.0.0.1:53 and reports what was written: "send", "tc" or "drop", with
// ServeDNS's results.
func serve(t *testing.T, ctx context.Context, p *RRL, name string, tcp bool) (string, int, error) {
	t.Helper()
	return serveOn(t, ctx, p, name, &test.ResponseWriter{TCP: tcp})
}

// serveOn is serve with the query arriving through w.
func serveOn(t *testing.T, ctx context.Context, p *RRL, name string, w dns.ResponseWriter) (string, int, error) {
	t.Helper()
	rec := dnstest.NewRecorder(w)
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	rcode, err := p.ServeDNS(ctx, rec, q)
	switch {
	case rec.Msg == nil:
		return "drop", rcode, err
	case rec.Msg.Truncated:
		return "tc", rcode, err
	}
	return "send " + dns.RcodeToString[rec.Msg.Rcode], rcode, err
}

func TestServeDNS(t *testing.T) {
	refuse := plugin.HandlerFunc(func(context.Context, dns.ResponseWriter, *dns.Msg) (int, error) {
		return dns.RcodeRefused, errors.New("no")
	})
	for _, tc := range []struct {
		name      string
		corefile  string
		next      plugin.Handler
		metadata  bool
		queries   []string
		tcp       bool
		want      string
		wantRcode int
	}{
		{
			name:     "limited in the zone",
			corefile: "rrl example.org {\n responses-per-second 1\n slip-ratio 1\n}",
			next:     answer(""), queries: []string{"www.example.org.", "www.example.org.", "www.example.org."},
			want: "send NOERROR,tc,tc",
		},
		{
			name:     "slip-ratio defaults to 0: drops",
			corefile: "rrl example.org {\n responses-per-second 1\n}",
			next:     answer(""), queries: []string{"www.example.org.", "www.example.org.", "www.example.org."},
			want: "send NOERROR,drop,drop",
		},
		{
			name:     "outside ZONES unlimited",
			corefile: "rrl example.org {\n responses-per-second 1\n}",
			next:     answer(""), queries: []string{"www.example.net.", "www.example.net.", "www.example.net."},
			want: "send NOERROR,send NOERROR,send NOERROR",
		},
		{
			name:     "TCP: no response limit",
			corefile: "rrl example.org {\n responses-per-second 1\n}",
			next:     answer(""), tcp: true, queries: []string{"www.example.org.", "www.example.org."},
			want: "send NOERROR,send NOERROR",
		},
		{
			name:     "wildcard with metadata: one account",
			corefile: "rrl example.org {\n responses-per-second 1\n}",
			next:     answer("*.wild.example.org."), metadata: true,
			queries: []string{"a.wild.example.org.", "b.wild.example.org.", "c.wild.example.org."},
			want:    "send NOERROR,drop,drop",
		},
		{
			name:     "wildcard without metadata: one account per name",
			corefile: "rrl example.org {\n responses-per-second 1\n}",
			next:     answer("*.wild.example.org."),
			queries:  []string{"a.wild.example.org.", "b.wild.example.org.", "c.wild.example.org."},
			want:     "send NOERROR,send NOERROR,send NOERROR",
		},
		{
			name:     "errors the server would write are limited",
			corefile: "rrl example.org {\n responses-per-second 10\n errors-per-second 1\n}",
			next:     refuse, queries: []string{"www.example.org.", "www.example.org.", "www.example.org."},
			want: "send REFUSED,drop,drop",
		},
		{
			name:     "report-only",
			corefile: "rrl example.org {\n responses-per-second 1\n report-only\n}",
			next:     answer(""), queries: []string{"www.example.org.", "www.example.org.", "www.example.org."},
			want: "send NOERROR,send NOERROR,send NOERROR",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPlugin(t, tc.corefile, []string{"."}, tc.next)
			var got []string
			for _, name := range tc.queries {
				ctx := context.Background()
				if tc.metadata {
					ctx = metadata.ContextWithMetadata(ctx)
				}
				out, rcode, _ := serve(t, ctx, p, name, tc.tcp)
				if !plugin.ClientWrite(rcode) {
					t.Errorf("%s: ServeDNS returned %s: the server would write a second response", name, dns.RcodeToString[rcode])
				}
				got = append(got, out)
			}
			if g := strings.Join(got, ","); g != tc.want {
				t.Errorf("got %s, want %s", g, tc.want)
			}
		})
	}
}

// localWriter is a UDP ResponseWriter for a query that arrived on the socket
// bound to local.
type localWriter struct {
	test.ResponseWriter
	local netip.AddrPort
}

func (w *localWriter) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(w.local) }

// limitedInGo sends 200 UDP queries through p arriving on local, and returns how
// many were answered and how many more the Go request limiter refused.
func limitedInGo(t *testing.T, p *RRL, local netip.AddrPort) (answered int, limited uint64) {
	t.Helper()
	var before uint64
	if l := p.prot.Load().Limiter(); l != nil {
		before = l.Stats().Dropped()
	}
	for range 200 {
		if out, _, _ := serveOn(t, context.Background(), p, "www.example.org.", &localWriter{local: local}); out != "drop" {
			answered++
		}
	}
	if l := p.prot.Load().Limiter(); l != nil {
		limited = l.Stats().Dropped() - before
	}
	return answered, limited
}

func TestServeDNSRequestsInGo(t *testing.T) {
	// Without the kernel filter, the Protection's Handler holds UDP queries to
	// requests-per-second in Go, and coredns_rrl_requests_exceeded_total counts them.
	p := newTestPlugin(t, "rrl {\n requests-per-second 5\n kernel-filter off\n}", []string{"."}, answer(""))
	sent, limited := limitedInGo(t, p, netip.MustParseAddrPort("127.0.0.1:53"))
	if sent > 100 || limited < 100 {
		t.Errorf("Go limits: %d of 200 answered, %d limited; want most refused", sent, limited)
	}
	if _, req := p.exceeded(); req != limited {
		t.Errorf("requests exceeded %d, want the Go limiter's %d", req, limited)
	}
}

// udpSocket opens a UDP socket on 127.0.0.1 and returns it with its listener
// address as dnsserver names it.
func udpSocket(t *testing.T) (netip.AddrPort, string) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	local := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	return local, "dns://" + local.String()
}

func TestAttach(t *testing.T) {
	// The plugin hands a listener address's sockets to its Protection once, which
	// attaches the eBPF filter there: UDP queries arriving on them are left to the
	// kernel, others are held to the limits in Go. close detaches the filter.
	requirePrivilege(t, unix.CAP_BPF)
	local, addr := udpSocket(t)
	p := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	attachGroup([]*RRL{p}, addr)
	prot := p.prot.Load()
	f := prot.Filter()
	attachGroup([]*RRL{p}, addr) // a second Server of the same address (multisocket): no second filter
	if st := prot.Status(); f.Mode() != rrl.ModeEBPF || prot.Filter() != f || !st.RequestsInKernel || st.Sockets != 1 {
		t.Fatalf("status %v, filter %v, want one socket with the eBPF filter", st, prot.Filter())
	}
	if sent, limited := limitedInGo(t, p, local); sent != 200 || limited != 0 {
		t.Errorf("queries on the filtered socket: %d of 200 answered, %d limited in Go; want all answered", sent, limited)
	}
	if sent, limited := limitedInGo(t, p, netip.MustParseAddrPort("127.0.0.1:53")); sent > 100 || limited < 100 {
		t.Errorf("queries on another socket: %d of 200 answered, %d limited in Go; want most refused", sent, limited)
	}
	if err := p.close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != rrl.ModeNone {
		t.Errorf("close left the filter in mode %v", f.Mode())
	}
	attachGroup([]*RRL{p}, addr) // after close (a server starting late): nothing
	if prot.Filter() != nil && prot.Filter().Mode() != rrl.ModeNone {
		t.Error("attach after close attached")
	}
}

func TestAttachNoSocket(t *testing.T) {
	// No socket on the address: logged, and the Go limiter holds the queries.
	p := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	attachGroup([]*RRL{p}, "dns://127.0.0.1:1") // nothing of ours listens on port 1
	prot := p.prot.Load()
	if st := prot.Status(); prot.Filter() != nil || st.RequestsInKernel || st.Sockets != 0 {
		t.Errorf("status %v, filter %v; want none", st, prot.Filter())
	}
	if sent, limited := limitedInGo(t, p, netip.MustParseAddrPort("127.0.0.1:1")); sent > 100 || limited < 100 {
		t.Errorf("%d of 200 answered, %d limited in Go; want most refused", sent, limited)
	}
}

func TestAttachTakeover(t *testing.T) {
	// A reload's new instance takes the filter of an address over with its own
	// settings; the old instance's close leaves it on the socket, the new one's
	// closes it.
	requirePrivilege(t, unix.CAP_BPF)
	_, addr := udpSocket(t)
	old := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	attachGroup([]*RRL{old}, addr)
	f := old.prot.Load().Filter()
	if f == nil {
		t.Fatal("no filter attached")
	}
	next := newTestPlugin(t, "rrl {\n requests-per-second 50\n}", []string{"."}, answer(""))
	attachGroup([]*RRL{next}, addr)
	if next.prot.Load().Filter() != f {
		t.Fatal("the new instance attached another filter instead of taking the old one over")
	}
	if got := f.Config().Values(); !containsPair(got, "requests-per-second", "50") {
		t.Errorf("filter settings %v, want the new instance's requests-per-second 50", got)
	}
	if err := old.close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != rrl.ModeEBPF || !next.prot.Load().Status().RequestsInKernel {
		t.Fatalf("after the old instance's close: mode %v, status %v", f.Mode(), next.prot.Load().Status())
	}
	if err := next.close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != rrl.ModeNone {
		t.Errorf("after the owner's close: mode %v, want closed", f.Mode())
	}
}

func TestAttachGroup(t *testing.T) {
	// Two blocks on one address: one filter on the socket, which both Protections
	// count as in force, so that neither holds the queries to the limits again in
	// Go; the filter goes with the last one to close.
	requirePrivilege(t, unix.CAP_BPF)
	local, addr := udpSocket(t)
	a := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"example.org."}, answer(""))
	b := newTestPlugin(t, "rrl {\n requests-per-second 5\n responses-per-second 100\n}", []string{"example.net."}, answer(""))
	attachGroup([]*RRL{a, b}, addr)
	f := b.prot.Load().Filter()
	if f == nil || f.Mode() != rrl.ModeEBPF {
		t.Fatalf("the last block holds filter %v, want the eBPF filter", f)
	}
	for _, p := range []*RRL{a, b} {
		if st := p.prot.Load().Status(); !st.RequestsInKernel {
			t.Errorf("block %v: status %v, want the request limits in the kernel", p.Zones, st)
		}
		if sent, limited := limitedInGo(t, p, local); sent != 200 || limited != 0 {
			t.Errorf("block %v: %d of 200 answered, %d limited in Go; want all answered", p.Zones, sent, limited)
		}
	}
	a.close()
	if f.Mode() != rrl.ModeEBPF {
		t.Fatalf("the first block's close took the filter off")
	}
	b.close()
	if f.Mode() != rrl.ModeNone {
		t.Errorf("after both closed: mode %v, want closed", f.Mode())
	}
}

func containsPair(kvs [][2]string, k, v string) bool {
	for _, kv := range kvs {
		if kv[0] == k && kv[1] == v {
			return true
		}
	}
	return false
}
