package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"golang.org/x/sys/unix"
)

func rrlctl(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// TestUsage: help exits 0 and says what it should, bad usage exits 2 before
// touching anything, failures exit 1.
func TestUsage(t *testing.T) {
	plain := t.TempDir()
	cases := []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{nil, exitUsage, "Commands:"},
		{[]string{"help"}, exitOK, "rrlctl load"},
		{[]string{"-h"}, exitOK, "Exit status"},
		{[]string{"help", "top"}, exitOK, "cannot be turned back into addresses"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"stats"}, exitUsage, "-pin DIR is required"},
		{[]string{"stats", "-h"}, exitOK, "-watch interval"},
		{[]string{"load", "-h"}, exitOK, "-requests-per-second"},
		{[]string{"load", "-h"}, exitOK, "-ipv6-request-levels"},
		{[]string{"top", "-h"}, exitOK, "-probe sources"},
		{[]string{"stats", "-pin", plain, "-bogus"}, exitUsage, "flag provided but not defined"},
		{[]string{"stats", "-pin", plain, "extra"}, exitUsage, "unexpected arguments"},
		{[]string{"stats", "-pin", plain, "-count", "3"}, exitUsage, "-count needs -watch"},
		{[]string{"set", "-pin", plain}, exitUsage, "KEYWORD VALUE pairs"},
		{[]string{"set", "-pin", plain, "requests-per-second"}, exitUsage, "KEYWORD VALUE pairs"},
		{[]string{"load", "-pin", plain, "-requests-per-second", "lots"}, exitUsage, `requests-per-second="lots"`},
		{[]string{"load", "-pin", plain, "-user", "no-such-user-here"}, exitUsage, "-user no-such-user-here"},
		{[]string{"top", "-pin", plain, "-probe", "example.com"}, exitUsage, `"example.com" is not an address`},
		{[]string{"top", "-pin", plain, "-n", "-1"}, exitUsage, "-n -1: must not be negative"},
		{[]string{"top", "-pin", plain, "-n", "65537"}, exitUsage, "-n 65537: must not be negative, at most 65536"},
		{[]string{"top", "-pin", plain, "-n", "99999999999999999999"}, exitUsage, "value out of range"},
		{[]string{"stats", "-pin", plain, "-watch", "-1s"}, exitUsage, "-watch -1s: want an interval"},
		{[]string{"stats", "-pin", plain, "-watch", "1ns"}, exitUsage, "-watch 1ns: want an interval"},
		{[]string{"stats", "-pin", plain, "-watch", "25h"}, exitUsage, "-watch 25h0m0s: want an interval"},
		{[]string{"stats", "-pin", plain, "-watch", "1s", "-count", "-2"}, exitUsage, "-count -2: must not be negative"},
		{[]string{"stats", "-pin", plain}, exitError, "not on a BPF filesystem"},
		{[]string{"config", "-pin", filepath.Join(plain, "missing")}, exitError, "does not exist"},
		{[]string{"unload", "-pin", plain}, exitError, "not on a BPF filesystem"},
	}
	for _, c := range cases {
		code, out, errOut := rrlctl(c.args...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("rrlctl %q: exit %d, want %d with %q; output:\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}
}

// TestLoadIDsOutOfRange: -user and -group IDs that do not fit a uid or gid (2^32
// and above, negative, and (uid_t)-1, which chown takes as "no change") are bad
// usage, exit status 2, and pin nothing.
func TestLoadIDsOutOfRange(t *testing.T) {
	root := bpffs(t)
	for _, c := range []struct{ flag, id string }{
		{"-user", "4294967296"},
		{"-group", "4294967297"},
		{"-user", "4294967295"},
		{"-group", "4294967295"},
		{"-user", "-1"},
		{"-group", "-5"},
		{"-user", "+4294967296"},
		{"-user", "99999999999999999999999"},
		{"-group", "1e3"},
	} {
		pin := filepath.Join(root, "rrl")
		code, out, errOut := rrlctl("load", "-pin", pin, c.flag, c.id)
		if code != exitUsage || !strings.Contains(errOut, c.flag+" "+c.id+":") {
			t.Errorf("load %s %s: exit %d, want %d naming the flag; output:\n%s%s", c.flag, c.id, code, exitUsage, out, errOut)
		}
		if got := bpffsEntries(t, root); len(got) != 0 {
			t.Errorf("load %s %s: bpffs holds %q, want nothing", c.flag, c.id, got)
			rrl.Unpin(pin)
		}
	}
	// The largest valid IDs are accepted; the pins belong to root and the group.
	pin := filepath.Join(root, "rrl")
	code, out, errOut := rrlctl("load", "-pin", pin, "-user", "4294967294", "-group", "4294967293")
	if code != exitOK || !strings.Contains(out, "group 4294967293") {
		t.Fatalf("load with the largest IDs: exit %d: %s%s", code, out, errOut)
	}
	defer rrl.Unpin(pin)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(pin, "rrl_settings"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Gid != 4294967293 {
		t.Errorf("rrl_settings owned by %d:%d, want 0:4294967293", st.Uid, st.Gid)
	}
}

// TestLoadGroup: load gives the pins to root and the group; -user alone means the
// user's primary group, and a uid the user database does not know is refused; with
// neither, only root has access. The output says which.
func TestLoadGroup(t *testing.T) {
	root := bpffs(t)
	cases := []struct {
		args []string
		code int
		want string
		gid  uint32
	}{
		{[]string{"-user", "nobody", "-group", "77"}, exitOK, "group 77:", 77},
		{[]string{"-user", "65534"}, exitOK, "group 65534:", 65534},
		{[]string{"-user", "4242424"}, exitError, "give a gid", 0},
		{nil, exitOK, "only root has access", 0},
	}
	for _, c := range cases {
		pin := filepath.Join(root, "rrl")
		code, out, errOut := rrlctl(append([]string{"load", "-pin", pin}, c.args...)...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("load %q: exit %d, want %d with %q:\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
		if code != exitOK {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(pin, "rrl_cookie_secrets"), &st); err != nil || st.Uid != 0 || st.Gid != c.gid {
			t.Errorf("load %q: secrets pin %d:%d (%v), want 0:%d", c.args, st.Uid, st.Gid, err, c.gid)
		}
		if err := rrl.Unpin(pin); err != nil {
			t.Fatal(err)
		}
	}
}

// bpffsEntries lists what dir holds besides the iterators the kernel puts in every
// bpffs root (maps.debug, progs.debug).
func bpffsEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".debug") {
			out = append(out, e.Name())
		}
	}
	return out
}

// bpffs mounts a private bpffs for the test, or skips when that is not permitted
// (unless RRL_REQUIRE_BPF=1).
func bpffs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	err := unix.Mount("bpf", dir, "bpf", 0, "")
	if err == nil {
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		probe := filepath.Join(dir, "probe")
		if err = rrl.LoadPinned(nil, probe, -1, -1); err == nil {
			err = rrl.Unpin(probe)
		}
	}
	if err != nil {
		if os.Getenv("RRL_REQUIRE_BPF") == "1" {
			t.Fatalf("bpffs and eBPF needed and RRL_REQUIRE_BPF=1: %v", err)
		}
		t.Skipf("needs root (CAP_SYS_ADMIN to mount bpffs, CAP_BPF to load): %v", err)
	}
	return dir
}

// sendQueries sends n DNS queries for the root from src to dst through a raw socket.
func sendQueries(t *testing.T, src, dst netip.AddrPort, n int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer unix.Close(fd)
	query := []byte{0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}
	pkt := make([]byte, 20+8+len(query))
	pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(pkt[12:], s[:])
	copy(pkt[16:], d[:])
	binary.BigEndian.PutUint16(pkt[20:], src.Port())
	binary.BigEndian.PutUint16(pkt[22:], dst.Port())
	binary.BigEndian.PutUint16(pkt[24:], uint16(8+len(query)))
	copy(pkt[28:], query)
	to := &unix.SockaddrInet4{Addr: d}
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint16(pkt[28:], uint16(i))
		if err := unix.Sendto(fd, pkt, 0, to); err != nil {
			t.Fatalf("raw send: %v", err)
		}
	}
}

// statsOf runs rrlctl stats -json.
func statsOf(t *testing.T, pin string) statsJSON {
	t.Helper()
	code, out, errOut := rrlctl("stats", "-pin", pin, "-json")
	if code != exitOK {
		t.Fatalf("stats: exit %d: %s", code, errOut)
	}
	var st statsJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("stats -json output %q: %v", out, err)
	}
	return st
}

// TestLifecycle drives every command against a filter pinned in a private bpffs
// and attached to a socket through the pins, with a flood from one address.
func TestLifecycle(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	if code, out, errOut := rrlctl("load", "-pin", pin, "-user", "65534", "-group", "65534", "-requests-per-second", "500", "-report-only=false"); code != exitOK || !strings.Contains(out, "loaded") {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(pin, "rrl_filter"), &st); err != nil || st.Uid != 0 || st.Gid != 65534 {
		t.Errorf("program pin: %+v, %v; want owned by root and group 65534", st, err)
	}
	if code, _, errOut := rrlctl("load", "-pin", pin); code != exitError || !strings.Contains(errOut, "already pinned") {
		t.Errorf("second load: exit %d: %s", code, errOut)
	}

	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := rrl.AttachPinned(conn, pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	src := netip.MustParseAddrPort("127.7.7.7:40000")
	const n = 2000
	sendQueries(t, src, dst, n)
	var js statsJSON
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if js = statsOf(t, pin); js.Counters["seen"] == n {
			break
		}
	}
	c := js.Counters
	var levelsLimited, limited32 uint64
	for _, l := range js.Levels {
		levelsLimited += l.Limited
		if l.Node.String() == "ipv4/32" && l.Limit == 500 {
			limited32 = l.Limited
		}
	}
	if c["seen"] != n || c["passed"]+c["dropped"] != n || c["limited"] != c["dropped"] || levelsLimited != c["limited"] || limited32 == 0 || js.Mode != "ebpf" {
		t.Errorf("stats after a burst of %d from one address: %+v", n, js)
	}
	if code, out, _ := rrlctl("stats", "-pin", pin); code != exitOK || !strings.Contains(out, "ipv4/32") || !strings.Contains(out, "limited") {
		t.Errorf("stats: exit %d:\n%s", code, out)
	}

	// Watching: rates per second over each interval, one JSON object per line,
	// while queries keep coming.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				sendQueries(t, netip.MustParseAddrPort("127.7.7.8:40001"), dst, 10)
			}
		}
	}()
	code, out, errOut := rrlctl("stats", "-pin", pin, "-watch", "100ms", "-count", "2", "-json")
	_, compact, _ := rrlctl("stats", "-pin", pin, "-watch", "50ms", "-count", "1")
	close(stop)
	wg.Wait()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 2 {
		t.Fatalf("stats -watch -count 2: exit %d, %d lines: %s%s", code, len(lines), out, errOut)
	}
	for _, line := range lines {
		var w statsJSON
		if err := json.Unmarshal([]byte(line), &w); err != nil {
			t.Fatal(err)
		}
		if w.Interval < 0.05 || w.Rates["seen"] <= 0 || w.Rates["seen"] < w.Rates["passed"] {
			t.Errorf("watch line: interval %.3f s, rates %v", w.Interval, w.Rates)
		}
	}
	if !strings.Contains(compact, "seen ") || !strings.Contains(compact, "/s") || strings.Count(compact, "\n") != 1 {
		t.Errorf("compact watch line: %q", compact)
	}

	// Reconfiguration applies on top of the loaded configuration.
	if code, _, errOut := rrlctl("set", "-pin", pin, "requests-per-second", "750", "exempt-clients", "192.0.2.0/24"); code != exitOK {
		t.Fatalf("set: exit %d: %s", code, errOut)
	}
	for _, bad := range [][]string{{"requests-per-second", "-1"}, {"no-such-keyword", "1"}} {
		if code, _, errOut := rrlctl(append([]string{"set", "-pin", pin}, bad...)...); code != exitUsage {
			t.Errorf("set %q: exit %d: %s", bad, code, errOut)
		}
	}
	code, out, errOut = rrlctl("config", "-pin", pin, "-json")
	var cfg map[string]string
	if code != exitOK || json.Unmarshal([]byte(out), &cfg) != nil {
		t.Fatalf("config -json: exit %d: %s%s", code, out, errOut)
	}
	if cfg["requests-per-second"] != "750" || cfg["exempt-clients"] != "192.0.2.0/24" || cfg["report-only"] != "false" {
		t.Errorf("config after set: %v", cfg)
	}
	if code, out, _ := rrlctl("config", "-pin", pin); code != exitOK || !strings.Contains(out, `"750"`) {
		t.Errorf("config: %s", out)
	}
	if got := f.Config().Values(); !strings.Contains(strings.Join(got[0][:], " "), "window") {
		t.Errorf("Values starts with %v", got[0])
	}
	for _, l := range statsOf(t, pin).Levels {
		if l.Node.String() == "ipv4/32" && l.Limit != 750 {
			t.Errorf("ipv4/32 limit %v after set, want 750", l.Limit)
		}
	}

	// top: the burst's source is the heavy one.
	code, out, errOut = rrlctl("top", "-pin", pin, "-n", "1", "-probe", "127.7.7.7:40000,127.99.0.1", "-json")
	var top topReport
	if code != exitOK || json.Unmarshal([]byte(out), &top) != nil {
		t.Fatalf("top -json: exit %d: %s%s", code, out, errOut)
	}
	if len(top.Probes) != 2 || len(top.Levels) == 0 {
		t.Fatalf("top: %+v", top)
	}
	for _, g := range top.Probes[0].Groups {
		if g.Node.String() == "ipv4/32" && (g.Group.String() != "127.7.7.7/32" || g.Rate < 100) {
			t.Errorf("probe of the burst's source: %+v", g)
		}
	}
	for _, g := range top.Probes[1].Groups {
		if g.Node.String() == "ipv4/32" && g.Rate != 0 {
			t.Errorf("probe of a silent source: %+v", g)
		}
	}
	for _, l := range top.Levels {
		if l.Node.String() == "ipv4/32" && (l.Heaviest < 100 || l.Busy < 2) {
			t.Errorf("ipv4/32 summary: %+v", l)
		}
	}
	perRow := map[string]int{}
	for _, cell := range top.Cells {
		perRow[cell.Node.String()+string(rune('0'+cell.Row))]++
	}
	for k, v := range perRow {
		if v != 1 {
			t.Errorf("-n 1 listed %d cells for %s", v, k)
		}
	}
	if code, out, _ := rrlctl("top", "-pin", pin, "-probe", "127.7.7.7:40000"); code != exitOK || !strings.Contains(out, "not addresses") || !strings.Contains(out, "source 127.7.7.7:40000") || !strings.Contains(out, "source port 40000") {
		t.Errorf("top: exit %d:\n%s", code, out)
	}

	if code, out, errOut := rrlctl("unload", "-pin", pin); code != exitOK || !strings.Contains(out, "unloaded") {
		t.Fatalf("unload: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory after unload: %v", err)
	}
	if code, _, errOut := rrlctl("stats", "-pin", pin); code != exitError || !strings.Contains(errOut, "does not exist") {
		t.Errorf("stats after unload: exit %d: %s", code, errOut)
	}
	// The attached socket keeps its filter after unload.
	if st, err := f.Stats(); err != nil || st.Seen < n {
		t.Errorf("attached filter after unload: %+v, %v", st, err)
	}
}
