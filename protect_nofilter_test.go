//go:build linux

package rrl

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/dnsrake/rrl/internal/procsock"
)

// TestProtectWithoutFilter: WithoutFilter leaves the socket without a kernel
// filter even where eBPF loads, and enforces the request limits in Go instead; a
// filter attached to the socket from outside stays.
func TestProtectWithoutFilter(t *testing.T) {
	requireBPF(t)
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "20")
	p, dst := startProtected(t, cfg, WithoutFilter())
	st := p.Status()
	if st.Filter != ModeNone || st.RequestsInKernel || !errors.Is(st.Reason, errFilterOff) || p.Filter() != nil || p.Limiter() == nil {
		t.Fatalf("status %v, filter %v, limiter %v; want no filter and the Go limiter", st, p.Filter(), p.Limiter())
	}
	if k, err := procsock.AttachedFilter(p.udp[0]); err != nil || k != procsock.NoFilter {
		t.Errorf("socket filter %q (%v), want none", k, err)
	}
	if n := burst(t, netip.MustParseAddr("127.0.0.31"), dst, 400); n >= 400 || n == 0 {
		t.Errorf("%d of 400 answered: want the Go limiter to hold the burst back", n)
	}
	// A filter attached from outside (rrlctl attach, AttachLocal) is left in place.
	f, err := attachLocal(dst, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	other, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := p.AddUDP(other); err != nil {
		t.Fatal(err)
	}
	if k, _ := procsock.AttachedFilter(p.udp[0]); k != procsock.EBPFFilter {
		t.Errorf("the filter attached from outside: %q", k)
	}
	if k, _ := procsock.AttachedFilter(other); k != procsock.NoFilter {
		t.Errorf("AddUDP attached a filter: %q", k)
	}
}
