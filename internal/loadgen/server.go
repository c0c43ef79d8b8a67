package loadgen

import (
	"net"
	"net/netip"
	"syscall"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// The receiving side of a live test or benchmark: a socket whose queue never
// overflows, and the kernel's count of what it refused, so that a lost datagram is
// never mistaken for a limited one.

// Listen opens a UDP socket on addr ("udp4", "udp6" or "udp" for network) with a
// 32 MiB receive queue: deep enough that a reader never loses a datagram to overflow,
// which would look like limiting. It takes SO_RCVBUFFORCE (CAP_NET_ADMIN), else as
// much as net.core.rmem_max allows.
func Listen(network string, addr netip.AddrPort) (*net.UDPConn, error) {
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	err = sockopt.Control(conn, func(fd int) error {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20) == nil {
			return nil
		}
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 32<<20)
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// Drops returns the number of datagrams the kernel dropped on their way into conn:
// those its socket filter refused and those that found the receive queue full
// (SK_MEMINFO_DROPS of SO_MEMINFO).
func Drops(conn syscall.Conn) (uint32, error) {
	info, err := Meminfo(conn)
	return info[unix.SK_MEMINFO_DROPS], err
}

// Meminfo returns conn's memory counters (SO_MEMINFO), indexed by unix.SK_MEMINFO_*.
func Meminfo(conn syscall.Conn) ([unix.SK_MEMINFO_VARS]uint32, error) {
	return sockopt.Meminfo(conn)
}
