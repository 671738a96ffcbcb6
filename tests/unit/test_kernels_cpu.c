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
