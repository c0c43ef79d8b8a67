//go:build linux

package rrl

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// xdpEnv is XDP mode on a veth pair between two network namespaces of the test's
// own: a filter pinned in a private bpffs, servers on the receiver (port 53, IPv4
// and IPv6) with the pinned socket filter attached as well, the XDP program on the
// receiver's end, and a pass program on the sender's (a veth delivers what the other
// end sends with XDP_TX only to an end with NAPI, which an XDP program gives it).
type xdpEnv struct {
	veth       *loadgen.Veth
	pin        string
	srv4, srv6 *udpServer
	f4, f6     *Filter
	flood      *loadgen.Flood
}

func newXDPEnv(t *testing.T, values ...[2]string) *xdpEnv {
	t.Helper()
	requireBPF(t)
	release, err := testutil.LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	e := &xdpEnv{pin: filepath.Join(newPinEnv(t).mnt, "rrl")}
	cfg := NewConfig()
	for _, kv := range values {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := LoadPinned(cfg, e.pin, -1, -1); err != nil {
		t.Fatalf("LoadPinned: %v", err)
	}
	if e.veth, err = loadgen.NewVeth(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.veth.Close() })
	if e.flood, err = loadgen.NewFlood(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.flood.Close() })
	e.veth.Sender.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: e.flood.PassProgram(), Interface: e.veth.SenderIndex})
		if err != nil {
			t.Fatalf("pass program on the sender: %v", err)
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	e.veth.Receiver.Do(func() error {
		e.srv4 = newUDPServer(t, "udp4", netip.AddrPortFrom(e.veth.Receiver4, 53).String())
		e.srv6 = newUDPServer(t, "udp6", netip.AddrPortFrom(e.veth.Receiver6, 53).String())
		return nil
	})
	if e.f4, err = AttachPinned(e.srv4.conn, e.pin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.f4.Close() })
	if e.f6, err = AttachPinned(e.srv6.conn, e.pin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.f6.Close() })
	return e
}

// attach attaches XDP to the receiver's end, natively.
func (e *xdpEnv) attach(t *testing.T, opts *XDPOptions) {
	t.Helper()
	e.veth.Receiver.Do(func() error {
		generic, err := AttachXDP(e.pin, e.veth.ReceiverDev, opts)
		if err != nil {
			t.Fatalf("AttachXDP: %v", err)
		}
		if generic != (opts != nil && opts.Generic) {
			t.Fatalf("AttachXDP: generic %v on a veth, which has native XDP", generic)
		}
		return nil
	})
	t.Cleanup(func() {
		e.veth.Receiver.Do(func() error { DetachXDP(e.pin, e.veth.ReceiverDev); return nil })
	})
}

// rawSender returns a raw sender in the sender's namespace to dst.
func (e *xdpEnv) rawSender(t *testing.T, dst netip.AddrPort) *rawSender {
	var raw *rawSender
	e.veth.Sender.Do(func() error { raw = newRawSender(t, dst); return nil })
	return raw
}

// slipQuery is the attack's query: a name and an OPT record, so that a truncated
// response (header and question) is shorter than it.
func slipQuery(id int) []byte {
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.Id = uint16(id)
	m.SetEdns0(1232, false)
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// tcCapture reads, on the sender's end, what the receiver sends back to sources of
// the attack: truncated responses from the server, each checked.
type tcCapture struct {
	fd      int
	mu      sync.Mutex
	replies map[netip.AddrPort]int // per destination (an attack source)
	bad     []string
	done    chan struct{}
}

func (e *xdpEnv) captureTC(t *testing.T, server netip.AddrPort) *tcCapture {
	t.Helper()
	c := &tcCapture{replies: map[netip.AddrPort]int{}, done: make(chan struct{})}
	err := e.veth.Sender.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		c.fd = fd
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: e.veth.SenderIndex})
	})
	if err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	want := slipQuery(0)
	go func() {
		defer close(c.done)
		buf := make([]byte, 2048)
		for {
			n, from, err := unix.Recvfrom(c.fd, buf, 0)
			if err == unix.EBADF {
				return
			}
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			c.check(buf[:n], server, want)
		}
	}()
	return c
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// check records one frame if it comes from server: a truncated response to a
// slipQuery, with the question echoed, no other section, valid checksums.
func (c *tcCapture) check(f []byte, server netip.AddrPort, query []byte) {
	if len(f) < 14 {
		return
	}
	var src, dst netip.AddrPort
	var udp []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		ip := f[14:]
		if len(ip) < 28 || ip[9] != unix.IPPROTO_UDP {
			return
		}
		udp = ip[20:]
		src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp))
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:]))
		if src != server {
			return
		}
		if onesSum(ip[:20], 0) != 0xffff {
			c.fail("IPv4 header checksum wrong")
			return
		}
	case unix.ETH_P_IPV6:
		ip := f[14:]
		if len(ip) < 48 || ip[6] != unix.IPPROTO_UDP {
			return
		}
		udp = ip[40:]
		src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), binary.BigEndian.Uint16(udp))
		dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), binary.BigEndian.Uint16(udp[2:]))
		if src != server {
			return
		}
		ulen := int(binary.BigEndian.Uint16(udp[4:]))
		if ulen > len(udp) {
			c.fail("IPv6: UDP length beyond the frame")
			return
		}
		pseudo := onesSum(ip[8:40], uint32(ulen)+unix.IPPROTO_UDP)
		if onesSum(udp[:ulen], uint32(pseudo)) != 0xffff {
			c.fail("IPv6: UDP checksum wrong")
			return
		}
	default:
		return
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < 8 || ulen > len(udp) {
		c.fail(fmt.Sprintf("UDP length %d of %d bytes", ulen, len(udp)))
		return
	}
	m := new(dns.Msg)
	if err := m.Unpack(udp[8:ulen]); err != nil {
		c.fail(fmt.Sprintf("response does not parse: %v", err))
		return
	}
	switch {
	case ulen-8 > len(query):
		c.fail(fmt.Sprintf("response of %d bytes to a query of %d", ulen-8, len(query)))
	case !m.Response || !m.Truncated || m.Rcode != dns.RcodeSuccess:
		c.fail(fmt.Sprintf("not a truncated NOERROR response: %v", m.MsgHdr))
	case len(m.Answer)+len(m.Ns)+len(m.Extra) != 0:
		c.fail("response carries records besides the question")
	case len(m.Question) != 1 || m.Question[0].Name != "www.example.com." || m.Question[0].Qtype != dns.TypeA:
		c.fail(fmt.Sprintf("question not echoed: %v", m.Question))
	case !m.RecursionDesired:
		c.fail("RD not kept")
	default:
		c.mu.Lock()
		c.replies[dst]++
		c.mu.Unlock()
	}
}

func (c *tcCapture) fail(s string) {
	c.mu.Lock()
	if len(c.bad) < 5 {
		c.bad = append(c.bad, s)
	}
	c.mu.Unlock()
}

// stop waits for stragglers and closes the socket; it returns the replies per
// destination.
func (c *tcCapture) stop(t *testing.T) map[netip.AddrPort]int {
	time.Sleep(200 * time.Millisecond)
	unix.Close(c.fd)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.bad {
		t.Errorf("bad response: %s", b)
	}
	return c.replies
}

func onesSum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestLiveXDPScenarios runs the socket filter's flood scenarios through XDP on a
// veth pair, with the socket filter of the same pins on the server's socket too: the
// attack is held to about its limit after a second, light clients lose nothing, a
// slip-ratio share of the limited queries is answered with valid truncated
// responses by XDP_TX, and the counters count every packet once.
func TestLiveXDPScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood scenarios take about 40 s")
	}
	const L = 500.0
	const dur = 3 * time.Second
	const from = time.Second
	rng := rand.New(rand.NewPCG(9, 9))
	v4 := func(a, b, c, d byte, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{a, b, c, d}), port)
	}
	// Attack sources in fd00:c613::/32 (the sender's own, so that it receives the
	// slips): a /48 by a, a /56 by b, a /64 by d.
	v6 := func(a uint16, b, d byte, host uint16, port uint16) netip.AddrPort {
		x := [16]byte{0xfd, 0, 0xc6, 0x13, byte(a >> 8), byte(a), b, d, 14: byte(host >> 8), 15: byte(host)}
		return netip.AddrPortFrom(netip.AddrFrom16(x), port)
	}
	scenarios := []struct {
		name   string
		v6     bool
		attack flow
	}{
		{"one source at 10x", false, flow{Name: "heavy", Rate: 10 * L, End: dur,
			Src: func(int) netip.AddrPort { return v4(198, 19, 1, 1, 40000) }}},
		{"a /24 of 200 sources at 20x together", false, flow{Name: "slash24", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v4(198, 19, 2, byte(1+i%200), uint16(30000+i%200)) }}},
		{"random sources on source port 23456 at 20x", false, flow{Name: "port", Rate: 20 * L, End: dur,
			Src: func(int) netip.AddrPort { return v4(198, 19, byte(10+rng.IntN(240)), byte(1+rng.IntN(254)), 23456) }}},
		{"IPv6: one source at 10x", true, flow{Name: "heavy6", Rate: 10 * L, End: dur,
			Src: func(int) netip.AddrPort { return v6(1, 1, 1, 1, 40000) }}},
		{"IPv6: 200 /64s of one /56 at 20x together", true, flow{Name: "slash56", Rate: 20 * L, End: dur,
			Src: func(i int) netip.AddrPort { return v6(2, 2, byte(i%200), 1, uint16(30000+i%200)) }}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			// Side by side, four at a time (the package's -test.parallel): each
			// scenario has namespaces, a veth pair, pins and servers of its own,
			// and judges what the kernel admitted by when it was sent.
			t.Parallel()
			e := newXDPEnv(t, [2]string{"requests-per-second", fmt.Sprint(L)}, [2]string{"slip-ratio", "2"})
			e.attach(t, nil)
			srv, f := e.srv4, e.f4
			if sc.v6 {
				srv, f = e.srv6, e.f6
			}
			attack := sc.attack
			attack.Payload = slipQuery
			flows := []flow{attack}
			for i := 0; i < 10; i++ { // light clients, each in its own /16 or /48
				var src netip.AddrPort
				if sc.v6 {
					src = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0xc6, 0x14, byte(i), 15: 1}), uint16(50000+i))
				} else {
					src = v4(198, 18, byte(1+i), 1, uint16(50000+i))
				}
				flows = append(flows, flow{Name: fmt.Sprintf("light%d", i), Rate: 0.05 * L, End: dur, Src: func(int) netip.AddrPort { return src }})
			}
			capture := e.captureTC(t, srv.addr)
			before, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			lost0, err := e.veth.SenderTxDropped()
			if err != nil {
				t.Fatal(err)
			}
			run := runLiveWith(t, srv, e.rawSender(t, srv.addr), f, flows, dur)
			lost1, err := e.veth.SenderTxDropped()
			if err != nil {
				t.Fatal(err)
			}
			replies := capture.stop(t)
			run.report(t)
			got := run.admitted(t, 0, from, dur)
			if got > 1.3*L {
				t.Errorf("attack admitted at %.0f pps after %v, want at most %.0f", got, from, 1.3*L)
			}
			for fi := 1; fi < len(flows); fi++ {
				if l := run.loss(fi); l >= 0.01 {
					t.Errorf("%s lost %.2f%% of its queries, want < 1%%", flows[fi].Name, 100*l)
				}
			}
			// Each packet counted once: XDP judged them all, the socket filter
			// none again.
			st := run.filter
			sent := 0
			for _, s := range run.sentAt {
				sent += len(s)
			}
			// (Less what the sender's end could not queue, should the receiver's
			// NAPI thread have been kept off its CPU that long.)
			if seen := st.Seen - before.Seen; seen != uint64(sent)-(lost1-lost0) {
				t.Errorf("the pins counted %d packets seen for %d sent, %d of them lost on the pair", seen, sent, lost1-lost0)
			}
			limited := sumLimited(st) - sumLimited(before)
			slipped := st.Slipped - before.Slipped
			total := 0
			for dst, n := range replies {
				if !loadgen.SpoofPrefix4.Contains(dst.Addr()) && !loadgen.SpoofPrefix6.Contains(dst.Addr()) {
					t.Errorf("%d responses to %v, which sent no attack", n, dst)
				}
				total += n
			}
			t.Logf("limited %d, slipped %d, truncated responses received %d", limited, slipped, total)
			if limited == 0 || uint64(total) != slipped {
				t.Errorf("received %d truncated responses, the program counted %d slips", total, slipped)
			}
			if r := float64(slipped) / float64(limited); r < 0.4 || r > 0.6 {
				t.Errorf("slipped %d of %d limited queries (%.2f), want half (slip-ratio 2)", slipped, limited, r)
			}
		})
	}
}

// TestLiveXDPOtherTraffic: with XDP attached, what it does not judge passes
// untouched and uncounted (UDP to another port at 10 times the limit, ICMP echo,
// TCP, neighbour resolution), and detaching leaves the interface without XDP, the
// pins without the link or destinations, and the socket filter judging again.
func TestLiveXDPOtherTraffic(t *testing.T) {
	const L = 200
	e := newXDPEnv(t, [2]string{"requests-per-second", fmt.Sprint(L)})
	e.attach(t, nil)
	var other *udpServer
	e.veth.Receiver.Do(func() error {
		other = newUDPServer(t, "udp4", netip.AddrPortFrom(e.veth.Receiver4, 5353).String())
		return nil
	})
	before, err := e.f4.Stats()
	if err != nil {
		t.Fatal(err)
	}
	raw := e.rawSender(t, other.addr)
	src := netip.MustParseAddrPort("198.19.7.7:40000")
	const n = 10 * L
	done := make(chan []reception)
	go func() { done <- other.collect(time.Now(), nil, 500*time.Millisecond, 10*time.Second) }()
	for i := 0; i < n; i++ {
		raw.send(t, loadgen.Packet(src, other.addr, dnsQuery(uint16(i), false)))
		if i%100 == 99 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := len(<-done); got != n {
		t.Errorf("UDP to port 5353: %d of %d arrived", got, n)
	}
	// ICMP echo over both families, and TCP (a refused connection is an answer
	// too).
	e.veth.Sender.Do(func() error {
		for _, dst := range []netip.Addr{e.veth.Receiver4, e.veth.Receiver6} {
			if err := icmpEcho(dst); err != nil {
				t.Errorf("ICMP echo to %v: %v", dst, err)
			}
		}
		return nil
	})
	e.veth.Sender.Do(func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(e.veth.Receiver4, 53).String(), 2*time.Second)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("TCP to port 53: %v, want connection refused (the TCP reset crossed)", err)
		}
		if c != nil {
			c.Close()
		}
		return nil
	})
	after, err := e.f4.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after.Seen != before.Seen {
		t.Errorf("traffic XDP does not judge was counted: seen %d -> %d", before.Seen, after.Seen)
	}

	// Detach: the interface, the pins and the socket filter as before the attach.
	e.veth.Receiver.Do(func() error {
		if err := DetachXDP(e.pin, e.veth.ReceiverDev); err != nil {
			t.Fatalf("DetachXDP: %v", err)
		}
		return nil
	})
	out, err := exec.Command("ip", "-n", e.veth.Receiver.Name, "-d", "link", "show", "dev", e.veth.ReceiverDev).CombinedOutput()
	if err != nil || strings.Contains(string(out), "xdp") {
		t.Errorf("after detach: %v\n%s", err, out)
	}
	if m, _ := filepath.Glob(filepath.Join(e.pin, pinXDPLinkPrefix+"*")); len(m) != 0 {
		t.Errorf("after detach the pins hold %v", m)
	}
	objs, err := loadXDPObjects(e.pin, []uint16{53}, true)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.close()
	var k xdpDestKey
	var v, count uint32
	if it := objs.dests.Iterate(); it.Next(&k, &v) {
		t.Errorf("after detach rrl_xdp_dests holds %+v", k)
	}
	if err := objs.state.Lookup(uint32(0), &count); err != nil || count != 0 {
		t.Errorf("after detach rrl_xdp counts %d (%v)", count, err)
	}
	raw4 := e.rawSender(t, e.srv4.addr)
	for i := 0; i < 10; i++ {
		raw4.send(t, loadgen.Packet(src, e.srv4.addr, dnsQuery(uint16(i), false)))
	}
	e.srv4.collect(time.Now(), nil, 300*time.Millisecond, 5*time.Second)
	final, err := e.f4.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if final.Seen != after.Seen+10 {
		t.Errorf("after detach the socket filter saw %d of 10 queries", final.Seen-after.Seen)
	}
}

// icmpEcho sends an ICMP (or ICMPv6) echo request to dst from the calling thread's
// network namespace and waits up to two seconds for the reply.
func icmpEcho(dst netip.Addr) error {
	family, proto, typ, reply := unix.AF_INET6, unix.IPPROTO_ICMPV6, byte(128), byte(129)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		family, proto, typ, reply = unix.AF_INET, unix.IPPROTO_ICMP, 8, 0
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	msg := []byte{typ, 0, 0, 0, 0x12, 0x34, 0, 1, 'r', 'r', 'l', '!'}
	if !dst.Is6() { // the kernel sums ICMPv6 itself
		c := ^onesSum(msg, 0)
		msg[2], msg[3] = byte(c>>8), byte(c)
	}
	if err := unix.Sendto(fd, msg, 0, sa); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("no reply: %w", err)
		}
		b := buf[:n]
		if !dst.Is6() && n >= 20 {
			b = b[int(b[0]&0xf)*4:] // raw IPv4 sockets read the IP header too
		}
		if len(b) >= 8 && b[0] == reply && b[4] == 0x12 && b[5] == 0x34 {
			return nil
		}
	}
}
