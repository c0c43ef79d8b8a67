//go:build linux

package rrl

import (
	"fmt"
	"syscall"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Raw socket access for the filters. Every socket option call goes through
// sockopt.Control, which hands the descriptor to a function returning an error and
// returns that error.

// socketDomain returns the address family of the socket (unix.AF_INET or
// unix.AF_INET6). An AF_INET6 socket may also receive IPv4 packets: see socketV6Only.
func socketDomain(fd int) (int, error) {
	return unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
}

// socketV6Only reports whether an AF_INET6 socket refuses IPv4 (IPV6_V6ONLY). A
// dual-stack socket (false) receives IPv4 packets too, with the same UDP header
// offsets as seen by a socket filter.
func socketV6Only(fd int) (bool, error) {
	v, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
	return v != 0, err
}

// checkUDPSocket returns an error unless fd is an IPv4 or IPv6 UDP socket. The filters
// read the packet from the UDP header, which is where the kernel starts a socket
// filter's data only on UDP sockets: on any other socket their offsets would be wrong.
func checkUDPSocket(fd int) error {
	domain, err := socketDomain(fd)
	if err != nil {
		return fmt.Errorf("get socket domain: %w", err)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("get socket type: %w", err)
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return fmt.Errorf("get socket protocol: %w", err)
	}
	if (domain != unix.AF_INET && domain != unix.AF_INET6) ||
		typ != unix.SOCK_DGRAM || proto != unix.IPPROTO_UDP {
		return fmt.Errorf("not a UDP socket (domain %d, type %d, protocol %d)", domain, typ, proto)
	}
	return nil
}

// attachClassic attaches the prefilter for cfg to conn, a UDP socket, replacing any
// socket filter it had (classic or eBPF). No privilege is needed. Datagrams queued
// before the call are not filtered: attach before the server starts reading.
func attachClassic(conn syscall.Conn, cfg *Config) error {
	prog, err := classicProgram(cfg)
	if err != nil {
		return err
	}
	return attachRawFilter(conn, prog, "attach classic filter")
}

// attachRawFilter attaches the classic program prog to conn, a UDP socket, with
// SO_ATTACH_FILTER; op names the operation in errors.
func attachRawFilter(conn syscall.Conn, prog []bpf.RawInstruction, op string) error {
	if len(prog) == 0 || len(prog) > maxClassicInsns {
		return fmt.Errorf("%s: program of %d instructions", op, len(prog))
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	return sockopt.Control(conn, func(fd int) error {
		if err := checkUDPSocket(fd); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog)
		return sockoptError(op, err)
	})
}

// detachFilter removes conn's socket filter, classic or eBPF (SO_DETACH_FILTER and
// SO_DETACH_BPF are the same option). A socket without a filter gives an error
// matching unix.ENOENT.
func detachFilter(conn syscall.Conn) error {
	return sockopt.Control(conn, func(fd int) error {
		err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
		return sockoptError("detach filter", err)
	})
}
