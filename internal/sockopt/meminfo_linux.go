package sockopt

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Meminfo returns conn's memory counters (SO_MEMINFO), indexed by unix.SK_MEMINFO_*.
func Meminfo(conn syscall.Conn) ([unix.SK_MEMINFO_VARS]uint32, error) {
	var info [unix.SK_MEMINFO_VARS]uint32
	err := Control(conn, func(fd int) error {
		size := uint32(unsafe.Sizeof(info))
		// x/sys/unix has no getsockopt for an array of integers.
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET,
			unix.SO_MEMINFO, uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			return fmt.Errorf("SO_MEMINFO: %w", errno)
		}
		if size <= unix.SK_MEMINFO_DROPS*4 {
			return fmt.Errorf("SO_MEMINFO returned %d bytes, no drop counter", size)
		}
		return nil
	})
	return info, err
}

// ReceiveQueue returns the bytes in conn's receive queue, the queue's size and the
// socket's drop counter, which counts both the queue's overflows and the socket
// filter's drops.
func ReceiveQueue(conn syscall.Conn) (queued, size, drops uint32, err error) {
	info, err := Meminfo(conn)
	return info[unix.SK_MEMINFO_RMEM_ALLOC], info[unix.SK_MEMINFO_RCVBUF], info[unix.SK_MEMINFO_DROPS], err
}
