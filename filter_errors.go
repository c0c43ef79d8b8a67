//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// enotsupp is the kernel-internal ENOTSUPP (524), which the bpf system call returns
// for features a kernel does not implement; it is not EOPNOTSUPP and x/sys/unix does
// not name it.
const enotsupp = syscall.Errno(524)

// sysError is a failed kernel operation classified under one of the sentinels above.
// It unwraps to both the sentinel and the underlying error, so errors.Is matches
// either, and errors.As finds the syscall.Errno.
type sysError struct {
	op       string // what was attempted, e.g. "load eBPF program"; "": err says it
	sentinel error  // ErrNotPermitted, ErrNotSupported, ErrOptMem
	err      error  // the cause, usually a syscall.Errno
	hint     string // how to fix it, or ""
}

func (e *sysError) Error() string {
	msg := ""
	if e.op != "" {
		msg = e.op + ": "
	}
	if e.err != nil {
		msg += e.err.Error()
	} else {
		msg += e.sentinel.Error()
	}
	if e.hint != "" {
		msg += ": " + e.hint
	}
	return msg
}

func (e *sysError) Unwrap() []error {
	if e.err == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.err}
}

const permissionHint = "loading the eBPF socket filter needs CAP_BPF " +
	"(CAP_SYS_ADMIN before Linux 5.8); grant it with 'setcap cap_bpf+ep BINARY', " +
	"attach before dropping privileges (the attached filter keeps working), " +
	"or attach objects a privileged step pinned in bpffs"

// permissionError reports that op was refused for lack of privilege, with a message
// saying how to grant it. err is the cause (unix.EPERM or unix.EACCES).
func permissionError(op string, err error) error {
	return &sysError{op: op, sentinel: ErrNotPermitted, err: err, hint: permissionHint}
}

// notSupportedError reports that op failed because the kernel lacks a feature.
func notSupportedError(op string, err error) error {
	return &sysError{op: op, sentinel: ErrNotSupported, err: err,
		hint: "the running kernel lacks this feature"}
}

// optmemError reports that attaching a filter to a socket was refused for socket
// option memory (ENOMEM from setsockopt), naming the sysctl that bounds it.
func optmemError(err error) error {
	return &sysError{op: "attach filter", sentinel: ErrOptMem, err: err, hint: optmemHint}
}

const optmemHint = "the socket's option memory is full; raise the sysctl net.core.optmem_max"

// sockoptError classifies the error of a setsockopt that attaches or detaches a
// socket filter (SO_ATTACH_FILTER, SO_ATTACH_BPF, SO_DETACH_FILTER), which attaching
// a program needs no privilege for: ENOMEM is ErrOptMem; EPERM means the socket's
// filter is locked (SO_LOCK_FILTER) and is ErrNotPermitted; ENOPROTOOPT, EOPNOTSUPP
// and ENOTSUPP are ErrNotSupported. Other errors are wrapped with op only.
func sockoptError(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOMEM):
		return &sysError{op: op, sentinel: ErrOptMem, err: err, hint: optmemHint}
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return &sysError{op: op, sentinel: ErrNotPermitted, err: err,
			hint: "the socket's filter is locked (SO_LOCK_FILTER)"}
	case errors.Is(err, unix.ENOPROTOOPT), errors.Is(err, unix.EOPNOTSUPP),
		errors.Is(err, enotsupp):
		return notSupportedError(op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// loadError classifies an error from loading the eBPF program or creating its maps
// with cilium/ebpf, or from opening pinned objects. A verifier rejection is returned
// as it is, wrapped with op: the verifier answers EACCES for a program it deems
// unsafe, which is a bug to report and not a missing privilege. Otherwise EPERM and
// EACCES are ErrNotPermitted (with the hint how to grant it, and without
// cilium/ebpf's guess at RLIMIT_MEMLOCK); ebpf.ErrNotSupported,
// ENOTSUPP, EOPNOTSUPP and ENOSYS are ErrNotSupported; other errors are wrapped with
// op only.
func loadError(op string, err error) error {
	var verr *ebpf.VerifierError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &verr):
		return &sysError{op: op, sentinel: ErrLoadFailed, err: err}
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return permissionError(op, withoutMemlockHint(err))
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, enotsupp),
		errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
		return notSupportedError(op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// memlockHint is what cilium/ebpf adds to EPERM from creating a map or loading a
// program, guessing at RLIMIT_MEMLOCK. It is not the cause here: the package lifts
// that limit before loading and kernels since 5.11 do not charge it, so a refusal
// that reaches loadError is the missing privilege, and the guess would send the
// reader after the wrong fix.
const memlockHint = " (MEMLOCK may be too low"

// hintlessError is an error whose message has cilium/ebpf's MEMLOCK hint removed;
// it unwraps to the original.
type hintlessError struct {
	msg string
	err error
}

func (e *hintlessError) Error() string { return e.msg }
func (e *hintlessError) Unwrap() error { return e.err }

// withoutMemlockHint returns err with every "(MEMLOCK may be too low...)" removed
// from its message, unchanged if there is none.
func withoutMemlockHint(err error) error {
	msg := err.Error()
	if !strings.Contains(msg, memlockHint) {
		return err
	}
	for {
		i := strings.Index(msg, memlockHint)
		if i < 0 {
			return &hintlessError{msg: msg, err: err}
		}
		j := strings.IndexByte(msg[i:], ')')
		if j < 0 {
			j = len(msg) - i - 1
		}
		msg = msg[:i] + msg[i+j+1:]
	}
}
