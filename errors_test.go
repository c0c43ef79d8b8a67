package rrl

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

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
			[]string{"load eBPF program", "operation not permitted", "CAP_BPF", "CAP_NET_ADMIN",
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
	if !strings.HasPrefix(err.Error(), "load eBPF program: operation not permitted (") {
		t.Errorf("message = %q", err)
	}
}

func ExampleErrNotPermitted() {
	// What Attach returns when the process may not load eBPF programs.
	err := fmt.Errorf("rrl: attach: %w", permissionError("load eBPF program", unix.EPERM))
	fmt.Println(errors.Is(err, ErrNotPermitted), errors.Is(err, unix.EPERM), errors.Is(err, ErrOptMem))
	// Output: true true false
}
