//go:build !linux

package sockopt

import (
	"errors"
	"syscall"
)

// ReceiveQueue needs SO_MEMINFO (Linux): elsewhere no queue can be read, so only a
// capacity given in the Config works.
func ReceiveQueue(conn syscall.Conn) (queued, size, drops uint32, err error) {
	return 0, 0, 0, errors.ErrUnsupported
}
