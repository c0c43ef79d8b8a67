package rrl

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
)

// Thin test wrappers over internal/loadgen.
var (
	dnsQuery   = loadgen.DNSQuery
	ipv4Packet = loadgen.IPv4Packet
	ipv6Packet = loadgen.IPv6Packet
)

// rawSender sends hand-built IP datagrams with any source address (CAP_NET_RAW).
type rawSender struct{ *loadgen.RawSender }

func newRawSender(t testing.TB, dst netip.AddrPort) *rawSender {
	t.Helper()
	r, err := loadgen.NewRawSender(dst)
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return &rawSender{r}
}

func (r *rawSender) send(t testing.TB, pkt []byte) {
	if err := r.Send(pkt); err != nil {
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
	conn, err := loadgen.Listen(network, netip.MustParseAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &udpServer{conn: conn, addr: conn.LocalAddr().(*net.UDPAddr).AddrPort()}
}

// reception is one datagram the server read.
type reception struct {
	at   time.Duration // since the collection started
	from netip.AddrPort
	size int
	id   uint16 // the datagram's first two bytes: a query's ID
}

// collect reads until stop is closed and then no datagram has arrived for quiet
// (stop nil: until the first quiet period), or until max has passed.
func (s *udpServer) collect(start time.Time, stop <-chan struct{}, quiet, max time.Duration) []reception {
	var got []reception
	loadgen.ReadUntil(s.conn, stop, quiet, max, func(b []byte, from netip.AddrPort) {
		var id uint16
		if len(b) >= 2 {
			id = uint16(b[0])<<8 | uint16(b[1])
		}
		got = append(got, reception{time.Since(start), from, len(b), id})
	})
	return got
}
