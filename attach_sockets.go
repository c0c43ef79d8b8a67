//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// A socket holds one filter at a time, and the kernel does not say whose it is. So
// that closing a Filter never strips a filter another Filter put on the socket later
// (the natural reload: attach the new one, then close the old), the package
// remembers which Filter of this process attached each socket last, and Close and
// Update touch only the sockets a Filter still owns. Filters attached by other
// processes (rrlctl attach) are not known here.
//
// A filter belongs to the socket, not to the descriptor it was attached through, and
// a socket may outlive that descriptor: a CoreDNS reload hands the new server a
// duplicate of the socket's descriptor and closes the old one before the old
// plugin's shutdown hook runs. So a Filter follows each socket by its identity and
// reaches it through the descriptor it saw last while that one is open, and
// otherwise through any other descriptor of the same socket it finds in
// /proc/self/fd. Only when the process has no descriptor of it left is the socket
// gone, and then the filter went with it.
//
// Holding a duplicate descriptor of each socket instead would spare the scan, but it
// would keep the socket alive after the server closed it: the port stays bound (a
// restarted server without SO_REUSEPORT cannot bind it), and a socket of a
// SO_REUSEPORT group that nobody reads any more keeps its share of the group's
// queries, which queue there unanswered. The scan costs a read of /proc/self/fd,
// and is made only when the descriptor seen last is closed; the descriptor found is
// borrowed, and copied only for the length of one call (procsock.Conn.Control).

// socketID identifies a socket whatever descriptor reaches it: its inode on sockfs,
// and its cookie (SO_COOKIE), which tells two sockets apart even when the kernel's
// 32-bit inode counter, which every pipe and TCP connection advances, has wrapped
// and given a new socket the inode number of an old one. Where the kernel has no
// SO_COOKIE (an old kernel), the cookie is 0 and the inode alone counts.
type socketID struct{ dev, ino, cookie uint64 }

// attachedSocket is a socket a Filter attached to.
type attachedSocket struct {
	conn  syscall.Conn   // the descriptor seen last; it may be closed since
	id    socketID       // the socket's identity, which outlives any descriptor
	local netip.AddrPort // its local address when attached, to name it in errors
}

// identify returns conn's socket identity.
func identify(conn syscall.Conn) (socketID, error) {
	var id socketID
	err := sockopt.Control(conn, func(fd int) (err error) {
		id, err = identityOf(fd)
		return err
	})
	return id, err
}

// identityOf returns the identity of the socket fd refers to.
func identityOf(fd int) (socketID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return socketID{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return socketID{}, unix.ENOTSOCK
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if errors.Is(err, unix.ENOPROTOOPT) {
		cookie, err = 0, nil
	}
	return socketID{dev: st.Dev, ino: st.Ino, cookie: cookie}, err
}

// localAddr returns the address conn's socket is bound to, or the zero AddrPort.
func localAddr(conn syscall.Conn) netip.AddrPort {
	var local netip.AddrPort
	sockopt.Control(conn, func(fd int) error {
		sa, err := unix.Getsockname(fd)
		switch a := sa.(type) {
		case *unix.SockaddrInet4:
			local = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
		case *unix.SockaddrInet6:
			local = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
		}
		return err
	})
	return local
}

// errSocketGone says that the process has no descriptor of a socket left: it is
// closed (or lives on only in other processes), and its filter with it.
var errSocketGone = errors.New("no descriptor of the socket is open in this process")

// errOtherFile says that a descriptor refers to another file than the socket.
var errOtherFile = errors.New("the descriptor refers to another file")

// reach runs fn on s's socket, through the descriptor f saw last if it is still open
// and still that socket, else through another descriptor of the socket found in
// /proc/self/fd, which f then remembers. It returns an error matching errSocketGone
// when the process has no descriptor of the socket left, and fn's error or why the
// socket could not be reached otherwise. fn gets the descriptor as a syscall.Conn
// valid only while it runs.
func (s *attachedSocket) reach(fn func(conn syscall.Conn) error) error {
	err := s.control(s.conn, fn)
	if !isStaleDescriptor(err) {
		return err
	}
	// A server that moves the socket to another descriptor (dup, then close the
	// old) while the directory is read can hide it from one scan: it is gone only
	// when two scans in a row find no descriptor that reaches it.
	for missed := 0; missed < 2; missed++ {
		conns, ferr := procsock.Descriptors(s.id.ino)
		if ferr != nil {
			return fmt.Errorf("its descriptor is closed, and finding another failed: %w", ferr)
		}
		for _, c := range conns {
			if err := s.control(c, fn); !isStaleDescriptor(err) {
				s.conn = c
				return err
			}
		}
	}
	return errSocketGone
}

// control runs fn on conn if conn's descriptor still refers to s's socket.
func (s *attachedSocket) control(conn syscall.Conn, fn func(conn syscall.Conn) error) error {
	return sockopt.Control(conn, func(fd int) error {
		if id, err := identityOf(fd); err != nil || id != s.id {
			return errOtherFile
		}
		return fn(heldFD(fd))
	})
}

// errorf names s in err, an error of op on it.
func (s *attachedSocket) errorf(op string, err error) error {
	return fmt.Errorf("rrl: %s: socket %s (inode %d): %w", op, s.local, s.id.ino, err)
}

// isStaleDescriptor reports whether err says that a descriptor no longer reaches
// the socket it was kept for.
func isStaleDescriptor(err error) bool {
	return errors.Is(err, errOtherFile) || isClosedSocket(err)
}

// isClosedSocket reports whether err says the descriptor was closed before we
// reached it.
func isClosedSocket(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) ||
		errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENOTSOCK)
}

// heldFD is a descriptor that stays open while a reach callback runs, as a
// syscall.Conn for the socket option helpers.
type heldFD int

func (h heldFD) SyscallConn() (syscall.RawConn, error) { return h, nil }

func (h heldFD) Control(fn func(fd uintptr)) error { fn(uintptr(h)); return nil }

func (h heldFD) Read(func(fd uintptr) bool) error { return errors.ErrUnsupported }

func (h heldFD) Write(func(fd uintptr) bool) error { return errors.ErrUnsupported }
