package main

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/dnsrake/rrl/internal/loadgen"
)

// TestXDPCommand drives xdp attach and detach in a network namespace of the test's
// own, on its loopback interface (a driver without native XDP: attach falls back to
// generic mode and says so) and on an interface that does not exist, and checks
// that another's program is never replaced nor detached, and that unload detaches.
func TestXDPCommand(t *testing.T) {
	pin := filepath.Join(bpffs(t), "rrl")
	if code, _, errOut := rrlctl("load", "-pin", pin); code != exitOK {
		t.Fatalf("load: exit %d: %s", code, errOut)
	}
	ns, err := loadgen.NewNetns("rrlctl-xdp")
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	xdpState := func() string {
		out, _ := exec.Command("ip", "-n", ns.Name, "-d", "link", "show", "dev", "lo").CombinedOutput()
		return string(out)
	}
	in := func(args ...string) (code int, out, errOut string) {
		ns.Do(func() error { code, out, errOut = rrlctl(args...); return nil })
		return
	}
	cases := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"xdp"}, exitUsage, "attach or detach"},
		{[]string{"xdp", "frob", "-dev", "lo"}, exitUsage, "unknown verb"},
		{[]string{"xdp", "attach", "-pin", pin}, exitUsage, "-dev IFACE is required"},
		{[]string{"xdp", "attach", "-dev", "lo"}, exitUsage, "-pin DIR is required"},
		{[]string{"xdp", "attach", "-dev", "lo", "-pin", pin, "-mode", "fast"}, exitUsage, "native or generic"},
		{[]string{"xdp", "attach", "-dev", "lo", "-pin", pin, "-ports", "0"}, exitUsage, "1 to 65535"},
		{[]string{"xdp", "attach", "-dev", "nosuch0", "-pin", pin}, exitError, `no interface "nosuch0"`},
		{[]string{"xdp", "attach", "-dev", "lo", "-pin", pin}, exitOK, "generic mode: its driver has no native XDP"},
		{[]string{"xdp", "attach", "-dev", "lo", "-pin", pin}, exitError, "already attached"},
		{[]string{"xdp", "detach", "-dev", "lo", "-pin", pin}, exitOK, "detached"},
		{[]string{"xdp", "detach", "-dev", "lo", "-pin", pin}, exitError, "no XDP program of rrl"},
		{[]string{"xdp", "attach", "-dev", "lo", "-pin", pin, "-mode", "generic", "-ports", "53,5353"}, exitOK, "generic mode"},
	}
	for _, c := range cases {
		code, out, errOut := in(c.args...)
		if code != c.code || !strings.Contains(out+errOut, c.contains) {
			t.Errorf("rrlctl %s: exit %d, %q%q; want exit %d and %q", strings.Join(c.args, " "), code, out, errOut, c.code, c.contains)
		}
	}
	if s := xdpState(); !strings.Contains(s, "xdpgeneric") {
		t.Errorf("after attach -mode generic: %s", s)
	}
	// unload detaches: no program is left on the interface, nothing in the pins.
	if code, _, errOut := in("unload", "-pin", pin); code != exitOK {
		t.Fatalf("unload: exit %d: %s", code, errOut)
	}
	if s := xdpState(); strings.Contains(s, "xdp") {
		t.Errorf("after unload: %s", s)
	}

	// Another's program: never replaced, never detached.
	flood, err := loadgen.NewFlood()
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	var l link.Link
	ns.Do(func() error {
		ifc, err := netInterface("lo")
		if err == nil {
			l, err = link.AttachXDP(link.XDPOptions{Program: flood.PassProgram(), Interface: ifc, Flags: link.XDPGenericMode})
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
	defer l.Close()
	if code, _, errOut := rrlctl("load", "-pin", pin); code != exitOK {
		t.Fatalf("load: exit %d: %s", code, errOut)
	}
	if code, out, errOut := in("xdp", "attach", "-dev", "lo", "-pin", pin); code != exitError || !strings.Contains(errOut, `"xdp_pass"`) || !strings.Contains(errOut, "never replaces") {
		t.Errorf("attach over another's program: exit %d: %s%s", code, out, errOut)
	}
	if code, out, errOut := in("xdp", "detach", "-dev", "lo"); code != exitError || !strings.Contains(errOut, "not rrl's") {
		t.Errorf("detach of another's program: exit %d: %s%s", code, out, errOut)
	}
	if s := xdpState(); !strings.Contains(s, "xdp_pass") {
		t.Errorf("another's program is gone: %s", s)
	}
}

func netInterface(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, err
	}
	return ifc.Index, nil
}
