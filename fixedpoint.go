package rrl

import (
	"math"
	"math/bits"
)

// Fixed is the unsigned fixed-point number format shared by the Go code and the
// kernel filter (filter_bpf.c implements the same operations on the same bits).
// A Fixed is a uint64 holding value * 2^32: 32 integer bits and 32 fraction bits,
// so it represents 0 to just under 2^32 in steps of 2^-32 (about 2.3e-10).
//
// Rates (packets per second), balances (seconds of credit) and probabilities are all
// Fixed. Every operation truncates towards zero, which is what the integer
// instructions of both languages do, so both sides compute the same bits.
//
// No-overflow ranges (the results outside them wrap, identically in C and Go, but
// callers never leave them):
//   - FixedFromInt: n < 2^32.
//   - FixedFromRatio: num < 2^32, den > 0.
//   - Mul: the exact product a*b/2^32 < 2^32; a larger product saturates to FixedMax.
//     The kernel's fp_mul wraps instead; its callers cannot leave the range (a rate
//     estimate passes 2^32 only beyond six billion packets a second).
//   - Div: b > 0 and a/b < 2^32; otherwise Div saturates to FixedMax.
//   - FixedFromNanos: durations below 2^32 seconds (136 years); longer ones wrap.
//   - Add and Sub saturate at FixedMax and 0.
type Fixed uint64

const (
	// FixedFracBits is the number of fraction bits of a Fixed.
	FixedFracBits = 32
	// FixedOne is 1.0.
	FixedOne Fixed = 1 << FixedFracBits
	// FixedHalf is 0.5.
	FixedHalf Fixed = 1 << (FixedFracBits - 1)
	// FixedMax is the largest Fixed, just under 2^32.
	FixedMax Fixed = math.MaxUint64
)

const nanosPerSecond = 1_000_000_000

// FixedFromInt returns n as a Fixed. n must be below 2^32.
func FixedFromInt(n uint64) Fixed { return Fixed(n << FixedFracBits) }

// FixedFromRatio returns num/den truncated. num must be below 2^32 and den non-zero.
func FixedFromRatio(num, den uint64) Fixed { return Fixed((num << FixedFracBits) / den) }

// FixedFromNanos converts a duration in nanoseconds into seconds as a Fixed.
// Negative durations give 0.
func FixedFromNanos(ns int64) Fixed {
	if ns <= 0 {
		return 0
	}
	s := uint64(ns) / nanosPerSecond
	r := uint64(ns) % nanosPerSecond // r < 2^30, so r<<32 fits
	return Fixed(s<<FixedFracBits + (r<<FixedFracBits)/nanosPerSecond)
}

// FixedFromFloat converts f, clamped to [0, FixedMax], rounding to nearest. It is for
// configuration and tests, never for the per-packet path.
func FixedFromFloat(f float64) Fixed {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= 1<<32:
		return FixedMax
	}
	v := math.Round(f * (1 << FixedFracBits))
	if v >= 1<<64 {
		return FixedMax
	}
	return Fixed(v)
}

// Float64 returns f as a float64 (for reports and tests).
func (f Fixed) Float64() float64 { return float64(f) / (1 << FixedFracBits) }

// Int returns the integer part of f.
func (f Fixed) Int() uint64 { return uint64(f) >> FixedFracBits }

// Frac returns the fraction part of f.
func (f Fixed) Frac() Fixed { return f & (FixedOne - 1) }

// Mul returns f*g truncated, saturating at FixedMax. Where the product fits it equals
// the C fp_mul, which computes the same bits from four 32x32-bit partial products
// because BPF has no 128-bit multiply.
func (f Fixed) Mul(g Fixed) Fixed {
	hi, lo := bits.Mul64(uint64(f), uint64(g))
	if hi>>(64-FixedFracBits) != 0 {
		return FixedMax
	}
	return Fixed(hi<<(64-FixedFracBits) | lo>>FixedFracBits)
}

// Div returns f/g truncated, or FixedMax when g is zero or the quotient does not fit.
func (f Fixed) Div(g Fixed) Fixed {
	hi, lo := uint64(f)>>(64-FixedFracBits), uint64(f)<<FixedFracBits
	if g == 0 || hi >= uint64(g) {
		return FixedMax
	}
	q, _ := bits.Div64(hi, lo, uint64(g))
	return Fixed(q)
}

// Add returns f+g, saturating at FixedMax.
func (f Fixed) Add(g Fixed) Fixed {
	s, carry := bits.Add64(uint64(f), uint64(g), 0)
	if carry != 0 {
		return FixedMax
	}
	return Fixed(s)
}

// Sub returns f-g, or 0 when g > f.
func (f Fixed) Sub(g Fixed) Fixed {
	if g > f {
		return 0
	}
	return f - g
}

// MulInt returns f*n, saturating at FixedMax.
func (f Fixed) MulInt(n uint64) Fixed {
	hi, lo := bits.Mul64(uint64(f), n)
	if hi != 0 {
		return FixedMax
	}
	return Fixed(lo)
}
