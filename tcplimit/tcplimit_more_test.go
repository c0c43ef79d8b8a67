package tcplimit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsrake/rrl/internal/testutil"
)

func TestTCPLimiterTotal(t *testing.T) {
	// At the total limit a new client is served, and the oldest connection of the
	// client holding the most is reset to make room.
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListenerTotal(inner, 4, 3)
	defer l.Close()
	if l.MaxConns() != 3 {
		t.Fatalf("MaxConns %d", l.MaxConns())
	}
	ch := acceptLoop(l)
	a, b, c := net.IPv4(127, 0, 1, 1), net.IPv4(127, 0, 1, 2), net.IPv4(127, 0, 1, 3)
	ca1 := dialFrom(t, "tcp4", a, l.Addr())
	expectAccepted(t, ch, ca1)
	expectAccepted(t, ch, dialFrom(t, "tcp4", b, l.Addr()))
	expectAccepted(t, ch, dialFrom(t, "tcp4", a, l.Addr()))
	checkStats(t, l, Stats{Accepted: 3, Open: 3, Clients: 2})
	expectAccepted(t, ch, dialFrom(t, "tcp4", c, l.Addr()))
	checkStats(t, l, Stats{Accepted: 4, Open: 3, Clients: 3, Evicted: 1})
	// The evicted one is a's first connection: the client reads a reset.
	ca1.SetReadDeadline(time.Now().Add(answerWait))
	if _, err := ca1.Read(make([]byte, 1)); err == nil || testutil.IsTimeout(err) {
		t.Errorf("a's oldest connection was not reset: %v", err)
	}
	if DefaultConns() < 1 {
		t.Errorf("DefaultConns() = %d", DefaultConns())
	}
	if got := LimitListener(inner, 1).MaxConns(); got != DefaultConns() {
		t.Errorf("LimitListener's total is %d, DefaultConns %d", got, DefaultConns())
	}
}

// descriptorsChildEnv marks the test binary TestTCPLimiterDescriptors starts.
const descriptorsChildEnv = "RRL_TEST_DESCRIPTORS_CHILD"

// descriptorsLimit is the child's RLIMIT_NOFILE: fewer descriptors than the
// connections the test opens.
const descriptorsLimit = 256

func TestTCPLimiterDescriptors(t *testing.T) {
	// 400 connections from 50 addresses to a server whose process may open 256
	// files (run in a child process, which lowers its own limit): with the
	// default total limit the server never runs out of descriptors, a new client
	// is answered within a second, and the server does not spin while the
	// connections are held.
	if os.Getenv(descriptorsChildEnv) == "1" {
		descriptorsChild(t)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestTCPLimiterDescriptors$", "-test.count=1", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), descriptorsChildEnv+"=1", "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 16)
	var out strings.Builder
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "CHILD "); ok {
				lines <- s
			} else {
				out.WriteString(sc.Text() + "\n")
			}
		}
	}()
	ask := func(cmd string) string {
		t.Helper()
		if cmd != "" {
			fmt.Fprintln(stdin, cmd)
		}
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatalf("child exited:\n%s", out.String())
			}
			return s
		case <-time.After(20 * time.Second):
			t.Fatalf("child did not answer %q", cmd)
		}
		return ""
	}
	addr, ok := strings.CutPrefix(ask(""), "ready ")
	if !ok {
		t.Fatal("child not ready")
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 400 {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3, byte(1+i%50))}}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		held = append(held, c)
	}
	time.Sleep(200 * time.Millisecond) // the server takes in the backlog
	cpu0, _ := strconv.ParseInt(ask("usage"), 10, 64)
	start := time.Now()
	time.Sleep(time.Second)
	cpu1, _ := strconv.ParseInt(ask("usage"), 10, 64)
	share := float64(cpu1-cpu0) / float64(time.Since(start))
	t.Logf("server CPU while 400 connections are held: %.1f%%", 100*share)
	if share > 0.2 {
		t.Errorf("the server used %.0f%% of a CPU while the connections were held: it spins", 100*share)
	}

	c := &dns.Client{Net: "tcp", Timeout: time.Second,
		Dialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 4, 1)}}}
	if _, _, err := c.Exchange(query("www.example.test.", dns.TypeA), addr); err != nil {
		t.Errorf("a new client got no TCP answer within a second: %v", err)
	}
	t.Logf("server stats: %s", ask("stats"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v\n%s", err, out.String())
	}
}

// descriptorsChild is the server of TestTCPLimiterDescriptors: it lowers its limit
// on open files, serves DNS over TCP behind LimitListener with the defaults, and
// answers the parent's requests on stdin.
func descriptorsChild(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	rl.Cur = descriptorsLimit
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	l := LimitListener(listenTCP(t), 0)
	testutil.Serve(t, &dns.Server{Listener: l, Handler: answerA,
		ReadTimeout: time.Minute, IdleTimeout: func() time.Duration { return time.Minute }})
	fmt.Printf("CHILD ready %s\n", l.Addr())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "usage":
			var ru syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			fmt.Printf("CHILD %d\n", ru.Utime.Nano()+ru.Stime.Nano())
		case "stats":
			fmt.Printf("CHILD %+v\n", l.Stats())
		}
	}
}
