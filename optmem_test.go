package rrl

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestAttachOptmemError: where net.core.optmem_max is too small for the filter (set in
// a network namespace of the test's own, where the setting is private), Attach fails
// with ErrOptMem, names the setting to raise, and leaves the classic prefilter (a few
// hundred bytes) on the socket.
func TestAttachOptmemError(t *testing.T) {
	requireBPF(t)
	ns := newTestNetns(t)
	var srv *udpServer
	ns.do(t, func() {
		if err := os.WriteFile("/proc/sys/net/core/optmem_max", []byte("2048"), 0); err != nil {
			t.Fatalf("set optmem_max in the test namespace: %v", err)
		}
		srv = newUDPServer(t, "udp4", "127.0.0.1:0")
	})
	f, err := Attach(srv.conn, NewConfig())
	if !errors.Is(err, ErrOptMem) || !strings.Contains(err.Error(), "net.core.optmem_max") {
		t.Fatalf("Attach: %v; want ErrOptMem naming net.core.optmem_max", err)
	}
	t.Logf("Attach said: %v", err)
	if f == nil || f.Mode() != ModeClassic {
		t.Fatalf("Attach left filter %v, want the classic fallback", f)
	}
	defer f.Close()
	// The classic prefilter works: a reflected response is dropped, a query passes.
	ns.do(t, func() {
		lo := netip.MustParseAddrPort("127.0.0.5:40000")
		expectDelivery(t, srv, srv.addr, []deliveryCase{
			{"query", lo, nil, dnsQuery(1, false), true},
			{"response", netip.MustParseAddrPort("127.0.0.6:40000"), nil, qr(dnsQuery(2, false)), false},
		})
	})
}
