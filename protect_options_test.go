//go:build linux

package rrl

import (
	"errors"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// exchangeCookie sends one query with a client cookie to addr and returns the answer.
func exchangeCookie(t *testing.T, addr netip.AddrPort) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	opt := q.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(q, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestProtectCookieOptions: WithCookies shares a Cookies (its secret makes the
// answer's server cookie, and the kernel filter verifies with it), withClock
// passes options to the Handler (its clock stamps the cookie), and
// WithoutCookies leaves cookies out.
func TestProtectCookieOptions(t *testing.T) {
	requireBPF(t)
	c := NewCookies(CookieSecret{1, 2, 3})
	stamp := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p, addr := startProtected(t, nil, WithCookies(c), withClock(func() time.Time { return stamp }))
	if p.Cookies() != c || !p.Status().KernelCookies {
		t.Fatalf("Cookies %p (want %p), status %v", p.Cookies(), c, p.Status())
	}
	cookie, ok := cookieFromMsg(exchangeCookie(t, addr))
	if !ok {
		t.Fatal("no cookie in the answer")
	}
	client := netip.MustParseAddr("127.0.0.1")
	if got := c.Verify(cookie, client, stamp); !got.Valid() {
		t.Errorf("the answer's cookie verified at the Handler's clock: %v, want valid", got)
	}
	if got := c.Verify(cookie, client, stamp.Add(2*time.Hour)); got.Valid() {
		t.Errorf("the answer's cookie two hours after the Handler's clock: %v, want not valid", got)
	}

	q, addr2 := startProtected(t, nil, WithoutCookies())
	if q.Cookies() != nil || q.Status().KernelCookies {
		t.Fatalf("without cookies: Cookies %v, status %v", q.Cookies(), q.Status())
	}
	if cookie, ok := cookieFromMsg(exchangeCookie(t, addr2)); ok && len(cookie) > clientCookieLen {
		t.Errorf("without cookies the answer carries a server cookie: %x", cookie)
	}
}

// TestProtectPinned: WithPinned attaches the pins a privileged step loaded, so the
// process shares their limits; pins that cannot be opened leave a filter of the
// process's own, and Status says why.
func TestProtectPinned(t *testing.T) {
	env := newPinEnv(t)
	dir := filepath.Join(env.mnt, "rrl")
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "77")
	if err := LoadPinned(cfg, dir, -1, -1); err != nil {
		t.Fatal(err)
	}
	p, _ := startProtected(t, nil, WithPinned(dir))
	st := p.Status()
	if st.Filter != ModeEBPF || st.Pinned != dir || st.Reason != nil || p.Filter().pinPath() != dir {
		t.Fatalf("status %v, filter pinned at %q: want the pins of %s", st, p.Filter().pinPath(), dir)
	}
	if !strings.Contains(p.Filter().Config().String(), `requests-per-second="77"`) {
		t.Errorf("the pinned filter runs %v, want the pins' requests-per-second 77", p.Filter().Config())
	}

	missing := filepath.Join(env.mnt, "none")
	q, _ := startProtected(t, nil, WithPinned(missing))
	st = q.Status()
	if st.Filter != ModeEBPF || st.Pinned != "" || !errors.Is(st.Reason, fs.ErrNotExist) || q.Filter().pinPath() != "" {
		t.Fatalf("missing pins: status %v", st)
	}
	if !strings.Contains(st.String(), "pinned filter not attached") {
		t.Errorf("status line %q does not say the pins were not attached", st)
	}
}
