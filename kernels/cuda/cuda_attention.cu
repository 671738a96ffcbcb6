/* cuda_attention.cu - causal attention, flash-style: forward and backward
 * stream over key/query tiles with an online softmax and never hold a T x T
 * matrix. Grouped-query: query head h reads key/value head h / (NH/NKV).
 *
 * Legend: see kernels/backend.h. qkv[N,QKV] rows are [q (NH*HD) | k (NKV*HD)
 * | v (NKV*HD)], row n = b*T + t; out[N,NH*HD]; lse[B,NH,T] (natural log of
 * the sum of exp of the scaled scores). qkv, out, dout and dqkv are
 * activations of type A (float or __nv_bfloat16, cuda_act.h): read widened,
 * written rounded, everything between fp32; lse and D are fp32.
 *
 * fp32 SIMT kernels (HD <= 128, HD even): a block of 4 warps owns 16 queries
 * (or 16 keys), 4 per warp; inside a tile of 32 keys (queries) lane j owns
 * key (query) j for the dot products, and lane d owns output dimensions
 * d, d+32, d+64, d+96 for the accumulations. Shared tiles read by lane index
 * are padded to HD+1 floats per row so the reads hit 32 distinct banks.
 *
 * Backward, deterministic with no atomics: D = rowsum(dout * out); one
 * kernel gives dq by walking keys, another dk and dv by walking the queries
 * of every query head in the key's group. Each recomputes p = exp(s - lse).
 *
 * These are the reference. cuda_flash.cu has the same tiling on bf16 tensor
 * cores; the two entry points below run it unless the SIMT kernels are
 * selected (cuda_flash.h: ASYNCPP_ATTENTION=simt) or it does not take the
 * shape. With ASYNCPP_ATTENTION=cudnn, cuDNN's fused attention
 * (cuda_cudnn.h) is tried first and the flash kernels run whatever it
 * declines.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "cuda_act.h"
#include "cuda_common.h"
#include "cuda_cudnn.h"
#include "cuda_flash.h"

#define ATT_Q 16      /* queries (keys) per block */
#define ATT_TILE 32   /* keys (queries) per tile: one per lane */
#define ATT_THREADS 128
#define ATT_MAXD 4    /* HD <= 32 * ATT_MAXD */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ static inline float att_warp_sum(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, o);
	return x;
}

__device__ static inline float att_warp_max(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
	return x;
}

/* ---- forward ---- */

template <typename A>
__global__ static void attention_forward_kernel(A *out, float *lse, const A *qkv, int T, int NH,
						int NKV, int HD, float scale2)
{
	extern __shared__ float smem[];
	float *Qs = smem;                          /* [ATT_Q][HD] */
	float *Ks = Qs + ATT_Q * HD;               /* [ATT_TILE][HD+1] */
	float *Vs = Ks + ATT_TILE * (HD + 1);      /* [ATT_TILE][HD] */
	int q0 = blockIdx.x * ATT_Q, h = blockIdx.y, b = blockIdx.z;
	int kvh = h / (NH / NKV);
	int QKV = (NH + 2 * NKV) * HD;
	int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
	const A *base = qkv + (size_t)b * T * QKV;
	int koff = NH * HD + kvh * HD, voff = (NH + NKV) * HD + kvh * HD;

	for (int i = tid; i < ATT_Q * HD; i += ATT_THREADS) {
		int qi = i / HD, d = i % HD, t = q0 + qi;
		Qs[i] = t < T ? act_ld(base, (size_t)t * QKV + h * HD + d) : 0.0f;
	}
	float m[4], l[4], acc[4][ATT_MAXD];
	int tq[4];
#pragma unroll
	for (int r = 0; r < 4; r++) {
		m[r] = -INFINITY;
		l[r] = 0;
		tq[r] = min(q0 + w * 4 + r, T - 1); /* rows past T compute, never write */
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++)
			acc[r][k] = 0;
	}
	int kend = min(T, q0 + ATT_Q);
	for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
		__syncthreads();
		for (int i = tid; i < ATT_TILE * HD; i += ATT_THREADS) {
			int j = i / HD, d = i % HD, t = k0 + j;
			int ok = t < T;
			Ks[j * (HD + 1) + d] = ok ? act_ld(base, (size_t)t * QKV + koff + d) : 0.0f;
			Vs[j * HD + d] = ok ? act_ld(base, (size_t)t * QKV + voff + d) : 0.0f;
		}
		__syncthreads();
		if (k0 > tq[3] && k0 > tq[0])
			continue; /* the whole tile is in this warp's future */
		/* lane j: scores of key k0+j against the warp's 4 queries */
		float s[4] = {0, 0, 0, 0};
		const float *kr = Ks + lane * (HD + 1);
		const float *qr = Qs + (w * 4) * HD;
		for (int d = 0; d < HD; d++) {
			float kv = kr[d];
#pragma unroll
			for (int r = 0; r < 4; r++)
				s[r] += qr[r * HD + d] * kv;
		}
		float p[4];
#pragma unroll
		for (int r = 0; r < 4; r++) {
			float sc = (k0 + lane <= tq[r]) ? s[r] * scale2 : -INFINITY;
			float mnew = fmaxf(m[r], att_warp_max(sc));
			/* key 0 is always visible, so mnew is finite from tile 0 on */
			float corr = exp2f(m[r] - mnew);
			p[r] = exp2f(sc - mnew);
			l[r] = l[r] * corr + att_warp_sum(p[r]);
			m[r] = mnew;
#pragma unroll
			for (int k = 0; k < ATT_MAXD; k++)
				acc[r][k] *= corr;
		}
		for (int jj = 0; jj < ATT_TILE; jj++) {
			float v[ATT_MAXD];
#pragma unroll
			for (int k = 0; k < ATT_MAXD; k++) {
				int d = lane + 32 * k;
				v[k] = d < HD ? Vs[jj * HD + d] : 0.0f;
			}
#pragma unroll
			for (int r = 0; r < 4; r++) {
				float pj = __shfl_sync(0xffffffffu, p[r], jj);
#pragma unroll
				for (int k = 0; k < ATT_MAXD; k++)
					acc[r][k] += pj * v[k];
			}
		}
	}
	int C = NH * HD;
#pragma unroll
	for (int r = 0; r < 4; r++) {
		int t = q0 + w * 4 + r;
		if (t >= T)
			continue;
		float inv = 1.0f / l[r];
		A *o = out + ((size_t)b * T + t) * C + h * HD;
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++) {
			int d = lane + 32 * k;
			if (d < HD)
				act_st(o, d, acc[r][k] * inv);
		}
		if (lane == 0)
			lse[((size_t)b * NH + h) * T + t] = (m[r] + log2f(l[r])) * LN2;
	}
}

static void check_shape(int NH, int NKV, int HD)
{
	if (HD <= 0 || HD > 32 * ATT_MAXD || HD % 2 || NKV <= 0 || NH % NKV)
		cuda_fatal(__FILE__, __LINE__,
			   "attention: unsupported shape NH=%d NKV=%d HD=%d (need HD even, "
			   "<= %d, NH a multiple of NKV)", NH, NKV, HD, 32 * ATT_MAXD);
}

static void launch_setup(const void *kernel, size_t smem)
{
	CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
}

template <typename A>
static void attention_forward(A *out, float *lse, const A *qkv, int B, int T, int NH, int NKV,
			      int HD)
{
	if (B <= 0 || T <= 0)
		return;
	if (cuda_attention_impl() == CUDA_ATTENTION_CUDNN &&
	    cuda_cudnn_attention_forward(out, lse, qkv, B, T, NH, NKV, HD) == 0)
		return;
	if (cuda_attention_impl() != CUDA_ATTENTION_SIMT && cuda_flash_supported(NH, NKV, HD)) {
		cuda_flash_forward(out, lse, qkv, B, T, NH, NKV, HD);
		return;
	}
	check_shape(NH, NKV, HD);
	size_t smem = (size_t)(ATT_Q * HD + ATT_TILE * (HD + 1) + ATT_TILE * HD) * sizeof(float);
	launch_setup((const void *)attention_forward_kernel<A>, smem);
	dim3 grid((T + ATT_Q - 1) / ATT_Q, NH, B);
	float scale2 = LOG2E / sqrtf((float)HD);
	attention_forward_kernel<A><<<grid, ATT_THREADS, smem, cuda_stream()>>>(
		out, lse, qkv, T, NH, NKV, HD, scale2);
	CUDA_LAUNCHED();
}

void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
			    int NKV, int HD)
{
	attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
}

void cuda_attention_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B,
			    int T, int NH, int NKV, int HD)
{
	attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
}

/* ---- backward ---- */

/* Dd[b,h,t] = sum_d dout[n, h*HD + d] * out[n, h*HD + d]: one warp each */
template <typename A>
__global__ static void attention_delta_kernel(float *Dd, const A *dout, const A *out, int B, int T,
					      int NH, int HD)
{
	int lane = threadIdx.x & 31;
	size_t rows = (size_t)B * NH * T, nwarps = (size_t)gridDim.x * blockDim.x / 32;
	for (size_t wid = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; wid < rows;
	     wid += nwarps) {
		int t = (int)(wid % T), h = (int)(wid / T % NH), b = (int)(wid / T / NH);
		size_t off = ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
		float s = 0;
		for (int d = lane; d < HD; d += 32)
			s += act_ld(dout, off + d) * act_ld(out, off + d);
		s = att_warp_sum(s);
		if (lane == 0)
			Dd[wid] = s; /* wid = (b*NH + h)*T + t */
	}
}

template <typename A>
static void attention_delta(float *Dd, const A *dout, const A *out, int B, int T, int NH, int HD)
{
	size_t rows = (size_t)B * NH * T;
	attention_delta_kernel<A><<<cuda_blocks(rows * 32, 256), 256, 0, cuda_stream()>>>(
		Dd, dout, out, B, T, NH, HD);
	CUDA_LAUNCHED();
}

void cuda_attention_delta(float *Dd, const float *dout, const float *out, int B, int T, int NH,
			  int HD)
{
	attention_delta(Dd, dout, out, B, T, NH, HD);
}

void cuda_attention_delta(float *Dd, const __nv_bfloat16 *dout, const __nv_bfloat16 *out, int B,
			  int T, int NH, int HD)
{
	attention_delta(Dd, dout, out, B, T, NH, HD);
}

/* dq for 16 queries of head h: sum over visible keys j of ds_ij * k_j * scale,
 * ds = p * (dp - D), p = exp(s*scale - lse), dp = dout_i . v_j */
template <typename A>
__global__ static void attention_dq_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse,
					   const float *Dd, int T, int NH, int NKV, int HD,
					   float scale)
{
	extern __shared__ float smem[];
	float *Qs = smem;                          /* [ATT_Q][HD] */
	float *Os = Qs + ATT_Q * HD;               /* [ATT_Q][HD] dout */
	float *Ks = Os + ATT_Q * HD;               /* [ATT_TILE][HD+1] */
	float *Vs = Ks + ATT_TILE * (HD + 1);      /* [ATT_TILE][HD+1] */
	int q0 = blockIdx.x * ATT_Q, h = blockIdx.y, b = blockIdx.z;
	int kvh = h / (NH / NKV);
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
	const A *base = qkv + (size_t)b * T * QKV;
	int koff = NH * HD + kvh * HD, voff = (NH + NKV) * HD + kvh * HD;
	float scale2 = scale * LOG2E;

	for (int i = tid; i < ATT_Q * HD; i += ATT_THREADS) {
		int qi = i / HD, d = i % HD, t = q0 + qi;
		int ok = t < T;
		Qs[i] = ok ? act_ld(base, (size_t)t * QKV + h * HD + d) : 0.0f;
		Os[i] = ok ? act_ld(dout, ((size_t)b * T + t) * C + h * HD + d) : 0.0f;
	}
	int tq[4];
	float lse2[4], D[4], dq[4][ATT_MAXD];
#pragma unroll
	for (int r = 0; r < 4; r++) {
		tq[r] = min(q0 + w * 4 + r, T - 1);
		size_t li = ((size_t)b * NH + h) * T + tq[r];
		lse2[r] = lse[li] * LOG2E;
		D[r] = Dd[li];
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++)
			dq[r][k] = 0;
	}
	int kend = min(T, q0 + ATT_Q);
	for (int k0 = 0; k0 < kend; k0 += ATT_TILE) {
		__syncthreads();
		for (int i = tid; i < ATT_TILE * HD; i += ATT_THREADS) {
			int j = i / HD, d = i % HD, t = k0 + j;
			int ok = t < T;
			Ks[j * (HD + 1) + d] = ok ? act_ld(base, (size_t)t * QKV + koff + d) : 0.0f;
			Vs[j * (HD + 1) + d] = ok ? act_ld(base, (size_t)t * QKV + voff + d) : 0.0f;
		}
		__syncthreads();
		if (k0 > tq[3] && k0 > tq[0])
			continue;
		float s[4] = {0, 0, 0, 0}, dp[4] = {0, 0, 0, 0};
		const float *kr = Ks + lane * (HD + 1), *vr = Vs + lane * (HD + 1);
		const float *qr = Qs + (w * 4) * HD, *orow = Os + (w * 4) * HD;
		for (int d = 0; d < HD; d++) {
			float kv = kr[d], vv = vr[d];
#pragma unroll
			for (int r = 0; r < 4; r++) {
				s[r] += qr[r * HD + d] * kv;
				dp[r] += orow[r * HD + d] * vv;
			}
		}
		float ds[4];
#pragma unroll
		for (int r = 0; r < 4; r++) {
			float p = (k0 + lane <= tq[r]) ? exp2f(s[r] * scale2 - lse2[r]) : 0.0f;
			ds[r] = p * (dp[r] - D[r]);
		}
		for (int jj = 0; jj < ATT_TILE; jj++) {
			float kv[ATT_MAXD];
#pragma unroll
			for (int k = 0; k < ATT_MAXD; k++) {
				int d = lane + 32 * k;
				kv[k] = d < HD ? Ks[jj * (HD + 1) + d] : 0.0f;
			}
#pragma unroll
			for (int r = 0; r < 4; r++) {
				float dsj = __shfl_sync(0xffffffffu, ds[r], jj);
#pragma unroll
				for (int k = 0; k < ATT_MAXD; k++)
					dq[r][k] += dsj * kv[k];
			}
		}
	}
#pragma unroll
	for (int r = 0; r < 4; r++) {
		int t = q0 + w * 4 + r;
		if (t >= T)
			continue;
		A *o = dqkv + ((size_t)b * T + t) * QKV + h * HD;
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++) {
			int d = lane + 32 * k;
			if (d < HD)
				act_st(o, d, dq[r][k] * scale);
		}
	}
}

/* dk, dv for 16 keys of kv head kvh: sums over every query head of the group
 * and every query i >= j: dv_j += p_ij dout_i, dk_j += ds_ij q_i * scale */
template <typename A>
__global__ static void attention_dkv_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse,
					    const float *Dd, int T, int NH, int NKV, int HD,
					    float scale)
{
	extern __shared__ float smem[];
	float *Ks = smem;                          /* [ATT_Q][HD] this block's keys */
	float *Vs = Ks + ATT_Q * HD;               /* [ATT_Q][HD] */
	float *Qs = Vs + ATT_Q * HD;               /* [ATT_TILE][HD+1] */
	float *Os = Qs + ATT_TILE * (HD + 1);      /* [ATT_TILE][HD+1] dout */
	float *L2 = Os + ATT_TILE * (HD + 1);      /* [ATT_TILE] lse * log2(e) */
	float *Ds = L2 + ATT_TILE;                 /* [ATT_TILE] */
	int k0 = blockIdx.x * ATT_Q, kvh = blockIdx.y, b = blockIdx.z;
	int G = NH / NKV;
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	int tid = threadIdx.x, lane = tid & 31, w = tid / 32;
	const A *base = qkv + (size_t)b * T * QKV;
	int koff = NH * HD + kvh * HD, voff = (NH + NKV) * HD + kvh * HD;
	float scale2 = scale * LOG2E;

	for (int i = tid; i < ATT_Q * HD; i += ATT_THREADS) {
		int j = i / HD, d = i % HD, t = k0 + j;
		int ok = t < T;
		Ks[i] = ok ? act_ld(base, (size_t)t * QKV + koff + d) : 0.0f;
		Vs[i] = ok ? act_ld(base, (size_t)t * QKV + voff + d) : 0.0f;
	}
	int tk[4];
	float dk[4][ATT_MAXD], dv[4][ATT_MAXD];
#pragma unroll
	for (int r = 0; r < 4; r++) {
		tk[r] = k0 + w * 4 + r;
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++)
			dk[r][k] = dv[r][k] = 0;
	}
	for (int g = 0; g < G; g++) {
		int h = kvh * G + g;
		for (int qs = k0; qs < T; qs += ATT_TILE) {
			__syncthreads();
			for (int i = tid; i < ATT_TILE * HD; i += ATT_THREADS) {
				int qi = i / HD, d = i % HD, t = qs + qi;
				int ok = t < T;
				Qs[qi * (HD + 1) + d] =
					ok ? act_ld(base, (size_t)t * QKV + h * HD + d) : 0.0f;
				size_t oi = ((size_t)b * T + t) * C + h * HD + d;
				Os[qi * (HD + 1) + d] = ok ? act_ld(dout, oi) : 0.0f;
			}
			if (tid < ATT_TILE) {
				int t = qs + tid;
				size_t li = ((size_t)b * NH + h) * T + (t < T ? t : T - 1);
				L2[tid] = lse[li] * LOG2E;
				Ds[tid] = Dd[li];
			}
			__syncthreads();
			/* lane i: query qs+i against the warp's 4 keys */
			float s[4] = {0, 0, 0, 0}, dp[4] = {0, 0, 0, 0};
			const float *qr = Qs + lane * (HD + 1), *orow = Os + lane * (HD + 1);
			const float *kr = Ks + (w * 4) * HD, *vr = Vs + (w * 4) * HD;
			for (int d = 0; d < HD; d++) {
				float qv = qr[d], ov = orow[d];
#pragma unroll
				for (int r = 0; r < 4; r++) {
					s[r] += kr[r * HD + d] * qv;
					dp[r] += vr[r * HD + d] * ov;
				}
			}
			int ti = qs + lane;
			float p[4], ds[4];
#pragma unroll
			for (int r = 0; r < 4; r++) {
				int vis = ti < T && ti >= tk[r];
				p[r] = vis ? exp2f(s[r] * scale2 - L2[lane]) : 0.0f;
				ds[r] = p[r] * (dp[r] - Ds[lane]);
			}
			for (int ii = 0; ii < ATT_TILE; ii++) {
				float qv[ATT_MAXD], ov[ATT_MAXD];
#pragma unroll
				for (int k = 0; k < ATT_MAXD; k++) {
					int d = lane + 32 * k;
					qv[k] = d < HD ? Qs[ii * (HD + 1) + d] : 0.0f;
					ov[k] = d < HD ? Os[ii * (HD + 1) + d] : 0.0f;
				}
#pragma unroll
				for (int r = 0; r < 4; r++) {
					float pj = __shfl_sync(0xffffffffu, p[r], ii);
					float dsj = __shfl_sync(0xffffffffu, ds[r], ii);
#pragma unroll
					for (int k = 0; k < ATT_MAXD; k++) {
						dv[r][k] += pj * ov[k];
						dk[r][k] += dsj * qv[k];
					}
				}
			}
		}
	}
#pragma unroll
	for (int r = 0; r < 4; r++) {
		int t = tk[r];
		if (t >= T)
			continue;
		A *row = dqkv + ((size_t)b * T + t) * QKV;
#pragma unroll
		for (int k = 0; k < ATT_MAXD; k++) {
			int d = lane + 32 * k;
			if (d < HD) {
				act_st(row, koff + d, dk[r][k] * scale);
				act_st(row, voff + d, dv[r][k]);
			}
		}
	}
}

template <typename A>
static void attention_backward(A *dqkv, const A *dout, const A *qkv, const A *out,
			       const float *lse, int B, int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return;
	if (cuda_attention_impl() == CUDA_ATTENTION_CUDNN &&
	    cuda_cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD) == 0)
		return;
	if (cuda_attention_impl() != CUDA_ATTENTION_SIMT && cuda_flash_supported(NH, NKV, HD)) {
		cuda_flash_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
		return;
	}
	check_shape(NH, NKV, HD);
	float scale = 1.0f / sqrtf((float)HD);
	size_t rows = (size_t)B * NH * T;
	float *Dd = (float *)cuda_scratch(rows * sizeof(float));
	cuda_attention_delta(Dd, dout, out, B, T, NH, HD);

	size_t smem_q = (size_t)(2 * ATT_Q * HD + 2 * ATT_TILE * (HD + 1)) * sizeof(float);
	launch_setup((const void *)attention_dq_kernel<A>, smem_q);
	dim3 gq((T + ATT_Q - 1) / ATT_Q, NH, B);
	attention_dq_kernel<A><<<gq, ATT_THREADS, smem_q, cuda_stream()>>>(
		dqkv, dout, qkv, lse, Dd, T, NH, NKV, HD, scale);
	CUDA_LAUNCHED();

	size_t smem_kv = (size_t)(2 * ATT_Q * HD + 2 * ATT_TILE * (HD + 1) + 2 * ATT_TILE) *
			 sizeof(float);
	launch_setup((const void *)attention_dkv_kernel<A>, smem_kv);
	dim3 gkv((T + ATT_Q - 1) / ATT_Q, NKV, B);
	attention_dkv_kernel<A><<<gkv, ATT_THREADS, smem_kv, cuda_stream()>>>(
		dqkv, dout, qkv, lse, Dd, T, NH, NKV, HD, scale);
	CUDA_LAUNCHED();
	cuda_scratch_free(Dd);
}

void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
			     const float *lse, int B, int T, int NH, int NKV, int HD)
{
	attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}

void cuda_attention_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
			     const __nv_bfloat16 *qkv, const __nv_bfloat16 *out, const float *lse,
			     int B, int T, int NH, int NKV, int HD)
{
	attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}
