/* cpu_norm.c - embeddings, LayerNorm and RMSNorm on the CPU.
 *
 * Legend: B batch, T sequence length, N = B*T rows, C channels, Vp rows of
 * the token embedding. Row work runs in parallel over rows; the parameter
 * gradients (sums over rows) run in parallel over blocks of CB columns, each
 * summing its rows in order 0..N-1, so no result depends on the thread count.
 */
#include <math.h>

#include "cpu.h"

#define CB 64 /* columns per block of a column reduction */

static int nblocks(int C)
{
	return (C + CB - 1) / CB;
}

/* out[N,C] = wte[tokens[n],:] + wpe[n % T,:]; tokens[N], wte[Vp,C], wpe[T,C] */
void cpu_embed_forward(float *out, const int32_t *tokens, const float *wte,
		       const float *wpe, int B, int T, int C)
{
	int N = B * T;

#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		float *o = out + (size_t)n * C;
		const float *e = wte + (size_t)tokens[n] * C;
		if (wpe) {
			const float *p = wpe + (size_t)(n % T) * C;
			for (int c = 0; c < C; c++)
				o[c] = e[c] + p[c];
		} else {
			for (int c = 0; c < C; c++)
				o[c] = e[c];
		}
	}
}

/* dwte[Vp,C] += scatter of dout[N,C] by tokens[N]; dwpe[T,C] += sum over b.
 * Each column block is owned by one thread and visits rows in order, so a
 * token's repeated rows add up in the same order on any thread count. */
void cpu_embed_backward(float *dwte, float *dwpe, const float *dout,
			const int32_t *tokens, int B, int T, int C)
{
	int N = B * T, nb = nblocks(C);

#pragma omp parallel num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	{
#pragma omp for schedule(static)
		for (int blk = 0; blk < nb; blk++) {
			int c0 = blk * CB, c1 = c0 + CB < C ? c0 + CB : C;
			for (int n = 0; n < N; n++) {
				float *d = dwte + (size_t)tokens[n] * C;
				const float *g = dout + (size_t)n * C;
				for (int c = c0; c < c1; c++)
					d[c] += g[c];
			}
		}
		if (dwpe) {
#pragma omp for schedule(static)
			for (int t = 0; t < T; t++) {
				float *d = dwpe + (size_t)t * C;
				for (int b = 0; b < B; b++) {
					const float *g = dout + ((size_t)b * T + t) * C;
					for (int c = 0; c < C; c++)
						d[c] += g[c];
				}
			}
		}
	}
}

void cpu_colsum_acc(float *dst, const float *x, int N, int C)
{
	int nb = nblocks(C);

#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	for (int blk = 0; blk < nb; blk++) {
		int c0 = blk * CB, w = c0 + CB < C ? CB : C - c0;
		float acc[CB] = {0};
		for (int n = 0; n < N; n++) {
			const float *r = x + (size_t)n * C + c0;
			for (int c = 0; c < w; c++)
				acc[c] += r[c];
		}
		for (int c = 0; c < w; c++)
			dst[c0 + c] += acc[c];
	}
}

/* The LayerNorm weight and bias of column c: NULL means 1 and 0 (backend.h).
 * The test sits outside the hot loops once the compiler unswitches them. */
static inline float ln_w(const float *w, int c)
{
	return w ? w[c] : 1.0f;
}

static inline float ln_b(const float *b, int c)
{
	return b ? b[c] : 0.0f;
}

/* out[N,C], mean[N], rstd[N] from inp[N,C]; w[C], b[C] (each may be NULL) */
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
			   const float *w, const float *b, int N, int C, float eps)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float s = 0.0f, v = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = 0; c < C; c++)
			s += x[c];
		float m = s / C;
#pragma omp simd reduction(+ : v)
		for (int c = 0; c < C; c++) {
			float d = x[c] - m;
			v += d * d;
		}
		float r = 1.0f / sqrtf(v / C + eps);
		for (int c = 0; c < C; c++)
			o[c] = (x[c] - m) * r * ln_w(w, c) + ln_b(b, c);
		mean[n] = m;
		rstd[n] = r;
	}
}

/* dinp[N,C] (overwritten), dw[C] += , db[C] += (each skipped when NULL:
 * the split backward's input part passes dw = db = NULL, its weight part
 * dinp = NULL; the two loops share nothing, so the parts give the fused
 * call's bits); dout, inp [N,C]; w[C] (NULL: 1; read for dinp only);
 * mean, rstd [N] */
void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
			    const float *inp, const float *w, const float *mean,
			    const float *rstd, int N, int C)
{
	int nb = nblocks(C);

#pragma omp parallel num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	{
#pragma omp for schedule(static)
		for (int n = 0; n < (dinp ? N : 0); n++) {
			const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
			float *dx = dinp + (size_t)n * C;
			float m = mean[n], r = rstd[n], s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
			for (int c = 0; c < C; c++) {
				float dn = g[c] * ln_w(w, c);
				s1 += dn;
				s2 += dn * (x[c] - m) * r;
			}
			s1 /= C;
			s2 /= C;
			for (int c = 0; c < C; c++) {
				float xn = (x[c] - m) * r;
				dx[c] = (g[c] * ln_w(w, c) - s1 - xn * s2) * r;
			}
		}
#pragma omp for schedule(static)
		for (int blk = 0; blk < (dw || db ? nb : 0); blk++) {
			int c0 = blk * CB, wd = c0 + CB < C ? CB : C - c0;
			float aw[CB] = {0}, ab[CB] = {0};
			for (int n = 0; n < N; n++) {
				const float *x = inp + (size_t)n * C + c0;
				const float *g = dout + (size_t)n * C + c0;
				float m = mean[n], r = rstd[n];
				for (int c = 0; c < wd; c++) {
					aw[c] += g[c] * ((x[c] - m) * r);
					ab[c] += g[c];
				}
			}
			for (int c = 0; c < wd; c++) {
				if (dw)
					dw[c0 + c] += aw[c];
				if (db)
					db[c0 + c] += ab[c];
			}
		}
	}
}

/* out[N,C] = inp * rstd * w; rstd[N] */
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
			 int N, int C, float eps)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = 0; c < C; c++)
			s += x[c] * x[c];
		float r = 1.0f / sqrtf(s / C + eps);
		for (int c = 0; c < C; c++)
			o[c] = x[c] * r * w[c];
		rstd[n] = r;
	}
}

/* dinp[N,C] (overwritten), dw[C] += (each skipped when NULL, as in
 * cpu_layernorm_backward); dout, inp [N,C]; w[C] (read for dinp only);
 * rstd[N] */
void cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
			  const float *w, const float *rstd, int N, int C)
{
	int nb = nblocks(C);

#pragma omp parallel num_threads(cpu_threads()) if ((size_t)N * C >= CPU_PAR_MIN)
	{
#pragma omp for schedule(static)
		for (int n = 0; n < (dinp ? N : 0); n++) {
			const float *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
			float *dx = dinp + (size_t)n * C;
			float r = rstd[n], s = 0.0f;
#pragma omp simd reduction(+ : s)
			for (int c = 0; c < C; c++)
				s += g[c] * w[c] * x[c];
			float k = r * r * s / C;
			for (int c = 0; c < C; c++)
				dx[c] = r * (g[c] * w[c] - x[c] * k);
		}
#pragma omp for schedule(static)
		for (int blk = 0; blk < (dw ? nb : 0); blk++) {
			int c0 = blk * CB, wd = c0 + CB < C ? CB : C - c0;
			float aw[CB] = {0};
			for (int n = 0; n < N; n++) {
				const float *x = inp + (size_t)n * C + c0;
				const float *g = dout + (size_t)n * C + c0;
				float r = rstd[n];
				for (int c = 0; c < wd; c++)
					aw[c] += g[c] * (x[c] * r);
			}
			for (int c = 0; c < wd; c++)
				dw[c0 + c] += aw[c];
		}
	}
}
