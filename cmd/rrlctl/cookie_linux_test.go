package main

import (
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// testSecret returns a cookie secret with every byte b, and its hex spelling.
func testSecret(b byte) (rrl.CookieSecret, string) {
	var s rrl.CookieSecret
	for i := range s {
		s[i] = b + byte(i)
	}
	return s, hex.EncodeToString(s[:])
}

// cookieClient sends queries carrying a server cookie to a server on loopback from
// a socket of its own, whose address the cookies are made for.
type cookieClient struct {
	conn *net.UDPConn
	src  netip.Addr
	id   uint16
}

func newCookieClient(t *testing.T, server netip.AddrPort) *cookieClient {
	t.Helper()
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(server))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &cookieClient{conn: conn, src: conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr()}
}

// send sends one query with a server cookie made with secret for the client's
// address now.
func (c *cookieClient) send(t *testing.T, secret rrl.CookieSecret) {
	t.Helper()
	c.id++
	m := new(dns.Msg)
	m.SetQuestion("example.", dns.TypeA)
	m.Id = c.id
	client := []byte{1, 2, 3, 4, 5, 6, 7, byte(c.id)}
	full := rrl.NewCookies(secret).Generate(client, c.src, time.Now())
	m.SetEdns0(1232, false)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: hex.EncodeToString(full)})
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

// cookieVerdict sends a query with a cookie made with secret and returns which
// counter it moved: "passed" (proven), "invalid", or "none" (the kernel looked at
// no cookie: it holds no secret).
func cookieVerdict(t *testing.T, pin string, c *cookieClient, secret rrl.CookieSecret) string {
	t.Helper()
	before := statsOf(t, pin).Counters
	c.send(t, secret)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		now := statsOf(t, pin).Counters
		if now["seen"] == before["seen"] {
			continue
		}
		switch {
		case now["cookie_passed"] == before["cookie_passed"]+1 && now["cookie_invalid"] == before["cookie_invalid"]:
			return "passed"
		case now["cookie_invalid"] == before["cookie_invalid"]+1 && now["cookie_passed"] == before["cookie_passed"]:
			return "invalid"
		case now["cookie_invalid"] == before["cookie_invalid"] && now["cookie_passed"] == before["cookie_passed"]:
			return "none"
		}
		t.Fatalf("counters moved oddly: %v, then %v", before, now)
	}
	t.Fatalf("the query never reached the filter")
	return ""
}

// TestCookieSecretReachesKernel: the cookie-secret of load, set and attach reaches
// the kernel of a pinned filter, which then proves queries from a real socket
// carrying a cookie made with it; a new secret keeps the one it replaces accepted;
// stats says whether cookies are verified and with how many secrets; no output
// shows a secret.
func TestCookieSecretReachesKernel(t *testing.T) {
	root := bpffs(t)
	if err := os.Chmod(filepath.Dir(root), 0o755); err != nil { // for uid 65534
		t.Fatal(err)
	}
	pin := filepath.Join(root, "rrl")
	s1, h1 := testSecret(0x10)
	s2, h2 := testSecret(0x20)
	s3, h3 := testSecret(0x30)
	s4, h4 := testSecret(0x40)
	var outputs strings.Builder
	run := func(t *testing.T, want int, args ...string) string {
		t.Helper()
		code, out, errOut := rrlctl(args...)
		outputs.WriteString(out + errOut)
		if code != want {
			t.Fatalf("rrlctl %s: exit %d, want %d:\n%s%s", redactSecrets(args), code, want, out, errOut)
		}
		return out + errOut
	}
	out := run(t, exitOK, "load", "-pin", pin, "-group", "65534", "-requests-per-second", "100", "-cookie-secret", h1)
	if !strings.Contains(out, "verified in the kernel") {
		t.Errorf("load -cookie-secret says nothing of the cookies:\n%s", out)
	}
	server, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	f, err := rrl.AttachPinned(server, pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := newCookieClient(t, server.LocalAddr().(*net.UDPAddr).AddrPort())

	type step struct {
		secrets int
		verdict map[rrl.CookieSecret]string
	}
	check := func(t *testing.T, what string, want step) {
		t.Helper()
		if got := statsOf(t, pin).CookieSecrets; got != want.secrets {
			t.Errorf("%s: stats -json cookie_secrets %d, want %d", what, got, want.secrets)
		}
		text := run(t, exitOK, "stats", "-pin", pin)
		if verified := strings.Contains(text, "server cookies: verified in the kernel"); verified != (want.secrets > 0) {
			t.Errorf("%s: stats says:\n%s", what, text)
		}
		for _, s := range []rrl.CookieSecret{s1, s2, s3, s4} {
			w, ok := want.verdict[s]
			if !ok {
				continue
			}
			if got := cookieVerdict(t, pin, c, s); got != w {
				t.Errorf("%s: a cookie made with secret %#x… is %s, want %s", what, s[0], got, w)
			}
		}
	}
	check(t, "after load", step{1, map[rrl.CookieSecret]string{s1: "passed", s2: "invalid"}})

	out = run(t, exitOK, "set", "-pin", pin, "cookie-secret", h2)
	if !strings.Contains(out, "cookie-secret [redacted]") {
		t.Errorf("set cookie-secret printed:\n%s", out)
	}
	check(t, "after a new secret", step{2, map[rrl.CookieSecret]string{s2: "passed", s1: "passed", s3: "invalid"}})

	run(t, exitOK, "set", "-pin", pin, "cookie-secret", h2)
	check(t, "after the secret in force alone again", step{1, map[rrl.CookieSecret]string{s2: "passed", s1: "invalid"}})

	run(t, exitOK, "set", "-pin", pin, "cookie-secret", h3+" "+h1, "requests-per-second", "40")
	check(t, "after two secrets", step{2, map[rrl.CookieSecret]string{s3: "passed", s1: "passed", s2: "invalid"}})
	cfg := run(t, exitOK, "config", "-pin", pin)
	if !strings.Contains(cfg, `"[redacted]"`) || !strings.Contains(cfg, `"40"`) {
		t.Errorf("config:\n%s", cfg)
	}
	// Updates that name no secret leave it in force (and recorded for stats).
	run(t, exitOK, "set", "-pin", pin, "requests-per-second", "50")
	check(t, "after an update without a secret", step{2, map[rrl.CookieSecret]string{s3: "passed"}})

	// A member of the pins' group may write the secrets but not read them: naming
	// one new secret, which would keep the one in force, is refused; naming both
	// works.
	bin := buildTool(t, "github.com/dnsrake/rrl/cmd/rrlctl", "rrlctl")
	asNobody := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		outputs.Write(b)
		return cmd.ProcessState.ExitCode(), string(b)
	}
	if code, out := asNobody("set", "-pin", pin, "cookie-secret", h4); code != exitError || !strings.Contains(out, "NEW CURRENT") {
		t.Errorf("set cookie-secret NEW as a member of the group: exit %d:\n%s", code, out)
	}
	check(t, "after a refused set", step{2, map[rrl.CookieSecret]string{s3: "passed", s4: "invalid"}})
	if code, out := asNobody("set", "-pin", pin, "cookie-secret", h4+" "+h3); code != exitOK {
		t.Errorf("set cookie-secret \"NEW CURRENT\" as a member of the group: exit %d:\n%s", code, out)
	}
	check(t, "after a member's rotation", step{2, map[rrl.CookieSecret]string{s4: "passed", s3: "passed", s1: "invalid"}})

	run(t, exitOK, "set", "-pin", pin, "cookie-secret", "")
	check(t, "after cookie-secret \"\"", step{0, map[rrl.CookieSecret]string{s4: "none", s3: "none"}})

	// Usage errors quote no secret either.
	run(t, exitUsage, "set", "-pin", pin, "cookie-secret", h1, "requests-per-second")
	run(t, exitUsage, "set", "-pin", pin, "cookie-secrets", h1)
	run(t, exitUsage, "load", "-pin", pin, "-cookie-secret", h1, h2)

	// attach: loading pins with the secret, and giving one to pins that exist.
	target, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	tpin := filepath.Join(root, "attached")
	listen := target.LocalAddr().String()
	self := strconv.Itoa(os.Getpid())
	out = run(t, exitOK, "attach", "-pid", self, "-listen", listen, "-pin", tpin, "-requests-per-second", "100", "-cookie-secret", h1)
	if !strings.Contains(out, "verified in the kernel") {
		t.Errorf("attach -cookie-secret says nothing of the cookies:\n%s", out)
	}
	tc := newCookieClient(t, target.LocalAddr().(*net.UDPAddr).AddrPort())
	if got := cookieVerdict(t, tpin, tc, s1); got != "passed" {
		t.Errorf("after attach loaded the pins with a secret, its cookie is %s", got)
	}
	run(t, exitOK, "attach", "-pid", self, "-listen", listen, "-pin", tpin, "-cookie-secret", h2)
	if st := statsOf(t, tpin); st.CookieSecrets != 2 {
		t.Errorf("after attach gave the pins a new secret: %d secrets", st.CookieSecrets)
	}
	for s, want := range map[rrl.CookieSecret]string{s2: "passed", s1: "passed", s3: "invalid"} {
		if got := cookieVerdict(t, tpin, tc, s); got != want {
			t.Errorf("after attach gave the pins a new secret, a cookie made with %#x… is %s, want %s", s[0], got, want)
		}
	}
	run(t, exitOK, "detach", "-pid", self, "-listen", listen, "-pin", tpin, "-unpin")

	all := outputs.String()
	for i, h := range []string{h1, h2, h3, h4} {
		for _, form := range []string{h, strings.ToUpper(h), h[:16]} {
			if strings.Contains(all, form) {
				t.Errorf("secret %d appears in the output (as %q):\n%s", i+1, form, all)
			}
		}
	}
}
