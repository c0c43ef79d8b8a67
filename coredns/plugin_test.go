package coredns

import (
	"context"
	"errors"
	"net"
	"strconv"
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
	p, err := newPlugin(s)
	if err != nil {
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

// serve sends a query for name through p over UDP (or TCP) from 10.240.0.1 and
// reports what was written: "send", "tc" or "drop", with ServeDNS's results.
func serve(t *testing.T, ctx context.Context, p *RRL, name string, tcp bool) (string, int, error) {
	t.Helper()
	rec := dnstest.NewRecorder(&test.ResponseWriter{TCP: tcp})
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

func TestServeDNSRequestsInGo(t *testing.T) {
	// Without the kernel filter holding every listener to requests-per-second, the
	// Go limiter does it; with it, the plugin leaves UDP queries to the kernel.
	for _, kernel := range []bool{false, true} {
		p := newTestPlugin(t, "rrl {\n requests-per-second 5\n kernel-filter off\n}", []string{"."}, answer(""))
		p.kernelLimits.Store(kernel)
		sent := 0
		for range 200 {
			if out, _, _ := serve(t, context.Background(), p, "www.example.org.", false); out != "drop" {
				sent++
			}
		}
		limited := p.limiter.Stats().Limited
		if kernel && (sent != 200 || limited != 0) {
			t.Errorf("kernel limits: %d of 200 answered, %d limited in Go; want all answered", sent, limited)
		}
		if !kernel && (sent > 100 || limited < 100) {
			t.Errorf("Go limits: %d of 200 answered, %d limited; want most refused", sent, limited)
		}
		if _, req := p.exceeded(); req != limited {
			t.Errorf("requests exceeded %d, want the Go limiter's %d", req, limited)
		}
	}
}

func TestAttach(t *testing.T) {
	// The plugin attaches one filter per listener address, to the sockets bound
	// there, and close detaches it.
	requirePrivilege(t, unix.CAP_BPF)
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	addr := "dns://127.0.0.1:" + strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	p := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	p.attach(addr)
	p.attach(addr) // a second Server of the same address (multisocket): no second filter
	if len(p.filters) != 1 || p.filters[addr].Mode() != rrl.ModeEBPF {
		t.Fatalf("filters %v, want one in ebpf mode", p.filters)
	}
	if !p.kernelLimits.Load() {
		t.Error("kernelLimits false with the eBPF filter attached")
	}
	if err := p.close(); err != nil {
		t.Fatal(err)
	}
	if p.kernelLimits.Load() || len(p.filters) != 0 {
		t.Error("close left filters or kernelLimits")
	}
	p.attach(addr) // after close (a server starting late): nothing
	if len(p.filters) != 0 {
		t.Error("attach after close attached")
	}
}

func TestAttachNoSocket(t *testing.T) {
	// No socket on the address: logged, and the Go limiter keeps enforcing.
	p := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	p.attach("dns://127.0.0.1:1") // nothing of ours listens on port 1
	if len(p.filters) != 0 || p.kernelLimits.Load() || !p.failed {
		t.Errorf("filters %v, kernelLimits %v, failed %v; want none, false, true", p.filters, p.kernelLimits.Load(), p.failed)
	}
}

func TestAttachTakeover(t *testing.T) {
	// A reload's new instance takes the filter of an address over with its own
	// settings; the old instance's close leaves it on the socket, the new one's
	// closes it.
	requirePrivilege(t, unix.CAP_BPF)
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	addr := "dns://127.0.0.1:" + strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	old := newTestPlugin(t, "rrl {\n requests-per-second 5\n}", []string{"."}, answer(""))
	old.attach(addr)
	f := old.filters[addr]
	if f == nil {
		t.Fatal("no filter attached")
	}
	next := newTestPlugin(t, "rrl {\n requests-per-second 50\n}", []string{"."}, answer(""))
	next.attach(addr)
	if next.filters[addr] != f {
		t.Fatal("the new instance attached another filter instead of taking the old one over")
	}
	if got := f.Config().Values(); !containsPair(got, "requests-per-second", "50") {
		t.Errorf("filter settings %v, want the new instance's requests-per-second 50", got)
	}
	if err := old.close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != rrl.ModeEBPF || !next.kernelLimits.Load() {
		t.Fatalf("after the old instance's close: mode %v, kernelLimits %v", f.Mode(), next.kernelLimits.Load())
	}
	if err := next.close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != rrl.ModeNone {
		t.Errorf("after the owner's close: mode %v, want closed", f.Mode())
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
