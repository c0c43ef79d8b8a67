package loadgen

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// SocketSender sends from the sources asked for, fixed ports and ephemeral ones,
// and keeps no more sockets than its maximum.
func TestSocketSender(t *testing.T) {
	srv, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s := NewSocketSender(srv.LocalAddr().(*net.UDPAddr).AddrPort(), 2)
	defer s.Close()
	srcs := []netip.AddrPort{
		netip.MustParseAddrPort("127.0.9.1:0"),
		netip.MustParseAddrPort("127.0.9.2:0"),
		netip.MustParseAddrPort("127.0.9.1:0"), // the same socket again
		netip.MustParseAddrPort("127.0.9.3:0"), // evicts 127.0.9.1
	}
	for i, src := range srcs {
		if err := s.Send(src, DNSQuery(uint16(i), false)); err != nil {
			t.Fatalf("send from %v: %v", src, err)
		}
	}
	if len(s.conns) != 2 || len(s.order) != 2 || s.order[0] != srcs[1] {
		t.Errorf("%d sockets kept, oldest %v; want 2, oldest %v", len(s.conns), s.order, srcs[1])
	}
	var ports []uint16
	buf := make([]byte, 512)
	for i, src := range srcs {
		srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := srv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		if from.Addr() != src.Addr() || from.Port() == 0 || n != 17 || buf[1] != byte(i) {
			t.Errorf("datagram %d from %v (%d bytes, id %d), want from %v", i, from, n, buf[1], src.Addr())
		}
		ports = append(ports, from.Port())
	}
	if ports[0] != ports[2] {
		t.Errorf("the same source sent from ports %d and %d", ports[0], ports[2])
	}
	if err := s.Close(); err != nil || len(s.conns) != 0 {
		t.Errorf("Close: %v, %d sockets left", err, len(s.conns))
	}
}
