//go:build linux

package rrl

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/miekg/dns"
)

// serveHost serves h on conn with a dns.Server of the host's own, as CoreDNS does
// with the Handler of a Protection it gave its sockets to (AttachLocal); stop shuts
// the server down, which closes conn.
func serveHost(t *testing.T, conn net.PacketConn, h dns.Handler) (stop func()) {
	t.Helper()
	srv := &dns.Server{PacketConn: conn, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	done := false
	stop = func() {
		if !done {
			done = true
			srv.Shutdown()
		}
	}
	t.Cleanup(stop)
	return stop
}

// dupUDP returns another descriptor of conn's socket, as a reloading host holds
// one for its new servers.
func dupUDP(t *testing.T, conn *net.UDPConn) *net.UDPConn {
	t.Helper()
	f, err := conn.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.(*net.UDPConn)
}

// listenLoopback opens a UDP socket on 127.0.0.1, closed when t ends.
func listenLoopback(t *testing.T) (*net.UDPConn, netip.AddrPort) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// rpsConfig returns NewConfig with requests-per-second set.
func rpsConfig(t *testing.T, rps string) *Config {
	t.Helper()
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", rps); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// kernelLimited returns how many packets the eBPF filter refused so far.
func kernelLimited(t *testing.T, f *Filter) uint64 {
	t.Helper()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return sumLimited(st)
}

func socketFilter(t *testing.T, conn *net.UDPConn) string {
	t.Helper()
	k, err := procsock.AttachedFilter(conn)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestNewProtectionGoUntilAttached: before a Protection of NewProtection has a
// socket, its Handler holds every UDP query to the request limits in Go.
func TestNewProtectionGoUntilAttached(t *testing.T) {
	p, err := NewProtection(answerA, rpsConfig(t, "20"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st := p.Status()
	if st.Filter != ModeNone || st.Sockets != 0 || st.RequestsInKernel || !st.Cookies ||
		!strings.Contains(st.String(), "request limits in Go") {
		t.Fatalf("status %+v (%v): want no filter, requests in Go, cookies on", st, st)
	}
	if p.UDPServer() != nil {
		t.Error("UDPServer without a socket: not nil")
	}
	conn, addr := listenLoopback(t)
	serveHost(t, conn, p.Handler())
	const sent = 400
	answered := burst(t, netip.MustParseAddr("127.0.22.1"), addr, sent)
	limited := p.Handler().Stats().RequestsLimited
	t.Logf("answered %d of %d, limited %d", answered, sent, limited)
	if limited == 0 || answered >= sent/2 || answered+int(limited) != sent {
		t.Errorf("answered %d + limited %d of %d: want the Go limits, once", answered, limited, sent)
	}
	if p.Limiter() == nil || p.Limiter().Stats().limited() != limited {
		t.Errorf("limiter %v: want it to have counted the %d refusals", p.Limiter(), limited)
	}
}

// TestAttachLocalTakeOver: a reload's new Protection takes its predecessor's eBPF
// filter over on the same socket: the filter runs the new limits (enforced, in the
// kernel only), the predecessor's Close leaves it on the socket, and the new one's
// Close takes it off.
func TestAttachLocalTakeOver(t *testing.T) {
	requireBPF(t)
	conn, addr := listenLoopback(t)
	old := dupUDP(t, conn) // the first generation's descriptor
	p1, err := NewProtection(answerA, rpsConfig(t, "1000000"))
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	if err := p1.AttachLocal(addr); err != nil {
		t.Fatal(err)
	}
	st := p1.Status()
	if st.Filter != ModeEBPF || !st.RequestsInKernel || st.Sockets != 1 || !st.KernelCookies {
		t.Fatalf("first: status %v", st)
	}
	f := p1.Filter()
	stop1 := serveHost(t, old, p1.Handler())
	if n := burst(t, netip.MustParseAddr("127.0.23.1"), addr, 200); n != 200 {
		t.Fatalf("first generation, a million per second: %d of 200 answered", n)
	}

	p2, err := NewProtection(answerA, rpsConfig(t, "20"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.AttachLocal(addr); err != nil {
		t.Fatalf("take-over: %v", err)
	}
	if p2.Filter() != f || p1.Filter() != nil {
		t.Fatalf("after the take-over the filters are %p (new) and %p (old), want %p and nil", p2.Filter(), p1.Filter(), f)
	}
	if st := p2.Status(); st.Filter != ModeEBPF || !st.RequestsInKernel || !st.KernelCookies || st.Reason != nil {
		t.Fatalf("second: status %v", st)
	}
	if !strings.Contains(f.Config().String(), `requests-per-second="20"`) {
		t.Errorf("the filter runs %v, want the new requests-per-second", f.Config())
	}
	stop1() // the host closes the old generation's descriptor, then its plugin
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	if k := socketFilter(t, conn); k != procsock.EBPFFilter {
		t.Fatalf("after the predecessor's Close the socket has filter %q", k)
	}
	serveHost(t, conn, p2.Handler())
	before := kernelLimited(t, f)
	const sent = 400
	answered := burst(t, netip.MustParseAddr("127.0.23.2"), addr, sent)
	limited := kernelLimited(t, f) - before
	t.Logf("answered %d of %d, the kernel refused %d", answered, sent, limited)
	if limited == 0 || answered >= sent/2 || answered+int(limited) != sent {
		t.Errorf("answered %d + kernel-limited %d of %d: want the new limit, in the kernel only", answered, limited, sent)
	}
	if got := p2.Handler().Stats().RequestsLimited; got != 0 || p2.Limiter() != nil {
		t.Errorf("the Go limiter refused %d (limiter %v): want the kernel alone", got, p2.Limiter())
	}
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if k := socketFilter(t, conn); k != procsock.NoFilter {
		t.Errorf("after the successor's Close the socket has filter %q", k)
	}
}

// TestAttachLocalFailedTakeOver: when taking the predecessor's filter over fails,
// the successor attaches a filter of its own; where that is only the classic
// prefilter, the Go limits hold the socket (measured), never none, and the
// predecessor, whose filter left the socket, holds its queries to them too.
func TestAttachLocalFailedTakeOver(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name      string
		loadFails bool
	}{{"new eBPF filter", false}, {"classic fallback", true}} {
		t.Run(tc.name, func(t *testing.T) {
			saved := takeOverHook
			takeOverHook = func(*Filter) error { return errors.New("injected take-over failure") }
			t.Cleanup(func() { takeOverHook = saved })
			conn, addr := listenLoopback(t)
			old := dupUDP(t, conn)
			p1, err := NewProtection(answerA, rpsConfig(t, "20"))
			if err != nil {
				t.Fatal(err)
			}
			defer p1.Close()
			if err := p1.AttachLocal(addr); err != nil {
				t.Fatal(err)
			}
			stop1 := serveHost(t, old, p1.Handler())
			if tc.loadFails {
				failLoad(t, permissionError("rrl: load eBPF filter", errors.ErrUnsupported))
			}
			p2, err := NewProtection(answerA, rpsConfig(t, "20"))
			if err != nil {
				t.Fatal(err)
			}
			defer p2.Close()
			err = p2.AttachLocal(addr)
			if err == nil || !strings.Contains(err.Error(), "injected take-over failure") {
				t.Fatalf("AttachLocal: %v, want the take-over's failure", err)
			}
			st := p2.Status()
			t.Logf("status: %v", st)
			if p2.Filter() == nil || p2.Filter() == p1.Filter() {
				t.Fatalf("successor's filter %p, predecessor's %p: want one of its own", p2.Filter(), p1.Filter())
			}
			if tc.loadFails {
				if st.Filter != ModeClassic || st.RequestsInKernel || st.KernelSockets != 0 || st.Reason == nil {
					t.Fatalf("status %+v: want the classic filter and the Go limits", st)
				}
				if ps := p1.Status(); ps.KernelSockets != 0 || p1.Limiter() == nil {
					t.Errorf("predecessor after its filter left the socket: %+v, limiter %v", ps, p1.Limiter())
				}
			} else if st.Filter != ModeEBPF || !st.RequestsInKernel {
				t.Fatalf("status %+v: want the new eBPF filter", st)
			}
			stop1()
			if err := p1.Close(); err != nil {
				t.Fatal(err)
			}
			want := procsock.EBPFFilter
			if tc.loadFails {
				want = procsock.ClassicFilter
			}
			if k := socketFilter(t, conn); k != want {
				t.Fatalf("after the predecessor's Close the socket has filter %q, want %q", k, want)
			}
			serveHost(t, conn, p2.Handler())
			var before uint64
			if !tc.loadFails {
				before = kernelLimited(t, p2.Filter())
			}
			const sent = 400
			answered := burst(t, netip.MustParseAddr("127.0.24.1"), addr, sent)
			goLimited := p2.Handler().Stats().RequestsLimited
			var limited uint64
			if tc.loadFails {
				limited = goLimited
			} else {
				limited = kernelLimited(t, p2.Filter()) - before
				if goLimited != 0 {
					t.Errorf("the Go limiter refused %d beside the eBPF filter", goLimited)
				}
			}
			t.Logf("answered %d of %d, limited %d", answered, sent, limited)
			if limited == 0 || answered >= sent/2 || answered+int(limited) != sent {
				t.Errorf("answered %d + limited %d of %d: want the limits enforced once", answered, limited, sent)
			}
		})
	}
}

// TestAddUDPToNewProtection: the first socket AddUDP gives a Protection of
// NewProtection gets its filter, and its server holds it to the limits.
func TestAddUDPToNewProtection(t *testing.T) {
	requireBPF(t)
	p, err := NewProtection(answerA, rpsConfig(t, "20"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	conn, addr := listenLoopback(t)
	srv, err := p.AddUDP(conn)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	defer srv.Shutdown()
	if st := p.Status(); st.Filter != ModeEBPF || !st.RequestsInKernel || st.Sockets != 1 {
		t.Fatalf("status %v", st)
	}
	if n := burst(t, netip.MustParseAddr("127.0.25.1"), addr, 400); n >= 200 || n == 0 {
		t.Errorf("%d of 400 answered, want the kernel limit", n)
	}
}

// TestStatusProvenClients: Status says where proven clients are judged at their own
// address, and why not when the finest request level is coarser than an address or
// cookies are off.
func TestStatusProvenClients(t *testing.T) {
	coarse := rpsConfig(t, "50")
	if err := coarse.SetValue("ipv4-request-levels", "16:16"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *Config
		opts []Option
		want string
	}{
		{"defaults", rpsConfig(t, "50"), nil, "server cookies verified in Go before the request limits"},
		{"coarse IPv4 levels", coarse, nil, "proven clients judged with their networks: the finest IPv4 request level is /24, not a whole address"},
		{"cookies off", rpsConfig(t, "50"), []Option{WithoutCookies()}, "server cookies off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProtection(answerA, tc.cfg, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			st := p.Status()
			if !strings.Contains(st.String(), tc.want) {
				t.Errorf("status %q, want %q in it", st, tc.want)
			}
			if (st.CookiesReason != nil) != (tc.name == "coarse IPv4 levels") {
				t.Errorf("CookiesReason %v", st.CookiesReason)
			}
		})
	}
}
