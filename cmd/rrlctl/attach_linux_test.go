package main

import (
	"errors"
	"fmt"
	"io/fs"
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

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// The limit the attach tests set, and the flood they send: 20 times it, from one /24.
const (
	attachRPS   = 50
	floodFactor = 20
)

// freePort returns a loopback port free for UDP and TCP at the time of the call.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for range 20 {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

// startServer starts cmd, stops it at cleanup, and waits until it answers a query
// for qname on addr.
func startServer(t *testing.T, cmd *exec.Cmd, addr netip.AddrPort, qname string) {
	t.Helper()
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", cmd.Path, log.String())
		}
	})
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		if _, _, err := c.Exchange(query(qname), addr.String()); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not answer on %s; output:\n%s", cmd.Path, addr, log.String())
}

func query(qname string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(qname, dns.TypeSOA)
	return m
}

// startNamed starts BIND 9's named in the foreground on 127.0.0.1:port serving a
// tiny example.test zone, with two worker threads: named gives each its own
// SO_REUSEPORT socket. Response rate limiting is off (named's default without a
// rate-limit block).
func startNamed(t *testing.T) (pid int, addr netip.AddrPort) {
	t.Helper()
	named, err := exec.LookPath("named")
	if err != nil {
		named = "/usr/sbin/named"
		if _, err = os.Stat(named); err != nil {
			if os.Getenv("RRL_REQUIRE_BPF") == "1" {
				t.Fatal("named (Debian package bind9) is missing and RRL_REQUIRE_BPF=1")
			}
			t.Skip("named (Debian package bind9) is not installed")
		}
	}
	dir := t.TempDir()
	port := freePort(t)
	zone := `$TTL 300
@   IN SOA ns.example.test. hostmaster.example.test. 1 7200 3600 1209600 300
@   IN NS  ns.example.test.
ns  IN A   192.0.2.53
www IN A   192.0.2.80
`
	conf := fmt.Sprintf(`options {
	directory "%[1]s";
	pid-file none;
	session-keyfile "%[1]s/session.key";
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	notify no;
	dnssec-validation no;
};
controls { };
zone "example.test" { type primary; file "%[1]s/example.test.zone"; };
`, dir, port)
	for name, text := range map[string]string{"named.conf": conf, "example.test.zone": zone} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	cmd := exec.Command(named, "-g", "-n", "2", "-c", filepath.Join(dir, "named.conf"))
	startServer(t, cmd, addr, "example.test.")
	return cmd.Process.Pid, addr
}

// buildTool builds a command of this module into a directory anyone may read.
func buildTool(t *testing.T, pkg, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rrlctl-attach-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// startAuthserver builds and starts examples/authserver without its own filter.
func startAuthserver(t *testing.T, bin string, port uint16) (pid int, addr netip.AddrPort) {
	t.Helper()
	addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	cmd := exec.Command(bin, "-listen", addr.String(), "-kernel-filter=false")
	startServer(t, cmd, addr, "example.test.")
	return cmd.Process.Pid, addr
}

// filtersOf returns the filter kind of every UDP socket of pid bound to addr.
func filtersOf(t *testing.T, pid int, addr netip.AddrPort) []string {
	t.Helper()
	conns, _, err := procsock.Copy(pid, addr)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, c := range conns {
		k, err := procsock.AttachedFilter(c)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
		c.Close()
	}
	return kinds
}

func allKind(kinds []string, want string) bool {
	for _, k := range kinds {
		if k != want {
			return false
		}
	}
	return len(kinds) > 0
}

// floodResult is what a flood and a light client got from the server.
type floodResult struct {
	sent, answered     int
	steady             int // answers in the last two thirds of the flood
	lightSent, lightOK int
}

// flood sends rate spoofed queries per second for dur to dst from 200 sources of
// 127.0.5.0/24, all on one port where a socket counts the answers, while a light
// client on 127.0.0.1 asks ten times, waiting for each answer.
func flood(t *testing.T, dst netip.AddrPort, rate int, dur time.Duration) floodResult {
	t.Helper()
	defer testutil.HoldLive(t)()
	answers, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		t.Fatal(err)
	}
	defer answers.Close()
	srcPort := uint16(answers.LocalAddr().(*net.UDPAddr).Port)
	raw, err := loadgen.NewRawSender(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	payload, err := query("www.example.test.").Pack()
	if err != nil {
		t.Fatal(err)
	}

	var res floodResult
	light := make(chan [2]int)
	go func() {
		c := &dns.Client{Timeout: time.Second}
		sent, ok := 0, 0
		for range 10 {
			sent++
			if r, _, err := c.Exchange(query("example.test."), dst.String()); err == nil && r.Rcode == dns.RcodeSuccess {
				ok++
			}
			time.Sleep(dur / 12)
		}
		light <- [2]int{sent, ok}
	}()
	counted := make(chan [2]int)
	stop := make(chan struct{})
	start := time.Now()
	go func() {
		n, steady := 0, 0
		loadgen.ReadUntil(answers, stop, 300*time.Millisecond, dur+10*time.Second, func([]byte, netip.AddrPort) {
			n++
			if at := time.Since(start); at >= dur/3 && at < dur {
				steady++
			}
		})
		counted <- [2]int{n, steady}
	}()
	for time.Since(start) < dur {
		for due := int(float64(rate)*time.Since(start).Seconds()) - res.sent; due > 0; due-- {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 5, byte(1 + res.sent%200)}), srcPort)
			if err := raw.Send(loadgen.Packet(src, dst, payload)); err != nil {
				t.Fatalf("raw send: %v", err)
			}
			res.sent++
		}
		time.Sleep(2 * time.Millisecond)
	}
	l := <-light
	res.lightSent, res.lightOK = l[0], l[1]
	close(stop)
	c := <-counted
	res.answered, res.steady = c[0], c[1]
	return res
}

// attachScenario attaches to the server pid serves on addr, floods it, detaches and
// floods again.
func attachScenario(t *testing.T, pid int, addr netip.AddrPort, pin string) {
	t.Helper()
	listen := addr.String()
	pidArg := strconv.Itoa(pid)
	code, out, errOut := rrlctl("attach", "-pid", pidArg, "-listen", listen, "-pin", pin,
		"-requests-per-second", strconv.Itoa(attachRPS), "-ipv4-request-levels", "24:1")
	if code != exitOK || !strings.Contains(out, "loaded and attached") {
		t.Fatalf("attach: exit %d: %s%s", code, out, errOut)
	}
	t.Log(strings.TrimSpace(out))
	if kinds := filtersOf(t, pid, addr); !allKind(kinds, procsock.EBPFFilter) {
		t.Fatalf("after attach the server's sockets have filters %v", kinds)
	}

	// Attaching again replaces the filter with itself, and says so.
	code, out, errOut = rrlctl("attach", "-pid", pidArg, "-listen", listen, "-pin", pin)
	if code != exitOK || !strings.Contains(out, "replacing its eBPF filter") || strings.Contains(out, "loaded") {
		t.Fatalf("second attach: exit %d: %s%s", code, out, errOut)
	}

	const dur = 3 * time.Second
	r := flood(t, addr, floodFactor*attachRPS, dur)
	st := statsOf(t, pin)
	t.Logf("attached: sent %d, answered %d (%d in the last two thirds); light client %d/%d; filter saw %d, passed %d",
		r.sent, r.answered, r.steady, r.lightOK, r.lightSent, st.Counters["seen"], st.Counters["passed"])
	// Once the sketch has learnt the flood's rate (the first third), the /24 gets its
	// limit of 50 answers a second, where it sends 1,000.
	if want := attachRPS * dur.Seconds() * 2 / 3; float64(r.steady) < 0.65*want || float64(r.steady) > 1.35*want {
		t.Errorf("the flood got %d answers in the last two thirds of %v, want about %.0f (limit %d/s; %d sent)", r.steady, dur, want, attachRPS, r.sent)
	}
	if r.answered > r.sent/4 {
		t.Errorf("the flood got %d answers of %d sent", r.answered, r.sent)
	}
	if r.lightOK != r.lightSent {
		t.Errorf("the light client got %d of %d answers", r.lightOK, r.lightSent)
	}
	if st.Counters["seen"] < uint64(r.sent) {
		t.Errorf("the pinned filter saw %d packets of %d sent", st.Counters["seen"], r.sent)
	}

	code, out, errOut = rrlctl("detach", "-pid", pidArg, "-listen", listen, "-pin", pin)
	if code != exitOK || !strings.Contains(out, "detached the filter") {
		t.Fatalf("detach: exit %d: %s%s", code, out, errOut)
	}
	if kinds := filtersOf(t, pid, addr); !allKind(kinds, procsock.NoFilter) {
		t.Fatalf("after detach the server's sockets have filters %v", kinds)
	}
	r = flood(t, addr, floodFactor*attachRPS, dur/4)
	t.Logf("detached: sent %d, answered %d; light client %d/%d", r.sent, r.answered, r.lightOK, r.lightSent)
	if float64(r.answered) < 0.9*float64(r.sent) || r.lightOK != r.lightSent {
		t.Errorf("after detach: %d of %d flood queries and %d of %d light ones answered, want (nearly) all",
			r.answered, r.sent, r.lightOK, r.lightSent)
	}
}

// TestAttachNamed: rrlctl attach protects a running BIND 9 named, which never calls
// rrl.Attach, on every socket of its SO_REUSEPORT group; detach gives it back its
// full rate, and -unpin removes the pins.
func TestAttachNamed(t *testing.T) {
	pin := filepath.Join(bpffs(t), "named")
	pid, addr := startNamed(t)
	if n := len(filtersOf(t, pid, addr)); n < 2 {
		t.Fatalf("named has %d UDP socket(s) on %s, want a SO_REUSEPORT group (-n 2)", n, addr)
	}
	attachScenario(t, pid, addr, pin)
	code, out, errOut := rrlctl("detach", "-pid", strconv.Itoa(pid), "-listen", addr.String(), "-pin", pin, "-unpin")
	if code != exitOK || !strings.Contains(out, "no filter on") || !strings.Contains(out, "unpinned") {
		t.Errorf("detach -unpin: exit %d: %s%s", code, out, errOut)
	}
	if _, err := os.Stat(pin); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pin directory after detach -unpin: %v", err)
	}
}

// TestAttachAuthserver: the same for examples/authserver started without its own
// filter; after the server restarts, the same attach command with the new PID
// protects it again with the filter still pinned.
func TestAttachAuthserver(t *testing.T) {
	pin := filepath.Join(bpffs(t), "authserver")
	bin := buildTool(t, "github.com/dnsrake/rrl/examples/authserver", "authserver")
	port := freePort(t)
	pid, addr := startAuthserver(t, bin, port)
	attachScenario(t, pid, addr, pin)

	// A restart: new process, new sockets, no filter. Attaching again reuses the pins.
	syscall.Kill(pid, syscall.SIGTERM)
	// The old server answers until its shutdown closes the socket: start the new one
	// only then, or its readiness check would be answered by the old one.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := procsock.UDP(pid, addr); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still has its socket on %s after SIGTERM", pid, addr)
		}
	}
	pid2, _ := startAuthserver(t, bin, port)
	if kinds := filtersOf(t, pid2, addr); !allKind(kinds, procsock.NoFilter) {
		t.Fatalf("the restarted server's sockets have filters %v", kinds)
	}
	code, out, errOut := rrlctl("attach", "-pid", strconv.Itoa(pid2), "-listen", addr.String(), "-pin", pin)
	if code != exitOK || !strings.Contains(out, "attached the filter pinned in "+pin) || strings.Contains(out, "loaded") {
		t.Fatalf("re-attach: exit %d: %s%s", code, out, errOut)
	}
	if kinds := filtersOf(t, pid2, addr); !allKind(kinds, procsock.EBPFFilter) {
		t.Fatalf("after re-attach the server's sockets have filters %v", kinds)
	}
	if code, out, errOut := rrlctl("set", "-pin", pin, "requests-per-second", "60"); code != exitOK {
		t.Errorf("set on the attached filter: exit %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := rrlctl("detach", "-pid", strconv.Itoa(pid2), "-listen", addr.String(), "-pin", pin, "-unpin"); code != exitOK || !strings.Contains(out, "unpinned") {
		t.Errorf("detach -unpin: exit %d: %s%s", code, out, errOut)
	}
	if kinds := filtersOf(t, pid2, addr); !allKind(kinds, procsock.NoFilter) {
		t.Errorf("after detach the server's sockets have filters %v", kinds)
	}
}

// TestAttachErrors: a wrong PID, no matching socket, a TCP-only listen address and
// no privilege each fail with a clear error, leaving nothing attached or pinned; bad
// usage exits 2.
func TestAttachErrors(t *testing.T) {
	pin := filepath.Join(bpffs(t), "errors")
	bin := buildTool(t, "github.com/dnsrake/rrl/cmd/rrlctl", "rrlctl")

	// This process is the target: a UDP socket on 127.0.0.2 and a TCP listener on
	// 127.0.0.1, both on one port.
	port := freePort(t)
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: int(port)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	tcp, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	tcpOnly := fmt.Sprintf("127.0.0.1:%d", port)
	udpAddr := fmt.Sprintf("127.0.0.2:%d", port)
	free := fmt.Sprintf("127.0.0.1:%d", freePort(t))

	cases := []struct {
		name string
		uid  int // run the built binary as this user; 0: in this process
		args []string
		code int
		want string
	}{
		{"wrong PID", 0, []string{"attach", "-pid", strconv.Itoa(exited.Process.Pid), "-listen", udpAddr}, exitError, "no such process"},
		{"no socket", 0, []string{"attach", "-pid", self, "-listen", free}, exitError, "has no UDP socket bound to " + free},
		{"TCP only", 0, []string{"attach", "-pid", self, "-listen", tcpOnly}, exitError, "only TCP sockets"},
		{"no privilege", 65534, []string{"attach", "-pid", self, "-listen", udpAddr}, exitError, "needs root or CAP_SYS_PTRACE"},
		{"detach, no privilege", 65534, []string{"detach", "-pid", self, "-listen", udpAddr}, exitError, "needs root or CAP_SYS_PTRACE"},
		{"detach, TCP only", 0, []string{"detach", "-pid", self, "-listen", tcpOnly}, exitError, "only TCP sockets"},
		{"no -pid", 0, []string{"attach", "-listen", udpAddr}, exitUsage, "-pid PID is required"},
		{"no -listen", 0, []string{"attach", "-pid", self}, exitUsage, "-listen ADDR:PORT is required"},
		{"port 0", 0, []string{"attach", "-pid", self, "-listen", "127.0.0.1:0"}, exitUsage, "port 0"},
		{"bad address", 0, []string{"detach", "-pid", self, "-listen", "localhost:53"}, exitUsage, "-listen localhost:53"},
		{"bad keyword value", 0, []string{"attach", "-pid", self, "-listen", udpAddr, "-requests-per-second", "lots"}, exitUsage, "requests-per-second"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "-pin", pin)
			var code int
			var out string
			if c.uid == 0 {
				var o, e string
				code, o, e = rrlctl(args...)
				out = o + e
			} else {
				cmd := exec.Command(bin, args...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.uid)}}
				b, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					t.Fatal(err)
				}
				code, out = cmd.ProcessState.ExitCode(), string(b)
			}
			if code != c.code || !strings.Contains(out, c.want) {
				t.Errorf("rrlctl %q: exit %d, want %d with %q; output:\n%s", args, code, c.code, c.want, out)
			}
			if _, err := os.Stat(pin); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the pin directory exists after the failure: %v", err)
			}
			if k, err := procsock.AttachedFilter(udp); err != nil || k != procsock.NoFilter {
				t.Errorf("this process's UDP socket has filter %q (%v)", k, err)
			}
		})
	}
}

func TestDefaultAttachPin(t *testing.T) {
	for _, c := range []struct{ listen, want string }{
		{"127.0.0.1:53", "/sys/fs/bpf/rrl-127_0_0_1-53"},
		{"0.0.0.0:5353", "/sys/fs/bpf/rrl-0_0_0_0-5353"},
		{"[::]:53", "/sys/fs/bpf/rrl-__-53"},
		{"[::ffff:192.0.2.1]:53", "/sys/fs/bpf/rrl-__ffff_192_0_2_1-53"},
		{"[::1]:53", "/sys/fs/bpf/rrl-__1-53"},
		{"[fe80::1%eth0]:53", "/sys/fs/bpf/rrl-fe80__1_eth0-53"},
	} {
		if got := defaultAttachPin(netip.MustParseAddrPort(c.listen)); got != c.want {
			t.Errorf("defaultAttachPin(%s) = %s, want %s", c.listen, got, c.want)
		}
	}
}
