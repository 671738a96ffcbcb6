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

/* dqkv[N,QKV] (overwritten) from dout[N,NH*HD], qkv, out[N,NH*HD], lse[B,NH,T] */
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv,
			    const float *out, const float *lse, int B, int T, int NH,
			    int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, group = NH / NKV;
	long qunits = (long)B * NH * T, kunits = (long)B * NKV * T;
	float scale = 1.0f / sqrtf((float)HD);
	/* D[B,NH,T] = dout_i . out_i, the softmax backward's row term */
	float *Dv = xmalloc(st_mult((size_t)qunits, sizeof(float)));
	int par = (size_t)qunits * T * HD >= 2 * CPU_PAR_MIN;

#pragma omp parallel num_threads(cpu_threads()) if (par)
	{
		float *ds = xmalloc(st_mult((size_t)T, sizeof(float)));

#pragma omp for schedule(static)
		for (long u = 0; u < qunits; u++) {
			int i = (int)(u % T), h = (int)(u / T % NH), b = (int)(u / T / NH);
			size_t r = ((size_t)b * T + i) * C + (size_t)h * HD;
			Dv[u] = dot(dout + r, out + r, HD);
		}
		/* dq_i = scale * sum_{j<=i} ds_ij k_j,
		 * ds_ij = p_ij (dout_i . v_j - D_i), p_ij = exp(scale q_i.k_j - lse_i) */
#pragma omp for schedule(dynamic, 16)
		for (long u = 0; u < qunits; u++) {
			int i = (int)(u % T), h = (int)(u / T % NH), b = (int)(u / T / NH);
			int kvh = h / group;
			const float *base = qkv + (size_t)b * T * QKV;
			const float *q = base + (size_t)i * QKV + (size_t)h * HD;
			const float *k0 = base + (size_t)(NH + kvh) * HD;
			const float *v0 = base + (size_t)(NH + NKV + kvh) * HD;
			const float *g = dout + ((size_t)b * T + i) * C + (size_t)h * HD;
			float *dq = dqkv + ((size_t)b * T + i) * QKV + (size_t)h * HD;
			float l = lse[u], D = Dv[u];

			for (int j = 0; j <= i; j++) {
				float p = cpu_expf(scale * dot(q, k0 + (size_t)j * QKV, HD) - l);
				ds[j] = p * (dot(g, v0 + (size_t)j * QKV, HD) - D);
			}
			for (int d = 0; d < HD; d++)
				dq[d] = 0.0f;
			for (int j = 0; j <= i; j++) {
				const float *k = k0 + (size_t)j * QKV;
				float sj = scale * ds[j];
#pragma omp simd
				for (int d = 0; d < HD; d++)
					dq[d] += sj * k[d];
			}
		}
		/* dk_j = scale * sum_h sum_{i>=j} ds_ij q_i; dv_j = sum_h sum_{i>=j} p_ij dout_i */
#pragma omp for schedule(dynamic, 16)
		for (long u = 0; u < kunits; u++) {
			int j = (int)(u % T), kvh = (int)(u / T % NKV), b = (int)(u / T / NKV);
			const float *base = qkv + (size_t)b * T * QKV;
			const float *k = base + (size_t)j * QKV + (size_t)(NH + kvh) * HD;
			const float *v = base + (size_t)j * QKV + (size_t)(NH + NKV + kvh) * HD;
			float *dk = dqkv + ((size_t)b * T + j) * QKV + (size_t)(NH + kvh) * HD;
			float *dv = dk + (size_t)NKV * HD;

			for (int d = 0; d < HD; d++)
				dk[d] = dv[d] = 0.0f;
			for (int h = kvh * group; h < (kvh + 1) * group; h++) {
				const float *lh = lse + ((size_t)b * NH + h) * T;
				const float *Dh = Dv + ((size_t)b * NH + h) * T;
				for (int i = j; i < T; i++) {
					const float *q = base + (size_t)i * QKV + (size_t)h * HD;
					const float *g = dout + ((size_t)b * T + i) * C + (size_t)h * HD;
					float p = cpu_expf(scale * dot(q, k, HD) - lh[i]);
					float dsv = p * (dot(g, v, HD) - Dh[i]) * scale;
#pragma omp simd
					for (int d = 0; d < HD; d++) {
						dk[d] += dsv * q[d];
						dv[d] += p * g[d];
					}
				}
			}
		}
		free(ds);
	}
	free(Dv);
}
