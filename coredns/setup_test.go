package coredns

import (
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/dnsrake/rrl"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		input  string
		keys   []string          // server block keys
		want   map[string]string // keyword: value in the resulting Config
		zones  []string
		kernel bool
		cookie bool
	}{
		{
			name:  "coredns/rrl defaults",
			input: "rrl",
			keys:  []string{"example.org."},
			want: map[string]string{
				"window": "15", "ipv4-prefix-length": "24", "ipv6-prefix-length": "56",
				"responses-per-second": "0", "requests-per-second": "0", "slip-ratio": "0",
				"max-table-size": "100000", "report-only": "false",
			},
			zones: []string{"example.org."}, kernel: true, cookie: true,
		},
		{
			name:  "README example",
			input: "rrl . {\n responses-per-second 10\n}",
			keys:  []string{"."},
			want:  map[string]string{"responses-per-second": "10", "slip-ratio": "0"},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "zones restrict",
			input: "rrl example.org example.net",
			keys:  []string{"."},
			zones: []string{"example.org.", "example.net."}, kernel: true, cookie: true,
		},
		{
			name: "every coredns/rrl directive",
			input: `rrl {
				window 10
				ipv4-prefix-length 16
				ipv6-prefix-length 48
				responses-per-second 5
				nodata-per-second 4
				nxdomains-per-second 3
				referrals-per-second 2
				errors-per-second 1.5
				slip-ratio 2
				requests-per-second 100
				max-table-size 5000
				report-only
			}`,
			keys: []string{"."},
			want: map[string]string{
				"window": "10", "ipv4-prefix-length": "16", "ipv6-prefix-length": "48",
				"responses-per-second": "5", "nodata-per-second": "4", "nxdomains-per-second": "3",
				"referrals-per-second": "2", "errors-per-second": "1.5", "slip-ratio": "2",
				"requests-per-second": "100", "max-table-size": "5000", "report-only": "true",
			},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "fractional window rounds up",
			input: "rrl {\n window 2.5\n}",
			keys:  []string{"."},
			want:  map[string]string{"window": "3"},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "max-table-size 0 is the default",
			input: "rrl {\n max-table-size 0\n}",
			keys:  []string{"."},
			want:  map[string]string{"max-table-size": "100000"},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name: "library keywords",
			input: `rrl {
				exempt-clients 192.0.2.0/24 2001:db8::/32
				all-per-second 20
				qps-scale 1000
				ipv4-request-levels 32:1 16:8
				ipv6-request-levels 128:1 48:2
				source-port-factor 0
				total-requests-per-second 5000
				reflection-ports 0 123 11211
				report-only false
			}`,
			keys: []string{"."},
			want: map[string]string{
				"exempt-clients": "192.0.2.0/24 2001:db8::/32", "all-per-second": "20",
				"qps-scale": "1000", "ipv4-request-levels": "32:1 16:8",
				"ipv6-request-levels": "128:1 48:2", "source-port-factor": "0",
				"total-requests-per-second": "5000", "reflection-ports": "0 123 11211",
				"report-only": "false",
			},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "kernel filter off",
			input: "rrl {\n kernel-filter off\n}",
			keys:  []string{"."},
			zones: []string{"."}, kernel: false, cookie: true,
		},
		{
			name:  "cookies off",
			input: "rrl {\n cookies off\n}",
			keys:  []string{"."},
			zones: []string{"."}, kernel: true, cookie: false,
		},
		{
			name:  "the last cookies line counts",
			input: "rrl {\n cookies off\n cookies\n}",
			keys:  []string{"."},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "cookies with a generated secret",
			input: "rrl {\n cookies\n}",
			keys:  []string{"."},
			zones: []string{"."}, kernel: true, cookie: true,
		},
		{
			name:  "cookies with a secret and a previous one",
			input: "rrl {\n cookies 000102030405060708090a0b0c0d0e0f f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff\n}",
			keys:  []string{"."},
			zones: []string{"."}, kernel: true, cookie: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := caddy.NewTestController("dns", tc.input)
			c.ServerBlockKeys = tc.keys
			s, err := parse(c)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			got := values(s.cfg)
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			if strings.Join(s.zones, " ") != strings.Join(tc.zones, " ") {
				t.Errorf("zones %v, want %v", s.zones, tc.zones)
			}
			if s.kernel != tc.kernel {
				t.Errorf("kernel %v, want %v", s.kernel, tc.kernel)
			}
			if s.cookies != tc.cookie {
				t.Errorf("cookies %v, want %v", s.cookies, tc.cookie)
			}
		})
	}
}

func TestParseCookieSecrets(t *testing.T) {
	c := caddy.NewTestController("dns", "rrl {\n cookies 000102030405060708090a0b0c0d0e0f f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff\n}")
	s, err := parse(c)
	if err != nil {
		t.Fatal(err)
	}
	sec := s.cookieSecret()
	if sec[0] != 0x00 || sec[15] != 0x0f || s.prev == nil || s.prev[0] != 0xf0 || s.prev[15] != 0xff {
		t.Errorf("secrets %x %x", sec, s.prev)
	}
	// Without a SECRET (cookies unmentioned, or "cookies" alone) every block of
	// every load in the process uses the process's generated secret: random, and
	// the same after a reload, so that clients' cookies stay valid.
	var got []rrl.CookieSecret
	for _, in := range []string{"rrl", "rrl {\n cookies\n}", "rrl {\n responses-per-second 5\n}"} {
		s, err := parse(caddy.NewTestController("dns", in))
		if err != nil {
			t.Fatal(err)
		}
		if !s.cookies || s.secret != nil || s.prev != nil {
			t.Errorf("%q: cookies %v, secret %v, previous %v; want on with the generated secret", in, s.cookies, s.secret != nil, s.prev != nil)
		}
		got = append(got, s.cookieSecret())
	}
	if got[0] == (rrl.CookieSecret{}) || got[0] != got[1] || got[1] != got[2] {
		t.Errorf("generated secrets %x: want one random secret", got)
	}
	if got[0] == sec {
		t.Error("the generated secret is the configured one")
	}
}

func TestParseCookieSecretNotShown(t *testing.T) {
	// A malformed secret is refused without any of it in the error: the error is
	// logged at start and at every reload.
	const secret = "00112233445566778899aabbccddeeff"
	for _, tc := range []struct{ name, args string }{
		{"too short", secret[:30]},
		{"too long", secret + "00"},
		{"not hexadecimal", "zz" + secret[2:]},
		{"bad previous", secret + " q" + secret[1:]},
		{"three secrets", secret + " " + secret + " f" + secret[1:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(caddy.NewTestController("dns", "rrl {\n cookies "+tc.args+"\n}"))
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, "Testfile:2") {
				t.Errorf("error %q does not name the line", msg)
			}
			// No run of 4 or more characters of any argument appears in it.
			for _, arg := range strings.Fields(tc.args) {
				for i := 0; i+4 <= len(arg); i++ {
					if strings.Contains(msg, arg[i:i+4]) {
						t.Fatalf("error %q contains %q of the secret", msg, arg[i:i+4])
					}
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	// What coredns/rrl refuses is refused, and so are bad values of this plugin's
	// own keywords; the error names the line.
	for _, tc := range []struct {
		input string
		want  string // in the error
	}{
		{"rrl {\n bogus 1\n}", "Testfile:2 - Error during parsing: unknown property 'bogus'"},
		{"rrl {\n window\n}", "Testfile:2 - Error during parsing: Wrong argument count"},
		{"rrl {\n window 0\n}", "Testfile:2"},
		{"rrl {\n window -1\n}", "must be greater than zero"},
		{"rrl {\n window x\n}", "not a number"},
		{"rrl {\n window 5000\n}", "at most 3600"},
		{"rrl {\n ipv4-prefix-length 0\n}", "must be between 1 and 32"},
		{"rrl {\n ipv4-prefix-length 33\n}", "must be between 1 and 32"},
		{"rrl {\n ipv6-prefix-length 129\n}", "must be between 1 and 128"},
		{"rrl {\n responses-per-second -1\n}", "Testfile:2"},
		{"rrl {\n responses-per-second ten\n}", "not a number"},
		{"rrl {\n responses-per-second 1 2\n}", "Wrong argument count"},
		{"rrl {\n nodata-per-second -1\n}", "Testfile:2"},
		{"rrl {\n nxdomains-per-second -1\n}", "Testfile:2"},
		{"rrl {\n referrals-per-second -1\n}", "Testfile:2"},
		{"rrl {\n errors-per-second -1\n}", "Testfile:2"},
		{"rrl {\n requests-per-second -1\n}", "Testfile:2"},
		{"rrl {\n slip-ratio 11\n}", "must be between 0 and 10"},
		{"rrl {\n slip-ratio -1\n}", "must be between 0 and 10"},
		{"rrl {\n max-table-size -5\n}", "cannot be negative"},
		{"rrl {\n max-table-size x\n}", "not an integer"},
		{"rrl {\n report-only yes please\n}", "Wrong argument count"},
		{"rrl {\n report-only maybe\n}", "want true or false"},
		{"rrl {\n exempt-clients\n}", "Wrong argument count"},
		{"rrl {\n exempt-clients 300.1.1.1\n}", "is not an address or prefix"},
		{"rrl {\n ipv4-request-levels 40:1\n}", "Testfile:2"},
		{"rrl {\n reflection-ports 70000\n}", "Testfile:2"},
		{"rrl {\n kernel-filter maybe\n}", "want on or off"},
		{"rrl {\n kernel-filter\n}", "Wrong argument count"},
		{"rrl {\n cookies 00\n}", "32 hexadecimal digits"},
		{"rrl {\n cookies zz0102030405060708090a0b0c0d0e0f\n}", "32 hexadecimal digits"},
		{"rrl {\n cookies a b c\n}", "Wrong argument count"},
		{"rrl {\n cookies off 000102030405060708090a0b0c0d0e0f\n}", "SECRET is not 32 hexadecimal digits"},
		{"rrl {\n responses-per-second 5\n\n\n nope\n}", "Testfile:5"},
		{"rrl\nrrl", "this plugin can only be used once per Server Block"},
	} {
		c := caddy.NewTestController("dns", tc.input)
		_, err := parse(c)
		if err == nil {
			t.Errorf("%q: no error, want %q", tc.input, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q, want it to contain %q", tc.input, err, tc.want)
		}
	}
}

func TestParseEveryLibraryKeyword(t *testing.T) {
	// Every keyword of rrl.Config is a property, taking the value SetValue takes.
	for _, kw := range rrl.ConfigKeywords() {
		value := rrl.NewConfig()
		var v string
		for _, kv := range value.Values() {
			if kv[0] == kw {
				v = kv[1]
			}
		}
		switch {
		case kw == "exempt-clients":
			v = "192.0.2.1" // empty by default
		case kw == "cookie-secret":
			v = "000102030405060708090a0b0c0d0e0f" // none by default
		case v == "":
			v = "1" // the category allowances are unset by default
		}
		c := caddy.NewTestController("dns", "rrl {\n "+kw+" "+v+"\n}")
		if _, err := parse(c); err != nil {
			t.Errorf("%s %s: %v", kw, v, err)
		}
	}
}

func TestListenerAddr(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"dns://:53", "[::]:53", ""},
		{"dns://127.0.0.1:1053", "127.0.0.1:1053", ""},
		{"dns://[::1]:53", "[::1]:53", ""},
		{"dns://[::ffff:127.0.0.1]:53", "127.0.0.1:53", ""},
		{"tls://:853", "", "no plain UDP socket"},
		{"dns://127.0.0.1", "", "has no port"},
		{"dns://nohost:53", "", "nohost"},
	} {
		got, err := listenerAddr(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("%s: %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestDirectives(t *testing.T) {
	d := []string{"metadata", "prometheus", "errors", "log", "dnstap", "local", "cache", "file"}
	got := Directives(d)
	if strings.Join(got, " ") != "metadata prometheus errors log dnstap rrl local cache file" {
		t.Errorf("Directives: %v", got)
	}
	if strings.Join(d, " ") != "metadata prometheus errors log dnstap local cache file" {
		t.Errorf("Directives changed its argument: %v", d)
	}
	if got := Directives(got); strings.Count(strings.Join(got, " "), "rrl") != 1 {
		t.Errorf("Directives twice: %v", got)
	}
	if got := Directives([]string{"file"}); strings.Join(got, " ") != "rrl file" {
		t.Errorf("Directives without dnstap: %v", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"window 2.5", "responses-per-second 5\nslip-ratio 2", "report-only", "cookies",
		"exempt-clients 192.0.2.0/24 ::1", "ipv4-request-levels 32:1 16:16", "kernel-filter off",
		"window NaN", "responses-per-second 1e400", "max-table-size -0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		c := caddy.NewTestController("dns", "rrl {\n"+body+"\n}")
		s, err := parse(c)
		if err != nil {
			return
		}
		// What parses builds a plugin.
		p := newPlugin(s)
		if err := p.start(); err != nil {
			t.Fatalf("%q parsed but the plugin did not start: %v", body, err)
		}
		p.close()
	})
}

func TestDisagreement(t *testing.T) {
	// What two server blocks on one address must agree on: the kernel filter's
	// settings, and the cookies whatever the filter; with the filter off in both,
	// the request limits are per block. Secrets are never shown.
	const s1, s2 = "000102030405060708090a0b0c0d0e0f", "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
	for _, tc := range []struct{ a, b, want string }{
		{"", "", ""},
		{"requests-per-second 100", "requests-per-second 100\n responses-per-second 5\n slip-ratio 2", ""},
		{"requests-per-second 100", "requests-per-second 50", `requests-per-second ("100" and "50")`},
		{"requests-per-second 100\n kernel-filter off", "requests-per-second 50\n kernel-filter off", ""},
		{"requests-per-second 100", "requests-per-second 100\n kernel-filter off", "kernel-filter (on and off)"},
		{"ipv4-prefix-length 24", "ipv4-prefix-length 16", `ipv4-prefix-length ("24" and "16")`},
		{"ipv4-request-levels 32:1", "ipv4-request-levels 32:2", "ipv4-request-levels"},
		{"source-port-factor 2", "", "source-port-factor"},
		{"total-requests-per-second 1000", "", "total-requests-per-second"},
		{"reflection-ports 0 123", "", "reflection-ports"},
		{"exempt-clients 192.0.2.1", "", "exempt-clients"},
		{"report-only", "", "report-only"},
		{"capacity auto", "", "capacity"},
		{"capacity 300", "capacity 300", ""},
		{"capacity auto\n names off", "capacity auto", "names"},
		{"capacity auto\n names off\n kernel-filter off", "capacity auto\n kernel-filter off", ""},
		{"capacity auto\n zones a.test.", "capacity auto\n zones b.test.", ""},
		{"cookies off", "", "cookies (off and on)"},
		{"cookies off", "cookies off", ""},
		{"cookies", "", ""},
		{"cookies " + s1, "cookies " + s1, ""},
		{"cookies " + s1, "", "the cookie secrets (not shown)"},
		{"cookies " + s1, "cookies " + s2, "the cookie secrets (not shown)"},
		{"cookies " + s1 + " " + s2, "cookies " + s1, "the cookie secrets (not shown)"},
		{"cookies " + s1 + "\n kernel-filter off", "cookies " + s2 + "\n kernel-filter off", "the cookie secrets (not shown)"},
	} {
		a, err := parse(caddy.NewTestController("dns", "rrl {\n"+tc.a+"\n}"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := parse(caddy.NewTestController("dns", "rrl {\n"+tc.b+"\n}"))
		if err != nil {
			t.Fatal(err)
		}
		got := disagreement(a, b)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%q / %q: disagreement %q, want %q", tc.a, tc.b, got, tc.want)
		}
		if strings.Contains(got, s1[:6]) || strings.Contains(got, s2[:6]) {
			t.Errorf("%q / %q: disagreement %q shows a secret", tc.a, tc.b, got)
		}
	}
}

func TestParseCookieSecretProperty(t *testing.T) {
	// cookie-secret is the cookies property's SECRET [PREVIOUS]; its errors never
	// quote the value.
	const sec, prev = "000102030405060708090a0b0c0d0e0f", "0x101112131415161718191a1b1c1d1e1f"
	s, err := parse(caddy.NewTestController("dns", "rrl {\n cookie-secret "+sec+" "+prev+"\n}"))
	if err != nil {
		t.Fatal(err)
	}
	if !s.cookies || s.secret == nil || s.prev == nil || s.secret[1] != 1 || s.prev[0] != 0x10 {
		t.Errorf("cookie-secret %s %s: cookies %v, secret %v, previous %v", sec, prev, s.cookies, s.secret, s.prev)
	}
	for _, bad := range []string{"00010203040506070809zz0b0c0d0e0f", "0001020304050607", sec + " " + sec + " " + sec} {
		_, err := parse(caddy.NewTestController("dns", "rrl {\n cookie-secret "+bad+"\n}"))
		if err == nil {
			t.Errorf("cookie-secret %s: accepted", bad)
			continue
		}
		for _, f := range strings.Fields(bad) {
			if strings.Contains(err.Error(), f[:8]) {
				t.Errorf("cookie-secret %s: error %q quotes the secret", bad, err)
			}
		}
	}
}
