package rrl

import (
	"encoding/hex"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestPinnedCookieSecretsRecorded: whoever writes a pinned filter's secrets (a
// server's UseCookies, its rotations, Update with a cookie-secret) records how many
// the kernel holds, and every process's Stats reports it, through writes of the
// settings by processes that know nothing of them; the secrets are never shown.
func TestPinnedCookieSecretsRecorded(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "100", -1, -1)
	other, err := OpenPinned(dir) // another process, say rrlctl stats
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	secrets := func() int {
		t.Helper()
		st, err := other.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.CookieSecrets
	}
	if n := secrets(); n != 0 {
		t.Fatalf("fresh pins: %d secrets", n)
	}
	_, f := attachPinnedServer(t, dir)
	c := NewCookies(CookieSecret{1})
	for _, s := range []struct {
		what string
		do   func() error
		want int
	}{
		{"UseCookies", func() error { return f.UseCookies(c) }, 1},
		{"Rotate", func() error { c.Rotate(CookieSecret{2}); return nil }, 2},
		{"an Update of another process", func() error { return other.Update(other.Config()) }, 2},
		{"ClearPrevious", func() error { c.ClearPrevious(); return nil }, 1},
		{"UseCookies(nil)", func() error { return f.UseCookies(nil) }, 0},
		{"Update with a cookie-secret", func() error {
			cfg := other.Config()
			if err := cfg.SetValue("cookie-secret", hex.EncodeToString([]byte("0123456789abcdef"))); err != nil {
				return err
			}
			return other.Update(cfg)
		}, 1},
		{"an Update of a process following a Cookies", func() error { return f.Update(f.Config()) }, 1},
	} {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if n := secrets(); n != s.want {
			t.Errorf("after %s: Stats reports %d secrets, want %d", s.what, n, s.want)
		}
	}
	if cfg := other.Config(); strings.Contains(cfg.String(), "cookie-secret") {
		t.Errorf("the pins' Config holds a cookie secret: %s", cfg)
	}

	// A filter that follows a Cookies takes its secrets from it only.
	if err := f.UseCookies(c); err != nil {
		t.Fatal(err)
	}
	cfg := f.Config()
	cfg.SetValue("cookie-secret", strings.Repeat("ab", 16))
	if err := f.Update(cfg); !errors.Is(err, ErrNotSupported) || strings.Contains(err.Error(), "abab") {
		t.Errorf("Update with a cookie-secret of a filter following a Cookies: %v", err)
	}
}

// TestMisspeltSecretKeywordRedacted: an unknown keyword whose value is a cookie
// secret does not quote it.
func TestMisspeltSecretKeywordRedacted(t *testing.T) {
	secret := strings.Repeat("0f", 16)
	for _, v := range []string{secret, "0x" + secret, secret + " " + secret} {
		err := NewConfig().SetValue("cookie-secrets", v)
		if err == nil || strings.Contains(err.Error(), "0f0f") || !strings.Contains(err.Error(), "unknown keyword") {
			t.Errorf("SetValue(cookie-secrets, %d characters): %v", len(v), err)
		}
	}
	if err := NewConfig().SetValue("windows", "30"); err == nil || !strings.Contains(err.Error(), `"30"`) {
		t.Errorf("an unknown keyword's other values are quoted as before: %v", err)
	}
}
