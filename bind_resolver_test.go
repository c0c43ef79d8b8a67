//go:build linux

package rrl

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// serveEnv makes the unprivileged child of TestBINDResolverGoLimits serve instead of
// testing: it prints its address, serves until its standard input closes, and then
// prints its counters.
const serveEnv = "RRL_TEST_SERVE_CHILD"

// TestBINDResolverGoLimits: a real BIND 9 resolver whose query source lies inside a
// flooded /24 forwards to a server run as uid 65534 without capabilities, where
// Protect can only attach the classic prefilter and the request limits run in Go.
// BIND sends client cookies and echoes the server cookie it learned, so the Go path
// judges its queries at its own address: at least 97% of the questions asked of it
// are answered while the flood is trimmed.
func TestBINDResolverGoLimits(t *testing.T) {
	if isUnprivilegedChild() && os.Getenv(serveEnv) == "1" {
		serveUnprivileged(t)
		return
	}
	if testing.Short() {
		t.Skip("live flood")
	}
	named := testutil.Named(t)
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	srv, stats := startUnprivilegedServer(t)

	const net24 = 70
	resolver := startBINDResolver(t, named, srv, netip.AddrFrom4([4]byte{127, 33, net24, 201}))
	c := &dns.Client{Timeout: 1500 * time.Millisecond}
	ask := func(name string) bool {
		q := new(dns.Msg)
		q.SetQuestion(name, dns.TypeA)
		r, _, err := c.Exchange(q, resolver.String())
		return err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1
	}
	// BIND learns the server's cookie from its first answers.
	for i := range 3 {
		if !ask(fmt.Sprintf("warm%d.example.test.", i)) {
			t.Fatalf("BIND did not answer before the flood")
		}
	}
	stopFlood := socketFlood(t, srv, net24)
	time.Sleep(500 * time.Millisecond)
	const queries = 60
	answered := 0
	for i := range queries {
		if ask(fmt.Sprintf("q%d.example.test.", i)) {
			answered++
		}
		time.Sleep(15 * time.Millisecond)
	}
	sent := stopFlood()
	status, counters := stats()
	t.Logf("server: %s\n%s\nBIND: %d of %d answered during a flood of %d packets", status, counters, answered, queries, sent)
	if !strings.Contains(status, "kernel filter: classic") || !strings.Contains(status, "request limits in Go") {
		t.Errorf("the unprivileged server runs %q, want the classic filter and the Go limits", status)
	}
	var passed, refused uint64
	if _, err := fmt.Sscanf(counters, "cookie-passed %d refused %d", &passed, &refused); err != nil {
		t.Fatalf("server counters %q: %v", counters, err)
	}
	if float64(answered) < 0.97*float64(queries) {
		t.Errorf("BIND resolver inside the flooded /24: %d of %d answered, want 97%%", answered, queries)
	}
	if passed < uint64(answered) || float64(refused) < 0.5*float64(sent) {
		t.Errorf("the server passed %d on a cookie and refused %d of the flood's %d", passed, refused, sent)
	}
}

// serveUnprivileged is the child's side: Protect on a loopback port, the address on
// standard output, serve until standard input closes, then the status and counters.
func serveUnprivileged(t *testing.T) {
	checkUnprivileged(t)
	p, addr := startProtected(t, rpsConfig(t, fmt.Sprint(goCookieRPS)))
	fmt.Printf("serving %s\n", addr)
	io.Copy(io.Discard, os.Stdin)
	var passed uint64
	if l := p.Limiter(); l != nil {
		passed = l.Stats().CookiePassed
	}
	fmt.Printf("status %s\ncookie-passed %d refused %d\n", p.Status(), passed, p.Handler().Stats().RequestsLimited)
}

// startUnprivilegedServer starts a copy of the test binary as uid 65534 without
// capabilities serving as serveUnprivileged does, and returns its address and a
// function that stops it and returns its status line and counters line.
func startUnprivilegedServer(t *testing.T) (netip.AddrPort, func() (status, counters string)) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe = executableBy(t, exe, unprivilegedID)
	cmd := exec.Command(exe, "-test.run=^TestBINDResolverGoLimits$", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), unprivilegedEnv+"=1", serveEnv+"=1", "GORACE=atexit_sleep_ms=0")
	cmd.Dir = filepath.Dir(exe)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: unprivilegedID, Gid: unprivilegedID, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	stopped := false
	stop := func() []string {
		if stopped {
			return nil
		}
		stopped = true
		stdin.Close()
		var rest []string
		for l := range lines {
			rest = append(rest, l)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("server child: %v\n%s\n%s", err, strings.Join(rest, "\n"), stderr.String())
		}
		return rest
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		stop()
	})
	var addr netip.AddrPort
	select {
	case l, ok := <-lines:
		a, found := strings.CutPrefix(l, "serving ")
		if !ok || !found {
			t.Fatalf("server child said %q; stderr:\n%s", l, stderr.String())
		}
		if addr, err = netip.ParseAddrPort(a); err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("server child did not start; stderr:\n%s", stderr.String())
	}
	return addr, func() (string, string) {
		var status, counters string
		for _, l := range stop() {
			if s, ok := strings.CutPrefix(l, "status "); ok {
				status = s
			}
			if strings.HasPrefix(l, "cookie-passed ") {
				counters = l
			}
		}
		return status, counters
	}
}

// startBINDResolver starts named as a resolver on a loopback port that forwards
// example.test. to auth, sending its queries from source, and returns its address
// once it answers. BIND sends DNS cookies to the servers it asks by default.
func startBINDResolver(t *testing.T, named string, auth netip.AddrPort, source netip.Addr) netip.AddrPort {
	t.Helper()
	dir := t.TempDir()
	probe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.LocalAddr().(*net.UDPAddr).AddrPort()
	probe.Close()
	conf := fmt.Sprintf(`options {
	directory "%[1]s";
	pid-file none;
	session-keyfile "%[1]s/session.key";
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion yes;
	allow-query { any; };
	allow-recursion { any; };
	query-source address %[3]s;
	dnssec-validation no;
	notify no;
	max-ncache-ttl 0;
};
controls { };
zone "example.test" { type forward; forward only; forwarders { %[4]s port %[5]d; }; };
`, dir, addr.Port(), source, auth.Addr(), auth.Port())
	path := filepath.Join(dir, "named.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(named, "-g", "-n", "1", "-c", path)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("named output:\n%s", log.String())
		}
	})
	c := &dns.Client{Timeout: 300 * time.Millisecond}
	q := new(dns.Msg)
	q.SetQuestion("ready.example.test.", dns.TypeA)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		if r, _, err := c.Exchange(q, addr.String()); err == nil && len(r.Answer) == 1 {
			return addr
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("named did not answer on %s; output:\n%s", addr, log.String())
	return addr
}
