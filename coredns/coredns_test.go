package coredns

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The tests in this file run a CoreDNS binary with the plugin (cmd/coredns-rrl),
// built once per test run into a temporary directory on first use: CoreDNS takes a
// few minutes to compile on a small machine, and the parser tests need no binary.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// coreDNSBinary returns the path of the CoreDNS binary, building it the first time.
func coreDNSBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "coredns-rrl-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "coredns-rrl")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/coredns-rrl")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/coredns-rrl: %v\n%s", err, out.String())
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// freePort returns a port free on 127.0.0.1 for both UDP and TCP at the time of
// the call.
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
		pc.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// server is a running CoreDNS.
type server struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer // stdout and stderr
	done   chan struct{}
	err    error // exit status, once done is closed
}

func (s *server) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.output.Write(b)
}

func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.output.String()
}

// startCoreDNS writes corefile and files (name: content) into a temporary
// directory and runs CoreDNS there with args. It returns once CoreDNS has printed its
// start-up banner (its servers are listening then), or fails the test.
func startCoreDNS(t *testing.T, corefile string, files map[string]string, args ...string) *server {
	t.Helper()
	return startCoreDNSAs(t, nil, corefile, files, args...)
}

// startCoreDNSAs is startCoreDNS with the process's credentials (nil: ours).
func startCoreDNSAs(t *testing.T, cred *syscall.Credential, corefile string, files map[string]string, args ...string) *server {
	t.Helper()
	s := runCoreDNSAs(t, cred, corefile, files, args...)
	deadline := time.After(60 * time.Second)
	for !strings.Contains(s.log(), "CoreDNS-") {
		select {
		case <-s.done:
			t.Fatalf("CoreDNS exited at start: %v\n%s", s.err, s.log())
		case <-deadline:
			t.Fatalf("CoreDNS did not start within a minute:\n%s", s.log())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return s
}

// runCoreDNS starts CoreDNS as startCoreDNS does, without waiting; the test's
// cleanup stops it.
func runCoreDNS(t *testing.T, corefile string, files map[string]string, args ...string) *server {
	t.Helper()
	return runCoreDNSAs(t, nil, corefile, files, args...)
}

func runCoreDNSAs(t *testing.T, cred *syscall.Credential, corefile string, files map[string]string, args ...string) *server {
	t.Helper()
	bin := coreDNSBinary(t)
	dir := t.TempDir()
	if cred != nil {
		// The unprivileged process reads the binary, the Corefile and the zones.
		for _, d := range []string{dir, filepath.Dir(dir), binDir} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "Corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := &server{done: make(chan struct{})}
	s.cmd = exec.Command(bin, append([]string{"-conf", "Corefile"}, args...)...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = s, s
	if cred != nil {
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-s.done
		}
		if t.Failed() {
			t.Logf("CoreDNS output:\n%s", s.log())
		}
	})
	return s
}

const exampleZone = `$ORIGIN example.test.
@	300 IN SOA ns.example.test. host.example.test. 1 7200 3600 1209600 300
	300 IN NS ns.example.test.
ns	300 IN A 192.0.2.53
www	300 IN A 192.0.2.1
*.wild	300 IN A 192.0.2.2
`

// metric returns the sum of the samples of name (with labels containing every
// label="value" in match) on the Prometheus endpoint at addr.
func metric(t *testing.T, addr, name string, match ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	found := false
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(line, m)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		t.Fatalf("no metric %s%v at %s:\n%s", name, match, addr, grepLines(string(body), "rrl"))
	}
	return sum
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// burst sends n copies of q with distinct IDs from one UDP socket, as fast as it
// can, and returns the responses that came back within quiet of the last one.
func burst(t *testing.T, addr string, q *dns.Msg, n int, quiet time.Duration) []*dns.Msg {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := range n {
		q.Id = uint16(i + 1)
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var got []*dns.Msg
	buf := make([]byte, 65535)
	for len(got) < n {
		conn.SetReadDeadline(time.Now().Add(quiet))
		k, err := conn.Read(buf)
		if err != nil {
			break
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:k]); err != nil {
			t.Fatalf("response: %v", err)
		}
		got = append(got, m)
	}
	return got
}

func TestCoreDNSBurst(t *testing.T) {
	// 60 identical queries at responses-per-second 5 and slip-ratio 2: five
	// answered, then BIND's alternation of slips (truncated, no records) and drops.
	port, mport := freePort(t), freePort(t)
	startCoreDNS(t, fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        responses-per-second 5
        slip-ratio 2
    }
    file db.example.test
}
`, port, mport), map[string]string{"db.example.test": exampleZone})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	got := burst(t, addr, q, 60, time.Second)
	var answered, slipped int
	for _, m := range got {
		switch {
		case m.Truncated && len(m.Answer) == 0 && len(m.Ns) == 0:
			slipped++
		case !m.Truncated && len(m.Answer) == 1 && m.Rcode == dns.RcodeSuccess:
			answered++
		default:
			t.Errorf("unexpected response:\n%v", m)
		}
	}
	if answered != 5 || slipped != 28 || len(got) != 33 {
		t.Errorf("%d answered, %d slipped, %d dropped; want 5, 28, 27", answered, slipped, 60-len(got))
	}
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	if v := metric(t, mAddr, "coredns_rrl_responses_exceeded_total"); v != 55 {
		t.Errorf("coredns_rrl_responses_exceeded_total %v, want 55", v)
	}
	if v := metric(t, mAddr, "coredns_rrl_requests_exceeded_total"); v != 0 {
		t.Errorf("coredns_rrl_requests_exceeded_total %v, want 0", v)
	}
	if v := metric(t, mAddr, "coredns_rrl_handler_responses_total", `action="slip"`); v != 28 {
		t.Errorf("coredns_rrl_handler_responses_total{action=slip} %v, want 28", v)
	}
	// A name outside the zone's accounts: answered, its own account.
	q.SetQuestion("www.example.test.", dns.TypeNS)
	if got := burst(t, addr, q, 1, 2*time.Second); len(got) != 1 || got[0].Truncated {
		t.Errorf("another qtype: %v, want its own account's answer", got)
	}
}

func TestCoreDNSWildcard(t *testing.T) {
	// With the metadata plugin on, names synthesised from *.wild.example.test share
	// the wildcard's account; without it each name has its own.
	for _, tc := range []struct {
		metadata string
		want     string
	}{
		{"metadata", "send tc tc tc"},
		{"", "send send send send"},
	} {
		port := freePort(t)
		startCoreDNS(t, fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    %s
    rrl {
        responses-per-second 1
        slip-ratio 1
    }
    file db.example.test
}
`, port, tc.metadata), map[string]string{"db.example.test": exampleZone})
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var got []string
		for _, l := range []string{"a", "b", "c", "d"} {
			q := new(dns.Msg)
			q.SetQuestion(l+".wild.example.test.", dns.TypeA)
			r := burst(t, addr, q, 1, 2*time.Second)
			switch {
			case len(r) == 0:
				got = append(got, "drop")
			case r[0].Truncated:
				got = append(got, "tc")
			default:
				got = append(got, "send")
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("metadata %q: %v, want %s", tc.metadata, got, tc.want)
		}
	}
}

func TestCoreDNSReadmeCorefile(t *testing.T) {
	// The example of coredns/rrl's README, unchanged, on a port of our choosing
	// (-dns.port, since the Corefile names none). With no plugin after rrl the
	// server answers SERVFAIL, through rrl.
	port := freePort(t)
	startCoreDNS(t, `
. {
  rrl . {
    responses-per-second 10
  }
}
`, nil, "-dns.port", strconv.Itoa(port))
	q := new(dns.Msg)
	q.SetQuestion("example.org.", dns.TypeA)
	got := burst(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), q, 1, 5*time.Second)
	if len(got) != 1 || got[0].Rcode != dns.RcodeServerFailure {
		t.Fatalf("responses %v, want one SERVFAIL", got)
	}
}

func TestCoreDNSBadCorefile(t *testing.T) {
	// A Corefile the plugin refuses stops CoreDNS at start, naming the line.
	for _, tc := range []struct{ body, want string }{
		{"bogus 1", "Corefile:4 - Error during parsing: unknown property 'bogus'"},
		{"slip-ratio 20", `Corefile:4 - Error during parsing: slip-ratio "20": must be between 0 and 10`},
		{"responses-per-second fast", `Corefile:4 - Error during parsing: responses-per-second "fast": not a number`},
		{"kernel-filter sometimes", `Corefile:4 - Error during parsing: kernel-filter "sometimes": want on or off`},
	} {
		port := freePort(t)
		s := runCoreDNS(t, fmt.Sprintf(".:%d {\n  bind 127.0.0.1\n  rrl {\n    %s\n  }\n}\n", port, tc.body), nil)
		select {
		case <-s.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: CoreDNS still running after a minute:\n%s", tc.body, s.log())
		}
		if s.err == nil {
			t.Errorf("%s: CoreDNS exited with status 0, want a failure", tc.body)
		}
		if !strings.Contains(s.log(), tc.want) {
			t.Errorf("%s: output does not contain %q:\n%s", tc.body, tc.want, s.log())
		}
	}
}

// requirePrivilege skips t unless the process has the capabilities (root does),
// or fails it with RRL_REQUIRE_BPF=1, as the library's tests do.
func requirePrivilege(t *testing.T, caps ...int) {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var have uint64
	for l := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			have, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	for _, c := range caps {
		if have&(1<<c) == 0 {
			msg := fmt.Sprintf("needs capability %d (run as root)", c)
			if os.Getenv("RRL_REQUIRE_BPF") == "1" {
				t.Fatal(msg + ", and RRL_REQUIRE_BPF=1 forbids skipping")
			}
			t.Skip(msg + " (set RRL_REQUIRE_BPF=1 to fail instead)")
		}
	}
}

// flood sends rate spoofed queries per second for dur from random sources in
// 127.66.0.0/24 to dst through a raw socket, and returns the number sent.
func flood(t *testing.T, dst netip.AddrPort, rate int, dur time.Duration) int {
	t.Helper()
	raw, err := loadgen.NewRawSender(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	payload := loadgen.DNSQuery(7, false)
	sent := 0
	start := time.Now()
	for time.Since(start) < dur {
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 66, 0, byte(rand.IntN(256))}), uint16(1024+rand.IntN(60000)))
			if err := raw.Send(loadgen.Packet(src, dst, payload)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Millisecond)
	}
	return sent
}

// floodCorefile serves example.test with a requests-per-second limit of 100.
func floodCorefile(port, mport int) string {
	return fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        responses-per-second 5
        requests-per-second 100
    }
    file db.example.test
}
`, port, mport)
}

// checkTrimmed floods the server at 20 times its limit for three seconds and
// checks in the plugin's metrics that the kernel filter dropped the excess.
func checkTrimmed(t *testing.T, port, mport int) {
	t.Helper()
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	before := metric(t, mAddr, "coredns_rrl_filter_passed_total")
	limitedBefore := metric(t, mAddr, "coredns_rrl_requests_exceeded_total")
	sent := flood(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), 2000, 3*time.Second)
	passed := metric(t, mAddr, "coredns_rrl_filter_passed_total") - before
	limited := metric(t, mAddr, "coredns_rrl_filter_limited_total", `node="ipv4/24"`)
	exceeded := metric(t, mAddr, "coredns_rrl_requests_exceeded_total") - limitedBefore
	t.Logf("flood: %d sent, %v passed to CoreDNS, %v limited at ipv4/24", sent, passed, limited)
	// 100 per second for three seconds, plus what passes while the estimate rises
	// (about 0.7 s of it): well under a fifth of the flood.
	if passed > float64(sent)/5 || passed < 150 {
		t.Errorf("%v of %d flood packets passed, want about 300-450", passed, sent)
	}
	if exceeded < float64(sent)*0.7 {
		t.Errorf("coredns_rrl_requests_exceeded_total rose by %v, want most of %d", exceeded, sent)
	}
	if v := metric(t, mAddr, "coredns_rrl_filter_mode", `mode="ebpf"`); v != 1 {
		t.Errorf("coredns_rrl_filter_mode{mode=ebpf} %v, want 1", v)
	}
	// A light client elsewhere is answered.
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	if got := burst(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), q, 3, time.Second); len(got) != 3 {
		t.Errorf("light client: %d of 3 answered", len(got))
	}
}

func TestCoreDNSKernelFlood(t *testing.T) {
	// A spoofed flood from one /24 at 20 times requests-per-second is trimmed in
	// the kernel before CoreDNS reads it.
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_NET_RAW)
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, floodCorefile(port, mport), map[string]string{"db.example.test": exampleZone})
	// The banner comes from the servers' start, the attach from their first step.
	waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": ebpf", 1)
	checkTrimmed(t, port, mport)
}

func TestCoreDNSKernelFilterReload(t *testing.T) {
	// After a reload (SIGUSR1) the new instance's filter is on the sockets and the
	// old instance's shutdown has not taken it off.
	requirePrivilege(t, unix.CAP_BPF, unix.CAP_NET_RAW)
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, floodCorefile(port, mport), map[string]string{"db.example.test": exampleZone})
	waitLog(t, s, "kernel filter for dns://", 1)
	s.cmd.Process.Signal(syscall.SIGUSR1)
	waitLog(t, s, "kept with the new settings", 1)
	waitLog(t, s, "Reloading complete", 1) // the old instance has shut down
	checkTrimmed(t, port, mport)
	if strings.Count(s.log(), "plugin/rrl: kernel filter for") != 2 {
		t.Errorf("want one attach and one take-over in the log:\n%s", s.log())
	}
}

// waitLog waits up to 30 seconds for CoreDNS to have logged sub n times.
func waitLog(t *testing.T, s *server, sub string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for strings.Count(s.log(), sub) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("CoreDNS did not log %q:\n%s", sub, s.log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestCoreDNSKernelFilterOff(t *testing.T) {
	// kernel-filter off: nothing attached, requests-per-second enforced in Go.
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        requests-per-second 10
        kernel-filter off
    }
    file db.example.test
}
`, port, mport), map[string]string{"db.example.test": exampleZone})
	if strings.Contains(s.log(), "kernel filter for") {
		t.Errorf("a kernel filter was attached:\n%s", s.log())
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	got := burst(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), q, 200, time.Second)
	limited := metric(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(mport)), "coredns_rrl_limiter_limited_total")
	if len(got) >= 150 || limited < 50 {
		t.Errorf("%d of 200 answered, %v limited in Go: want the Go limiter to refuse most", len(got), limited)
	}
}

func TestCoreDNSUnprivileged(t *testing.T) {
	// Run as uid 65534 without capabilities, CoreDNS cannot load eBPF: the plugin
	// attaches the classic prefilter and enforces requests-per-second in Go.
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	port, mport := freePort(t), freePort(t)
	s := startCoreDNSAs(t, &syscall.Credential{Uid: 65534, Gid: 65534}, fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        requests-per-second 10
    }
    file db.example.test
}
`, port, mport), map[string]string{"db.example.test": exampleZone})
	waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": classic", 1)
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	if v := metric(t, mAddr, "coredns_rrl_filter_mode", `mode="classic"`); v != 1 {
		t.Errorf("coredns_rrl_filter_mode{mode=classic} %v, want 1", v)
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	got := burst(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), q, 200, time.Second)
	limited := metric(t, mAddr, "coredns_rrl_limiter_limited_total")
	if len(got) >= 150 || limited < 50 {
		t.Errorf("%d of 200 answered, %v limited in Go: want the Go limiter to refuse most", len(got), limited)
	}
	if v := metric(t, mAddr, "coredns_rrl_requests_exceeded_total"); v != limited {
		t.Errorf("coredns_rrl_requests_exceeded_total %v, want the Go limiter's %v", v, limited)
	}
}

func TestCoreDNSKernelCookies(t *testing.T) {
	// With cookies, the kernel filter verifies server cookies with the plugin's
	// secret: a client that learned its cookie from CoreDNS is counted as proven.
	requirePrivilege(t, unix.CAP_BPF)
	port, mport := freePort(t), freePort(t)
	s := startCoreDNS(t, fmt.Sprintf(`example.test:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    rrl {
        requests-per-second 100
        cookies 000102030405060708090a0b0c0d0e0f
    }
    file db.example.test
}
`, port, mport), map[string]string{"db.example.test": exampleZone})
	waitLog(t, s, "kernel filter for dns://127.0.0.1:"+strconv.Itoa(port)+": ebpf", 1)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	opt := q.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
	got := burst(t, addr, q, 1, 5*time.Second)
	if len(got) != 1 || got[0].IsEdns0() == nil {
		t.Fatalf("first query: %v, want an answer with an OPT record", got)
	}
	var full string
	for _, o := range got[0].IsEdns0().Option {
		if c, ok := o.(*dns.EDNS0_COOKIE); ok {
			full = c.Cookie
		}
	}
	if len(full) <= 16 {
		t.Fatalf("no server cookie in the answer: %q", full)
	}
	opt.Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: full}}
	for range 3 {
		if got := burst(t, addr, q, 1, 5*time.Second); len(got) != 1 {
			t.Fatal("no answer to a query with the server cookie")
		}
	}
	mAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mport))
	if v := metric(t, mAddr, "coredns_rrl_filter_cookie_passed_total"); v != 3 {
		t.Errorf("coredns_rrl_filter_cookie_passed_total %v, want 3", v)
	}
	if v := metric(t, mAddr, "coredns_rrl_filter_cookie_invalid_total"); v != 0 {
		t.Errorf("coredns_rrl_filter_cookie_invalid_total %v, want 0", v)
	}
}
