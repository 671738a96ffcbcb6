/* cuda_embed.cu - the token and position embeddings, forward and backward
 * (the backward sorts the tokens on the device: deterministic, no host wait).
 *
 * Legend: see kernels/backend.h. */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_act.h"
#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* embeddings                                                           */

/* out[N,C] (A) = wte[tokens[n],:] + wpe[n % T,:] (wpe NULL: 0), summed in
 * float and stored once */
template <typename A>
__global__ static void embed_forward_kernel(A *out, const int32_t *tokens, const float *wte,
					    const float *wpe, int N, int T, int C)
{
	size_t total = (size_t)N * C;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t n = i / C, c = i % C;
		float v = wte[(size_t)tokens[n] * C + c];
		if (wpe)
			v += wpe[(n % T) * C + c];
		act_st(out, i, v);
	}
}

template <typename A>
static void cu_embed_forward(A *out, const int32_t *tokens, const float *wte, const float *wpe,
			     int B, int T, int C)
{
	size_t total = (size_t)B * T * C;
	embed_forward_kernel<A><<<cuda_blocks(total, 256), 256, 0, cuda_stream()>>>(
		out, tokens, wte, wpe, B * T, T, C);
	CUDA_LAUNCHED();
}

/* dwte[tok] += the rows of dout at the positions holding tok, summed from 0
 * in ascending position. keys[N] are the tokens sorted (stably), pos[N] the
 * positions in that order, so each token's run lists its positions in
 * ascending order; the block at the head of a run sums it, the others
 * return at once. The bits depend on the tokens only. */
template <typename A>
__global__ static void embed_backward_wte_kernel(float *dwte, const A *dout, const int32_t *keys,
						 const int32_t *pos, int N, int C)
{
	int i = blockIdx.x;
	int c = blockIdx.y * blockDim.x + threadIdx.x;
	if (c >= C || (i > 0 && keys[i] == keys[i - 1]))
		return;
	int tok = keys[i];
	float s = 0;
	for (int j = i; j < N && keys[j] == tok; j++)
		s += act_ld(dout, (size_t)pos[j] * C + c);
	dwte[(size_t)tok * C + c] += s;
}

__global__ static void iota_kernel(int32_t *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = i;
}

template <typename A>
__global__ static void embed_backward_wpe_kernel(float *dwpe, const A *dout, int B, int T, int C)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (size_t)T * C)
		return;
	float s = 0;
	for (int b = 0; b < B; b++)
		s += act_ld(dout, (size_t)b * T * C + i);
	dwpe[i] += s;
}

template <typename A>
static void cu_embed_backward(float *dwte, float *dwpe, const A *dout, const int32_t *tokens,
			      int B, int T, int C)
{
	int N = B * T;
	if (N <= 0)
		return;
	cudaStream_t stream = cuda_stream();
	if (dwpe) {
		size_t tc = (size_t)T * C;
		embed_backward_wpe_kernel<A><<<cuda_blocks(tc, 256), 256, 0, stream>>>(
			dwpe, dout, B, T, C);
		CUDA_LAUNCHED();
	}
	if (!dwte)
		return;
	/* sort (token, position) pairs on the device: a radix sort is stable,
	 * so positions stay ascending within a token, the order the host sort
	 * of the first version gave, with no wait for the host */
	int32_t *d = (int32_t *)cuda_scratch(3 * (size_t)N * sizeof(int32_t));
	int32_t *pos_in = d, *keys = d + N, *pos = d + 2 * (size_t)N;
	iota_kernel<<<cuda_blocks(N, 256), 256, 0, stream>>>(pos_in, N);
	CUDA_LAUNCHED();
	size_t temp_bytes = 0;
	CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, keys, pos_in, pos,
						   N, 0, 32, stream));
	void *temp = cuda_scratch(temp_bytes);
	CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, keys, pos_in, pos, N,
						   0, 32, stream));
	dim3 grid(N, (C + 127) / 128);
	embed_backward_wte_kernel<A><<<grid, 128, 0, stream>>>(dwte, dout, keys, pos, N, C);
	CUDA_LAUNCHED();
	cuda_scratch_free(temp);
	cuda_scratch_free(d);
}


/* ------------------------------------------------------------------ */
/* the table's slots: activations travel as void * in the table's       */
/* act_dtype (float or __nv_bfloat16: A)                                 */

template <typename A>
static void act_embed_forward(void *out, const int32_t *tokens, const float *wte,
			      const float *wpe, int B, int T, int C)
{
	cu_embed_forward((A *)out, tokens, wte, wpe, B, T, C);
}

template <typename A>
static void act_embed_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tokens,
			       int B, int T, int C)
{
	cu_embed_backward(dwte, dwpe, (const A *)dout, tokens, B, T, C);
}

template <typename A> static void fill(struct backend &t)
{
	t.embed_forward = act_embed_forward<A>;
	t.embed_backward = act_embed_backward<A>;
}

void cuda_embed_slots(struct backend &t, bool bf16)
{
	if (bf16)
		fill<__nv_bfloat16>(t);
	else
		fill<float>(t);
}
