/* cpu_optim.c - optimizer pieces: update directions, momentum, Newton-Schulz
 * orthogonalisation, applying an update, sum of squares and scaling.
 *
 * Legend: n elements of a parameter tensor; rows x cols for a matrix.
 * Elementwise loops split freely between threads; sumsq sums fixed-size
 * chunks (their size depends only on n) and adds the chunk sums in order.
 */
#include <math.h>

#include "../backend.h"
#include "cpu.h"

/* u[n] = -lr * (m/bc1) / (sqrt(v/bc2) + eps); m[n], v[n] advanced with g[n] */
void cpu_adamw_dir(float *u, const float *g, float *m, float *v, size_t n, float lr,
		   float beta1, float beta2, float eps, float bc1, float bc2)
{
	float ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;

#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		float mi = beta1 * m[i] + (1.0f - beta1) * gi;
		float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		u[i] = -lr * (mi * ib1) / (sqrtf(vi * ib2) + eps);
	}
}

/* AdamW or Lion then apply_update, element by element, tensor by tensor:
 * the expressions of cpu_adamw_dir, cpu_lion_dir and cpu_apply_update (no
 * contraction across them: C11 mode compiles with fp-contract off), so the
 * same bits without the u scratch pass. */
static void elem_step_one(int rule, const struct optim_elem_tensor *t, float lr, float beta1,
			  float beta2, float eps, float ib1, float ib2, float lambda)
{
	float keep = 1.0f - t->decay;
	float *w = t->w, *s0 = t->s0, *s1 = t->s1, *up = t->u_prev;
	const float *g = t->g;
	int correct = up && t->correct;
	size_t n = t->n;
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i], ui;
		if (rule == OPTIM_ELEM_ADAMW) {
			float mi = beta1 * s0[i] + (1.0f - beta1) * gi;
			float vi = beta2 * s1[i] + (1.0f - beta2) * gi * gi;
			s0[i] = mi;
			s1[i] = vi;
			ui = -lr * (mi * ib1) / (sqrtf(vi * ib2) + eps);
		} else {
			float mi = s0[i];
			float c = beta1 * mi + (1.0f - beta1) * gi;
			float sg = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
			ui = -lr * sg;
			s0[i] = beta2 * mi + (1.0f - beta2) * gi;
		}
		if (correct)
			w[i] = w[i] * keep + ui + lambda * (ui - up[i]);
		else
			w[i] = w[i] * keep + ui;
		if (up)
			up[i] = ui;
	}
}

void cpu_elementwise_step(int rule, const struct optim_elem_tensor *t, int count, float lr,
			  float beta1, float beta2, float eps, float bc1, float bc2, float lambda)
{
	float ib1 = 1.0f / bc1, ib2 = 1.0f / bc2;
	for (int k = 0; k < count; k++)
		elem_step_one(rule, &t[k], lr, beta1, beta2, eps, ib1, ib2, lambda);
}

/* Adan: see backend.h; every array [n] */
void cpu_adan_dir(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
		  size_t n, float lr, float beta1, float beta2, float beta3, float eps, float bc1,
		  float bc2, float bc3, int first)
{
	float ib1 = 1.0f / bc1, ib2 = 1.0f / bc2, isb3 = 1.0f / sqrtf(bc3);

#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i], d = first ? 0.0f : gi - gprev[i], z = gi + beta2 * d;
		float mi = beta1 * m[i] + (1.0f - beta1) * gi;
		float vi = beta2 * v[i] + (1.0f - beta2) * d;
		float ni = beta3 * nacc[i] + (1.0f - beta3) * z * z;
		m[i] = mi;
		v[i] = vi;
		nacc[i] = ni;
		gprev[i] = gi;
		u[i] = -lr * (mi * ib1 + beta2 * vi * ib2) / (sqrtf(ni) * isb3 + eps);
	}
}

/* AdEMAMix: see backend.h; every array [n] */
void cpu_ademamix_dir(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
		      float lr, float beta1, float beta2, float beta3, float alpha, float eps,
		      float bc1, float bc2)
{
	float ib1 = 1.0f / bc1, isb2 = 1.0f / sqrtf(bc2);

#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		float a = beta1 * m1[i] + (1.0f - beta1) * gi;
		float b = beta3 * m2[i] + (1.0f - beta3) * gi;
		float c = beta2 * nu[i] + (1.0f - beta2) * gi * gi;
		m1[i] = a;
		m2[i] = b;
		nu[i] = c;
		u[i] = -lr * (a * ib1 + alpha * b) / (sqrtf(c) * isb2 + eps);
	}
}

/* c[n] = g + coef (g - gprev); gprev = g */
void cpu_mars_correct(float *c, const float *g, float *gprev, size_t n, float coef)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		c[i] = gi + coef * (gi - gprev[i]);
		gprev[i] = gi;
	}
}

/* x[n] = beta x + (1-beta) g */
void cpu_ema(float *x, const float *g, size_t n, float beta)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		x[i] = beta * x[i] + (1.0f - beta) * g[i];
}

/* v[n] = b2 v + (1-b2) gr^2; out[n] = mr / (sqrt(v) + eps) */
void cpu_soap_adam(float *out, const float *mr, const float *gr, float *v, size_t n,
		   float beta2, float eps)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float vi = beta2 * v[i] + (1.0f - beta2) * gr[i] * gr[i];
		v[i] = vi;
		out[i] = mr[i] / (sqrtf(vi) + eps);
	}
}

/* o[rows, cols], v[rows]: see backend.h */
void cpu_row_normalize(float *o, float *v, int rows, int cols, float beta2, float eps)
{
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)rows * cols >= CPU_PAR_MIN)
	for (int r = 0; r < rows; r++) {
		float *row = o + (size_t)r * cols;
		double s = 0.0;
		for (int c = 0; c < cols; c++)
			s += (double)row[c] * row[c];
		float vr = beta2 * v[r] + (1.0f - beta2) * (float)(s / cols);
		v[r] = vr;
		float inv = 1.0f / (sqrtf(vr) + eps);
		for (int c = 0; c < cols; c++)
			row[c] *= inv;
	}
}

/* row-major C = alpha op(A) op(B) + beta C (cpu_gemm with packed strides) */
void cpu_gemm_op(float *c, const float *a, const float *b, int M, int N, int K, int ta, int tb,
		 float alpha, float beta)
{
	cpu_gemm(ta, tb, M, N, K, alpha, a, ta ? M : K, b, tb ? K : N, beta, c, N);
}

/* u[n] = -lr * sign(b1*m + (1-b1)*g); m[n] = b2*m + (1-b2)*g */
void cpu_lion_dir(float *u, const float *g, float *m, size_t n, float lr, float beta1,
		  float beta2)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i], mi = m[i];
		float c = beta1 * mi + (1.0f - beta1) * gi;
		float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
		u[i] = -lr * s;
		m[i] = beta2 * mi + (1.0f - beta2) * gi;
	}
}

/* m[n] = mu*m + g; out[n] = nesterov ? g + mu*m : m (out may alias g or m) */
void cpu_momentum(float *out, const float *g, float *m, size_t n, float mu, int nesterov)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float gi = g[i];
		float mi = mu * m[i] + gi;
		m[i] = mi;
		out[i] = nesterov ? gi + mu * mi : mi;
	}
}

/* w[n] = w*(1-decay) + u + lambda*(u - u_prev); u_prev[n] = u */
void cpu_apply_update(float *w, const float *u, float *u_prev, size_t n, float decay,
		      float lambda)
{
	float keep = 1.0f - decay;

	if (!u_prev) {
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
		for (size_t i = 0; i < n; i++)
			w[i] = w[i] * keep + u[i];
		return;
	}
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++) {
		float ui = u[i];
		w[i] = w[i] * keep + ui + lambda * (ui - u_prev[i]);
		u_prev[i] = ui;
	}
}

#define SUMSQ_MAX_CHUNKS 1024
#define SUMSQ_MIN_CHUNK 4096

/* sum of x[n]^2 in double: at most SUMSQ_MAX_CHUNKS chunks whose size depends
 * only on n, each summed in order, the chunk sums added in order. */
double cpu_sumsq(const float *x, size_t n)
{
	double part[SUMSQ_MAX_CHUNKS], total = 0.0;
	size_t chunk = (n + SUMSQ_MAX_CHUNKS - 1) / SUMSQ_MAX_CHUNKS;

	if (chunk < SUMSQ_MIN_CHUNK)
		chunk = SUMSQ_MIN_CHUNK;
	long nchunks = (long)((n + chunk - 1) / chunk);

#pragma omp parallel for num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (long k = 0; k < nchunks; k++) {
		size_t i0 = (size_t)k * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
		/* 8 double lanes (one AVX-512 register), combined in order */
		double lane[8] = {0}, s = 0.0;
		size_t i = i0;
		for (; i + 8 <= i1; i += 8)
			for (int l = 0; l < 8; l++)
				lane[l] += (double)x[i + l] * x[i + l];
		for (; i < i1; i++)
			s += (double)x[i] * x[i];
		for (int l = 0; l < 8; l++)
			s += lane[l];
		part[k] = s;
	}
	for (long k = 0; k < nchunks; k++)
		total += part[k];
	return total;
}

/* Large tensors one after another, each over the threads (cpu_sumsq), then
 * the small ones in parallel, one per thread at a time. A tensor's chunking,
 * so its bits, depend on its n only, whichever thread sums it. */
void cpu_sumsq_many(double *out, const float *const *x, const size_t *n, int count)
{
	for (int k = 0; k < count; k++)
		if (n[k] >= CPU_PAR_MIN)
			out[k] = cpu_sumsq(x[k], n[k]);
#pragma omp parallel for schedule(dynamic, 4) num_threads(cpu_threads()) if (count > 8)
	for (int k = 0; k < count; k++)
		if (n[k] < CPU_PAR_MIN)
			out[k] = cpu_sumsq(x[k], n[k]);
}

/* x[n] *= s */
void cpu_scale(float *x, float s, size_t n)
{
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		x[i] *= s;
}

/* dst[m,n] = src[n,m]^T * s, in tiles */
static void transpose_scaled(float *dst, const float *src, int m, int n, float s)
{
	enum { TB = 32 };

#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)m * n >= CPU_PAR_MIN)
	for (int i0 = 0; i0 < m; i0 += TB)
		for (int j0 = 0; j0 < n; j0 += TB)
			for (int i = i0; i < i0 + TB && i < m; i++)
				for (int j = j0; j < j0 + TB && j < n; j++)
					dst[(size_t)i * n + j] = src[(size_t)j * m + i] * s;
}

/* out[rows,cols] = NS^steps(in / (|in|_F + 1e-7)), with the quintic
 * X <- a X + (b A + c A A) X, A = X X^T, on the orientation with rows <= cols.
 * scratch: newton_schulz_scratch(rows, cols) floats. out may alias in. */
void cpu_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
		       float *scratch)
{
	const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
	int tr = rows > cols, m = tr ? cols : rows, n = tr ? rows : cols;
	size_t mn = (size_t)m * n, mm = (size_t)m * m;
	float *X = scratch, *Y = X + mn, *A = Y + mn, *Bm = A + mm;
	float s = (float)(1.0 / (sqrt(cpu_sumsq(in, mn)) + 1e-7));

	if (tr) {
		transpose_scaled(X, in, m, n, s);
	} else {
#pragma omp parallel for simd num_threads(cpu_threads()) if (mn >= CPU_PAR_MIN)
		for (size_t i = 0; i < mn; i++)
			X[i] = in[i] * s;
	}
	for (int it = 0; it < steps; it++) {
		cpu_gemm(0, 1, m, m, n, 1.0f, X, n, X, n, 0.0f, A, m);
#pragma omp parallel for simd num_threads(cpu_threads()) if (mm >= CPU_PAR_MIN)
		for (size_t i = 0; i < mm; i++)
			Bm[i] = b * A[i];
		cpu_gemm(0, 0, m, m, m, c, A, m, A, m, 1.0f, Bm, m);
#pragma omp parallel for simd num_threads(cpu_threads()) if (mn >= CPU_PAR_MIN)
		for (size_t i = 0; i < mn; i++)
			Y[i] = a * X[i];
		cpu_gemm(0, 0, m, n, m, 1.0f, Bm, m, X, n, 1.0f, Y, n);
		float *t = X;
		X = Y;
		Y = t;
	}
	if (tr)
		transpose_scaled(out, X, n, m, 1.0f);
	else
		cpu_memcpy(out, X, mn * sizeof(float));
}
