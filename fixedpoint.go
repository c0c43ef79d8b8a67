package rrl

import (
	"math"
	"math/bits"
)

// fixed is the unsigned fixed-point number format shared by the Go code and the
// kernel filter (bpf/fixedpoint.h implements the same operations on the same bits).
// A fixed is a uint64 holding value * 2^32: 32 integer bits and 32 fraction bits,
// so it represents 0 to just under 2^32 in steps of 2^-32 (about 2.3e-10).
//
// Rates (packets per second), balances (seconds of credit) and probabilities are all
// fixed. Every operation truncates towards zero, which is what the integer
// instructions of both languages do, so both sides compute the same bits.
//
// No-overflow ranges (the results outside them wrap, identically in C and Go, but
// callers never leave them):
//   - fixedFromInt: n < 2^32.
//   - fixedFromRatio: num < 2^32, den > 0.
//   - Mul: the exact product a*b/2^32 < 2^32; a larger product saturates to fixedMax.
//     The kernel's fp_mul wraps instead; its callers cannot leave the range (a rate
//     estimate passes 2^32 only beyond six billion packets a second).
//   - Div: b > 0 and a/b < 2^32; otherwise Div saturates to fixedMax.
//   - fixedFromNanos: durations below 2^32 seconds (136 years); longer ones wrap.
//   - Add and Sub saturate at fixedMax and 0.
type fixed uint64

const (
	// fixedFracBits is the number of fraction bits of a fixed.
	fixedFracBits = 32
	// fixedOne is 1.0.
	fixedOne fixed = 1 << fixedFracBits
	// fixedHalf is 0.5.
	fixedHalf fixed = 1 << (fixedFracBits - 1)
	// fixedMax is the largest fixed, just under 2^32.
	fixedMax fixed = math.MaxUint64
)

const nanosPerSecond = 1_000_000_000

// fixedFromInt returns n as a fixed. n must be below 2^32.
func fixedFromInt(n uint64) fixed { return fixed(n << fixedFracBits) }

// fixedFromRatio returns num/den truncated. num must be below 2^32 and den non-zero.
func fixedFromRatio(num, den uint64) fixed { return fixed((num << fixedFracBits) / den) }

// fixedFromNanos converts a duration in nanoseconds into seconds as a fixed.
// Negative durations give 0.
func fixedFromNanos(ns int64) fixed {
	if ns <= 0 {
		return 0
	}
	s := uint64(ns) / nanosPerSecond
	r := uint64(ns) % nanosPerSecond // r < 2^30, so r<<32 fits
	return fixed(s<<fixedFracBits + (r<<fixedFracBits)/nanosPerSecond)
}

// fixedFromFloat converts f, clamped to [0, fixedMax], rounding to nearest. It is for
// configuration and tests, never for the per-packet path.
func fixedFromFloat(f float64) fixed {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= 1<<32:
		return fixedMax
	}
	v := math.Round(f * (1 << fixedFracBits))
	if v >= 1<<64 {
		return fixedMax
	}
	return fixed(v)
}

// Float64 returns f as a float64 (for reports and tests).
func (f fixed) Float64() float64 { return float64(f) / (1 << fixedFracBits) }

// Int returns the integer part of f.
func (f fixed) Int() uint64 { return uint64(f) >> fixedFracBits }

// Frac returns the fraction part of f.
func (f fixed) Frac() fixed { return f & (fixedOne - 1) }

// Mul returns f*g truncated, saturating at fixedMax. Where the product fits it equals
// the C fp_mul, which computes the same bits from four 32x32-bit partial products
// because BPF has no 128-bit multiply.
func (f fixed) Mul(g fixed) fixed {
	hi, lo := bits.Mul64(uint64(f), uint64(g))
	if hi>>(64-fixedFracBits) != 0 {
		return fixedMax
	}
	return fixed(hi<<(64-fixedFracBits) | lo>>fixedFracBits)
}

// Div returns f/g truncated, or fixedMax when g is zero or the quotient does not fit.
func (f fixed) Div(g fixed) fixed {
	hi, lo := uint64(f)>>(64-fixedFracBits), uint64(f)<<fixedFracBits
	if g == 0 || hi >= uint64(g) {
		return fixedMax
	}
	q, _ := bits.Div64(hi, lo, uint64(g))
	return fixed(q)
}

// Add returns f+g, saturating at fixedMax.
func (f fixed) Add(g fixed) fixed {
	s, carry := bits.Add64(uint64(f), uint64(g), 0)
	if carry != 0 {
		return fixedMax
	}
	return fixed(s)
}

// Sub returns f-g, or 0 when g > f.
func (f fixed) Sub(g fixed) fixed {
	if g > f {
		return 0
	}
	return f - g
}

// MulInt returns f*n, saturating at fixedMax.
func (f fixed) MulInt(n uint64) fixed {
	hi, lo := bits.Mul64(uint64(f), n)
	if hi != 0 {
		return fixedMax
	}
	return fixed(lo)
}
