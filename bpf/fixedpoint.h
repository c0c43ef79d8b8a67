// Fixed point (fixedpoint.go): unsigned 32.32, no floats in the kernel.
#pragma once

#include "common.h"

#define FP_ONE (1ULL << 32)
#define FP_HALF (1ULL << 31)
#define FP_MAX (~0ULL)

typedef __u64 fp_t;


// fp_mul is Fixed.Mul: floor(a*b / 2^32) from four 32x32-bit partial products (BPF
// has no 128-bit multiply), modulo 2^64: it equals Fixed.Mul wherever the product fits
// (Fixed.Mul saturates beyond), and arrival_rate, its only caller, never leaves that.
static __always_inline fp_t fp_mul(fp_t a, fp_t b)
{
	__u64 ah = a >> 32, al = a & 0xffffffff;
	__u64 bh = b >> 32, bl = b & 0xffffffff;
	return ((ah * bh) << 32) + ah * bl + al * bh + ((al * bl) >> 32);
}

// fp_div is Fixed.Div: floor(a * 2^32 / b) by long division over the 96-bit
// dividend, FP_MAX when b is 0 or the quotient does not fit.
// fp_mul_frac is fp_mul for b <= 1.0 (b < 2^32 or exactly FP_ONE), such as a decay
// factor or a random draw: the partial products with b's integer part vanish, so
// this is the same result with two multiplies instead of four.
static __always_inline fp_t fp_mul_frac(fp_t a, fp_t b)
{
	if (b == FP_ONE)
		return a;
	__u64 ah = a >> 32, al = a & 0xffffffff;
	return ah * b + ((al * b) >> 32);
}

static __always_inline fp_t fp_div(fp_t a, fp_t b)
{
	__u64 rem = a >> 32, lo = a << 32, q = 0;
	if (b == 0 || rem >= b)
		return FP_MAX;
	for (int i = 0; i < 64; i++) {
		__u64 carry = rem >> 63;
		rem = (rem << 1) | (lo >> 63);
		lo <<= 1;
		q <<= 1;
		if (carry || rem >= b) {
			rem -= b;
			q |= 1;
		}
	}
	return q;
}

static __always_inline fp_t fp_add(fp_t a, fp_t b)
{
	fp_t s = a + b;
	return s < a ? FP_MAX : s;
}

static __always_inline fp_t fp_sub(fp_t a, fp_t b)
{
	return b > a ? 0 : a - b;
}

