package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
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

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/testutil"
)

// nodeLimits returns the limit of every level the pinned filter f runs with.
func nodeLimits(t *testing.T, f *rrl.Filter) map[rrl.LimiterNode]float64 {
	t.Helper()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[rrl.LimiterNode]float64{}
	for _, n := range st.Nodes {
		out[n.Node] = n.Limit
	}
	return out
}

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// controlRun is an `rrlctl control` running in this test's process.
type controlRun struct {
	out, errOut testutil.SyncBuffer
	code        chan int // its exit code, when it returns
}

// startControl runs `rrlctl args...` (a control command) in a goroutine.
func startControl(args ...string) *controlRun {
	c := &controlRun{code: make(chan int, 1)}
	go func() { c.code <- run(args, &c.out, &c.errOut) }()
	return c
}

// started fails t unless control says within d that it is controlling.
func (c *controlRun) started(t *testing.T, d time.Duration) {
	t.Helper()
	if !waitFor(d, func() bool { return strings.Contains(c.out.String(), "controlling") }) {
		t.Fatalf("control did not start: %s", c.output())
	}
}

// exit returns control's exit code, failing t when it has not returned within d;
// why says what should have made it return.
func (c *controlRun) exit(t *testing.T, d time.Duration, why string) int {
	t.Helper()
	select {
	case code := <-c.code:
		return code
	case <-time.After(d):
		t.Fatalf("control did not stop %s", why)
		return 0
	}
}

// stop sends this process SIGTERM, as an operator stops control, and returns its
// exit code.
func (c *controlRun) stop(t *testing.T) int {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return c.exit(t, 5*time.Second, "on SIGTERM")
}

// output is what control wrote to its standard output and error.
func (c *controlRun) output() string { return c.out.String() + c.errOut.String() }

// TestControl runs rrlctl control on a pinned filter attached to a real socket of
// this process, whose reader takes 500 queries per second, floods it from many
// loopback sources at about 5,000 per second, and checks that the controller finds
// the overload and puts a water level in force for every process of the pins, that
// rrlctl stats reports it, that a second controller on the same pins is refused,
// and that SIGTERM lifts the level. Without a socket, capacity auto is reported as
// unmeasurable and no level is written.
func TestControl(t *testing.T) {
	root := bpffs(t)
	cases := []struct {
		name     string
		capacity string
		sockets  bool   // -pid and -listen: the controller samples the socket's queue
		problem  string // want this problem reported, and no overload
	}{
		{name: "auto", capacity: "auto", sockets: true},
		{name: "configured", capacity: "1000", sockets: true},
		{name: "auto without socket", capacity: "auto", problem: "no socket"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pin := filepath.Join(root, "rrl"+strconv.Itoa(i))
			if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", tc.capacity); code != exitOK {
				t.Fatalf("load: exit %d: %s%s", code, out, errOut)
			}
			conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetReadBuffer(16 << 10); err != nil {
				t.Fatal(err)
			}
			f, err := rrl.AttachPinned(conn, pin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			static := nodeLimits(t, f)
			dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()

			defer overload(t, conn)()

			args := []string{"control", "-pin", pin, "-interval", "20ms"}
			if tc.sockets {
				args = append(args, "-pid", strconv.Itoa(os.Getpid()), "-listen", dst.String())
			}
			ctl := startControl(args...)
			ctl.started(t, 5*time.Second)
			lifted := func() bool { return mapsEqual(nodeLimits(t, f), static) }
			var capst *rrl.CapacityStats
			read := func() *rrl.CapacityStats {
				st, err := f.Stats()
				if err != nil {
					t.Fatal(err)
				}
				return st.Capacity
			}
			if tc.problem != "" {
				if !waitFor(3*time.Second, func() bool { capst = read(); return capst != nil && strings.Contains(capst.Problem, tc.problem) }) {
					t.Errorf("capacity %+v; want the problem %q", capst, tc.problem)
				}
				time.Sleep(300 * time.Millisecond) // flood on: still no level
				if capst = read(); capst.Overloaded || capst.Level != 0 {
					t.Errorf("capacity %+v without a socket; want no overload", capst)
				}
			} else {
				levelled := func() bool {
					for node, l := range nodeLimits(t, f) {
						if l < static[node] {
							return true
						}
					}
					return false
				}
				if !waitFor(4*time.Second, func() bool { capst = read(); return capst.Overloaded && capst.Level > 0 && levelled() }) {
					t.Fatalf("no water level in force after 4 s of flood: capacity %+v, limits %v (static %v)\n%s", capst, nodeLimits(t, f), static, ctl.output())
				}
				if capst.Problem != "" || capst.Capacity <= 0 || math.IsInf(capst.Capacity, 0) {
					t.Errorf("capacity under overload: %+v", capst)
				}
				if c, so, _ := rrlctl("stats", "-pin", pin); c != exitOK || !strings.Contains(so, "overloaded") {
					t.Errorf("stats during the overload: exit %d:\n%s", c, so)
				}
				if !waitFor(time.Second, func() bool { return strings.Contains(ctl.out.String(), "overload:") }) {
					t.Errorf("control printed no overload: %s", ctl.out.String())
				}
				// rrlctl set writes the settings without the level: the controller
				// follows the new configuration and writes its level again, without
				// putting the old configuration back.
				if c, so, e := rrlctl("set", "-pin", pin, "requests-per-second", "100000"); c != exitOK {
					t.Fatalf("set: exit %d: %s%s", c, so, e)
				}
				belowSet := func() bool {
					for _, l := range nodeLimits(t, f) {
						if l < 10000 {
							return true
						}
					}
					return false
				}
				if !waitFor(2*time.Second, belowSet) {
					t.Errorf("no water level after rrlctl set: limits %v", nodeLimits(t, f))
				}
				if c, so, _ := rrlctl("config", "-pin", pin); c != exitOK || !strings.Contains(so, `"100000"`) {
					t.Errorf("config after the controller wrote its level again: exit %d:\n%s", c, so)
				}
				if tc.capacity != "auto" {
					if c, so, e := rrlctl("set", "-pin", pin, "capacity", "2000"); c != exitOK {
						t.Fatalf("set: exit %d: %s%s", c, so, e)
					}
					// The controller reads the pins' configuration at its next sample; a
					// busy machine delays the test's -race process, not the outcome.
					if !waitFor(5*time.Second, func() bool { capst = read(); return capst.Capacity == 2000 }) {
						t.Errorf("capacity after rrlctl set capacity 2000: %+v", capst)
					}
				}
				// The limits come back to those of requests-per-second 100000.
				lifted = func() bool { return !belowSet() }
			}
			// One controller per pin directory.
			if c, _, e := rrlctl("control", "-pin", pin); c != exitError || !strings.Contains(e, fmt.Sprintf("process %d runs the controller", os.Getpid())) {
				t.Errorf("second control: exit %d: %s", c, e)
			}

			if c := ctl.stop(t); c != exitOK || !strings.Contains(ctl.out.String(), "stopped: the water level is lifted") {
				t.Errorf("control after SIGTERM: exit %d: %s", c, ctl.output())
			}
			// The flood goes on, and the static limits are back.
			if !lifted() {
				t.Errorf("limits after control stopped: %v; want the static ones (before: %v)", nodeLimits(t, f), static)
			}
			if capst = read(); capst.Overloaded || capst.Level != 0 || !strings.Contains(capst.Problem, "no controller runs") {
				t.Errorf("capacity after control stopped: %+v", capst)
			}
		})
	}
}

// overload makes conn's server slower than its traffic until the returned function
// is called: a reader takes one query every 2 ms (500 per second) while 25 queries
// arrive every 5 ms (5,000 per second) from 400 addresses in four /24s, for at most
// 6 s.
func overload(t *testing.T, conn *net.UDPConn) (stop func()) {
	release := testutil.HoldLive(t)
	dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 512)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			conn.SetReadDeadline(time.Now().Add(time.Millisecond))
			conn.ReadFromUDPAddrPort(buf)
		}
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < 1200; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 9, byte(i % 4), byte(1 + i%100)}), 40000)
			sendQueries(t, src, dst, 25)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait(); release() }) }
}

func mapsEqual[K comparable](a, b map[K]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The test binary runs as rrlctl, or as a server of a pinned filter, when these are
// set, so that tests can kill an rrlctl or a server process.
const (
	childArgsEnv  = "RRLCTL_TEST_ARGS"  // rrlctl's arguments, separated by \x1f
	childServeEnv = "RRLCTL_TEST_SERVE" // a pin directory: serve a socket through it
)

func TestMain(m *testing.M) {
	if args := os.Getenv(childArgsEnv); args != "" {
		os.Exit(run(strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
	}
	if pin := os.Getenv(childServeEnv); pin != "" {
		os.Exit(servePinned(pin))
	}
	// The package's floods (overload, flood, TestTopLimitedGroups) hold the
	// live-test lock while they run, which keeps them apart from another
	// package's capacity measurements (testutil.HoldLive).
	os.Exit(m.Run())
}

// servePinned is a server process: a loopback UDP socket with the filter pinned in
// pin, its address on stdout, never read, until stdin closes. A line "reopen" on
// stdin makes it close the socket and bind the same address again, as a server's
// reload does, within 2 s ("reopened ADDR", or "rebind failed"), and a line
// "attach" attach the filter to the new socket ("attached").
func servePinned(pin string) int {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := rrl.AttachPinned(conn, pin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(conn.LocalAddr())
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		switch lines.Text() {
		case "reopen":
			addr := conn.LocalAddr().(*net.UDPAddr)
			f.Close()
			conn.Close()
			// A copy of the socket in another process keeps its address bound.
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if conn, err = net.ListenUDP("udp4", addr); err == nil {
					fmt.Println("reopened", conn.LocalAddr())
					break
				}
				if time.Now().After(deadline) {
					fmt.Println("rebind failed:", err)
					return 1
				}
			}
		case "attach":
			if f, err = rrl.AttachPinned(conn, pin); err != nil {
				fmt.Println("attach failed:", err)
				return 1
			}
			fmt.Println("attached")
		}
	}
	f.Close()
	return 0
}

// servePinnedChild starts servePinned in a child process on the pins in pin and
// returns it, its output and its address once it serves.
func servePinnedChild(t *testing.T, pin string, stdin io.Reader) (*exec.Cmd, *testutil.SyncBuffer, netip.AddrPort) {
	t.Helper()
	srv, out := child(t, childServeEnv+"="+pin, stdin)
	var addr netip.AddrPort
	if !waitFor(5*time.Second, func() bool {
		var err error
		addr, err = netip.ParseAddrPort(strings.TrimSpace(out.String()))
		return err == nil
	}) {
		t.Fatalf("server did not start: %s", out.String())
	}
	return srv, out, addr
}

// child starts the test binary with env set, and kills it at cleanup.
func child(t *testing.T, env string, stdin io.Reader) (*exec.Cmd, *testutil.SyncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr, cmd.Stdin = out, out, stdin
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out
}

// pinnedSocket loads a filter with capacity into a new pin directory under root
// and attaches it to a loopback socket of this process.
func pinnedSocket(t *testing.T, pin, capacity string) (*net.UDPConn, *rrl.Filter, map[rrl.LimiterNode]float64) {
	t.Helper()
	if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", capacity); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	f, err := rrl.AttachPinned(conn, pin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return conn, f, nodeLimits(t, f)
}

// levelled reports whether some level of f runs below its static limit.
func levelled(t *testing.T, f *rrl.Filter, static map[rrl.LimiterNode]float64) bool {
	for node, l := range nodeLimits(t, f) {
		if l < static[node] {
			return true
		}
	}
	return false
}

// TestControlKilled kills rrlctl control (SIGKILL) while its water level is in
// force: the level stays, stats says that the controller died without lifting it,
// and the next control lifts it as it starts.
func TestControlKilled(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	conn, f, static := pinnedSocket(t, pin, "1000")
	dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	stopFlood := overload(t, conn)
	defer stopFlood()
	ctl, ctlOut := child(t, childArgsEnv+"="+strings.Join([]string{"control", "-pin", pin, "-pid", strconv.Itoa(os.Getpid()), "-listen", dst.String()}, "\x1f"), nil)
	if !waitFor(5*time.Second, func() bool { return levelled(t, f, static) }) {
		t.Fatalf("no water level in force after 5 s of flood; control:\n%s", ctlOut.String())
	}
	ctl.Process.Kill()
	ctl.Wait()
	stopFlood()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Capacity; c == nil || c.Level <= 0 || !strings.Contains(c.Problem, fmt.Sprintf("(pid %d) died", ctl.Process.Pid)) || !strings.Contains(c.Problem, "without lifting") {
		t.Errorf("capacity after control was killed: %+v", c)
	}
	if !levelled(t, f, static) {
		t.Errorf("the level of the killed controller is gone: %v", nodeLimits(t, f))
	}
	if c, so, _ := rrlctl("stats", "-pin", pin); c != exitOK || !strings.Contains(so, "without lifting its water level") {
		t.Errorf("stats after control was killed: exit %d:\n%s", c, so)
	}

	// The next controller lifts it as it starts (the flood is over, so no new one).
	next := startControl("control", "-pin", pin, "-pid", strconv.Itoa(os.Getpid()), "-listen", dst.String())
	if !waitFor(2*time.Second, func() bool { return !levelled(t, f, static) }) {
		t.Errorf("the next control left the level in force: %v\n%s", nodeLimits(t, f), next.output())
	}
	next.started(t, 2*time.Second)
	if c := next.stop(t); c != exitOK {
		t.Errorf("control after SIGTERM: exit %d: %s", c, next.output())
	}
}

// TestControlTargetExits: control watches another process's socket, and exits,
// lifting its level and closing its copies of the socket, when that process exits.
func TestControlTargetExits(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", "auto"); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	stdin, closeStdin := io.Pipe()
	srv, _, addr := servePinnedChild(t, pin, stdin)
	ctl := startControl("control", "-pin", pin, "-pid", strconv.Itoa(srv.Process.Pid), "-listen", addr.String())
	ctl.started(t, 5*time.Second)
	closeStdin.Close() // the server exits
	srv.Wait()
	if c := ctl.exit(t, 5*time.Second, "when its server exited"); c != exitError || !strings.Contains(ctl.errOut.String(), fmt.Sprintf("process %d exited", srv.Process.Pid)) {
		t.Errorf("control after its server exited: exit %d: %s", c, ctl.output())
	}
	// Its copies are closed: the port is free again.
	if c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr)); err != nil {
		t.Errorf("the server's port is still taken after control exited: %v", err)
	} else {
		c.Close()
	}
	if f, err := rrl.OpenPinned(pin); err != nil {
		t.Error(err)
	} else {
		st, _ := f.Stats()
		if st.Capacity == nil || !strings.Contains(st.Capacity.Problem, "no controller runs") {
			t.Errorf("capacity after control exited: %+v", st.Capacity)
		}
		f.Close()
	}
}

// TestControlSocketsChange: the server control watches closes its socket and binds
// the address again (a reload); control lets go of its copy of the old socket, so
// that the address can be bound again, reports the new one while it has no filter,
// and samples it once the server attaches the filter.
func TestControlSocketsChange(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", "auto"); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	stdin, input := io.Pipe()
	defer input.Close()
	srv, srvOut, addr := servePinnedChild(t, pin, stdin)
	ctl := startControl("control", "-pin", pin, "-pid", strconv.Itoa(srv.Process.Pid), "-listen", addr.String(), "-interval", "20ms")
	ctl.started(t, 5*time.Second)
	fmt.Fprintln(input, "reopen")
	if !waitFor(3*time.Second, func() bool {
		return strings.Contains(srvOut.String(), "reopened") || strings.Contains(srvOut.String(), "failed")
	}) ||
		!strings.Contains(srvOut.String(), "reopened "+addr.String()) {
		t.Fatalf("the server could not bind its address again: %s\ncontrol: %s", srvOut.String(), ctl.output())
	}
	// The new socket has no filter yet: reported, not sampled, and taken once the
	// server attaches the filter.
	bare := fmt.Sprintf("the sockets of process %d changed: now no socket", srv.Process.Pid)
	if !waitFor(3*time.Second, func() bool {
		return strings.Contains(ctl.out.String(), bare) && strings.Contains(ctl.errOut.String(), "no eBPF filter")
	}) {
		t.Errorf("control did not report the new socket without the filter: %s", ctl.output())
	}
	fmt.Fprintln(input, "attach")
	want := fmt.Sprintf("the sockets of process %d changed: now 1 socket(s)", srv.Process.Pid)
	if !waitFor(3*time.Second, func() bool { return strings.Contains(ctl.out.String(), want) }) {
		t.Errorf("control did not take the new socket: %s\nserver: %s", ctl.output(), srvOut.String())
	}
	if c := ctl.stop(t); c != exitOK {
		t.Errorf("control after SIGTERM: exit %d: %s", c, ctl.output())
	}
}
