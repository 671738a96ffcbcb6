/* test_kernels_cpu.c - the CPU backend against double-precision references.
 *
 * For every forward/backward pair: the forward against a naive reference
 * written here in double, and the analytic gradients of L = sum(out * R)
 * (fixed random R) against central differences of that double reference.
 * A gradient check passes when every element satisfies
 *     |analytic - numeric| <= tol * (max|numeric| + |numeric|)
 * with tol stated per op (fp32 kernels against exact double math: errors of a
 * few 1e-6 relative are expected; a wrong formula gives O(1)).
 * Plus: optimizer pieces against hand-computed values, Newton-Schulz
 * singular values, and bit-identical results for 1, 2 and 3 threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../test.h"

static const struct backend *be = &backend_cpu;

/* ---- helpers ---- */

static float *fnew(size_t n)
{
	return xcalloc(n ? n : 1, sizeof(float));
}

static double *dnew(size_t n)
{
	return xcalloc(n ? n : 1, sizeof(double));
}

static void frand(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t st = seed;
	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal(&st);
}

static double *todouble(const float *x, size_t n)
{
	double *d = dnew(n);
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}

static double dsum_prod(const double *a, const float *r, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += a[i] * r[i];
	return s;
}

/* max_i |a_i - ref_i| / (max|ref| + |ref_i|): 0 is perfect */
static double rel_err(const float *a, const double *ref, size_t n)
{
	double mx = 0, worst = 0;
	for (size_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(ref[i]));
	for (size_t i = 0; i < n; i++) {
		double e = fabs(a[i] - ref[i]) / (mx + fabs(ref[i]) + 1e-300);
		if (!(e <= worst)) /* NaN counts as worst */
			worst = isnan(e) ? INFINITY : e;
	}
	return worst;
}

/* Central differences of f() in x[0..n) (double, step h) compared with the
 * analytic gradient an[]; returns rel_err of an against the numeric one. */
static double grad_check(double *x, size_t n, const float *an, double (*f)(void), double h)
{
	double *num = dnew(n);
	for (size_t k = 0; k < n; k++) {
		double x0 = x[k];
		x[k] = x0 + h;
		double fp = f();
		x[k] = x0 - h;
		double fm = f();
		x[k] = x0;
		num[k] = (fp - fm) / (2 * h);
	}
	double e = rel_err(an, num, n);
	free(num);
	return e;
}

/* fill with garbage so that a kernel that forgets to overwrite is caught */
static void garbage(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = 1e3f + (float)i;
}

/* ---- double references ---- */

static void ref_layernorm(double *out, const double *x, const double *w, const double *b,
			  int N, int C, double eps)
{
	for (int n = 0; n < N; n++) {
		const double *r = x + (size_t)n * C;
		double m = 0, v = 0;
		for (int c = 0; c < C; c++)
			m += r[c];
		m /= C;
		for (int c = 0; c < C; c++)
			v += (r[c] - m) * (r[c] - m);
		v /= C;
		for (int c = 0; c < C; c++)
			out[(size_t)n * C + c] = (r[c] - m) / sqrt(v + eps) * w[c] + b[c];
	}
}

static void ref_rmsnorm(double *out, const double *x, const double *w, int N, int C,
			double eps)
{
	for (int n = 0; n < N; n++) {
		const double *r = x + (size_t)n * C;
		double s = 0;
		for (int c = 0; c < C; c++)
			s += r[c] * r[c];
		double rs = 1 / sqrt(s / C + eps);
		for (int c = 0; c < C; c++)
			out[(size_t)n * C + c] = r[c] * rs * w[c];
	}
}

static void ref_matmul(double *out, const double *x, const double *w, const double *bias,
		       int N, int C, int OC)
{
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = bias ? bias[o] : 0;
			for (int c = 0; c < C; c++)
				s += x[(size_t)n * C + c] * w[(size_t)o * C + c];
			out[(size_t)n * OC + o] = s;
		}
}

static void ref_rope(double *qkv, int B, int T, int NH, int NKV, int HD, double theta)
{
	int QKV = (NH + 2 * NKV) * HD, half = HD / 2;
	for (int n = 0; n < B * T; n++)
		for (int h = 0; h < NH + NKV; h++) {
			double *x = qkv + (size_t)n * QKV + (size_t)h * HD;
			for (int i = 0; i < half; i++) {
				double a = (n % T) * pow(theta, -2.0 * i / HD);
				double x1 = x[i], x2 = x[i + half];
				x[i] = x1 * cos(a) - x2 * sin(a);
				x[i + half] = x2 * cos(a) + x1 * sin(a);
			}
		}
}

/* out = softmax(Q K^T / sqrt(HD) + causal mask) V, the textbook formula */
static void ref_attention(double *out, double *lse, const double *qkv, int B, int T,
			  int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	double *s = dnew(T);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			int kvh = h / (NH / NKV);
			for (int i = 0; i < T; i++) {
				const double *q = qkv + ((size_t)b * T + i) * QKV + h * HD;
				double m = -INFINITY, z = 0;
				for (int j = 0; j <= i; j++) {
					const double *k = qkv + ((size_t)b * T + j) * QKV +
							  (NH + kvh) * HD;
					double d = 0;
					for (int e = 0; e < HD; e++)
						d += q[e] * k[e];
					s[j] = d / sqrt((double)HD);
					m = fmax(m, s[j]);
				}
				for (int j = 0; j <= i; j++)
					z += exp(s[j] - m);
				double *o = out + ((size_t)b * T + i) * C + h * HD;
				for (int e = 0; e < HD; e++)
					o[e] = 0;
				for (int j = 0; j <= i; j++) {
					const double *v = qkv + ((size_t)b * T + j) * QKV +
							  (NH + NKV + kvh) * HD;
					for (int e = 0; e < HD; e++)
						o[e] += exp(s[j] - m) / z * v[e];
				}
				if (lse)
					lse[((size_t)b * NH + h) * T + i] = m + log(z);
			}
		}
	free(s);
}

static double ref_gelu(double x)
{
	return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void ref_xent(double *losses, const double *logits, const int32_t *tg, int N, int V,
		     int Vp)
{
	for (int n = 0; n < N; n++) {
		const double *x = logits + (size_t)n * Vp;
		double m = -INFINITY, z = 0;
		for (int c = 0; c < V; c++)
			m = fmax(m, x[c]);
		for (int c = 0; c < V; c++)
			z += exp(x[c] - m);
		losses[n] = m + log(z) - x[tg[n]];
	}
}

/* The objective's state: the double inputs the finite differences move and
 * the fixed weights R of L = sum(out * R). Tests run one at a time. */
static struct gstate {
	int B, T, C, N, NH, NKV, HD, OC, F, V, Vp;
	double eps, theta;
	double *x, *w, *b, *out;
	float *R;
	int32_t *tok;
} G;

/* ---- embeddings ---- */

static double obj_embed(void)
{
	/* G.x = wte[V,C], G.w = wpe[T,C] */
	for (int n = 0; n < G.N; n++)
		for (int c = 0; c < G.C; c++)
			G.out[(size_t)n * G.C + c] = G.x[(size_t)G.tok[n] * G.C + c] +
						     G.w[(size_t)(n % G.T) * G.C + c];
	return dsum_prod(G.out, G.R, (size_t)G.N * G.C);
}

TEST(embed_forward_backward)
{
	int B = 3, T = 5, C = 7, V = 4, N = B * T;
	size_t nw = (size_t)V * C, np = (size_t)T * C, no = (size_t)N * C;
	float *wte = fnew(nw), *wpe = fnew(np), *out = fnew(no), *R = fnew(no);
	float *dwte = fnew(nw), *dwpe = fnew(np), *dwte0 = fnew(nw), *dwpe0 = fnew(np);
	int32_t tok[15];
	uint64_t st = 7;

	for (int n = 0; n < N; n++)
		tok[n] = (int32_t)(rng_next(&st) % V); /* V < N: tokens repeat */
	frand(wte, nw, 1, 1);
	frand(wpe, np, 2, 1);
	frand(R, no, 3, 1);
	frand(dwte0, nw, 4, 1);
	frand(dwpe0, np, 5, 1);
	memcpy(dwte, dwte0, nw * 4);
	memcpy(dwpe, dwpe0, np * 4);
	G = (struct gstate){.B = B, .T = T, .C = C, .N = N, .R = R, .tok = tok};
	G.x = todouble(wte, nw);
	G.w = todouble(wpe, np);
	G.out = dnew(no);

	be->embed_forward(out, tok, wte, wpe, B, T, C);
	obj_embed();
	CHECK_MSG(rel_err(out, G.out, no) < 1e-7, "forward err %g", rel_err(out, G.out, no));
	/* without wpe: the token rows alone */
	be->embed_forward(out, tok, wte, NULL, B, T, C);
	CHECK(out[2 * C + 3] == wte[tok[2] * C + 3]);

	/* the gradient is R scattered: accumulated on top of dwte0 */
	be->embed_backward(dwte, dwpe, R, tok, B, T, C);
	for (size_t i = 0; i < nw; i++)
		dwte[i] -= dwte0[i];
	for (size_t i = 0; i < np; i++)
		dwpe[i] -= dwpe0[i];
	double e1 = grad_check(G.x, nw, dwte, obj_embed, 1e-3);
	double e2 = grad_check(G.w, np, dwpe, obj_embed, 1e-3);
	CHECK_MSG(e1 < 1e-6 && e2 < 1e-6, "dwte err %g, dwpe err %g", e1, e2);
	/* dwpe NULL is allowed */
	be->embed_backward(dwte, NULL, R, tok, B, T, C);
	free(wte), free(wpe), free(out), free(R), free(dwte), free(dwpe), free(dwte0);
	free(dwpe0), free(G.x), free(G.w), free(G.out);
}

/* ---- layernorm / rmsnorm ---- */

static double obj_layernorm(void)
{
	ref_layernorm(G.out, G.x, G.w, G.b, G.N, G.C, G.eps);
	return dsum_prod(G.out, G.R, (size_t)G.N * G.C);
}

TEST(layernorm_forward_backward)
{
	int N = 6, C = 67; /* C not a multiple of the 64-column blocks */
	size_t no = (size_t)N * C;
	float *x = fnew(no), *w = fnew(C), *b = fnew(C), *out = fnew(no), *R = fnew(no);
	float *mean = fnew(N), *rstd = fnew(N), *dx = fnew(no), *dw = fnew(C), *db = fnew(C);
	float *dw0 = fnew(C), *db0 = fnew(C);

	frand(x, no, 11, 2);
	for (size_t i = 0; i < no; i++)
		x[i] += 0.5f; /* nonzero mean */
	frand(w, C, 12, 1);
	frand(b, C, 13, 1);
	frand(R, no, 14, 1);
	frand(dw0, C, 15, 1);
	frand(db0, C, 16, 1);
	memcpy(dw, dw0, C * 4);
	memcpy(db, db0, C * 4);
	G = (struct gstate){.N = N, .C = C, .eps = 1e-5, .R = R};
	G.x = todouble(x, no), G.w = todouble(w, C), G.b = todouble(b, C), G.out = dnew(no);

	be->layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5f);
	obj_layernorm();
	double ef = rel_err(out, G.out, no);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	garbage(dx, no);
	be->layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
	for (int c = 0; c < C; c++)
		dw[c] -= dw0[c], db[c] -= db0[c];
	/* tol 1e-5: the backward cancels terms of similar size in fp32 */
	double ex = grad_check(G.x, no, dx, obj_layernorm, 1e-5);
	double ew = grad_check(G.w, C, dw, obj_layernorm, 1e-5);
	double eb = grad_check(G.b, C, db, obj_layernorm, 1e-5);
	CHECK_MSG(ex < 1e-5 && ew < 1e-5 && eb < 1e-5, "dinp %g dw %g db %g", ex, ew, eb);
	free(x), free(w), free(b), free(out), free(R), free(mean), free(rstd), free(dx);
	free(dw), free(db), free(dw0), free(db0), free(G.x), free(G.w), free(G.b), free(G.out);
}

static double obj_rmsnorm(void)
{
	ref_rmsnorm(G.out, G.x, G.w, G.N, G.C, G.eps);
	return dsum_prod(G.out, G.R, (size_t)G.N * G.C);
}

TEST(rmsnorm_forward_backward)
{
	int N = 5, C = 70;
	size_t no = (size_t)N * C;
	float *x = fnew(no), *w = fnew(C), *out = fnew(no), *R = fnew(no), *rstd = fnew(N);
	float *dx = fnew(no), *dw = fnew(C), *dw0 = fnew(C);

	frand(x, no, 21, 1.5f);
	frand(w, C, 22, 1);
	frand(R, no, 23, 1);
	frand(dw0, C, 24, 1);
	memcpy(dw, dw0, C * 4);
	G = (struct gstate){.N = N, .C = C, .eps = 1e-5, .R = R};
	G.x = todouble(x, no), G.w = todouble(w, C), G.out = dnew(no);

	be->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
	obj_rmsnorm();
	double ef = rel_err(out, G.out, no);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	garbage(dx, no);
	be->rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
	for (int c = 0; c < C; c++)
		dw[c] -= dw0[c];
	double ex = grad_check(G.x, no, dx, obj_rmsnorm, 1e-5);
	double ew = grad_check(G.w, C, dw, obj_rmsnorm, 1e-5);
	CHECK_MSG(ex < 1e-5 && ew < 1e-5, "dinp %g dw %g", ex, ew);
	free(x), free(w), free(out), free(R), free(rstd), free(dx), free(dw), free(dw0);
	free(G.x), free(G.w), free(G.out);
}

/* ---- matmul ---- */

static double obj_matmul(void)
{
	ref_matmul(G.out, G.x, G.w, G.b, G.N, G.C, G.OC);
	return dsum_prod(G.out, G.R, (size_t)G.N * G.OC);
}

static void check_matmul(int with_bias)
{
	int N = 7, C = 13, OC = 11;
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	float *x = fnew(nx), *w = fnew(nw), *b = fnew(OC), *out = fnew(no), *R = fnew(no);
	float *dx = fnew(nx), *dw = fnew(nw), *db = fnew(OC), *dw0 = fnew(nw), *db0 = fnew(OC);

	frand(x, nx, 31, 1);
	frand(w, nw, 32, 1);
	frand(b, OC, 33, 1);
	frand(R, no, 34, 1);
	frand(dw0, nw, 35, 1);
	frand(db0, OC, 36, 1);
	memcpy(dw, dw0, nw * 4);
	memcpy(db, db0, OC * 4);
	G = (struct gstate){.N = N, .C = C, .OC = OC, .R = R};
	G.x = todouble(x, nx), G.w = todouble(w, nw), G.out = dnew(no);
	G.b = with_bias ? todouble(b, OC) : NULL;

	garbage(out, no);
	be->matmul_forward(out, x, w, with_bias ? b : NULL, N, C, OC);
	obj_matmul();
	double ef = rel_err(out, G.out, no);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	garbage(dx, nx);
	be->matmul_backward(dx, dw, with_bias ? db : NULL, R, x, w, N, C, OC);
	for (size_t i = 0; i < nw; i++)
		dw[i] -= dw0[i];
	for (int i = 0; i < OC; i++)
		db[i] -= db0[i];
	double ex = grad_check(G.x, nx, dx, obj_matmul, 1e-4);
	double ew = grad_check(G.w, nw, dw, obj_matmul, 1e-4);
	CHECK_MSG(ex < 1e-6 && ew < 1e-6, "dinp %g dw %g", ex, ew);
	if (with_bias) {
		double eb = grad_check(G.b, OC, db, obj_matmul, 1e-4);
		CHECK_MSG(eb < 1e-6, "dbias %g", eb);
	} else {
		for (int i = 0; i < OC; i++)
			CHECK(db[i] == 0.0f); /* dbias untouched */
	}
	/* dinp NULL: only dw accumulates (again) */
	memcpy(dw0, dw, nw * 4);
	be->matmul_backward(NULL, dw, NULL, R, x, w, N, C, OC);
	for (size_t i = 0; i < nw; i++)
		dw[i] -= dw0[i];
	CHECK(grad_check(G.w, nw, dw, obj_matmul, 1e-4) < 1e-6);
	free(x), free(w), free(b), free(out), free(R), free(dx), free(dw), free(db);
	free(dw0), free(db0), free(G.x), free(G.w), free(G.b), free(G.out);
}

TEST(matmul_forward_backward_bias)
{
	check_matmul(1);
}

TEST(matmul_forward_backward_nobias)
{
	check_matmul(0);
}

/* ---- rope ---- */

static double obj_rope(void)
{
	size_t n = (size_t)G.N * (G.NH + 2 * G.NKV) * G.HD;
	memcpy(G.out, G.x, n * sizeof(double));
	ref_rope(G.out, G.B, G.T, G.NH, G.NKV, G.HD, G.theta);
	return dsum_prod(G.out, G.R, n);
}

TEST(rope_forward_backward)
{
	int B = 2, T = 9, NH = 4, NKV = 2, HD = 8, N = B * T;
	size_t n = (size_t)N * (NH + 2 * NKV) * HD;
	float *qkv = fnew(n), *x = fnew(n), *R = fnew(n), *d = fnew(n);

	frand(x, n, 41, 1);
	frand(R, n, 42, 1);
	G = (struct gstate){.B = B, .T = T, .N = N, .NH = NH, .NKV = NKV, .HD = HD,
			.theta = 10000.0, .R = R};
	G.x = todouble(x, n), G.out = dnew(n);

	memcpy(qkv, x, n * 4);
	be->rope_forward(qkv, B, T, NH, NKV, HD, 10000.0f);
	obj_rope();
	double ef = rel_err(qkv, G.out, n);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	/* v heads untouched, position 0 untouched */
	CHECK(memcmp(qkv + (NH + NKV) * HD, x + (NH + NKV) * HD, NKV * HD * 4) == 0);
	CHECK(memcmp(qkv, x, (NH + NKV) * HD * 4) == 0);
	memcpy(d, R, n * 4);
	be->rope_backward(d, B, T, NH, NKV, HD, 10000.0f);
	double eb = grad_check(G.x, n, d, obj_rope, 1e-4);
	CHECK_MSG(eb < 1e-6, "backward err %g", eb);
	/* backward undoes forward (rotations are orthogonal) */
	be->rope_backward(qkv, B, T, NH, NKV, HD, 10000.0f);
	for (size_t i = 0; i < n; i++)
		CHECK_NEAR(qkv[i], x[i], 1e-5);
	free(qkv), free(x), free(R), free(d), free(G.x), free(G.out);
}

/* ---- attention ---- */

static double obj_attention(void)
{
	ref_attention(G.out, NULL, G.x, G.B, G.T, G.NH, G.NKV, G.HD);
	return dsum_prod(G.out, G.R, (size_t)G.N * G.NH * G.HD);
}

/* forward against the textbook formula, backward against finite differences */
static void check_attention(int B, int T, int NH, int NKV, int HD, uint64_t seed)
{
	int N = B * T, QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	float *qkv = fnew(nq), *out = fnew(no), *lse = fnew(nl), *R = fnew(no), *dq = fnew(nq);
	double *rlse = dnew(nl);

	frand(qkv, nq, seed, 1.0f);
	frand(R, no, seed + 1, 1.0f);
	G = (struct gstate){.B = B, .T = T, .N = N, .NH = NH, .NKV = NKV, .HD = HD, .R = R};
	G.x = todouble(qkv, nq), G.out = dnew(no);

	be->attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
	ref_attention(G.out, rlse, G.x, B, T, NH, NKV, HD);
	double ef = rel_err(out, G.out, no), el = rel_err(lse, rlse, nl);
	CHECK_MSG(ef < 1e-6 && el < 1e-6, "T=%d NH=%d NKV=%d: forward err %g lse err %g", T,
		  NH, NKV, ef, el);
	garbage(dq, nq);
	be->attention_backward(dq, R, qkv, out, lse, B, T, NH, NKV, HD);
	double eb = grad_check(G.x, nq, dq, obj_attention, 1e-5);
	CHECK_MSG(eb < 2e-5, "T=%d NH=%d NKV=%d: backward err %g", T, NH, NKV, eb);
	free(qkv), free(out), free(lse), free(R), free(dq), free(rlse), free(G.x), free(G.out);
}

TEST(attention_mha)
{
	check_attention(2, 5, 2, 2, 8, 51);
	if (test_failed())
		return;
	check_attention(1, 17, 3, 3, 4, 52);
}

TEST(attention_gqa)
{
	check_attention(2, 7, 4, 2, 8, 53);
	if (test_failed())
		return;
	check_attention(1, 13, 6, 2, 4, 54);
	if (test_failed())
		return;
	check_attention(1, 3, 4, 1, 6, 55); /* multi-query */
}

/* larger: only the forward against the reference (no finite differences) */
TEST(attention_forward_long)
{
	int B = 2, T = 131, NH = 4, NKV = 2, HD = 32, N = B * T;
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	float *qkv = fnew(nq), *out = fnew(no), *lse = fnew(nl);
	double *rout = dnew(no), *rlse = dnew(nl), *dqkv;

	frand(qkv, nq, 56, 1.5f);
	dqkv = todouble(qkv, nq);
	be->attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
	ref_attention(rout, rlse, dqkv, B, T, NH, NKV, HD);
	double ef = rel_err(out, rout, no), el = rel_err(lse, rlse, nl);
	CHECK_MSG(ef < 1e-6 && el < 1e-6, "forward err %g lse err %g", ef, el);
	free(qkv), free(out), free(lse), free(rout), free(rlse), free(dqkv);
}

/* ---- gelu / swiglu ---- */

static double obj_gelu(void)
{
	for (int i = 0; i < G.N; i++)
		G.out[i] = ref_gelu(G.x[i]);
	return dsum_prod(G.out, G.R, G.N);
}

TEST(gelu_forward_backward)
{
	int n = 1000;
	float *x = fnew(n), *out = fnew(n), *R = fnew(n), *dx = fnew(n);

	frand(x, n, 61, 3);
	x[0] = 0, x[1] = 20, x[2] = -20, x[3] = 1e-4f;
	frand(R, n, 62, 1);
	G = (struct gstate){.N = n, .R = R};
	G.x = todouble(x, n), G.out = dnew(n);
	be->gelu_forward(out, x, n);
	obj_gelu();
	double ef = rel_err(out, G.out, n);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	garbage(dx, n);
	be->gelu_backward(dx, x, R, n);
	double eb = grad_check(G.x, n, dx, obj_gelu, 1e-5);
	CHECK_MSG(eb < 1e-5, "backward err %g", eb);
	/* in place on dout */
	memcpy(out, R, n * 4);
	be->gelu_backward(out, x, out, n);
	CHECK(memcmp(out, dx, n * 4) == 0);
	free(x), free(out), free(R), free(dx), free(G.x), free(G.out);
}

static double obj_swiglu(void)
{
	for (int r = 0; r < G.N; r++)
		for (int i = 0; i < G.F; i++) {
			double g = G.x[(size_t)r * 2 * G.F + i], u = G.x[(size_t)r * 2 * G.F + G.F + i];
			G.out[(size_t)r * G.F + i] = g / (1 + exp(-g)) * u;
		}
	return dsum_prod(G.out, G.R, (size_t)G.N * G.F);
}

TEST(swiglu_forward_backward)
{
	int N = 6, F = 37;
	size_t ni = (size_t)N * 2 * F, no = (size_t)N * F;
	float *x = fnew(ni), *out = fnew(no), *R = fnew(no), *dx = fnew(ni);

	frand(x, ni, 71, 2.5f);
	frand(R, no, 72, 1);
	G = (struct gstate){.N = N, .F = F, .R = R};
	G.x = todouble(x, ni), G.out = dnew(no);
	be->swiglu_forward(out, x, N, F);
	obj_swiglu();
	double ef = rel_err(out, G.out, no);
	CHECK_MSG(ef < 1e-6, "forward err %g", ef);
	garbage(dx, ni);
	be->swiglu_backward(dx, R, x, N, F);
	double eb = grad_check(G.x, ni, dx, obj_swiglu, 1e-5);
	CHECK_MSG(eb < 1e-5, "backward err %g", eb);
	free(x), free(out), free(R), free(dx), free(G.x), free(G.out);
}

TEST(add_aliasing)
{
	float a[5] = {1, 2, 3, 4, 5}, b[5] = {10, 20, 30, 40, 50}, o[5];
	be->add(o, a, b, 5);
	CHECK(o[0] == 11 && o[4] == 55);
	be->add(a, a, b, 5);
	CHECK(a[0] == 11 && a[4] == 55);
	be->add(b, a, b, 5);
	CHECK(b[0] == 21 && b[4] == 105);
}

/* ---- softmax cross-entropy ---- */

static double obj_xent(void)
{
	ref_xent(G.out, G.x, G.tok, G.N, G.V, G.Vp);
	double s = 0;
	for (int n = 0; n < G.N; n++)
		s += G.out[n] * G.eps; /* eps holds dloss */
	return s;
}

TEST(softmax_xent_padded)
{
	int N = 5, V = 23, Vp = 32;
	size_t nl = (size_t)N * Vp;
	float *logits = fnew(nl), *losses = fnew(N), *d = fnew(nl), *l2 = fnew(N);
	int32_t tg[5] = {0, 22, 7, 7, 13};
	float dloss = 1.0f / N;

	frand(logits, nl, 81, 3);
	for (int n = 0; n < N; n++)
		for (int c = V; c < Vp; c++)
			logits[(size_t)n * Vp + c] = 1e4f; /* padding must not count */
	logits[2 * Vp + 5] = 80.0f;		   /* large logit: needs the max shift */
	G = (struct gstate){.N = N, .V = V, .Vp = Vp, .eps = dloss, .tok = tg};
	G.x = todouble(logits, nl), G.out = dnew(N);

	garbage(d, nl);
	be->softmax_xent(losses, d, logits, tg, N, V, Vp, dloss);
	obj_xent();
	double ef = rel_err(losses, G.out, N);
	CHECK_MSG(ef < 1e-6, "loss err %g", ef);
	for (int n = 0; n < N; n++)
		for (int c = V; c < Vp; c++)
			CHECK(d[(size_t)n * Vp + c] == 0.0f);
	double eb = grad_check(G.x, nl, d, obj_xent, 1e-5);
	CHECK_MSG(eb < 1e-5, "dlogits err %g", eb);
	/* losses only, and dlogits aliasing logits */
	be->softmax_xent(l2, NULL, logits, tg, N, V, Vp, dloss);
	CHECK(memcmp(l2, losses, N * 4) == 0);
	be->softmax_xent(l2, logits, logits, tg, N, V, Vp, dloss);
	CHECK(memcmp(l2, losses, N * 4) == 0);
	CHECK(memcmp(logits, d, nl * 4) == 0);
	free(logits), free(losses), free(d), free(l2), free(G.x), free(G.out);
}

/* ---- contracts of backend.h where the backends once differed ---- */

/* A target < 0 is ignored (loss 0, zero gradient row); a target >= V is a
 * bad input made visible (NaN loss, zero gradient row). Other rows are as
 * with valid targets, and nothing outside the logits is read or written. */
TEST(softmax_xent_target_out_of_range)
{
	int N = 6, V = 23, Vp = 32;
	size_t nl = (size_t)N * Vp;
	int32_t tg[6] = {3, -1, 23, 7, -7, 100000}, ok[6] = {3, 0, 0, 7, 0, 0};
	int bad[6] = {0, 1, 2, 0, 1, 2}; /* 0 valid, 1 ignored, 2 >= V */
	float *logits = fnew(nl), *d = fnew(nl), *dref = fnew(nl), *alias = fnew(nl);
	float *losses = fnew(N), *lref = fnew(N), *l2 = fnew(N);
	float dloss = 1.0f / N;

	frand(logits, nl, 91, 3);
	be->softmax_xent(lref, dref, logits, ok, N, V, Vp, dloss);
	garbage(d, nl);
	be->softmax_xent(losses, d, logits, tg, N, V, Vp, dloss);
	memcpy(alias, logits, nl * 4);
	be->softmax_xent(l2, alias, alias, tg, N, V, Vp, dloss); /* dlogits aliases logits */
	for (int n = 0; n < N; n++) {
		const float *row = d + (size_t)n * Vp, *arow = alias + (size_t)n * Vp;
		if (bad[n] == 0) {
			CHECK_MSG(losses[n] == lref[n] && l2[n] == lref[n], "row %d: loss changed", n);
			CHECK(!memcmp(row, dref + (size_t)n * Vp, Vp * 4));
			CHECK(!memcmp(arow, row, Vp * 4));
			continue;
		}
		if (bad[n] == 1)
			CHECK_MSG(losses[n] == 0.0f && l2[n] == 0.0f, "row %d: ignored target, loss %g",
				  n, losses[n]);
		else
			CHECK_MSG(isnan(losses[n]) && isnan(l2[n]), "row %d: target %d >= V, loss %g",
				  n, tg[n], losses[n]);
		for (int c = 0; c < Vp; c++)
			CHECK_MSG(row[c] == 0.0f && arow[c] == 0.0f,
				  "row %d (target %d): dlogits[%d] = %g, want 0", n, tg[n], c, row[c]);
	}
	be->softmax_xent(l2, NULL, logits, tg, N, V, Vp, dloss); /* loss only */
	CHECK(l2[0] == lref[0] && l2[1] == 0.0f && isnan(l2[2]) && isnan(l2[5]));
	free(logits), free(d), free(dref), free(alias), free(losses), free(lref), free(l2);
}

/* copy with dst == src is a no-op (memcpy onto itself would be UB in C). */
TEST(copy_onto_itself)
{
	float x[7] = {1, -2, 3.5f, 1e-30f, -0.0f, 7, 8}, y[7];
	memcpy(y, x, sizeof(x));
	be->copy(x, x, sizeof(x));
	CHECK(!memcmp(x, y, sizeof(x)));
	be->copy(x, x, 0);
	be->copy(x + 2, x + 2, 3 * sizeof(float));
	CHECK(!memcmp(x, y, sizeof(x)));
}

/* layernorm: NULL weight means 1, NULL bias 0; the backward skips dw or db
 * when that one is NULL and reads w = NULL as 1 too. Compared with the same
 * backend given explicit ones and zeros. */
TEST(layernorm_null_weight_bias)
{
	int N = 9, C = 131;
	size_t no = (size_t)N * C;
	float *x = fnew(no), *dy = fnew(no), *one = fnew(C), *zero = fnew(C);
	float *out0 = fnew(no), *out = fnew(no), *mean = fnew(N), *rstd = fnew(N);
	float *dx0 = fnew(no), *dx = fnew(no), *dw0 = fnew(C), *db0 = fnew(C);
	float *dw = fnew(C), *db = fnew(C);

	frand(x, no, 95, 2);
	frand(dy, no, 96, 1);
	for (int c = 0; c < C; c++)
		one[c] = 1.0f;
	be->layernorm_forward(out0, mean, rstd, x, one, zero, N, C, 1e-5f);
	be->layernorm_backward(dx0, dw0, db0, dy, x, one, mean, rstd, N, C);
	for (int k = 1; k < 4; k++) { /* bit 0: weight NULL, bit 1: bias NULL */
		garbage(out, no);
		be->layernorm_forward(out, mean, rstd, x, k & 1 ? NULL : one, k & 2 ? NULL : zero,
				      N, C, 1e-5f);
		for (size_t i = 0; i < no; i++)
			CHECK_MSG(fabsf(out[i] - out0[i]) <= 1e-6f * (fabsf(out0[i]) + 1),
				  "out[%zu] = %g, want %g (case %d)", i, out[i], out0[i], k);
	}
	/* dw only, db only, neither (a NULL one stays 0); w NULL each time */
	for (int k = 0; k < 3; k++) {
		memset(dw, 0, C * 4), memset(db, 0, C * 4);
		garbage(dx, no);
		int no_dw = k != 0, no_db = k != 1;
		be->layernorm_backward(dx, no_dw ? NULL : dw, no_db ? NULL : db, dy, x, NULL, mean,
				       rstd, N, C);
		for (size_t i = 0; i < no; i++)
			CHECK_MSG(fabsf(dx[i] - dx0[i]) <= 1e-6f * (fabsf(dx0[i]) + 1),
				  "dinp[%zu] = %g, want %g (case %d)", i, dx[i], dx0[i], k);
		for (int c = 0; c < C; c++) {
			float ww = no_dw ? 0.0f : dw0[c], wb = no_db ? 0.0f : db0[c];
			CHECK(fabsf(dw[c] - ww) <= 1e-6f * (fabsf(ww) + 1));
			CHECK(fabsf(db[c] - wb) <= 1e-6f * (fabsf(wb) + 1));
		}
	}
	free(x), free(dy), free(one), free(zero), free(out0), free(out), free(mean), free(rstd);
	free(dx0), free(dx), free(dw0), free(db0), free(dw), free(db);
}

/* ---- the vectorised exp behind softmax, GELU and SiLU ---- */

#include "../../kernels/cpu/cpu_math.h"

TEST(cpu_expf_accuracy)
{
	double worst = 0;
	for (float x = -87.0f; x < 88.3f; x += 0.00731f) {
		double e = exp((double)x), r = fabs(cpu_expf(x) - e) / e;
		worst = fmax(worst, r);
	}
	CHECK_MSG(worst < 1.5 * 5.97e-8, "max relative error %g (> 1.5 ulp)", worst);
	CHECK(cpu_expf(0.0f) == 1.0f);
	CHECK(cpu_expf(-100.0f) == 0.0f);
	CHECK(cpu_expf(-INFINITY) == 0.0f);
	CHECK(isnan(cpu_expf(NAN)));
	CHECK(cpu_expf(100.0f) > 1e38f);
	CHECK(cpu_tanhf(30.0f) == 1.0f && cpu_tanhf(-30.0f) == -1.0f);
}

/* ---- optimizer pieces against hand-computed values ---- */

TEST(adamw_dir_values)
{
	float g[4] = {0.5f, -1.0f, 2.0f, 0.0f}, m[4] = {0.1f, 0.2f, -0.3f, 0.05f};
	float v[4] = {0.01f, 0.04f, 0.09f, 0.0025f}, u[4];
	/* step 3: bc1 = 1 - 0.9^3, bc2 = 1 - 0.999^3; computed by hand in double */
	const double em[4] = {0.14, 0.08, -0.07, 0.045};
	const double ev[4] = {0.01024, 0.04096, 0.09391, 0.0024975};
	const double eu[4] = {-0.0027948094822487194, -0.0007985169970881756,
			      0.0004614410979033526, -0.0018190050870673998};
	be->adamw_dir(u, g, m, v, 4, 0.01f, 0.9f, 0.999f, 1e-8f, 0.271f, 0.002997001f);
	for (int i = 0; i < 4; i++) {
		CHECK_NEAR(m[i], em[i], 1e-6 * fabs(em[i]));
		CHECK_NEAR(v[i], ev[i], 1e-6 * fabs(ev[i]));
		CHECK_NEAR(u[i], eu[i], 2e-6 * fabs(eu[i]));
	}
}

TEST(lion_dir_values)
{
	float m[4] = {0.1f, -0.2f, 0.3f, 0.0f}, g[4] = {-2.0f, 0.5f, 0.1f, 0.0f}, u[4];
	/* c = 0.9 m + 0.1 g = (-0.11, -0.13, 0.28, 0): u = -lr sign(c) */
	const float eu[4] = {0.001f, 0.001f, -0.001f, 0.0f};
	const double em[4] = {0.079, -0.193, 0.298, 0.0};
	be->lion_dir(u, g, m, 4, 0.001f, 0.9f, 0.99f);
	for (int i = 0; i < 4; i++) {
		CHECK(u[i] == eu[i]);
		CHECK_NEAR(m[i], em[i], 1e-7);
	}
}

TEST(momentum_values)
{
	float m[3] = {0.5f, -1.0f, 0.25f}, g[3] = {1.0f, 2.0f, -4.0f}, out[3];
	/* m = 0.9 m + g = (1.45, 1.1, -3.775); nesterov: g + 0.9 m */
	be->momentum(out, g, m, 3, 0.9f, 0);
	CHECK_NEAR(m[0], 1.45, 1e-6);
	CHECK_NEAR(m[1], 1.1, 1e-6);
	CHECK_NEAR(m[2], -3.775, 1e-6);
	CHECK(memcmp(out, m, sizeof(m)) == 0);
	float m2[3] = {0.5f, -1.0f, 0.25f};
	be->momentum(out, g, m2, 3, 0.9f, 1);
	CHECK_NEAR(out[0], 2.305, 1e-6);
	CHECK_NEAR(out[1], 2.99, 1e-6);
	CHECK_NEAR(out[2], -7.3975, 1e-6);
	CHECK(memcmp(m, m2, sizeof(m)) == 0);
	/* out aliasing g (SGD writes the direction over the gradient) */
	float m3[3] = {0.5f, -1.0f, 0.25f}, g3[3] = {1.0f, 2.0f, -4.0f};
	be->momentum(g3, g3, m3, 3, 0.9f, 1);
	CHECK(memcmp(g3, out, sizeof(out)) == 0);
}

TEST(apply_update_values)
{
	float w[3] = {1.0f, -2.0f, 3.0f}, u[3] = {0.1f, 0.2f, -0.3f};
	float up[3] = {0.05f, -0.1f, 0.0f};
	/* no correction: w (1 - 0.01) + u */
	be->apply_update(w, u, NULL, 3, 0.01f, 0.5f);
	CHECK_NEAR(w[0], 1.09, 1e-6);
	CHECK_NEAR(w[1], -1.78, 1e-6);
	CHECK_NEAR(w[2], 2.67, 1e-6);
	/* correction: + lambda (u - u_prev), then u_prev = u */
	float w2[3] = {1.0f, -2.0f, 3.0f};
	be->apply_update(w2, u, up, 3, 0.01f, 0.5f);
	CHECK_NEAR(w2[0], 1.115, 1e-6);
	CHECK_NEAR(w2[1], -1.63, 1e-6);
	CHECK_NEAR(w2[2], 2.52, 1e-6);
	CHECK(memcmp(up, u, sizeof(u)) == 0);
	/* lambda 0 with u_prev is bit-identical to no correction */
	float w3[3] = {1.0f, -2.0f, 3.0f}, w4[3] = {1.0f, -2.0f, 3.0f};
	be->apply_update(w3, u, NULL, 3, 0.01f, 0.0f);
	be->apply_update(w4, u, up, 3, 0.01f, 0.0f);
	CHECK(memcmp(w3, w4, sizeof(w3)) == 0);
}

/* sumsq_many gives each tensor's sumsq bits, whatever the thread count
 * (large tensors are split over the threads, small ones run one per thread). */
TEST(sumsq_many_matches_sumsq)
{
	enum { COUNT = 40 };
	const float *xs[COUNT];
	size_t ns[COUNT];
	float *buf = xmalloc(sizeof(float) * 5000000);
	for (size_t i = 0; i < 5000000; i++)
		buf[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
	size_t off = 0;
	for (int k = 0; k < COUNT; k++) {
		ns[k] = k == 5 ? 0 : k % 9 == 2 ? 1000003 : (size_t)(1 + (k * 977) % 5000);
		if (off + ns[k] > 5000000)
			off = 0;
		xs[k] = buf + off;
		off += ns[k];
	}
	double want[COUNT];
	for (int k = 0; k < COUNT; k++)
		want[k] = be->sumsq(xs[k], ns[k]);
	for (int threads = 1; threads <= 3; threads++) {
		double got[COUNT];
		be->set_threads(threads);
		be->sumsq_many(got, xs, ns, COUNT);
		for (int k = 0; k < COUNT; k++)
			CHECK_MSG(memcmp(&got[k], &want[k], sizeof(double)) == 0,
				  "tensor %d (%zu floats), %d threads: %.17g vs %.17g", k, ns[k],
				  threads, got[k], want[k]);
	}
	be->set_threads(0);
	free(buf);
}

/* loss_mean: the float of the in-order double sum over N, as stage_forward
 * summed on the host before (pipelines and one worker share it). */
TEST(loss_mean_is_the_ordered_sum)
{
	int Ns[] = {1, 7, 4096, 16385};
	for (size_t k = 0; k < ARRAY_SIZE(Ns); k++) {
		int N = Ns[k];
		float *l = xmalloc(sizeof(float) * (size_t)N), out = -1;
		double sum = 0;
		for (int i = 0; i < N; i++) {
			l[i] = 10.0f / (float)(i + 3) + (float)(i % 5);
			sum += l[i];
		}
		be->loss_mean(&out, l, N);
		float want = (float)(sum / N);
		CHECK_MSG(memcmp(&out, &want, sizeof(float)) == 0, "N=%d: %.9g vs %.9g", N, out, want);
		free(l);
	}
}

TEST(sumsq_and_scale)
{
	float x[5] = {1.0f, -2.0f, 3.0f, 0.5f, 0.0f};
	CHECK(be->sumsq(x, 5) == 14.25);
	CHECK(be->sumsq(x, 0) == 0.0);
	be->scale(x, -2.0f, 5);
	CHECK(x[0] == -2.0f && x[1] == 4.0f && x[3] == -1.0f && x[4] == 0.0f);
	/* a long vector of 1e-4 accumulates in double: 10^7 * 1e-8 = 0.1 */
	size_t n = 10000000;
	float *y = fnew(n);
	for (size_t i = 0; i < n; i++)
		y[i] = 1e-4f;
	double s = be->sumsq(y, n), e = (double)n * (double)1e-4f * (double)1e-4f;
	CHECK_NEAR(s, e, 1e-12);
	free(y);
}

/* ---- Newton-Schulz ---- */

/* eigenvalues (w[n]) and eigenvectors (columns of V[n,n]) of the symmetric
 * A[n,n] (destroyed), by cyclic Jacobi rotations */
static void jacobi_eig(double *A, int n, double *w, double *V)
{
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			V[i * n + j] = i == j;
	for (int sweep = 0; sweep < 100; sweep++) {
		double off = 0;
		for (int p = 0; p < n; p++)
			for (int q = p + 1; q < n; q++)
				off += A[p * n + q] * A[p * n + q];
		if (off < 1e-26)
			break;
		for (int p = 0; p < n; p++)
			for (int q = p + 1; q < n; q++) {
				double apq = A[p * n + q];
				if (fabs(apq) < 1e-300)
					continue;
				double th = (A[q * n + q] - A[p * n + p]) / (2 * apq);
				double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1));
				double c = 1 / sqrt(t * t + 1), s = t * c;
				for (int k = 0; k < n; k++) { /* A = A J */
					double akp = A[k * n + p], akq = A[k * n + q];
					A[k * n + p] = c * akp - s * akq;
					A[k * n + q] = s * akp + c * akq;
				}
				for (int k = 0; k < n; k++) { /* A = J^T A */
					double apk = A[p * n + k], aqk = A[q * n + k];
					A[p * n + k] = c * apk - s * aqk;
					A[q * n + k] = s * apk + c * aqk;
				}
				for (int k = 0; k < n; k++) {
					double vkp = V[k * n + p], vkq = V[k * n + q];
					V[k * n + p] = c * vkp - s * vkq;
					V[k * n + q] = s * vkp + c * vkq;
				}
			}
	}
	for (int i = 0; i < n; i++)
		w[i] = A[i * n + i];
}

/* G[m,m] = X X^T for X[m,n] (double); tr: X is given as Xt[n,m] */
static void gram(double *Gm, const float *x, int rows, int cols)
{
	int tr = rows > cols, m = tr ? cols : rows, n = tr ? rows : cols;
#define XE(i, k) (tr ? (double)x[(size_t)(k) * cols + (i)] : (double)x[(size_t)(i) * cols + (k)])
	for (int i = 0; i < m; i++)
		for (int j = 0; j < m; j++) {
			double s = 0;
			for (int k = 0; k < n; k++)
				s += XE(i, k) * XE(j, k);
			Gm[i * m + j] = s;
		}
}

static void check_ns(int rows, int cols, uint64_t seed)
{
	int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows, tr = rows > cols;
	size_t sz = (size_t)rows * cols;
	float *in = fnew(sz), *out = fnew(sz), *scr = fnew(newton_schulz_scratch(rows, cols));
	double *Gm = dnew((size_t)m * m), *w = dnew(m), *V = dnew((size_t)m * m);
	double *P = dnew(sz);

	frand(in, sz, seed, 0.02f);
	be->newton_schulz(out, in, rows, cols, 5, scr);

	/* singular values of the output: sqrt of the eigenvalues of its Gram */
	gram(Gm, out, rows, cols);
	jacobi_eig(Gm, m, w, V);
	double smin = INFINITY, smax = 0;
	for (int i = 0; i < m; i++) {
		double s = sqrt(fmax(w[i], 0));
		smin = fmin(smin, s), smax = fmax(smax, s);
	}
	CHECK_MSG(smin > 0.6 && smax < 1.25, "%dx%d: singular values in [%g, %g]", rows, cols,
		  smin, smax);

	/* the exact polar factor U V^T = (X X^T)^{-1/2} X in the m <= n orientation */
	gram(Gm, in, rows, cols);
	jacobi_eig(Gm, m, w, V);
	double dot = 0, np = 0, no = 0;
	for (int i = 0; i < m; i++)
		for (int k = 0; k < n; k++) {
			double p = 0;
			for (int j = 0; j < m; j++) {
				/* (X X^T)^{-1/2}[i,j] = sum_l V[i,l] w_l^{-1/2} V[j,l] */
				double s = 0;
				for (int l = 0; l < m; l++)
					s += V[i * m + l] * V[j * m + l] / sqrt(w[l]);
				p += s * (tr ? in[(size_t)k * cols + j] : in[(size_t)j * cols + k]);
			}
			double o = tr ? out[(size_t)k * cols + i] : out[(size_t)i * cols + k];
			dot += p * o, np += p * p, no += o * o;
		}
	double cosine = dot / sqrt(np * no);
	CHECK_MSG(cosine > 0.97, "%dx%d: cosine to the polar factor %g", rows, cols, cosine);
	CHECK_MSG(fabs(np - m) < 1e-6 * m, "polar factor norm^2 %g != %d", np, m);

	/* out may alias in */
	float *io = fnew(sz);
	memcpy(io, in, sz * 4);
	be->newton_schulz(io, io, rows, cols, 5, scr);
	CHECK(memcmp(io, out, sz * 4) == 0);
	free(in), free(out), free(scr), free(Gm), free(w), free(V), free(P), free(io);
}

TEST(newton_schulz_singular_values)
{
	check_ns(24, 24, 91);
	if (test_failed())
		return;
	check_ns(40, 16, 92); /* tall: transposed internally */
	if (test_failed())
		return;
	check_ns(16, 40, 93); /* wide */
	if (test_failed())
		return;
	check_ns(1, 9, 94);
}

/* ---- results do not depend on the thread count ---- */

/* Runs every operation on shapes big enough for the parallel paths (and for
 * OpenBLAS to use several threads) and appends every output to out[]. */
#define SUITE_MAX 48
struct suite {
	int n;
	const char *name[SUITE_MAX];
	float *buf[SUITE_MAX];
	size_t len[SUITE_MAX];
};

static float *keep(struct suite *s, const char *name, const float *x, size_t n)
{
	if (s->n < SUITE_MAX) {
		s->name[s->n] = name;
		s->len[s->n] = n;
		s->buf[s->n] = fnew(n);
		memcpy(s->buf[s->n++], x, n * sizeof(float));
	}
	return (float *)x;
}

static void suite_free(struct suite *s)
{
	for (int i = 0; i < s->n; i++)
		free(s->buf[i]);
	s->n = 0;
}

static void run_suite(struct suite *s)
{
	int B = 2, T = 67, C = 192, N = B * T, OC = 320, V = 500, Vp = 512;
	int NH = 4, NKV = 2, HD = 32, QKV = (NH + 2 * NKV) * HD;
	size_t nx = (size_t)N * C;
	float *x = fnew(nx), *w = fnew((size_t)OC * C), *b = fnew(OC), *o = fnew((size_t)N * Vp);
	float *dx = fnew((size_t)N * Vp), *dw = fnew((size_t)Vp * C), *db = fnew(OC);
	float *mean = fnew(N), *rstd = fnew(N), *R = fnew((size_t)N * Vp);
	float *qkv = fnew((size_t)N * QKV), *lse = fnew((size_t)B * NH * T);
	float *dp = fnew((size_t)T * C);
	int32_t *tok = xcalloc(N, sizeof(int32_t));
	uint64_t st = 5;

	for (int n = 0; n < N; n++)
		tok[n] = (int32_t)(rng_next(&st) % 40); /* few tokens: many collisions */
	frand(x, nx, 101, 1);
	frand(w, (size_t)OC * C, 102, 0.1f);
	frand(b, OC, 103, 1);
	frand(R, (size_t)N * Vp, 104, 1);
	frand(qkv, (size_t)N * QKV, 105, 1);

	frand(dp, (size_t)T * C, 107, 1);
	be->embed_forward(o, tok, w, dp, B, T, C);
	keep(s, "embed_forward", o, nx);
	be->embed_backward(dw, dp, R, tok, B, T, C);
	keep(s, "embed_backward dwte", dw, (size_t)Vp * C);
	keep(s, "embed_backward dwpe", dp, (size_t)T * C);
	be->layernorm_forward(o, mean, rstd, x, w, b, N, C, 1e-5f);
	keep(s, "layernorm_forward", o, nx);
	be->layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
	keep(s, "layernorm_backward dinp", dx, nx);
	keep(s, "layernorm_backward dw", dw, C);
	keep(s, "layernorm_backward db", db, C);
	be->rmsnorm_forward(o, rstd, x, w, N, C, 1e-5f);
	keep(s, "rmsnorm_forward", o, nx);
	be->rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
	keep(s, "rmsnorm_backward dinp", dx, nx);
	keep(s, "rmsnorm_backward dw", dw, C);
	be->matmul_forward(o, x, w, b, N, C, OC);
	keep(s, "matmul_forward", o, (size_t)N * OC);
	be->matmul_backward(dx, dw, db, R, x, w, N, C, OC);
	keep(s, "matmul_backward dinp", dx, nx);
	keep(s, "matmul_backward dw", dw, (size_t)OC * C);
	keep(s, "matmul_backward db", db, OC);
	{
		/* more than one 256 x 1024 output tile of cpu_gemm in each product */
		int M2 = 300, K2 = 64, O2 = 1100;
		float *a2 = fnew((size_t)M2 * K2), *w2 = fnew((size_t)O2 * K2);
		float *o2 = fnew((size_t)M2 * O2), *da = fnew((size_t)M2 * K2);
		float *dw2 = fnew((size_t)O2 * K2);
		frand(a2, (size_t)M2 * K2, 108, 1);
		frand(w2, (size_t)O2 * K2, 109, 1);
		be->matmul_forward(o2, a2, w2, NULL, M2, K2, O2);
		keep(s, "matmul_forward multi-tile", o2, (size_t)M2 * O2);
		be->matmul_backward(da, dw2, NULL, o2, a2, w2, M2, K2, O2);
		keep(s, "matmul_backward multi-tile dinp", da, (size_t)M2 * K2);
		keep(s, "matmul_backward multi-tile dw", dw2, (size_t)O2 * K2);
		free(a2), free(w2), free(o2), free(da), free(dw2);
	}
	be->rope_forward(qkv, B, T, NH, NKV, HD, 10000.0f);
	keep(s, "rope_forward", qkv, (size_t)N * QKV);
	be->attention_forward(o, lse, qkv, B, T, NH, NKV, HD);
	keep(s, "attention_forward", o, (size_t)N * NH * HD);
	keep(s, "attention_forward lse", lse, (size_t)B * NH * T);
	be->attention_backward(dx, R, qkv, o, lse, B, T, NH, NKV, HD);
	keep(s, "attention_backward", dx, (size_t)N * QKV);
	be->rope_backward(dx, B, T, NH, NKV, HD, 10000.0f);
	keep(s, "rope_backward", dx, (size_t)N * QKV);
	be->gelu_forward(o, x, nx);
	keep(s, "gelu_forward", o, nx);
	be->gelu_backward(dx, x, R, nx);
	keep(s, "gelu_backward", dx, nx);
	be->swiglu_forward(o, x, N, C / 2);
	keep(s, "swiglu_forward", o, (size_t)N * C / 2);
	be->swiglu_backward(dx, R, x, N, C / 2);
	keep(s, "swiglu_backward", dx, nx);
	be->add(o, x, R, nx);
	keep(s, "add", o, nx);
	frand(o, (size_t)N * Vp, 106, 3);
	be->softmax_xent(mean, dx, o, tok, N, V, Vp, 0.01f);
	keep(s, "softmax_xent losses", mean, N);
	keep(s, "softmax_xent dlogits", dx, (size_t)N * Vp);
	/* optimizer pieces on the matmul weight's shape */
	size_t nw = (size_t)OC * C;
	float *m = fnew(nw), *v = fnew(nw), *u = fnew(nw);
	be->adamw_dir(u, R, m, v, nw, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f);
	keep(s, "adamw_dir", u, nw);
	be->lion_dir(u, R, m, nw, 1e-3f, 0.9f, 0.99f);
	keep(s, "lion_dir", u, nw);
	be->momentum(u, R, m, nw, 0.95f, 1);
	keep(s, "momentum", u, nw);
	be->apply_update(w, u, v, nw, 0.01f, 1.0f);
	keep(s, "apply_update", w, nw);
	double ss = be->sumsq(R, (size_t)N * Vp);
	float ssf[2] = {(float)ss, (float)(ss - (float)ss)};
	keep(s, "sumsq", ssf, 2);
	be->scale(R, 0.7f, (size_t)N * Vp);
	keep(s, "scale", R, (size_t)N * Vp);
	float *scr = fnew(newton_schulz_scratch(OC, C));
	be->newton_schulz(u, w, OC, C, 5, scr);
	keep(s, "newton_schulz tall", u, nw);
	be->newton_schulz(u, w, C, OC, 5, scr);
	keep(s, "newton_schulz wide", u, nw);
	free(scr), free(m), free(v), free(u);
	free(x), free(w), free(b), free(o), free(dx), free(dw), free(db), free(mean), free(rstd);
	free(R), free(qkv), free(lse), free(dp), free(tok);
}

TEST(thread_count_invariance)
{
	struct suite ref = {0}, s = {0};
	be->set_threads(1);
	run_suite(&ref);
	CHECK(ref.n < SUITE_MAX);
	for (int th = 2; th <= 3; th++) {
		be->set_threads(th);
		run_suite(&s);
		CHECK(s.n == ref.n);
		for (int i = 0; i < s.n; i++)
			CHECK_MSG(memcmp(s.buf[i], ref.buf[i], s.len[i] * sizeof(float)) == 0,
				  "%s differs between 1 and %d threads", s.name[i], th);
		suite_free(&s);
	}
	be->set_threads(0);
	suite_free(&ref);
}

/* pipeline stages call the backend from threads of their own at once */
static void *suite_thread(void *arg)
{
	run_suite(arg);
	return NULL;
}

TEST(concurrent_callers)
{
	struct suite ref = {0}, s[3] = {{0}};
	pthread_t th[3];
	be->set_threads(2);
	run_suite(&ref);
	for (int i = 0; i < 3; i++)
		CHECK(pthread_create(&th[i], NULL, suite_thread, &s[i]) == 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	for (int t = 0; t < 3; t++) {
		for (int i = 0; i < ref.n; i++)
			CHECK_MSG(memcmp(s[t].buf[i], ref.buf[i], ref.len[i] * sizeof(float)) == 0,
				  "%s differs when 3 threads call the backend at once", ref.name[i]);
		suite_free(&s[t]);
	}
	be->set_threads(0);
	suite_free(&ref);
}
