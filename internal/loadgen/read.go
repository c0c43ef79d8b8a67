package loadgen

import (
	"net"
	"net/netip"
	"time"
)

// ReadUntil reads datagrams from conn and calls fn with each and its source
// (IPv4-mapped sources unmapped), until stop is closed and then nothing has arrived
// for quiet; with a nil stop, until the first quiet period. It gives up after max in
// any case. It changes conn's read deadline.
func ReadUntil(conn *net.UDPConn, stop <-chan struct{}, quiet, max time.Duration, fn func(b []byte, from netip.AddrPort)) {
	buf := make([]byte, 2048)
	deadline := time.Now().Add(max)
	stopped := stop == nil
	for time.Now().Before(deadline) {
		if !stopped {
			select {
			case <-stop:
				stopped = true
			default:
			}
		}
		conn.SetReadDeadline(time.Now().Add(quiet))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if stopped {
				return
			}
			continue
		}
		fn(buf[:n], netip.AddrPortFrom(from.Addr().Unmap(), from.Port()))
	}
}
