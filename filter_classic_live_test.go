package rrl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The classic prefilter and the facts it relies on, on real loopback sockets.

// liveSocket is one kind of server socket and the senders that reach it.
type liveSocket struct {
	name    string
	network string               // for net.ListenUDP
	listen  netip.Addr           // address to listen on
	target  netip.Addr           // address the senders send to
	sources func(int) netip.Addr // the i-th sender's source address
	ipv6    bool                 // senders are IPv6
}

var liveSockets = []liveSocket{
	{"IPv4", "udp4", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.1"), loopback4, false},
	{"IPv6", "udp6", netip.IPv6Loopback(), netip.IPv6Loopback(), loopback6, true},
	{"dual-stack via IPv4", "udp", netip.IPv6Unspecified(), netip.MustParseAddr("127.0.0.1"), loopback4, false},
	{"dual-stack via IPv6", "udp", netip.IPv6Unspecified(), netip.IPv6Loopback(), loopback6, true},
}

// loopback4 gives each sender its own source address, 127.0.1.i.
func loopback4(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 1)}) }

// loopback6 is ::1 for everyone: IPv6 has one loopback address, senders differ by port.
func loopback6(int) netip.Addr { return netip.IPv6Loopback() }

// listenLive opens the server socket, checking its family (and for the dual-stack
// kinds that it is dual-stack), and closes it when t ends. Without IPv6 on the
// machine the IPv6 kinds skip, unless RRL_REQUIRE_BPF=1.
func listenLive(t *testing.T, s liveSocket) *net.UDPConn {
	t.Helper()
	conn, err := net.ListenUDP(s.network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.listen, 0)))
	if err != nil {
		if s.listen.Is6() && os.Getenv("RRL_REQUIRE_BPF") != "1" {
			t.Skipf("no IPv6 loopback on this machine: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	err = sockopt.Control(conn, func(fd int) error {
		domain, err := socketDomain(fd)
		if err != nil {
			return err
		}
		wantDomain := unix.AF_INET
		if s.listen.Is6() {
			wantDomain = unix.AF_INET6
		}
		if domain != wantDomain {
			return fmt.Errorf("socket domain %d, want %d", domain, wantDomain)
		}
		if domain == unix.AF_INET6 {
			v6only, err := socketV6Only(fd)
			if err != nil {
				return err
			}
			if dual := s.listen.IsUnspecified(); v6only == dual {
				return fmt.Errorf("IPV6_V6ONLY = %v on a socket that should be dual-stack=%v", v6only, dual)
			}
		}
		return checkUDPSocket(fd)
	})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// liveCase is one datagram sent to the server from its own source.
type liveCase struct {
	name    string
	port    uint16 // source port; 0 means an ephemeral one unless raw
	raw     bool   // sent through a raw socket, the only way to use source port 0
	payload []byte
	pass    bool // whether the filter must deliver it
	// ipOptions sends with IPv4 options (IP_OPTIONS) or an IPv6 destination options
	// header (IPV6_DSTOPTS), which lengthen the IP header the filter never reads.
	ipOptions bool
}

// cannotSend reports why this process cannot send c (empty when it can).
func (c liveCase) cannotSend(s liveSocket, caps uint64, unprivPortStart int) string {
	if (c.raw || c.ipOptions && s.ipv6) && caps&(1<<unix.CAP_NET_RAW) == 0 {
		return "needs CAP_NET_RAW"
	}
	if !c.raw && c.port != 0 && int(c.port) < unprivPortStart && caps&(1<<unix.CAP_NET_BIND_SERVICE) == 0 {
		return "needs CAP_NET_BIND_SERVICE"
	}
	return ""
}

// sentPacket records where a case's datagram came from.
type sentPacket struct {
	c   liveCase
	key packetKey
}

// packetKey tells datagrams apart: IPv6 senders share ::1 and may share a port, so
// the DNS ID (unique per case, -1 for a payload too short to have one) counts too.
type packetKey struct {
	src netip.AddrPort
	id  int
}

func keyOf(src netip.AddrPort, payload []byte) packetKey {
	k := packetKey{netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), -1}
	if len(payload) >= 2 {
		k.id = int(binary.BigEndian.Uint16(payload))
	}
	return k
}

// sendCases sends each case to server from its own socket and returns the sources.
func sendCases(t *testing.T, s liveSocket, server netip.AddrPort, cases []liveCase) []sentPacket {
	t.Helper()
	var sent []sentPacket
	for i, c := range cases {
		src := netip.AddrPortFrom(s.sources(i), c.port)
		if c.raw {
			src = netip.AddrPortFrom(server.Addr(), 0)
			sendRawUDP(t, server, c.payload)
		} else {
			network := "udp4"
			if s.ipv6 {
				network = "udp6"
			}
			conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(src))
			if err != nil {
				t.Fatalf("%s: bind %v: %v", c.name, src, err)
			}
			src = conn.LocalAddr().(*net.UDPAddr).AddrPort()
			if c.ipOptions {
				if err := sockopt.Control(conn, setIPOptions); err != nil {
					conn.Close()
					t.Fatalf("%s: %v", c.name, err)
				}
			}
			if _, err := conn.WriteToUDPAddrPort(c.payload, server); err != nil {
				conn.Close()
				t.Fatalf("%s: send from %v: %v", c.name, src, err)
			}
			conn.Close()
		}
		sent = append(sent, sentPacket{c, keyOf(src, c.payload)})
	}
	return sent
}

// setIPOptions makes the socket send with IP header options: three NOPs and an end
// of list for IPv4 (a 24-byte header), a destination options header holding one
// 4-byte PadN option for IPv6 (8 bytes before the UDP header).
func setIPOptions(fd int) error {
	domain, err := socketDomain(fd)
	if err != nil {
		return err
	}
	if domain == unix.AF_INET {
		return unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, "\x01\x01\x01\x00")
	}
	// Next header (filled in by the kernel), length 0 (8 bytes), PadN of 4 bytes.
	return unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, "\x00\x00\x01\x04\x00\x00\x00\x00")
}

// sendRawUDP sends a UDP datagram with source port 0 to dst through a raw socket;
// the kernel adds the IP header and, for IPv6, the checksum.
func sendRawUDP(t *testing.T, dst netip.AddrPort, payload []byte) {
	t.Helper()
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.Addr().As16()}
	if a := dst.Addr().Unmap(); a.Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Addr: a.As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer unix.Close(fd)
	if family == unix.AF_INET6 {
		// IPv6 requires a UDP checksum: let the kernel fill it in at offset 6.
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_CHECKSUM, 6); err != nil {
			t.Fatalf("IPV6_CHECKSUM: %v", err)
		}
	}
	// IPv4 UDP checksum 0 means none.
	if err := unix.Sendto(fd, udpDatagram(0, dst.Port(), payload), 0, sa); err != nil {
		t.Fatalf("raw send to %v: %v", dst, err)
	}
}

// receiveAll reads from server until every one of total datagrams sent since the
// drop counter read dropsBefore is accounted for, as received or as dropped, or
// until a deadline. It returns the sources received (each with its count) and the
// number dropped.
func receiveAll(t *testing.T, server *net.UDPConn, total int, dropsBefore uint32) (map[packetKey]int, int) {
	t.Helper()
	got := map[packetKey]int{}
	received, dropped := 0, 0
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, from, err := server.ReadFromUDPAddrPort(buf)
		if err == nil {
			got[keyOf(from, buf[:n])]++
			received++
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
		dropped = int(socketDropCount(t, server) - dropsBefore)
		if received+dropped >= total {
			break
		}
	}
	return got, dropped
}

func socketDropCount(t *testing.T, conn *net.UDPConn) uint32 {
	t.Helper()
	n, err := loadgen.Drops(conn)
	if err != nil {
		t.Fatalf("SO_MEMINFO: %v", err)
	}
	return n
}

// checkDelivery sends the cases to server and checks that exactly those marked pass
// (all of them if passAll) arrive, and that the others are counted as dropped.
func checkDelivery(t *testing.T, s liveSocket, server *net.UDPConn, cases []liveCase, passAll bool) {
	t.Helper()
	addr := netip.AddrPortFrom(s.target, server.LocalAddr().(*net.UDPAddr).AddrPort().Port())
	before := socketDropCount(t, server)
	sent := sendCases(t, s, addr, cases)
	seen := map[packetKey]bool{}
	for _, p := range sent {
		if seen[p.key] {
			t.Fatalf("two cases sent from %v with ID %d: cannot tell them apart", p.key.src, p.key.id)
		}
		seen[p.key] = true
	}
	got, dropped := receiveAll(t, server, len(sent), before)
	wantDropped := 0
	for _, p := range sent {
		want := 0
		if p.c.pass || passAll {
			want = 1
		} else {
			wantDropped++
		}
		if got[p.key] != want {
			t.Errorf("%s from %v: received %d times, want %d", p.c.name, p.key.src, got[p.key], want)
		}
		delete(got, p.key)
	}
	for k, n := range got {
		t.Errorf("received %d unexpected datagrams from %v with ID %d", n, k.src, k.id)
	}
	if dropped != wantDropped {
		t.Errorf("socket counted %d drops, want %d", dropped, wantDropped)
	}
}

// liveConfigs are the prefilter settings tested on live sockets with their cases.
// Listed ports lie below the ephemeral range (32768 and up by default), so an
// ephemeral source is never on a list.
func liveConfigs(t *testing.T) []struct {
	name  string
	cfg   *Config
	cases []liveCase
} {
	q := minimalQuery(0x4242)
	cases := []liveCase{
		{name: "minimal query, ephemeral port", payload: q, pass: true},
		{name: "EDNS query, ephemeral port", payload: ednsQuery(t, 0x4243), pass: true},
		{name: "minimal query from 23456", port: 23456, payload: q, pass: true},
		{name: "minimal query from 53", port: 53, payload: q, pass: true},
		{name: "16-byte truncated query", payload: q[:16], pass: false},
		{name: "empty datagram", payload: nil, pass: false},
		{name: "response (QR set)", payload: minimalResponse(0x4244), pass: false},
		{name: "minimal query with IP options", payload: q, pass: true, ipOptions: true},
		{name: "response with IP options", payload: minimalResponse(0x4246), pass: false, ipOptions: true},
		{name: "reflection port 11211 with IP options", port: 11211, payload: q, pass: false, ipOptions: true},
		{name: "minimal query from port 0", raw: true, payload: q, pass: false},
	}
	for _, p := range defaultReflectionPorts[:] {
		if p != 0 {
			cases = append(cases, liveCase{name: "minimal query from " + strconv.Itoa(int(p)),
				port: p, payload: q, pass: false})
		}
	}
	custom := []liveCase{
		{name: "minimal query, ephemeral port", payload: q, pass: true},
		{name: "minimal query from 20202 (listed)", port: 20202, payload: q, pass: false},
		{name: "minimal query from 11211 (listed)", port: 11211, payload: q, pass: false},
		{name: "minimal query from 1900 (not listed)", port: 1900, payload: q, pass: true},
		{name: "minimal query from 123 (not listed)", port: 123, payload: q, pass: true},
		{name: "minimal query from port 0 (not listed)", raw: true, payload: q, pass: true},
		{name: "response (QR set)", payload: minimalResponse(0x4245), pass: false},
	}
	for _, list := range [][]liveCase{cases, custom} {
		for i := range list {
			if p := list[i].payload; len(p) >= 2 {
				list[i].payload = slices.Clone(p)
				binary.BigEndian.PutUint16(list[i].payload, uint16(0x4000+i))
			}
		}
	}
	return []struct {
		name  string
		cfg   *Config
		cases []liveCase
	}{
		{"default", NewConfig(), cases},
		{"reflection-ports 11211 20202", newConfigWith(t, "reflection-ports", "11211 20202"), custom},
	}
}

// testClassicLive runs the prefilter on every kind of live socket with the cases
// this process can send, then detaches it and checks that everything flows.
func testClassicLive(t *testing.T) {
	caps, err := effectiveCaps()
	if err != nil {
		t.Fatal(err)
	}
	unprivPortStart := 1024
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); err == nil {
		unprivPortStart, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	for _, lc := range liveConfigs(t) {
		for _, s := range liveSockets {
			var cases []liveCase
			for _, c := range lc.cases {
				if why := c.cannotSend(s, caps, unprivPortStart); why != "" {
					t.Logf("%s/%s: case %q left out: %s", lc.name, s.name, c.name, why)
					continue
				}
				cases = append(cases, c)
			}
			t.Run(lc.name+"/"+s.name, func(t *testing.T) {
				server := listenLive(t, s)
				if err := attachClassic(server, lc.cfg); err != nil {
					t.Fatal(err)
				}
				checkDelivery(t, s, server, cases, false)
				if err := detachFilter(server); err != nil {
					t.Fatal(err)
				}
				checkDelivery(t, s, server, cases, true)
				if err := detachFilter(server); !errors.Is(err, unix.ENOENT) {
					t.Errorf("second detach: %v, want ENOENT", err)
				}
			})
		}
	}
}

func TestClassicLive(t *testing.T) { testClassicLive(t) }

// hasCap reports whether the process has capability c.
func hasCap(c int) bool {
	caps, err := effectiveCaps()
	return err == nil && caps&(1<<c) != 0
}

// The same as an unprivileged process: attaching a classic filter needs no privilege.
func TestClassicLiveUnprivileged(t *testing.T) {
	if isUnprivilegedChild() {
		checkUnprivileged(t)
		testClassicLive(t)
		return
	}
	runUnprivileged(t, "TestClassicLiveUnprivileged")
}

// A filter attached with the longest reflection list is accepted by the kernel and
// drops exactly the listed ports on a live socket.
func TestClassicLiveLongList(t *testing.T) {
	cfg := NewConfig()
	cfg.reflectionPorts = nil
	for i := range maxReflectionPorts {
		cfg.reflectionPorts = append(cfg.reflectionPorts, uint16(20000+3*i))
	}
	s := liveSockets[0]
	server := listenLive(t, s)
	if err := attachClassic(server, cfg); err != nil {
		t.Fatal(err)
	}
	var cases []liveCase
	for _, p := range []uint16{20000, 20001, 20003, 20093, 20189, 20190, 20186, 19999} {
		listed := (p-20000)%3 == 0 && p >= 20000 && p < 20000+3*maxReflectionPorts
		cases = append(cases, liveCase{name: "from " + strconv.Itoa(int(p)), port: p,
			payload: minimalQuery(p), pass: !listed})
	}
	checkDelivery(t, s, server, cases, false)
}

// attachClassic refuses sockets whose filter would read the wrong offsets.
func TestAttachClassicNotUDP(t *testing.T) {
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := attachClassic(ln, NewConfig()); err == nil || !strings.Contains(err.Error(), "not a UDP socket") {
		t.Errorf("attach to TCP listener: %v, want a not-UDP error", err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := attachClassic(conn, NewConfig()); err == nil {
		t.Error("attach to a closed socket: no error")
	}
}

// Facts about what a socket filter sees on a live UDP socket, which the prefilter
// and the eBPF program rely on: each probe passes a datagram only if a field holds
// the expected value at the expected offset.
func TestSocketFilterSeesUDPHeader(t *testing.T) {
	payload := minimalQuery(0xabcd)
	netOff := int32(skfNetOff)
	for _, s := range liveSockets {
		t.Run(s.name, func(t *testing.T) {
			server := listenLive(t, s)
			dport := uint32(server.LocalAddr().(*net.UDPAddr).Port)
			const sport = 23456
			ipVersion := uint32(4)
			if s.ipv6 {
				ipVersion = 6
			}
			type probe struct {
				name      string
				load      []bpf.Instruction
				value     uint32
				pass      bool
				ipOptions bool // send with IP options
			}
			probes := []probe{
				{"source port at 0", []bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 2}}, sport, true, false},
				{"destination port at 2", []bpf.Instruction{bpf.LoadAbsolute{Off: 2, Size: 2}}, dport, true, false},
				{"UDP length at 4", []bpf.Instruction{bpf.LoadAbsolute{Off: 4, Size: 2}}, 8 + 17, true, false},
				{"DNS ID at 8", []bpf.Instruction{bpf.LoadAbsolute{Off: 8, Size: 2}}, 0xabcd, true, false},
				{"length extension counts from the UDP header",
					[]bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtLen}}, 8 + 17, true, false},
				{"IP version at SKF_NET_OFF", []bpf.Instruction{
					bpf.LoadAbsolute{Off: uint32(netOff), Size: 1},
					bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: 4}}, ipVersion, true, false},
				// Controls: a probe can fail.
				{"destination port at 2, wrong value",
					[]bpf.Instruction{bpf.LoadAbsolute{Off: 2, Size: 2}}, dport + 1, false, false},
				{"length extension, IP header length added",
					[]bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtLen}}, 20 + 8 + 17, false, false},
			}
			// With IP options the IP header grows and the data still starts at the UDP
			// header; without them the probe reads the plain header.
			ipv4HeaderWords := []bpf.Instruction{bpf.LoadAbsolute{Off: uint32(netOff), Size: 1},
				bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0x0f}}
			ipv6NextHeader := []bpf.Instruction{bpf.LoadAbsolute{Off: uint32(netOff) + 6, Size: 1}}
			if !s.ipv6 {
				probes = append(probes,
					probe{"IPv4 header of 20 bytes", ipv4HeaderWords, 5, true, false},
					probe{"IPv4 header of 24 bytes with options", ipv4HeaderWords, 6, true, true},
					probe{"source port at 0 with IPv4 options",
						[]bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 2}}, sport, true, true})
			} else if hasCap(unix.CAP_NET_RAW) {
				probes = append(probes,
					probe{"IPv6 next header UDP", ipv6NextHeader, unix.IPPROTO_UDP, true, false},
					probe{"IPv6 next header destination options", ipv6NextHeader, unix.IPPROTO_DSTOPTS, true, true},
					probe{"source port at 0 with IPv6 destination options",
						[]bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 2}}, sport, true, true})
			} else {
				t.Log("IPv6 destination options need CAP_NET_RAW: not probed")
			}
			for _, p := range probes {
				cases := []liveCase{{name: "query", port: sport, payload: payload, ipOptions: p.ipOptions}}
				prog, err := bpf.Assemble(append(p.load,
					bpf.JumpIf{Cond: bpf.JumpEqual, Val: p.value, SkipFalse: 1},
					bpf.RetConstant{Val: classicPass},
					bpf.RetConstant{Val: 0}))
				if err != nil {
					t.Fatal(err)
				}
				if err := attachRawFilter(server, prog, "attach probe"); err != nil {
					t.Fatal(err)
				}
				t.Run(p.name, func(t *testing.T) {
					cases[0].pass = p.pass
					checkDelivery(t, s, server, cases, false)
				})
			}
		})
	}
}

// The receive path with and without the prefilter, one datagram at a time through
// a real loopback socket. The VM's cost says nothing about the kernel's, so this is
// the number to compare: it includes the sender's system call.
func BenchmarkClassicLoopback(b *testing.B) {
	long := NewConfig()
	long.reflectionPorts = nil
	for i := range maxReflectionPorts {
		long.reflectionPorts = append(long.reflectionPorts, uint16(1000+i))
	}
	for _, bc := range []struct {
		name   string
		cfg    *Config // nil: no filter
		source uint16  // 0: ephemeral
		pass   bool
	}{
		{"none", nil, 0, true},
		{"classic-default", NewConfig(), 0, true},
		{"classic-64-ports", long, 0, true},
		{"none-from-11211", nil, 11211, true},
		{"classic-drop-11211", NewConfig(), 11211, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			server, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer server.Close()
			if bc.cfg != nil {
				if err := attachClassic(server, bc.cfg); err != nil {
					b.Fatal(err)
				}
			}
			sender, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 2, 1), Port: int(bc.source)},
				server.LocalAddr().(*net.UDPAddr))
			if err != nil {
				b.Fatal(err)
			}
			defer sender.Close()
			payload := minimalQuery(1)
			buf := make([]byte, 512)
			dropsBefore, err := loadgen.Drops(server)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			n := 0
			start := time.Now()
			for b.Loop() {
				if _, err := sender.Write(payload); err != nil {
					b.Fatal(err)
				}
				if bc.pass {
					server.SetReadDeadline(time.Now().Add(time.Second))
					if _, _, err := server.ReadFromUDPAddrPort(buf); err != nil {
						b.Fatal(err)
					}
				}
				n++
			}
			elapsed := time.Since(start)
			dropsAfter, err := loadgen.Drops(server)
			if err != nil {
				b.Fatal(err)
			}
			wantDrops := 0
			if !bc.pass {
				wantDrops = n
			}
			if got := int(dropsAfter - dropsBefore); got != wantDrops {
				b.Fatalf("%d packets dropped, want %d", got, wantDrops)
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n), "ns/packet")
		})
	}
}
