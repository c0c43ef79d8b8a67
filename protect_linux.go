//go:build linux

package rrl

import (
	"net/netip"
	"syscall"
	"time"

	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/sockopt"
)

// foundSocket is a UDP socket of this process that AttachLocal found.
type foundSocket struct {
	conn  syscall.Conn
	id    socketID
	fd    int
	local netip.AddrPort
}

// localSockets returns this process's UDP sockets bound to local (see AttachLocal).
// A descriptor found may be closed before it is looked at (a framework closing its
// copy of a socket as a reload ends, while another copy lives on): the scan is then
// made again, a few times, so that the socket is found through the copy that stays.
func localSockets(local netip.AddrPort) ([]foundSocket, error) {
	var err error
	for range 5 {
		var out []foundSocket
		if out, err = scanLocalSockets(local); err == nil || !isClosedSocket(err) {
			return out, err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, err
}

// scanLocalSockets is one scan of localSockets.
func scanLocalSockets(local netip.AddrPort) ([]foundSocket, error) {
	socks, err := procsock.UDP(0, local)
	if err != nil {
		return nil, err
	}
	out := make([]foundSocket, 0, len(socks))
	for _, s := range socks {
		c := procsock.Borrow(s)
		id, err := identify(c)
		if err != nil {
			return nil, err
		}
		out = append(out, foundSocket{conn: c, id: id, fd: s.FD, local: netip.AddrPortFrom(s.Local.Addr().Unmap().WithZone(""), s.Local.Port())})
	}
	return out, nil
}

// filterOwning returns the Filter of this process that attached the socket last, or
// nil.
func filterOwning(id socketID) *Filter {
	socketOwners.Lock()
	defer socketOwners.Unlock()
	return socketOwners.m[id]
}

// checkUDP returns an error unless conn is an open UDP socket: one that says there
// is no socket, that it is closed, or that it is not UDP.
func checkUDP(conn syscall.Conn) error {
	if err := checkSocketArg(conn); err != nil {
		return err
	}
	return closedSocketError(sockopt.Control(conn, checkUDPSocket))
}
