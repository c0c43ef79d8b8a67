//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// The tests here move a socket to another descriptor the way a CoreDNS reload does
// (the new server gets a copy, the old one is closed), and check with real packets
// that the Filter still reaches the socket.

// copySocket returns a server reading from a new descriptor of srv's socket, made as
// a CoreDNS reload makes it (File, then FilePacketConn), which closes when t ends.
func copySocket(t *testing.T, srv *udpServer) *udpServer {
	t.Helper()
	file, err := srv.conn.File()
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	pc, err := net.FilePacketConn(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return &udpServer{conn: pc.(*net.UDPConn), addr: srv.addr}
}

func fdOf(c syscall.Conn) (fd int) {
	sockopt.Control(c, func(s int) error { fd = s; return nil })
	return fd
}

// takeNumber closes srv's descriptor and opens sockets until one gets its number (the
// lowest free one), returning that socket: whoever keeps the number now reaches
// another socket. The sockets close when t ends.
func takeNumber(t *testing.T, srv *udpServer) *udpServer {
	t.Helper()
	fd := fdOf(srv.conn)
	srv.conn.Close()
	for range 64 {
		other := newUDPServer(t, "udp4", "127.0.0.1:0")
		if fdOf(other.conn) == fd {
			return other
		}
	}
	t.Fatalf("no new socket got descriptor %d", fd)
	return nil
}

// probeResult is what a server read of one probe.
type probeResult struct {
	flood     int  // of 300 queries from one source, as fast as they can be sent
	response  bool // a response (QR set) arrived
	reflected bool // a query from source port 20202 arrived
}

// probeN counts probes, so that every probe uses sources no earlier one used.
var probeN byte

// probeSocket sends srv a flood of 300 queries from one source, a response and a query from
// port 20202, each from its own /16 and port, and returns what srv read.
func probeSocket(t *testing.T, srv *udpServer) probeResult {
	t.Helper()
	probeN++
	flooder := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 20 + probeN%60, 0, 1}), 41000+uint16(probeN))
	responder := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 90 + probeN%60, 0, 1}), 42000+uint16(probeN))
	reflector := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 160 + probeN%60, 0, 1}), 20202)
	raw := newRawSender(t, srv.addr)
	for i := range 300 {
		raw.send(t, ipv4Packet(flooder, srv.addr, nil, dnsQuery(uint16(i), false)))
	}
	raw.send(t, ipv4Packet(responder, srv.addr, nil, qr(dnsQuery(1, false))))
	raw.send(t, ipv4Packet(reflector, srv.addr, nil, dnsQuery(2, false)))
	var r probeResult
	for _, got := range srv.collect(time.Now(), nil, 200*time.Millisecond, 5*time.Second) {
		switch got.from {
		case flooder:
			r.flood++
		case responder:
			r.response = true
		case reflector:
			r.reflected = true
		}
	}
	return r
}

// A filterCheck says whether a probe's result shows a filter in the state it names.
type filterCheck struct {
	name string
	ok   func(probeResult) bool
}

var (
	// Any filter drops responses; with requests-per-second 20 a flood of 300 from
	// one source is held near the limit (a fresh source's first packets are not
	// all refused).
	limitedTo20 = filterCheck{"the eBPF filter limiting to 20", func(r probeResult) bool {
		return r.flood <= 150 && !r.response
	}}
	unlimited = filterCheck{"a filter that drops responses and limits nothing", func(r probeResult) bool {
		return r.flood == 300 && !r.response && r.reflected
	}}
	dropping20202 = filterCheck{"the classic filter with reflection port 20202", func(r probeResult) bool {
		return r.flood == 300 && !r.response && !r.reflected
	}}
	noFilter = filterCheck{"no filter", func(r probeResult) bool {
		return r.flood == 300 && r.response && r.reflected
	}}
)

// expectFilter probes srv and checks the result against want.
func expectFilter(t *testing.T, srv *udpServer, when string, want filterCheck) {
	t.Helper()
	if r := probeSocket(t, srv); !want.ok(r) {
		t.Fatalf("%s: probe %+v, want %s", when, r, want.name)
	}
}

// attachWay is a way to put a Filter on a server's socket.
type attachWay struct {
	name   string
	attach func(srv *udpServer, cfg *Config) (*Filter, error)
}

var attachWays = []attachWay{
	{"Attach", func(srv *udpServer, cfg *Config) (*Filter, error) { return Attach(srv.conn, cfg) }},
	// AttachLocal finds the socket's descriptor in /proc/self/fd, as the CoreDNS
	// plugin does.
	{"AttachLocal", func(srv *udpServer, cfg *Config) (*Filter, error) { return attachLocal(srv.addr, cfg) }},
}

// attachMode attaches a Filter with way in the mode asked for (classic: the eBPF
// program made to fail to load) and checks it took that mode.
func attachMode(t *testing.T, way attachWay, srv *udpServer, classic bool, cfg *Config) *Filter {
	t.Helper()
	if classic {
		failLoad(t, errors.New("injected"))
		defer func() { loadKernel = loadKernelObjects }()
	}
	f, err := way.attach(srv, cfg)
	if classic && !errors.Is(err, ErrLoadFailed) || !classic && err != nil {
		t.Fatalf("%s: %v", way.name, err)
	}
	want := ModeEBPF
	if classic {
		want = ModeClassic
	}
	if f.Mode() != want {
		t.Fatalf("%s: mode %v, want %v", way.name, f.Mode(), want)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestFilterFollowsSocket: after the descriptor a Filter was attached through is
// closed and the socket lives on under a copy (a CoreDNS reload), Update still changes
// the filter on the socket (in classic mode, where each socket holds a program of its
// own, too) and Close removes it, whether the Filter came from Attach or AttachLocal;
// a new socket that took the closed descriptor's number keeps its own filter.
func TestFilterFollowsSocket(t *testing.T) {
	requireBPF(t)
	type step struct {
		cfg  *Config     // the Config Update applies
		want filterCheck // what the socket does afterwards
	}
	rps := func(v string) *Config { return newConfigWith(t, "requests-per-second", v) }
	cases := []struct {
		name    string
		classic bool
		first   *Config // the Config attached
		want    filterCheck
		update  *step // nil: Close without Update
	}{
		{"eBPF, Close", false, rps("20"), limitedTo20, nil},
		{"eBPF, Update to a lower limit, Close", false, rps("0"), unlimited,
			&step{rps("20"), limitedTo20}},
		{"classic, Close", true, rps("20"), unlimited, nil},
		{"classic, Update of reflection ports, Close", true, rps("20"), unlimited,
			&step{newConfigWith(t, "reflection-ports", "20202"), dropping20202}},
	}
	for _, way := range attachWays {
		for _, c := range cases {
			t.Run(way.name+"/"+c.name, func(t *testing.T) {
				srv := newUDPServer(t, "udp4", "127.0.0.1:0")
				f := attachMode(t, way, srv, c.classic, c.first)
				expectFilter(t, srv, "attached", c.want)

				moved := copySocket(t, srv)
				// The closed descriptor's number now reaches another socket, with
				// a filter of its own that must stay.
				other := takeNumber(t, srv)
				g, err := Attach(other.conn, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				expectFilter(t, moved, "the first descriptor closed", c.want)

				if c.update != nil {
					if err := f.Update(c.update.cfg); err != nil {
						t.Fatalf("Update: %v", err)
					}
					expectFilter(t, moved, "after Update", c.update.want)
				}
				if err := f.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				expectFilter(t, moved, "after Close", noFilter)
				if got, err := procsock.AttachedFilter(moved.conn); err != nil || got != procsock.NoFilter {
					t.Errorf("after Close the socket has %s (%v)", got, err)
				}
				if got, err := procsock.AttachedFilter(other.conn); err != nil || got != procsock.EBPFFilter {
					t.Errorf("the socket on the reused descriptor number has %s (%v), want its own eBPF filter", got, err)
				}
			})
		}
	}
}

// TestFilterSocketGone: a socket whose every descriptor is closed is gone, with its
// filter: Update (classic mode) and Close return nil and the Filter forgets it.
func TestFilterSocketGone(t *testing.T) {
	requireBPF(t)
	for _, way := range attachWays {
		for _, classic := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/classic=%v", way.name, classic), func(t *testing.T) {
				srv := newUDPServer(t, "udp4", "127.0.0.1:0")
				f := attachMode(t, way, srv, classic, nil)
				moved := copySocket(t, srv)
				srv.conn.Close()
				moved.conn.Close()
				if err := f.Update(NewConfig()); err != nil {
					t.Fatalf("Update: %v", err)
				}
				if classic && len(f.sockets) != 0 {
					t.Errorf("after Update the Filter still holds %d sockets", len(f.sockets))
				}
				if err := f.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			})
		}
	}
}

// withoutProc runs fn on a thread of its own in a mount namespace of its own with an
// empty tmpfs over /proc, so that fn finds no /proc/self/fd. The thread ends with fn.
func withoutProc(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		done <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			if err := unix.Mount("rrltest", "/proc", "tmpfs", 0, ""); err != nil {
				return fmt.Errorf("mount tmpfs on /proc: %w", err)
			}
			if _, err := os.Stat("/proc/self/fd"); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("/proc/self/fd still there: %v", err)
			}
			fn()
			return nil
		}()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFilterUnreachableSocket: a socket that is open but cannot be reached (its
// descriptor closed and /proc/self/fd not readable, so that no other can be found) or
// refuses the change (SO_LOCK_FILTER) is named, with its address and inode, in the
// error of Close or Update, and keeps its filter as the error says.
func TestFilterUnreachableSocket(t *testing.T) {
	requireBPF(t)
	lockFilter := func(t *testing.T, srv *udpServer, f *Filter, op func() error) error {
		if err := sockopt.Control(srv.conn, func(fd int) error {
			return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1)
		}); err != nil {
			t.Fatal(err)
		}
		return op()
	}
	hideProc := func(t *testing.T, srv *udpServer, f *Filter, op func() error) (err error) {
		withoutProc(t, func() { err = op() })
		return err
	}
	cases := []struct {
		name    string
		classic bool
		block   func(t *testing.T, srv *udpServer, f *Filter, op func() error) error
		want    error // the error must match it too (nil: anything)
	}{
		{"eBPF, /proc hidden", false, hideProc, nil},
		{"classic, /proc hidden", true, hideProc, nil},
		{"eBPF, filter locked", false, lockFilter, ErrNotPermitted},
		{"classic, filter locked", true, lockFilter, ErrNotPermitted},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newUDPServer(t, "udp4", "127.0.0.1:0")
			cfg := NewConfig()
			cfg.SetValue("requests-per-second", "20")
			f := attachMode(t, attachWays[0], srv, c.classic, cfg)
			id, err := identify(srv.conn)
			if err != nil {
				t.Fatal(err)
			}
			moved := copySocket(t, srv)
			srv.conn.Close()
			// eBPF: Close, which must leave the program limiting to 20. Classic:
			// Update adding a reflection port, which must leave the old program.
			op, want := f.Close, limitedTo20
			if c.classic {
				op = func() error { return f.Update(newConfigWith(t, "reflection-ports", "20202")) }
				want = unlimited
			}
			err = c.block(t, moved, f, op)
			if err == nil {
				t.Fatal("no error")
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("error %v does not match %v", err, c.want)
			}
			for _, name := range []string{srv.addr.String(), fmt.Sprintf("inode %d", id.ino)} {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("error %q does not name %s", err, name)
				}
			}
			t.Logf("error: %v", err)
			expectFilter(t, moved, "after the failed call", want)
			if c.classic && slices.Contains(f.Config().reflectionPorts, 20202) {
				t.Error("the failed Update changed the Config")
			}
		})
	}
}

// TestAttachLocalAcrossReloads plays the CoreDNS plugin's part in a series of
// reloads on one socket: each reload hands the socket to the new server as a copy,
// the new instance updates the running Filter and adds the address's sockets again
// (Filter.AttachLocal, which may find the old descriptor, still open), and then the
// old descriptor is closed. Every Update is enforced on the socket, and the last
// reload, which drops the plugin, leaves no filter.
func TestAttachLocalAcrossReloads(t *testing.T) {
	requireBPF(t)
	type reload struct {
		cfg  *Config     // the new instance's
		want filterCheck // what the socket does then
	}
	cases := []struct {
		name    string
		classic bool
		first   *Config
		want    filterCheck
		reloads []reload
	}{
		{"eBPF", false, newConfigWith(t, "requests-per-second", "0"), unlimited, []reload{
			{newConfigWith(t, "requests-per-second", "20"), limitedTo20},
			{newConfigWith(t, "requests-per-second", "0"), unlimited},
			{newConfigWith(t, "requests-per-second", "20"), limitedTo20},
		}},
		{"classic", true, NewConfig(), unlimited, []reload{
			{newConfigWith(t, "reflection-ports", "20202"), dropping20202},
			{NewConfig(), unlimited},
			{newConfigWith(t, "reflection-ports", "20202"), dropping20202},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newUDPServer(t, "udp4", "127.0.0.1:0")
			f := attachMode(t, attachWays[1], srv, c.classic, c.first)
			expectFilter(t, srv, "attached", c.want)
			for i, r := range c.reloads {
				next := copySocket(t, srv)
				if err := f.Update(r.cfg); err != nil {
					t.Fatalf("reload %d: Update: %v", i+1, err)
				}
				if err := f.attachLocal(srv.addr); err != nil {
					t.Fatalf("reload %d: AttachLocal: %v", i+1, err)
				}
				srv.conn.Close()
				srv = next
				expectFilter(t, srv, fmt.Sprintf("reload %d", i+1), r.want)
			}
			// The last reload drops the plugin: the old instance closes its
			// Filter after the old descriptor was closed.
			next := copySocket(t, srv)
			srv.conn.Close()
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			expectFilter(t, next, "after Close", noFilter)
		})
	}
}

// TestReachTellsSocketsApartByCookie: a descriptor whose socket has the inode number
// of the socket sought but another cookie (a new socket after the kernel's inode
// counter wrapped) is not that socket: reach finds the socket sought gone and leaves
// the other one alone.
func TestReachTellsSocketsApartByCookie(t *testing.T) {
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	id, err := identify(srv.conn)
	if err != nil {
		t.Fatal(err)
	}
	if id.cookie == 0 {
		t.Fatal("no socket cookie (SO_COOKIE)")
	}
	closed := newUDPServer(t, "udp4", "127.0.0.1:0")
	closed.conn.Close()
	for _, c := range []struct {
		name string
		id   socketID
		want error // nil: reached
	}{
		{"same socket", id, nil},
		{"same inode, another cookie", socketID{dev: id.dev, ino: id.ino, cookie: id.cookie + 1}, errSocketGone},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &attachedSocket{conn: closed.conn, id: c.id}
			called := false
			err := s.reach(func(syscall.Conn) error { called = true; return nil })
			if c.want == nil && (err != nil || !called) {
				t.Fatalf("reach: %v, called %v; want the socket reached", err, called)
			}
			if c.want != nil && (!errors.Is(err, c.want) || called) {
				t.Fatalf("reach: %v, called %v; want %v without a call", err, called, c.want)
			}
		})
	}
}
