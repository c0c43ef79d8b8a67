//go:build !linux

package rrl

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// socketID identifies a socket; elsewhere than on Linux sockets are told apart by
// their *net.UDPConn.
type socketID struct{ dev, ino uint64 }

type foundSocket struct {
	conn  syscall.Conn
	id    socketID
	fd    int
	local netip.AddrPort
}

func identify(conn syscall.Conn) (socketID, error)             { return socketID{}, nil }
func localSockets(local netip.AddrPort) ([]foundSocket, error) { return nil, errNotLinux }
func filterOwning(id socketID) *Filter                         { return nil }
func checkUDP(conn syscall.Conn) error                         { return checkSocketArg(conn) }

// isClosedSocket reports whether err says the descriptor was closed before it was
// used.
func isClosedSocket(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed)
}
