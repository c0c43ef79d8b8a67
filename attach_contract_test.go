//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// failLoad makes the eBPF program fail to load with err until t ends.
func failLoad(t testing.TB, err error) {
	t.Helper()
	saved := loadKernel
	loadKernel = func() (*kernelObjects, error) { return nil, err }
	t.Cleanup(func() { loadKernel = saved })
}

// injectedLoadFailures are the ways loading the eBPF program can fail, each with the
// sentinel Attach must report it under.
var injectedLoadFailures = []struct {
	name string
	err  error
	want error
}{
	{"not permitted", permissionError("rrl: load eBPF filter", unix.EPERM), ErrNotPermitted},
	{"old kernel", notSupportedError("rrl: load eBPF filter", fmt.Errorf("the kernel lacks the helper %s", asm.FnKtimeGetCoarseNs)), ErrNotSupported},
	{"verifier rejection", errors.New("load program: permission denied: invalid mem access"), ErrLoadFailed},
	{"option memory", optmemError(unix.ENOMEM), ErrOptMem},
}

// TestAttachFallsBackOnAnyLoadFailure: whatever keeps the eBPF program from loading,
// Attach keeps the classic prefilter on the socket (it drops a reflected response
// and passes a query) and says why with a typed error.
func TestAttachFallsBackOnAnyLoadFailure(t *testing.T) {
	requireBPF(t)
	for _, c := range injectedLoadFailures {
		t.Run(c.name, func(t *testing.T) {
			failLoad(t, c.err)
			srv := newUDPServer(t, "udp4", "127.0.0.1:0")
			f, err := Attach(srv.conn, NewConfig())
			if !errors.Is(err, c.want) {
				t.Fatalf("Attach error %v, want one matching %v", err, c.want)
			}
			if f == nil || f.Mode() != ModeClassic {
				t.Fatalf("Attach left %v, want the classic fallback", f.Mode())
			}
			defer f.Close()
			expectDelivery(t, srv, srv.addr, []deliveryCase{
				{"query", netip.MustParseAddrPort("127.0.8.1:40000"), nil, dnsQuery(1, false), true},
				{"response", netip.MustParseAddrPort("127.0.8.2:40000"), nil, qr(dnsQuery(2, false)), false},
			})
		})
	}
}

// TestMissingHelperIsNotSupported: a helper the kernel does not have is reported as
// ErrNotSupported, and this kernel has every helper the program calls.
func TestMissingHelperIsNotSupported(t *testing.T) {
	requireBPF(t)
	if err := missingHelper(); err != nil {
		t.Fatalf("missingHelper on this kernel: %v", err)
	}
	saved := requiredHelpers
	t.Cleanup(func() { requiredHelpers = saved })
	requiredHelpers = append([]asm.BuiltinFunc{asm.BuiltinFunc(100000)}, saved...)
	err := missingHelper()
	if err == nil || !strings.Contains(err.Error(), "lacks the helper") {
		t.Fatalf("missingHelper with an unknown helper: %v", err)
	}
	if err := notSupportedError("rrl: load eBPF filter", err); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("%v does not match ErrNotSupported", err)
	}
}

// floodFrom sends n queries from src to srv through a raw socket and returns how
// many srv read.
func floodFrom(t *testing.T, srv *udpServer, src netip.AddrPort, n int) int {
	t.Helper()
	raw := newRawSender(t, srv.addr)
	for i := range n {
		raw.send(t, ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(i), false)))
	}
	return len(srv.collect(time.Now(), nil, 200*time.Millisecond, 5*time.Second))
}

// TestReloadKeepsNewFilter: attaching a new Filter to a socket and then closing the
// old one leaves the new one in force, for every combination of modes.
func TestReloadKeepsNewFilter(t *testing.T) {
	requireBPF(t)
	for _, c := range []struct {
		name             string
		oldEBPF, newEBPF bool
	}{
		{"ebpf then ebpf", true, true},
		{"classic then ebpf", false, true},
		{"ebpf then classic", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := newUDPServer(t, "udp4", "127.0.0.1:0")
			attach := func(ebpf bool, rps string) *Filter {
				cfg := NewConfig()
				if err := cfg.SetValue("requests-per-second", rps); err != nil {
					t.Fatal(err)
				}
				if !ebpf {
					failLoad(t, errors.New("injected"))
					defer func() { loadKernel = loadKernelObjects }()
				}
				f, err := Attach(srv.conn, cfg)
				if ebpf && err != nil || !ebpf && !errors.Is(err, ErrLoadFailed) {
					t.Fatalf("Attach: %v", err)
				}
				return f
			}
			old := attach(c.oldEBPF, "1000")
			next := attach(c.newEBPF, "20")
			defer next.Close()
			if err := old.Close(); err != nil {
				t.Fatalf("close old filter: %v", err)
			}
			if c.newEBPF {
				// A burst of 300 from one source: the new filter holds it near its
				// limit of 20 (a fresh source's first packets are not all refused).
				got := floodFrom(t, srv, netip.MustParseAddrPort("127.0.9.1:40000"), 300)
				st, err := next.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if st.Seen < 300 || got > 150 {
					t.Fatalf("after closing the old filter: %d of 300 delivered, new filter saw %d: not in force", got, st.Seen)
				}
			} else {
				expectDelivery(t, srv, srv.addr, []deliveryCase{
					{"response", netip.MustParseAddrPort("127.0.9.2:40000"), nil, qr(dnsQuery(2, false)), false},
				})
			}
			// Updating the closed filter must not touch the socket either.
			if err := old.Update(NewConfig()); !errors.Is(err, ErrClosed) {
				t.Fatalf("Update of the closed filter: %v, want ErrClosed", err)
			}
		})
	}
}

// TestUpdateLeavesLaterFilter: a classic Filter whose socket another Filter took
// over does not put its program back on Update.
func TestUpdateLeavesLaterFilter(t *testing.T) {
	requireBPF(t)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	failLoad(t, errors.New("injected"))
	old, _ := Attach(srv.conn, NewConfig())
	defer old.Close()
	loadKernel = loadKernelObjects
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "20")
	next, err := Attach(srv.conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if err := old.Update(NewConfig()); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got := floodFrom(t, srv, netip.MustParseAddrPort("127.0.9.3:40000"), 300); got > 150 {
		t.Fatalf("%d of 300 delivered: the old classic filter replaced the eBPF one", got)
	}
}

// TestCloseAfterSocketClosed: closing the Filter after the server closed its socket,
// the usual shutdown order, is not an error.
func TestCloseAfterSocketClosed(t *testing.T) {
	requireBPF(t)
	for _, ebpf := range []bool{true, false} {
		srv := newUDPServer(t, "udp4", "127.0.0.1:0")
		if !ebpf {
			failLoad(t, errors.New("injected"))
		}
		f, _ := Attach(srv.conn, NewConfig())
		loadKernel = loadKernelObjects
		if f == nil {
			t.Fatal("no filter")
		}
		srv.conn.Close()
		if err := f.Close(); err != nil {
			t.Errorf("ebpf=%v: Close after the socket closed: %v", ebpf, err)
		}
	}
}

// TestNilFilter: every method of a nil Filter (what Attach returns for a socket it
// cannot protect at all) is safe, so `defer f.Close()` after Attach never panics.
func TestNilFilter(t *testing.T) {
	var f *Filter
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if f.Mode() != ModeNone || f.Config() != nil || f.pinPath() != "" {
		t.Errorf("nil filter: mode %v config %v pin %q", f.Mode(), f.Config(), f.pinPath())
	}
	if st, err := f.Stats(); err != nil || st.Mode != ModeNone {
		t.Errorf("Stats: %+v, %v", st, err)
	}
	if err := f.Update(NewConfig()); !errors.Is(err, ErrClosed) {
		t.Errorf("Update: %v", err)
	}
	if _, err := f.HeavyCells(1); !errors.Is(err, ErrClosed) {
		t.Errorf("HeavyCells: %v", err)
	}
	if _, err := f.GroupRates(netip.MustParseAddrPort("127.0.0.1:1")); !errors.Is(err, ErrClosed) {
		t.Errorf("GroupRates: %v", err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := f.Attach(conn); !errors.Is(err, ErrClosed) {
		t.Errorf("Attach: %v", err)
	}
	// Attach on a TCP socket: nothing to protect, a nil Filter and an error.
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g, err := Attach(l, NewConfig())
	if err == nil || g != nil {
		t.Fatalf("Attach(TCP listener) = %v, %v; want nil and an error", g, err)
	}
	defer g.Close()
}

// TestClassicUpdateAllOrNothing: when one socket of a classic Filter refuses the new
// program (its filter is locked), the sockets already changed get the old one back.
func TestClassicUpdateAllOrNothing(t *testing.T) {
	requireBPF(t)
	failLoad(t, errors.New("injected"))
	first := newUDPServer(t, "udp4", "127.0.0.1:0")
	second := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, _ := Attach(first.conn, NewConfig())
	if f.Mode() != ModeClassic {
		t.Fatalf("mode %v", f.Mode())
	}
	defer f.Close()
	if err := f.Attach(second.conn); err != nil {
		t.Fatal(err)
	}
	raw, err := second.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1) })
	if err != nil {
		t.Fatalf("lock filter: %v", err)
	}
	cfg := NewConfig()
	cfg.SetValue("reflection-ports", "")
	if err := f.Update(cfg); !errors.Is(err, ErrNotPermitted) {
		t.Fatalf("Update with a locked socket: %v, want ErrNotPermitted", err)
	}
	// The first socket still drops queries from NTP's port, as the old program does.
	expectDelivery(t, first, first.addr, []deliveryCase{
		{"from port 123", netip.MustParseAddrPort("127.0.8.3:123"), nil, dnsQuery(3, false), false},
		{"query", netip.MustParseAddrPort("127.0.8.4:40000"), nil, dnsQuery(4, false), true},
	})
	if got := f.Config().Values(); fmt.Sprint(got) != fmt.Sprint(NewConfig().Values()) {
		t.Errorf("Config after the failed Update: %v", got)
	}
}
