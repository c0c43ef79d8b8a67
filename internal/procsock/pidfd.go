//go:build linux

package procsock

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Copy takes copies of the UDP sockets of process pid bound to local, with
// pidfd_open and pidfd_getfd (Linux 5.6). The copies are descriptors of this process
// for the same sockets: options set on them, such as a socket filter, act on the
// target's sockets. Closing them (Close) leaves the target's sockets as they are.
// Copying needs root or CAP_SYS_PTRACE over the target (the ptrace access mode
// check); the error says so when the kernel refuses.
func Copy(pid int, local netip.AddrPort) ([]*Conn, []Socket, error) {
	if pid <= 0 {
		return nil, nil, fmt.Errorf("pid %d: not a process id", pid)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, nil, fmt.Errorf("pid %d: no such process", pid)
		}
		return nil, nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	socks, err := UDP(pid, local)
	if err != nil {
		return nil, nil, err
	}
	var conns []*Conn
	fail := func(err error) ([]*Conn, []Socket, error) {
		for _, c := range conns {
			c.Close()
		}
		return nil, nil, err
	}
	for _, s := range socks {
		fd, err := unix.PidfdGetfd(pidfd, s.FD, 0)
		switch {
		case errors.Is(err, unix.EPERM):
			return fail(fmt.Errorf("pidfd_getfd: copying a socket of process %d needs root or CAP_SYS_PTRACE over it: %w", pid, err))
		case errors.Is(err, unix.ENOSYS):
			return fail(fmt.Errorf("pidfd_getfd needs Linux 5.6 or later: %w", err))
		case errors.Is(err, unix.ESRCH):
			return fail(fmt.Errorf("process %d exited: %w", pid, err))
		case err != nil:
			return fail(fmt.Errorf("pidfd_getfd of descriptor %d of process %d: %w", s.FD, pid, err))
		}
		c := &Conn{fd: fd, inode: s.Inode, owned: true}
		conns = append(conns, c)
		// The target may have closed the descriptor and reused its number since
		// /proc was read: make sure the copy is the socket that was found.
		if err := c.Control(func(uintptr) {}); err != nil {
			return fail(fmt.Errorf("descriptor %d of process %d changed while being copied; try again", s.FD, pid))
		}
	}
	return conns, socks, nil
}
