// Package testutil holds test helpers shared by the module's packages.
package testutil

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// AcceptLoop runs Accept until it fails, sending each connection on the returned
// channel, which is closed when Accept fails.
func AcceptLoop(l net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 64)
	go func() {
		defer close(ch)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

func DialFrom(t *testing.T, network string, local net.IP, addr net.Addr) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
	}
	c, err := d.Dial(network, addr.String())
	if err != nil {
		t.Fatalf("dial %v from %v: %v", addr, local, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ExpectAccepted waits for the server to accept a connection and checks that it is c's
// other end by sending a byte through it.
func ExpectAccepted(t *testing.T, ch <-chan net.Conn, c net.Conn) net.Conn {
	t.Helper()
	select {
	case s := <-ch:
		if s.RemoteAddr().String() != c.LocalAddr().String() {
			t.Fatalf("accepted %v, want %v", s.RemoteAddr(), c.LocalAddr())
		}
		if _, err := c.Write([]byte{42}); err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(s, b[:]); err != nil || b[0] != 42 {
			t.Fatalf("read on accepted conn: %v %v", b, err)
		}
		return s
	case <-time.After(5 * time.Second):
		t.Fatalf("connection from %v not accepted", c.LocalAddr())
	}
	return nil
}

// ExpectRefused dials addr from local and checks that the server closed the
// connection at once, without Accept returning it. On loopback the reset can come
// so fast that the dial itself reports it.
func ExpectRefused(t *testing.T, ch <-chan net.Conn, network string, local net.IP, addr net.Addr) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != nil {
		d.LocalAddr = &net.TCPAddr{IP: local}
	}
	c, err := d.Dial(network, addr.String())
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		_, err = c.Read(b[:])
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection from %v was not closed by the server: %v", c.LocalAddr(), err)
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("refused connection from %v: %v, want a reset", local, err)
	}
	select {
	case s := <-ch:
		t.Fatalf("Accept returned %v, which is over the limit", s.RemoteAddr())
	default:
	}
}
