/* half.h - bfloat16 and IEEE half (binary16) <-> float32, bit-exact.
 *
 * Widening is exact. Narrowing rounds to nearest, ties to even, as PyTorch's
 * .to(torch.bfloat16) / .half() do: overflow gives infinity, f16 has
 * subnormals, NaN stays NaN (quiet, sign kept).
 */
#ifndef ASYNCPP_HALF_H
#define ASYNCPP_HALF_H

#include <stdint.h>
#include <string.h>

static inline float f32_from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float bf16_to_f32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* NaN: keep it quiet */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0x1f)
		return f32_from_bits(sign | 0x7f800000u | m << 13);
	if (e)
		return f32_from_bits(sign | (e + 112) << 23 | m << 13);
	if (!m)
		return f32_from_bits(sign);
	/* subnormal: m * 2^-24, exact in float */
	float v = (float)m * 5.9604644775390625e-8f;
	return sign ? -v : v;
}

static inline uint16_t f16_from_parts(uint32_t sign, int32_t e, uint32_t m);

static inline uint16_t f32_to_f16(float f)
{
	uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
	if (a >= 0x477ff000u) /* rounds to 65536 or more, or is infinite */
		return (uint16_t)(sign | 0x7c00);
	if (a >= 0x38800000u) { /* normal in f16 (>= 2^-14) */
		uint32_t r = a + 0x0fffu + ((a >> 13) & 1);
		return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
	}
	return f16_from_parts(sign, (int32_t)(a >> 23), a & 0x7fffffu);
}

/* a value below 2^-14: a subnormal or zero of f16 */
static inline uint16_t f16_from_parts(uint32_t sign, int32_t e, uint32_t m)
{
	if (e < 102) /* below 2^-25: rounds to zero */
		return (uint16_t)sign;
	m |= 0x800000u;
	int shift = 126 - e; /* 14..24 */
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return (uint16_t)(sign | q);
}

#endif
