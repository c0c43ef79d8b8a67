package rrl

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAttachUnprivilegedFallsBackToClassic runs Attach as an unprivileged process
// (uid 65534, no capabilities): loading eBPF is refused with ErrNotPermitted, the
// error says how to grant it, and the classic prefilter is attached and working.
func TestAttachUnprivilegedFallsBackToClassic(t *testing.T) {
	if !isUnprivilegedChild() {
		requireBPF(t)
		runUnprivileged(t, "TestAttachUnprivilegedFallsBackToClassic")
		return
	}
	checkUnprivileged(t)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "100")
	f, err := Attach(conn, cfg)
	if !errors.Is(err, ErrNotPermitted) {
		t.Fatalf("unprivileged Attach: err %v, want ErrNotPermitted", err)
	}
	if !strings.Contains(err.Error(), "CAP_BPF") {
		t.Errorf("error does not say how to grant the privilege: %v", err)
	}
	if f == nil || f.Mode() != ModeClassic {
		t.Fatalf("unprivileged Attach: filter %v, want one in classic mode", f)
	}
	t.Logf("Attach said: %v", err)

	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// A reflected response (QR set) is dropped, a minimal query delivered.
	client.Write(qr(dnsQuery(1, false)))
	client.Write(dnsQuery(2, false))
	buf := make([]byte, 512)
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := conn.ReadFromUDP(buf)
	if err != nil || n != 17 || buf[1] != 2 {
		t.Fatalf("first datagram read: %d bytes id %d (%v), want the 17-byte query with id 2", n, buf[1], err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	client.Write(qr(dnsQuery(3, false)))
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, _, err := conn.ReadFromUDP(buf); err != nil || buf[1] != 3 {
		t.Fatalf("after Close: read %d bytes id %d (%v), want the response with id 3", n, buf[1], err)
	}
}
