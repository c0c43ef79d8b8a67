//go:build linux

package rrl

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// A socket holds one filter at a time, and the kernel does not say whose it is. So
// that closing a Filter never strips a filter another Filter put on the socket later
// (the natural reload: attach the new one, then close the old), the package
// remembers which Filter of this process attached each socket last, and Close and
// Update touch only the sockets a Filter still owns. Filters attached by other
// processes (rrlctl attach) are not known here.

// socketID identifies a socket whatever descriptor reaches it: its inode on sockfs.
type socketID struct{ dev, ino uint64 }

// attachedSocket is a socket a Filter attached to.
type attachedSocket struct {
	conn syscall.Conn
	id   socketID
}

var socketOwners = struct {
	sync.Mutex
	m map[socketID]*Filter
}{m: map[socketID]*Filter{}}

// identify returns conn's socket identity.
func identify(conn syscall.Conn) (socketID, error) {
	var id socketID
	err := sockopt.Control(conn, func(fd int) error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		id = socketID{dev: st.Dev, ino: st.Ino}
		return nil
	})
	return id, err
}

// own records that f attached the socket last.
func (f *Filter) own(conn syscall.Conn, id socketID) {
	socketOwners.Lock()
	socketOwners.m[id] = f
	socketOwners.Unlock()
	for _, s := range f.sockets {
		if s.id == id {
			return
		}
	}
	f.sockets = append(f.sockets, attachedSocket{conn: conn, id: id})
}

// owns reports whether f is still the last Filter that attached s.
func (f *Filter) owns(s attachedSocket) bool {
	socketOwners.Lock()
	defer socketOwners.Unlock()
	return socketOwners.m[s.id] == f
}

// disown forgets f's claim on s, leaving a later owner's in place.
func (f *Filter) disown(s attachedSocket) {
	socketOwners.Lock()
	if socketOwners.m[s.id] == f {
		delete(socketOwners.m, s.id)
	}
	socketOwners.Unlock()
}

// ownedSockets returns the sockets f still owns.
func (f *Filter) ownedSockets() []attachedSocket {
	var out []attachedSocket
	for _, s := range f.sockets {
		if f.owns(s) {
			out = append(out, s)
		}
	}
	return out
}

// isClosedSocket reports whether err says the socket was closed before we reached it,
// the usual order at shutdown (the server closes its socket, then the Filter).
func isClosedSocket(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) ||
		errors.Is(err, unix.EBADF) || errors.Is(err, unix.ENOTSOCK)
}
