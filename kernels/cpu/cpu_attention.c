/* cpu_attention.c - rotary embedding and causal (grouped-query) attention.
 *
 * Legend: B batch, T sequence length, N = B*T, NH query heads, NKV key/value
 * heads (NH % NKV == 0), HD head width, QKV = (NH + 2*NKV)*HD.
 * qkv[N,QKV] rows hold [q heads | k heads | v heads]; query head h reads
 * key/value head h / (NH/NKV).
 *
 * Flash-style: no T x T matrix is stored. The forward keeps, per query, the
 * log-sum-exp of its scaled scores (lse[B,NH,T]); the backward recomputes the
 * probabilities from it. Every output is owned by one loop iteration:
 *   dq[i]       sums over keys j <= i,
 *   dk[j], dv[j] sum over the query heads of the group, then queries i >= j,
 * each in index order, so the thread count never changes a bit.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "../../io/util.h"
#include "cpu.h"
#include "cpu_math.h"

/* ---- rotary embedding ---- */

/* cos/sin[T, HD/2] of angle t * theta^(-2i/HD), computed in double */
static float *rope_table(int T, int HD, float theta)
{
	int half = HD / 2;
	float *tab = xmalloc(st_mult(st_mult((size_t)T, (size_t)half), 2 * sizeof(float)));

	for (int i = 0; i < half; i++) {
		double freq = pow((double)theta, -2.0 * i / HD);
		for (int t = 0; t < T; t++) {
			double a = t * freq;
			tab[((size_t)t * half + i) * 2] = (float)cos(a);
			tab[((size_t)t * half + i) * 2 + 1] = (float)sin(a);
		}
	}
	return tab;
}

/* dir = +1 rotates by the angle (forward), -1 by its negative (backward:
 * the transpose of a rotation is the rotation back) */
static void rope_apply(float *qkv, int B, int T, int NH, int NKV, int HD, float theta,
		       float dir)
{
	int N = B * T, half = HD / 2, QKV = (NH + 2 * NKV) * HD, nheads = NH + NKV;
	float *tab = rope_table(T, HD, theta);

#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * nheads * HD >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *cs = tab + (size_t)(n % T) * half * 2;
		for (int h = 0; h < nheads; h++) {
			float *x = qkv + (size_t)n * QKV + (size_t)h * HD;
#pragma omp simd
			for (int i = 0; i < half; i++) {
				float c = cs[2 * i], s = dir * cs[2 * i + 1];
				float x1 = x[i], x2 = x[i + half];
				x[i] = x1 * c - x2 * s;
				x[i + half] = x2 * c + x1 * s;
			}
		}
	}
	free(tab);
}

/* qkv[N,QKV]: q and k heads rotated in place; row n is position n % T */
void cpu_rope_forward(float *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope_apply(qkv, B, T, NH, NKV, HD, theta, 1.0f);
}

/* dqkv[N,QKV]: the transpose of rope_forward, in place */
void cpu_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope_apply(dqkv, B, T, NH, NKV, HD, theta, -1.0f);
}

/* ---- attention ---- */

static inline float dot(const float *a, const float *b, int n)
{
	float s = 0.0f;
#pragma omp simd reduction(+ : s)
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* out[N,NH*HD], lse[B,NH,T] from qkv[N,QKV] */
void cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T,
			   int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, group = NH / NKV;
	long units = (long)B * NH * T;
	float scale = 1.0f / sqrtf((float)HD);

#pragma omp parallel num_threads(cpu_threads()) if ((size_t)units * T * HD >= 2 * CPU_PAR_MIN)
	{
		float *att = xmalloc(st_mult((size_t)T, sizeof(float)));
#pragma omp for schedule(dynamic, 16)
		for (long u = 0; u < units; u++) {
			int i = (int)(u % T), h = (int)(u / T % NH), b = (int)(u / T / NH);
			int kvh = h / group;
			const float *base = qkv + (size_t)b * T * QKV;
			const float *q = base + (size_t)i * QKV + (size_t)h * HD;
			const float *k0 = base + (size_t)(NH + kvh) * HD;
			const float *v0 = base + (size_t)(NH + NKV + kvh) * HD;
			float *o = out + ((size_t)b * T + i) * C + (size_t)h * HD;
			float m = -INFINITY, sum = 0.0f;

			for (int j = 0; j <= i; j++) {
				float s = scale * dot(q, k0 + (size_t)j * QKV, HD);
				att[j] = s;
				m = s > m ? s : m;
			}
#pragma omp simd reduction(+ : sum)
			for (int j = 0; j <= i; j++) {
				float p = cpu_expf(att[j] - m);
				att[j] = p;
				sum += p;
			}
			for (int d = 0; d < HD; d++)
				o[d] = 0.0f;
			for (int j = 0; j <= i; j++) {
				const float *v = v0 + (size_t)j * QKV;
				float p = att[j];
#pragma omp simd
				for (int d = 0; d < HD; d++)
					o[d] += p * v[d];
			}
			float inv = 1.0f / sum;
			for (int d = 0; d < HD; d++)
				o[d] *= inv;
			lse[((size_t)b * NH + h) * T + i] = m + logf(sum);
		}
		free(att);
	}
}

/* Query rows per block of the backward: its score blocks are QB x T. */
#define QB 128

/* dqkv[N,QKV] (overwritten) from dout[N,NH*HD], qkv, out[N,NH*HD], lse[B,NH,T].
 *
 * One unit of work is (b, kv head): it owns dk and dv of that kv head and dq
 * of the query heads of its group. For each query head h of the group (in
 * order) and each block of QB queries i0..i1 (in order), with the keys
 * j < i1 that the block can see:
 *   S  = scale Q K^T, P = exp(S - lse) on j <= i, 0 above the diagonal
 *   dP = dout V^T,    dS = P (dP - D), D_i = dout_i . out_i
 *   dq = scale dS K,  dk += scale dS^T Q,  dv += P^T dout
 * The five products are single-threaded sgemm calls on shapes that depend
 * only on (T, HD, QB), and every sum runs in this fixed order inside one
 * unit, so no bit depends on the thread count. Recomputing the scores with
 * a product (instead of per-pair dot products) costs the masked half of
 * each block but runs at matrix-product speed. */
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv,
			    const float *out, const float *lse, int B, int T, int NH,
			    int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, group = NH / NKV;
	long units = (long)B * NKV;
	float scale = 1.0f / sqrtf((float)HD);
	int par = units > 1 && (size_t)B * NH * T * T * HD >= 2 * CPU_PAR_MIN;

	cpu_blas_init();
#pragma omp parallel num_threads(cpu_threads()) if (par)
	{
		int qb = T < QB ? T : QB;
		float *P = xmalloc(st_mult(st_mult((size_t)qb, (size_t)T), sizeof(float)));
		float *dS = xmalloc(st_mult(st_mult((size_t)qb, (size_t)T), sizeof(float)));

#pragma omp for schedule(dynamic, 1)
		for (long u = 0; u < units; u++) {
			int kvh = (int)(u % NKV), b = (int)(u / NKV);
			const float *base = qkv + (size_t)b * T * QKV;
			const float *K = base + (size_t)(NH + kvh) * HD;
			const float *V = base + (size_t)(NH + NKV + kvh) * HD;
			float *dK = dqkv + (size_t)b * T * QKV + (size_t)(NH + kvh) * HD;
			float *dV = dK + (size_t)NKV * HD;

			for (int t = 0; t < T; t++)
				for (int d = 0; d < HD; d++)
					dK[(size_t)t * QKV + d] = dV[(size_t)t * QKV + d] = 0.0f;
			for (int h = kvh * group; h < (kvh + 1) * group; h++) {
				const float *lh = lse + ((size_t)b * NH + h) * T;
				for (int i0 = 0; i0 < T; i0 += qb) {
					int m = T - i0 < qb ? T - i0 : qb, nk = i0 + m;
					size_t row = (size_t)b * T + i0;
					const float *Q = qkv + row * QKV + (size_t)h * HD;
					const float *G = dout + row * C + (size_t)h * HD;
					const float *O = out + row * C + (size_t)h * HD;
					float *dQ = dqkv + row * QKV + (size_t)h * HD;

					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, HD, scale,
						    Q, QKV, K, QKV, 0.0f, P, nk);
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, HD, 1.0f,
						    G, C, V, QKV, 0.0f, dS, nk);
					for (int r = 0; r < m; r++) {
						int i = i0 + r;
						float *p = P + (size_t)r * nk, *ds = dS + (size_t)r * nk;
						float l = lh[i];
						float D = dot(G + (size_t)r * C, O + (size_t)r * C, HD);
#pragma omp simd
						for (int j = 0; j <= i; j++) {
							float e = cpu_expf(p[j] - l);
							p[j] = e;
							ds[j] = e * (ds[j] - D);
						}
						for (int j = i + 1; j < nk; j++)
							p[j] = ds[j] = 0.0f;
					}
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HD, nk,
						    scale, dS, nk, K, QKV, 0.0f, dQ, QKV);
					cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, HD, m,
						    scale, dS, nk, Q, QKV, 1.0f, dK, QKV);
					cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, HD, m,
						    1.0f, P, nk, G, C, 1.0f, dV, QKV);
				}
			}
		}
		free(P);
		free(dS);
	}
}
