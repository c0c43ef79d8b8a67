package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/dnscookie"
	"github.com/miekg/dns"
)

// startTest serves the embedded zone on 127.0.0.1 with cfg (nil: defaults) and
// returns the server and its start-up log.
func startTest(t *testing.T, cfg *rrl.Config, metrics string) (*server, string) {
	t.Helper()
	z, err := loadZone(strings.NewReader(demoZone), "", "example.test.zone")
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = rrl.NewConfig()
	}
	var log bytes.Buffer
	s, err := startServer(serverConfig{listen: "127.0.0.1:0", zone: z, cfg: cfg, metrics: metrics, log: &log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s, log.String()
}

var startLine = regexp.MustCompile(`(?m)^rrl: kernel filter: ebpf; request limits in the kernel; server cookies verified in the kernel$|^rrl: kernel filter: (classic|none); request limits in Go; server cookies verified in Go before the request limits; eBPF filter not in force: .+$`)

func TestServeZone(t *testing.T) {
	s, log := startTest(t, nil, "")
	if !startLine.MatchString(log) || strings.Count(log, "\n") != 1 {
		t.Errorf("start-up log %q: want one line saying which protection is in force", log)
	}
	type want struct {
		rcode  int
		aa     bool
		answer []string // answer records, in text form without TTL and class
		ns     []string // authority record types
		extra  int      // additional records besides OPT
		tc     bool
	}
	for _, tc := range []struct {
		name  string
		qtype uint16
		edns  bool
		nets  []string
		want  want
	}{
		{"www.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"www.example.test. A 192.0.2.80"}}},
		{"WWW.Example.TEST.", dns.TypeAAAA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"www.example.test. AAAA 2001:db8::80"}}},
		// NODATA: the name exists without the type; the SOA says so.
		{"text.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, ns: []string{"SOA"}}},
		// NODATA at an empty non-terminal (ns1.sub's parent is the cut, so
		// use a name whose only descendant is the wildcard).
		{"wild.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, ns: []string{"SOA"}}},
		{"nope.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeNameError, aa: true, ns: []string{"SOA"}}},
		{"a.b.nope.example.test.", dns.TypeMX, true, nil, want{rcode: dns.RcodeNameError, aa: true, ns: []string{"SOA"}}},
		// Referrals, at and below the cut, with glue.
		{"sub.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeSuccess, ns: []string{"NS", "NS"}, extra: 2}},
		{"host.sub.example.test.", dns.TypeAAAA, true, nil, want{rcode: dns.RcodeSuccess, ns: []string{"NS", "NS"}, extra: 2}},
		// Synthesised from *.wild.example.test., with the name asked.
		{"Anything.wild.example.test.", dns.TypeA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"Anything.wild.example.test. A 192.0.2.99"}}},
		{"x.y.wild.example.test.", dns.TypeAAAA, true, nil, want{rcode: dns.RcodeSuccess, aa: true, ns: []string{"SOA"}}},
		{"example.test.", dns.TypeMX, true, nil, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"example.test. MX 10 mail.example.test."}}},
		{"example.org.", dns.TypeA, true, nil, want{rcode: dns.RcodeRefused}},
		// The large answer fits an EDNS payload; without EDNS it is truncated
		// over UDP and complete over TCP.
		{"big.example.test.", dns.TypeTXT, true, nil, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"TXT", "TXT", "TXT", "TXT"}}},
		{"big.example.test.", dns.TypeTXT, false, []string{"udp"}, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"TXT"}, tc: true}},
		{"big.example.test.", dns.TypeTXT, false, []string{"tcp"}, want{rcode: dns.RcodeSuccess, aa: true, answer: []string{"TXT", "TXT", "TXT", "TXT"}}},
	} {
		nets := tc.nets
		if nets == nil {
			nets = []string{"udp", "tcp"}
		}
		for _, network := range nets {
			q := new(dns.Msg)
			q.SetQuestion(tc.name, tc.qtype)
			if tc.edns {
				q.SetEdns0(1232, false)
			}
			c := &dns.Client{Net: network, Timeout: 5 * time.Second}
			r, _, err := c.Exchange(q, s.addr)
			if err != nil {
				t.Errorf("%s %s over %s: %v", tc.name, dns.TypeToString[tc.qtype], network, err)
				continue
			}
			var got want
			got.rcode, got.aa, got.tc = r.Rcode, r.Authoritative, r.Truncated
			for _, rr := range r.Answer {
				if len(tc.want.answer) > 0 && !strings.Contains(tc.want.answer[0], " ") {
					got.answer = append(got.answer, dns.TypeToString[rr.Header().Rrtype])
					continue
				}
				h := rr.Header()
				got.answer = append(got.answer, h.Name+" "+dns.TypeToString[h.Rrtype]+" "+strings.TrimPrefix(rr.String(), h.String()))
			}
			for _, rr := range r.Ns {
				got.ns = append(got.ns, dns.TypeToString[rr.Header().Rrtype])
			}
			for _, rr := range r.Extra {
				if rr.Header().Rrtype != dns.TypeOPT {
					got.extra++
				}
			}
			if tc.want.tc {
				got.answer = got.answer[:min(len(got.answer), 1)]
			}
			if g, w := strings.Join(got.answer, "|"), strings.Join(tc.want.answer, "|"); g != w || got.rcode != tc.want.rcode ||
				got.aa != tc.want.aa || got.tc != tc.want.tc || strings.Join(got.ns, " ") != strings.Join(tc.want.ns, " ") || got.extra != tc.want.extra {
				t.Errorf("%s %s over %s:\n got %+v\nwant %+v\n%v", tc.name, dns.TypeToString[tc.qtype], network, got, tc.want, r)
			}
			if tc.edns && r.IsEdns0() == nil {
				t.Errorf("%s over %s: no OPT record in the response", tc.name, network)
			}
		}
	}
}

func TestServeCookiesAndLimits(t *testing.T) {
	// The middleware is in place: a client cookie gets a server cookie, and
	// with responses-per-second 1 the second answer slips.
	cfg := rrl.NewConfig()
	cfg.SetValue("responses-per-second", "1")
	cfg.SetValue("slip-ratio", "1")
	s, _ := startTest(t, cfg, "")
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	dnscookie.Set(q, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	c := &dns.Client{Timeout: 5 * time.Second}
	r, _, err := c.Exchange(q, s.addr)
	if err != nil {
		t.Fatal(err)
	}
	full, ok := dnscookie.FromMsg(r)
	if !ok || len(full) != dnscookie.Len || len(r.Answer) != 1 {
		t.Fatalf("first response: cookie %x, %v", full, r)
	}
	plain := new(dns.Msg)
	plain.SetQuestion("www.example.test.", dns.TypeA)
	plain.SetEdns0(1232, false)
	if r, _, err = c.Exchange(plain, s.addr); err != nil || !r.Truncated || len(r.Answer) != 0 {
		t.Fatalf("second response: want a slip, got %v, %v", r, err)
	}
	// With the server cookie the client is no longer limited.
	dnscookie.Set(q, full)
	for range 3 {
		if r, _, err = c.Exchange(q, s.addr); err != nil || r.Truncated || len(r.Answer) != 1 {
			t.Fatalf("with a server cookie: %v, %v", r, err)
		}
	}
}

func TestMetricsEndpoint(t *testing.T) {
	s, log := startTest(t, nil, "127.0.0.1:0")
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("no metrics address in %q", log)
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	if _, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(q, s.addr); err != nil {
		t.Fatal(err)
	}
	// A query without a question, which miekg/dns answers itself: counted.
	c, err := net.Dial("udp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	// (Long enough for the kernel filter, which drops what is shorter than a query.)
	c.Write([]byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 512)); err != nil {
		t.Fatalf("no FORMERR for a query without a question: %v", err)
	}
	c.Close()
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`dns_rrl_debits_total{category="answer"} 1`,
		`dns_handler_responses_total{action="send",category="answer"} 1`,
		`dns_tcp_accepted_total 0`,
		`dns_handler_malformed_total{reason="question-count"} 1`,
		`dns_handler_responses_total{action="send",category="error"} 1`,
		`go_goroutines `,
		`process_cpu_seconds_total `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if s.limiter == nil && !strings.Contains(string(body), `dns_filter_mode{mode="ebpf"} 1`) {
		t.Errorf("metrics lack the eBPF filter's:\n%s", body)
	}
	if s.limiter != nil && !strings.Contains(string(body), "dns_limiter_packets_total 1\n") {
		t.Errorf("metrics lack the Go limiter's:\n%s", body)
	}
}

func TestZoneFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "z")
	zoneText := "@ 300 IN SOA ns.other.test. h.other.test. 1 2 3 4 5\n@ 300 IN NS ns.other.test.\nwww 300 IN A 198.51.100.1\n"
	if err := os.WriteFile(file, []byte(zoneText), 0o644); err != nil {
		t.Fatal(err)
	}
	zs, err := openZones([]zoneArg{{file: file, origin: "other.test"}})
	if err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("www.other.test.", dns.TypeA)
	if m, _ := zs.zones[0].answer(q); len(zs.zones) != 1 || len(m.Answer) != 1 || !m.Authoritative {
		t.Errorf("answer from the zone file: %v", m)
	}
	for _, bad := range []string{
		"www 300 IN A 198.51.100.1\n", // no SOA
		zoneText + "www.elsewhere. 300 IN A 192.0.2.1\n",
		zoneText + "@ 300 IN SOA a. b. 1 2 3 4 5\n",
		"@ 300 IN SOA ns.other.test. h.other.test. 1 2 3 4 5\n", // no NS
		"@ 300 IN SOA garbage\n",
	} {
		if _, err := loadZone(strings.NewReader(bad), "other.test.", "bad"); err == nil {
			t.Errorf("zone accepted:\n%s", bad)
		}
	}
	if _, err := openZones([]zoneArg{{file: filepath.Join(dir, "missing")}}); err == nil {
		t.Error("missing zone file accepted")
	}
}

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"-responses-per-second", "5", "-slip-ratio", "3", "-report-only", "-listen", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"responses-per-second", "5"}, {"slip-ratio", "3"}, {"report-only", "true"}}
	if len(o.settings) != len(want) || !o.listenSet {
		t.Fatalf("settings %v, listen set %v", o.settings, o.listenSet)
	}
	for i := range want {
		if o.settings[i] != want[i] {
			t.Errorf("setting %d: %v, want %v", i, o.settings[i], want[i])
		}
	}
	if o.noFilter {
		t.Error("the kernel filter is off by default")
	}
	if o, err = parseFlags([]string{"-kernel-filter=false"}, io.Discard); err != nil || !o.noFilter {
		t.Errorf("-kernel-filter=false: %+v, %v", o, err)
	}
	// Every keyword is a flag; bad values and unknown flags are usage errors.
	var help bytes.Buffer
	parseFlags([]string{"-h"}, &help)
	for _, kw := range rrl.ConfigKeywords() {
		if !strings.Contains(help.String(), "-"+kw) {
			t.Errorf("no flag -%s", kw)
		}
	}
	for _, args := range [][]string{{"-slip-ratio", "11"}, {"-window", "x"}, {"-nonsense"}, {"extra"}, {"-demo-duration", "0s"}} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("%v: exit status %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

func TestRunShutsDown(t *testing.T) {
	// A cancelled context (SIGINT, SIGTERM) shuts the server down cleanly.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stderr bytes.Buffer
	if code := run(ctx, []string{"-listen", "127.0.0.1:0"}, io.Discard, &stderr); code != 0 {
		t.Errorf("exit status %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "serving example.test. on 127.0.0.1:") {
		t.Errorf("log %q", stderr.String())
	}
}

// TestDemo runs the demo with its output going to files, as `authserver -demo
// >out 2>&1` does: the report adds up, and no line is redrawn with a carriage return.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	stdoutFile, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdoutFile.Close()
	stderrFile, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderrFile.Close()
	args := []string{"-demo", "-demo-duration", "2s", "-demo-flood-rate", "3000", "-demo-clients", "4"}
	code := run(context.Background(), args, stdoutFile, stderrFile)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	out, errOut := read("stdout"), read("stderr")
	if code != 0 {
		t.Fatalf("exit status %d:\n%s\n%s", code, errOut, out)
	}
	t.Log(errOut + "\n" + out)
	if !startLine.MatchString(errOut) || !regexp.MustCompile(`(?m)^\s*\d+\.\ds  legitimate answered \d+ of \d+   flood \d+ sent: \d+ dropped (in the kernel|by the Go request limiter), `).MatchString(errOut) {
		t.Errorf("stderr lacks the start-up line or a progress line: %q", errOut)
	}
	if strings.ContainsRune(out+errOut, '\r') {
		t.Errorf("output to a file holds carriage returns: %q", out+errOut)
	}
	// The last line says it in the README's words, and no internal counters are
	// dumped.
	if !regexp.MustCompile(`(?m)^(every legitimate query answered \(\d+\)|\d+ of \d+ legitimate queries answered), \d+\.\d% of the flood dropped (in the kernel|by the Go request limiter), the victim receiving 0\.\d{3}x the bytes sent in its name \(\d+x unprotected\)\n$`).MatchString(out) {
		t.Errorf("the report does not end with its summary line:\n%s", out)
	}
	if strings.Contains(out, "rrl.Stats") || strings.Contains(out, "RPS ") {
		t.Errorf("the report dumps internal counters:\n%s", out)
	}
	// The table's rows, by label: the first number on the line.
	rows := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		m := regexp.MustCompile(`^\s+(\S.*?)\s+(\d+)(\s+[\d.]+%)?$`).FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		label := m[1]
		if strings.HasPrefix(label, "packets sent") {
			label = "packets sent"
		}
		if strings.HasPrefix(label, "dropped ") {
			label = "dropped by the request limiter"
		}
		rows[label] = n
	}
	legitSent, legitAnswered := rows["queries sent"], rows["answered"]
	floodSent, limited, reached := rows["packets sent"], rows["dropped by the request limiter"], rows["reached response rate limiting"]
	sendN, slipN, dropN := rows["answered in full (Send)"], rows["slipped: truncated, TC=1 (Slip)"], rows["not answered (Drop)"]
	// Packets that found the server's receive queue full (a loaded machine) reach
	// neither row; the count holds any legitimate ones too, so it bounds from above.
	lost := rows["lost: the server's receive queue was full"]
	// 4 resolvers at 20 queries per second for 2 s; 3000 flood packets per second.
	if legitSent < 100 || float64(legitAnswered) < 0.99*float64(legitSent) {
		t.Errorf("legitimate: %d of %d answered, want 99%%", legitAnswered, legitSent)
	}
	if floodSent < 3000 || limited+reached > floodSent || limited+reached+lost < floodSent || sendN+slipN+dropN != reached {
		t.Errorf("flood rows do not add up: sent %d = limited %d + reached %d (+ up to %d lost in the receive queue); reached = %d + %d + %d", floodSent, limited, reached, lost, sendN, slipN, dropN)
	}
	// The request limiter trims the victim network to about 100 per second (a
	// burst passes while its estimate builds up); RRL answers about 5 per
	// second of those, with the first second's credit.
	if float64(limited) < 0.8*float64(floodSent) {
		t.Errorf("the request limiter dropped %d of %d flood packets", limited, floodSent)
	}
	if sendN > 20 || float64(sendN+slipN) > 0.05*float64(floodSent) {
		t.Errorf("%d flood queries answered and %d slipped of %d", sendN, slipN, floodSent)
	}
	// Resolvers inside the flooded network that hold a server cookie get their
	// answers while the flood is trimmed, whether the kernel filter or the Go
	// limiter verifies it (unprivileged).
	netSent, netAnswered := rows["cookie queries sent"], rows["cookie queries answered"]
	if netSent < 60 || float64(netAnswered) < 0.99*float64(netSent) {
		t.Errorf("resolvers inside the flooded network: %d of %d answered, want 99%%", netAnswered, netSent)
	}
	if !regexp.MustCompile(`the victim received \d+ bytes for the \d+ sent in its name: 0\.\d+x`).MatchString(out) {
		t.Errorf("no amplification line below 1x in\n%s", out)
	}
}

// unprivilegedEnv marks the child process TestDemoUnprivileged starts.
const unprivilegedEnv = "AUTHSERVER_TEST_UNPRIVILEGED"

func TestDemoUnprivileged(t *testing.T) {
	// Run as root, TestDemo shows the kernel filter at work. This runs it again
	// in a child process as nobody, without capabilities: the fallback (classic
	// prefilter, Go request limiter, flood from bound sockets) must hold as well.
	if os.Getenv(unprivilegedEnv) == "1" {
		t.Skip("in the unprivileged child")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another user; TestDemo already ran unprivileged")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// go test builds the binary in a private directory: copy it where nobody
	// can run it.
	dir, err := os.MkdirTemp("", "authserver-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "authserver.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	cmd := exec.Command(bin, "-test.run", "^TestDemo$", "-test.count", "1", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), unprivilegedEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unprivileged TestDemo: %v\n%s", err, out)
	}
	for _, want := range []string{"kernel filter: classic; request limits in Go", "dropped by the Go request limiter", "from bound sockets", "--- PASS: TestDemo"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("unprivileged run lacks %q:\n%s", want, out)
		}
	}
}

// TestCookieSecretFlag: -cookie-secret makes the server's cookies with the site's
// secret; a bad one is a usage error that does not show it.
func TestCookieSecretFlag(t *testing.T) {
	const secret = "00112233445566778899aabbccddeeff"
	o, err := parseFlags([]string{"-cookie-secret", secret}, io.Discard)
	if err != nil || len(o.settings) != 1 || o.settings[0] != [2]string{"cookie-secret", secret} {
		t.Fatalf("-cookie-secret: %+v, %v", o, err)
	}
	bad := "zz" + secret[2:]
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-cookie-secret", bad}, io.Discard, &stderr); code != 2 {
		t.Errorf("bad secret: exit status %d, want 2 (%s)", code, stderr.String())
	}
	if strings.Contains(stderr.String(), bad[2:10]) || !strings.Contains(stderr.String(), "cookie-secret") {
		t.Errorf("bad secret: stderr %q should name the flag and not show the value", stderr.String())
	}

	cfg := rrl.NewConfig()
	if err := cfg.SetValue("cookie-secret", secret); err != nil {
		t.Fatal(err)
	}
	s, _ := startTest(t, cfg, "")
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	dnscookie.Set(q, []byte("client01"))
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(q, s.addr)
	if err != nil {
		t.Fatal(err)
	}
	full, ok := dnscookie.FromMsg(r)
	var key rrl.CookieSecret
	hex.Decode(key[:], []byte(secret))
	if got := rrl.NewCookies(key).Verify(full, netip.MustParseAddr("127.0.0.1"), time.Now()); !ok || got != rrl.CookieValid {
		t.Errorf("the answer's cookie %x under the configured secret: %v", full, got)
	}
}

// TestCookiesFlag: server cookies are on by default; -cookies=false turns them off.
func TestCookiesFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"-cookies=false"}, false}} {
		o, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		z, err := loadZone(strings.NewReader(demoZone), "", "example.test.zone")
		if err != nil {
			t.Fatal(err)
		}
		s, err := startServer(serverConfig{listen: "127.0.0.1:0", zone: z, cfg: rrl.NewConfig(), tcpConns: 4, log: io.Discard, noCookies: o.noCookies})
		if err != nil {
			t.Fatal(err)
		}
		st := s.protection.Status()
		s.shutdown(context.Background())
		if st.Cookies != tc.want {
			t.Errorf("%v: status %v, want cookies %v", tc.args, st, tc.want)
		}
	}
}
