package rrl

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"unsafe"
)

// TestDistinctCounter checks the estimator against the exact count: over 40 seeded
// sets of each size from 1 to 10,000 (8 of 100,000 and of a million), every estimate is within 10% (or one) of
// the truth and the root mean square error within 5% (its standard error is 3.3%);
// values added again do not count, and adds from several goroutines at once give
// exactly what they give one after another.
func TestDistinctCounter(t *testing.T) {
	for _, n := range []int{1, 2, 10, 50, 200, 1000, 2500, 3100, 10_000, 100_000, 1_000_000} {
		sq := 0.0
		seeds := 40
		if n >= 100_000 {
			seeds = 8
		}
		for seed := range seeds {
			var c distinctCounter
			r := rand.New(rand.NewPCG(uint64(seed), uint64(n)))
			for i := range n {
				h := mix64(r.Uint64())
				c.add(h)
				if i%3 == 0 {
					c.add(h) // again: no change
				}
			}
			e := c.estimate()
			if math.Abs(e-float64(n)) > max(0.1*float64(n), 1) {
				t.Errorf("%d distinct (seed %d): estimate %.1f", n, seed, e)
			}
			sq += (e - float64(n)) * (e - float64(n)) / float64(n) / float64(n)
		}
		if rms := math.Sqrt(sq / float64(seeds)); rms > 0.05 {
			t.Errorf("%d distinct: rms relative error %.3f, want at most 0.05", n, rms)
		}
	}
	var c distinctCounter
	if e := c.estimate(); e != 0 {
		t.Errorf("empty: %v", e)
	}
	// Concurrent adds: the registers are maxima, so order does not matter.
	var seq, par distinctCounter
	hs := make([]uint64, 50_000)
	for i := range hs {
		hs[i] = mix64(uint64(i))
		seq.add(hs[i])
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(hs)+g; i++ {
				par.add(hs[i%len(hs)])
			}
		}()
	}
	wg.Wait()
	if s, p := seq.estimate(), par.estimate(); s != p {
		t.Errorf("concurrent adds estimate %v, sequential %v", p, s)
	}
	seq.reset()
	if e := seq.estimate(); e != 0 {
		t.Errorf("after reset: %v", e)
	}
}

// TestZoneCounters: zoneCounterSlots zones are counted at once, each from nothing
// when watched; a zone not watched is not counted; a released slot is taken again.
func TestZoneCounters(t *testing.T) {
	var z zoneCounters
	for i := range zoneCounterSlots {
		if !z.watch(nameKey(100 + i)) {
			t.Fatalf("zone %d of %d not watched", i+1, zoneCounterSlots)
		}
	}
	if z.watch(nameKey(100)) {
		t.Error("a watched zone watched again")
	}
	if z.watch(nameKey(999)) {
		t.Error("a zone watched beyond the slots")
	}
	if z.slot(nameKey(999)) != nil {
		t.Error("a zone not watched has a slot")
	}
	for i := range 300 {
		s := z.slot(nameKey(103))
		s.names.add(mix64(uint64(i)))
		s.nets.add(mix64(uint64(i % 30)))
	}
	names, nets, ok := z.figures(nameKey(103))
	if !ok || math.Abs(names-300) > 30 || math.Abs(nets-30) > 3 {
		t.Errorf("figures %v %v %v, want about 300 and 30", names, nets, ok)
	}
	if n, _, _ := z.figures(nameKey(104)); n != 0 {
		t.Errorf("another zone counted %v names", n)
	}
	z.release(nameKey(103))
	if _, _, ok := z.figures(nameKey(103)); ok || z.slot(nameKey(103)) != nil {
		t.Error("a released zone still counted")
	}
	if !z.watch(nameKey(999)) {
		t.Fatal("the released slot not taken again")
	}
	if n, m, ok := z.figures(nameKey(999)); !ok || n != 0 || m != 0 {
		t.Errorf("a new zone starts at %v %v %v, want nothing", n, m, ok)
	}
	if got := unsafe.Sizeof(z); got > zoneCountersBytes+8 || zoneCountersBytes > 20<<10 {
		t.Errorf("zone counters take %d bytes, zoneCountersBytes %d", got, zoneCountersBytes)
	}
}

// TestNetworkHash: addresses of one client network hash alike, of two differ.
func TestNetworkHash(t *testing.T) {
	for _, tc := range []struct {
		a, b         string
		bits4, bits6 int
		same         bool
	}{
		{"192.0.2.1", "192.0.2.200", 24, 56, true},
		{"192.0.2.1", "192.0.3.1", 24, 56, false},
		{"192.0.2.1", "192.0.3.1", 16, 56, true},
		{"192.0.2.1", "192.0.2.2", 32, 56, false},
		{"192.0.2.1", "192.0.2.1", 32, 56, true},
		{"2001:db8:0:100::1", "2001:db8:0:1ff:ffff::9", 24, 56, true},
		{"2001:db8:0:100::1", "2001:db8:0:200::1", 24, 56, false},
		{"2001:db8::1", "2001:db8::ffff", 24, 112, true},
		{"2001:db8::1", "2001:db8::1:1", 24, 112, false},
		{"2001:db8::1", "2001:db8::2", 24, 128, false},
		{"2001:db8::1", "2001:db8:0:0:8000::", 24, 64, true},
		// An IPv4 network and the IPv6 one of the same bits are two networks.
		{"0.0.0.1", "::1", 24, 128, false},
	} {
		a, b := netip.MustParseAddr(tc.a), netip.MustParseAddr(tc.b)
		ha, hb := networkHash(a, tc.bits4, tc.bits6, 7), networkHash(b, tc.bits4, tc.bits6, 7)
		if (ha == hb) != tc.same {
			t.Errorf("%s and %s (/%d, /%d): same %v, want %v", tc.a, tc.b, tc.bits4, tc.bits6, ha == hb, tc.same)
		}
	}
}
