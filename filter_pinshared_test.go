//go:build linux

package rrl

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// pinServeEnv makes the child of TestPinnedSharedCookieSecret serve: Protect with the
// pinned filter in its value's directory, the cookie-secret of pinSecretEnv (none
// when empty).
const (
	pinServeEnv  = "RRL_TEST_PIN_SERVE_DIR"
	pinSecretEnv = "RRL_TEST_PIN_SECRET"
)

// TestPinnedSharedCookieSecret: two processes attached to one pinned filter (in a
// private bpffs) with the same configured cookie-secret both give the kernel the
// secret their cookies are made with, so a resolver that learned its cookie from
// either one gets through a flood of its /24, judged by the kernel at its /32.
// Without a configured secret neither writes its random one into the shared
// filter, and both say so.
func TestPinnedSharedCookieSecret(t *testing.T) {
	if dir := os.Getenv(pinServeEnv); dir != "" {
		servePinned(t, dir, os.Getenv(pinSecretEnv))
		return
	}
	if testing.Short() {
		t.Skip("live flood")
	}
	env := newPinEnv(t)
	dir := filepath.Join(env.mnt, "rrl")
	if err := LoadPinned(rpsConfig(t, fmt.Sprint(goCookieRPS)), dir, -1, -1); err != nil {
		t.Fatal(err)
	}
	const name = "TestPinnedSharedCookieSecret"

	// Without a configured secret: no process writes one.
	for range 2 {
		_, stop := startServeChild(t, name, false, pinServeEnv+"="+dir, pinSecretEnv+"=")
		status := childLine(stop(), "status ")
		if !strings.Contains(status, "kernel filter: ebpf (pinned at") || strings.Contains(status, "server cookies verified in the kernel") ||
			!strings.Contains(status, "no cookie-secret is configured") {
			t.Errorf("without a configured secret: status %q", status)
		}
	}

	var addrs [2]netip.AddrPort
	var stops [2]func() []string
	for i := range addrs {
		addrs[i], stops[i] = startServeChild(t, name, false, pinServeEnv+"="+dir, pinSecretEnv+"="+siteSecret)
	}
	// Each resolver learns its cookie from its own server, the second server having
	// started after the first; both before the flood.
	const net24 = 80
	type resolver struct {
		c      *dns.Client
		server netip.AddrPort
		cookie []byte
	}
	var rs [2]*resolver
	for i := range rs {
		src := netip.AddrFrom4([4]byte{127, 33, net24, byte(201 + i)})
		rs[i] = &resolver{server: addrs[i], cookie: []byte("pinned-0")[:clientCookieLen],
			c: &dns.Client{Timeout: 400 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}}}
	}
	ask := func(r *resolver, id int) bool {
		q := new(dns.Msg)
		q.SetQuestion(fmt.Sprintf("q%d.example.test.", id), dns.TypeA)
		setCookie(q, r.cookie)
		m, _, err := r.c.Exchange(q, r.server.String())
		if err != nil || len(m.Answer) != 1 {
			return false
		}
		if c, ok := cookieFromMsg(m); ok && len(c) == cookieLen {
			r.cookie = c
		}
		return true
	}
	for i, r := range rs {
		if !ask(r, 0) || len(r.cookie) != cookieLen {
			t.Fatalf("resolver %d learned no server cookie", i)
		}
	}
	f, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	stopFloods := []func() int{socketFlood(t, addrs[0], net24), socketFlood(t, addrs[1], net24)}
	time.Sleep(500 * time.Millisecond)
	const queries = 40
	var answered [2]int
	for i := range queries {
		for j, r := range rs {
			if ask(r, 1+i) {
				answered[j]++
			}
		}
		time.Sleep(15 * time.Millisecond)
	}
	sent := stopFloods[0]() + stopFloods[1]()
	after, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for i, stop := range stops {
		if status := childLine(stop(), "status "); !strings.Contains(status, "server cookies verified in the kernel") {
			t.Errorf("server %d with the configured secret: status %q", i, status)
		}
	}
	passed, limited := after.CookiePassed-before.CookiePassed, sumLimited(after)-sumLimited(before)
	t.Logf("resolvers answered %v of %d each; flood %d sent, the kernel refused %d and passed %d on a cookie", answered, queries, sent, limited, passed)
	for i, n := range answered {
		if float64(n) < 0.97*queries {
			t.Errorf("resolver %d (cookie from server %d): %d of %d answered, want 97%%", i, i, n, queries)
		}
	}
	if passed < uint64(answered[0]+answered[1]) || float64(limited) < 0.5*float64(sent) {
		t.Errorf("the kernel passed %d on a cookie and refused %d of %d flood packets", passed, limited, sent)
	}
}

// servePinned is the child's side of TestPinnedSharedCookieSecret.
func servePinned(t *testing.T, dir, secret string) {
	cfg := NewConfig()
	if err := cfg.SetValue("cookie-secret", secret); err != nil {
		t.Fatal(err)
	}
	p, addr := startProtected(t, cfg, WithPinned(dir))
	fmt.Printf("serving %s\n", addr)
	var buf [1]byte
	for {
		if _, err := os.Stdin.Read(buf[:]); err != nil {
			break
		}
	}
	fmt.Printf("status %s\n", p.Status())
}
