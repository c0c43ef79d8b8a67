//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/dnsrake/rrl/internal/procsock"
)

// attachLocal attaches one Filter, configured by cfg, to every UDP socket of this
// process bound to local; an unspecified address (0.0.0.0 or ::) in local matches
// sockets bound to any address on that port, and port 0 is an error.
//
// It is for servers whose sockets a framework opens: it finds them by matching the
// socket inodes of this process's descriptors (/proc/self/fd) against the UDP
// sockets of its network namespace and their local addresses (/proc/self/net/udp and
// udp6), so both families match, as do the sockets of a SO_REUSEPORT group (which
// then hold one limit together), an AF_INET6 dual-stack socket for an unspecified
// local address of either family, and an IPv4-mapped bind for its IPv4 address. TCP
// sockets never match. When none matches, nothing is attached and the error says what
// the process has on that port.
//
// Errors and the classic fallback are those of Attach. The Filter follows each socket,
// not the descriptor it was found through: when the process closes that descriptor
// but keeps another of the same socket (a reload that hands the socket to a new
// server as a copy), Update and Close reach the socket through the other; a socket
// with no descriptor left is gone and left alone, and so is a new socket that took
// the closed descriptor's number. Close detaches the filter and leaves the sockets
// open. Sockets opened after the call are not protected: call Filter.attachLocal.
func attachLocal(local netip.AddrPort, cfg *Config) (*Filter, error) {
	socks, err := procsock.UDP(0, local)
	if err != nil {
		return nil, fmt.Errorf("rrl: attach to %s: %w", local, err)
	}
	f, err := Attach(procsock.Borrow(socks[0]), cfg)
	if f == nil {
		return nil, err
	}
	// err may report a fallback to the classic filter: the other sockets get the same.
	if aerr := f.attachSockets(socks[1:]); aerr != nil {
		f.Close()
		return nil, aerr
	}
	return f, err
}

// attachLocal adds every UDP socket of this process bound to local to f, found as the
// function attachLocal finds them: for sockets a server opened since f was attached
// (a reload that added some). A socket f is on already keeps the filter, which from
// then on reaches it through the descriptor found now. It tries every socket and
// returns the errors of those it could not attach.
func (f *Filter) attachLocal(local netip.AddrPort) error {
	socks, err := procsock.UDP(0, local)
	if err != nil {
		return fmt.Errorf("rrl: attach to %s: %w", local, err)
	}
	return f.attachSockets(socks)
}

// attachSockets attaches f to every one of socks.
func (f *Filter) attachSockets(socks []procsock.Socket) error {
	var errs []error
	for _, s := range socks {
		if err := f.Attach(procsock.Borrow(s)); err != nil {
			errs = append(errs, fmt.Errorf("rrl: attach to socket %s (inode %d, descriptor %d): %w", s.Local, s.Inode, s.FD, err))
		}
	}
	return errors.Join(errs...)
}
