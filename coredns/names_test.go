package coredns

import (
	"context"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/test"
	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// TestParseNames: names and zones are properties of the one keyword table: names
// takes on or off, zones one or more names (given as several arguments), and a bad
// value is refused naming the keyword.
func TestParseNames(t *testing.T) {
	for _, tc := range []struct{ props, key, want, err string }{
		{"capacity auto\n names off", "names", "off", ""},
		{"capacity auto", "names", "on", ""},
		{"zones victim.test. Other.Test", "zones", "victim.test. other.test.", ""},
		{"names maybe", "", "", `names "maybe"`},
		{"zones .", "", "", `zones "."`},
		{"zones", "", "", "Wrong argument count"},
	} {
		s, err := parse(caddy.NewTestController("dns", "rrl {\n "+tc.props+"\n}"))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one with %q", tc.props, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.props, err)
		case values(s.cfg)[tc.key] != tc.want:
			t.Errorf("%q: %s is %q, want %q", tc.props, tc.key, values(s.cfg)[tc.key], tc.want)
		}
	}
}

// TestDefaultZones: without a zones property the names judge gets the zones of
// the rrl blocks on the block's addresses (its own first, the root left out); one
// set in the Corefile stays as written.
func TestDefaultZones(t *testing.T) {
	other := &RRL{Zones: []string{"other.test.", "victim.test."}}
	for _, tc := range []struct {
		props string
		zones []string
		group bool
		want  string
	}{
		{"capacity auto", []string{"victim.test."}, false, "victim.test."},
		{"capacity auto", []string{"victim.test.", "."}, true, "victim.test. other.test."},
		{"capacity auto", []string{"."}, false, ""},
		{"capacity auto\n zones mine.test.", []string{"victim.test."}, true, "mine.test."},
	} {
		s, err := parse(caddy.NewTestController("dns", "rrl {\n "+tc.props+"\n}"))
		if err != nil {
			t.Fatal(err)
		}
		s.zones = tc.zones
		p := newPlugin(s)
		if tc.group {
			p.groups = []*socketGroup{{addr: "dns://:53", members: []*RRL{p, other}}}
		}
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		p.close()
		if got := values(s.cfg)["zones"]; got != tc.want {
			t.Errorf("%q for %v (group %v): zones %q, want %q", tc.props, tc.zones, tc.group, got, tc.want)
		}
	}
}

// zoneAnswer is a next plugin answering as the authoritative server of victim.test.
// does: data for www, NODATA for txt, a wildcard's synthesis under wild (reported as
// the file plugin does, metadata zone/wildcard with the wildcard's owner) and
// NXDOMAIN with the SOA for any other name.
func zoneAnswer() plugin.Handler {
	return plugin.HandlerFunc(func(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		name := r.Question[0].Name
		soa := test.SOA("victim.test. 300 IN SOA ns1.victim.test. h.victim.test. 1 7200 900 1209600 300")
		switch {
		case name == "www.victim.test.":
			m.Answer = []dns.RR{test.A(name + " 300 IN A 192.0.2.1")}
		case name == "txt.victim.test.":
			m.Ns = []dns.RR{soa}
		case dns.IsSubDomain("wild.victim.test.", name) && name != "wild.victim.test.":
			metadata.SetValueFunc(ctx, "zone/wildcard", func() string { return "*.wild.victim.test." })
			m.Answer = []dns.RR{test.A(name + " 300 IN A 192.0.2.9")}
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{soa}
		}
		w.WriteMsg(m)
		return m.Rcode, nil
	})
}

// TestNamesLearnt: the responses of the next plugin teach the names judge which
// names exist: a name answered with data or NODATA is known from its next query on,
// a name answered NXDOMAIN is not, nor is a name a wildcard synthesised (with the
// metadata plugin, which reports the wildcard; without it the file plugin cannot,
// and such a name is learnt as a name of its own).
func TestNamesLearnt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		metadata bool
		known    bool
	}{
		{"www.victim.test.", false, true},
		{"txt.victim.test.", false, true},
		{"x7f3k.victim.test.", false, false},
		{"a.wild.victim.test.", true, false},
		{"a.wild.victim.test.", false, true},
	} {
		p := newTestPlugin(t, "rrl {\n capacity auto\n kernel-filter off\n}", []string{"victim.test."}, zoneAnswer())
		ask := func() rrl.NameStats {
			ctx := context.Background()
			if tc.metadata {
				ctx = metadata.ContextWithMetadata(ctx)
			}
			if out, _, _ := serve(t, ctx, p, tc.name, false); out == "drop" {
				t.Fatalf("%s: dropped", tc.name)
			}
			return *p.prot.Load().Limiter().Stats().Names
		}
		first := ask()
		if first.Known != 0 || first.Unknown != 1 {
			t.Errorf("%s (metadata %v): first query counted %+v, want unknown", tc.name, tc.metadata, first)
		}
		second := ask()
		if got := second.Known == 1; got != tc.known || second.Known+second.Unknown != 2 {
			t.Errorf("%s (metadata %v): second query counted %+v, want known %v", tc.name, tc.metadata, second, tc.known)
		}
	}
}
