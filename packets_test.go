package rrl

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// dnsQuery returns a DNS query for the root name (the smallest question there is:
// 17 bytes) or, with edns, with an OPT record (28 bytes).
func dnsQuery(id uint16, edns bool) []byte {
	q := []byte{byte(id >> 8), byte(id), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}
	if edns {
		q[11] = 1
		q = append(q, 0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0)
	}
	return q
}

// ipv4Packet builds an IPv4/UDP datagram from src to dst carrying payload, with
// optional IP options (a multiple of 4 bytes).
func ipv4Packet(src, dst netip.AddrPort, options, payload []byte) []byte {
	ihl := 20 + len(options)
	total := ihl + 8 + len(payload)
	b := make([]byte, total)
	b[0] = 0x40 | byte(ihl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(total))
	b[8] = 64
	b[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], options)
	binary.BigEndian.PutUint16(b[10:], checksum(b[:ihl], 0))
	u := b[ihl:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	copy(u[8:], payload)
	return b
}

// ipv6Packet builds an IPv6/UDP datagram, optionally behind a destination options
// header (8 bytes of PadN).
func ipv6Packet(src, dst netip.AddrPort, destOpts bool, payload []byte) []byte {
	ext := 0
	if destOpts {
		ext = 8
	}
	b := make([]byte, 40+ext+8+len(payload))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(ext+8+len(payload)))
	b[6] = unix.IPPROTO_UDP
	b[7] = 64
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	if destOpts {
		b[6] = unix.IPPROTO_DSTOPTS
		b[40] = unix.IPPROTO_UDP
		b[41] = 0
		b[42], b[43] = 1, 4 // PadN, 4 bytes
	}
	u := b[40+ext:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	copy(u[8:], payload)
	// The UDP checksum is mandatory over IPv6: pseudo-header, then the datagram.
	var pseudo uint32
	for i := 0; i < 16; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(s[i:])) + uint32(binary.BigEndian.Uint16(d[i:]))
	}
	pseudo += uint32(len(u)) + unix.IPPROTO_UDP
	c := checksum(u, pseudo)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
	return b
}

func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// rawSender sends hand-built IP datagrams with any source address, so tests can
// play many clients (and spoofed floods) on loopback. It needs CAP_NET_RAW.
type rawSender struct {
	fd  int
	v6  bool
	dst unix.Sockaddr
}

func newRawSender(t testing.TB, dst netip.AddrPort) *rawSender {
	t.Helper()
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.Addr().As16()}
	if dst.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &rawSender{fd: fd, v6: family == unix.AF_INET6, dst: sa}
}

func (r *rawSender) send(t testing.TB, pkt []byte) {
	if err := unix.Sendto(r.fd, pkt, 0, r.dst); err != nil {
		t.Fatalf("raw send: %v", err)
	}
}

// udpServer is a UDP socket that counts what it receives per source address.
type udpServer struct {
	conn *net.UDPConn
	addr netip.AddrPort
}

func newUDPServer(t testing.TB, network, addr string) *udpServer {
	t.Helper()
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A queue deep enough that the reader never loses packets to buffer overflow,
	// which would look like limiting.
	control(conn, func(fd int) error {
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
	})
	return &udpServer{conn: conn, addr: conn.LocalAddr().(*net.UDPAddr).AddrPort()}
}

// reception is one datagram the server read.
type reception struct {
	at   time.Duration // since the collection started
	from netip.AddrPort
	size int
}

// collect reads until stop is closed and then no datagram has arrived for quiet
// (stop nil: until the first quiet period), or until max has passed.
func (s *udpServer) collect(start time.Time, stop <-chan struct{}, quiet, max time.Duration) []reception {
	var got []reception
	buf := make([]byte, 2048)
	deadline := time.Now().Add(max)
	stopped := stop == nil
	for time.Now().Before(deadline) {
		if !stopped {
			select {
			case <-stop:
				stopped = true
			default:
			}
		}
		s.conn.SetReadDeadline(time.Now().Add(quiet))
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if stopped {
				break
			}
			continue
		}
		got = append(got, reception{time.Since(start), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), n})
	}
	return got
}
