package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

func TestZoneFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []zoneArg // nil with err
		err  string
	}{
		{args: nil, want: nil},
		{args: []string{"-zone", "a"}, want: []zoneArg{{file: "a"}}},
		{args: []string{"-zone", "a", "-origin", "a.test"}, want: []zoneArg{{"a", "a.test"}}},
		// The single-zone forms of before, in either order.
		{args: []string{"-origin", "a.test", "-zone", "a"}, want: []zoneArg{{"a", "a.test"}}},
		// A second -zone adds a zone: it used to replace the first.
		{args: []string{"-zone", "a", "-zone", "b"}, want: []zoneArg{{file: "a"}, {file: "b"}}},
		{args: []string{"-zone", "a", "-origin", "a.test", "-zone", "b", "-origin", "b.test"}, want: []zoneArg{{"a", "a.test"}, {"b", "b.test"}}},
		{args: []string{"-origin", "a.test", "-zone", "a", "-origin", "b.test", "-zone", "b"}, want: []zoneArg{{"a", "a.test"}, {"b", "b.test"}}},
		{args: []string{"-zone", "a", "-zone", "b", "-origin", "b.test"}, want: []zoneArg{{file: "a"}, {"b", "b.test"}}},
		{args: []string{"-zone", "a", "-origin", "a.test", "-origin", "b.test", "-zone", "b"}, want: []zoneArg{{"a", "a.test"}, {"b", "b.test"}}},
		{args: []string{"-origin", "a.test"}, err: "-origin a.test without a -zone"},
		{args: []string{"-zone", "a", "-origin", "a.test", "-origin", "b.test"}, err: "-origin b.test without a -zone"},
		{args: []string{"-origin", "a.test", "-origin", "b.test", "-zone", "a"}, err: "two -origin flags"},
		{args: []string{"-zone", ""}, err: "empty file name"},
		{args: []string{"-zone", "a", "-origin", ""}, err: "empty origin"},
	} {
		o, err := parseFlags(tc.args, io.Discard)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if !reflect.DeepEqual(o.zones, tc.want) {
			t.Errorf("%q: zones %+v, want %+v", tc.args, o.zones, tc.want)
		}
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-origin", "x.test"}, io.Discard, &stderr); code != 2 {
		t.Errorf("a lone -origin: exit status %d, want 2 (%s)", code, stderr.String())
	}
}

// writeZones writes zone files into a temporary directory: name -> text.
func writeZones(t *testing.T, zones map[string]string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	paths := map[string]string{}
	for name, text := range zones {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		paths[name] = p
	}
	return paths
}

const (
	victimZone = "@ 300 IN SOA ns.victim.test. h.victim.test. 1 2 3 4 5\n@ 300 IN NS ns.victim.test.\nns 300 IN A 192.0.2.1\nwww 300 IN A 192.0.2.10\n*.wild 300 IN A 192.0.2.11\nchild 300 IN NS ns.child.victim.test.\nchild 300 IN DS 1 8 2 " + dsDigest + "\n"
	// child.victim.test. is delegated from victim.test. and served too.
	childZone = "$ORIGIN child.victim.test.\n@ 300 IN SOA ns.child.victim.test. h.child.victim.test. 7 2 3 4 5\n@ 300 IN NS ns\nns 300 IN A 192.0.2.2\nwww 300 IN A 192.0.2.20\n"
	otherZone = "@ 300 IN SOA ns.other.test. h.other.test. 9 2 3 4 5\n@ 300 IN NS ns.other.test.\nwww 300 IN AAAA 2001:db8::30\n"
	dsDigest  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// TestServeSeveralZones serves three zones (two of them nested) from one server,
// given by repeated -zone flags, and asks each over a real loopback socket.
func TestServeSeveralZones(t *testing.T) {
	p := writeZones(t, map[string]string{"victim": victimZone, "child": childZone, "other": otherZone})
	o, err := parseFlags([]string{"-zone", p["victim"], "-origin", "victim.test", "-zone", p["child"], "-zone", p["other"], "-origin", "other.test."}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	zs, err := openZones(o.zones)
	if err != nil {
		t.Fatal(err)
	}
	if got := zs.origins(); got != "victim.test., child.victim.test., other.test." {
		t.Errorf("origins %q", got)
	}
	s, err := startServer(serverConfig{listen: "127.0.0.1:0", zone: zs, cfg: rrl.NewConfig(), tcpConns: 4, log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	for _, tc := range []struct {
		name   string
		qtype  uint16
		rcode  int
		aa     bool
		answer string // the first answer record's data, "" for none
		soa    string // the authority SOA's owner, "" for none
		ns     string // the authority NS's owner (a referral), "" for none
	}{
		{"www.victim.test.", dns.TypeA, dns.RcodeSuccess, true, "192.0.2.10", "", ""},
		{"WWW.Other.Test.", dns.TypeAAAA, dns.RcodeSuccess, true, "2001:db8::30", "", ""},
		{"www.child.victim.test.", dns.TypeA, dns.RcodeSuccess, true, "192.0.2.20", "", ""},
		{"x7f3k.wild.victim.test.", dns.TypeA, dns.RcodeSuccess, true, "192.0.2.11", "", ""},
		// Each zone's negative answers carry its own SOA.
		{"nope.victim.test.", dns.TypeA, dns.RcodeNameError, true, "", "victim.test.", ""},
		{"nope.child.victim.test.", dns.TypeA, dns.RcodeNameError, true, "", "child.victim.test.", ""},
		{"nope.other.test.", dns.TypeA, dns.RcodeNameError, true, "", "other.test.", ""},
		{"www.other.test.", dns.TypeA, dns.RcodeSuccess, true, "", "other.test.", ""},
		// The child's apex is answered by the child, but its DS by the parent.
		{"child.victim.test.", dns.TypeSOA, dns.RcodeSuccess, true, "ns.child.victim.test.", "", ""},
		{"child.victim.test.", dns.TypeDS, dns.RcodeSuccess, true, "1 8 2 " + strings.ToUpper(dsDigest), "", ""},
		// Names in none of the zones are refused.
		{"www.elsewhere.test.", dns.TypeA, dns.RcodeRefused, false, "", "", ""},
		{"test.", dns.TypeSOA, dns.RcodeRefused, false, "", "", ""},
	} {
		q := new(dns.Msg)
		q.SetQuestion(tc.name, tc.qtype)
		m, _, err := (&dns.Client{Net: "udp"}).Exchange(q, s.addr)
		if err != nil {
			t.Errorf("%s %s: %v", tc.name, dns.TypeToString[tc.qtype], err)
			continue
		}
		answer, soa, ns := "", "", ""
		if len(m.Answer) > 0 {
			f := strings.Fields(m.Answer[0].String())
			answer = strings.Join(f[4:], " ")
			if tc.qtype == dns.TypeSOA {
				answer = f[4]
			}
		}
		for _, rr := range m.Ns {
			switch rr.(type) {
			case *dns.SOA:
				soa = rr.Header().Name
			case *dns.NS:
				ns = rr.Header().Name
			}
		}
		if m.Rcode != tc.rcode || m.Authoritative != tc.aa || answer != tc.answer || soa != tc.soa || ns != tc.ns {
			t.Errorf("%s %s: rcode %s aa %v answer %q soa %q ns %q, want %s %v %q %q %q\n%v", tc.name, dns.TypeToString[tc.qtype],
				dns.RcodeToString[m.Rcode], m.Authoritative, answer, soa, ns, dns.RcodeToString[tc.rcode], tc.aa, tc.answer, tc.soa, tc.ns, m)
		}
	}
}

func TestOpenZonesErrors(t *testing.T) {
	p := writeZones(t, map[string]string{"a": otherZone, "b": otherZone, "bad": "www 300 IN A 192.0.2.1\n"})
	for _, tc := range []struct {
		args []zoneArg
		err  string
	}{
		{[]zoneArg{{p["a"], "other.test"}, {p["b"], "other.test"}}, "both hold the zone other.test."},
		{[]zoneArg{{p["a"], "other.test"}, {p["bad"], "x.test"}}, "no SOA record"},
		{[]zoneArg{{p["a"], "other.test"}, {p["a"] + ".missing", ""}}, "no such file"},
	} {
		if _, err := openZones(tc.args); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: error %v, want %q", tc.args, err, tc.err)
		}
	}
	zs, err := openZones(nil)
	if err != nil || zs.origins() != "example.test." {
		t.Errorf("no -zone: %v, %v; want the embedded example.test.", zs, err)
	}
}

// TestServedZones checks that the served origins become the zones keyword unless
// the operator sets it, and that a -bind-rate-limit file still may.
func TestServedZones(t *testing.T) {
	p := writeZones(t, map[string]string{"victim": victimZone, "child": childZone, "other": otherZone})
	several := []string{"-zone", p["victim"], "-origin", "victim.test", "-zone", p["child"], "-zone", p["other"], "-origin", "other.test."}
	for _, tc := range []struct {
		name string
		args []string
		bind string // a -bind-rate-limit clause applied over the flags, "" for none
		want string // the zones keyword in force, "" for unset
	}{
		{"embedded zone", nil, "", "example.test."},
		{"several zones", several, "", "victim.test. child.victim.test. other.test."},
		{"the operator's zones", append([]string{"-zones", "Other.Test"}, several...), "", "other.test."},
		{"the operator's empty zones", append([]string{"-zones", ""}, several...), "", ""},
		{"a file without zones", several, "rate-limit { responses-per-second 5; };", "victim.test. child.victim.test. other.test."},
		{"a file's zones", several, "rate-limit { zones \"victim.test\"; };", "victim.test."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			cfg := rrl.NewConfig()
			for _, kv := range o.settings {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			zs, err := openZones(o.zones)
			if err != nil {
				t.Fatal(err)
			}
			if err := servedZones(cfg, o, zs); err != nil {
				t.Fatal(err)
			}
			if tc.bind != "" {
				if cfg, err = rrl.ParseBINDRateLimit(tc.bind, cfg); err != nil {
					t.Fatal(err)
				}
			}
			got := ""
			for _, kv := range cfg.Values() {
				if kv[0] == "zones" {
					got = kv[1]
				}
			}
			if got != tc.want {
				t.Errorf("zones %q, want %q", got, tc.want)
			}
		})
	}
}
