/* cuda_act.h - element access for kernels templated on the activation
 * storage type A (kernels/act.h): float (ACT_F32) or __nv_bfloat16
 * (ACT_BF16). C++ only, device code.
 *
 * A kernel reads every activation with act_ld (a float, exact for bf16) and
 * writes every activation with act_st (a float store, or bf16 rounded to
 * nearest even by __float2bfloat16_rn). Everything between is the same float
 * arithmetic for both types, so a bf16 kernel gives the f32 kernel's result
 * on the widened inputs, rounded once per stored element: the contract of
 * backend.h, and what the CPU's backend_cpu_bf16 computes. (A NaN stays a
 * NaN; its payload may differ from the CPU's f32_to_bf16.) The index keeps
 * the caller's integer type, so p[i] is the very expression an f32 kernel
 * had before it was templated (the same address arithmetic and code).
 *
 * cuda_flash.cu also includes this under its CPU emulator (FLASH_EMULATE,
 * dev/flash_emu.h), which supplies the two bf16 conversions.
 */
#ifndef ASYNCPP_CUDA_ACT_H
#define ASYNCPP_CUDA_ACT_H

#ifndef FLASH_EMULATE
#include <cuda_bf16.h>
#endif

template <typename I> __device__ static __forceinline__ float act_ld(const float *p, I i)
{
	return p[i];
}

template <typename I>
__device__ static __forceinline__ float act_ld(const __nv_bfloat16 *p, I i)
{
	return __bfloat162float(p[i]);
}

template <typename I> __device__ static __forceinline__ void act_st(float *p, I i, float v)
{
	p[i] = v;
}

template <typename I>
__device__ static __forceinline__ void act_st(__nv_bfloat16 *p, I i, float v)
{
	p[i] = __float2bfloat16_rn(v);
}

/* v as stored and read back (act_st then act_ld): exact for float, rounded
 * to nearest even for bf16. For fused kernels that must give the bits of
 * two kernels, the first of which stored its result. Not a barrier to
 * contraction: for float, an add of the result may still fuse with the
 * multiply that made v (use __fadd_rn there). */
__device__ static __forceinline__ float act_rt(const float *, float v)
{
	return v;
}

__device__ static __forceinline__ float act_rt(const __nv_bfloat16 *, float v)
{
	return __bfloat162float(__float2bfloat16_rn(v));
}

#endif
