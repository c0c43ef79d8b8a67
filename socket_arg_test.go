//go:build linux

package rrl

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// badSocket is a socket no call of the package can protect, and what its error says.
type badSocket struct {
	name string
	conn func(t *testing.T) syscall.Conn // nil: a nil syscall.Conn
	udp  bool                            // conn is a *net.UDPConn
	want string                          // a phrase of the error
}

// badSockets returns every kind of socket argument that cannot be protected: none,
// a nil *net.UDPConn inside the interface, a closed UDP socket, and sockets that are
// not UDP. The nil interface and the sockets that are not *net.UDPConn are typed
// otherwise only for the calls that take a syscall.Conn.
func badSockets() []badSocket {
	return []badSocket{
		{"nil", nil, false, "no socket"},
		{"nil *net.UDPConn", func(*testing.T) syscall.Conn { return (*net.UDPConn)(nil) }, true, "no socket"},
		{"closed UDP", func(t *testing.T) syscall.Conn {
			c := listenUDP(t)
			c.Close()
			return c
		}, true, "the socket is closed"},
		{"TCP listener", func(t *testing.T) syscall.Conn {
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		}, false, "not a UDP socket"},
		{"TCP connection", func(t *testing.T) syscall.Conn {
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			c, err := net.DialTCP("tcp4", nil, l.Addr().(*net.TCPAddr))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}, false, "not a UDP socket"},
		{"UDP-Lite", func(t *testing.T) syscall.Conn {
			// A datagram socket of another protocol than UDP that the net package
			// still returns as a *net.UDPConn.
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE)
			if err != nil {
				t.Skipf("this kernel has no UDP-Lite to make a non-UDP *net.UDPConn with: %v", err)
			}
			f := os.NewFile(uintptr(fd), "udplite")
			defer f.Close()
			c, err := net.FileConn(f)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c.(*net.UDPConn)
		}, true, "not a UDP socket"},
		{"unixgram", func(t *testing.T) syscall.Conn {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}, false, "not a UDP socket"},
	}
}

// TestBadSocketArguments: every exported call that takes a socket returns an error
// that says what is wrong with it for a nil, closed or non-UDP socket, and never
// panics. Calls typed *net.UDPConn get the sockets of that type.
func TestBadSocketArguments(t *testing.T) {
	good := listenUDP(t)
	f, _ := Attach(good, nil) // the eBPF filter, or the classic one without CAP_BPF
	if f == nil {
		t.Fatal("Attach to a UDP socket returned no Filter")
	}
	defer f.Close()
	// A pinned directory that does not exist: the socket is checked first.
	noPins := filepath.Join(t.TempDir(), "pins")

	calls := []struct {
		name string
		call func(t *testing.T, conn syscall.Conn) error
		udp  bool // takes a *net.UDPConn
	}{
		{"Attach", func(t *testing.T, conn syscall.Conn) error {
			f, err := Attach(conn, nil)
			if f != nil {
				f.Close()
				t.Error("a Filter returned with the error")
			}
			return err
		}, false},
		{"AttachPinned", func(t *testing.T, conn syscall.Conn) error {
			f, err := AttachPinned(conn, noPins)
			if f != nil {
				f.Close()
				t.Error("a Filter returned with the error")
			}
			return err
		}, false},
		{"Filter.Attach", func(t *testing.T, conn syscall.Conn) error { return f.Attach(conn) }, false},
		{"Filter.RunCapacity", func(t *testing.T, conn syscall.Conn) error {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return f.RunCapacity(ctx, good, conn)
		}, false},
		{"Protect", func(t *testing.T, conn syscall.Conn) error {
			p, err := Protect(conn.(*net.UDPConn), dns.HandlerFunc(noAnswer), nil)
			if p != nil {
				p.Close()
				t.Error("a Protection returned with the error")
			}
			return err
		}, true},
		{"Protection.AddUDP", func(t *testing.T, conn syscall.Conn) error {
			p, err := NewProtection(dns.HandlerFunc(noAnswer), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			srv, err := p.AddUDP(conn.(*net.UDPConn))
			if srv != nil {
				t.Error("a server returned with the error")
			}
			if st := p.Status(); st.Sockets != 0 {
				t.Errorf("status %v: the socket was counted", st)
			}
			return err
		}, true},
	}
	for _, c := range calls {
		for _, s := range badSockets() {
			if c.udp && !s.udp {
				continue // not a *net.UDPConn: the call's type refuses it
			}
			t.Run(c.name+"/"+s.name, func(t *testing.T) {
				var conn syscall.Conn
				if s.conn != nil {
					conn = s.conn(t)
				}
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("panic: %v", r)
						}
					}()
					err = c.call(t, conn)
				}()
				if err == nil || !strings.Contains(err.Error(), s.want) {
					t.Fatalf("error %v, want one saying %q", err, s.want)
				}
				if strings.Count(err.Error(), "rrl:") > 1 {
					t.Errorf("error %q repeats its prefix", err)
				}
				if s.want == "the socket is closed" && !errors.Is(err, net.ErrClosed) {
					t.Errorf("error %v: errors.Is(err, net.ErrClosed) is false", err)
				}
			})
		}
	}
}

// TestTCPServerBadListener: a TCP server made for no listener, or a closed one,
// fails to serve with an error instead of panicking.
func TestTCPServerBadListener(t *testing.T) {
	closed, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	for _, c := range []struct {
		name string
		l    net.Listener
	}{
		{"nil", nil},
		{"nil *net.TCPListener", (*net.TCPListener)(nil)},
		{"closed", closed},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewProtection(dns.HandlerFunc(noAnswer), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("panic: %v", r)
				}
			}()
			if err := p.TCPServer(c.l).ActivateAndServe(); err == nil {
				t.Error("ActivateAndServe: no error")
			}
		})
	}
}

// noAnswer is a handler that writes nothing.
func noAnswer(dns.ResponseWriter, *dns.Msg) {}
