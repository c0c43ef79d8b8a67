// Package sockopt reaches a socket's file descriptor for option calls, for the rrl
// package and its load generator alike.
package sockopt

import "syscall"

// Control runs fn on conn's file descriptor and returns fn's error, or the error of
// reaching the descriptor (for example when conn is closed). Call sites never
// capture an error variable from inside a closure. The descriptor is valid only
// while fn runs: fn must not keep it.
func Control(conn syscall.Conn, fn func(fd int) error) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := raw.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}
