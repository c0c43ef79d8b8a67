//go:build linux

package rrl

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const (
	siteSecret  = "0123456789abcdef0123456789abcdef"
	otherSecret = "fedcba9876543210fedcba9876543210"
)

// hexSecret decodes a secret of the tests.
func hexSecret(t testing.TB, s string) CookieSecret {
	t.Helper()
	var cs CookieSecret
	if n, err := hex.Decode(cs[:], []byte(s)); err != nil || n != len(cs) {
		t.Fatalf("secret %q: %v", s, err)
	}
	return cs
}

// noSecret fails t if text shows any part of either test secret.
func noSecret(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range []string{siteSecret, otherSecret, "zz" + siteSecret[2:]} {
		for i := 0; i+8 <= len(s); i += 8 {
			if strings.Contains(strings.ToLower(text), s[i:i+8]) {
				t.Errorf("%s shows the secret: %s", what, text)
				return
			}
		}
	}
}

// TestCookieSecretKeyword: cookie-secret takes one or two 128-bit secrets in hex;
// refusals leave the Config as it was, and no error, String, Values or fmt output of
// a Config shows a secret.
func TestCookieSecretKeyword(t *testing.T) {
	for _, tc := range []struct {
		value   string
		ok      bool
		current string
		prev    string // "" for none
	}{
		{siteSecret, true, siteSecret, ""},
		{"0x" + strings.ToUpper(siteSecret), true, siteSecret, ""},
		{siteSecret + " " + otherSecret, true, siteSecret, otherSecret},
		{siteSecret + "," + otherSecret, true, siteSecret, otherSecret},
		{"", true, "", ""},
		{siteSecret[:30], false, "", ""},
		{siteSecret + "00", false, "", ""},
		{"zz" + siteSecret[2:], false, "", ""},
		{siteSecret + " " + otherSecret + " " + siteSecret, false, "", ""},
	} {
		t.Run(fmt.Sprintf("%.12q", tc.value), func(t *testing.T) {
			cfg := NewConfig()
			if err := cfg.SetValue("cookie-secret", otherSecret); err != nil {
				t.Fatal(err)
			}
			err := cfg.SetValue("cookie-secret", tc.value)
			if (err == nil) != tc.ok {
				t.Fatalf("SetValue: %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				noSecret(t, "the error", err.Error())
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Keyword != "cookie-secret" || ce.Value != redacted {
					t.Errorf("error %#v: want a ConfigError with the value redacted", err)
				}
				if cs := cfg.secrets; cs == nil || cs.current != hexSecret(t, otherSecret) || cs.previous != nil {
					t.Errorf("a refused value changed the secrets")
				}
				return
			}
			switch cs := cfg.secrets; {
			case tc.current == "":
				if cs != nil {
					t.Errorf("\"\" left secrets configured")
				}
			case cs == nil || cs.current != hexSecret(t, tc.current):
				t.Errorf("current secret not set")
			case tc.prev == "" && cs.previous != nil, tc.prev != "" && (cs.previous == nil || *cs.previous != hexSecret(t, tc.prev)):
				t.Errorf("accepted secret %v, want %q", cs.previous, tc.prev)
			}
			for what, text := range map[string]string{
				"String": cfg.String(), "Values": fmt.Sprint(cfg.Values()),
				"%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", *cfg), "config text": configText(cfg),
			} {
				noSecret(t, what, text)
			}
			if tc.current != "" && !strings.Contains(cfg.String(), `cookie-secret="[redacted]"`) {
				t.Errorf("String %q does not show the secret redacted", cfg)
			}
			if strings.Contains(configText(cfg), "cookie-secret") {
				t.Errorf("a pinned filter's config text names the secret: %q", configText(cfg))
			}
		})
	}
	// A clone does not share the secrets.
	a := NewConfig()
	a.SetValue("cookie-secret", siteSecret+" "+otherSecret)
	b := a.clone()
	*b.secrets.previous = CookieSecret{}
	if *a.secrets.previous != hexSecret(t, otherSecret) {
		t.Error("a clone shares the accepted secret")
	}
}

// TestBINDCookieSecret: the BIND clause takes cookie-secret once, or twice for an
// accepted second secret, and its errors never quote a secret.
func TestBINDCookieSecret(t *testing.T) {
	cfg, err := ParseBINDRateLimit(fmt.Sprintf(`rate-limit { responses-per-second 5; cookie-secret "%s"; cookie-secret "%s"; };`, siteSecret, otherSecret), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cs := cfg.secrets; cs == nil || cs.current != hexSecret(t, siteSecret) || cs.previous == nil || *cs.previous != hexSecret(t, otherSecret) {
		t.Fatalf("secrets %+v", cfg.secrets)
	}
	for _, text := range []string{
		`cookie-secret "zz` + siteSecret[2:] + `";`,
		`cookie-secret "` + siteSecret + `" "` + otherSecret + `";`,
		`cookie-secret "` + siteSecret + `"`,
		`cookie-secret "` + siteSecret + `"; cookie-secret "` + otherSecret + `"; cookie-secret "` + siteSecret + `";`,
		`cookie-secret ;`,
	} {
		_, err := ParseBINDRateLimit(text, nil)
		var be *ConfigError
		if !errors.As(err, &be) || be.Line < 1 {
			t.Errorf("%.30q: error %v, want a ConfigError with its line", text, err)
			continue
		}
		noSecret(t, "the error", err.Error())
		noSecret(t, "the error's fields", fmt.Sprintf("%+v", *be))
	}
}

// TestProtectCookieSecret: a Protection makes its cookies with the configured secret
// and accepts the second; Update with another cookie-secret rotates both the Handler's
// and, through UseCookies, the kernel's.
func TestProtectCookieSecret(t *testing.T) {
	cfg := NewConfig()
	if err := cfg.SetValue("cookie-secret", siteSecret+" "+otherSecret); err != nil {
		t.Fatal(err)
	}
	p, err := NewProtection(answerA, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client, now := netip.MustParseAddr("192.0.2.1"), time.Now()
	site, other := NewCookies(hexSecret(t, siteSecret)), NewCookies(hexSecret(t, otherSecret))
	cc := []byte("clientck")
	if got := p.Cookies().Verify(site.Generate(cc, client, now), client, now); got != CookieValid {
		t.Errorf("a cookie of the site's secret: %v", got)
	}
	if got := p.Cookies().Verify(other.Generate(cc, client, now), client, now); got != CookieValidReissue {
		t.Errorf("a cookie of the accepted secret: %v", got)
	}
	if got := site.Verify(p.Cookies().Generate(cc, client, now), client, now); got != CookieValid {
		t.Errorf("the Protection's cookie under the site's secret: %v", got)
	}
	next := cfg.clone()
	next.SetValue("cookie-secret", otherSecret)
	if _, err := p.Update(next); err != nil {
		t.Fatal(err)
	}
	if got := p.Cookies().Verify(site.Generate(cc, client, now), client, now); got != CookieBad {
		t.Errorf("after Update to the other secret alone, a cookie of the first: %v", got)
	}
	if got := other.Verify(p.Cookies().Generate(cc, client, now), client, now); got != CookieValid {
		t.Errorf("after Update, the Protection's cookie under the new secret: %v", got)
	}
	// An Update without cookie-secret leaves the secrets as they are.
	if _, err := p.Update(NewConfig()); err != nil {
		t.Fatal(err)
	}
	if got := other.Verify(p.Cookies().Generate(cc, client, now), client, now); got != CookieValid {
		t.Errorf("after an Update without cookie-secret: %v", got)
	}
}
