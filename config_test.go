package rrl

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestNewConfigDefaults(t *testing.T) {
	c := NewConfig()
	if c.window != 15 || c.ipv4PrefixLength != 24 || c.ipv6PrefixLength != 56 || c.slipRatio != 2 ||
		c.maxTableSize != 100000 || c.responsesPerSecond != 0 || c.requestsPerSecond != 0 || c.reportOnly ||
		len(c.exempt) != 0 || c.IsActive() {
		t.Errorf("defaults: %+v", c)
	}
	for cat := range AllowanceLast {
		if c.allowance(cat) != 0 {
			t.Errorf("category %d allowance %v", cat, c.allowance(cat))
		}
	}
}

func TestSetValue(t *testing.T) {
	for _, tc := range []struct {
		kw, value string
		ok        bool
		check     func(c *Config) bool // on success
	}{
		{"window", "1", true, func(c *Config) bool { return c.window == 1 }},
		{"window", " 3600 ", true, func(c *Config) bool { return c.window == 3600 }},
		{"window", "0", false, nil},
		{"window", "3601", false, nil},
		{"window", "1.5", false, nil},
		{"window", "", false, nil},
		{"ipv4-prefix-length", "32", true, func(c *Config) bool { return c.ipv4PrefixLength == 32 }},
		{"ipv4-prefix-length", "1", true, func(c *Config) bool { return c.ipv4PrefixLength == 1 }},
		{"ipv4-prefix-length", "0", false, nil},
		{"ipv4-prefix-length", "33", false, nil},
		{"ipv6-prefix-length", "128", true, func(c *Config) bool { return c.ipv6PrefixLength == 128 }},
		{"ipv6-prefix-length", "129", false, nil},
		{"ipv6-prefix-length", "-1", false, nil},
		{"responses-per-second", "5", true, func(c *Config) bool {
			return c.allowance(AllowanceAnswer) == 5 && c.allowance(AllowanceNXDomain) == 5 && c.allowance(AllowanceError) == 5 && c.IsActive()
		}},
		{"responses-per-second", "0.25", true, func(c *Config) bool { return c.responsesPerSecond == 0.25 }},
		{"responses-per-second", "10000000", true, func(c *Config) bool { return c.responsesPerSecond == 1e7 }},
		{"responses-per-second", "10000001", false, nil},
		{"responses-per-second", "-1", false, nil},
		{"responses-per-second", "NaN", false, nil},
		{"responses-per-second", "inf", false, nil},
		{"responses-per-second", "five", false, nil},
		{"nodata-per-second", "0", true, func(c *Config) bool { return c.nodataSet && c.allowance(AllowanceNoData) == 0 }},
		{"nxdomains-per-second", "3", true, func(c *Config) bool { return c.allowance(AllowanceNXDomain) == 3 }},
		{"referrals-per-second", "3", true, func(c *Config) bool { return c.allowance(AllowanceReferral) == 3 }},
		{"errors-per-second", "3", true, func(c *Config) bool { return c.allowance(AllowanceError) == 3 }},
		{"requests-per-second", "100", true, func(c *Config) bool { return c.requestsPerSecond == 100 && c.IsActive() }},
		{"all-per-second", "20", true, func(c *Config) bool { return c.allPerSecond == 20 && c.IsActive() }},
		{"qps-scale", "250", true, func(c *Config) bool { return c.qpsScale == 250 }},
		{"qps-scale", "-250", false, nil},
		{"slip-ratio", "0", true, func(c *Config) bool { return c.slipRatio == 0 }},
		{"slip-ratio", "10", true, func(c *Config) bool { return c.slipRatio == 10 }},
		{"slip-ratio", "11", false, nil},
		{"max-table-size", "0", true, func(c *Config) bool { return c.maxTableSize == 100000 }},
		{"max-table-size", "1", true, func(c *Config) bool { return c.maxTableSize == 1 }},
		{"max-table-size", "67108864", true, func(c *Config) bool { return c.maxTableSize == 1<<26 }},
		{"max-table-size", "67108865", false, nil},
		{"max-table-size", "-5", false, nil},
		{"report-only", "", true, func(c *Config) bool { return c.reportOnly }},
		{"report-only", "true", true, func(c *Config) bool { return c.reportOnly }},
		{"report-only", "false", true, func(c *Config) bool { return !c.reportOnly }},
		{"report-only", "maybe", false, nil},
		{"exempt-clients", "192.0.2.1, 2001:db8::/32 ::ffff:198.51.100.0/120", true, func(c *Config) bool {
			return slices.Equal(c.exempt, []netip.Prefix{netip.MustParsePrefix("192.0.2.1/32"),
				netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("198.51.100.0/24")})
		}},
		{"exempt-clients", "", true, func(c *Config) bool { return len(c.exempt) == 0 }},
		{"exempt-clients", "192.0.2.1, example.test", false, nil},
		{"exempt-clients", "192.0.2.0/33", false, nil},
		{"ipv4-request-levels", "32:1 16:16 8:100", true, func(c *Config) bool { return len(c.ipv4Levels) == 3 }},
		{"ipv4-request-levels", "32:1 32:2", false, nil},
		{"ipv4-request-levels", "30:1 28:1 26:1 22:1 20:1", false, nil}, // six levels with /24
		{"ipv6-request-levels", "128:x", false, nil},
		{"source-port-factor", "0", true, func(c *Config) bool { return c.sourcePortFactor == 0 }},
		{"source-port-factor", "1000001", false, nil},
		{"total-requests-per-second", "1000", true, func(c *Config) bool { return c.totalRequests == 1000 && c.IsActive() }},
		{"reflection-ports", "53, 123 123", true, func(c *Config) bool { return slices.Equal(c.reflectionPorts, []uint16{53, 123}) }},
		{"reflection-ports", "65536", false, nil},
		{"no-such-keyword", "1", false, nil},
		{"Window", "10", false, nil},
	} {
		t.Run(tc.kw+"="+tc.value, func(t *testing.T) {
			c := NewConfig()
			before := c.clone()
			err := c.SetValue(tc.kw, tc.value)
			if (err == nil) != tc.ok {
				t.Fatalf("SetValue(%q, %q) = %v, want ok %v", tc.kw, tc.value, err, tc.ok)
			}
			if err != nil {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Keyword != tc.kw || ce.Value != tc.value ||
					!strings.Contains(err.Error(), tc.kw) {
					t.Errorf("error %v does not name the keyword and value", err)
				}
				if !reflect.DeepEqual(c, before) {
					t.Errorf("a failed SetValue changed the Config: %+v", c)
				}
				return
			}
			if !tc.check(c) {
				t.Errorf("SetValue(%q, %q) left %+v", tc.kw, tc.value, c)
			}
			if _, err := New(c); err != nil {
				t.Errorf("New after SetValue: %v", err)
			}
		})
	}
}

func TestSetValueFollowsResponses(t *testing.T) {
	// Categories not set follow responses-per-second whatever the order of the
	// calls; set ones keep their value.
	c := NewConfig()
	c.SetValue("nxdomains-per-second", "2")
	c.SetValue("responses-per-second", "9")
	want := [AllowanceLast]float64{9, 9, 9, 2, 9}
	for cat := range AllowanceLast {
		if c.allowance(cat) != want[cat] {
			t.Errorf("category %d: %v, want %v", cat, c.allowance(cat), want[cat])
		}
	}
}

func TestConfigKeywordsAccepted(t *testing.T) {
	// Every listed keyword is known to SetValue: a bad value gives a value error,
	// not "unknown keyword".
	for _, kw := range ConfigKeywords() {
		err := NewConfig().SetValue(kw, "\x00bad")
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Reason == "unknown keyword" {
			t.Errorf("%s: %v", kw, err)
		}
	}
}

func TestExemptClientsRejectZones(t *testing.T) {
	cfg := NewConfig()
	for _, v := range []string{"fe80::1%eth0", "fe80::%lo/64"} {
		if err := cfg.SetValue("exempt-clients", v); err == nil {
			t.Errorf("exempt-clients %q accepted", v)
		}
	}
}

func TestReflectionPortsLimit(t *testing.T) {
	cfg := NewConfig()
	var ports []string
	for p := 1000; p < 1000+maxReflectionPorts; p++ {
		ports = append(ports, strconv.Itoa(p))
	}
	if err := cfg.SetValue("reflection-ports", strings.Join(ports, " ")); err != nil {
		t.Fatalf("%d ports refused: %v", len(ports), err)
	}
	ports = append(ports, "9999")
	if err := cfg.SetValue("reflection-ports", strings.Join(ports, " ")); err == nil {
		t.Fatalf("%d ports accepted", len(ports))
	}
	if len(cfg.reflectionPorts) != maxReflectionPorts {
		t.Fatalf("a refused value changed the list to %d ports", len(cfg.reflectionPorts))
	}
}

// TestDefaultReflectionPortsImmutable: a caller that changes the slice
// DefaultReflectionPorts returns changes neither later results, nor new Configs, nor
// the classic program built without a Config.
func TestDefaultReflectionPortsImmutable(t *testing.T) {
	want := []uint16{0, 19, 123, 161, 389, 1900, 11211}
	prog, err := classicProgram(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultReflectionPorts()
	if !slices.Equal(p, want) {
		t.Fatalf("DefaultReflectionPorts() = %v, want %v", p, want)
	}
	for i := range p {
		p[i] = 53 // a caller "adding DNS" by overwriting would drop every query
	}
	_ = append(p[:0], 53)
	if got := DefaultReflectionPorts(); !slices.Equal(got, want) {
		t.Errorf("after a caller's change DefaultReflectionPorts() = %v, want %v", got, want)
	}
	if got := NewConfig().reflectionPorts; !slices.Equal(got, want) {
		t.Errorf("after a caller's change NewConfig reflection ports = %v, want %v", got, want)
	}
	after, err := classicProgram(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after, prog) {
		t.Error("after a caller's change the classic program differs")
	}
}

// TestKeywordTable checks that each entry of the keyword table is all it takes for a
// keyword: SetValue accepts its example, Values prints it back (a secret redacted),
// ConfigKeywords lists it, and a BIND clause sets it under its BIND name or its own.
func TestKeywordTable(t *testing.T) {
	if got := ConfigKeywords(); len(got) != len(keywords) {
		t.Fatalf("ConfigKeywords has %d keywords, the table %d", len(got), len(keywords))
	}
	for i, k := range keywords {
		if ConfigKeywords()[i] != k.name {
			t.Errorf("ConfigKeywords()[%d] = %s, want %s", i, ConfigKeywords()[i], k.name)
		}
		if k.example == "" {
			t.Errorf("%s: no example value", k.name)
			continue
		}
		c := NewConfig()
		if def, ok := k.get(c); ok && def == k.example {
			t.Errorf("%s: example %q is the default", k.name, k.example)
		}
		if err := c.SetValue(k.name, k.example); err != nil {
			t.Errorf("%s %q: %v", k.name, k.example, err)
			continue
		}
		want := k.example
		if k.secret {
			want = redacted
		}
		var printed string
		for _, kv := range c.Values() {
			if kv[0] == k.name {
				printed = kv[1]
			}
		}
		if printed != want {
			t.Errorf("%s: Values prints %q, want %q", k.name, printed, want)
		}
		for _, kv := range configPairs(c) {
			if k.secret && kv[0] == k.name {
				t.Errorf("%s: in the pinned filter's pairs", k.name)
			}
		}

		name, value := k.bind, k.example
		switch {
		case name == "":
			name, value = k.name, `"`+value+`"`
		case k.name == "exempt-clients":
			value = "{ " + strings.Join(strings.Fields(value), "; ") + "; }"
		}
		got, err := ParseBINDRateLimit(name+" "+value+";", nil)
		if err != nil {
			t.Errorf("BIND %s %s: %v", name, value, err)
			continue
		}
		if !slices.Equal(got.Values(), c.Values()) {
			t.Errorf("BIND %s %s: Values %v, want %v", name, value, got.Values(), c.Values())
		}
	}
}
