/* cuda_moe.cu - the mixture-of-experts routing and dispatch ops of
 * kernels/backend.h (moe_*) on the GPU; the CPU's (kernels/cpu/cpu_moe.c)
 * are the reference, and tests/unit/test_moe_ops.c checks both against one
 * double-precision re-derivation.
 *
 * Determinism: no floating-point atomics anywhere. The dispatch counts by
 * expert per chunk of CHUNK slots (each slot's rank among its expert's
 * slots of the chunk by a scan of the slots before it in shared memory),
 * then one block turns the chunks' counts into offsets (a thread per
 * expert down its chunks, then a prefix over the experts) in (expert,
 * chunk) order: positions are the stable order (expert,
 * token, j) of the CPU, bit for bit (they are integers). Per-token work
 * (routing, the router's backward) is one thread per token in the CPU's
 * order; sums over tokens (the auxiliary losses) and the gates' dot
 * products use fixed trees, so their bits depend on the shape only (they
 * may differ from the CPU's serial sums in the last bits).
 *
 * Legend: backend.h's (N tokens, E experts, K per token, C width).
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_act.h"
#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}

#define MOE_THREADS 256
#define CHUNK 256 /* slots per dispatch chunk (= threads of its block) */

/* ---- routing ---- */

template <typename A>
__device__ static float row_lse(const A *z, int E, double *sum_out)
{
	float mx = act_ld(z, 0);
	double sum = 0;
	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, act_ld(z, e));
	for (int e = 0; e < E; e++)
		sum += exp((double)(act_ld(z, e) - mx));
	if (sum_out)
		*sum_out = sum;
	return mx + (float)log(sum);
}

template <typename A>
__global__ static void route_kernel(float *score, int32_t *sel, float *gate, const A *z, int N,
				    int E, int K, int router)
{
	int n = blockIdx.x * blockDim.x + threadIdx.x;
	if (n >= N)
		return;
	const A *zr = z + (size_t)n * E;
	float *sc = score + (size_t)n * E, lse = row_lse(zr, E, NULL);
	int32_t *sl = sel + (size_t)n * K;
	double gsum = 0;

	for (int e = 0; e < E; e++) {
		float v = act_ld(zr, e);
		sc[e] = router == 0 ? expf(v - lse) : 1.0f / (1.0f + expf(-v));
	}
	/* K passes of argmax; strict > keeps the lower index on ties */
	for (int j = 0; j < K; j++) {
		int best = -1;
		for (int e = 0; e < E; e++) {
			int taken = 0;
			for (int i = 0; i < j; i++)
				taken |= sl[i] == e;
			if (!taken && (best < 0 || sc[e] > sc[best]))
				best = e;
		}
		sl[j] = best;
		gsum += sc[best];
	}
	for (int j = 0; j < K; j++)
		gate[(size_t)n * K + j] = K > 1 ? (float)(sc[sl[j]] / gsum) : sc[sl[j]];
}

/* ---- dispatch ---- */

/* Per chunk: each slot's rank among the chunk's slots of its expert
 * (into pos, for now) and the chunk's count per expert (hist[chunk,E]). */
__global__ static void dispatch_rank_kernel(int32_t *pos, int32_t *hist, const int32_t *sel,
					    int NK, int E)
{
	__shared__ int32_t s[CHUNK];
	int base = blockIdx.x * CHUNK, i = base + threadIdx.x, len = min(CHUNK, NK - base);

	s[threadIdx.x] = i < NK ? sel[i] : -1;
	__syncthreads();
	if (i < NK) {
		int r = 0, me = s[threadIdx.x];
		for (int k = 0; k < (int)threadIdx.x; k++)
			r += s[k] == me;
		pos[i] = r;
	}
	for (int e = threadIdx.x; e < E; e += blockDim.x) {
		int c = 0;
		for (int k = 0; k < len; k++)
			c += s[k] == e;
		hist[(size_t)blockIdx.x * E + e] = c;
	}
}

/* One block: each expert's column of hist (one thread per expert) turned
 * into offsets within the column, its total into count[e + 1]; then
 * count[] made exclusive over experts by thread 0 (E steps). The place
 * kernel adds count[sel] (integers: the order of the sums changes no bit). */
#define OFF_BATCH 8
__global__ static void dispatch_offsets_kernel(int32_t *count, int32_t *hist, int chunks, int E)
{
	for (int e = threadIdx.x; e < E; e += blockDim.x) {
		int32_t run = 0;
		int c = 0;
		for (; c + OFF_BATCH <= chunks; c += OFF_BATCH) {
			int32_t h[OFF_BATCH];
#pragma unroll
			for (int u = 0; u < OFF_BATCH; u++)
				h[u] = hist[(size_t)(c + u) * E + e];
#pragma unroll
			for (int u = 0; u < OFF_BATCH; u++) {
				hist[(size_t)(c + u) * E + e] = run;
				run += h[u];
			}
		}
		for (; c < chunks; c++) {
			int32_t h = hist[(size_t)c * E + e];
			hist[(size_t)c * E + e] = run;
			run += h;
		}
		count[e + 1] = run;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int32_t run = 0;
		for (int e = 0; e < E; e++) {
			int32_t t = count[e + 1];
			count[e] = run;
			run += t;
		}
		count[E] = run;
	}
}

__global__ static void dispatch_place_kernel(int32_t *pos, const int32_t *hist,
					     const int32_t *count, const int32_t *sel, int NK, int E)
{
	int i = blockIdx.x * CHUNK + threadIdx.x;
	if (i < NK)
		pos[i] += hist[(size_t)blockIdx.x * E + sel[i]] + count[sel[i]];
}

static void cu_moe_dispatch(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K,
			    int E)
{
	cudaStream_t st = cuda_stream();
	int NK = N * K, chunks = (NK + CHUNK - 1) / CHUNK;
	int32_t *hist = (int32_t *)cuda_scratch(sizeof(int32_t) * (size_t)(chunks ? chunks : 1) * E);

	if (chunks) {
		dispatch_rank_kernel<<<chunks, CHUNK, 0, st>>>(pos, hist, sel, NK, E);
		CUDA_LAUNCHED();
	}
	/* E threads walk the chunks (batched loads), then E serial steps */
	dispatch_offsets_kernel<<<1, MOE_THREADS, 0, st>>>(count, hist, chunks, E);
	CUDA_LAUNCHED();
	if (chunks) {
		dispatch_place_kernel<<<chunks, CHUNK, 0, st>>>(pos, hist, count, sel, NK, E);
		CUDA_LAUNCHED();
	}
	cuda_scratch_free(hist);
}

/* ---- gather and combine ---- */

/* A block per slot (gather) or token (combine), its threads over the
 * row's C columns: no division per element. */
template <typename A>
__global__ static void gather_kernel(A *xd, const A *x, const int32_t *pos, int K, int C)
{
	size_t slot = blockIdx.x;
	A *dst = xd + (size_t)pos[slot] * C;
	const A *src = x + (slot / K) * C;
	for (int c = threadIdx.x; c < C; c += blockDim.x)
		dst[c] = src[c];
}

/* out[n,c] += sum_j gate * y (no contraction: the CPU's products and sums
 * rounded one by one) */
template <typename A>
__global__ static void combine_kernel(A *out, const A *y, const float *gate, const int32_t *pos,
				      int K, int C)
{
	size_t t = blockIdx.x, o = t * C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float v = act_ld(out, o + c);
		for (int j = 0; j < K; j++) {
			float yv = act_ld(y, (size_t)pos[t * K + j] * C + c);
			v = __fadd_rn(v, gate ? __fmul_rn(gate[t * K + j], yv) : yv);
		}
		act_st(out, o + c, v);
	}
}

/* One warp per slot: dy row = gate * dout row; dgate = dout . y in double
 * (each lane strides over c, then a fixed shuffle tree). */
template <typename A>
__global__ static void combine_backward_kernel(A *dy, float *dgate, const A *dout, const A *y,
					       const float *gate, const int32_t *pos, int K, int C,
					       int NK)
{
	int slot = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
	if (slot >= NK)
		return;
	size_t r = (size_t)pos[slot] * C, o = (size_t)(slot / K) * C;
	float g = gate[slot];
	double dot = 0;
	for (int c = lane; c < C; c += 32) {
		float dv = act_ld(dout, o + c);
		dot += (double)dv * act_ld(y, r + c);
		act_st(dy, r + c, __fmul_rn(g, dv));
	}
	for (int off = 16; off > 0; off /= 2)
		dot += __shfl_down_sync(0xffffffffu, dot, off);
	if (lane == 0)
		dgate[slot] = (float)dot;
}

/* ---- auxiliary losses ---- */

/* t[n, 0..E-1] = q[n,e] (score, or score over the token's sum), t[n,E] = lse^2 */
template <typename A>
__global__ static void aux_token_kernel(double *t, const A *z, const float *score, int N, int E,
					int router)
{
	int n = blockIdx.x * blockDim.x + threadIdx.x;
	if (n >= N)
		return;
	const float *sc = score + (size_t)n * E;
	double norm = 0, *tr = t + (size_t)n * (E + 1);
	float lse = row_lse(z + (size_t)n * E, E, NULL);
	if (router == 0)
		norm = 1.0;
	else
		for (int e = 0; e < E; e++)
			norm += sc[e];
	for (int e = 0; e < E; e++)
		tr[e] = sc[e] / norm;
	tr[E] = (double)lse * lse;
}

/* One block per column of t[N,E+1]: its sum in a fixed tree. */
__global__ static void aux_colsum_kernel(double *sum, const double *t, int N, int cols)
{
	__shared__ double s[MOE_THREADS];
	double v = 0;
	for (int n = threadIdx.x; n < N; n += blockDim.x)
		v += t[(size_t)n * cols + blockIdx.x];
	s[threadIdx.x] = v;
	__syncthreads();
	for (int w = blockDim.x / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			s[threadIdx.x] += s[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		sum[blockIdx.x] = s[0];
}

__global__ static void aux_final_kernel(float *aux, const double *sum, const int32_t *count,
					int N, int E, int K)
{
	double bal = 0;
	for (int e = 0; e < E; e++)
		bal += (double)(count[e + 1] - count[e]) / ((double)N * K) * (sum[e] / N);
	aux[0] = (float)(E * bal);
	aux[1] = (float)(sum[E] / N);
}

/* ---- the router's backward: one thread per token ---- */

template <typename A>
__global__ static void router_backward_kernel(A *dz, const A *z, const float *score,
					      const int32_t *sel, const float *gate,
					      const float *dgate, const int32_t *count, int N,
					      int E, int K, int router, double ca, double cz)
{
	int n = blockIdx.x * blockDim.x + threadIdx.x;
	if (n >= N)
		return;
	const A *zr = z + (size_t)n * E;
	const float *sc = score + (size_t)n * E, *g = gate + (size_t)n * K;
	const float *dg = dgate + (size_t)n * K;
	const int32_t *sl = sel + (size_t)n * K;
	double gd = 0, gsum = 0, dot = 0, norm = 0, fq = 0, sum, lse;
	double NK = (double)N * K;
	float mx = act_ld(zr, 0);

	for (int j = 0; j < K; j++) {
		gd += (double)g[j] * dg[j];
		gsum += sc[sl[j]];
	}
#define DB(j) (K > 1 ? (dg[j] - gd) / gsum : (double)dg[j])
	if (router == 0) {
		for (int j = 0; j < K; j++)
			dot += DB(j) * sc[sl[j]];
		norm = 1.0;
	} else {
		for (int e = 0; e < E; e++)
			norm += sc[e];
	}
	for (int e = 0; e < E; e++)
		fq += (count[e + 1] - count[e]) / NK * sc[e] / norm;
	/* the z-loss's lse in double, as the CPU's backward has it */
	row_lse(zr, E, &sum);
	for (int e = 1; e < E; e++)
		mx = fmaxf(mx, act_ld(zr, e));
	lse = mx + log(sum);
	for (int e = 0; e < E; e++) {
		double s = sc[e], f = (count[e + 1] - count[e]) / NK, t = f - fq;
		float v = router == 0 ? (float)(-s * dot) : 0.0f;
		for (int j = 0; j < K; j++)
			if (sl[j] == e)
				v = router == 0 ? __fadd_rn(v, (float)(s * DB(j)))
						: (float)(DB(j) * s * (1 - s));
		v = __fadd_rn(v, router == 0 ? (float)(ca * s * t)
					     : (float)(ca * t * s * (1 - s) / norm));
		v = __fadd_rn(v, (float)(cz * lse * exp(act_ld(zr, e) - lse)));
		act_st(dz, (size_t)n * E + e, v);
	}
#undef DB
}

/* ---- the table's slots ---- */

static int token_blocks(int N)
{
	return (N + MOE_THREADS - 1) / MOE_THREADS;
}

template <typename A>
static void cu_moe_route(float *score, int32_t *sel, float *gate, const void *z, int N, int E,
			 int K, int router)
{
	if (N <= 0)
		return;
	route_kernel<A><<<token_blocks(N), MOE_THREADS, 0, cuda_stream()>>>(
		score, sel, gate, (const A *)z, N, E, K, router);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_moe_gather(void *xd, const void *x, const int32_t *pos, int N, int K, int C)
{
	if (!N || !K || !C)
		return;
	gather_kernel<A><<<N * K, MOE_THREADS, 0, cuda_stream()>>>((A *)xd, (const A *)x, pos,
								    K, C);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_moe_combine(void *out, const void *y, const float *gate, const int32_t *pos,
			   int N, int K, int C)
{
	if (!N || !C)
		return;
	combine_kernel<A><<<N, MOE_THREADS, 0, cuda_stream()>>>((A *)out, (const A *)y, gate, pos,
								 K, C);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_moe_combine_backward(void *dy, float *dgate, const void *dout, const void *y,
				    const float *gate, const int32_t *pos, int N, int K, int C)
{
	int NK = N * K, per = MOE_THREADS / 32;
	if (NK <= 0)
		return;
	combine_backward_kernel<A><<<(NK + per - 1) / per, MOE_THREADS, 0, cuda_stream()>>>(
		(A *)dy, dgate, (const A *)dout, (const A *)y, gate, pos, K, C, NK);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_moe_aux(float *aux, const void *z, const float *score, const int32_t *count,
		       int N, int E, int K, int router)
{
	cudaStream_t st = cuda_stream();
	double *t = (double *)cuda_scratch(sizeof(double) * ((size_t)N * (E + 1) + E + 1));
	double *sum = t + (size_t)N * (E + 1);

	if (N > 0) {
		aux_token_kernel<A><<<token_blocks(N), MOE_THREADS, 0, st>>>(t, (const A *)z, score,
									     N, E, router);
		CUDA_LAUNCHED();
	}
	aux_colsum_kernel<<<E + 1, MOE_THREADS, 0, st>>>(sum, t, N, E + 1);
	CUDA_LAUNCHED();
	aux_final_kernel<<<1, 1, 0, st>>>(aux, sum, count, N, E, K);
	CUDA_LAUNCHED();
	cuda_scratch_free(t);
}

template <typename A>
static void cu_moe_router_backward(void *dz, const void *z, const float *score,
				   const int32_t *sel, const float *gate, const float *dgate,
				   const int32_t *count, int N, int E, int K, int router,
				   float dloss, float alpha, float beta)
{
	double ca = (double)dloss * alpha * E / N, cz = (double)dloss * beta * 2.0 / N;
	if (N <= 0)
		return;
	router_backward_kernel<A><<<token_blocks(N), MOE_THREADS, 0, cuda_stream()>>>(
		(A *)dz, (const A *)z, score, sel, gate, dgate, count, N, E, K, router, ca, cz);
	CUDA_LAUNCHED();
}

template <typename A> static void fill(struct backend &t)
{
	t.moe_route = cu_moe_route<A>;
	t.moe_dispatch = cu_moe_dispatch;
	t.moe_gather = cu_moe_gather<A>;
	t.moe_combine = cu_moe_combine<A>;
	t.moe_combine_backward = cu_moe_combine_backward<A>;
	t.moe_aux = cu_moe_aux<A>;
	t.moe_router_backward = cu_moe_router_backward<A>;
}

void cuda_moe_slots(struct backend &t, bool bf16)
{
	if (bf16)
		fill<__nv_bfloat16>(t);
	else
		fill<float>(t);
}
