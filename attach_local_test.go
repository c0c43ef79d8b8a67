//go:build linux

package rrl

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// localSocket is a socket a TestAttachLocal case opens.
type localSocket struct {
	network string // "udp4", "udp6", "udp" (dual-stack), "tcp4"
	addr    string // "127.0.0.1" etc.: the port is the case's
	attach  bool   // AttachLocal must attach to it
}

// listenLocal opens a socket with SO_REUSEPORT on port (0: any), returning it and its port.
func listenLocal(t *testing.T, network, addr string, port uint16) (syscall.Conn, uint16) {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	hostport := net.JoinHostPort(addr, strconv.Itoa(int(port)))
	if strings.HasPrefix(network, "tcp") {
		l, err := lc.Listen(context.Background(), network, hostport)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l.(*net.TCPListener), uint16(l.Addr().(*net.TCPAddr).Port)
	}
	pc, err := lc.ListenPacket(context.Background(), network, hostport)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.(*net.UDPConn), uint16(pc.LocalAddr().(*net.UDPAddr).Port)
}

// TestAttachLocal: AttachLocal finds this process's UDP sockets by local address
// (both families, a wildcard bind, a dual-stack socket, a SO_REUSEPORT group), puts
// one eBPF filter on exactly those, counts their traffic in one Filter, and Close
// removes it again; TCP sockets and sockets on other addresses are left alone.
func TestAttachLocal(t *testing.T) {
	requireBPF(t)
	cases := []struct {
		name    string
		sockets []localSocket
		listen  string // address to attach to; the port is the case's
		send    string // address to send test traffic to
		errText string // non-empty: AttachLocal fails naming this
	}{
		{"IPv4 address", []localSocket{{"udp4", "127.0.0.1", true}, {"udp4", "127.0.0.2", false}}, "127.0.0.1", "127.0.0.1", ""},
		{"IPv4 wildcard bind", []localSocket{{"udp4", "0.0.0.0", true}}, "0.0.0.0", "127.0.0.1", ""},
		{"IPv6 address", []localSocket{{"udp6", "::1", true}}, "::1", "::1", ""},
		{"dual-stack socket serving IPv4", []localSocket{{"udp", "::", true}}, "0.0.0.0", "127.0.0.1", ""},
		{"both families by ::", []localSocket{{"udp4", "0.0.0.0", true}, {"udp6", "::", true}}, "::", "127.0.0.1", ""},
		{"SO_REUSEPORT group, TCP beside it", []localSocket{
			{"udp4", "127.0.0.1", true}, {"udp4", "127.0.0.1", true}, {"udp4", "127.0.0.1", true},
			{"tcp4", "127.0.0.1", false}, {"udp4", "127.0.0.3", false},
		}, "127.0.0.1", "127.0.0.1", ""},
		{"no socket on the address", []localSocket{{"udp4", "127.0.0.2", false}}, "127.0.0.1", "", "bound to 127.0.0.2"},
		{"TCP only", []localSocket{{"tcp4", "127.0.0.1", false}}, "127.0.0.1", "", "only TCP"},
		{"specific address, wildcard socket", []localSocket{{"udp4", "0.0.0.0", false}}, "127.0.0.1", "", "bound to 0.0.0.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var conns []syscall.Conn
			var port uint16
			for _, s := range c.sockets {
				conn, p := listenLocal(t, s.network, s.addr, port)
				port = p
				conns = append(conns, conn)
			}
			local := netip.AddrPortFrom(netip.MustParseAddr(c.listen), port)
			cfg := NewConfig()
			f, err := attachLocal(local, cfg)
			if c.errText != "" {
				if err == nil || !errors.Is(err, procsock.ErrNoSocket) || !strings.Contains(err.Error(), c.errText) {
					t.Fatalf("AttachLocal(%s) = %v, want ErrNoSocket naming %q", local, err, c.errText)
				}
				if f != nil {
					t.Fatal("a Filter came with the error")
				}
				checkFilters(t, c.sockets, conns, false)
				return
			}
			if err != nil {
				t.Fatalf("AttachLocal(%s): %v", local, err)
			}
			defer f.Close()
			checkFilters(t, c.sockets, conns, true)

			// Real traffic: a response is dropped and a query passes, both counted by f.
			dst := netip.AddrPortFrom(netip.MustParseAddr(c.send), port)
			raw := newRawSender(t, dst)
			src := netip.MustParseAddrPort("127.0.9.1:5300")
			if dst.Addr().Is6() {
				src = netip.MustParseAddrPort("[::1]:5300")
			}
			q := loadgen.DNSQuery(1, false)
			raw.send(t, loadgen.Packet(src, dst, q))
			raw.send(t, loadgen.Packet(src, dst, qr(q)))
			var st FilterStats
			for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if st, err = f.Stats(); err != nil {
					t.Fatal(err)
				}
				if st.Seen >= 2 {
					break
				}
			}
			if st.Seen != 2 || st.Passed != 1 || st.DroppedResponse != 1 {
				t.Errorf("filter saw %d, passed %d, dropped %d responses; want 2, 1, 1", st.Seen, st.Passed, st.DroppedResponse)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			checkFilters(t, c.sockets, conns, false)
		})
	}
}

// checkFilters checks which sockets have an eBPF filter: those marked attach when
// attached is true, none otherwise.
func checkFilters(t *testing.T, sockets []localSocket, conns []syscall.Conn, attached bool) {
	t.Helper()
	for i, s := range sockets {
		want := procsock.NoFilter
		if attached && s.attach {
			want = procsock.EBPFFilter
		}
		got, err := procsock.AttachedFilter(conns[i])
		if err != nil {
			t.Fatalf("%s %s: %v", s.network, s.addr, err)
		}
		if got != want {
			t.Errorf("%s %s: filter %s, want %s", s.network, s.addr, got, want)
		}
	}
}

// TestAttachLocalErrors: port 0 and a closed socket's address are refused, with
// nothing attached.
func TestAttachLocalErrors(t *testing.T) {
	if _, err := attachLocal(netip.MustParseAddrPort("127.0.0.1:0"), nil); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("port 0: %v", err)
	}
	conn, port := listenLocal(t, "udp4", "127.0.0.1", 0)
	conn.(*net.UDPConn).Close()
	_, err := attachLocal(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), nil)
	if !errors.Is(err, procsock.ErrNoSocket) {
		t.Errorf("closed socket: %v, want ErrNoSocket", err)
	}
}

// TestAttachLocalCloseAfterSocketClosed: closing the Filter after the server closed
// its socket, and another socket took the descriptor number, leaves the new one alone.
func TestAttachLocalCloseAfterSocketClosed(t *testing.T) {
	requireBPF(t)
	conn, port := listenLocal(t, "udp4", "127.0.0.1", 0)
	f, err := attachLocal(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), nil)
	if err != nil {
		t.Fatal(err)
	}
	fdOf := func(c syscall.Conn) (fd int) {
		sockopt.Control(c, func(s int) error { fd = s; return nil })
		return fd
	}
	oldFD := fdOf(conn)
	conn.(*net.UDPConn).Close()
	// The lowest free descriptor is the one just closed: the next socket gets it,
	// and a filter of its own.
	other, _ := listenLocal(t, "udp4", "127.0.0.1", 0)
	if fdOf(other) != oldFD {
		t.Fatalf("the new socket got descriptor %d, not the closed socket's %d", fdOf(other), oldFD)
	}
	g, err := Attach(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := f.Close(); err != nil {
		t.Errorf("Close after the socket was closed: %v", err)
	}
	if got, _ := procsock.AttachedFilter(other); got != procsock.EBPFFilter {
		t.Errorf("another socket on the reused descriptor lost its filter: %s", got)
	}
}

// TestAttachLocalUnprivilegedFallsBackToClassic: without the privilege to load eBPF,
// AttachLocal puts the classic prefilter on every matching socket and reports
// ErrNotPermitted, as Attach does; Close removes it from all of them.
func TestAttachLocalUnprivilegedFallsBackToClassic(t *testing.T) {
	if !isUnprivilegedChild() {
		requireBPF(t)
		runUnprivileged(t, "TestAttachLocalUnprivilegedFallsBackToClassic")
		return
	}
	checkUnprivileged(t)
	a, port := listenLocal(t, "udp4", "127.0.0.1", 0)
	b, _ := listenLocal(t, "udp4", "127.0.0.1", port)
	f, err := attachLocal(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), nil)
	if !errors.Is(err, ErrNotPermitted) || f == nil || f.Mode() != ModeClassic {
		t.Fatalf("unprivileged AttachLocal: %v, %v; want a classic Filter and ErrNotPermitted", f, err)
	}
	for _, c := range []syscall.Conn{a, b} {
		if k, err := procsock.AttachedFilter(c); err != nil || k != procsock.ClassicFilter {
			t.Errorf("socket filter %q (%v), want classic", k, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []syscall.Conn{a, b} {
		if k, err := procsock.AttachedFilter(c); err != nil || k != procsock.NoFilter {
			t.Errorf("after Close: socket filter %q (%v), want none", k, err)
		}
	}
}

// TestFilterAttachLocal: Filter.AttachLocal adds a socket opened after the filter was
// attached (one more of a SO_REUSEPORT group) and leaves the first as it was; with no
// matching socket it says so.
func TestFilterAttachLocal(t *testing.T) {
	requireBPF(t)
	first, port := listenLocal(t, "udp4", "127.0.0.1", 0)
	local := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	f, err := attachLocal(local, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	second, _ := listenLocal(t, "udp4", "127.0.0.1", port)
	if got, _ := procsock.AttachedFilter(second); got != procsock.NoFilter {
		t.Fatalf("the new socket has %s before Filter.AttachLocal", got)
	}
	if err := f.attachLocal(local); err != nil {
		t.Fatalf("Filter.AttachLocal: %v", err)
	}
	for i, c := range []syscall.Conn{first, second} {
		if got, _ := procsock.AttachedFilter(c); got != procsock.EBPFFilter {
			t.Errorf("socket %d: %s, want the eBPF filter", i, got)
		}
	}
	if err := f.attachLocal(netip.AddrPortFrom(local.Addr(), 1)); !errors.Is(err, procsock.ErrNoSocket) {
		t.Errorf("Filter.AttachLocal on a port without sockets: %v, want ErrNoSocket", err)
	}
	f.Close()
	for i, c := range []syscall.Conn{first, second} {
		if got, _ := procsock.AttachedFilter(c); got != procsock.NoFilter {
			t.Errorf("socket %d after Close: %s", i, got)
		}
	}
}
