package rrl

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

func TestControlReturnsFnError(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	errMine := errors.New("mine")
	var seen int
	if err := sockopt.Control(conn, func(fd int) error { seen = fd; return errMine }); err != errMine {
		t.Errorf("control returned %v, want fn's error", err)
	}
	if seen <= 0 {
		t.Errorf("fn saw descriptor %d", seen)
	}
	if err := sockopt.Control(conn, func(int) error { return nil }); err != nil {
		t.Errorf("control with a nil fn error: %v", err)
	}

	conn.Close()
	called := false
	if err := sockopt.Control(conn, func(int) error { called = true; return nil }); err == nil || called {
		t.Errorf("control on a closed conn: err %v, fn called %v", err, called)
	}
}

func TestSocketInspection(t *testing.T) {
	tests := []struct {
		network, addr string
		domain        int
		v6only        bool
		udp           bool
	}{
		{"udp4", "127.0.0.1:0", unix.AF_INET, false, true},
		{"udp6", "[::1]:0", unix.AF_INET6, true, true},
		{"udp", "[::]:0", unix.AF_INET6, false, true},
		{"tcp4", "127.0.0.1:0", unix.AF_INET, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.network+" "+tt.addr, func(t *testing.T) {
			var conn interface {
				syscall.Conn
				Close() error
			}
			var err error
			if tt.udp {
				conn, err = net.ListenUDP(tt.network, mustResolveUDP(t, tt.addr))
			} else {
				conn, err = net.ListenTCP(tt.network, mustResolveTCP(t, tt.addr))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			err = sockopt.Control(conn, func(fd int) error {
				domain, err := socketDomain(fd)
				if err != nil || domain != tt.domain {
					t.Errorf("socketDomain = %d, %v; want %d", domain, err, tt.domain)
				}
				if domain == unix.AF_INET6 {
					v6only, err := socketV6Only(fd)
					if err != nil || v6only != tt.v6only {
						t.Errorf("socketV6Only = %v, %v; want %v", v6only, err, tt.v6only)
					}
				}
				if err := checkUDPSocket(fd); (err == nil) != tt.udp {
					t.Errorf("checkUDPSocket = %v, want UDP %v", err, tt.udp)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mustResolveUDP(t *testing.T, addr string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustResolveTCP(t *testing.T, addr string) *net.TCPAddr {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
