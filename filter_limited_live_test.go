package rrl

import (
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
)

// estimatorTau is the time constant of the filter's rate estimator.
var estimatorTau = time.Duration(math.Round(float64(halfLifeNanos) / math.Ln2))

// TestLiveLimitedGroups floods a real socket from a /24 of many spoofed sources and
// from a single address, next to a light source, and reads LimitedGroups during the
// flood: the /24 is listed at the /24 level and the address at /32, each with the rate
// it was sent at (within 20%), and nothing else, the light source least of all.
func TestLiveLimitedGroups(t *testing.T) {
	const L = 500.0
	srv, f := attachLive(t, fmt.Sprint(L))
	light := netip.MustParseAddrPort("127.9.9.9:50000")
	flows := []flow{
		{Name: "slash24", Rate: 4 * L, End: 3 * time.Second, Src: func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 2, 2, byte(1 + i%200)}), uint16(30000+i%200))
		}},
		{Name: "single", Rate: 3 * L, End: 3 * time.Second, Src: func(int) netip.AddrPort { return netip.MustParseAddrPort("127.1.1.1:40000") }},
		{Name: "light", Rate: 0.05 * L, End: 3 * time.Second, Src: func(int) netip.AddrPort { return light }},
	}
	want := []struct {
		fi    int
		node  LimiterNode
		group string
	}{
		{0, nodeTagIPv4 | 24, "127.2.2.0/24"},
		{1, nodeTagIPv4 | 32, "127.1.1.1/32"},
	}
	raw := newRawSender(t, srv.addr)
	stop := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		loadgen.ReadUntil(srv.conn, stop, 300*time.Millisecond, 30*time.Second, func([]byte, netip.AddrPort) {})
		close(drained)
	}()
	defer func() { close(stop); <-drained }()
	start := time.Now()
	log := loadgen.NewSendLog(start, len(flows))
	sent := make(chan error, 1)
	go func() {
		_, err := loadgen.Pace(start, flows, 3*time.Second, 2*time.Millisecond, func(fi int, src netip.AddrPort, payload []byte) error {
			log.Add(fi)
			return raw.Send(loadgen.Packet(src, srv.addr, payload))
		})
		sent <- err
	}()
	// Well into the steady state, with the flood still on.
	time.Sleep(time.Until(start.Add(2500 * time.Millisecond)))
	at := log.Since()
	groups, err := f.LimitedGroups()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("send: %v", err)
	}
	for _, g := range groups {
		t.Logf("%v %v port %d: rate %.1f limit %.0f dropped %d, from %v to %v", g.Node, g.Group, g.Port, g.Rate, g.Limit, g.Dropped, g.First.Sub(start), g.Last.Sub(start))
		if g.Node != NodePort && g.Node != NodeTotal && g.Group.Contains(light.Addr()) {
			t.Errorf("the light source's group %v is listed", g.Group)
		}
	}
	if len(groups) != len(want) {
		t.Errorf("%d groups listed, want %d", len(groups), len(want))
	}
	for _, w := range want {
		sentRate := log.DecayedRate(w.fi, at, estimatorTau)
		found := false
		for _, g := range groups {
			if g.Node != w.node || g.Group.String() != w.group {
				continue
			}
			found = true
			if !within(g.Rate, sentRate, 0.20) || g.Limit != L || g.Dropped == 0 || g.Last.Before(g.First) || g.First.Before(start) {
				t.Errorf("%s: %+v; sent at %.1f/s, limit %v", flows[w.fi].Name, g, sentRate, L)
			}
		}
		if !found {
			t.Errorf("%s: group %v %s not listed", flows[w.fi].Name, w.node, w.group)
		}
	}
}
