// Package loadgen builds DNS query packets and sends them from arbitrary source
// addresses on loopback or inside a network namespace: the traffic of rrl's live
// tests and of the flood benchmark. It needs CAP_NET_RAW for raw sockets and
// CAP_SYS_ADMIN for namespaces.
package loadgen

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// DNSQuery returns a query for the root name, type A: the smallest question there
// is (17 bytes), or with edns an OPT record as well (28 bytes).
func DNSQuery(id uint16, edns bool) []byte {
	q := []byte{byte(id >> 8), byte(id), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}
	if edns {
		q[11] = 1
		q = append(q, 0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0)
	}
	return q
}

// IPv4Packet builds an IPv4/UDP datagram from src to dst carrying payload, with IP
// options (a multiple of 4 bytes, or nil).
func IPv4Packet(src, dst netip.AddrPort, options, payload []byte) []byte {
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

// IPv6Packet builds an IPv6/UDP datagram, behind a destination options header (8
// bytes of padding) when destOpts is set.
func IPv6Packet(src, dst netip.AddrPort, destOpts bool, payload []byte) []byte {
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

// Packet builds an IPv4 or IPv6 datagram, by dst's family.
func Packet(src, dst netip.AddrPort, payload []byte) []byte {
	if dst.Addr().Is4() {
		return IPv4Packet(src, dst, nil, payload)
	}
	return IPv6Packet(src, dst, false, payload)
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

// RawSender sends hand-built IP datagrams with any source address: many clients, or
// a spoofed flood, from one socket. Keep destinations on loopback or inside a
// namespace of one's own.
type RawSender struct {
	fd  int
	dst unix.Sockaddr
}

// NewRawSender opens a raw socket of dst's family in the calling thread's network
// namespace.
func NewRawSender(dst netip.AddrPort) (*RawSender, error) {
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.Addr().As16()}
	if dst.Addr().Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, err
	}
	return &RawSender{fd: fd, dst: sa}, nil
}

// Send sends one datagram built by IPv4Packet or IPv6Packet.
func (r *RawSender) Send(pkt []byte) error { return unix.Sendto(r.fd, pkt, 0, r.dst) }

// Close closes the socket.
func (r *RawSender) Close() error { return unix.Close(r.fd) }
