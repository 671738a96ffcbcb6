/* cpu_math.h - vectorisable elementary functions for the CPU kernels.
 *
 * glibc's expf/tanhf are scalar calls that stop GCC from vectorising a loop;
 * these are branch-free so a loop over them becomes AVX code. cpu_expf is
 * Cephes' expf: range reduction x = k ln2 + r with ln2 split in two, a degree-7
 * polynomial for e^r, then 2^k through the exponent bits; relative error
 * below 1.5 ulp over the whole range (test_kernels_cpu checks it against
 * exp() in double). Overflow saturates at FLT_MAX-ish (e^88.37), results below
 * e^-87.3 flush to 0, NaN stays NaN.
 */
#ifndef ASYNCPP_CPU_MATH_H
#define ASYNCPP_CPU_MATH_H

#include <stdint.h>
#include <string.h>

static inline float cpu_expf(float xin)
{
	const float hi = 88.3762626647949f, lo = -87.33654f;
	/* written so that NaN falls through both clamps unchanged */
	float x = xin > hi ? hi : xin;
	x = x < lo ? lo : x;
	/* k = round(x / ln2) through the 1.5*2^23 trick: the low mantissa bits
	 * of t hold k, no float->int conversion needed */
	float t = x * 1.44269504088896341f + 12582912.0f;
	int32_t ti;
	memcpy(&ti, &t, sizeof(ti));
	float k = t - 12582912.0f;
	float r = x - k * 0.693359375f;
	r = r + k * 2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	float y = p * (r * r) + r + 1.0f;
	/* unsigned: for a NaN input ti is garbage and the shift must not be
	 * undefined behaviour (y is NaN then, whatever s is) */
	uint32_t e = (uint32_t)(ti - 0x4B400000 + 127) << 23;
	float s;
	memcpy(&s, &e, sizeof(s));
	return xin < lo ? 0.0f : y * s;
}

/* tanh(x) = 1 - 2 / (e^{2x} + 1): absolute error ~1e-7 (relative error is
 * larger only where |tanh| is below ~1e-3, where GELU does not care). */
static inline float cpu_tanhf(float x)
{
	return 1.0f - 2.0f / (cpu_expf(2.0f * x) + 1.0f);
}

static inline float cpu_sigmoidf(float x)
{
	return 1.0f / (1.0f + cpu_expf(-x));
}

#endif
