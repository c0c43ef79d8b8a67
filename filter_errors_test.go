package rrl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

func TestErrorsMatchSentinelAndErrno(t *testing.T) {
	sentinels := []error{ErrNotPermitted, ErrNotSupported, ErrOptMem, ErrClosed}
	tests := []struct {
		name     string
		err      error
		sentinel error // the one sentinel err must match
		errno    syscall.Errno
		inMsg    []string
	}{
		{"load EPERM", permissionError("load eBPF program", unix.EPERM), ErrNotPermitted, unix.EPERM,
			[]string{"load eBPF program", "operation not permitted", "CAP_BPF",
				"setcap cap_bpf+ep", "dropping privileges", "keeps working", "pinned"}},
		{"map EACCES", permissionError("create map", unix.EACCES), ErrNotPermitted, unix.EACCES,
			[]string{"create map", "permission denied", "CAP_BPF"}},
		{"optmem", optmemError(unix.ENOMEM), ErrOptMem, unix.ENOMEM,
			[]string{"attach filter", "net.core.optmem_max"}},
		{"not supported", notSupportedError("load eBPF program", enotsupp), ErrNotSupported, enotsupp,
			[]string{"load eBPF program", "lacks"}},
		{"sockopt ENOMEM", sockoptError("attach eBPF filter", unix.ENOMEM), ErrOptMem, unix.ENOMEM,
			[]string{"attach eBPF filter", "net.core.optmem_max"}},
		{"sockopt locked", sockoptError("detach filter", unix.EPERM), ErrNotPermitted, unix.EPERM,
			[]string{"detach filter", "SO_LOCK_FILTER"}},
		{"sockopt ENOPROTOOPT", sockoptError("attach eBPF filter", unix.ENOPROTOOPT), ErrNotSupported,
			unix.ENOPROTOOPT, []string{"attach eBPF filter"}},
		{"sockopt EOPNOTSUPP", sockoptError("attach", unix.EOPNOTSUPP), ErrNotSupported, unix.EOPNOTSUPP, nil},
		{"sockopt other", sockoptError("attach classic filter", unix.EINVAL), nil, unix.EINVAL,
			[]string{"attach classic filter: invalid argument"}},
		{"wrapped again", fmt.Errorf("rrl: attach: %w", permissionError("load", unix.EPERM)),
			ErrNotPermitted, unix.EPERM, []string{"rrl: attach: load: operation not permitted"}},
		{"closed", fmt.Errorf("update: %w", ErrClosed), ErrClosed, 0, []string{"update: filter closed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, s := range sentinels {
				if got, want := errors.Is(tt.err, s), s == tt.sentinel; got != want {
					t.Errorf("errors.Is(%q, %q) = %v, want %v", tt.err, s, got, want)
				}
			}
			if tt.errno != 0 {
				if !errors.Is(tt.err, tt.errno) {
					t.Errorf("errors.Is(%q, %v) = false", tt.err, tt.errno)
				}
				var errno syscall.Errno
				if !errors.As(tt.err, &errno) || errno != tt.errno {
					t.Errorf("errors.As found errno %v, want %v", errno, tt.errno)
				}
				if errors.Is(tt.err, unix.EBADF) {
					t.Errorf("errors.Is(%q, EBADF) = true", tt.err)
				}
			}
			for _, s := range tt.inMsg {
				if !strings.Contains(tt.err.Error(), s) {
					t.Errorf("message %q lacks %q", tt.err, s)
				}
			}
		})
	}
	if err := sockoptError("attach", nil); err != nil {
		t.Errorf("sockoptError(nil) = %v, want nil", err)
	}
}

// A cause-less error still reads well and matches its sentinel.
func TestSysErrorWithoutCause(t *testing.T) {
	err := permissionError("load eBPF program", nil)
	if !errors.Is(err, ErrNotPermitted) {
		t.Fatalf("errors.Is(%q, ErrNotPermitted) = false", err)
	}
	if !strings.HasPrefix(err.Error(), "load eBPF program: operation not permitted: loading the eBPF socket filter needs CAP_BPF") {
		t.Errorf("message = %q", err)
	}
}

func TestLoadError(t *testing.T) {
	verifier := &ebpf.VerifierError{Cause: unix.EACCES, Log: []string{"R2 !read_ok"}}
	tests := []struct {
		name     string
		err      error
		sentinel error
	}{
		{"EPERM", fmt.Errorf("load program: %w", unix.EPERM), ErrNotPermitted},
		{"EACCES on a pinned object", fmt.Errorf("open pin: %w", unix.EACCES), ErrNotPermitted},
		{"verifier rejection", fmt.Errorf("load program: %w", verifier), nil},
		{"cilium not supported", fmt.Errorf("map type: %w", ebpf.ErrNotSupported), ErrNotSupported},
		{"ENOTSUPP", enotsupp, ErrNotSupported},
		{"ENOSYS", unix.ENOSYS, ErrNotSupported},
		{"EINVAL", unix.EINVAL, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := loadError("load eBPF filter", tt.err)
			if !errors.Is(err, tt.err) || !strings.HasPrefix(err.Error(), "load eBPF filter: ") {
				t.Errorf("loadError = %q, want it to wrap %q", err, tt.err)
			}
			for _, s := range []error{ErrNotPermitted, ErrNotSupported, ErrOptMem, ErrClosed} {
				if got, want := errors.Is(err, s), s == tt.sentinel; got != want {
					t.Errorf("errors.Is(%q, %q) = %v, want %v", err, s, got, want)
				}
			}
		})
	}
	if loadError("x", nil) != nil {
		t.Error("loadError(nil) != nil")
	}
}

// loadSocketFilter loads a socket filter program of the given instructions.
func loadSocketFilter(insns asm.Instructions) error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SocketFilter, Instructions: insns, License: "MIT",
	})
	if err == nil {
		prog.Close()
	}
	return loadError("load eBPF program", err)
}

// What the kernel answers, classified: a verifier rejection is not a permission
// error even though the kernel's errno is EACCES.
func TestLoadErrorFromKernel(t *testing.T) {
	requirePrivilege(t)
	if err := loadSocketFilter(asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}); err != nil {
		t.Fatalf("load a trivial program: %v", err)
	}
	// R2 is never written: the verifier refuses to read it.
	err := loadSocketFilter(asm.Instructions{asm.Mov.Reg(asm.R0, asm.R2), asm.Return()})
	var verr *ebpf.VerifierError
	if !errors.As(err, &verr) || errors.Is(err, ErrNotPermitted) {
		t.Errorf("verifier rejection classified as %q", err)
	}
}

// The same load as an unprivileged process is refused with ErrNotPermitted where
// the kernel forbids unprivileged eBPF.
func TestLoadErrorUnprivileged(t *testing.T) {
	if !isUnprivilegedChild() {
		runUnprivileged(t, "TestLoadErrorUnprivileged")
		return
	}
	checkUnprivileged(t)
	b, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	if err != nil {
		t.Fatal(err)
	}
	err = loadSocketFilter(asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()})
	if strings.TrimSpace(string(b)) == "0" {
		// Unprivileged socket filters are allowed here: the load must succeed.
		if err != nil {
			t.Fatalf("unprivileged load with unprivileged_bpf_disabled=0: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrNotPermitted) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("unprivileged load: %v, want ErrNotPermitted and EPERM", err)
	}
	if !strings.Contains(err.Error(), "setcap cap_bpf+ep") {
		t.Errorf("message %q does not say how to grant the privilege", err)
	}
	t.Logf("unprivileged load: %v", err)
}

func ExampleErrNotPermitted() {
	// What Attach returns when the process may not load eBPF programs.
	err := fmt.Errorf("rrl: attach: %w", permissionError("load eBPF program", unix.EPERM))
	fmt.Println(errors.Is(err, ErrNotPermitted), errors.Is(err, unix.EPERM), errors.Is(err, ErrOptMem))
	// Output: true true false
}

// TestLoadErrorWithoutMemlockHint: a refusal to create a map or load a program, as
// cilium/ebpf words it, is ErrNotPermitted naming the missing privilege, without the
// RLIMIT_MEMLOCK guess, and still matches EPERM.
func TestLoadErrorWithoutMemlockHint(t *testing.T) {
	for _, cause := range []error{
		fmt.Errorf("field Program: program rrl_filter: map rrl_counters: map create: %w (MEMLOCK may be too low, consider rlimit.RemoveMemlock)", unix.EPERM),
		fmt.Errorf("program rrl_filter: load program: %w (MEMLOCK may be too low, consider rlimit.RemoveMemlock)", unix.EPERM),
		fmt.Errorf("map create: %w", unix.EACCES),
	} {
		err := loadError("rrl: load eBPF filter", cause)
		if !errors.Is(err, ErrNotPermitted) || !errors.Is(err, cause) || !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
			t.Errorf("loadError(%q) = %v: not ErrNotPermitted wrapping the cause", cause, err)
		}
		if msg := err.Error(); strings.Contains(msg, "MEMLOCK") || !strings.Contains(msg, "CAP_BPF") ||
			!strings.Contains(msg, "rrl_filter") && !strings.Contains(msg, "map create") {
			t.Errorf("loadError(%q) says %q: want the context and CAP_BPF, no MEMLOCK", cause, msg)
		}
	}
}

// TestAttachUnprivilegedNamesOnlyPrivilege runs Attach as an unprivileged process:
// the error names the missing privilege and not RLIMIT_MEMLOCK, which is not the
// cause.
func TestAttachUnprivilegedNamesOnlyPrivilege(t *testing.T) {
	if !isUnprivilegedChild() {
		requireBPF(t)
		runUnprivileged(t, "TestAttachUnprivilegedNamesOnlyPrivilege")
		return
	}
	checkUnprivileged(t)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f, err := Attach(conn, NewConfig())
	if f != nil {
		defer f.Close()
	}
	if !errors.Is(err, ErrNotPermitted) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("unprivileged Attach: err %v, want ErrNotPermitted and EPERM", err)
	}
	if msg := err.Error(); strings.Contains(msg, "MEMLOCK") || !strings.Contains(msg, "CAP_BPF") {
		t.Errorf("unprivileged Attach says %q: want CAP_BPF named and no MEMLOCK hint", msg)
	}
	t.Logf("Attach said: %v", err)
}
