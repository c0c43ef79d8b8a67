package rrl

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The pinned-filter tests load and pin as root in a private bpffs that the test
// mounts and unmounts, and attach from child processes (this test binary, re-run
// as TestPinnedHelperProcess) running as uid 65534 without capabilities.

const nobody = 65534

// pinEnv is a private bpffs mount inside a 0755 directory that other users can
// traverse, with a copy of the test binary that they can execute.
type pinEnv struct {
	base, mnt, bin string
}

func newPinEnv(t testing.TB) *pinEnv { return newPinEnvMode(t, "0755") }

// newPinEnvMode is newPinEnv with the bpffs root given mode (octal, e.g. "1777",
// the kernel's default).
func newPinEnvMode(t testing.TB, mode string) *pinEnv {
	t.Helper()
	requireBPF(t)
	base, err := os.MkdirTemp("", "rrl-pin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(base, "bpf")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode="+mode); err != nil {
		t.Fatalf("mount bpffs on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return &pinEnv{base: base, mnt: mnt}
}

// binary returns a copy of the test binary that any user may run.
func (e *pinEnv) binary(t *testing.T) string {
	t.Helper()
	if e.bin != "" {
		return e.bin
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	e.bin = filepath.Join(e.base, "rrl.test")
	dst, err := os.OpenFile(e.bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return e.bin
}

// helperResult is what a helper process reports as its last line.
type helperResult struct {
	Err                          string
	NotPermitted, Layout, Exists bool
	CapEff                       string
	UID                          int
	Received, Steady             int
	Seen, Passed, Limited        uint64
	Mode                         string
	UpdateErr                    string
	UpdateNotPermitted           bool
	CloseErr                     string
	// names mode (pinNamesServe): per existing name, how many queries the
	// server answered and when it first did (Unix ns); random names answered,
	// in all and in the window.
	Known                map[string]int
	KnownFirst           map[string]int64
	Random, RandomSteady int
}

// TestPinnedHelperProcess is the child side of the pinned-filter tests: it acts only
// when RRL_PIN_HELPER is set, as the tests do when they re-run this binary.
//
//	probe: AttachPinned a fresh socket, then Stats, Update with its own Config, Close.
//	serve: as probe, but first print "READY port" and count the datagrams received
//	       until stdin closes; stdin's first line "WINDOW from to" (Unix ns) is the
//	       steady-state window whose receptions count in Steady.
//	names: serve DNS (namesZoneHandler) with a Protection on the pins until stdin
//	       closes, as serve does (pinNamesServe).
func TestPinnedHelperProcess(t *testing.T) {
	mode := os.Getenv("RRL_PIN_HELPER")
	if mode == "" {
		t.Skip("helper process for the pinned-filter tests; runs only when re-executed by them")
	}
	res := pinHelper(mode, os.Getenv("RRL_PIN_DIR"), os.Getenv("RRL_PIN_PORT"))
	b, _ := json.Marshal(res)
	fmt.Printf("RESULT %s\n", b)
	os.Exit(0)
}

func pinHelper(mode, dir, port string) (res helperResult) {
	res.UID = os.Getuid()
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.Lines(string(status)) {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				res.CapEff = strings.TrimSpace(v)
			}
		}
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = errors.Join(
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1),
				// Unprivileged: SO_RCVBUF, bounded by net.core.rmem_max.
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20),
				// Arrival times from the kernel, so that a late read does not
				// move a datagram into the steady window.
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1))
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "127.0.0.1:"+port)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	conn := pc.(*net.UDPConn)
	defer conn.Close()
	if mode == "names" {
		return pinNamesServe(conn, dir, res)
	}
	f, err := AttachPinned(conn, dir)
	if err != nil {
		res.Err = err.Error()
		res.NotPermitted = errors.Is(err, ErrNotPermitted)
		res.Layout = errors.Is(err, ErrLayoutMismatch)
		return res
	}
	res.Mode = f.Mode().String()
	if mode == "serve" {
		fmt.Printf("READY %d\n", conn.LocalAddr().(*net.UDPAddr).Port)
		var from, to int64
		stdin := bufio.NewScanner(os.Stdin)
		if stdin.Scan() {
			fmt.Sscanf(stdin.Text(), "WINDOW %d %d", &from, &to)
		}
		done := make(chan struct{})
		go func() {
			for stdin.Scan() {
			}
			close(done)
		}()
		buf, oob := make([]byte, 2048), make([]byte, 128)
		stopped := false
		for {
			select {
			case <-done:
				stopped = true
			default:
			}
			conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, oobn, _, _, err := conn.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				if stopped {
					break
				}
				continue
			}
			res.Received++
			if at := arrival(oob[:oobn]); at >= from && at < to {
				res.Steady++
			}
		}
	}
	if st, err := f.Stats(); err != nil {
		res.Err = err.Error()
	} else {
		res.Seen, res.Passed = st.Seen, st.Passed
		for _, n := range st.Nodes {
			res.Limited += n.Limited
		}
	}
	if err := f.Update(f.Config()); err != nil {
		res.UpdateErr = err.Error()
		res.UpdateNotPermitted = errors.Is(err, ErrNotPermitted)
	}
	if err := f.Close(); err != nil {
		res.CloseErr = err.Error()
	}
	return res
}

// arrival returns the kernel's receive time (Unix ns) from a datagram's control
// messages, or now when there is none.
func arrival(oob []byte) int64 {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMPNS {
			continue
		}
		// A struct timespec of two longs.
		switch len(m.Data) {
		case 16:
			return int64(binary.NativeEndian.Uint64(m.Data))*1e9 + int64(binary.NativeEndian.Uint64(m.Data[8:]))
		case 8:
			return int64(binary.NativeEndian.Uint32(m.Data))*1e9 + int64(binary.NativeEndian.Uint32(m.Data[4:]))
		}
	}
	return time.Now().UnixNano()
}

// child is a running helper process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	port  int
}

func (e *pinEnv) start(t *testing.T, mode, dir string, uid, gid, port int) *child {
	t.Helper()
	cmd := exec.Command(e.binary(t), "-test.run=^TestPinnedHelperProcess$")
	cmd.Env = append(os.Environ(), "RRL_PIN_HELPER="+mode, "RRL_PIN_DIR="+dir, "RRL_PIN_PORT="+strconv.Itoa(port))
	// Changing to a non-zero uid clears the capability sets: the child has none.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Stderr = os.Stderr
	cmd.Dir = e.base
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
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	if mode == "serve" || mode == "names" {
		for c.out.Scan() {
			if _, err := fmt.Sscanf(c.out.Text(), "READY %d", &c.port); err == nil {
				return c
			}
			if strings.HasPrefix(c.out.Text(), "RESULT ") {
				t.Fatalf("helper failed before serving: %s", c.out.Text())
			}
		}
		t.Fatalf("helper exited without READY")
	}
	return c
}

// result waits for the helper's RESULT line.
func (c *child) result(t *testing.T) helperResult {
	t.Helper()
	c.stdin.Close()
	for c.out.Scan() {
		if js, ok := strings.CutPrefix(c.out.Text(), "RESULT "); ok {
			var r helperResult
			if err := json.Unmarshal([]byte(js), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("helper exited without a result (%v)", c.cmd.Wait())
	return helperResult{}
}

// flood sends 10,000 queries per second for dur from 40 sources of one /24, each
// far below the per-address limit, to dst: only the /24 level can limit it. It tells
// every server the steady window, from 1.5 s to dur.
func flood(t *testing.T, dst netip.AddrPort, dur time.Duration, servers ...*child) {
	t.Helper()
	start := time.Now()
	for _, s := range servers {
		fmt.Fprintf(s.stdin, "WINDOW %d %d\n", start.Add(1500*time.Millisecond).UnixNano(), start.Add(dur).UnixNano())
	}
	raw := newRawSender(t, dst)
	sent := 0
	for time.Since(start) < dur {
		for due := int(10000*time.Since(start).Seconds()) - sent; due > 0; due-- {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 6, 6, byte(1 + sent%40)}), uint16(40000+sent%40))
			raw.send(t, ipv4Packet(src, dst, nil, dnsQuery(uint16(sent), false)))
			sent++
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// attachPinnedServer attaches the filter pinned in dir to a new UDP server on
// loopback; the Filter is closed when t ends.
func attachPinnedServer(t *testing.T, dir string) (*udpServer, *Filter) {
	t.Helper()
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err := AttachPinned(srv.conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return srv, f
}

func loadPinnedForTest(t *testing.T, dir, rps string, uid, gid int) {
	t.Helper()
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", rps); err != nil {
		t.Fatal(err)
	}
	if err := LoadPinned(cfg, dir, uid, gid); err != nil {
		t.Fatalf("LoadPinned: %v", err)
	}
}

// TestPinnedUnprivilegedAttach: root loads and pins for group 65534; a process running
// as 65534 without capabilities attaches, and a flood from one /24 reaches it at the
// /24's limit; its Update works (its group may write the settings), its Close leaves
// the pins, and root sees the limiting through the pins.
func TestPinnedUnprivilegedAttach(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", nobody, nobody)

	checkPinAccess(t, dir, nobody)

	srv := e.start(t, "serve", dir, nobody, nobody, 0)
	const dur = 3 * time.Second
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(srv.port))
	flood(t, dst, dur, srv)
	r := srv.result(t)
	t.Logf("child: %+v", r)
	if r.Err != "" {
		t.Fatalf("child: %s", r.Err)
	}
	if r.UID != nobody || r.CapEff != "0000000000000000" {
		t.Errorf("child ran as uid %d with capabilities %s, want %d and none", r.UID, r.CapEff, nobody)
	}
	if rate := float64(r.Steady) / 1.5; !within(rate, 500, 0.10) {
		t.Errorf("unprivileged server received %.0f pps from the /24, want 500 ±10%%", rate)
	}
	if r.Mode != "ebpf" || r.Limited == 0 || uint64(r.Received) != r.Passed {
		t.Errorf("child: mode %s, limited %d, passed %d, received %d", r.Mode, r.Limited, r.Passed, r.Received)
	}
	if r.UpdateErr != "" || r.CloseErr != "" {
		t.Errorf("child Update: %q, Close: %q", r.UpdateErr, r.CloseErr)
	}

	// The child has closed its filter: the pins and their counters remain.
	f, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stats()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var limited24 uint64
	for _, n := range st.Nodes {
		if n.Node.String() == "ipv4/24" {
			limited24 = n.Limited
		}
	}
	if st.Seen < 20000 || limited24 == 0 || st.Passed != r.Passed {
		t.Errorf("stats through the pins: %+v; want the flood seen and limited at ipv4/24, %d passed", st, r.Passed)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("pin directory left after Unpin: %v", err)
	}
}

// TestPinnedSharedLimit: two unprivileged processes, each with its own SO_REUSEPORT
// socket on one port, attach the same pins and hold one limit together.
func TestPinnedSharedLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", nobody, nobody)
	a := e.start(t, "serve", dir, nobody, nobody, 0)
	b := e.start(t, "serve", dir, nobody, nobody, a.port)
	if b.port != a.port {
		t.Fatalf("second server on port %d, want %d", b.port, a.port)
	}
	const dur = 3 * time.Second
	flood(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(a.port)), dur, a, b)
	ra, rb := a.result(t), b.result(t)
	t.Logf("a: %+v\nb: %+v", ra, rb)
	if ra.Err != "" || rb.Err != "" {
		t.Fatalf("children: %q, %q", ra.Err, rb.Err)
	}
	if ra.Received == 0 || rb.Received == 0 {
		t.Errorf("traffic did not spread over both processes: %d, %d", ra.Received, rb.Received)
	}
	if rate := float64(ra.Steady+rb.Steady) / 1.5; !within(rate, 500, 0.10) {
		t.Errorf("two processes together received %.0f pps from the /24, want one shared limit of 500 ±10%%", rate)
	}
}

// TestPinnedPermissions: a user that is neither owner nor group member is refused
// with an error naming the pin and the user; an owner whose settings pin was made
// read-only still attaches and reads statistics, and Update says why it cannot.
func TestPinnedPermissions(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", nobody, nobody)

	other := e.start(t, "probe", dir, nobody-1, nobody-1, 0).result(t)
	t.Logf("stranger: %s", other.Err)
	if !other.NotPermitted || !strings.Contains(other.Err, filepath.Join(dir, "rrl_")) || !strings.Contains(other.Err, "uid 65533") {
		t.Errorf("stranger: %+v; want ErrNotPermitted naming a pin and uid 65533", other)
	}

	settings := filepath.Join(dir, pinSettings)
	if err := os.Chmod(settings, 0o440); err != nil {
		t.Fatal(err)
	}
	ro := e.start(t, "probe", dir, nobody, nobody, 0).result(t)
	t.Logf("read-only owner: %s", ro.UpdateErr)
	if ro.Err != "" || ro.Mode != "ebpf" {
		t.Fatalf("owner with a read-only settings pin: %+v", ro)
	}
	if !ro.UpdateNotPermitted || !strings.Contains(ro.UpdateErr, settings) || !strings.Contains(ro.UpdateErr, "uid 65534") {
		t.Errorf("Update with read-only settings: %q (ErrNotPermitted %v), want a permission error naming %s and the uid", ro.UpdateErr, ro.UpdateNotPermitted, settings)
	}
}

// checkPinAccess fails t unless dir and every pin in it are owned by root and group
// gid with exactly the layout's modes, and dir holds nothing but the pins.
func checkPinAccess(t *testing.T, dir string, gid uint32) {
	t.Helper()
	want := map[string]os.FileMode{".": 0o750}
	for name, mode := range pinModes {
		want[name] = mode
	}
	if unprivilegedBPF() {
		want[pinCookieSecrets] = 0o200 // root's alone on such a kernel
	}
	for name, mode := range want {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != mode || fi.Mode()&(fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid) != 0 || st.Uid != 0 || st.Gid != gid {
			t.Errorf("%s: mode %s uid %d gid %d, want %04o, owner 0 and group %d", name, fi.Mode(), st.Uid, st.Gid, mode, gid)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	if wantNames := slices.Sorted(maps.Keys(pinModes)); !slices.Equal(names, wantNames) {
		t.Errorf("pin directory holds %q, want %q", names, wantNames)
	}
}

// childQueries and childResponses are what TestPinnedAccessUnprivilegedChild sends
// to its own socket.
const childQueries, childResponses = 10, 3

// TestPinnedAccessUnprivileged: root loads the pins for group 65534, and a process of
// that group (uid 65534, no capabilities) tries every way its uid allows to read the
// cookie secrets, to write the maps only the kernel writes, and to take the pins
// over (TestPinnedAccessUnprivilegedChild): all are refused, while attaching the
// filter to its own socket and reconfiguring it work, and the filter judges its
// packets. Afterwards the pins are as root made them. The server's uid outside the
// group gets nothing: no pin is its own.
func TestPinnedAccessUnprivileged(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", nobody, nobody)
	checkPinAccess(t, dir, nobody)
	root, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	before, err := root.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out, err := unprivilegedRun(t, "TestPinnedAccessUnprivilegedChild", "RRL_PIN_ACCESS_DIR="+dir)
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	checkPinAccess(t, dir, nobody)
	after, err := root.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if seen, passed := after.Seen-before.Seen, after.Passed-before.Passed; seen != childQueries+childResponses || passed != childQueries {
		t.Errorf("through root's descriptors the child's traffic shows as %d seen, %d passed; want %d and %d",
			seen, passed, childQueries+childResponses, childQueries)
	}

	stranger := e.start(t, "probe", dir, nobody, nobody-1, 0).result(t)
	t.Logf("uid %d outside group %d: %s", nobody, nobody, stranger.Err)
	if !stranger.NotPermitted || stranger.Mode != "" {
		t.Errorf("uid %d in group %d: %+v; want ErrNotPermitted", nobody, nobody-1, stranger)
	}
}

// errAny stands for any error in TestPinnedAccessUnprivilegedChild's table.
var errAny = errors.New("any error")

// TestPinnedAccessUnprivilegedChild is the unprivileged side of
// TestPinnedAccessUnprivileged.
func TestPinnedAccessUnprivilegedChild(t *testing.T) {
	dir := os.Getenv("RRL_PIN_ACCESS_DIR")
	if !isUnprivilegedChild() || dir == "" {
		t.Skip("child of TestPinnedAccessUnprivileged")
	}
	checkUnprivileged(t)
	pin := func(name string) string { return filepath.Join(dir, name) }
	secrets := pin(pinCookieSecrets)
	openMap := func(name string, opts *ebpf.LoadPinOptions, then func(m *ebpf.Map) error) func() error {
		return func() error {
			m, err := ebpf.LoadPinnedMap(pin(name), opts)
			if err != nil {
				return err
			}
			defer m.Close()
			if then == nil {
				return nil
			}
			return then(m)
		}
	}
	ro, wo := &ebpf.LoadPinOptions{ReadOnly: true}, &ebpf.LoadPinOptions{WriteOnly: true}
	// Where unprivileged BPF is enabled the secrets are root's alone, so even the
	// write-only opening is refused, and a map of one's own can be made.
	viaWriteOnly, ownMap := error(unix.EPERM), error(unix.EPERM)
	if unprivilegedBPF() {
		viaWriteOnly, ownMap = unix.EACCES, nil
	}
	cmd := func(c int) func(m *ebpf.Map) error { return func(m *ebpf.Map) error { return bpfMapCmd(m, c) } }
	steps := []struct {
		name string
		do   func() error
		want error
	}{
		// The secrets: write-only for the group, by every route.
		{"open the secrets to read", openMap(pinCookieSecrets, ro, nil), unix.EACCES},
		{"open the secrets to read and write", openMap(pinCookieSecrets, nil, nil), unix.EACCES},
		{"look the secrets up through a write-only descriptor", openMap(pinCookieSecrets, wo, cmd(unix.BPF_MAP_LOOKUP_ELEM)), viaWriteOnly},
		{"walk the secrets' keys through a write-only descriptor", openMap(pinCookieSecrets, wo, cmd(unix.BPF_MAP_GET_NEXT_KEY)), viaWriteOnly},
		{"mmap the secrets", openMap(pinCookieSecrets, wo, func(m *ebpf.Map) error {
			b, err := unix.Mmap(m.FD(), 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
			if err == nil {
				unix.Munmap(b)
			}
			return err
		}), errAny},
		{"open the program's maps by ID", func() error {
			prog, err := ebpf.LoadPinnedProgram(pin(pinProgram), ro)
			if err != nil {
				return err
			}
			defer prog.Close()
			info, err := prog.Info()
			if err != nil {
				return err
			}
			ids, ok := info.MapIDs()
			if !ok || len(ids) == 0 {
				return fmt.Errorf("the program's map IDs are not available: %w", unix.ENODATA)
			}
			var errs []error
			for _, id := range ids {
				m, err := ebpf.NewMapFromID(id)
				if err == nil {
					m.Close()
					return fmt.Errorf("opened map %d by ID", id)
				}
				if !errors.Is(err, unix.EPERM) {
					errs = append(errs, err)
				}
			}
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			return unix.EPERM
		}, unix.EPERM},
		{"create a map of its own", func() error {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
			if err == nil {
				m.Close()
			}
			return err
		}, ownMap},
		{"chmod the secrets", func() error { return os.Chmod(secrets, 0o660) }, unix.EPERM},
		{"chown the secrets", func() error { return os.Chown(secrets, os.Getuid(), -1) }, unix.EPERM},

		// What only the kernel writes.
		{"open the counters to write", openMap(pinCounters, nil, nil), unix.EACCES},
		{"write the counters", openMap(pinCounters, ro, cmd(unix.BPF_MAP_UPDATE_ELEM)), unix.EPERM},
		{"chmod the counters", func() error { return os.Chmod(pin(pinCounters), 0o660) }, unix.EPERM},
		{"open the sketches to write", openMap(pinCells, nil, nil), unix.EACCES},
		{"write the sketches", openMap(pinCells, ro, cmd(unix.BPF_MAP_UPDATE_ELEM)), unix.EPERM},
		{"chmod the sketches", func() error { return os.Chmod(pin(pinCells), 0o660) }, unix.EPERM},
		{"open the limited groups to write", openMap(pinLimited, nil, nil), unix.EACCES},
		{"write the limited groups", openMap(pinLimited, ro, cmd(unix.BPF_MAP_UPDATE_ELEM)), unix.EPERM},
		{"delete from the limited groups", openMap(pinLimited, ro, cmd(unix.BPF_MAP_DELETE_ELEM)), unix.EPERM},
		{"chmod the limited groups", func() error { return os.Chmod(pin(pinLimited), 0o660) }, unix.EPERM},
		{"open the program to write", func() error {
			p, err := ebpf.LoadPinnedProgram(pin(pinProgram), nil)
			if err == nil {
				p.Close()
			}
			return err
		}, unix.EACCES},
		{"chmod the program", func() error { return os.Chmod(pin(pinProgram), 0o660) }, unix.EPERM},
		{"chmod the settings", func() error { return os.Chmod(pin(pinSettings), 0o666) }, unix.EPERM},

		// The directory: no pin can be removed, moved or replaced.
		{"unlink the secrets", func() error { return os.Remove(secrets) }, unix.EACCES},
		{"rename the settings", func() error { return os.Rename(pin(pinSettings), pin("moved")) }, unix.EACCES},
		{"rename the program over the config", func() error { return os.Rename(pin(pinProgram), pin(pinConfig)) }, unix.EACCES},
		{"add a symlink", func() error { return os.Symlink("/tmp", pin("rrl_evil")) }, unix.EACCES},
		{"add a directory", func() error { return os.Mkdir(pin("sub"), 0o700) }, unix.EACCES},
		{"chmod the pin directory", func() error { return os.Chmod(dir, 0o770) }, unix.EPERM},
		{"rename the pin directory", func() error { return os.Rename(dir, dir+"-moved") }, unix.EACCES},
	}
	for _, s := range steps {
		if s.want == nil {
			continue // allowed on this kernel
		}
		err := s.do()
		switch {
		case err == nil:
			t.Errorf("%s: done; want it refused", s.name)
		case s.want != errAny && !errors.Is(err, s.want):
			t.Errorf("%s: %v; want %v", s.name, err, s.want)
		default:
			t.Logf("%s: refused: %v", s.name, err)
		}
	}

	// What the group is for: attach to its own socket and reconfigure.
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := AttachPinned(conn, dir)
	if err != nil {
		t.Fatalf("AttachPinned as a member of the group: %v", err)
	}
	defer f.Close()
	if err := f.Update(f.Config()); err != nil {
		t.Errorf("Update as a member of the group: %v", err)
	}
	before, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for i := range childQueries + childResponses {
		q := dnsQuery(uint16(i), false)
		if i >= childQueries {
			q = qr(q) // reflected responses, which the filter drops
		}
		if _, err := client.Write(q); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	buf := make([]byte, 2048)
	for {
		// Every query within a second; then nothing more (the responses were dropped).
		wait := time.Second
		if got == childQueries {
			wait = 200 * time.Millisecond
		}
		conn.SetReadDeadline(time.Now().Add(wait))
		n, err := conn.Read(buf)
		if err != nil {
			break
		}
		if buf[2]&0x80 != 0 {
			t.Errorf("a response (id %d) reached the socket", binary.BigEndian.Uint16(buf[:n]))
		}
		got++
	}
	after, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	seen, passed, responses := after.Seen-before.Seen, after.Passed-before.Passed, after.DroppedResponse-before.DroppedResponse
	t.Logf("received %d; filter: seen %d, passed %d, dropped responses %d", got, seen, passed, responses)
	if got != childQueries || seen != childQueries+childResponses || passed != childQueries || responses != childResponses {
		t.Errorf("received %d queries, filter saw %d, passed %d, dropped %d responses; want %d, %d, %d, %d",
			got, seen, passed, responses, childQueries, childQueries+childResponses, childQueries, childResponses)
	}
}

// bpfMapCmd issues map command c of bpf(2) on m with zeroed key and value buffers,
// bypassing the library's own checks so that the kernel decides.
func bpfMapCmd(m *ebpf.Map, c int) error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	key := make([]byte, max(m.KeySize(), 1))
	val := make([]byte, max((int(m.ValueSize())+7)&^7*ncpu, len(key)))
	attr := struct {
		fd         uint32
		_          uint32
		key, value uint64 // value: next_key for BPF_MAP_GET_NEXT_KEY
		flags      uint64
	}{fd: uint32(m.FD()), key: uint64(uintptr(unsafe.Pointer(&key[0]))), value: uint64(uintptr(unsafe.Pointer(&val[0])))}
	if c == unix.BPF_MAP_DELETE_ELEM {
		attr.value = 0 // the kernel refuses (EINVAL) fields a command does not take
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(c), uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(key)
	runtime.KeepAlive(val)
	if errno != 0 {
		return errno
	}
	return nil
}

// TestLoadPinnedUnsafeDir: LoadPinned refuses a pin directory that anyone but root
// could change, or one below such a directory on bpffs (through a symlink too),
// pins nothing and removes a directory it created; directories only root can
// change, sticky ones above the pin directory among them, are accepted and left as
// they were.
func TestLoadPinnedUnsafeDir(t *testing.T) {
	e := newPinEnv(t)
	mkdir := func(t *testing.T, path string, mode os.FileMode, uid int) string {
		t.Helper()
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, uid, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cases := []struct {
		name string
		// setup makes what the case needs under base and returns the pin directory
		// to load into and the directory whose mode must be left as it is.
		setup func(t *testing.T, base string) (pinDir, kept string)
		ok    bool
	}{
		{"an existing directory of another user", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o755, nobody)
			return d, d
		}, false},
		{"an existing directory anyone may write", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o777, 0)
			return d, d
		}, false},
		{"an existing sticky directory anyone may write", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o777|fs.ModeSticky, 0)
			return d, d
		}, false},
		{"an existing group-writable directory", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o770, 0)
			return d, d
		}, false},
		{"under a directory of another user", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o755, nobody)
			return d + "/rrl", d
		}, false},
		{"under a group-writable directory", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o775, 0)
			return d + "/rrl", d
		}, false},
		{"two levels under a directory of another user", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o755, nobody)
			mkdir(t, d+"/e", 0o755, 0)
			return d + "/e/rrl", d
		}, false},
		{"through a symlink into a directory anyone may write", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o777, 0)
			if err := os.Symlink(d, base+"/link"); err != nil {
				t.Fatal(err)
			}
			return base + "/link/rrl", d
		}, false},
		{"an existing directory of root's", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o755, 0)
			return d, d
		}, true},
		{"under a sticky directory anyone may write", func(t *testing.T, base string) (string, string) {
			d := mkdir(t, base+"/d", 0o777|fs.ModeSticky, 0)
			return d + "/rrl", d
		}, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := mkdir(t, filepath.Join(e.mnt, fmt.Sprintf("case%d", i)), 0o755, 0)
			dir, kept := c.setup(t, base)
			keptMode, err := os.Stat(kept)
			if err != nil {
				t.Fatal(err)
			}
			err = LoadPinned(nil, dir, -1, nobody)
			t.Logf("LoadPinned(%s): %v", dir, err)
			if fi, serr := os.Stat(kept); serr != nil || fi.Mode() != keptMode.Mode() {
				t.Errorf("%s: mode %v (%v), was %v", kept, fi.Mode(), serr, keptMode.Mode())
			}
			if c.ok {
				if err != nil {
					t.Fatalf("LoadPinned: %v", err)
				}
				if err := Unpin(dir); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "other than root") || !strings.Contains(err.Error(), kept) {
				t.Errorf("LoadPinned(%s): %v; want a refusal naming %s", dir, err, kept)
			}
			if _, err := os.Stat(filepath.Join(dir, pinProgram)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused load left %s: %v", pinProgram, err)
			}
			if dir != kept {
				if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("a refused load left the directory it made: %v", err)
				}
			}
		})
	}
}

// TestLoadPinnedGroup: the pins go to root and the group given; with a uid alone, to
// that user's primary group from the user database, and a uid it does not know is
// refused before anything is pinned. No pin is the uid's own.
func TestLoadPinnedGroup(t *testing.T) {
	e := newPinEnv(t)
	u, err := user.LookupId(strconv.Itoa(nobody))
	if err != nil {
		t.Fatalf("uid %d in the user database: %v", nobody, err)
	}
	nobodyGroup, err := strconv.Atoi(u.Gid)
	if err != nil {
		t.Fatal(err)
	}
	unknown := 4242
	for _, err := user.LookupId(strconv.Itoa(unknown)); err == nil; _, err = user.LookupId(strconv.Itoa(unknown)) {
		unknown++
	}
	cases := []struct {
		uid, gid  int
		wantGroup int // -1: refused
		wantMode  func(os.FileMode) os.FileMode
	}{
		{nobody, 77, 77, nil},
		{nobody, -1, nobodyGroup, nil},
		{unknown, 78, 78, nil},
		{unknown, -1, -1, nil},
		{-1, 79, 79, nil},
		{-1, -1, 0, func(m os.FileMode) os.FileMode { return m &^ 0o070 }},
	}
	for i, c := range cases {
		dir := filepath.Join(e.mnt, fmt.Sprintf("rrl%d", i))
		err := LoadPinned(nil, dir, c.uid, c.gid)
		if c.wantGroup < 0 {
			if err == nil || !strings.Contains(err.Error(), "give a gid") {
				t.Errorf("uid %d gid %d: %v; want a refusal asking for a gid", c.uid, c.gid, err)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("uid %d gid %d: the refused load left %s: %v", c.uid, c.gid, dir, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("uid %d gid %d: %v", c.uid, c.gid, err)
			continue
		}
		want := map[string]os.FileMode{".": 0o750}
		for name, mode := range pinModes {
			want[name] = mode
		}
		for name, mode := range want {
			if c.wantMode != nil {
				mode = c.wantMode(mode)
			}
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != 0 || int(st.Gid) != c.wantGroup || fi.Mode().Perm() != mode {
				t.Errorf("uid %d gid %d: %s is %d:%d mode %04o, want 0:%d %04o", c.uid, c.gid, name, st.Uid, st.Gid, fi.Mode().Perm(), c.wantGroup, mode)
			}
		}
		if err := Unpin(dir); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadPinnedSecretsWithUnprivilegedBPF: where unprivileged processes may load
// BPF programs (and so read a map through a write-only descriptor), the secrets pin
// is root's alone; the rest is as usual, and a member still attaches.
func TestLoadPinnedSecretsWithUnprivilegedBPF(t *testing.T) {
	e := newPinEnv(t)
	saved := unprivilegedBPF
	unprivilegedBPF = func() bool { return true }
	defer func() { unprivilegedBPF = saved }()
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, nobody)
	for name, mode := range pinModes {
		if name == pinCookieSecrets {
			mode = 0o200
		}
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != mode || st.Uid != 0 || st.Gid != nobody {
			t.Errorf("%s: %d:%d mode %04o, want 0:%d %04o", name, st.Uid, st.Gid, fi.Mode().Perm(), nobody, mode)
		}
	}
	r := e.start(t, "probe", dir, nobody, nobody, 0).result(t)
	if r.Err != "" || r.Mode != "ebpf" || r.UpdateErr != "" {
		t.Errorf("member: %+v; want it attached and updating", r)
	}
}

// TestPinnedLayoutMismatch: pins whose layout version or map shapes differ from this
// library's are refused with ErrLayoutMismatch rather than misread.
func TestPinnedLayoutMismatch(t *testing.T) {
	e := newPinEnv(t)
	cases := []struct {
		name  string
		spoil func(t *testing.T, dir string)
	}{
		{"layout version", func(t *testing.T, dir string) {
			m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinSettings), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var s filterSettings
			if err := m.Lookup(uint32(0), &s); err != nil {
				t.Fatal(err)
			}
			s.LayoutVersion = layoutVersion + 1
			if err := m.Put(uint32(0), &s); err != nil {
				t.Fatal(err)
			}
		}},
		{"counters of another size", func(t *testing.T, dir string) {
			path := filepath.Join(dir, pinCounters)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8 * 20, MaxEntries: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Pin(path); err != nil {
				t.Fatal(err)
			}
		}},
		{"config format", func(t *testing.T, dir string) {
			m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinConfig), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Put(uint32(0), make([]byte, configValueSize)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(e.mnt, fmt.Sprintf("rrl%d", i))
			loadPinnedForTest(t, dir, "500", -1, -1)
			c.spoil(t, dir)
			srv := newUDPServer(t, "udp4", "127.0.0.1:0")
			f, err := AttachPinned(srv.conn, dir)
			if !errors.Is(err, ErrLayoutMismatch) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("AttachPinned: %v, want ErrLayoutMismatch", err)
			}
			if err := Unpin(dir); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPinnedErrors: misplaced or missing pin directories, a second load, and
// unloading nothing give errors that say so.
func TestPinnedErrors(t *testing.T) {
	e := newPinEnv(t)
	plain := t.TempDir() // not on bpffs
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, -1)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	attach := func(d string) error {
		f, err := AttachPinned(srv.conn, d)
		if err == nil {
			f.Close()
		}
		return err
	}
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"load on a plain directory", LoadPinned(nil, plain, -1, -1), ErrNotMounted},
		{"load under a plain directory", LoadPinned(nil, filepath.Join(plain, "rrl"), -1, -1), ErrNotMounted},
		{"load under a missing directory", LoadPinned(nil, filepath.Join(e.mnt, "a", "b"), -1, -1), fs.ErrNotExist},
		{"load twice", LoadPinned(nil, dir, -1, -1), fs.ErrExist},
		{"attach from a plain directory", attach(plain), ErrNotMounted},
		{"attach from a missing directory", attach(filepath.Join(e.mnt, "missing")), fs.ErrNotExist},
		{"attach from an empty bpffs", attach(e.mnt), fs.ErrNotExist},
		{"unpin a plain directory", Unpin(plain), ErrNotMounted},
		{"unpin an empty bpffs", Unpin(e.mnt), fs.ErrNotExist},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if err := attach(dir); err != nil {
		t.Errorf("the failed second load disturbed the first: %v", err)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.mnt); err != nil {
		t.Errorf("Unpin removed a directory it did not create: %v", err)
	}
}

// TestPinnedUpdateShared: an Update through one opening of the pins is what every
// other opening then reads, and the seed survives it.
func TestPinnedUpdateShared(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, -1)
	for name, mode := range pinModes {
		// No group given: the group bits are cleared.
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != mode&^0o070 {
			t.Errorf("%s: %v, %v; want mode %04o", name, fi.Mode(), err, mode&^0o070)
		}
	}
	a, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg := a.Config()
	for _, kv := range [][2]string{{"requests-per-second", "750"}, {"exempt-clients", "192.0.2.0/24 2001:db8::/32"}, {"report-only", ""}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Update(cfg); err != nil {
		t.Fatal(err)
	}
	b, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !sameConfig(b.Config(), cfg) {
		t.Errorf("second opening reads %s, want %s", configText(b.Config()), configText(cfg))
	}
	if a.seed != b.seed || a.seed == 0 {
		t.Errorf("seeds %x and %x", a.seed, b.seed)
	}
	// A later change through a is what b's Config and Stats report.
	cfg.SetValue("requests-per-second", "900")
	if err := a.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := b.Config(); !sameConfig(got, cfg) {
		t.Errorf("after a second Update, b reads %s", configText(got))
	}
	st, err := b.Stats()
	if err != nil || len(st.Nodes) == 0 || st.Nodes[0].Limit != 900 {
		t.Errorf("b's stats after the Update: %+v, %v; want limits of 900", st, err)
	}
	s, _, err := b.objs.settingsMaps().active(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := kernelSettings(cfg, a.seed)
	want.Slot = s.Slot
	if !reflect.DeepEqual(s, want) {
		t.Errorf("settings map differs from the updated Config")
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
}

// sameConfig compares Configs field by field, nil and empty lists alike, clocks
// ignored.
func sameConfig(a, b *Config) bool {
	norm := func(c *Config) Config {
		d := *c.clone()
		d.nowFunc = nil
		if len(d.exempt) == 0 {
			d.exempt = nil
		}
		if len(d.ipv4Levels) == 0 {
			d.ipv4Levels = nil
		}
		if len(d.ipv6Levels) == 0 {
			d.ipv6Levels = nil
		}
		if len(d.reflectionPorts) == 0 {
			d.reflectionPorts = nil
		}
		return d
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// TestConfigTextRoundTrip: the text a pinned filter stores rebuilds the same Config.
func TestConfigTextRoundTrip(t *testing.T) {
	cases := [][][2]string{
		nil,
		{{"requests-per-second", "500"}},
		{{"responses-per-second", "5"}, {"nxdomains-per-second", "0"}, {"errors-per-second", "2.5"}},
		{{"ipv4-prefix-length", "20"}, {"ipv4-request-levels", "32:1 28:0.5 20:2 16:16 8:100"}},
		{{"ipv4-request-levels", ""}, {"ipv6-request-levels", ""}, {"reflection-ports", ""}},
		{{"ipv6-prefix-length", "48"}, {"ipv6-request-levels", "128:1 64:1 56:2 40:8"}},
		{{"exempt-clients", "10.0.0.0/8, 192.0.2.1 ::ffff:198.51.100.7 2001:db8::/33"}},
		{{"report-only", ""}, {"slip-ratio", "0"}, {"max-table-size", "7"}, {"window", "3600"}},
		{{"all-per-second", "1e-3"}, {"qps-scale", "10000000"}, {"source-port-factor", "0.1"}, {"total-requests-per-second", "123456.789"}},
	}
	for _, pairs := range cases {
		cfg := NewConfig()
		for _, kv := range pairs {
			if err := cfg.SetValue(kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		got, err := parseConfigText(configText(cfg))
		if err != nil {
			t.Errorf("%v: %v", pairs, err)
			continue
		}
		if !sameConfig(got, cfg) {
			t.Errorf("%v: round trip gives\n%s want\n%s", pairs, configText(got), configText(cfg))
		}
	}
}

// FuzzParseConfigText: any stored text either fails cleanly or gives a Config whose
// own text gives it back.
func FuzzParseConfigText(f *testing.F) {
	f.Add(configText(NewConfig()))
	f.Add("requests-per-second=5\nipv4-prefix-length=20\n")
	f.Add("exempt-clients=::1 10.0.0.0/8\nreport-only=\n")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, text string) {
		cfg, err := parseConfigText(text)
		if err != nil {
			return
		}
		again, err := parseConfigText(configText(cfg))
		if err != nil {
			t.Fatalf("own text of %q fails: %v", text, err)
		}
		if !sameConfig(cfg, again) {
			t.Fatalf("%q: round trip differs", text)
		}
	})
}

func TestParseKernelRelease(t *testing.T) {
	cases := []struct {
		rel          string
		major, minor int
		ok           bool
	}{
		{"6.18.0", 6, 18, true},
		{"5.19.0-46-generic", 5, 19, true},
		{"5.4.0-rc1", 5, 4, true},
		{"4.19", 4, 19, true},
		{"6.1-custom", 6, 1, true},
		{"6", 0, 0, false},
		{"x.1", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, c := range cases {
		major, minor, ok := parseKernelRelease(c.rel)
		if major != c.major || minor != c.minor || ok != c.ok {
			t.Errorf("%q: %d.%d %v, want %d.%d %v", c.rel, major, minor, ok, c.major, c.minor, c.ok)
		}
	}
	if _, _, ok := kernelVersion(); !ok {
		t.Error("cannot read the running kernel's version")
	}
}

// TestAccessError: a refused open names the path, its owner and mode, and the user,
// and on kernels before 5.19 says that they need privilege to open pins at all.
func TestAccessError(t *testing.T) {
	path := t.TempDir()
	if err := os.Chmod(path, 0o700); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		major, minor int
		old          bool
	}{{5, 15, true}, {4, 19, true}, {5, 19, false}, {6, 18, false}}
	for _, c := range cases {
		err := accessErrorOn(path, unix.EACCES, c.major, c.minor, true)
		msg := err.Error()
		if !errors.Is(err, ErrNotPermitted) || !errors.Is(err, os.ErrPermission) || !strings.Contains(msg, path) ||
			!strings.Contains(msg, fmt.Sprintf("uid %d", os.Geteuid())) || !strings.Contains(msg, "mode 0700") {
			t.Errorf("%d.%d: %v", c.major, c.minor, err)
		}
		if strings.Contains(msg, "older than 5.19") != c.old {
			t.Errorf("%d.%d: %v; kernel note expected: %v", c.major, c.minor, err, c.old)
		}
	}
}

// The pin layout must name every production object once.
func TestPinLayout(t *testing.T) {
	if len(pinOrder) != len(pinModes) {
		t.Fatalf("pinOrder %v and pinModes disagree", pinOrder)
	}
	names := slices.Clone(pinOrder)
	slices.Sort(names)
	typ := reflect.TypeFor[kernelObjects]()
	for i := range typ.NumField() {
		if tag := typ.Field(i).Tag.Get("ebpf"); !slices.Contains(names, tag) {
			t.Errorf("production object %s is not pinned", tag)
		}
	}
}

// TestPinnedSketchReadBack: after a flood from one /24, the estimates read back
// from the pinned sketches show the /24 at the flood's rate, each of its 40
// sources at a fortieth, an uninvolved network near zero, and the /24's cells as
// the only busy ones of their level.
func TestPinnedSketchReadBack(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, -1)
	srv, f := attachPinnedServer(t, dir)
	const rate = 4000
	raw := newRawSender(t, srv.addr)
	// The flood goes on while the sketches are read (slowly under -race), so that
	// the estimates are steady rather than decaying.
	stop, sendErr := make(chan struct{}), make(chan error, 1)
	go func() {
		start := time.Now()
		sent := 0
		for {
			select {
			case <-stop:
				sendErr <- nil
				return
			case <-time.After(time.Millisecond):
			}
			for due := int(rate*time.Since(start).Seconds()) - sent; due > 0; due-- {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 6, 6, byte(1 + sent%40)}), uint16(40000+sent%40))
				if err := raw.Send(ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(sent), false))); err != nil {
					sendErr <- err
					return
				}
				sent++
			}
		}
	}()
	halt := sync.OnceFunc(func() { close(stop) })
	defer halt()
	time.Sleep(1500 * time.Millisecond)
	groups, err := f.GroupRates(netip.MustParseAddrPort("127.6.6.1:40000"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.GroupRates(netip.MustParseAddrPort("127.99.1.1:40000"))
	if err != nil {
		t.Fatal(err)
	}
	cells, err := f.HeavyCells(2)
	if err != nil {
		t.Fatal(err)
	}
	halt()
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("flood source: %+v\nother: %+v\ncells: %+v", groups, other, cells)
	want := map[string]struct {
		group string
		rate  float64
	}{
		"ipv4/32": {"127.6.6.1/32", rate / 40},
		"ipv4/24": {"127.6.6.0/24", rate},
		"ipv4/16": {"127.6.0.0/16", rate},
		"port":    {"0.0.0.0/0", rate / 40},
	}
	if len(groups) != len(want) {
		t.Fatalf("groups %+v, want the levels %v", groups, want)
	}
	for _, g := range groups {
		w, ok := want[g.Node.String()]
		if !ok || g.Group.String() != w.group || !within(g.Rate, w.rate, 0.20) {
			t.Errorf("%s: group %s at %.0f pps, want %s at %.0f ±20%%", g.Node, g.Group, g.Rate, w.group, w.rate)
		}
	}
	for _, g := range other {
		if g.Node != NodePort && g.Rate > rate/40/4 {
			t.Errorf("uninvolved %s group %s estimated at %.0f pps", g.Node, g.Group, g.Rate)
		}
	}
	var top24 []SketchCell
	for _, c := range cells {
		if c.Node.String() == "ipv4/24" {
			top24 = append(top24, c)
		}
	}
	// One /24 sent: one busy cell per row, idle cells are not listed.
	if len(top24) != 2 || !within(top24[0].Rate, rate, 0.20) || !within(top24[1].Rate, rate, 0.20) || top24[1].Row == top24[0].Row {
		t.Errorf("heaviest ipv4/24 cells %+v: want the flood's cell in each row, nothing else", top24)
	}
}

// BenchmarkPinned measures what tools pay per call on pinned objects: opening the
// pins (and closing them), and reading the sketches back.
func BenchmarkPinned(b *testing.B) {
	requireBPF(b)
	mnt, err := os.MkdirTemp("", "rrl-pin-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(mnt)
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		b.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	dir := filepath.Join(mnt, "rrl")
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "500")
	if err := LoadPinned(cfg, dir, -1, -1); err != nil {
		b.Fatal(err)
	}
	f, err := OpenPinned(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	src := netip.MustParseAddrPort("192.0.2.1:5353")
	b.Run("OpenPinned", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g, err := OpenPinned(dir)
			if err != nil {
				b.Fatal(err)
			}
			g.Close()
		}
	})
	b.Run("Stats", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.Stats(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("GroupRates", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.GroupRates(src); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("HeavyCells", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.HeavyCells(20); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestLoadPinnedIDsOutOfRange: IDs that chown would truncate into another owner are
// refused before anything is pinned.
func TestLoadPinnedIDsOutOfRange(t *testing.T) {
	for _, c := range []struct{ uid, gid int64 }{{1 << 32, 0}, {0, 1<<32 + 1}, {-2, 0}, {0, 1<<32 - 1}} {
		if int64(int(c.uid)) != c.uid || int64(int(c.gid)) != c.gid {
			continue // not an int on this platform
		}
		dir := filepath.Join(t.TempDir(), "pins")
		err := LoadPinned(nil, dir, int(c.uid), int(c.gid))
		if err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("LoadPinned(uid %d, gid %d): %v, want out of range", c.uid, c.gid, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("uid %d gid %d: pin directory left behind: %v", c.uid, c.gid, err)
		}
	}
}
