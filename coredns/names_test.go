package coredns

import (
	"strings"
	"testing"

	"github.com/coredns/caddy"
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
