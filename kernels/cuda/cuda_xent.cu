/* cuda_xent.cu - the fused softmax + cross-entropy over the logits (the
 * loss and its gradient in one kernel, in place) and the mean of the
 * losses; two kernels behind one slot (ASYNCPP_XENT).
 *
 * Legend: see kernels/backend.h (V, Vp). */
#include <atomic>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_act.h"
#include "cuda_common.h"
#include "cuda_flash.h" /* CUDA_XENT_PLAIN, CUDA_XENT_VEC */

extern "C" {
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* fused softmax + cross-entropy: one block per row                     */

#define XENT_THREADS 512

/* Combine two (max, sum of exp(x - max)) pairs. */
__device__ static inline void lse_merge(float &m, float &s, float m2, float s2)
{
	float mm = fmaxf(m, m2);
	if (mm == -INFINITY)
		return;
	s = s * expf(m - mm) + s2 * expf(m2 - mm);
	m = mm;
}

/* The end of a row's first pass, for both kernels below: every thread's
 * (max, sum of exp) merged across the block, thread 0 writes the row's
 * loss from xt (the target's logit, read before any write), every thread
 * gets the row's lse. */
__device__ static float xent_row_lse(float m, float s, int t, int V, float xt, float *loss)
{
	__shared__ float shm[XENT_THREADS / 32], shs[XENT_THREADS / 32], sh_lse;
	int tid = threadIdx.x, lane = tid & 31, wid = tid / 32;
	for (int o = 16; o > 0; o >>= 1) {
		float m2 = __shfl_xor_sync(0xffffffffu, m, o);
		float s2 = __shfl_xor_sync(0xffffffffu, s, o);
		lse_merge(m, s, m2, s2);
	}
	if (lane == 0) {
		shm[wid] = m;
		shs[wid] = s;
	}
	__syncthreads();
	if (tid == 0) {
		float mm = shm[0], ss = shs[0];
		for (int w = 1; w < XENT_THREADS / 32; w++)
			lse_merge(mm, ss, shm[w], shs[w]);
		float lse = mm + logf(ss);
		sh_lse = lse;
		/* a target outside [0, V) (backend.h): t < 0 is ignored (0),
		 * t >= V a bad input (NaN); its gradient row is 0 */
		float bad = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
		*loss = (t >= 0 && t < V) ? lse - xt : bad;
	}
	__syncthreads();
	return sh_lse;
}

/* logits[N,Vp], dlogits[N,Vp] (A; may alias logits: a thread reads an
 * element before it writes it, and only it touches that element) */
template <typename A>
__global__ static void softmax_xent_kernel(float *losses, A *dlogits, const A *logits,
					   const int32_t *targets, int V, int Vp, float dloss)
{
	int n = blockIdx.x, tid = threadIdx.x;
	const A *x = logits + (size_t)n * Vp;
	int t = targets[n];
	float xt = 0.0f; /* thread 0's read, before any write */
	if (tid == 0)
		xt = (t >= 0 && t < V) ? act_ld(x, t) : 0.0f;
	float m = -INFINITY, s = 0;
	for (int j = tid; j < V; j += XENT_THREADS) {
		float v = act_ld(x, j);
		if (v > m) {
			s = s * expf(m - v) + 1.0f;
			m = v;
		} else {
			s += expf(v - m);
		}
	}
	float lse = xent_row_lse(m, s, t, V, xt, &losses[n]);
	if (!dlogits)
		return;
	A *d = dlogits + (size_t)n * Vp;
	int valid = t >= 0 && t < V;
	for (int j = tid; j < Vp; j += XENT_THREADS) {
		float g = 0;
		if (j < V && valid)
			g = (expf(act_ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)) * dloss;
		act_st(d, j, g);
	}
}

/* The same with 16-byte loads and stores (4 floats or 8 bf16 a thread at a
 * time) and one online-softmax update per vector instead of per element;
 * rows must start 16-byte aligned (Vp * sizeof(A) a multiple of 16 and an
 * aligned base). The result differs from softmax_xent_kernel's only by the
 * order of the fp32 sums. Not the default until a GPU run has compared them
 * (cuda_xent_set_impl; NOTES.md). */
template <typename A> struct xent_vec {
	static const int n = 16 / sizeof(A); /* elements per 16 bytes */
};

/* the n elements of one 16-byte vector at p, as floats */
template <typename A> __device__ static __forceinline__ void xent_load(float *v, const A *p)
{
	uint4 u = *(const uint4 *)p;
	const A *e = (const A *)&u;
#pragma unroll
	for (int i = 0; i < xent_vec<A>::n; i++)
		v[i] = act_ld(e, i);
}

template <typename A> __device__ static __forceinline__ void xent_store(A *p, const float *v)
{
	uint4 u;
	A *e = (A *)&u;
#pragma unroll
	for (int i = 0; i < xent_vec<A>::n; i++)
		act_st(e, i, v[i]);
	*(uint4 *)p = u;
}

template <typename A>
__global__ static void softmax_xent_vec_kernel(float *losses, A *dlogits, const A *logits,
					       const int32_t *targets, int V, int Vp, float dloss)
{
	const int NV = xent_vec<A>::n;
	int n = blockIdx.x, tid = threadIdx.x;
	const A *x = logits + (size_t)n * Vp;
	int t = targets[n], nvec = (V + NV - 1) / NV;
	float xt = 0.0f; /* thread 0's read, before any write */
	if (tid == 0)
		xt = (t >= 0 && t < V) ? act_ld(x, t) : 0.0f;
	float m = -INFINITY, s = 0;
	for (int k = tid; k < nvec; k += XENT_THREADS) {
		float v[NV], vm = -INFINITY;
		xent_load(v, x + (size_t)k * NV);
#pragma unroll
		for (int i = 0; i < NV; i++)
			if (k * NV + i < V)
				vm = fmaxf(vm, v[i]);
		float mm = fmaxf(m, vm), add = 0;
#pragma unroll
		for (int i = 0; i < NV; i++)
			if (k * NV + i < V)
				add += expf(v[i] - mm);
		s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + add;
		m = mm;
	}
	float lse = xent_row_lse(m, s, t, V, xt, &losses[n]);
	if (!dlogits)
		return;
	A *d = dlogits + (size_t)n * Vp;
	int valid = t >= 0 && t < V;
	for (int k = tid; k < Vp / NV; k += XENT_THREADS) {
		float v[NV];
		xent_load(v, x + (size_t)k * NV);
#pragma unroll
		for (int i = 0; i < NV; i++) {
			int j = k * NV + i;
			v[i] = (j < V && valid) ? (expf(v[i] - lse) - (j == t ? 1.0f : 0.0f)) * dloss
						: 0.0f;
		}
		xent_store(d + (size_t)k * NV, v);
	}
}

/* CUDA_XENT_PLAIN or CUDA_XENT_VEC (cuda_flash.h); from ASYNCPP_XENT=vec|plain
 * once, plain by default */
static std::atomic<int> xent_impl(-1);

extern "C" int cuda_xent_impl(void)
{
	int v = xent_impl.load();
	if (v < 0) {
		const char *e = getenv("ASYNCPP_XENT");
		int want = CUDA_XENT_PLAIN, expect = -1;
		if (e && !strcmp(e, "vec"))
			want = CUDA_XENT_VEC;
		else if (e && *e && strcmp(e, "plain"))
			cuda_fatal(__FILE__, __LINE__, "ASYNCPP_XENT='%s': expected 'plain' or 'vec'", e);
		xent_impl.compare_exchange_strong(expect, want);
		v = xent_impl.load();
	}
	return v;
}

extern "C" int cuda_xent_set_impl(int impl)
{
	int prev = cuda_xent_impl();
	if (impl == CUDA_XENT_PLAIN || impl == CUDA_XENT_VEC)
		xent_impl.store(impl);
	return prev;
}

template <typename A>
static void cu_softmax_xent(float *losses, A *dlogits, const A *logits, const int32_t *targets,
			    int N, int V, int Vp, float dloss)
{
	if (N <= 0)
		return;
	int vec = cuda_xent_impl() == CUDA_XENT_VEC && (Vp * sizeof(A)) % 16 == 0 &&
		  (uintptr_t)logits % 16 == 0 && (!dlogits || (uintptr_t)dlogits % 16 == 0);
	if (vec)
		softmax_xent_vec_kernel<A><<<N, XENT_THREADS, 0, cuda_stream()>>>(
			losses, dlogits, logits, targets, V, Vp, dloss);
	else
		softmax_xent_kernel<A><<<N, XENT_THREADS, 0, cuda_stream()>>>(losses, dlogits, logits,
									    targets, V, Vp, dloss);
	CUDA_LAUNCHED();
}


/* out[0] = mean of losses[N]: each of 256 threads sums its stride in
 * double in order, then a fixed tree; one block, queued, no host wait. */
__global__ static void loss_mean_kernel(float *out, const float *losses, int N)
{
	__shared__ double sh[256];
	double s = 0;
	for (int i = threadIdx.x; i < N; i += 256)
		s += losses[i];
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int w = 128; w > 0; w >>= 1) {
		if ((int)threadIdx.x < w)
			sh[threadIdx.x] += sh[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[0] = (float)(sh[0] / N);
}

static void cu_loss_mean(float *out, const float *losses, int N)
{
	loss_mean_kernel<<<1, 256, 0, cuda_stream()>>>(out, losses, N);
	CUDA_LAUNCHED();
}


/* ------------------------------------------------------------------ */
/* the table's slots: activations travel as void * in the table's       */
/* act_dtype (float or __nv_bfloat16: A)                                 */

template <typename A>
static void act_softmax_xent(float *losses, void *dlogits, const void *logits,
			     const int32_t *targets, int N, int V, int Vp, float dloss)
{
	cu_softmax_xent(losses, (A *)dlogits, (const A *)logits, targets, N, V, Vp, dloss);
}

void cuda_xent_slots(struct backend &t, bool bf16)
{
	t.softmax_xent = bf16 ? act_softmax_xent<__nv_bfloat16> : act_softmax_xent<float>;
	t.loss_mean = cu_loss_mean;
}
