/* act.h - the storage type of activations and activation gradients.
 *
 * A backend declares, in struct backend's act_dtype, the type in which the
 * operations of backend.h read and write activations (a layer's inputs and
 * outputs, their gradients, logits): ACT_F32 (float) or ACT_BF16 (bfloat16:
 * the top 16 bits of a float, stored as uint16_t). Statistics (LayerNorm
 * mean and rstd, attention's lse), losses, weights, parameter gradients and
 * optimizer state are always float.
 *
 * Activation buffers are passed as void *: they are not float arrays and
 * must not be indexed as such. Offsets go through act_at() with the
 * element size (act_dtype_size); host code reads and writes single
 * elements with act_load()/act_store() (host memory only).
 *
 * bf16 rounding (f32_to_bf16 of io/formats/half.h, the one the safetensors
 * writer uses) is round-to-nearest-even on the 16 bits
 * dropped; infinities stay infinities, a finite value that rounds past the
 * largest bf16 becomes an infinity, and a NaN stays a NaN (quiet, its sign
 * kept). Denormals round like any other value (no flush to zero).
 */
#ifndef ASYNCPP_ACT_H
#define ASYNCPP_ACT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../io/formats/half.h" /* bf16_to_f32, f32_to_bf16 (round to nearest even) */

enum act_dtype { ACT_F32 = 0, ACT_BF16 = 1 };

/* Bytes per element. */
static inline size_t act_dtype_size(int dtype)
{
	return dtype == ACT_BF16 ? 2 : 4;
}

/* "f32" or "bf16" (the spelling of train.act_dtype). */
static inline const char *act_dtype_name(int dtype)
{
	return dtype == ACT_BF16 ? "bf16" : "f32";
}

/* Element i of the activation buffer p with elements of esz bytes (like
 * strchr, const in, plain out: the caller keeps the constness it had). */
static inline void *act_at(const void *p, size_t i, size_t esz)
{
	return p ? (void *)((const char *)p + i * esz) : NULL;
}

/* The float nearest to f that bf16 can hold (f32_to_bf16 and back). */
static inline float round_bf16(float f)
{
	return bf16_to_f32(f32_to_bf16(f));
}

/* Element i of a host activation buffer, as a float / stored from one. */
static inline float act_load(const void *p, size_t i, int dtype)
{
	if (dtype == ACT_BF16)
		return bf16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

static inline void act_store(void *p, size_t i, int dtype, float v)
{
	if (dtype == ACT_BF16)
		((uint16_t *)p)[i] = f32_to_bf16(v);
	else
		((float *)p)[i] = v;
}

#endif
