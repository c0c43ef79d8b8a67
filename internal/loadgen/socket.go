package loadgen

import (
	"errors"
	"net"
	"net/netip"
)

// SocketSender sends UDP datagrams from ordinary sockets bound to each wanted source
// address, the way an unprivileged process can have many sources: any 127.x.y.z on
// Linux loopback (or any address of a local route), ports from 1024 up. Port 0 binds
// an ephemeral port. It keeps one socket per source and, past max sockets, closes the
// oldest. It is not safe for concurrent use.
type SocketSender struct {
	dst   netip.AddrPort
	max   int
	conns map[netip.AddrPort]*net.UDPConn
	order []netip.AddrPort // oldest first
}

// NewSocketSender returns a sender to dst keeping at most max sockets open.
func NewSocketSender(dst netip.AddrPort, max int) *SocketSender {
	return &SocketSender{dst: dst, max: max, conns: map[netip.AddrPort]*net.UDPConn{}}
}

// Send sends payload from src, binding a socket to src first if it has none.
func (s *SocketSender) Send(src netip.AddrPort, payload []byte) error {
	c, ok := s.conns[src]
	if !ok {
		if len(s.order) >= s.max {
			s.conns[s.order[0]].Close()
			delete(s.conns, s.order[0])
			s.order = s.order[1:]
		}
		var err error
		if c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(src)); err != nil {
			return err
		}
		s.conns[src] = c
		s.order = append(s.order, src)
	}
	_, err := c.WriteToUDPAddrPort(payload, s.dst)
	return err
}

// Close closes every socket.
func (s *SocketSender) Close() error {
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, c.Close())
	}
	s.conns, s.order = map[netip.AddrPort]*net.UDPConn{}, nil
	return errors.Join(errs...)
}
