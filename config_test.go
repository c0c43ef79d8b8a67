package rrl

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
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
		{"events-per-second", "1", true, func(c *Config) bool { return c.eventsPerSec() == 1 }},
		{"events-per-second", "1000000", true, func(c *Config) bool { return c.eventsPerSec() == 1_000_000 }},
		{"events-per-second", "0", false, nil},
		{"events-per-second", "1000001", false, nil},
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

// TestDefaultReflectionPortsImmutable: a change to one Config's reflection ports
// changes neither new Configs nor the classic program built without a Config.
func TestDefaultReflectionPortsImmutable(t *testing.T) {
	want := []uint16{0, 19, 123, 161, 389, 1900, 11211}
	prog, err := classicProgram(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := NewConfig()
	p := c.reflectionPorts
	if !slices.Equal(p, want) {
		t.Fatalf("NewConfig reflection ports = %v, want %v", p, want)
	}
	for i := range p {
		p[i] = 53 // a change in place to "add DNS" would drop every query
	}
	_ = append(p[:0], 53)
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

// TestKeywordsDocumented checks that every keyword of the table is in the Config doc
// comment's list and in docs/configuration.md, so that neither drifts from the table.
func TestKeywordsDocumented(t *testing.T) {
	src, err := os.ReadFile("config.go")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, kw := range ConfigKeywords() {
		if !strings.Contains(string(src), "\n//\t"+kw+" ") {
			t.Errorf("%s is not in the Config doc comment's keyword list", kw)
		}
		if !strings.Contains(string(ref), "| `"+kw+"` |") {
			t.Errorf("%s is not in docs/configuration.md", kw)
		}
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
		if err := validate(c); err != nil {
			t.Errorf("%s %q: validate: %v", k.name, k.example, err)
		}
		if (k.check == nil) != (k.reset == nil) {
			t.Errorf("%s: check and reset go together", k.name)
		}
		if k.bind != "" && !k.secret {
			text := FormatBINDRateLimit(c)
			if got, err := ParseBINDRateLimit(text, nil); err != nil || !slices.Equal(got.Values(), c.Values()) {
				t.Errorf("%s: FormatBINDRateLimit does not read back (%v):\n%s", k.name, err, text)
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

// badValues are, for each keyword with a range, values out of it put into a Config
// as code of the package can (not through SetValue). A keyword added to the table
// with a check needs its entry here.
var badValues = map[string][]func(c *Config){
	"window":             {func(c *Config) { c.window = 0 }, func(c *Config) { c.window = 3601 }, func(c *Config) { c.window = -1 }},
	"ipv4-prefix-length": {func(c *Config) { c.ipv4PrefixLength = 0 }, func(c *Config) { c.ipv4PrefixLength = 33 }},
	"ipv6-prefix-length": {func(c *Config) { c.ipv6PrefixLength = 0 }, func(c *Config) { c.ipv6PrefixLength = 129 }},
	"slip-ratio":         {func(c *Config) { c.slipRatio = -1 }, func(c *Config) { c.slipRatio = 11 }},
	"max-table-size": {func(c *Config) { c.maxTableSize = 0 }, func(c *Config) { c.maxTableSize = -1 },
		func(c *Config) { c.maxTableSize = maxTableSize + 1 }},
	"events-per-second": {func(c *Config) { c.eventsPerSecond = 0 }, func(c *Config) { c.eventsPerSecond = -3 },
		func(c *Config) { c.eventsPerSecond = maxEventsPerSecond + 1 }},
	"exempt-clients": {func(c *Config) { c.exempt = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), {}} }},
	"ipv4-request-levels": {
		func(c *Config) { c.ipv4Levels = []requestLevel{{33, 1}} },
		func(c *Config) { c.ipv4Levels = []requestLevel{{0, 1}} },
		func(c *Config) { c.ipv4Levels = []requestLevel{{16, math.NaN()}} },
		func(c *Config) { c.ipv4Levels = []requestLevel{{16, -1}} },
		func(c *Config) { c.ipv4Levels = []requestLevel{{16, 1}, {16, 2}} },
		// Six levels with the client network's /24.
		func(c *Config) { c.ipv4Levels = []requestLevel{{32, 1}, {28, 1}, {20, 1}, {16, 1}, {8, 1}} },
	},
	"ipv6-request-levels": {
		func(c *Config) { c.ipv6Levels = []requestLevel{{129, 1}} },
		func(c *Config) { c.ipv6Levels = []requestLevel{{48, 1_000_001}} },
	},
	"source-port-factor": {func(c *Config) { c.sourcePortFactor = math.NaN() }, func(c *Config) { c.sourcePortFactor = -1 },
		func(c *Config) { c.sourcePortFactor = 1_000_001 }},
	"reflection-ports": {func(c *Config) {
		c.reflectionPorts = nil
		for p := range maxReflectionPorts + 1 {
			c.reflectionPorts = append(c.reflectionPorts, uint16(p))
		}
	}},
	"capacity": {func(c *Config) { c.capacity = -5 }, func(c *Config) { c.capacity = math.NaN() },
		func(c *Config) { c.capacity = maxRate + 1 }, func(c *Config) { c.capacity = math.Inf(1) }},
	"zones": {func(c *Config) { c.zones = []string{"."} }, func(c *Config) { c.zones = []string{"bad\x01zone."} },
		func(c *Config) {
			c.zones = nil
			for i := range maxZones + 1 {
				c.zones = append(c.zones, fmt.Sprintf("z%d.test.", i))
			}
		}},
}

// rateFields are the rates' fields, whose bad values are the same for all.
var rateFields = map[string]func(c *Config) *float64{
	"responses-per-second":      func(c *Config) *float64 { return &c.responsesPerSecond },
	"nodata-per-second":         func(c *Config) *float64 { return &c.nodataPerSecond },
	"nxdomains-per-second":      func(c *Config) *float64 { return &c.nxdomainsPerSecond },
	"referrals-per-second":      func(c *Config) *float64 { return &c.referralsPerSecond },
	"errors-per-second":         func(c *Config) *float64 { return &c.errorsPerSecond },
	"requests-per-second":       func(c *Config) *float64 { return &c.requestsPerSecond },
	"all-per-second":            func(c *Config) *float64 { return &c.allPerSecond },
	"qps-scale":                 func(c *Config) *float64 { return &c.qpsScale },
	"total-requests-per-second": func(c *Config) *float64 { return &c.totalRequests },
}

// badValuesOf returns the out-of-range values of keyword k.
func badValuesOf(k keyword) []func(c *Config) {
	if f, ok := rateFields[k.name]; ok {
		var out []func(c *Config)
		for _, v := range []float64{-1, maxRate + 1, math.NaN(), math.Inf(1), math.Inf(-1)} {
			out = append(out, func(c *Config) { *f(c) = v })
		}
		return out
	}
	return badValues[k.name]
}

// configErrors returns the ConfigErrors joined in err.
func configErrors(err error) []*ConfigError {
	var out []*ConfigError
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var ce *ConfigError
		if errors.As(e, &ce) {
			out = append(out, ce)
		}
	}
	return out
}

// TestValidateEveryKeyword: for every keyword of the table with a range, a Config
// holding a value out of it makes New (and Update) fail with one ConfigError naming
// the keyword and quoting the value, and NewRRL put the default in its place, leaving
// the other keywords' values as they were.
func TestValidateEveryKeyword(t *testing.T) {
	for _, k := range keywords {
		bad := badValuesOf(k)
		if k.check == nil {
			if len(bad) > 0 {
				t.Errorf("%s: bad values in the test but no check in the table", k.name)
			}
			continue
		}
		if k.reset == nil {
			t.Errorf("%s: a check without a reset", k.name)
			continue
		}
		if len(bad) == 0 {
			t.Errorf("%s: a check but no bad values in the test", k.name)
		}
		for i, mutate := range bad {
			orig := configAfter(t, "responses-per-second", "5", "nodata-per-second", "3", "cookie-secret", siteSecret)
			c := orig.clone()
			mutate(c)
			printed, _ := k.get(c)
			_, err := New(c)
			ces := configErrors(err)
			if len(ces) != 1 || ces[0].Keyword != k.name || ces[0].Value != printed || ces[0].Line != 0 ||
				!strings.Contains(err.Error(), k.name) {
				t.Errorf("%s, bad value %d (%s): New error %v, want one ConfigError naming it", k.name, i, printed, err)
			}
			if err != nil {
				noSecret(t, "New's error", err.Error())
			}
			if _, err2 := NewRRL(nil).Update(c); err2 == nil || err2.Error() != err.Error() {
				t.Errorf("%s, bad value %d: Update error %v, want New's", k.name, i, err2)
			}

			r := NewRRL(c) // panics if the repaired Config is refused
			if act, _, _ := r.Debit(udp("192.0.2.1"), &www); act != Send {
				t.Errorf("%s, bad value %d: NewRRL's RRL: %v", k.name, i, act)
			}
			fixed := c.clone()
			fixed.repair()
			if err := validate(fixed); err != nil {
				t.Errorf("%s, bad value %d: repaired Config: %v", k.name, i, err)
			}
			// The keyword's value is the default's, the others' (and whether
			// Values shows the keyword: an allowance's set flag) as before.
			for _, kk := range keywords {
				got, gotOK := kk.get(fixed)
				want, wantOK := kk.get(orig)
				if kk.name == k.name {
					want = mustGet(NewConfig(), k)
				}
				if got != want || gotOK != wantOK {
					t.Errorf("%s, bad value %d: repaired %s %q (shown %v), want %q (%v)", k.name, i, kk.name, got, gotOK, want, wantOK)
				}
			}
		}
	}
}

// mustGet returns k's value in c, left out or not.
func mustGet(c *Config, k keyword) string {
	v, _ := k.get(c)
	return v
}

// TestNewRRLRepairAllowances: NewRRL resets an allowance out of range to 0 and keeps
// its set flag, as before the keyword table drove it: set, the category stays off;
// not set, it follows responses-per-second.
func TestNewRRLRepairAllowances(t *testing.T) {
	c := configAfter(t, "responses-per-second", "5", "nodata-per-second", "3")
	c.nodataPerSecond = math.NaN()
	c.nxdomainsPerSecond = -1 // not set
	c.responsesPerSecond = math.Inf(1)
	c.repair()
	if c.nodataPerSecond != 0 || !c.nodataSet || c.nxdomainsPerSecond != 0 || c.nxdomainsSet || c.responsesPerSecond != 0 {
		t.Errorf("repaired: %+v", c)
	}
	c.responsesPerSecond = 4
	if c.allowance(AllowanceNoData) != 0 || c.allowance(AllowanceNXDomain) != 4 {
		t.Errorf("allowances %v %v, want 0 4", c.allowance(AllowanceNoData), c.allowance(AllowanceNXDomain))
	}
	// The zero Config: the keywords whose zero is out of range are named, and
	// NewRRL gives them their defaults.
	_, err := New(&Config{})
	var names []string
	for _, ce := range configErrors(err) {
		names = append(names, ce.Keyword)
	}
	if want := []string{"window", "ipv4-prefix-length", "ipv6-prefix-length", "max-table-size", "events-per-second"}; !slices.Equal(names, want) {
		t.Errorf("New(&Config{}) names %v, want %v", names, want)
	}
	z := &Config{}
	z.repair()
	d := NewConfig()
	if z.window != d.window || z.ipv4PrefixLength != d.ipv4PrefixLength || z.ipv6PrefixLength != d.ipv6PrefixLength ||
		z.maxTableSize != d.maxTableSize || z.slipRatio != 0 || validate(z) != nil {
		t.Errorf("repaired zero Config: %+v", z)
	}
}

// TestKeywordTableAddition adds a keyword to the table, as a change of the package
// would (a second name for all-per-second, in BIND spelled bind-test-per-second), and
// checks that the entry is all it takes: SetValue, ConfigKeywords and Values know it,
// New names it when out of range and NewRRL repairs it, FormatBINDRateLimit writes
// it and ParseBINDRateLimit reads it under its BIND spelling.
func TestKeywordTableAddition(t *testing.T) {
	saved := keywords
	keywords = append(slices.Clip(keywords), rateKeyword("test-per-second",
		func(c *Config) (*float64, *bool) { return &c.allPerSecond, nil }, "bind-test-per-second"))
	defer func() { keywords = saved }()

	if !slices.Contains(ConfigKeywords(), "test-per-second") {
		t.Errorf("ConfigKeywords: %v", ConfigKeywords())
	}
	c := NewConfig()
	if err := c.SetValue("test-per-second", "9"); err != nil || c.allPerSecond != 9 {
		t.Fatalf("SetValue: %v, %v", err, c.allPerSecond)
	}
	if !slices.Contains(c.Values(), [2]string{"test-per-second", "9"}) {
		t.Errorf("Values: %v", c.Values())
	}
	text := FormatBINDRateLimit(c)
	if !strings.Contains(text, "\tbind-test-per-second 9;\n") {
		t.Errorf("FormatBINDRateLimit:\n%s", text)
	}
	got, err := ParseBINDRateLimit("bind-test-per-second 11;", nil)
	if err != nil || got.allPerSecond != 11 {
		t.Errorf("ParseBINDRateLimit: %v", err)
	}
	if _, err := ParseBINDRateLimit("test-per-second 11;", nil); err == nil {
		t.Error("ParseBINDRateLimit took the package's spelling of an option BIND spells otherwise")
	}
	c.allPerSecond = math.NaN()
	_, err = New(c)
	var named bool
	for _, ce := range configErrors(err) {
		named = named || ce.Keyword == "test-per-second"
	}
	if !named {
		t.Errorf("New: %v, want an error naming test-per-second", err)
	}
	c.repair()
	if c.allPerSecond != 0 || validate(c) != nil {
		t.Errorf("repaired: %v", c.allPerSecond)
	}
}

// mustSet sets keyword to value in cfg and fails the test if SetValue refuses it.
func mustSet(t testing.TB, cfg *Config, keyword, value string) {
	t.Helper()
	if err := cfg.SetValue(keyword, value); err != nil {
		t.Fatal(err)
	}
}
