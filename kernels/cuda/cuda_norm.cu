/* cuda_norm.cu - LayerNorm and RMSNorm (with the fused residual add),
 * forward and backward, and the column sums that give the norms' and the
 * products' weight and bias gradients; every sum in a fixed order.
 *
 * Legend: see kernels/backend.h (N = B*T rows of C). */
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

/* the sum over a warp's 32 lanes, in a fixed butterfly */

__device__ static inline float warp_sum(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, o);
	return x;
}


/* Column sums for weight/bias gradients, in a fixed order (A: the storage
 * type of dout and inp, cuda_act.h; the sums are float):
 * rows are cut into chunks of COLSUM_ROWS; block (x: 32 x V columns, y:
 * chunk) sums its chunk with 8 row-strided threads per column, combined in
 * order; a second kernel adds the chunk partials in chunk order.
 *   pw[chunk,C] = sum dout * xhat, xhat = (inp - mean) * rstd (pw non-NULL;
 *                 mean NULL means 0, as for RMSNorm)
 *   pb[chunk,C] = sum dout (pb non-NULL)
 * A thread sums V neighbouring columns (V = 8 bytes of A: one load per row
 * instead of V) when the rows allow it, else one; each column's sum is the
 * same sequence of additions either way, so the bits never depend on
 * where a buffer sits. */
#define COLSUM_ROWS 256

/* V elements of A at p (8-byte aligned) as floats */
template <typename A, int V> __device__ static __forceinline__ void ld8(float *out, const A *p)
{
	static_assert(sizeof(A) * V == 8, "8 bytes");
	uint2 u = *reinterpret_cast<const uint2 *>(p);
	const A *e = reinterpret_cast<const A *>(&u);
#pragma unroll
	for (int v = 0; v < V; v++)
		out[v] = act_ld(e, v);
}

template <typename A, int V>
__global__ static void colsum_partial_kernel(float *pw, float *pb, const A *dout, const A *inp,
					     const float *mean, const float *rstd, int N, int C)
{
	/* [ty][v * 32 + tx]: a warp's 32 lanes on 32 banks */
	__shared__ float shw[8][32 * V], shb[8][32 * V];
	int tx = threadIdx.x, ty = threadIdx.y;
	int c = (blockIdx.x * 32 + tx) * V; /* the first of this thread's V columns */
	int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(r0 + COLSUM_ROWS, N);
	float sw[V], sb[V];
#pragma unroll
	for (int v = 0; v < V; v++)
		sw[v] = sb[v] = 0;
	if (c < C) { /* V > 1 only when C % V == 0: all V columns exist */
		for (int r = r0 + ty; r < r1; r += 8) {
			float d[V], x[V];
			if constexpr (V == 1)
				d[0] = act_ld(dout, (size_t)r * C + c);
			else
				ld8<A, V>(d, dout + (size_t)r * C + c);
			if (pw) {
				if constexpr (V == 1)
					x[0] = act_ld(inp, (size_t)r * C + c);
				else
					ld8<A, V>(x, inp + (size_t)r * C + c);
			}
#pragma unroll
			for (int v = 0; v < V; v++) {
				if (pw) {
					float m = mean ? mean[r] : 0.0f;
					sw[v] += d[v] * ((x[v] - m) * rstd[r]);
				}
				sb[v] += d[v];
			}
		}
	}
#pragma unroll
	for (int v = 0; v < V; v++) {
		shw[ty][v * 32 + tx] = sw[v];
		shb[ty][v * 32 + tx] = sb[v];
	}
	__syncthreads();
	if (ty == 0 && c < C) {
#pragma unroll
		for (int v = 0; v < V; v++) {
			float aw = 0, ab = 0;
			for (int k = 0; k < 8; k++) {
				aw += shw[k][v * 32 + tx];
				ab += shb[k][v * 32 + tx];
			}
			if (pw)
				pw[(size_t)blockIdx.y * C + c + v] = aw;
			if (pb)
				pb[(size_t)blockIdx.y * C + c + v] = ab;
		}
	}
}

__global__ static void colsum_final_kernel(float *dw, float *db, const float *pw,
					   const float *pb, int nchunks, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	float aw = 0, ab = 0;
	for (int k = 0; k < nchunks; k++) {
		if (pw)
			aw += pw[(size_t)k * C + c];
		if (pb)
			ab += pb[(size_t)k * C + c];
	}
	if (dw)
		dw[c] += aw;
	if (db)
		db[c] += ab;
}

/* Whether colsums may read 8 bytes at a time: every row starts 8-byte
 * aligned. ASYNCPP_COLSUM=scalar (read at each call) forces one column per
 * thread, for timing the two; test_cuda_ops cuda_colsum_offsets proves the
 * same bits with buffers one element off. */
template <typename A> static bool colsum_vec(const A *dout, const A *inp, int C)
{
	const char *env = getenv("ASYNCPP_COLSUM");
	if (env && !strcmp(env, "scalar"))
		return false;
	const int V = 8 / (int)sizeof(A);
	return C % V == 0 && (uintptr_t)dout % 8 == 0 && (uintptr_t)inp % 8 == 0;
}

/* dw[C] += sum dout*xhat (if dw), db[C] += sum dout (if db); dout[N,C],
 * inp[N,C] (A), mean[N], rstd[N]. */
template <typename A>
static void colsums(float *dw, float *db, const A *dout, const A *inp, const float *mean,
		    const float *rstd, int N, int C)
{
	if (N <= 0 || C <= 0 || (!dw && !db))
		return;
	int nchunks = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
	size_t sz = (size_t)nchunks * C * sizeof(float);
	float *pw = dw ? (float *)cuda_scratch(sz) : NULL;
	float *pb = db ? (float *)cuda_scratch(sz) : NULL;
	constexpr int V = 8 / (int)sizeof(A);
	dim3 block(32, 8);
	if (colsum_vec(dout, dw ? inp : dout, C)) {
		dim3 grid((C / V + 31) / 32, nchunks);
		colsum_partial_kernel<A, V><<<grid, block, 0, cuda_stream()>>>(pw, pb, dout, inp,
									       mean, rstd, N, C);
	} else {
		dim3 grid((C + 31) / 32, nchunks);
		colsum_partial_kernel<A, 1><<<grid, block, 0, cuda_stream()>>>(pw, pb, dout, inp,
									       mean, rstd, N, C);
	}
	CUDA_LAUNCHED();
	colsum_final_kernel<<<(C + 255) / 256, 256, 0, cuda_stream()>>>(dw, db, pw, pb, nchunks, C);
	CUDA_LAUNCHED();
	cuda_scratch_free(pw);
	cuda_scratch_free(pb);
}

void cuda_colsum_acc(float *dst, const float *x, int N, int C)
{
	colsums<float>(NULL, dst, x, NULL, NULL, NULL, N, C);
}

void cuda_colsum_acc(float *dst, const __nv_bfloat16 *x, int N, int C)
{
	colsums<__nv_bfloat16>(NULL, dst, x, NULL, NULL, NULL, N, C);
}


/* ------------------------------------------------------------------ */
/* normalisation: one warp per row                                      */

/* LayerNorm when is_ln is set (mean subtracted), RMSNorm otherwise (mean
 * NULL). w NULL means weight 1, b NULL bias 0 (backend.h). RES: inp is
 * first made as ra + rb (add_op's arithmetic, stored into inp), the
 * fused add_norm_forward; each lane then reads back only elements it wrote
 * itself, so no barrier is needed, and the rest is the same code, so the
 * same bits as the two kernels. */
template <typename A, bool RES>
__global__ static void norm_forward_kernel(A *out, float *mean, float *rstd, A *inp,
					   const A *ra, const A *rb, const float *w,
					   const float *b, int N, int C, float eps, int is_ln)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	if (row >= N)
		return;
	if (RES) {
		A *r = inp + (size_t)row * C;
		const A *xa = ra + (size_t)row * C, *xb = rb + (size_t)row * C;
		for (int c = lane; c < C; c += 32)
			act_st(r, c, act_ld(xa, c) + act_ld(xb, c));
	}
	const A *x = inp + (size_t)row * C;
	float m = 0;
	if (is_ln) {
		float s = 0;
		for (int c = lane; c < C; c += 32)
			s += act_ld(x, c);
		m = warp_sum(s) / C;
	}
	float v = 0;
	for (int c = lane; c < C; c += 32) {
		float d = act_ld(x, c) - m;
		v += d * d;
	}
	float rs = rsqrtf(warp_sum(v) / C + eps);
	A *o = out + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float y = (act_ld(x, c) - m) * rs * (w ? w[c] : 1.0f);
		if (b)
			y += b[c];
		act_st(o, c, y);
	}
	if (lane == 0) {
		if (mean)
			mean[row] = m;
		if (rstd)
			rstd[row] = rs;
	}
}

/* dinp = rstd * (dnorm - [mean(dnorm)] - xhat * mean(dnorm * xhat)),
 * dnorm = dout * w (w NULL: 1); the bracketed term only for LayerNorm (mean
 * non-NULL). ACC: dinp += that, as stored and then added by add_op
 * (norm_backward_add). */
template <typename A, bool ACC>
__global__ static void norm_backward_dx_kernel(A *dinp, const A *dout, const A *inp,
					       const float *w, const float *mean,
					       const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	if (row >= N)
		return;
	const A *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
	float m = mean ? mean[row] : 0.0f, rs = rstd[row];
	float s1 = 0, s2 = 0;
	for (int c = lane; c < C; c += 32) {
		float dn = act_ld(dy, c) * (w ? w[c] : 1.0f);
		s1 += dn;
		s2 += dn * ((act_ld(x, c) - m) * rs);
	}
	s1 = mean ? warp_sum(s1) / C : 0.0f;
	s2 = warp_sum(s2) / C;
	A *dx = dinp + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float dn = act_ld(dy, c) * (w ? w[c] : 1.0f);
		float xh = (act_ld(x, c) - m) * rs;
		float d = (dn - s1 - xh * s2) * rs;
		if (ACC) /* __fadd_rn: never contracted with d's multiply into an
			  * fma, which would round once where the ops apart round
			  * twice (f32) */
			act_st(dx, c, __fadd_rn(act_ld(dx, c), act_rt(dx, d)));
		else
			act_st(dx, c, d);
	}
}

#define NORM_ROWS_PER_BLOCK 8

/* The forward of either norm, res = a + b first when RES (a, b non-NULL). */
template <typename A>
static void norm_forward(A *out, float *mean, float *rstd, A *inp, const A *a, const A *b,
			 const float *w, const float *bias, int N, int C, float eps, int is_ln)
{
	int nb = (N + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK;
	if (a)
		norm_forward_kernel<A, true><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			out, mean, rstd, inp, a, b, w, bias, N, C, eps, is_ln);
	else
		norm_forward_kernel<A, false><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			out, mean, rstd, inp, NULL, NULL, w, bias, N, C, eps, is_ln);
	CUDA_LAUNCHED();
}

/* The backward of either norm (mean NULL: RMSNorm): dw, db, then dinp
 * stored, or added into it (acc). */
template <typename A>
static void norm_backward(A *dinp, float *dw, float *db, const A *dout, const A *inp,
			  const float *w, const float *mean, const float *rstd, int N, int C,
			  bool acc)
{
	/* weight/bias gradients first: dinp may alias dout */
	colsums(dw, db, dout, inp, mean, rstd, N, C);
	int nb = (N + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK;
	if (!dinp)
		return;
	if (acc)
		norm_backward_dx_kernel<A, true><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			dinp, dout, inp, w, mean, rstd, N, C);
	else
		norm_backward_dx_kernel<A, false><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			dinp, dout, inp, w, mean, rstd, N, C);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_layernorm_forward(A *out, float *mean, float *rstd, const A *inp, const float *w,
				 const float *b, int N, int C, float eps)
{
	norm_forward<A>(out, mean, rstd, (A *)inp, NULL, NULL, w, b, N, C, eps, 1);
}

template <typename A>
static void cu_layernorm_backward(A *dinp, float *dw, float *db, const A *dout, const A *inp,
				  const float *w, const float *mean, const float *rstd, int N,
				  int C)
{
	norm_backward<A>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, false);
}

template <typename A>
static void cu_rmsnorm_forward(A *out, float *rstd, const A *inp, const float *w, int N, int C,
			       float eps)
{
	norm_forward<A>(out, NULL, rstd, (A *)inp, NULL, NULL, w, NULL, N, C, eps, 0);
}

template <typename A>
static void cu_rmsnorm_backward(A *dinp, float *dw, const A *dout, const A *inp, const float *w,
				const float *rstd, int N, int C)
{
	norm_backward<A>(dinp, dw, NULL, dout, inp, w, NULL, rstd, N, C, false);
}

/* the fused forms (backend.h): the same kernels with RES / ACC */
template <typename A>
static void cu_add_norm_forward(A *res, A *out, float *mean, float *rstd, const A *a, const A *b,
				const float *w, const float *bias, int N, int C, float eps,
				int is_ln)
{
	norm_forward<A>(out, is_ln ? mean : NULL, rstd, res, a, b, w, is_ln ? bias : NULL, N, C,
			eps, is_ln);
}

template <typename A>
static void cu_norm_backward_add(A *dacc, float *dw, float *db, const A *dout, const A *inp,
				 const float *w, const float *mean, const float *rstd, int N,
				 int C, int is_ln)
{
	norm_backward<A>(dacc, dw, is_ln ? db : NULL, dout, inp, w, is_ln ? mean : NULL, rstd, N,
			 C, true);
}


/* ------------------------------------------------------------------ */
/* the table's slots: activations travel as void * in the table's       */
/* act_dtype (float or __nv_bfloat16: A)                                 */

template <typename A>
static void act_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
				  const float *w, const float *b, int N, int C, float eps)
{
	cu_layernorm_forward((A *)out, mean, rstd, (const A *)inp, w, b, N, C, eps);
}

template <typename A>
static void act_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
				   const void *inp, const float *w, const float *mean,
				   const float *rstd, int N, int C)
{
	cu_layernorm_backward((A *)dinp, dw, db, (const A *)dout, (const A *)inp, w, mean, rstd, N,
			      C);
}

template <typename A>
static void act_add_norm_forward(void *res, void *out, float *mean, float *rstd, const void *a,
				 const void *b, const float *w, const float *bias, int N, int C,
				 float eps, int is_ln)
{
	cu_add_norm_forward((A *)res, (A *)out, mean, rstd, (const A *)a, (const A *)b, w, bias, N,
			    C, eps, is_ln);
}

template <typename A>
static void act_norm_backward_add(void *dacc, float *dw, float *db, const void *dout,
				  const void *inp, const float *w, const float *mean,
				  const float *rstd, int N, int C, int is_ln)
{
	cu_norm_backward_add((A *)dacc, dw, db, (const A *)dout, (const A *)inp, w, mean, rstd, N,
			     C, is_ln);
}

template <typename A>
static void act_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, int N,
				int C, float eps)
{
	cu_rmsnorm_forward((A *)out, rstd, (const A *)inp, w, N, C, eps);
}

template <typename A>
static void act_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
				 const float *w, const float *rstd, int N, int C)
{
	cu_rmsnorm_backward((A *)dinp, dw, (const A *)dout, (const A *)inp, w, rstd, N, C);
}

template <typename A> static void fill(struct backend &t)
{
	t.layernorm_forward = act_layernorm_forward<A>;
	t.layernorm_backward = act_layernorm_backward<A>;
	t.rmsnorm_forward = act_rmsnorm_forward<A>;
	t.rmsnorm_backward = act_rmsnorm_backward<A>;
	/* ASYNCPP_FUSED_NORM=0 runs the residual adds apart (gpu-check times both) */
	const char *fused = getenv("ASYNCPP_FUSED_NORM");
	bool fuse = !(fused && !strcmp(fused, "0"));
	t.add_norm_forward = fuse ? act_add_norm_forward<A> : NULL;
	t.norm_backward_add = fuse ? act_norm_backward_add<A> : NULL;
}

void cuda_norm_slots(struct backend &t, bool bf16)
{
	if (bf16)
		fill<__nv_bfloat16>(t);
	else
		fill<float>(t);
}
