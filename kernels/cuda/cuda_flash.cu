/* cuda_flash.cu - causal attention on bf16 tensor cores (FlashAttention-2
 * style), forward and a deterministic backward, for HD 64 and 128.
 * cuda_attention.cu keeps the fp32 SIMT kernels as the reference and runs
 * these when they are selected (cuda_attention_impl(), ASYNCPP_ATTENTION).
 *
 * Legend: see kernels/backend.h. qkv[N,QKV] rows are [q (NH*HD) | k (NKV*HD)
 * | v (NKV*HD)], row n = b*T + t; out[N,NH*HD]; lse[B,NH,T] (natural log of
 * the sum of exp of the scaled scores). Query head h reads key/value head
 * h / (NH/NKV). Scale 1/sqrt(HD), causal.
 *
 * Numbers: q, k, v and dout are activations of type A in memory (fp32, or
 * bf16 for the bf16 table: cuda_act.h); fp32 ones are rounded to bf16
 * (nearest even) as their tiles are copied into shared memory, bf16 ones are
 * copied as they are, so bf16 inputs give the fp32 path's bits on the same
 * values. p and ds are rounded to bf16 as the A operand of the second
 * product. out and dqkv are stored as A (rounded once for bf16). Every product runs on
 * mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 (fp32 accumulation); softmax,
 * lse, delta and the outputs are fp32. Scores are pre-scaled by
 * log2(e)/sqrt(HD) so the online softmax uses exp2f.
 *
 * Tiles (all blocks 4 warps, 128 threads; a warp owns 16 rows, the m of one
 * mma): shared tiles are bf16 rows of HD+8 elements (a 16-byte pad, so the
 * 8 rows an ldmatrix phase reads start in 8 different 16-byte bank groups).
 *   forward  block = 64 queries of one (b, h); key tiles of 64 from 0 to the
 *            diagonal. S = Q K^T and O += P V per warp; Q's fragments stay in
 *            registers; P goes from the accumulator layout straight into an
 *            A operand (no shared memory round trip).
 *   dkv      block = 64 keys of one (b, kv head); loops over the query heads
 *            of the group, then over query tiles from the diagonal to T, in
 *            that fixed order. Per warp (16 keys): S^T = K Q^T, dP^T = V dO^T,
 *            P^T = exp2(S^T - lse), dS^T = P^T (dP^T - D), dV += P^T dO,
 *            dK += dS^T Q. No atomics: each key's dk, dv are summed by one warp.
 *   dq       block = 64 queries of one (b, h); key tiles from 0 to the
 *            diagonal: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 *   delta    D = rowsum(dout * out) (cuda_attention_delta, as the SIMT path).
 * So every result is a function of the shape and the inputs only.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16; g = lane/4, t = lane%4):
 *   A (16x16, row) 4 regs: {r g, c 2t..2t+1}, {r g+8, c 2t..}, {r g, c 2t+8..},
 *                          {r g+8, c 2t+8..}; the lower half holds the lower column
 *   B (16x8, col)  2 regs: {k 2t..2t+1, n g}, {k 2t+8..2t+9, n g}
 *   C (16x8)       4 f32:  (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
 * ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, which
 * lands in register i; without .trans a lane gets (row g, cols 2t, 2t+1), with
 * .trans (rows 2t, 2t+1, col g). So, from row-major [row][dim] shared tiles:
 *   A of rows R..R+15, dims D..D+15:     row R + (lane & 15),
 *                                         dim D + (lane >> 4) * 8
 *   B of X^T, n = rows R..R+15 (two n tiles), k = dims D..D+15:
 *                                         row R + (lane & 7) + (lane >> 4) * 8,
 *                                         dim D + ((lane >> 3) & 1) * 8
 *                                         -> regs {0,1} n tile R, {2,3} n tile R+8
 *   B of X (.trans), k = rows R..R+15, n = dims D..D+15 (two n tiles):
 *                                         row R + (lane & 7) + ((lane >> 3) & 1) * 8,
 *                                         dim D + (lane >> 4) * 8
 *                                         -> regs {0,1} n tile D, {2,3} n tile D+8
 * and an accumulator pair of n tiles (2j, 2j+1) is the A operand of k step j:
 *   {c[2j][0], c[2j][1]}, {c[2j][2], c[2j][3]}, {c[2j+1][0], c[2j+1][1]},
 *   {c[2j+1][2], c[2j+1][3]}.
 *
 * kernels/cuda/dev/flash_emulate.cpp runs these kernels on the CPU with a
 * warp emulator (FLASH_EMULATE) against a double reference; see NOTES.md.
 */
#ifndef FLASH_EMULATE
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <atomic>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"
#include "cuda_flash.h"
#else
#include FLASH_EMULATE
#endif
#include "cuda_act.h"

#define FL_THREADS 128
#define FL_ROWS 64 /* rows of a block: 4 warps x 16 */
#define FL_LOG2E 1.4426950408889634f
#define FL_LN2 0.6931471805599453f

typedef __nv_bfloat16 bf16;

/* ---- the few instructions, one helper each ---- */

#ifndef FLASH_EMULATE
__device__ static __forceinline__ unsigned char *fl_smem(void)
{
	extern __shared__ __align__(16) unsigned char fl_smem_[];
	return fl_smem_;
}

/* d = a b + d, m16n8k16, bf16 operands, fp32 accumulators */
__device__ static __forceinline__ void fl_mma(float d[4], const uint32_t a[4], uint32_t b0,
					      uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
	    "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 b16 matrices from shared memory; p is this lane's row address.
 * volatile and "memory": the tiles are rewritten between loads from the
 * same addresses, so these must neither merge nor move across barriers. */
__device__ static __forceinline__ void fl_ldsm(uint32_t r[4], const bf16 *p)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(a)
		     : "memory");
}

__device__ static __forceinline__ void fl_ldsm_t(uint32_t r[4], const bf16 *p)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(a)
		     : "memory");
}

__device__ static __forceinline__ float fl_xor(float x, int m)
{
	return __shfl_xor_sync(0xffffffffu, x, m);
}

/* 16 bytes global -> shared without registers (sm_80+), in the current
 * group; zeros when !valid (src-size 0: nothing is read from g) */
__device__ static __forceinline__ void fl_cp16(void *s, const void *g, bool valid)
{
	uint32_t a = (uint32_t)__cvta_generic_to_shared(s);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g),
		     "r"(valid ? 16 : 0)
		     : "memory");
}

/* close the group of copies issued since the last commit */
__device__ static __forceinline__ void fl_cp_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* wait until at most N committed groups are in flight (this thread's) */
template <int N> __device__ static __forceinline__ void fl_cp_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

/* two fp32 -> one register of two bf16, lo in the lower half */
__device__ static __forceinline__ uint32_t fl_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	uint32_t u;
	memcpy(&u, &v, sizeof(u));
	return u;
}

/* The A operand of k step j from accumulators c[2j], c[2j+1] (16 x 16). */
__device__ static __forceinline__ void fl_acc_to_a(uint32_t a[4], const float c0[4],
						   const float c1[4])
{
	a[0] = fl_pack(c0[0], c0[1]);
	a[1] = fl_pack(c0[2], c0[3]);
	a[2] = fl_pack(c1[0], c1[1]);
	a[3] = fl_pack(c1[2], c1[3]);
}

/* Shared row length in bf16 elements: HD + a 16-byte pad. */
template <int HD> struct fl_ld {
	static const int v = HD + 8;
};

/* Four elements at p as four bf16 in two registers (lowest first), zeros
 * when !valid: fp32 rounded to nearest even, bf16 as stored. vec: one
 * 16-byte (fp32) or 8-byte (bf16) load, else four scalar ones (the same
 * values, hence the bits). */
__device__ static __forceinline__ uint2 fl_load4(const float *p, bool valid, bool vec)
{
	float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	if (valid) {
		if (vec)
			v = __ldg((const float4 *)p);
		else
			v = make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
	}
	uint2 u;
	u.x = fl_pack(v.x, v.y);
	u.y = fl_pack(v.z, v.w);
	return u;
}

__device__ static __forceinline__ uint2 fl_load4(const bf16 *p, bool valid, bool vec)
{
	uint2 u = make_uint2(0u, 0u); /* bf16 zeros */
	if (!valid)
		return u;
	if (vec)
		return __ldg((const uint2 *)p);
	const unsigned short *h = (const unsigned short *)p;
	u.x = (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
	u.y = (uint32_t)__ldg(h + 2) | (uint32_t)__ldg(h + 3) << 16;
	return u;
}

/* Whether rows of activations at p (row strides and head offsets are
 * multiples of HD) allow fl_load4's vector load: 4 elements aligned. */
template <typename A> __device__ static __forceinline__ bool fl_vec(const A *p)
{
	return (uintptr_t)p % (4 * sizeof(A)) == 0;
}

/* rows x HD activations from g (row stride ld elements) into s (bf16, rows
 * of HD+8); rows at or past nvalid are zeros. vec: g and ld allow fl_load4's
 * vector loads. */
template <int HD, int ROWS, typename A>
__device__ static __forceinline__ void fl_load_tile(bf16 *s, const A *g, size_t ld, int nvalid,
						    bool vec)
{
	const int LD = fl_ld<HD>::v, C4 = HD / 4, PER = ROWS * C4 / FL_THREADS;
	static_assert(ROWS * C4 % FL_THREADS == 0, "tile must split evenly over the threads");
	/* unrolled by 4: four 16-byte loads in flight per thread, without the
	 * registers of a whole tile (which cost occupancy; NOTES.md) */
#pragma unroll 4
	for (int it = 0; it < PER; it++) {
		int i = threadIdx.x + it * FL_THREADS, r = i / C4, c = (i % C4) * 4;
		uint2 u = fl_load4(g + (size_t)r * ld + c, r < nvalid, vec);
		*(uint2 *)(s + r * LD + c) = u;
	}
}

/* Double buffering (bf16 activations at 16-byte aligned addresses): the next
 * key (or query) tile is copied with cp.async while the tensor cores work on
 * the current one, each thread its 16-byte pieces, one commit group per tile.
 * fp32 activations are rounded on their way in, so they keep fl_load_tile
 * and one buffer. Row strides and head offsets are multiples of HD elements,
 * so an aligned base keeps every row aligned. */
static __host__ __device__ __forceinline__ bool fl_async(const float *) { return false; }
static __host__ __device__ __forceinline__ bool fl_async(const bf16 *p)
{
	return (uintptr_t)p % 16 == 0;
}
/* whether A has the cp.async kernels at all (a template argument: each
 * instantiation holds one way of loading, so no registers go to the other) */
template <typename A> struct fl_can_async {
	static const bool v = false;
};
template <> struct fl_can_async<bf16> {
	static const bool v = true;
};

/* rows x HD bf16 from g (row stride ld) into s (rows of HD+8), as fl_load_tile
 * but asynchronous: complete after the group's fl_cp_wait and a barrier */
template <int HD, int ROWS>
__device__ static __forceinline__ void fl_cp_tile(bf16 *s, const bf16 *g, size_t ld, int nvalid)
{
	const int LD = fl_ld<HD>::v, C8 = HD / 8, PER = ROWS * C8 / FL_THREADS;
	static_assert(ROWS * C8 % FL_THREADS == 0, "tile must split evenly over the threads");
#pragma unroll
	for (int it = 0; it < PER; it++) {
		int i = threadIdx.x + it * FL_THREADS, r = i / C8, c = (i % C8) * 8;
		bool v = r < nvalid; /* row 0 is always valid: its address stands in */
		fl_cp16(s + r * LD + c, g + (v ? (size_t)r * ld + c : 0), v);
	}
}

/* never called (fl_async is false for fp32); keeps one kernel body */
template <int HD, int ROWS>
__device__ static __forceinline__ void fl_cp_tile(bf16 *, const float *, size_t, int)
{
}

/* ---- forward ---- */

/* grid (ceil(T/64), NH, B); the last query blocks (the most keys) first */
template <int HD, typename A, bool AS>
__global__ static void __launch_bounds__(FL_THREADS)
	flash_forward_kernel(A *out, float *lse, const A *qkv, int T, int NH, int NKV, float scale2)
{
	const bool async = AS; /* tiles by cp.async, double-buffered (fl_async) */
	const int LD = fl_ld<HD>::v, KS = HD / 16, ND = HD / 8;
	const int BUF = 2 * FL_ROWS * LD;     /* one buffer: K then V, [64][LD] each */
	bf16 *Qs = (bf16 *)fl_smem();         /* [64][LD] */
	bf16 *KV = Qs + FL_ROWS * LD;         /* buffer 0; buffer 1 (KV + BUF) when async */
	int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
	int q0 = qb * FL_ROWS, kvh = h / (NH / NKV);
	size_t QKV = (size_t)(NH + 2 * NKV) * HD;
	int C = NH * HD;
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
	const A *base = qkv + (size_t)b * T * QKV;
	size_t koff = (size_t)(NH + kvh) * HD, voff = (size_t)(NH + NKV + kvh) * HD;
	bool vec = fl_vec(qkv);

	if (async) { /* key tile 0 on its way while Q loads */
		fl_cp_tile<HD, FL_ROWS>(KV, base + koff, QKV, T);
		fl_cp_tile<HD, FL_ROWS>(KV + FL_ROWS * LD, base + voff, QKV, T);
		fl_cp_commit();
	}
	fl_load_tile<HD, FL_ROWS>(Qs, base + (size_t)q0 * QKV + (size_t)h * HD, QKV, T - q0, vec);
	__syncthreads();
	uint32_t qf[KS][4];
#pragma unroll
	for (int kk = 0; kk < KS; kk++)
		fl_ldsm(qf[kk], Qs + (w * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);

	float o[ND][4];
#pragma unroll
	for (int d = 0; d < ND; d++)
		o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
	float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
	int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};

	/* key tiles 0..qb: tile qb is the diagonal one (and holds T-1 when
	 * this is the last block); every earlier key is visible to every row */
	for (int kt = 0; kt <= qb; kt++) {
		int k0 = kt * FL_ROWS, cur = async ? kt & 1 : 0;
		const bf16 *Ks = KV + cur * BUF, *Vs = Ks + FL_ROWS * LD;
		if (async) {
			if (kt < qb) { /* the next tile into the other buffer */
				size_t n0 = (size_t)(k0 + FL_ROWS) * QKV;
				bf16 *nk = KV + (cur ^ 1) * BUF;
				fl_cp_tile<HD, FL_ROWS>(nk, base + n0 + koff, QKV, T - k0 - FL_ROWS);
				fl_cp_tile<HD, FL_ROWS>(nk + FL_ROWS * LD, base + n0 + voff, QKV,
							T - k0 - FL_ROWS);
			}
			fl_cp_commit(); /* empty on the last tile: wait<1> stays right */
			fl_cp_wait<1>(); /* this thread's copies of tile kt are in */
			__syncthreads(); /* and everyone's */
		} else {
			__syncthreads(); /* the previous tile's readers are done */
			fl_load_tile<HD, FL_ROWS>(KV, base + (size_t)k0 * QKV + koff, QKV, T - k0, vec);
			fl_load_tile<HD, FL_ROWS>(KV + FL_ROWS * LD, base + (size_t)k0 * QKV + voff, QKV,
						  T - k0, vec);
			__syncthreads();
		}

		float s[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
			s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < KS; kk++)
#pragma unroll
			for (int jp = 0; jp < 4; jp++) {
				uint32_t kb[4];
				fl_ldsm(kb, Ks + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
						    ((lane >> 3) & 1) * 8);
				fl_mma(s[2 * jp], qf[kk], kb[0], kb[1]);
				fl_mma(s[2 * jp + 1], qf[kk], kb[2], kb[3]);
			}

		/* scale to base 2, mask (future keys, keys past T), row maxima */
		float mx[2] = {m[0], m[1]};
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int key = k0 + j * 8 + 2 * t4 + (e & 1), r = row[e >> 1];
				float x = s[j][e] * scale2;
				if (kt == qb && (key > r || key >= T))
					x = -INFINITY;
				s[j][e] = x;
				mx[e >> 1] = fmaxf(mx[e >> 1], x);
			}
		float corr[2];
#pragma unroll
		for (int r = 0; r < 2; r++) {
			/* the 4 lanes of a quad hold the 64 scores of a row */
			mx[r] = fmaxf(mx[r], fl_xor(mx[r], 1));
			mx[r] = fmaxf(mx[r], fl_xor(mx[r], 2));
			/* key 0 is visible to every row, so mx is finite from tile 0 on
			 * and corr is exp2(-inf) = 0 on the first tile */
			corr[r] = exp2f(m[r] - mx[r]);
			m[r] = mx[r];
			l[r] *= corr[r];
		}
#pragma unroll
		for (int d = 0; d < ND; d++) {
			o[d][0] *= corr[0];
			o[d][1] *= corr[0];
			o[d][2] *= corr[1];
			o[d][3] *= corr[1];
		}
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				float p = exp2f(s[j][e] - mx[e >> 1]);
				s[j][e] = p;
				l[e >> 1] += p; /* this lane's part of the row sum */
			}

		/* O += P V: P (16 x 64 keys) from the accumulators, V by .trans */
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			uint32_t pa[4];
			fl_acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
			for (int dp = 0; dp < ND / 2; dp++) {
				uint32_t vb[4];
				fl_ldsm_t(vb, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
						      dp * 16 + (lane >> 4) * 8);
				fl_mma(o[2 * dp], pa, vb[0], vb[1]);
				fl_mma(o[2 * dp + 1], pa, vb[2], vb[3]);
			}
		}
		if (async)
			__syncthreads(); /* tile kt's readers are done before kt+2 lands in it */
	}

	/* the quad's row sums, then out = O / l and lse = ln 2 (m + log2 l) */
#pragma unroll
	for (int r = 0; r < 2; r++) {
		l[r] += fl_xor(l[r], 1);
		l[r] += fl_xor(l[r], 2);
	}
#pragma unroll
	for (int r = 0; r < 2; r++) {
		if (row[r] >= T)
			continue;
		float inv = 1.0f / l[r];
		A *orow = out + ((size_t)b * T + row[r]) * C + (size_t)h * HD + 2 * t4;
#pragma unroll
		for (int d = 0; d < ND; d++) {
			act_st(orow, d * 8, o[d][2 * r] * inv);
			act_st(orow, d * 8 + 1, o[d][2 * r + 1] * inv);
		}
		if (t4 == 0)
			lse[((size_t)b * NH + h) * T + row[r]] = (m[r] + log2f(l[r])) * FL_LN2;
	}
}

/* ---- backward: dk, dv ---- */

/* Query rows per tile of the dk/dv kernel: 64 for HD 64; 32 for HD 128,
 * whose dk and dv accumulators (2 x 64 fp32 per lane) leave no room for 64. */
template <int HD> struct fl_dkv_bq {
	static const int v = HD > 64 ? 32 : 64;
};

/* grid (ceil(T/64), NKV, B): 64 keys of one (b, kv head) per block; the
 * first key blocks (the most queries) first */
template <int HD, typename A, bool AS>
__global__ static void __launch_bounds__(FL_THREADS)
	flash_dkv_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse, const float *Dd,
			 int T, int NH, int NKV, float scale2, float scale)
{
	const bool async = AS; /* tiles by cp.async, double-buffered (fl_async) */
	const int LD = fl_ld<HD>::v, KS = HD / 16, ND = HD / 8, BQ = fl_dkv_bq<HD>::v;
	const int NQ = BQ / 8;
	bf16 *Ks = (bf16 *)fl_smem();          /* [64][LD] this block's keys */
	bf16 *Vs = Ks + FL_ROWS * LD;          /* [64][LD] */
	/* query tile buffers (buffer 1 only when async): Q then dout, [BQ][LD]
	 * each, at QO + buf * 2 BQ LD; lse * log2(e) then delta, [BQ] each, at
	 * LD2 + buf * 2 BQ */
	bf16 *QO = Vs + FL_ROWS * LD;
	float *LD2 = (float *)(QO + (async ? 2 : 1) * 2 * BQ * LD);
	int k0 = blockIdx.x * FL_ROWS, kvh = blockIdx.y, b = blockIdx.z;
	int G = NH / NKV, C = NH * HD;
	size_t QKV = (size_t)(NH + 2 * NKV) * HD;
	int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
	const A *base = qkv + (size_t)b * T * QKV;
	const A *dbase = dout + (size_t)b * T * C;
	size_t koff = (size_t)(NH + kvh) * HD, voff = (size_t)(NH + NKV + kvh) * HD;
	bool vec = fl_vec(qkv) && fl_vec(dout);

	fl_load_tile<HD, FL_ROWS>(Ks, base + (size_t)k0 * QKV + koff, QKV, T - k0, vec);
	fl_load_tile<HD, FL_ROWS>(Vs, base + (size_t)k0 * QKV + voff, QKV, T - k0, vec);

	float dk[ND][4], dv[ND][4];
#pragma unroll
	for (int d = 0; d < ND; d++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			dk[d][e] = dv[d][e] = 0.0f;
	int key[2] = {k0 + w * 16 + g, k0 + w * 16 + g + 8};

	/* Query tile i (in this order: the group's heads, then the queries from
	 * k0 to T; those before k0 see none of these keys; BQ divides 64): head
	 * kvh G + i / nqt, queries from k0 + (i % nqt) BQ. */
	int nqt = (T - k0 + BQ - 1) / BQ, ntile = G * nqt;
	/* tile i into buffer buf: Q, dout (asynchronously when async, else
	 * rounded on the way), lse and delta (plain loads) */
	auto stage = [&](int i, int buf) {
		int h = kvh * G + i / nqt, qs = k0 + (i % nqt) * BQ;
		const A *qg = base + (size_t)qs * QKV + (size_t)h * HD;
		const A *og = dbase + (size_t)qs * C + (size_t)h * HD;
		bf16 *q = QO + buf * 2 * BQ * LD;
		if (async) {
			fl_cp_tile<HD, BQ>(q, qg, QKV, T - qs);
			fl_cp_tile<HD, BQ>(q + BQ * LD, og, C, T - qs);
		} else {
			fl_load_tile<HD, BQ>(q, qg, QKV, T - qs, vec);
			fl_load_tile<HD, BQ>(q + BQ * LD, og, C, T - qs, vec);
		}
		if (tid < BQ) {
			int t = qs + tid;
			size_t li = ((size_t)b * NH + h) * T + t;
			float *l2 = LD2 + buf * 2 * BQ;
			l2[tid] = t < T ? lse[li] * FL_LOG2E : 0.0f;
			l2[BQ + tid] = t < T ? Dd[li] : 0.0f;
		}
	};
	if (async) {
		stage(0, 0);
		fl_cp_commit();
	}
	for (int i = 0; i < ntile; i++) {
		int qs = k0 + (i % nqt) * BQ, cur = async ? i & 1 : 0;
		const bf16 *Qs = QO + cur * 2 * BQ * LD, *Os = Qs + BQ * LD;
		const float *L2 = LD2 + cur * 2 * BQ, *Ds = L2 + BQ;
		if (async) { /* as the forward's key tiles */
			if (i + 1 < ntile)
				stage(i + 1, cur ^ 1);
			fl_cp_commit();
			fl_cp_wait<1>();
			__syncthreads();
		} else {
			__syncthreads(); /* the previous tile's readers are done */
			stage(i, 0);
			__syncthreads();
		}
		/* else this warp's keys are all after the tile's queries */
		if (k0 + w * 16 <= qs + BQ - 1) {
			/* S^T = K Q^T and dP^T = V dO^T: 16 keys x BQ queries */
			float s[NQ][4], dp[NQ][4];
#pragma unroll
			for (int j = 0; j < NQ; j++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
			for (int kk = 0; kk < KS; kk++) {
				uint32_t ka[4], va[4];
				int ao = (w * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8;
				fl_ldsm(ka, Ks + ao);
				fl_ldsm(va, Vs + ao);
#pragma unroll
				for (int jp = 0; jp < NQ / 2; jp++) {
					uint32_t qb[4], ob[4];
					int bo = (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
						 ((lane >> 3) & 1) * 8;
					fl_ldsm(qb, Qs + bo);
					fl_ldsm(ob, Os + bo);
					fl_mma(s[2 * jp], ka, qb[0], qb[1]);
					fl_mma(s[2 * jp + 1], ka, qb[2], qb[3]);
					fl_mma(dp[2 * jp], va, ob[0], ob[1]);
					fl_mma(dp[2 * jp + 1], va, ob[2], ob[3]);
				}
			}
			/* P^T = exp2(S^T scale2 - lse2), 0 where the query is before
			 * the key or past T; dS^T = P^T (dP^T - D) */
#pragma unroll
			for (int j = 0; j < NQ; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int qi = j * 8 + 2 * t4 + (e & 1), tq = qs + qi;
					float p = exp2f(s[j][e] * scale2 - L2[qi]);
					if (tq < key[e >> 1] || tq >= T)
						p = 0.0f;
					s[j][e] = p;
					dp[j][e] = p * (dp[j][e] - Ds[qi]);
				}
			/* dV += P^T dO, dK += dS^T Q: k = the tile's queries */
#pragma unroll
			for (int kq = 0; kq < BQ / 16; kq++) {
				uint32_t pa[4], da[4];
				fl_acc_to_a(pa, s[2 * kq], s[2 * kq + 1]);
				fl_acc_to_a(da, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
				for (int dd = 0; dd < ND / 2; dd++) {
					uint32_t ob[4], qb[4];
					int bo = (kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
						 dd * 16 + (lane >> 4) * 8;
					fl_ldsm_t(ob, Os + bo);
					fl_ldsm_t(qb, Qs + bo);
					fl_mma(dv[2 * dd], pa, ob[0], ob[1]);
					fl_mma(dv[2 * dd + 1], pa, ob[2], ob[3]);
					fl_mma(dk[2 * dd], da, qb[0], qb[1]);
					fl_mma(dk[2 * dd + 1], da, qb[2], qb[3]);
				}
			}
		}
		if (async)
			__syncthreads(); /* tile i's readers are done before i+2 lands in it */
	}

#pragma unroll
	for (int r = 0; r < 2; r++) {
		if (key[r] >= T)
			continue;
		A *drow = dqkv + ((size_t)b * T + key[r]) * QKV + 2 * t4;
#pragma unroll
		for (int d = 0; d < ND; d++) {
			act_st(drow, koff + d * 8, dk[d][2 * r] * scale);
			act_st(drow, koff + d * 8 + 1, dk[d][2 * r + 1] * scale);
			act_st(drow, voff + d * 8, dv[d][2 * r]);
			act_st(drow, voff + d * 8 + 1, dv[d][2 * r + 1]);
		}
	}
}

/* ---- backward: dq ---- */

/* grid (ceil(T/64), NH, B): 64 queries of one (b, h) per block, key tiles of
 * 64 from 0 to the diagonal; the last query blocks first */
template <int HD, typename A, bool AS>
__global__ static void __launch_bounds__(FL_THREADS)
	flash_dq_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse, const float *Dd,
			int T, int NH, int NKV, float scale2, float scale)
{
	const bool async = AS; /* tiles by cp.async, double-buffered (fl_async) */
	const int LD = fl_ld<HD>::v, KS = HD / 16, ND = HD / 8;
	bf16 *Qs = (bf16 *)fl_smem();          /* [64][LD] */
	bf16 *Os = Qs + FL_ROWS * LD;          /* [64][LD] dout */
	const int BUF = 2 * FL_ROWS * LD;      /* one buffer: K then V, [64][LD] each */
	bf16 *KV = Os + FL_ROWS * LD;          /* buffer 0; buffer 1 (KV + BUF) when async */
	int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
	int q0 = qb * FL_ROWS, kvh = h / (NH / NKV), C = NH * HD;
	size_t QKV = (size_t)(NH + 2 * NKV) * HD;
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
	const A *base = qkv + (size_t)b * T * QKV;
	size_t koff = (size_t)(NH + kvh) * HD, voff = (size_t)(NH + NKV + kvh) * HD;
	bool vec = fl_vec(qkv) && fl_vec(dout);

	if (async) { /* key tile 0 on its way while Q and dO load */
		fl_cp_tile<HD, FL_ROWS>(KV, base + koff, QKV, T);
		fl_cp_tile<HD, FL_ROWS>(KV + FL_ROWS * LD, base + voff, QKV, T);
		fl_cp_commit();
	}
	fl_load_tile<HD, FL_ROWS>(Qs, base + (size_t)q0 * QKV + (size_t)h * HD, QKV, T - q0, vec);
	fl_load_tile<HD, FL_ROWS>(Os, dout + ((size_t)b * T + q0) * C + (size_t)h * HD, C, T - q0,
				  vec);
	int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};
	float lse2[2], D[2];
#pragma unroll
	for (int r = 0; r < 2; r++) {
		size_t li = ((size_t)b * NH + h) * T + min(row[r], T - 1); /* rows past T: never written */
		lse2[r] = lse[li] * FL_LOG2E;
		D[r] = Dd[li];
	}
	float dq[ND][4];
#pragma unroll
	for (int d = 0; d < ND; d++)
		dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

	for (int kt = 0; kt <= qb; kt++) {
		int k0 = kt * FL_ROWS, cur = async ? kt & 1 : 0;
		const bf16 *Ks = KV + cur * BUF, *Vs = Ks + FL_ROWS * LD;
		if (async) { /* as in the forward */
			if (kt < qb) {
				size_t n0 = (size_t)(k0 + FL_ROWS) * QKV;
				bf16 *nk = KV + (cur ^ 1) * BUF;
				fl_cp_tile<HD, FL_ROWS>(nk, base + n0 + koff, QKV, T - k0 - FL_ROWS);
				fl_cp_tile<HD, FL_ROWS>(nk + FL_ROWS * LD, base + n0 + voff, QKV,
							T - k0 - FL_ROWS);
			}
			fl_cp_commit();
			fl_cp_wait<1>();
			__syncthreads();
		} else {
			__syncthreads();
			fl_load_tile<HD, FL_ROWS>(KV, base + (size_t)k0 * QKV + koff, QKV, T - k0, vec);
			fl_load_tile<HD, FL_ROWS>(KV + FL_ROWS * LD, base + (size_t)k0 * QKV + voff, QKV,
						  T - k0, vec);
			__syncthreads();
		}

		/* S = Q K^T, dP = dO V^T: 16 queries x 64 keys per warp */
		float s[8][4], dp[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < KS; kk++) {
			uint32_t qa[4], oa[4];
			int ao = (w * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8;
			fl_ldsm(qa, Qs + ao);
			fl_ldsm(oa, Os + ao);
#pragma unroll
			for (int jp = 0; jp < 4; jp++) {
				uint32_t kb[4], vb[4];
				int bo = (jp * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 +
					 ((lane >> 3) & 1) * 8;
				fl_ldsm(kb, Ks + bo);
				fl_ldsm(vb, Vs + bo);
				fl_mma(s[2 * jp], qa, kb[0], kb[1]);
				fl_mma(s[2 * jp + 1], qa, kb[2], kb[3]);
				fl_mma(dp[2 * jp], oa, vb[0], vb[1]);
				fl_mma(dp[2 * jp + 1], oa, vb[2], vb[3]);
			}
		}
		/* dS = P (dP - D), P = exp2(S scale2 - lse2), 0 for future keys and
		 * keys past T; kept in s */
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				int tk = k0 + j * 8 + 2 * t4 + (e & 1), r = e >> 1;
				float p = exp2f(s[j][e] * scale2 - lse2[r]);
				if (kt == qb && (tk > row[r] || tk >= T))
					p = 0.0f;
				s[j][e] = p * (dp[j][e] - D[r]);
			}
		/* dQ += dS K: K by .trans (k = keys, n = dims) */
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			uint32_t da[4];
			fl_acc_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
			for (int dd = 0; dd < ND / 2; dd++) {
				uint32_t kb[4];
				fl_ldsm_t(kb, Ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
						      dd * 16 + (lane >> 4) * 8);
				fl_mma(dq[2 * dd], da, kb[0], kb[1]);
				fl_mma(dq[2 * dd + 1], da, kb[2], kb[3]);
			}
		}
		if (async)
			__syncthreads(); /* tile kt's readers are done before kt+2 lands in it */
	}

#pragma unroll
	for (int r = 0; r < 2; r++) {
		if (row[r] >= T)
			continue;
		A *drow = dqkv + ((size_t)b * T + row[r]) * QKV + (size_t)h * HD + 2 * t4;
#pragma unroll
		for (int d = 0; d < ND; d++) {
			act_st(drow, d * 8, dq[d][2 * r] * scale);
			act_st(drow, d * 8 + 1, dq[d][2 * r + 1] * scale);
		}
	}
}

/* Shared memory of each kernel, bytes; async: two buffers of the tiles
 * that stream (forward, dq: K and V; dk/dv: Q, dout, lse and delta). */
template <int HD> static size_t fl_smem_forward(bool async)
{
	return (size_t)(async ? 5 : 3) * FL_ROWS * fl_ld<HD>::v * sizeof(bf16);
}
template <int HD> static size_t fl_smem_dkv(bool async)
{
	const int BQ = fl_dkv_bq<HD>::v, nb = async ? 2 : 1;
	return (size_t)(2 * FL_ROWS + nb * 2 * BQ) * fl_ld<HD>::v * sizeof(bf16) +
	       (size_t)nb * 2 * BQ * sizeof(float);
}
template <int HD> static size_t fl_smem_dq(bool async)
{
	return (size_t)(async ? 6 : 4) * FL_ROWS * fl_ld<HD>::v * sizeof(bf16);
}

#ifndef FLASH_EMULATE
/* ---- host side ---- */

static void fl_setup(const void *kernel, size_t smem)
{
	CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)smem));
}

template <int HD, typename A>
static void fl_forward(A *out, float *lse, const A *qkv, int B, int T, int NH, int NKV)
{
	const bool CA = fl_can_async<A>::v;
	bool async = fl_async(qkv) && cuda_attention_impl() != CUDA_ATTENTION_FLASH_SYNC;
	size_t smem = fl_smem_forward<HD>(async);
	dim3 grid((T + FL_ROWS - 1) / FL_ROWS, NH, B);
	float scale2 = FL_LOG2E / sqrtf((float)HD);
	if (async) {
		fl_setup((const void *)flash_forward_kernel<HD, A, CA>, smem);
		flash_forward_kernel<HD, A, CA><<<grid, FL_THREADS, smem, cuda_stream()>>>(
			out, lse, qkv, T, NH, NKV, scale2);
	} else {
		fl_setup((const void *)flash_forward_kernel<HD, A, false>, smem);
		flash_forward_kernel<HD, A, false><<<grid, FL_THREADS, smem, cuda_stream()>>>(
			out, lse, qkv, T, NH, NKV, scale2);
	}
	CUDA_LAUNCHED();
}

template <int HD, typename A>
static void fl_backward(A *dqkv, const A *dout, const A *qkv, const A *out, const float *lse,
			int B, int T, int NH, int NKV)
{
	float scale = 1.0f / sqrtf((float)HD), scale2 = scale * FL_LOG2E;
	size_t rows = (size_t)B * NH * T;
	float *Dd = (float *)cuda_scratch(rows * sizeof(float));
	cuda_attention_delta(Dd, dout, out, B, T, NH, HD);

	/* dq streams key tiles (qkv), dk/dv query tiles (qkv and dout) */
	const bool CA = fl_can_async<A>::v;
	bool pipe = cuda_attention_impl() != CUDA_ATTENTION_FLASH_SYNC;
	bool async_q = pipe && fl_async(qkv), async_kv = async_q && fl_async(dout);
	size_t smem_q = fl_smem_dq<HD>(async_q);
	dim3 gq((T + FL_ROWS - 1) / FL_ROWS, NH, B);
	if (async_q) {
		fl_setup((const void *)flash_dq_kernel<HD, A, CA>, smem_q);
		flash_dq_kernel<HD, A, CA><<<gq, FL_THREADS, smem_q, cuda_stream()>>>(
			dqkv, dout, qkv, lse, Dd, T, NH, NKV, scale2, scale);
	} else {
		fl_setup((const void *)flash_dq_kernel<HD, A, false>, smem_q);
		flash_dq_kernel<HD, A, false><<<gq, FL_THREADS, smem_q, cuda_stream()>>>(
			dqkv, dout, qkv, lse, Dd, T, NH, NKV, scale2, scale);
	}
	CUDA_LAUNCHED();

	size_t smem_kv = fl_smem_dkv<HD>(async_kv);
	dim3 gkv((T + FL_ROWS - 1) / FL_ROWS, NKV, B);
	if (async_kv) {
		fl_setup((const void *)flash_dkv_kernel<HD, A, CA>, smem_kv);
		flash_dkv_kernel<HD, A, CA><<<gkv, FL_THREADS, smem_kv, cuda_stream()>>>(
			dqkv, dout, qkv, lse, Dd, T, NH, NKV, scale2, scale);
	} else {
		fl_setup((const void *)flash_dkv_kernel<HD, A, false>, smem_kv);
		flash_dkv_kernel<HD, A, false><<<gkv, FL_THREADS, smem_kv, cuda_stream()>>>(
			dqkv, dout, qkv, lse, Dd, T, NH, NKV, scale2, scale);
	}
	CUDA_LAUNCHED();
	cuda_scratch_free(Dd);
}

int cuda_flash_supported(int NH, int NKV, int HD)
{
	return (HD == 64 || HD == 128) && NKV > 0 && NH > 0 && NH % NKV == 0;
}

template <typename A>
static void flash_forward(A *out, float *lse, const A *qkv, int B, int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return;
	if (HD == 64)
		fl_forward<64>(out, lse, qkv, B, T, NH, NKV);
	else if (HD == 128)
		fl_forward<128>(out, lse, qkv, B, T, NH, NKV);
	else
		cuda_fatal(__FILE__, __LINE__, "flash attention: HD=%d (only 64 and 128)", HD);
}

template <typename A>
static void flash_backward(A *dqkv, const A *dout, const A *qkv, const A *out, const float *lse,
			   int B, int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0)
		return;
	if (HD == 64)
		fl_backward<64>(dqkv, dout, qkv, out, lse, B, T, NH, NKV);
	else if (HD == 128)
		fl_backward<128>(dqkv, dout, qkv, out, lse, B, T, NH, NKV);
	else
		cuda_fatal(__FILE__, __LINE__, "flash attention: HD=%d (only 64 and 128)", HD);
}

void cuda_flash_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV,
			int HD)
{
	flash_forward(out, lse, qkv, B, T, NH, NKV, HD);
}

void cuda_flash_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV,
			int HD)
{
	flash_forward(out, lse, qkv, B, T, NH, NKV, HD);
}

void cuda_flash_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
			 const float *lse, int B, int T, int NH, int NKV, int HD)
{
	flash_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}

void cuda_flash_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out,
			 const float *lse, int B, int T, int NH, int NKV, int HD)
{
	flash_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}

/* ---- which kernels the attention slots run ---- */

static std::atomic<int> fl_impl(-1);

static int fl_impl_from_env(void)
{
	const char *e = getenv("ASYNCPP_ATTENTION");
	/* flash by default since the H100 run of 2026-11-27 (NOTES.md) */
	if (!e || !*e || !strcmp(e, "flash"))
		return CUDA_ATTENTION_FLASH;
	if (!strcmp(e, "flash-sync"))
		return CUDA_ATTENTION_FLASH_SYNC;
	if (!strcmp(e, "simt"))
		return CUDA_ATTENTION_SIMT;
	if (!strcmp(e, "cudnn"))
		return CUDA_ATTENTION_CUDNN;
	cuda_fatal(__FILE__, __LINE__,
		   "ASYNCPP_ATTENTION='%s': expected 'cudnn', 'flash', 'flash-sync' or 'simt'", e);
}

extern "C" int cuda_attention_impl(void)
{
	int v = fl_impl.load();
	if (v < 0) {
		int want = fl_impl_from_env(), expect = -1;
		fl_impl.compare_exchange_strong(expect, want);
		v = fl_impl.load();
	}
	return v;
}

extern "C" int cuda_attention_set_impl(int impl)
{
	int prev = cuda_attention_impl();
	if (impl == CUDA_ATTENTION_SIMT || impl == CUDA_ATTENTION_FLASH ||
	    impl == CUDA_ATTENTION_FLASH_SYNC || impl == CUDA_ATTENTION_CUDNN)
		fl_impl.store(impl);
	return prev;
}

extern "C" int cuda_attention_flash_supported(int NH, int NKV, int HD)
{
	return cuda_flash_supported(NH, NKV, HD);
}
#endif
