//go:build linux

package rrl

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// answerA answers every query with one A record.
var answerA = dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	if len(q.Question) == 1 {
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)}}
	}
	w.WriteMsg(m)
})

// startProtected protects a new loopback UDP socket with cfg and serves answerA
// on it; everything stops when t ends.
func startProtected(t *testing.T, cfg *Config, opts ...Option) (*Protection, netip.AddrPort) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := Protect(conn, answerA, cfg, opts...)
	if err != nil {
		conn.Close()
		t.Fatalf("Protect: %v", err)
	}
	srv := p.UDPServer()
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() {
		srv.Shutdown()
		if err := p.Close(); err != nil {
			t.Errorf("Protection.Close: %v", err)
		}
	})
	return p, conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// burstQuiet is the silence that ends a burst's answers: on loopback an answer
// comes within milliseconds of its query, so half a second without one means that
// no more are coming.
const burstQuiet = 500 * time.Millisecond

// burst sends n queries from a socket bound to src as fast as it can and returns how
// many were answered.
func burst(t *testing.T, src netip.Addr, dst netip.AddrPort, n int) int {
	t.Helper()
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(dst))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var answered atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			c.SetReadDeadline(time.Now().Add(burstQuiet))
			if _, err := c.Read(buf); err != nil {
				return
			}
			answered.Add(1)
		}
	}()
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	for i := range n {
		q.Id = uint16(i)
		b, _ := q.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if i%10 == 9 {
			time.Sleep(time.Millisecond) // stay far below the socket buffers' size
		}
	}
	<-done
	return int(answered.Load())
}

// TestProtectEnforcesRequestsOnce: in every mode the host can end up in, Protect
// applies requests-per-second exactly once to a UDP query: a burst from one source
// is limited, and every query the limiter in force passed is answered (so no second
// limit withheld any).
func TestProtectEnforcesRequestsOnce(t *testing.T) {
	requireBPF(t)
	modes := []struct {
		name   string
		inject error // nil: the real eBPF filter
		want   error
	}{{name: "ebpf"}}
	for _, c := range injectedLoadFailures {
		modes = append(modes, struct {
			name   string
			inject error
			want   error
		}{c.name, c.err, c.want})
	}
	for i, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if m.inject != nil {
				failLoad(t, m.inject)
			}
			cfg := NewConfig()
			cfg.SetValue("requests-per-second", "20")
			p, addr := startProtected(t, cfg)
			st := p.Status()
			t.Logf("status: %v", st)
			if m.inject == nil {
				if st.Filter != ModeEBPF || !st.RequestsInKernel || st.Reason != nil || p.Limiter() != nil {
					t.Fatalf("status %+v, want the eBPF filter limiting requests", st)
				}
			} else if st.Filter != ModeClassic || st.RequestsInKernel || !errors.Is(st.Reason, m.want) || p.Limiter() == nil {
				t.Fatalf("status %+v, want the classic filter, requests in Go, reason %v", st, m.want)
			}
			const sent = 400
			src := netip.AddrFrom4([4]byte{127, 0, 21, byte(1 + i)})
			answered := burst(t, src, addr, sent)
			var limited uint64
			if st.RequestsInKernel {
				fs, err := p.Filter().Stats()
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range fs.Nodes {
					limited += n.Limited
				}
			} else {
				limited = p.Limiter().Stats().limited()
				if got := p.Handler().Stats().RequestsLimited; got != limited {
					t.Errorf("handler refused %d, limiter %d", got, limited)
				}
			}
			rs := p.RRL().GetStats(false)
			t.Logf("answered %d of %d, limited by the request limiter %d, RRL reasons %v", answered, sent, limited, rs.IPReasons)
			if limited == 0 || answered >= sent/2 {
				t.Errorf("requests-per-second not enforced: %d of %d answered", answered, sent)
			}
			if rs.IPReasons[IPRateLimit] != 0 || rs.Actions[Drop]+rs.Actions[Slip] != 0 {
				t.Errorf("RRL limited requests a second time: %+v", rs)
			}
			if answered+int(limited) != sent {
				t.Errorf("answered %d + limited %d != sent %d: something else withheld queries", answered, limited, sent)
			}
		})
	}
}

// TestProtectTCPAndStatus: the TCP server answers through the same Handler, and the
// status line names the mode and where requests are limited.
func TestProtectTCPAndStatus(t *testing.T) {
	requireBPF(t)
	p, addr := startProtected(t, nil)
	if s := p.Status().String(); !strings.Contains(s, "kernel filter: ebpf") || !strings.Contains(s, "request limits in the kernel") {
		t.Errorf("status line %q", s)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := p.TCPServer(l)
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	defer srv.Shutdown()
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	cl := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	r, _, err := cl.Exchange(q, l.Addr().String())
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("TCP exchange: %v %v", r, err)
	}
	cl.Net = "udp"
	opt := q.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	if r, _, err = cl.Exchange(q, addr.String()); err != nil || len(r.Answer) != 1 {
		t.Fatalf("UDP exchange: %v %v", r, err)
	}
	if c, ok := cookieFromMsg(r); !ok || len(c) != clientCookieLen+16 {
		t.Errorf("answer to a client cookie carries cookie %x, want a server cookie (cookies on by default)", c)
	}
	if len(p.TCPLimiters()) != 1 {
		t.Errorf("TCPLimiters: %d", len(p.TCPLimiters()))
	}
}

// TestProtectAddUDP: a second socket shares the filter; after Close, AddUDP fails.
func TestProtectAddUDP(t *testing.T) {
	requireBPF(t)
	p, _ := startProtected(t, nil)
	conn, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := p.AddUDP(conn); err != nil {
		t.Fatalf("AddUDP: %v", err)
	}
	// The program is on the second socket: a reflected response from NTP's port is
	// counted and dropped by the shared filter.
	before, _ := p.Filter().Stats()
	c, err := net.DialUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback}, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1})
	time.Sleep(50 * time.Millisecond)
	after, _ := p.Filter().Stats()
	if after.DroppedResponse != before.DroppedResponse+1 {
		t.Errorf("second socket: DroppedResponse %d -> %d", before.DroppedResponse, after.DroppedResponse)
	}
	p.Close()
	if _, err := p.AddUDP(conn); !errors.Is(err, ErrClosed) {
		t.Errorf("AddUDP after Close: %v", err)
	}
}

// TestProtectRefusesTCPSocket: a socket that cannot be protected is an error, not a
// half-built Protection.
func TestProtectRefusesTCPSocket(t *testing.T) {
	requirePrivilege(t, unix.CAP_BPF)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if p, err := Protect(conn, answerA, nil); err == nil || p != nil {
		t.Fatalf("Protect(closed socket) = %v, %v; want an error", p, err)
	}
}

// TestProtectUpdate: Update changes the limits of every layer at once; a
// configuration the kernel filter refuses changes nothing anywhere.
func TestProtectUpdate(t *testing.T) {
	requireBPF(t)
	for i, inject := range []error{nil, errors.New("injected")} {
		name := "ebpf"
		if inject != nil {
			name = "classic"
		}
		t.Run(name, func(t *testing.T) {
			if inject != nil {
				failLoad(t, inject)
			}
			cfg := NewConfig()
			cfg.SetValue("requests-per-second", "10000")
			p, addr := startProtected(t, cfg)
			src := func(j int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, byte(30 + i), byte(j)}) }
			if got := burst(t, src(1), addr, 200); got != 200 {
				t.Fatalf("before Update: %d of 200 answered", got)
			}
			// Too many exempt prefixes for the kernel filter, and a response limit
			// that would show: refused, and nothing changes.
			bad := NewConfig()
			bad.SetValue("requests-per-second", "10000")
			bad.SetValue("responses-per-second", "1")
			var many []string
			for k := range 1100 {
				many = append(many, netip.AddrFrom4([4]byte{10, byte(k >> 8), byte(k), 0}).String()+"/24")
			}
			bad.SetValue("exempt-clients", strings.Join(many, " "))
			if _, err := p.Update(bad); err == nil && inject == nil {
				t.Fatal("Update with 1100 exempt prefixes: no error from the eBPF filter")
			} else if err != nil {
				if got := burst(t, src(2), addr, 200); got != 200 {
					t.Fatalf("after a refused Update: %d of 200 answered, want the old limits", got)
				}
			}
			good := NewConfig()
			good.SetValue("requests-per-second", "20")
			if _, err := p.Update(good); err != nil {
				t.Fatalf("Update: %v", err)
			}
			if got := burst(t, src(3), addr, 400); got > 200 {
				t.Fatalf("after Update to 20 per second: %d of 400 answered", got)
			}
			invalid := NewConfig()
			invalid.window = -1
			if _, err := p.Update(invalid); err == nil {
				t.Fatal("Update with an invalid Config: no error")
			}
		})
	}
}

// TestProtectKernelEvents: with an event function in the Config, a Protection
// reports the groups the eBPF filter limits, and Close stops watching.
func TestProtectKernelEvents(t *testing.T) {
	requireBPF(t)
	got := make(chan LimitEvent, 16)
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "50")
	cfg.SetEventFunc(func(e LimitEvent) {
		if e.Account == AccountGroup {
			select {
			case got <- e:
			default:
			}
		}
	})
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p, err := Protect(conn, answerA, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &udpServer{conn: conn, addr: conn.LocalAddr().(*net.UDPAddr).AddrPort()}
	src := netip.MustParseAddrPort("127.0.40.1:40000")
	floodFrom(t, srv, src, 2000)
	select {
	case e := <-got:
		if e.Stop || e.Network != netip.PrefixFrom(src.Addr(), 32) {
			t.Errorf("event %v, want the start of limiting 127.0.40.1/32", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no kernel limiting event")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
