package rrl

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// The reference for every fixed operation is exact integer arithmetic in math/big on
// the raw values: a fixed f stands for the real number f/2^32.

var (
	bigTwo32 = new(big.Int).Lsh(big.NewInt(1), 32)
	bigTwo64 = new(big.Int).Lsh(big.NewInt(1), 64)
	bigTwo96 = new(big.Int).Lsh(big.NewInt(1), 96)
)

func bu(x uint64) *big.Int { return new(big.Int).SetUint64(x) }

// refMul is floor(a*b/2^32) and whether it fits (result < 2^64).
func refMul(a, b fixed) (fixed, bool) {
	p := new(big.Int).Mul(bu(uint64(a)), bu(uint64(b)))
	if p.Cmp(bigTwo96) >= 0 {
		return 0, false
	}
	return fixed(p.Rsh(p, 32).Uint64()), true
}

// refMulSat is floor(a*b/2^32), or fixedMax when that does not fit.
func refMulSat(a, b fixed) fixed {
	if p, ok := refMul(a, b); ok {
		return p
	}
	return fixedMax
}

// refDiv is floor(a*2^32/b), or fixedMax when b is 0 or the quotient is 2^64 or more.
func refDiv(a, b fixed) fixed {
	if b == 0 {
		return fixedMax
	}
	q := new(big.Int).Lsh(bu(uint64(a)), 32)
	q.Quo(q, bu(uint64(b)))
	if q.Cmp(bigTwo64) >= 0 {
		return fixedMax
	}
	return fixed(q.Uint64())
}

// refRatio is floor(num*2^32/den).
func refRatio(num, den uint64) fixed {
	q := new(big.Int).Lsh(bu(num), 32)
	return fixed(q.Quo(q, bu(den)).Uint64())
}

// maxNanos is the largest duration fixedFromNanos converts without wrapping:
// 2^32 seconds (136 years) minus one nanosecond.
const maxNanos = int64(1<<32)*nanosPerSecond - 1

// refNanos is floor(ns*2^32/1e9) for ns > 0, else 0.
func refNanos(ns int64) fixed {
	if ns <= 0 {
		return 0
	}
	q := new(big.Int).Lsh(big.NewInt(ns), 32)
	return fixed(q.Quo(q, big.NewInt(nanosPerSecond)).Uint64())
}

func refAdd(a, b fixed) fixed {
	s := new(big.Int).Add(bu(uint64(a)), bu(uint64(b)))
	if s.Cmp(bigTwo64) >= 0 {
		return fixedMax
	}
	return fixed(s.Uint64())
}

func refSub(a, b fixed) fixed {
	if b > a {
		return 0
	}
	return fixed(new(big.Int).Sub(bu(uint64(a)), bu(uint64(b))).Uint64())
}

func refMulInt(a fixed, n uint64) fixed {
	p := new(big.Int).Mul(bu(uint64(a)), bu(n))
	if p.Cmp(bigTwo64) >= 0 {
		return fixedMax
	}
	return fixed(p.Uint64())
}

// fixedEdges are raw values at the edges of the format's ranges.
var fixedEdges = []fixed{
	0, 1, 2, fixedHalf - 1, fixedHalf, fixedOne - 1, fixedOne, fixedOne + 1,
	3 * fixedHalf, fixedFromInt(10), fixedFromInt(100), fixedFromInt(1e6),
	1 << 48, 1<<63 - 1, 1 << 63, fixedMax - 1, fixedMax,
	rateScale, fixed(decayTable[17]), 0xdeadbeefcafebabe,
}

func TestFixedMulTable(t *testing.T) {
	for _, a := range fixedEdges {
		for _, b := range fixedEdges {
			if got, want := a.Mul(b), refMulSat(a, b); got != want {
				t.Errorf("%#x.Mul(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
			}
		}
	}
	// A few products written out by hand.
	for _, c := range []struct{ a, b, want fixed }{
		{fixedOne, fixedOne, fixedOne},
		{fixedHalf, fixedHalf, fixedOne / 4},
		{fixedFromInt(3), fixedFromInt(7), fixedFromInt(21)},
		{1, 1, 0},                      // 2^-64 truncates to 0
		{fixedMax, fixedOne, fixedMax}, // times one is the identity
		{fixedMax, 1, fixedMax >> 32},  // times one ulp: shifts
		{fixedFromInt(1 << 31), 2*fixedOne - 2, fixedFromInt(1<<32 - 1)}, // (2^31)(2-2^-31) = 2^32-1
		// Products of 2^32 and more saturate, as MulInt does, instead of wrapping.
		{fixedFromInt(1 << 31), 2 * fixedOne, fixedMax},          // exactly 2^32
		{fixedFromInt(1 << 16), fixedFromInt(1 << 16), fixedMax}, // 2^32 again
		{fixedMax, fixedMax, fixedMax},
		{fixedMax, fixedOne + 1, fixedMax},                                 // just over the identity
		{fixedFromInt(3601), fixedFromInt(1 << 31), fixedMax},              // largest cost times largest qps-scale factor
		{fixedFromInt(1 << 30), fixedFromInt(4) - 1, fixedMax - 1<<30 + 1}, // 2^32 - 1/4 fits
	} {
		if got := c.a.Mul(c.b); got != c.want {
			t.Errorf("%#x.Mul(%#x) = %#x, want %#x", uint64(c.a), uint64(c.b), uint64(got), uint64(c.want))
		}
	}
}

func TestFixedDivTable(t *testing.T) {
	for _, a := range fixedEdges {
		for _, b := range fixedEdges {
			if got, want := a.Div(b), refDiv(a, b); got != want {
				t.Errorf("%#x.Div(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
			}
		}
	}
	for _, c := range []struct{ a, b, want fixed }{
		{fixedOne, fixedFromInt(2), fixedHalf},
		{fixedFromInt(21), fixedFromInt(7), fixedFromInt(3)},
		{fixedOne, fixedFromInt(3), 1431655765}, // floor(2^32/3)
		{fixedOne, 0, fixedMax},
		{fixedFromInt(1 << 31), fixedHalf, fixedMax}, // 2^32 does not fit
		{0, 0, fixedMax},
	} {
		if got := c.a.Div(c.b); got != c.want {
			t.Errorf("%#x.Div(%#x) = %#x, want %#x", uint64(c.a), uint64(c.b), uint64(got), uint64(c.want))
		}
	}
}

func TestFixedConversions(t *testing.T) {
	for _, n := range []uint64{0, 1, 2, 1000, 1<<31 + 5, 1<<32 - 1} {
		if got, want := fixedFromInt(n), fixed(new(big.Int).Mul(bu(n), bigTwo32).Uint64()); got != want {
			t.Errorf("fixedFromInt(%d) = %#x, want %#x", n, uint64(got), uint64(want))
		}
		if got := fixedFromInt(n).Int(); got != n {
			t.Errorf("fixedFromInt(%d).Int() = %d", n, got)
		}
		if got := fixedFromInt(n).Frac(); got != 0 {
			t.Errorf("fixedFromInt(%d).Frac() = %#x", n, uint64(got))
		}
	}
	for _, c := range []struct{ num, den uint64 }{
		{0, 1}, {1, 1}, {1, 2}, {1, 3}, {2, 3}, {1<<32 - 1, 1}, {1<<32 - 1, 1<<64 - 1},
		{5, 1000}, {999_999_999, nanosPerSecond}, {1, 1<<64 - 1}, {12345, 7},
	} {
		if got, want := fixedFromRatio(c.num, c.den), refRatio(c.num, c.den); got != want {
			t.Errorf("fixedFromRatio(%d, %d) = %#x, want %#x", c.num, c.den, uint64(got), uint64(want))
		}
	}
	for _, ns := range []int64{
		math.MinInt64, -1, 0, 1, 2, 999_999_999, nanosPerSecond, nanosPerSecond + 1,
		1 << 28, 15 * nanosPerSecond, 1 << 40, 1 << 62, maxNanos - 1, maxNanos,
	} {
		if got, want := fixedFromNanos(ns), refNanos(ns); got != want {
			t.Errorf("fixedFromNanos(%d) = %#x, want %#x", ns, uint64(got), uint64(want))
		}
	}
	for _, c := range []struct {
		f    float64
		want fixed
	}{
		{math.NaN(), 0}, {math.Inf(-1), 0}, {-1, 0}, {0, 0}, {1, fixedOne}, {0.5, fixedHalf},
		{0x1p-34, 0},
		{0x1p-33, 1}, // exactly half an ulp: math.Round rounds halves away from zero
		{0x1p-32, 1},
		{1.5 * 0x1p-32, 2}, // 1.5 ulp rounds (away from zero) to 2
		{100.25, fixedFromInt(100) + fixedOne/4},
		{1<<32 - 0x1p-20, fixedFromInt(1<<32-1) + fixedOne - 1<<12},
		{1 << 32, fixedMax}, {1e300, fixedMax}, {math.Inf(1), fixedMax},
	} {
		if got := fixedFromFloat(c.f); got != c.want {
			t.Errorf("fixedFromFloat(%g) = %#x, want %#x", c.f, uint64(got), uint64(c.want))
		}
	}
	for _, f := range fixedEdges {
		// Float64 is exact up to float64 rounding of the raw value.
		want, _ := new(big.Float).Quo(new(big.Float).SetUint64(uint64(f)), new(big.Float).SetInt(bigTwo32)).Float64()
		if got := f.Float64(); got != want {
			t.Errorf("%#x.Float64() = %g, want %g", uint64(f), got, want)
		}
		if got, want := f.Int(), uint64(f)>>32; got != want {
			t.Errorf("%#x.Int() = %d, want %d", uint64(f), got, want)
		}
		if got := fixedFromInt(f.Int()) + f.Frac(); got != f {
			t.Errorf("%#x: Int and Frac do not add up: %#x", uint64(f), uint64(got))
		}
	}
}

func TestFixedSaturating(t *testing.T) {
	for _, a := range fixedEdges {
		for _, b := range fixedEdges {
			if got, want := a.Add(b), refAdd(a, b); got != want {
				t.Errorf("%#x.Add(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
			}
			if got, want := a.Sub(b), refSub(a, b); got != want {
				t.Errorf("%#x.Sub(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
			}
			if got, want := a.MulInt(uint64(b)), refMulInt(a, uint64(b)); got != want {
				t.Errorf("%#x.MulInt(%d) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
			}
		}
	}
}

// TestFixedRandom compares every operation with math/big on many seeded random
// operands drawn with a bias towards the interesting magnitudes: 200,000 pairs, or
// 20,000 with -short or under the race detector (exhaustive_test.go).
func TestFixedRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	draw := func() fixed {
		// A random bit length makes small, medium and large values equally likely.
		return fixed(r.Uint64() >> r.UintN(64))
	}
	n := 200_000
	if testing.Short() || !exhaustive() {
		n = 20_000
	}
	for range n {
		a, b := draw(), draw()
		checkFixedOps(t, a, b)
		if t.Failed() {
			return
		}
	}
}

func checkFixedOps(t *testing.T, a, b fixed) {
	t.Helper()
	if got, want := a.Mul(b), refMulSat(a, b); got != want {
		t.Errorf("%#x.Mul(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
	}
	if got, want := a.Div(b), refDiv(a, b); got != want {
		t.Errorf("%#x.Div(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
	}
	if got, want := a.Add(b), refAdd(a, b); got != want {
		t.Errorf("%#x.Add(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
	}
	if got, want := a.Sub(b), refSub(a, b); got != want {
		t.Errorf("%#x.Sub(%#x) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
	}
	if got, want := a.MulInt(uint64(b)), refMulInt(a, uint64(b)); got != want {
		t.Errorf("%#x.MulInt(%d) = %#x, want %#x", uint64(a), uint64(b), uint64(got), uint64(want))
	}
	num, den := uint64(a)>>32, uint64(b)
	if den != 0 {
		if got, want := fixedFromRatio(num, den), refRatio(num, den); got != want {
			t.Errorf("fixedFromRatio(%d, %d) = %#x, want %#x", num, den, uint64(got), uint64(want))
		}
	}
	ns := int64(uint64(a) % uint64(maxNanos+1))
	if got, want := fixedFromNanos(ns), refNanos(ns); got != want {
		t.Errorf("fixedFromNanos(%d) = %#x, want %#x", ns, uint64(got), uint64(want))
	}
}

func FuzzFixedOps(f *testing.F) {
	for _, a := range fixedEdges[:8] {
		f.Add(uint64(a), uint64(fixedMax-a))
	}
	f.Add(uint64(rateScale), uint64(fixedOne))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		checkFixedOps(t, fixed(a), fixed(b))
	})
}

// ln2 to 60 digits, for checking rateScale.
const ln2Digits = "0.693147180559945309417232121458176568075500134360255254120680"

func TestRateScale(t *testing.T) {
	const prec = 256
	ln2, _, err := big.ParseFloat(ln2Digits, 10, prec, big.ToNearestEven)
	if err != nil {
		t.Fatal(err)
	}
	// rateScale = round(ln 2 * 1e9 / halfLifeNanos * 2^32) = round(ln 2 * 5 * 2^32).
	v := new(big.Float).SetPrec(prec).Mul(ln2, big.NewFloat(1e9/halfLifeNanos*(1<<32)))
	v.Add(v, big.NewFloat(0.5))
	want, _ := v.Int(nil)
	if got := bu(uint64(rateScale)); got.Cmp(want) != 0 {
		t.Errorf("rateScale = %d, want %s", uint64(rateScale), want)
	}
}

// exp2Frac returns round(2^32 * 2^(-i/64)) computed in math/big: 2^(1/64) is six
// square roots of 2.
func exp2Frac(i int) uint64 {
	const prec = 256
	root := new(big.Float).SetPrec(prec).SetInt64(2)
	for range 6 {
		root.Sqrt(root)
	}
	p := new(big.Float).SetPrec(prec).SetInt64(1)
	for range i {
		p.Mul(p, root)
	}
	v := new(big.Float).SetPrec(prec).SetInt(bigTwo32)
	v.Quo(v, p)
	v.Add(v, big.NewFloat(0.5))
	n, _ := v.Int(nil)
	return n.Uint64()
}

func TestDecayTable(t *testing.T) {
	for i, got := range decayTable {
		if want := exp2Frac(i); got != want {
			t.Errorf("decayTable[%d] = %d, want %d", i, got, want)
		}
	}
}

func TestDecayFactor(t *testing.T) {
	const h = halfLifeNanos
	// Exact points: whole half-lives and table steps.
	for k := range uint64(40) {
		want := fixed(0)
		if k < 32 {
			want = fixedOne >> k
		}
		if got := decayFactor(k * h); got != want {
			t.Errorf("decayFactor(%d half-lives) = %#x, want %#x", k, uint64(got), uint64(want))
		}
	}
	for i := range decayTable[:len(decayTable)-1] {
		if got := decayFactor(uint64(i) * halfLifeNanos >> decayTableShift); got != fixed(decayTable[i]) {
			t.Errorf("decayFactor(step %d) = %d, want %d", i, uint64(got), decayTable[i])
		}
	}
	// Relative error against math.Exp2 over many dt. Beyond a few half-lives the
	// result has few significant bits left, so the bound there is 2e-5 relative plus
	// one ulp for the final truncating shift.
	r := rand.New(rand.NewPCG(3, 4))
	worst := 0.0
	for n := range 300_000 {
		var dt uint64
		switch n % 3 {
		case 0:
			dt = r.Uint64N(h) // within the first half-life
		case 1:
			dt = r.Uint64N(12 * h)
		default:
			dt = r.Uint64N(40 * h)
		}
		want := math.Exp2(-float64(dt) / h)
		got := decayFactor(dt).Float64()
		if got > 1 {
			t.Fatalf("decayFactor(%d) = %g > 1", dt, got)
		}
		err := math.Abs(got - want)
		if err > 2e-5*want+0x1p-32 {
			t.Fatalf("decayFactor(%d) = %.12g, want %.12g (error %g)", dt, got, want, err)
		}
		if dt < 12*h {
			rel := err / want
			worst = max(worst, rel)
			if rel >= 2e-5 {
				t.Fatalf("decayFactor(%d) = %.12g, want %.12g: relative error %g", dt, got, want, rel)
			}
		}
	}
	t.Logf("worst relative error of decayFactor below 12 half-lives: %.3g", worst)
	// Monotonic non-increasing in dt.
	prev := decayFactor(0)
	for dt := uint64(0); dt < 3*h; dt += 9973 {
		d := decayFactor(dt)
		if d > prev {
			t.Fatalf("decayFactor not monotonic at %d: %d > %d", dt, d, prev)
		}
		prev = d
	}
}
