package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/testutil"
)

// useDefaultPinRoot makes the default pin directories of attach and detach live in
// root, a bpffs the test mounted, until the test ends.
func useDefaultPinRoot(t *testing.T, root string) {
	old := defaultPinRoot
	defaultPinRoot = root
	t.Cleanup(func() { defaultPinRoot = old })
}

// listenUDP opens a UDP socket on addr (port 0: any) in this process, closed when
// the test ends.
func listenUDP(t *testing.T, network, addr string) (*net.UDPConn, netip.AddrPort) {
	t.Helper()
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestAttachDefaultPin: attach and detach without -pin work for an IPv4 and an IPv6
// address: the default directory's name is one bpffs takes.
func TestAttachDefaultPin(t *testing.T) {
	useDefaultPinRoot(t, bpffs(t))
	self := strconv.Itoa(os.Getpid())
	for _, c := range []struct{ network, addr, name string }{
		{"udp4", "127.0.0.2:0", "rrl-127_0_0_2-"},
		{"udp6", "[::1]:0", "rrl-__1-"},
	} {
		t.Run(c.network, func(t *testing.T) {
			conn, local := listenUDP(t, c.network, c.addr)
			listen := local.String()
			dir := filepath.Join(defaultPinRoot, c.name+strconv.Itoa(int(local.Port())))
			code, out, errOut := rrlctl("attach", "-pid", self, "-listen", listen, "-requests-per-second", "70")
			if code != exitOK || !strings.Contains(out, dir) {
				t.Fatalf("attach -listen %s: exit %d, want %d naming %s:\n%s%s", listen, code, exitOK, dir, out, errOut)
			}
			if kind, err := procsock.AttachedFilter(conn); err != nil || kind != procsock.EBPFFilter {
				t.Errorf("after attach the socket has %q (%v)", kind, err)
			}
			code, out, errOut = rrlctl("config", "-pin", dir, "-json")
			var cfg map[string]string
			if code != exitOK || json.Unmarshal([]byte(out), &cfg) != nil || cfg["requests-per-second"] != "70" {
				t.Errorf("config -pin %s: exit %d:\n%s%s", dir, code, out, errOut)
			}
			if code, out, errOut := rrlctl("detach", "-pid", self, "-listen", listen, "-unpin"); code != exitOK || !strings.Contains(out, "unpinned "+dir) {
				t.Errorf("detach -unpin: exit %d:\n%s%s", code, out, errOut)
			}
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after detach -unpin: %v", dir, err)
			}
		})
	}
}

// TestLoadDottedName: bpffs refuses a name with a dot even to root; load says so
// rather than blaming permissions.
func TestLoadDottedName(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl.v1")
	code, out, errOut := rrlctl("load", "-pin", pin)
	if code != exitError || !strings.Contains(errOut, "allows no '.'") || strings.Contains(errOut, "not permitted") {
		t.Errorf("load -pin %s: exit %d, want %d saying bpffs allows no '.':\n%s%s", pin, code, exitError, out, errOut)
	}
}

// TestAttachPlantedPins reproduces the planted pins of a bpffs with the kernel's
// default mode 1777: uid 65534 makes the directory attach would use by default for
// the server's address and pins a loaded filter's objects in it. attach refuses it,
// leaving the server's socket without a filter, and so does every command given it.
func TestAttachPlantedPins(t *testing.T) {
	root := bpffs(t)
	useDefaultPinRoot(t, root)
	// uid 65534 must reach the bpffs: t.TempDir's parent is 0700.
	if err := os.Chmod(filepath.Dir(root), 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&fs.ModeSticky == 0 {
		t.Fatalf("bpffs root %s: %v, %v; want the kernel's default mode 1777", root, fi.Mode(), err)
	}
	legit := filepath.Join(root, "legit")
	if err := rrl.LoadPinned(nil, legit, -1, 65534); err != nil {
		t.Fatal(err)
	}
	conn, local := listenUDP(t, "udp4", "127.0.0.2:0")
	planted := defaultAttachPin(local)
	testutil.MkdirAs(t, planted, 65534)
	testutil.Repin(t, legit, planted, 65534)

	self := strconv.Itoa(os.Getpid())
	for _, args := range [][]string{
		{"attach", "-pid", self, "-listen", local.String()},
		{"attach", "-pid", self, "-listen", local.String(), "-pin", planted},
		{"stats", "-pin", planted},
		{"set", "-pin", planted, "requests-per-second", "1"},
		{"config", "-pin", planted},
		{"top", "-pin", planted},
		{"control", "-pin", planted},
		{"unload", "-pin", planted},
		{"detach", "-pid", self, "-listen", local.String(), "-unpin"},
	} {
		code, out, errOut := rrlctl(args...)
		if code != exitError || !strings.Contains(errOut, planted) || !strings.Contains(errOut, "other than root") {
			t.Errorf("rrlctl %q: exit %d, want %d refusing %s:\n%s%s", args, code, exitError, planted, out, errOut)
		}
		if kind, err := procsock.AttachedFilter(conn); err != nil || kind != procsock.NoFilter {
			t.Fatalf("after rrlctl %q the socket has %q (%v)", args, kind, err)
		}
	}
	if _, err := os.Stat(filepath.Join(planted, "rrl_filter")); err != nil {
		t.Errorf("the planted pins were removed: %v", err)
	}
	// The filter root pinned in the sticky bpffs root is used as before.
	if code, out, errOut := rrlctl("attach", "-pid", self, "-listen", local.String(), "-pin", legit); code != exitOK {
		t.Errorf("attach -pin %s: exit %d:\n%s%s", legit, code, out, errOut)
	}
	if kind, err := procsock.AttachedFilter(conn); err != nil || kind != procsock.EBPFFilter {
		t.Errorf("after attach -pin %s the socket has %q (%v)", legit, kind, err)
	}
}

// TestHelpShowsFlags: "rrlctl help CMD" prints what "rrlctl CMD -h" prints, every
// flag included.
func TestHelpShowsFlags(t *testing.T) {
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := rrlctl("help", c.name)
			hcode, _, hOut := rrlctl(c.name, "-h")
			if code != exitOK || hcode != exitOK || errOut != "" || out != hOut {
				t.Errorf("help %s: exit %d, stderr %q, output:\n%s\nwant (from %s -h, exit %d):\n%s", c.name, code, errOut, out, c.name, hcode, hOut)
			}
			if !strings.Contains(out, "-pin directory") {
				t.Errorf("help %s does not show -pin:\n%s", c.name, out)
			}
		})
	}
	_, out, _ := rrlctl("help", "load")
	for _, flag := range []string{"-group", "-user", "-requests-per-second", "-cookie-secret"} {
		if !strings.Contains(out, flag) {
			t.Errorf("help load lacks %s:\n%s", flag, out)
		}
	}
}
