package rrl

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
)

// TestKernelMatchesModelProven replays one packet sequence, some of it carrying valid
// server cookies, through the kernel program (which verifies the cookies itself)
// and through the Go path of a Protection's reader (rawCookie and Cookies.Verify,
// then Limiter.decideProvenAt or decideAt), with the same clock readings and draws:
// every verdict and, at the end, every sketch cell must be the same. So a proven
// query counts in, and is limited by, exactly the nodes the kernel counts it in.
func TestKernelMatchesModelProven(t *testing.T) {
	configs := []struct {
		name   string
		values [][2]string
	}{
		{"defaults with a capacity", [][2]string{{"requests-per-second", "100"}, {"total-requests-per-second", "2000"}}},
		{"finest levels coarser than the address", [][2]string{{"requests-per-second", "50"},
			{"ipv4-request-levels", "16:16"}, {"ipv6-request-levels", "48:4"}}},
		{"port node only", [][2]string{{"requests-per-second", "0"}, {"total-requests-per-second", "300"}}},
		{"no limits", [][2]string{{"requests-per-second", "0"}}},
		{"report-only, exempt clients", [][2]string{{"requests-per-second", "20"}, {"report-only", "true"},
			{"exempt-clients", "10.1.0.0/16 fd00:0:1::/48"}}},
	}
	for _, hook := range []string{"socket", "xdp"} {
		for _, c := range configs {
			t.Run(hook+"/"+c.name, func(t *testing.T) {
				t.Parallel() // as in TestKernelMatchesModel
				cfg := NewConfig()
				for _, kv := range c.values {
					if err := cfg.SetValue(kv[0], kv[1]); err != nil {
						t.Fatal(err)
					}
				}
				crossCheckProven(t, cfg, c.name != "no limits" && c.name[:6] != "report", hook == "xdp")
			})
		}
	}
}

// crossCheckProven runs the sequence through the socket filter's test program, or
// with xdp through the XDP program's (a refusal is then a drop or a slip: the model
// says only whether the packet passes).
func crossCheckProven(t *testing.T, cfg *Config, wantDrops, xdp bool) {
	rig := newCookieRig(t, cfg)
	prog := rig.objs.FilterTest
	if xdp {
		prog = loadXDPTest(t, rig.objs).Test
	}
	model, err := newLimiterSeed(cfg, 7) // the rig's seed
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Unix(1_790_000_000, 0)
	cookies := NewCookies(testSecretA)
	rig.setKeys(cookies, wall)

	r := rand.New(rand.NewPCG(5, 6))
	var sources []netip.AddrPort
	for i := range 30 {
		sources = append(sources,
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i % 3), byte(i % 5), byte(i)}), uint16(1024+r.IntN(60000))),
			netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(i % 2), 0, 0, byte(i % 4), 0, byte(i % 7), 15: byte(i)}), uint16(1024+r.IntN(60000))),
		)
	}
	name := wireName("www", "example", "test")
	now := int64(rig.mono)
	var counts [2][2]int // [proven][passed]
	for i := range 4000 {
		switch x := r.IntN(100); {
		case x < 3:
			now -= r.Int64N(50_000_000)
		case x < 6:
		default:
			now += r.Int64N(2_000_000)
		}
		at := wall.Add(time.Duration(now - int64(rig.mono)))
		src := sources[r.IntN(len(sources))]
		heavy := r.IntN(3) == 0
		if heavy {
			src = sources[r.IntN(2)] // two heavy sources, one of each family
		}
		var opts [][]byte
		switch x := r.IntN(6); {
		case x < 3: // a cookie this server made for src
			opts = append(opts, ednsOption(dns.EDNS0COOKIE, cookies.Generate([]byte("crosschk"), src.Addr(), at)))
		case x == 3: // a cookie made for another address
			opts = append(opts, ednsOption(dns.EDNS0COOKIE, cookies.Generate([]byte("crosschk"), sources[2].Addr(), at)))
		case x == 4: // a client cookie only
			opts = append(opts, ednsOption(dns.EDNS0COOKIE, []byte("clientck")))
		}
		payload := cookieQuery(uint16(i), name, opts...)
		rnd := r.Uint32()

		proven := false
		if c, ok := rawCookie(payload); ok {
			proven = cookies.Verify(c, src.Addr(), at).Valid()
		}
		var want bool
		if proven {
			want = model.decideProvenAt(src, now, rnd).Allowed
		} else {
			want = model.decideAt(src, now, rnd).Allowed
		}
		if err := rig.objs.TestInput.Put(uint32(0), &filterTestInput{Now: uint64(max(now, 0)), Rnd: rnd}); err != nil {
			t.Fatal(err)
		}
		ret, err := prog.Run(&ebpf.RunOptions{Data: cookiePacket(src, payload)})
		if err != nil {
			t.Fatal(err)
		}
		got := ret != 0
		if xdp {
			got = ret == xdpPass
		}
		if got != want {
			t.Fatalf("packet %d from %v (proven %v) at %d draw %#x: kernel pass=%v, model pass=%v", i, src, proven, now, rnd, got, want)
		}
		counts[b2i(proven)][b2i(want)]++
	}
	if counts[1][1] == 0 || counts[0][1] == 0 || (counts[1][0]+counts[0][0] == 0) == wantDrops {
		t.Fatalf("sequence did not exercise the verdicts: [proven][passed] %v", counts)
	}
	kc := rig.counters()
	if got, want := kc[counterCookiePassed], model.Stats().CookiePassed; got != want {
		t.Errorf("passed on a cookie: kernel %d, model %d", got, want)
	}

	cells := 0
	for i, c := range kernelCells(t, rig.objs.Cells) {
		idx := uint32(i)
		node := int(idx) / (sketchDepth * sketchWidth)
		row := int(idx) / sketchWidth % sketchDepth
		col := idx % sketchWidth
		if node >= numNodes {
			// The names judge's zone sketch (bpf/names.h): names are off here.
			if c != (filterCell{}) {
				t.Fatalf("zone sketch cell row %d col %d counted with names off: %+v", row, col, c)
			}
			continue
		}
		count, last := model.cell(node, row, col)
		if uint64(count) != c.Count || last != c.Last {
			t.Fatalf("cell node %d row %d col %d: kernel (%d, %d), model (%d, %d)", node, row, col, c.Count, c.Last, count, last)
		}
		if c.Count != 0 {
			cells++
		}
	}
	t.Logf("[proven][passed] %v; %d cookie passes; %d non-empty cells identical", counts, kc[counterCookiePassed], cells)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestLimiterProven: on a timeline, a proven source is limited at its own
// address's limit only, adds nothing to the groups it shares, so a flood of its /24
// and port does not trim it, and is judged as without a cookie when no level keys
// on the whole address.
func TestLimiterProven(t *testing.T) {
	const rps = 100
	src := netip.MustParseAddrPort("192.0.2.7:5353")
	flood := func(i int) netip.AddrPort { // the same /24 and port, other addresses
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(20 + i%200)}), 5353)
	}
	for _, tc := range []struct {
		name   string
		values [][2]string
		// Over 2 s at 1 ms steps: the flood sends 20 per ms from its /24, the
		// source 1 per 10 ms (10% of its address's limit) proven, then 1 per ms
		// (10 times it).
		light, heavy [2]float64 // bounds of the fractions of its queries passed
	}{
		{"defaults", [][2]string{{"requests-per-second", "100"}}, [2]float64{0.999, 1}, [2]float64{0.05, 0.2}},
		{"finest level /24: judged with the flood", [][2]string{{"requests-per-second", "100"}, {"ipv4-request-levels", "16:16"}},
			[2]float64{0, 0.05}, [2]float64{0, 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NewConfig()
			for _, kv := range tc.values {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			l, err := newLimiterSeed(cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(7, 8))
			ms := int64(time.Millisecond)
			var light, lightOK, heavy, heavyOK int
			for step := range int64(4000) {
				now := 1e9 + step*ms
				for i := range 20 {
					l.decideAt(flood(int(step)*20+i), now, r.Uint32())
				}
				switch {
				case step < 2000 && step%10 == 0:
					light++
					if l.decideProvenAt(src, now, r.Uint32()).Allowed {
						lightOK++
					}
				case step >= 2000:
					heavy++
					if l.decideProvenAt(src, now, r.Uint32()).Allowed {
						heavyOK++
					}
				}
			}
			lf, hf := float64(lightOK)/float64(light), float64(heavyOK)/float64(heavy)
			t.Logf("light %d/%d, heavy %d/%d; stats %+v", lightOK, light, heavyOK, heavy, l.Stats())
			if lf < tc.light[0] || lf > tc.light[1] {
				t.Errorf("proven source at 10%% of its limit inside a flooded /24: %.3f passed, want %v", lf, tc.light)
			}
			// At ten times its address's limit it is trimmed to about that limit
			// (with the defaults), or with the flood.
			if hf < tc.heavy[0] || hf > tc.heavy[1] {
				t.Errorf("proven source at 10 times its limit: %.3f passed, want %v", hf, tc.heavy)
			}
			if tc.light[0] > 0 && l.Stats().CookiePassed != uint64(lightOK+heavyOK) {
				t.Errorf("CookiePassed %d, want %d", l.Stats().CookiePassed, lightOK+heavyOK)
			}
		})
	}
}
