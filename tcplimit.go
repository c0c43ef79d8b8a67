package rrl

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// DefaultTCPConnsPerClient is the per-client connection limit LimitListener uses when
// given a limit of zero or less.
const DefaultTCPConnsPerClient = 16

// TCPLimiter is a net.Listener for DNS over TCP that holds each client to a number of
// concurrent connections: per IPv4 address and per IPv6 /64 (the smallest network a
// single IPv6 host is commonly given, so a host cannot escape the limit by cycling
// through its addresses). IPv4-mapped IPv6 addresses count as IPv4.
//
// Only connections the kernel has completed count, that is, what the wrapped
// listener's Accept returns: a flood of spoofed SYNs never reaches Accept, so it
// cannot fill the table or lock a victim address out. A connection over the limit
// is reset as soon as it is accepted, and Accept goes on to the next one. A slot
// is released when the returned net.Conn is closed (once, however many times Close
// is called). The table has an entry only per client with an open connection, so
// it never holds more entries than there are open connections.
//
// The connections Accept returns are wrappers; their NetConn method returns the
// wrapped listener's connection (a *net.TCPConn) for its own methods. Connections
// whose remote address is not a TCP address pass unlimited and unwrapped (and are
// counted as accepted). Stats returns the counters. TCPLimiter is safe for
// concurrent use.
type TCPLimiter struct {
	net.Listener
	limit int32

	mu   sync.Mutex
	open map[netip.Prefix]int32 // open connections per client network; no zero entries

	accepted atomic.Uint64
	refused  atomic.Uint64
	current  atomic.Int64
}

// TCPLimiterStats are a TCPLimiter's counters.
type TCPLimiterStats struct {
	Accepted uint64 // connections returned by Accept
	Refused  uint64 // connections closed at once because their client was at its limit
	Open     int64  // connections returned by Accept and not yet closed
	Clients  int    // client networks with at least one open connection (table entries)
}

// LimitListener returns l limited to perClient concurrent connections per IPv4
// address and per IPv6 /64; perClient <= 0 means DefaultTCPConnsPerClient. Give the
// result to the server in place of l, e.g. as a miekg/dns Server's Listener.
func LimitListener(l net.Listener, perClient int) *TCPLimiter {
	if perClient <= 0 {
		perClient = DefaultTCPConnsPerClient
	}
	if perClient > 1<<30 {
		perClient = 1 << 30
	}
	return &TCPLimiter{Listener: l, limit: int32(perClient), open: make(map[netip.Prefix]int32)}
}

// Accept waits for and returns the next connection whose client is under its limit.
// Connections over the limit are closed and counted without returning. Errors of
// the wrapped listener are returned as they are.
func (t *TCPLimiter) Accept() (net.Conn, error) {
	for {
		c, err := t.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ta, ok := c.RemoteAddr().(*net.TCPAddr)
		if !ok {
			t.accepted.Add(1)
			return c, nil
		}
		key := tcpClientKey(ta.AddrPort().Addr())
		if !t.take(key) {
			t.refused.Add(1)
			if tc, ok := c.(*net.TCPConn); ok {
				// Reset rather than close: no FIN handshake, and no
				// TIME_WAIT entry per refused connection on this side.
				tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		t.accepted.Add(1)
		t.current.Add(1)
		return &limitedConn{Conn: c, t: t, key: key}, nil
	}
}

// take claims a slot for key, reporting false when key is at its limit.
func (t *TCPLimiter) take(key netip.Prefix) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.open[key]
	if n >= t.limit {
		return false
	}
	t.open[key] = n + 1
	return true
}

// release returns a slot of key, removing the entry when it was the last.
func (t *TCPLimiter) release(key netip.Prefix) {
	t.mu.Lock()
	if n := t.open[key]; n > 1 {
		t.open[key] = n - 1
	} else {
		delete(t.open, key)
	}
	t.mu.Unlock()
	t.current.Add(-1)
}

// Stats returns the limiter's counters.
func (t *TCPLimiter) Stats() TCPLimiterStats {
	t.mu.Lock()
	clients := len(t.open)
	t.mu.Unlock()
	return TCPLimiterStats{
		Accepted: t.accepted.Load(),
		Refused:  t.refused.Load(),
		Open:     t.current.Load(),
		Clients:  clients,
	}
}

// tcpClientKey returns the network a connection from a is counted against: the IPv4
// address itself, or the IPv6 /64 it is in.
func tcpClientKey(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	bits := 64
	if a.Is4() {
		bits = 32
	}
	p, _ := a.Prefix(bits)
	return p
}

// limitedConn releases its client's slot when closed.
type limitedConn struct {
	net.Conn
	t        *TCPLimiter
	key      netip.Prefix
	released atomic.Bool
}

// Close closes the connection and, the first time, releases its slot.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.t.release(c.key)
	}
	return err
}

// NetConn returns the connection Accept of the wrapped listener returned, for
// access to its own methods (such as (*net.TCPConn).SetKeepAlive). Close the
// limitedConn, not this one, or the slot is never released.
func (c *limitedConn) NetConn() net.Conn { return c.Conn }
