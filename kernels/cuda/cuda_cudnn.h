/* cuda_cudnn.h - the attention slots on cuDNN's fused attention
 * (cuda_cudnn_attention.cu; ASYNCPP_ATTENTION=cudnn, cuda_flash.h).
 *
 * Each returns 0 when cuDNN ran the call, or -1 when the caller must run
 * its own kernels: f32 activations, a head size other than 64 and 128,
 * cuDNN missing or refusing the shape (said once per process, see
 * cudnn_sdpa.h). A refusal is decided before anything is enqueued, so the
 * fallback sees the inputs untouched.
 */
#ifndef ASYNCPP_CUDA_CUDNN_H
#define ASYNCPP_CUDA_CUDNN_H

#include <cuda_bf16.h>

int cuda_cudnn_attention_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B,
				 int T, int NH, int NKV, int HD);
int cuda_cudnn_attention_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
				  const __nv_bfloat16 *qkv, const __nv_bfloat16 *out,
				  const float *lse, int B, int T, int NH, int NKV, int HD);
/* fp32 activations: cuDNN's fused attention takes 16-bit types only */
static inline int cuda_cudnn_attention_forward(float *, float *, const float *, int, int, int,
					       int, int)
{
	return -1;
}
static inline int cuda_cudnn_attention_backward(float *, const float *, const float *,
						const float *, const float *, int, int, int, int,
						int)
{
	return -1;
}

#endif
