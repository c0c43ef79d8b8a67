// Package tcplimit limits the TCP connections a DNS server accepts, per client
// network and in all, as a net.Listener wrapper (like x/net/netutil's LimitListener).
package tcplimit

import (
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultConnsPerClient is the per-client connection limit LimitListener uses when
// given a limit of zero or less.
const DefaultConnsPerClient = 16

// Listener is a net.Listener for DNS over TCP that holds each client to a number of
// concurrent connections, per IPv4 address and per IPv6 /64 (the smallest network a
// single IPv6 host is commonly given, so a host cannot escape the limit by cycling
// through its addresses), and all clients together to a total. IPv4-mapped IPv6
// addresses count as IPv4.
//
// Only connections the kernel has completed count, that is, what the wrapped
// listener's Accept returns: a flood of spoofed SYNs never reaches Accept, so it
// cannot fill the table or lock a victim address out. A connection over its
// client's limit is reset as soon as it is accepted, and Accept goes on to the next
// one. A new connection that finds the total reached is served, and an open one is
// reset to make room: the oldest connection of the client with the most open
// connections among the oldest few (evicted), so that clients holding many
// connections pay for newcomers and a new client is always served. A slot is
// released when the returned net.Conn is closed (once, however many times Close is
// called). The table has an entry only per client with an open connection, so it
// never holds more entries than there are open connections.
//
// When the wrapped listener's Accept fails for want of resources (EMFILE, ENFILE,
// ENOBUFS, ENOMEM), Accept does not return the error, which would have the server
// try again at once and spin: it resets an open connection when descriptors ran
// out, pauses (5 ms, doubling up to 1 s while the failures last) and tries again.
// Close ends a pause.
//
// The connections Accept returns are wrappers; their NetConn method returns the
// wrapped listener's connection for its own methods, and when that has a
// ConnectionState method (a *tls.Conn, for DNS over TLS with the TLS listener
// inside the limiter) so does the wrapper, so that miekg/dns and handlers see the
// TLS state. Connections whose remote address is not a TCP address pass unlimited
// and unwrapped (and are counted as accepted). Stats returns the counters.
// Listener is safe for concurrent use.
type Listener struct {
	net.Listener
	limit int32
	total int64

	mu             sync.Mutex
	open           map[netip.Prefix]int32 // open connections per client network; no zero entries
	oldest, newest *limitedConn           // open connections in the order they were accepted

	closed    chan struct{}
	closeOnce sync.Once

	accepted     atomic.Uint64
	refused      atomic.Uint64
	evicted      atomic.Uint64
	acceptErrors [acceptErrorKinds]atomic.Uint64
	current      atomic.Int64
}

// Stats are a Listener's counters.
type Stats struct {
	Accepted uint64 // connections returned by Accept
	Refused  uint64 // connections reset at once because their client was at its limit
	Open     int64  // connections returned by Accept and not yet closed
	Clients  int    // client networks with at least one open connection (table entries)
	// Evicted counts open connections reset to make room for a new one at the
	// total limit, or when descriptors ran out.
	Evicted uint64
	// AcceptErrors counts failures of the wrapped listener's Accept that Accept
	// paused after and retried: [0] for want of descriptors (EMFILE, ENFILE), [1]
	// for want of memory (ENOBUFS, ENOMEM).
	AcceptErrors [2]uint64
}

// acceptErrorKinds is the length of Stats.AcceptErrors.
const acceptErrorKinds = 2

// LimitListener returns l limited to perClient concurrent connections per IPv4
// address and per IPv6 /64 (perClient <= 0 means DefaultConnsPerClient) and to
// DefaultConns in all. Give the result to the server in place of l, e.g. as a
// miekg/dns Server's Listener.
func LimitListener(l net.Listener, perClient int) *Listener {
	return LimitListenerTotal(l, perClient, 0)
}

// LimitListenerTotal is LimitListener with a total limit of its own: at most total
// connections open at once (total <= 0 means DefaultConns).
func LimitListenerTotal(l net.Listener, perClient, total int) *Listener {
	if perClient <= 0 {
		perClient = DefaultConnsPerClient
	}
	perClient = min(perClient, 1<<30)
	if total <= 0 {
		total = DefaultConns()
	}
	return &Listener{Listener: l, limit: int32(perClient), total: int64(total),
		open: make(map[netip.Prefix]int32), closed: make(chan struct{})}
}

// DefaultConns returns the total connection limit LimitListener uses: half the
// process's soft limit on open files (RLIMIT_NOFILE, as Knot DNS does), which
// leaves the other half for UDP sockets, files and the rest of the process; at
// least 1 and at most 1<<20. Where the limit cannot be read it is 512.
func DefaultConns() int {
	n, ok := openFileLimit()
	if !ok {
		return 512
	}
	return int(max(1, min(n/2, 1<<20)))
}

// MaxConns returns the total connection limit.
func (t *Listener) MaxConns() int { return int(t.total) }

// Close closes the wrapped listener and ends a pause of Accept.
func (t *Listener) Close() error {
	t.closeOnce.Do(func() { close(t.closed) })
	return t.Listener.Close()
}

// Accept waits for and returns the next connection whose client is under its limit.
// Connections over the limit are closed and counted without returning. Errors of
// the wrapped listener are returned as they are, except those for want of
// resources, which are waited out (see Listener).
func (t *Listener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := t.Listener.Accept()
		if err != nil {
			kind, retry := acceptErrorKind(err)
			if !retry {
				return nil, err
			}
			t.acceptErrors[kind].Add(1)
			if kind == 0 {
				t.evict() // a descriptor for the connection waiting
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			select {
			case <-t.closed:
				return nil, err
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		ta, ok := c.RemoteAddr().(*net.TCPAddr)
		if !ok {
			t.accepted.Add(1)
			return c, nil
		}
		lc := &limitedConn{Conn: c, t: t, key: tcpClientKey(ta.AddrPort().Addr())}
		victim, ok := t.take(lc)
		if victim != nil {
			victim.reset()
		}
		if !ok {
			t.refused.Add(1)
			resetConn(c)
			continue
		}
		t.accepted.Add(1)
		if _, isTLS := c.(tlsStater); isTLS {
			return limitedTLSConn{lc}, nil
		}
		return lc, nil
	}
}

// acceptErrorKind returns the AcceptErrors index of err, and whether Accept waits
// it out.
func acceptErrorKind(err error) (int, bool) {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return 0, true
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return 1, true
	}
	return 0, false
}

// take claims a slot for c, reporting false when its client is at its limit. At the
// total limit it evicts a connection, returned for the caller to reset.
func (t *Listener) take(c *limitedConn) (victim *limitedConn, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.open[c.key]
	if n >= t.limit {
		return nil, false
	}
	if t.current.Load() >= t.total {
		victim = t.evictLocked()
		n = t.open[c.key] // the victim may have been c's client's
	}
	t.open[c.key] = n + 1
	t.current.Add(1)
	c.prev = t.newest
	if t.newest != nil {
		t.newest.next = c
	} else {
		t.oldest = c
	}
	t.newest = c
	return victim, true
}

// evictScan is how many of the oldest connections eviction looks at.
const evictScan = 64

// evictLocked releases the slot of the oldest connection of the client with the
// most open connections among the evictScan oldest, and returns it (or nil).
func (t *Listener) evictLocked() *limitedConn {
	var victim *limitedConn
	most := int32(0)
	i := 0
	for c := t.oldest; c != nil && i < evictScan; c, i = c.next, i+1 {
		if n := t.open[c.key]; n > most {
			victim, most = c, n
		}
	}
	if victim == nil || !victim.released.CompareAndSwap(false, true) {
		return nil
	}
	t.releaseLocked(victim)
	t.evicted.Add(1)
	return victim
}

// evict evicts a connection and resets it.
func (t *Listener) evict() {
	t.mu.Lock()
	victim := t.evictLocked()
	t.mu.Unlock()
	if victim != nil {
		victim.reset()
	}
}

// releaseLocked returns the slot of c, removing its client's entry when it was the
// last.
func (t *Listener) releaseLocked(c *limitedConn) {
	if n := t.open[c.key]; n > 1 {
		t.open[c.key] = n - 1
	} else {
		delete(t.open, c.key)
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		t.oldest = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		t.newest = c.prev
	}
	c.prev, c.next = nil, nil
	t.current.Add(-1)
}

// Stats returns the limiter's counters.
func (t *Listener) Stats() Stats {
	t.mu.Lock()
	clients := len(t.open)
	t.mu.Unlock()
	s := Stats{
		Accepted: t.accepted.Load(),
		Refused:  t.refused.Load(),
		Open:     t.current.Load(),
		Clients:  clients,
		Evicted:  t.evicted.Load(),
	}
	for i := range s.AcceptErrors {
		s.AcceptErrors[i] = t.acceptErrors[i].Load()
	}
	return s
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

// resetConn closes c with a reset rather than a FIN handshake: no TIME_WAIT entry
// on this side, and nothing more to send (for a TLS connection, the TCP connection
// under it is closed).
func resetConn(c net.Conn) {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// limitedConn releases its client's slot when closed.
type limitedConn struct {
	net.Conn
	t          *Listener
	key        netip.Prefix
	released   atomic.Bool
	prev, next *limitedConn // in t's list while not released; guarded by t.mu
}

// Close closes the connection and, the first time, releases its slot.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.t.mu.Lock()
		c.t.releaseLocked(c)
		c.t.mu.Unlock()
	}
	return err
}

// reset closes an evicted connection (its slot is already released); the server
// reading from it gets an error and closes it in turn.
func (c *limitedConn) reset() { resetConn(c.Conn) }

// NetConn returns the connection Accept of the wrapped listener returned, for
// access to its own methods (such as (*net.TCPConn).SetKeepAlive). Close the
// limitedConn, not this one, or the slot is never released.
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// tlsStater is what miekg/dns looks for on a connection to find its TLS state.
type tlsStater interface {
	ConnectionState() tls.ConnectionState
}

// limitedTLSConn is a limitedConn over a connection with a TLS state.
type limitedTLSConn struct{ *limitedConn }

// ConnectionState returns the TLS state of the wrapped connection.
func (c limitedTLSConn) ConnectionState() tls.ConnectionState {
	return c.Conn.(tlsStater).ConnectionState()
}
