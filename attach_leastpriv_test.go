package rrl

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// leastPrivilegeEnv tells the child of TestAttachLeastPrivilege which capabilities
// it runs with: "bpf" (CAP_BPF alone) or "bpf+perfmon".
const leastPrivilegeEnv = "RRL_TEST_LEAST_PRIVILEGE"

// TestAttachLeastPrivilege runs Attach on a real socket as uid 65534 with only the
// capabilities a server is told to have, as `setpriv --reuid 65534 --regid 65534
// --clear-groups --inh-caps +bpf,+perfmon --ambient-caps +bpf,+perfmon` starts one.
// With CAP_BPF and CAP_PERFMON the eBPF filter is attached and limits. With CAP_BPF
// alone this kernel's verifier refuses the program (it sanitises pointer arithmetic
// against Spectre v1 for such a process and then walks more paths than it allows),
// so Attach falls back at once to the classic prefilter with ErrNotPermitted and an
// error that names both capabilities, once.
func TestAttachLeastPrivilege(t *testing.T) {
	switch os.Getenv(leastPrivilegeEnv) {
	case "bpf":
		checkOnlyCaps(t, unix.CAP_BPF)
		leastPrivilegeCapBPFOnly(t)
		return
	case "bpf+perfmon":
		checkOnlyCaps(t, unix.CAP_BPF, unix.CAP_PERFMON)
		leastPrivilegeLimits(t)
		return
	}
	requireBPF(t)
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	for _, c := range []struct {
		env  string
		caps []uintptr
	}{
		{"bpf", []uintptr{unix.CAP_BPF}},
		{"bpf+perfmon", []uintptr{unix.CAP_BPF, unix.CAP_PERFMON}},
	} {
		t.Run(c.env, func(t *testing.T) {
			out, err := unprivilegedRunCaps(t, "TestAttachLeastPrivilege", c.caps, leastPrivilegeEnv+"="+c.env)
			if err != nil {
				t.Fatalf("child with %s: %v\n%s", c.env, err, out)
			}
			t.Logf("child with %s (uid %d):\n%s", c.env, unprivilegedID, out)
		})
	}
}

func leastPrivilegeCapBPFOnly(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := Attach(conn, NewConfig())
	if f == nil {
		t.Fatalf("Attach: no filter (%v)", err)
	}
	defer f.Close()
	t.Logf("Attach said: %v", err)
	if !errors.Is(err, ErrNotPermitted) || f.Mode() != ModeClassic {
		t.Fatalf("Attach with CAP_BPF only: mode %v, err %v; want classic and ErrNotPermitted", f.Mode(), err)
	}
	// Attach does not try, since the verifier would refuse: loading the program
	// with CAP_BPF alone fails on this kernel. When it no longer does, Attach
	// should try (verifierTrusts).
	if verifierTrusts() {
		t.Fatal("verifierTrusts: true with CAP_BPF alone")
	}
	spec, serr := loadFilter()
	if serr != nil {
		t.Fatal(serr)
	}
	var objs kernelObjects
	start := time.Now()
	lerr := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogDisabled: true}})
	if lerr == nil {
		objs.Close()
		t.Fatal("the program loads with CAP_BPF alone: let Attach try (verifierTrusts)")
	}
	t.Logf("loading with CAP_BPF alone failed after %v: %v", time.Since(start).Round(time.Millisecond), lerr)
	msg := err.Error()
	for _, want := range []string{"CAP_PERFMON", "setcap cap_bpf,cap_perfmon+ep"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q", want)
		}
	}
	if strings.Count(msg, "load eBPF filter") != 1 {
		t.Errorf("error repeats its prefix: %v", err)
	}
}

func leastPrivilegeLimits(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "5"); err != nil {
		t.Fatal(err)
	}
	f, err := Attach(conn, cfg)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer f.Close()
	if f.Mode() != ModeEBPF {
		t.Fatalf("Attach: mode %v, want %v", f.Mode(), ModeEBPF)
	}
	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// The classic prefilter drops responses too, but keeps no counters and sets no
	// limits: counted drops of both kinds are the eBPF program's.
	const queries = 200
	if _, err := client.Write(qr(dnsQuery(0, false))); err != nil {
		t.Fatal(err)
	}
	for i := range queries {
		if _, err := client.Write(dnsQuery(uint16(i+1), false)); err != nil {
			t.Fatal(err)
		}
	}
	delivered := 0
	buf := make([]byte, 512)
	for {
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, _, err := conn.ReadFromUDP(buf); err != nil {
			var nerr net.Error
			if !errors.As(err, &nerr) || !nerr.Timeout() {
				t.Fatal(err)
			}
			break
		}
		if buf[2]&0x80 != 0 {
			t.Fatal("a response (QR=1) was delivered")
		}
		delivered++
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delivered %d of %d queries; stats %+v", delivered, queries, st)
	// Five a second and the estimator's burst is a handful; 50 leaves room for a
	// slow machine spreading the sends over seconds.
	if delivered == 0 || delivered > 50 {
		t.Errorf("delivered %d of %d queries at 5 per second", delivered, queries)
	}
	if st.Seen != queries+1 || st.DroppedResponse != 1 || st.limited() != uint64(queries-delivered) {
		t.Errorf("stats seen %d, dropped responses %d, limited %d; want %d, 1, %d",
			st.Seen, st.DroppedResponse, st.limited(), queries+1, queries-delivered)
	}
}
