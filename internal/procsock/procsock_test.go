//go:build linux

package procsock

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A table as the kernel prints it on a little-endian machine.
const udpTable = `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  1: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 4242 2 0000000000000000 0
  2: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 17 2 0000000000000000 0
  3: 00000000000000000000000001000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 99 2 0000000000000000 0
  4: 0000000000000000FFFF00000100007F:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 100 2 0000000000000000 0
  5: 00000000000000000000000000000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 101 2 0000000000000000 0
`

func TestParseTable(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the table is in little-endian host order")
	}
	got, err := parseTable(strings.NewReader(udpTable))
	if err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{netip.MustParseAddrPort("127.0.0.1:53"), 4242},
		{netip.MustParseAddrPort("0.0.0.0:5353"), 17},
		{netip.MustParseAddrPort("[::1]:53"), 99},
		{netip.MustParseAddrPort("127.0.0.1:53"), 100}, // ::ffff:127.0.0.1, unmapped
		{netip.MustParseAddrPort("[::]:53"), 101},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: got %v, want %v", i+1, got[i], want[i])
		}
	}
	for _, bad := range []string{"h\n 1: 0100007F 0 0 0 0 0 0 0 0 1\n", "h\n 1: 0100ZZ7F:0035 0 0 0 0 0 0 0 0 1\n", "h\n 1: 0100007F:0035 0 0 0 0 0 0 0 x\n"} {
		if _, err := parseTable(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestMatches(t *testing.T) {
	ap := netip.MustParseAddrPort
	cases := []struct {
		local, bound string
		want         bool
	}{
		{"127.0.0.1:53", "127.0.0.1:53", true},
		{"127.0.0.1:53", "127.0.0.1:54", false},
		{"127.0.0.1:53", "127.0.0.2:53", false},
		{"127.0.0.1:53", "0.0.0.0:53", false},
		{"0.0.0.0:53", "127.0.0.2:53", true},
		{"0.0.0.0:53", "[::]:53", true},
		{"[::]:53", "0.0.0.0:53", true},
		{"[::1]:53", "[::1]:53", true},
		{"[::ffff:127.0.0.1]:53", "127.0.0.1:53", true},
		{"[::1]:53", "127.0.0.1:53", false},
	}
	for _, c := range cases {
		if got := Matches(ap(c.local), ap(c.bound)); got != c.want {
			t.Errorf("Matches(%s, %s) = %v", c.local, c.bound, got)
		}
	}
}

// TestUDPSelf: UDP finds this process's own sockets, one per socket even when
// duplicated, and refuses port 0.
func TestUDPSelf(t *testing.T) {
	a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dup, err := a.File() // a second descriptor for the same socket
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	local := a.LocalAddr().(*net.UDPAddr).AddrPort()
	socks, err := UDP(0, local)
	if err != nil {
		t.Fatal(err)
	}
	if len(socks) != 1 || socks[0].Local != local || socks[0].IPv6 {
		t.Fatalf("UDP(%s) = %+v, want one IPv4 socket", local, socks)
	}
	if got, err := AttachedFilter(Borrow(socks[0])); err != nil || got != NoFilter {
		t.Errorf("AttachedFilter = %q, %v", got, err)
	}
	if _, err := UDP(0, netip.AddrPortFrom(local.Addr(), 0)); err == nil {
		t.Error("port 0 accepted")
	}
}

func FuzzParseTable(f *testing.F) {
	f.Add(udpTable)
	f.Fuzz(func(t *testing.T, s string) {
		entries, err := parseTable(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, e := range entries {
			if !e.local.Addr().IsValid() {
				t.Fatalf("invalid address from %q", s)
			}
		}
	})
}

// TestDescriptors: Descriptors lists every descriptor of a socket, lowest first, and
// none once they are all closed; a borrowed Conn hands fn a descriptor of the socket
// while it is open, and fails with EBADF after.
func TestDescriptors(t *testing.T) {
	a, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dup, err := a.File()
	if err != nil {
		t.Fatal(err)
	}
	defer dup.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dup.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	conns, err := Descriptors(st.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 2 || conns[0].fd >= conns[1].fd {
		t.Fatalf("Descriptors found %d, want the socket's 2 lowest first: %+v", len(conns), conns)
	}
	for _, c := range conns {
		var got unix.Stat_t
		err := c.Control(func(fd uintptr) { unix.Fstat(int(fd), &got) })
		if err != nil || got.Ino != st.Ino {
			t.Errorf("descriptor %d: Control %v, inode %d, want %d", c.fd, err, got.Ino, st.Ino)
		}
	}
	a.Close()
	dup.Close()
	if conns, err := Descriptors(st.Ino); err != nil || len(conns) != 0 {
		t.Errorf("after closing both: Descriptors = %d, %v; want none", len(conns), err)
	}
	if err := conns[0].Control(func(uintptr) { t.Error("fn ran on a closed descriptor") }); !errors.Is(err, unix.EBADF) {
		t.Errorf("Control on a closed descriptor: %v, want EBADF", err)
	}
}
