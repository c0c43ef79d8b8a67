//go:build !linux

package rrl

import (
	"errors"
	"syscall"
)

// readSocketQueue needs SO_MEMINFO (Linux): elsewhere no queue can be read, and only a
// configured capacity works.
func readSocketQueue(conn syscall.Conn) (queued, size, drops uint32, err error) {
	return 0, 0, 0, errors.ErrUnsupported
}
