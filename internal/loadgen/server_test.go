package loadgen

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// A Listen socket counts no drops until a filter refuses datagrams, and then counts
// each one it refused; it reads what it is sent before that.
func TestListenDrops(t *testing.T) {
	srv, err := Listen("udp4", netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if n, err := Drops(srv); err != nil || n != 0 {
		t.Fatalf("Drops of a new socket = %d, %v; want 0", n, err)
	}
	client, err := net.DialUDP("udp4", nil, srv.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	buf := make([]byte, 64)
	if _, err := client.Write([]byte("one")); err != nil {
		t.Fatal(err)
	}
	srv.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := srv.Read(buf); err != nil {
		t.Fatalf("read before the filter: %v", err)
	}
	// A classic filter that refuses everything ("ret #0"): no privilege needed.
	refuse := []unix.SockFilter{{Code: 0x06, K: 0}}
	err = sockopt.Control(srv, func(fd int) error {
		return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(refuse)), Filter: &refuse[0]})
	})
	if err != nil {
		t.Fatal(err)
	}
	const refused = 3
	for range refused {
		if _, err := client.Write([]byte("two")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := Drops(srv)
		if err != nil {
			t.Fatal(err)
		}
		if n == refused {
			break
		}
		if n > refused || time.Now().After(deadline) {
			t.Fatalf("Drops = %d after %d refused datagrams", n, refused)
		}
		time.Sleep(time.Millisecond)
	}
}
