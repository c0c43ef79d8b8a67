package rrl

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func fx(f float64) fixed { return fixedFromFloat(f) }

func TestShareNamesTable(t *testing.T) {
	const C = 1000
	for _, tc := range []struct {
		name     string
		zones    []zoneRates
		capacity float64
		want     []zoneRates // admitted
	}{
		{"no zones", nil, C, nil},
		{"below capacity: nothing changes", []zoneRates{{fx(300), fx(200)}, {fx(100), fx(399)}}, C,
			[]zoneRates{{fx(300), fx(200)}, {fx(100), fx(399)}}},
		{"exactly at capacity", []zoneRates{{fx(300), fx(200)}, {fx(100), fx(400)}}, C,
			[]zoneRates{{fx(300), fx(200)}, {fx(100), fx(400)}}},
		// The figures: victim.test. 0.2 C known + 3 C random, other.test. 0.1 C.
		{"random-subdomain flood", []zoneRates{{fx(200), fx(3000)}, {fx(100), 0}}, C,
			[]zoneRates{{fx(200), fx(700)}, {fx(100), 0}}},
		// The example of names_share.go: B's attack does not cost A.
		{"attack on another zone", []zoneRates{{fx(600), 0}, {fx(100), fx(3000)}}, C,
			[]zoneRates{{fx(600), 0}, {fx(100), fx(300)}}},
		{"two zones flooded with random names", []zoneRates{{fx(100), fx(3000)}, {fx(50), fx(5000)}, {fx(10), fx(20)}}, C,
			[]zoneRates{{fx(100), fx(410)}, {fx(50), fx(410)}, {fx(10), fx(20)}}},
		{"a flood of real names", []zoneRates{{fx(5000), fx(10)}, {fx(100), fx(10)}, {fx(300), 0}}, C,
			[]zoneRates{{fx(600), 0}, {fx(100), 0}, {fx(300), 0}}},
		{"no capacity", []zoneRates{{fx(1), fx(1)}}, 0, []zoneRates{{0, 0}}},
		{"an uneven share", []zoneRates{{fx(10), 0}, {fx(10), 0}, {fx(10), 0}}, 10,
			[]zoneRates{{fixedFromRatio(10, 3), 0}, {fixedFromRatio(10, 3), 0}, {fixedFromRatio(10, 3), 0}}},
	} {
		lv := shareNames(tc.zones, fx(tc.capacity))
		for i, z := range tc.zones {
			if got := lv.admitted(z); got != tc.want[i] {
				t.Errorf("%s: zone %d admitted %v/%v, want %v/%v (levels %v/%v)", tc.name, i,
					got.known.Float64(), got.unknown.Float64(), tc.want[i].known.Float64(), tc.want[i].unknown.Float64(),
					lv.known.Float64(), lv.unknown.Float64())
			}
		}
	}
}

// maxMinReference is the water level of rates at capacity by progressive filling in
// float64 (+Inf when they fit).
func maxMinReference(rates []float64, capacity float64) float64 {
	s := slices.Clone(rates)
	slices.Sort(s)
	total := 0.0
	for _, r := range s {
		total += r
	}
	if total <= capacity {
		return math.Inf(1)
	}
	for i, r := range s {
		n := float64(len(s) - i)
		if r*n >= capacity {
			return capacity / n
		}
		capacity -= r
	}
	return math.Inf(1)
}

// randomZones returns 1 to 40 zones whose rates span from nothing to 10^6 per
// second, often zero, sometimes equal.
func randomZones(r *rand.Rand) []zoneRates {
	rate := func() fixed {
		switch r.IntN(6) {
		case 0:
			return 0
		case 1:
			return fx(100) // ties
		}
		return fixed(r.Uint64N(uint64(fx(math.Pow(10, float64(r.IntN(7)))))))
	}
	zs := make([]zoneRates, 1+r.IntN(40))
	for i := range zs {
		zs[i] = zoneRates{rate(), rate()}
	}
	return zs
}

func sumAdmitted(lv nameLevels, zs []zoneRates) (known, unknown fixed) {
	for _, z := range zs {
		a := lv.admitted(z)
		known += a.known
		unknown += a.unknown
	}
	return known, unknown
}

// TestShareNamesProperties checks, over random zones and capacities: nothing is
// limited below capacity; under overload the admitted rates add up to the capacity
// (less at most one unit of the last place per zone); known names come first; each
// tier is max-min fair and agrees with a float64 reference; more capacity never
// admits less, and more arrivals in one zone never admit more elsewhere.
func TestShareNamesProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 30))
	for iter := range 20000 {
		zs := randomZones(r)
		var totalK, totalU fixed
		for _, z := range zs {
			totalK += z.known
			totalU += z.unknown
		}
		c := fixed(r.Uint64N(uint64(totalK+totalU)*5/4 + 1))
		lv := shareNames(zs, c)
		k, u := sumAdmitted(lv, zs)
		n := fixed(len(zs))
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("iteration %d, capacity %v, zones %v, levels %v: "+format, append([]any{iter, c, zs, lv}, args...)...)
		}
		for _, z := range zs {
			if a := lv.admitted(z); a.known > z.known || a.unknown > z.unknown {
				fail("admitted %v of %v", a, z)
			}
		}
		switch {
		case totalK+totalU <= c:
			if lv.known != fixedMax || lv.unknown != fixedMax {
				fail("limited below capacity")
			}
		default:
			if k+u > c || k+u+n <= c {
				fail("admitted %v, want within %d units below capacity %v", k+u, n, c)
			}
		}
		// Known first: random names get nothing while known ones are trimmed.
		if k < totalK && u != 0 {
			fail("unknown names admitted (%v) while known ones are trimmed", u)
		}
		// Max-min per tier: a trimmed zone gets at least as much as any other.
		for _, tier := range []struct {
			level fixed
			get   func(zoneRates) fixed
			left  fixed
		}{
			{lv.known, func(z zoneRates) fixed { return z.known }, c},
			{lv.unknown, func(z zoneRates) fixed { return z.unknown }, c.Sub(totalK)},
		} {
			var most, leastTrimmed fixed = 0, fixedMax
			rates := make([]float64, len(zs))
			for i, z := range zs {
				rate, got := tier.get(z), min(tier.get(z), tier.level)
				most = max(most, got)
				if got < rate {
					leastTrimmed = min(leastTrimmed, got)
				}
				rates[i] = rate.Float64()
			}
			if leastTrimmed != fixedMax && most > leastTrimmed {
				fail("zone admitted %v while another is trimmed to %v", most, leastTrimmed)
			}
			if tier.level == 0 && lv.known != fixedMax {
				continue // the unknown tier when the known one took everything
			}
			ref := maxMinReference(rates, tier.left.Float64())
			if got := tier.level.Float64(); math.IsInf(ref, 1) != (tier.level == fixedMax) ||
				!math.IsInf(ref, 1) && math.Abs(got-ref) > 1e-6*max(1, ref) {
				fail("level %v, reference %v", got, ref)
			}
		}
		// More capacity admits no less anywhere.
		more := shareNames(zs, c.Add(fixed(r.Uint64N(uint64(fx(1000))))))
		for _, z := range zs {
			a, b := lv.admitted(z), more.admitted(z)
			if b.known < a.known || b.unknown < a.unknown {
				fail("more capacity admits %v of %v, less than %v", b, z, a)
			}
		}
		// More arrivals in one zone: no more for the others, no less for it.
		j := r.IntN(len(zs))
		grown := slices.Clone(zs)
		if r.IntN(2) == 0 {
			grown[j].known += fixed(r.Uint64N(uint64(fx(5000))))
		} else {
			grown[j].unknown += fixed(r.Uint64N(uint64(fx(5000))))
		}
		lg := shareNames(grown, c)
		for i := range zs {
			a, b := lv.admitted(zs[i]), lg.admitted(grown[i])
			if i == j && (b.known < a.known || b.unknown < a.unknown && grown[j].known == zs[j].known) {
				fail("zone %d sends more (%v) and gets less: %v, was %v", j, grown[j], b, a)
			}
			if i != j && (b.known > a.known || b.unknown > a.unknown) {
				fail("zone %d sends more (%v) and zone %d gets more: %v, was %v", j, grown[j], i, b, a)
			}
		}
	}
}

func BenchmarkShareNames(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	zs := make([]zoneRates, 1000)
	for i := range zs {
		zs[i] = zoneRates{fixed(r.Uint64N(uint64(fx(1000)))), fixed(r.Uint64N(uint64(fx(1000))))}
	}
	b.ReportAllocs()
	for b.Loop() {
		shareNames(zs, fx(100000))
	}
}
