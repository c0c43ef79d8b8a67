package rrl

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// bindOption is one option of BIND 9's rate-limit clause as its documentation lists
// it (grammar order), with a value to write and the keyword and value it sets here.
type bindOption struct {
	name, value string
	keyword     string // "" for min-table-size, which sets nothing
	want        string
}

var bindDocOptions = []bindOption{
	{"all-per-second", "20", "all-per-second", "20"},
	{"errors-per-second", "5", "errors-per-second", "5"},
	{"exempt-clients", "{ 192.0.2.1; 198.51.100.0/24; 2001:db8::/32; }", "exempt-clients", "192.0.2.1/32 198.51.100.0/24 2001:db8::/32"},
	{"ipv4-prefix-length", "22", "ipv4-prefix-length", "22"},
	{"ipv6-prefix-length", "48", "ipv6-prefix-length", "48"},
	{"log-only", "yes", "report-only", "true"},
	{"max-table-size", "20000", "max-table-size", "20000"},
	{"min-table-size", "500", "", ""},
	{"nodata-per-second", "4", "nodata-per-second", "4"},
	{"nxdomains-per-second", "3", "nxdomains-per-second", "3"},
	{"qps-scale", "250", "qps-scale", "250"},
	{"referrals-per-second", "2", "referrals-per-second", "2"},
	{"responses-per-second", "10", "responses-per-second", "10"},
	{"slip", "3", "slip-ratio", "3"},
	{"window", "7", "window", "7"},
}

// configAfter returns NewConfig with the keyword, value pairs set.
func configAfter(t *testing.T, kv ...string) *Config {
	t.Helper()
	c := NewConfig()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := c.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func sameValues(a, b *Config) bool {
	return slices.Equal(a.Values(), b.Values())
}

// TestBINDEveryOption parses each documented option alone, in a clause, and all of
// them together, and checks the Config against SetValue's.
func TestBINDEveryOption(t *testing.T) {
	var all strings.Builder
	all.WriteString("rate-limit {\n")
	var allKV []string
	for _, o := range bindDocOptions {
		stmt := fmt.Sprintf("%s %s;", o.name, o.value)
		fmt.Fprintf(&all, "\t%s\n", stmt)
		var kv []string
		if o.keyword != "" {
			kv = []string{o.keyword, o.want}
			allKV = append(allKV, kv...)
		}
		want := configAfter(t, kv...)
		for _, text := range []string{stmt, "rate-limit { " + stmt + " };"} {
			got, err := ParseBINDRateLimit(text, nil)
			if err != nil {
				t.Errorf("%q: %v", text, err)
				continue
			}
			if !sameValues(got, want) {
				t.Errorf("%q:\n got %v\nwant %v", text, got.Values(), want.Values())
			}
		}
	}
	all.WriteString("};\n")
	got, err := ParseBINDRateLimit(all.String(), nil)
	if err != nil {
		t.Fatalf("%s: %v", all.String(), err)
	}
	if want := configAfter(t, allKV...); !sameValues(got, want) {
		t.Errorf("all options:\n got %v\nwant %v", got.Values(), want.Values())
	}
}

// TestBINDRoundTrip: FormatBINDRateLimit and ParseBINDRateLimit give back every
// option's setting.
func TestBINDRoundTrip(t *testing.T) {
	cases := [][]string{
		nil,
		{"responses-per-second", "5"},
		{"responses-per-second", "10", "referrals-per-second", "2", "nodata-per-second", "4",
			"nxdomains-per-second", "3", "errors-per-second", "0", "all-per-second", "20",
			"qps-scale", "250", "window", "3600", "ipv4-prefix-length", "32",
			"ipv6-prefix-length", "128", "slip-ratio", "0", "max-table-size", "1",
			"report-only", "true", "exempt-clients", "192.0.2.1 10.0.0.0/8 2001:db8::1 2001:db8:1::/48"},
		{"window", "1", "ipv4-prefix-length", "1", "ipv6-prefix-length", "1", "slip-ratio", "10"},
	}
	for _, kv := range cases {
		want := configAfter(t, kv...)
		text := FormatBINDRateLimit(want)
		got, err := ParseBINDRateLimit(text, nil)
		if err != nil {
			t.Errorf("%v: %v\n%s", kv, err, text)
			continue
		}
		if !sameValues(got, want) {
			t.Errorf("%v: round trip\n%s\n got %v\nwant %v", kv, text, got.Values(), want.Values())
		}
	}
}

// TestBINDDocumentedClauses parses clauses as BIND's documentation writes them: the
// short examples and a commented configuration using every option.
func TestBINDDocumentedClauses(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		kv         []string
	}{
		{"minimal", "rate-limit {\n    responses-per-second 5;\n};\n",
			[]string{"responses-per-second", "5"}},
		{"window", "rate-limit {\n    responses-per-second 5;\n    window 5;\n};",
			[]string{"responses-per-second", "5", "window", "5"}},
		{"log-only", "rate-limit {\n\tresponses-per-second 10;\n\tlog-only yes;\n};",
			[]string{"responses-per-second", "10", "report-only", "true"}},
		{"commented", `rate-limit {
	slip 2;                      // every other response truncated
	window 15;                   # seconds to bucket
	responses-per-second 5;      /* answers per prefix and second */
	referrals-per-second 5;
	nodata-per-second 5;
	nxdomains-per-second 5;
	errors-per-second 5;
	all-per-second 20;
	log-only no;
	qps-scale 250;
	exempt-clients { 127.0.0.1; 192.0.2.0/24; ::1; };
	ipv4-prefix-length 24;
	ipv6-prefix-length 56;
	/* a comment over
	   two lines */
	max-table-size 20000;
	min-table-size 500;
};
`, []string{"slip-ratio", "2", "window", "15", "responses-per-second", "5",
			"referrals-per-second", "5", "nodata-per-second", "5", "nxdomains-per-second", "5",
			"errors-per-second", "5", "all-per-second", "20", "report-only", "false",
			"qps-scale", "250", "exempt-clients", "127.0.0.1 192.0.2.0/24 ::1",
			"ipv4-prefix-length", "24", "ipv6-prefix-length", "56", "max-table-size", "20000"}},
		{"extension", "requests-per-second 50; ipv4-request-levels \"32:1 16:8\"; responses-per-second 5;",
			[]string{"requests-per-second", "50", "ipv4-request-levels", "32:1 16:8", "responses-per-second", "5"}},
	} {
		got, err := ParseBINDRateLimit(tc.text, nil)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if want := configAfter(t, tc.kv...); !sameValues(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got.Values(), want.Values())
		}
	}
}

// TestBINDBase: options the clause does not set keep the base Config's values, and
// the base is not modified.
func TestBINDBase(t *testing.T) {
	base := configAfter(t, "requests-per-second", "50", "responses-per-second", "1")
	got, err := ParseBINDRateLimit("responses-per-second 7;", base)
	if err != nil {
		t.Fatal(err)
	}
	if want := configAfter(t, "requests-per-second", "50", "responses-per-second", "7"); !sameValues(got, want) {
		t.Errorf("got %v", got.Values())
	}
	if base.responsesPerSecond != 1 {
		t.Error("base modified")
	}
}

// TestBINDErrors: every bad input's error names its line.
func TestBINDErrors(t *testing.T) {
	for _, tc := range []struct {
		text string
		line int
		msg  string
	}{
		{"rate-limit {\n  responses-per-second 5;\n  exempt-clients { localhost; };\n};", 3, "localhost"},
		{"rate-limit {\n  exempt-clients {\n    192.0.2.1;\n    trusted-acl;\n  };\n};", 4, "trusted-acl"},
		{"exempt-clients { !192.0.2.1; };", 1, "!192.0.2.1"},
		{"exempt-clients { any; };", 1, "any"},
		{"exempt-clients { key \"k\"; };", 1, "key"},
		{"exempt-clients { { 192.0.2.1; }; };", 1, "{"},
		{"exempt-clients { 192.0.2.1 };", 1, "want ';'"},
		{"\n\nresponses-per-second 5;\nfoo-per-second 3;", 4, "foo-per-second"},
		{"responses-per-second 5;\nresponses-per-second 6;", 2, "twice"},
		{"responses-per-second five;", 1, "integer"},
		{"responses-per-second 2.5;", 1, "integer"},
		{"responses-per-second -1;", 1, "integer"},
		{"\nwindow 0;", 2, "window"},
		{"window 3601;", 1, "window"},
		{"slip 11;", 1, "slip"},
		{"ipv4-prefix-length 33;", 1, "ipv4-prefix-length"},
		{"log-only maybe;", 1, "boolean"},
		{"log-only \"yes\";", 1, "boolean"},
		{"responses-per-second 5", 1, "want ';'"},
		{"responses-per-second;", 1, "needs a value"},
		{"slip-ratio 2;", 1, "slip-ratio"},
		{"report-only yes;", 1, "report-only"},
		{"rate-limit {\n  window 5;\n", 2, "end of input"},
		{"rate-limit {\n  window 5;\n}", 3, "end of input"},
		{"rate-limit { window 5; };\nrate-limit { };", 2, "after the rate-limit clause"},
		{"/* open\n\n comment", 1, "not closed"},
		{"window 5;\n\"quoted\" 5;", 2, "option name"},
		{"rate-limit { window 5; }; extra", 1, "extra"},
		{"min-table-size lots;", 1, "integer"},
		{"responses-per-second 5 6;", 1, "want ';'"},
		{"ipv4-request-levels \"32:1 8:x\";", 1, "ipv4-request-levels"},
	} {
		_, err := ParseBINDRateLimit(tc.text, nil)
		var be *ConfigError
		if !errors.As(err, &be) || be.Line < 1 {
			t.Errorf("%q: error %v, want a ConfigError with its line", tc.text, err)
			continue
		}
		if be.Line != tc.line || !strings.Contains(err.Error(), tc.msg) ||
			!strings.Contains(err.Error(), fmt.Sprintf("line %d:", tc.line)) {
			t.Errorf("%q: %v (line %d), want line %d and %q", tc.text, err, be.Line, tc.line, tc.msg)
		}
	}
}

func TestBINDExemptPrefixes(t *testing.T) {
	got, err := ParseBINDRateLimit("exempt-clients { 192.0.2.77/24; ::ffff:198.51.100.1; };", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.1/32")}
	if !slices.Equal(got.exempt, want) {
		t.Errorf("exempt %v, want %v", got.exempt, want)
	}
}

func FuzzParseBINDRateLimit(f *testing.F) {
	f.Add("rate-limit { responses-per-second 5; window 5; };")
	f.Add("exempt-clients { 192.0.2.1; 2001:db8::/32; }; log-only yes; slip 0;")
	f.Add("/* c */ # c\n// c\nrate-limit {\n};")
	f.Add(`ipv4-request-levels "32:1 16:16"; qps-scale 100;`)
	for _, o := range bindDocOptions {
		f.Add(o.name + " " + o.value + ";")
	}
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := ParseBINDRateLimit(text, nil)
		if err != nil {
			var be *ConfigError
			if !errors.As(err, &be) || be.Line < 1 || be.Line > strings.Count(text, "\n")+1 {
				t.Fatalf("%q: error %v without a line in the text", text, err)
			}
			return
		}
		// What parses formats and parses back to the same response settings.
		again, err := ParseBINDRateLimit(FormatBINDRateLimit(cfg), nil)
		if err != nil {
			t.Fatalf("%q: formatted clause does not parse: %v\n%s", text, err, FormatBINDRateLimit(cfg))
		}
		if FormatBINDRateLimit(again) != FormatBINDRateLimit(cfg) {
			t.Fatalf("%q: round trip changed\n%s\n%s", text, FormatBINDRateLimit(cfg), FormatBINDRateLimit(again))
		}
	})
}

// TestBINDFormatEveryKeyword: FormatBINDRateLimit writes every keyword with a BIND
// spelling, with its example value, in BIND's syntax, and ParseBINDRateLimit reads it
// back; each alone and all together. Keywords without a BIND spelling and the cookie
// secret are not written.
func TestBINDFormatEveryKeyword(t *testing.T) {
	all := NewConfig()
	for _, k := range keywords {
		c := configAfter(t, k.name, k.example)
		if err := all.SetValue(k.name, k.example); err != nil {
			t.Fatal(err)
		}
		text := FormatBINDRateLimit(c)
		written := strings.Contains(text, "\t"+k.bind+" ")
		if k.bind == "" || k.secret {
			if text != FormatBINDRateLimit(NewConfig()) {
				t.Errorf("%s, which BIND has not, written:\n%s", k.name, text)
			}
			continue
		}
		if !written {
			t.Errorf("%s: %s not written:\n%s", k.name, k.bind, text)
		}
		got, err := ParseBINDRateLimit(text, nil)
		if err != nil {
			t.Errorf("%s: %v\n%s", k.name, err, text)
			continue
		}
		if !sameValues(got, c) {
			t.Errorf("%s: round trip\n%s\n got %v\nwant %v", k.name, text, got.Values(), c.Values())
		}
	}
	text := FormatBINDRateLimit(all)
	noSecret(t, "FormatBINDRateLimit", text)
	if strings.Contains(text, "000102030405060708090a0b0c0d0e0f") || strings.Contains(text, "cookie") {
		t.Errorf("the cookie secret written:\n%s", text)
	}
	got, err := ParseBINDRateLimit(text, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	// What BIND has comes back; the rest is the default.
	want := NewConfig()
	for _, k := range keywords {
		if k.bind != "" && !k.secret {
			want.SetValue(k.name, k.example)
		}
	}
	if !sameValues(got, want) {
		t.Errorf("all keywords:\n%s\n got %v\nwant %v", text, got.Values(), want.Values())
	}
}

// TestBINDFormatForms: BIND's syntax of each form of value: booleans yes and no,
// exempt-clients as an address match list with single addresses bare (an empty one
// left out), integers without exponent, allowances not set left out.
func TestBINDFormatForms(t *testing.T) {
	for _, tc := range []struct {
		kv       []string
		has, not []string
	}{
		{nil, []string{"\tlog-only no;\n", "\tresponses-per-second 0;\n", "\tall-per-second 0;\n"},
			[]string{"exempt-clients", "nodata-per-second", "nxdomains-per-second", "referrals-per-second", "errors-per-second"}},
		{[]string{"report-only", "true", "nodata-per-second", "0", "responses-per-second", "10000000", "qps-scale", "1234567"},
			[]string{"\tlog-only yes;\n", "\tnodata-per-second 0;\n", "\tresponses-per-second 10000000;\n", "\tqps-scale 1234567;\n"},
			[]string{"nxdomains-per-second", "e+"}},
		{[]string{"exempt-clients", "192.0.2.1 10.0.0.0/8 2001:db8::1 2001:db8:1::/48 ::ffff:198.51.100.7"},
			[]string{"\texempt-clients { 192.0.2.1; 10.0.0.0/8; 2001:db8::1; 2001:db8:1::/48; 198.51.100.7; };\n"},
			[]string{"/32", "/128"}},
	} {
		cfg := configAfter(t, tc.kv...)
		text := FormatBINDRateLimit(cfg)
		for _, s := range tc.has {
			if !strings.Contains(text, s) {
				t.Errorf("%v: %q not in\n%s", tc.kv, s, text)
			}
		}
		for _, s := range tc.not {
			if strings.Contains(text, s) {
				t.Errorf("%v: %q in\n%s", tc.kv, s, text)
			}
		}
		got, err := ParseBINDRateLimit(text, nil)
		if err != nil || !sameValues(got, cfg) {
			t.Errorf("%v: round trip: %v\n%s", tc.kv, err, text)
		}
	}
}
