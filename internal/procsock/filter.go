//go:build linux

package procsock

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What the kernel tells about a socket's filter, and so what can be put back after
// replacing it: no filter (put back by detaching), a classic program (SO_GET_FILTER
// returns the program as it was attached, and SO_ATTACH_FILTER puts it back), or an
// eBPF program, which the kernel neither dumps nor names: nobody can put that one
// back. SO_LOCK_FILTER makes the kernel refuse any change to the filter.

// SavedFilter is a socket's filter as SaveFilter found it.
type SavedFilter struct {
	Kind    string            // NoFilter, EBPFFilter or ClassicFilter
	Classic []unix.SockFilter // the classic program, when Kind is ClassicFilter
	Locked  bool              // SO_LOCK_FILTER is set: the filter can be neither replaced nor removed
	// OptMem is the socket's option memory in use, in bytes (SK_MEMINFO_OPTMEM),
	// its filter included. Attaching a filter fails (ENOMEM) unless OptMem plus the
	// new filter's size stays below net.core.optmem_max of the socket's network
	// namespace, as the old filter is freed only after the new one is charged: of
	// two sockets, the one with more option memory fails first.
	OptMem uint32
}

// Restorable reports whether RestoreFilter can put s back exactly: a socket without
// a filter or with a classic one.
func (s SavedFilter) Restorable() bool { return s.Kind == NoFilter || s.Kind == ClassicFilter }

// ErrNotRestorable is returned by RestoreFilter for an eBPF filter, which the kernel
// does not let anyone read back.
var ErrNotRestorable = errors.New("an eBPF socket filter cannot be read back, so cannot be put back")

// SaveFilter returns conn's filter: its kind, the program when it is classic, and
// whether it is locked.
func SaveFilter(conn syscall.Conn) (SavedFilter, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return SavedFilter{}, err
	}
	var s SavedFilter
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		locked, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_LOCK_FILTER)
		if err != nil {
			serr = fmt.Errorf("SO_LOCK_FILTER: %w", err)
			return
		}
		s.Locked = locked != 0
		if s.OptMem, serr = optMem(fd); serr != nil {
			return
		}
		// The program may change between asking its length and reading it (EINVAL
		// when it grew): try again a few times.
		for range 5 {
			s.Kind, s.Classic, serr = getFilter(fd)
			if !errors.Is(serr, unix.EINVAL) {
				return
			}
		}
	})
	if cerr != nil {
		return SavedFilter{}, cerr
	}
	return s, serr
}

// optMem returns socket fd's SK_MEMINFO_OPTMEM.
func optMem(fd uintptr) (uint32, error) {
	var info [unix.SK_MEMINFO_VARS]uint32
	size := uint32(unsafe.Sizeof(info))
	// x/sys/unix has no getsockopt for an array of integers.
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return 0, fmt.Errorf("SO_MEMINFO: %w", errno)
	}
	if size <= unix.SK_MEMINFO_OPTMEM*4 {
		return 0, fmt.Errorf("SO_MEMINFO returned %d bytes, no option memory", size)
	}
	return info[unix.SK_MEMINFO_OPTMEM], nil
}

// getFilter reads the filter of socket fd with SO_GET_FILTER, whose length argument
// counts instructions: 0 asks for the length, and an eBPF program gives EACCES.
func getFilter(fd uintptr) (string, []unix.SockFilter, error) {
	n, err := getFilterInto(fd, nil)
	switch {
	case errors.Is(err, unix.EACCES):
		return EBPFFilter, nil, nil
	case err != nil:
		return "", nil, fmt.Errorf("SO_GET_FILTER: %w", err)
	case n == 0:
		return NoFilter, nil, nil
	}
	prog := make([]unix.SockFilter, n)
	m, err := getFilterInto(fd, prog)
	switch {
	case errors.Is(err, unix.EACCES):
		return EBPFFilter, nil, nil // replaced by an eBPF program meanwhile
	case err != nil:
		return "", nil, fmt.Errorf("SO_GET_FILTER: %w", err)
	case m == 0:
		return NoFilter, nil, nil
	}
	return ClassicFilter, prog[:m], nil
}

// getFilterInto calls SO_GET_FILTER with room for len(prog) instructions and returns
// the program's length.
func getFilterInto(fd uintptr, prog []unix.SockFilter) (int, error) {
	n := uint32(len(prog))
	var p unsafe.Pointer
	if len(prog) > 0 {
		p = unsafe.Pointer(&prog[0])
	}
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_GET_FILTER,
		uintptr(p), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// RestoreFilter puts s back on conn in place of whatever filter conn has now: it
// detaches the filter for NoFilter, and attaches s's program for ClassicFilter. The
// kernel charges a new filter to the socket's option memory before it frees the old
// one; when both do not fit (ENOMEM), the filter is detached first, which leaves
// the socket unfiltered for the moment between the two calls. For EBPFFilter it
// changes nothing and returns ErrNotRestorable.
func RestoreFilter(conn syscall.Conn, s SavedFilter) error {
	switch s.Kind {
	case NoFilter:
		return DetachFilter(conn)
	case ClassicFilter:
		if len(s.Classic) == 0 || len(s.Classic) > 0xffff {
			return fmt.Errorf("classic program of %d instructions", len(s.Classic))
		}
		attach := func() error { return setFilter(conn, s.Classic) }
		err := attach()
		if errors.Is(err, unix.ENOMEM) {
			if derr := DetachFilter(conn); derr != nil {
				return errors.Join(err, derr)
			}
			err = attach()
		}
		return err
	case EBPFFilter:
		return ErrNotRestorable
	}
	return fmt.Errorf("unknown filter kind %q", s.Kind)
}

// setFilter attaches a classic program to conn with SO_ATTACH_FILTER.
func setFilter(conn syscall.Conn, prog []unix.SockFilter) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("SO_ATTACH_FILTER: %w", serr)
	}
	return nil
}

// DetachFilter removes conn's filter, whatever it is; a socket without one is not an
// error.
func DetachFilter(conn syscall.Conn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
	}); err != nil {
		return err
	}
	if serr != nil && !errors.Is(serr, unix.ENOENT) {
		return fmt.Errorf("SO_DETACH_FILTER: %w", serr)
	}
	return nil
}
