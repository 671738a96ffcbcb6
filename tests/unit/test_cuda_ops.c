/* test_cuda_ops.c - every CUDA backend operation against a reference.
 *
 * Every test SKIPs when this binary has no CUDA backend or no usable device
 * (cuda_available() says why), and per operation when a backend lacks the
 * slot. Most ops are compared with the CPU backend; attention, matmul at odd
 * shapes and Newton-Schulz with references computed here in double (written
 * independently of kernels/cpu).
 *
 * Inputs are fresh every run: the seed is ASYNCPP_TEST_SEED when set, else
 * drawn from the time and pid; every test starts again from it and every
 * failure names it, so `ASYNCPP_TEST_SEED=S test_cuda_ops TEST` repeats one.
 * Outputs an op overwrites are filled with NaN on the device before the call,
 * so an element it fails to write fails the comparison.
 *
 * Tolerances, relative to max|reference| of the compared tensor (fp32
 * kernels unless stated):
 *   memory, embed_forward, add, scale         exact
 *   norms, rope, gelu, swiglu, softmax_xent   1e-5
 *   optimizer pieces                          1e-6 (lion: exact signs)
 *   sumsq                                     1e-9 (both in double)
 *   attention vs double, each of out, lse,    forward 1e-4, backward 1e-3:
 *     dq, dk, dv on its own (SIMT kernels)    fp32 sums over up to T*NH/NKV
 *                                             terms; the fp32 CPU backend
 *                                             measures ~5e-7, a wrong mask
 *                                             or head mapping gives O(1)
 *   flash attention (bf16 tensor cores) vs    forward 1e-2, backward 2e-2:
 *     double, and vs the SIMT kernels         q, k, v, dout and then p and ds
 *                                             are rounded to bf16 (unit
 *                                             roundoff u = 2^-9 = 2e-3). A
 *                                             score q.k/sqrt(HD) then errs by
 *                                             ~sqrt(2) u |q||k|/sqrt(HD)
 *                                             ~ 3e-3 (inputs N(0,1)), so p by
 *                                             ~0.3% relative, plus u from p's
 *                                             own rounding; out, an average of
 *                                             v, errs by a few u relative to
 *                                             max|out|. The backward chains
 *                                             two such products (dp = dout.v,
 *                                             then ds (dp - D) times q or k)
 *                                             and rounds ds: about twice the
 *                                             forward's error. Measured with
 *                                             kernels/cuda/dev/flash_emulate
 *                                             (exact bf16 roundings, fp32
 *                                             sums) at this file's shapes:
 *                                             forward <= 4.3e-3, backward
 *                                             <= 6.5e-3 (NOTES.md); a wrong
 *                                             fragment index gives O(1)
 *   matmul (bf16 operands, fp32 accumulate)   1e-2: rounding each operand to
 *                                             bf16 (unit roundoff 2^-9) gives
 *                                             per-element errors ~1.6e-3 of
 *                                             the output's spread, so about
 *                                             2e-3 of max|ref| at worst;
 *                                             misaligned operands: bit-identical
 *   matmul dbias (fp32 column sums)           1e-5
 *   bf16 table (cuda_bf16_*)                  bit for bit the f32 table's
 *                                             result on the same values,
 *                                             rounded (matmul out, dinp: 1
 *                                             bf16 ulp + 1e-4); vs the CPU's
 *                                             bf16 ops: exact where f32 is,
 *                                             else 1 bf16 ulp + the f32
 *                                             tolerance (see the section)
 *   newton_schulz (bf16 GEMMs, 5 steps)       Frobenius 6e-2 of |ref|_F vs
 *                                             double, and the diagonal of the
 *                                             short side's Gram matrix in
 *                                             [0.5, 1.5]: see ns_case
 * Reductions must also repeat bit for bit (determinism tests).
 *
 * cuda_ops_harness_on_cpu runs the double-reference cases and the contract
 * cases against the CPU backend at small shapes, so the references and the
 * checking code are proved in every run, not only on a GPU machine.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#ifdef ASYNCPP_CUDA
#include "../../kernels/cuda/cuda_flash.h"
int cuda_rope_tables_made(void); /* cuda_elementwise.cu, for cuda_rope_table */
#endif
#include "../ref_attention.h"
#include "../split_ops.h"
#include "../test.h"

static const struct backend *cu;
static const struct backend *ref = &backend_cpu;
/* The backend the device helpers below talk to: cu, or the CPU backend in
 * cuda_ops_harness_on_cpu. */
static const struct backend *dev;
static int ready = -1;
static char why[256];

/* ---- seeds: fresh every run, named by every failure ---- */

static uint64_t seed0, seed;

static void seed_test(void)
{
	if (!seed0) {
		const char *e = getenv("ASYNCPP_TEST_SEED");
		seed0 = e && *e ? strtoull(e, NULL, 0)
				: rng_mix((uint64_t)time(NULL), (uint64_t)getpid());
		if (!seed0)
			seed0 = 1;
		fprintf(stderr, "test_cuda_ops: ASYNCPP_TEST_SEED=%llu\n",
			(unsigned long long)seed0);
	}
	seed = seed0;
}

#define SEED_FMT " [ASYNCPP_TEST_SEED=%llu]"
#define SEED_ARG ((unsigned long long)seed0)

/* test.h's CHECK, naming the seed */
#undef CHECK
#define CHECK(cond) CHECK_MSG(cond, "%s" SEED_FMT, #cond, SEED_ARG)

static int cuda_ready(void)
{
	seed_test();
	if (ready < 0) {
		cu = backend_cuda();
		if (!cu)
			snprintf(why, sizeof(why), "this binary has no CUDA backend");
		ready = cu && cuda_available(why, sizeof(why));
	}
	dev = cu;
	return ready;
}

#define NEED(slot)                                                                \
	do {                                                                      \
		if (!cuda_ready())                                                \
			SKIP(why);                                                \
		if (!ref->slot || !cu->slot)                                      \
			SKIP("cpu or cuda backend lacks " #slot);                 \
	} while (0)

/* ---- host buffers ---- */

static float *randn(size_t n, float s)
{
	float *x = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	for (size_t i = 0; i < n; i++)
		x[i] = s * rng_normal(&seed);
	return x;
}

static float *fill(size_t n, float v)
{
	float *x = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	for (size_t i = 0; i < n; i++)
		x[i] = v;
	return x;
}

static float *dupf(const float *x, size_t n)
{
	return memcpy(xmalloc(st_mult(n ? n : 1, sizeof(float))), x, n * sizeof(float));
}

static double *dnew(size_t n)
{
	return xcalloc(n ? n : 1, sizeof(double));
}

/* ---- device buffers (on dev) ---- */

static void *put(const void *h, size_t bytes)
{
	void *d = dev->alloc(bytes);
	dev->to_device(d, h, bytes);
	return d;
}

static float *putf(const float *h, size_t n)
{
	return put(h, n * sizeof(float));
}

static float *getf(const float *d, size_t n)
{
	float *h = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	dev->to_host(h, d, n * sizeof(float));
	return h;
}

/* Fill d[n] with NaN before an op that must overwrite all of it. */
static void poison(float *d, size_t n)
{
	float *h = fill(n, NAN);
	dev->to_device(d, h, n * sizeof(float));
	free(h);
}

/* A device buffer of n floats, all NaN. */
static float *nan_dev(size_t n)
{
	float *d = dev->alloc(n * sizeof(float));
	poison(d, n);
	return d;
}

/* n floats at `off` floats past a fresh allocation (*base, for free):
 * off 1 leaves the pointer 4 bytes past every vector alignment. Holding h,
 * or NaN when h is NULL. */
static float *put_at(const float *h, size_t n, int off, float **base)
{
	*base = dev->alloc((n + off) * sizeof(float));
	float *d = *base + off;
	if (h)
		dev->to_device(d, h, n * sizeof(float));
	else
		poison(d, n);
	return d;
}

/* ---- comparisons ---- */

/* max |got - want| / (max |want| or 1 when want is ~0) */
static double rel_err(const float *got, const float *want, size_t n)
{
	double md = 0, mw = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= md)) /* NaN propagates */
			md = d;
		if (fabs(want[i]) > mw)
			mw = fabs(want[i]);
	}
	return md / (mw > 1e-30 ? mw : 1.0);
}

#define CHECK_CLOSE(got, want, n, tol)                                            \
	do {                                                                      \
		double e_ = rel_err(got, want, n);                                \
		CHECK_MSG(e_ <= (tol), "%s vs %s: relative error %.3g > %g" SEED_FMT, \
			  #got, #want, e_, (double)(tol), SEED_ARG);              \
	} while (0)

/* The worst element of got[rows, cols] (row stride `stride`) against a
 * double reference laid out alike: |got - want| / max(max|want|, floor),
 * NaN worst. */
struct worst {
	double rel, got, want;
	size_t row, col;
};

static struct worst cmp_ref_floor(const float *got, const double *want, size_t rows,
				  size_t cols, size_t stride, double floor)
{
	struct worst w = {0, 0, 0, 0, 0};
	double mw = floor, md = -1;
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++)
			mw = fmax(mw, fabs(want[r * stride + c]));
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++) {
			double g = got[r * stride + c], x = want[r * stride + c];
			double d = isnan(g) ? INFINITY : fabs(g - x);
			if (d > md)
				md = d, w = (struct worst){0, g, x, r, c};
		}
	w.rel = md / (mw > 1e-30 ? mw : 1.0);
	return w;
}

/* What the case functions below are checking, for their messages. */
static char ctx[160];

#define CHECK_REF(got_, want_, rows, cols, stride, tol, what)                        \
	CHECK_REF_FLOOR(got_, want_, rows, cols, stride, 0, tol, what)
/* The same, the error relative to at least `floor` (a block whose exact
 * values cancel to 0 holds only rounding noise of terms of that size). */
#define CHECK_REF_FLOOR(got_, want_, rows, cols, stride, floor, tol, what)           \
	do {                                                                       \
		struct worst w_ = cmp_ref_floor(got_, want_, rows, cols, stride, floor); \
		CHECK_MSG(w_.rel <= (tol),                                         \
			  "%s: %s: relative error %.3g > %g at [%zu][%zu]: got %.9g, " \
			  "want %.9g" SEED_FMT, ctx, what, w_.rel, (double)(tol),  \
			  w_.row, w_.col, w_.got, w_.want, SEED_ARG);              \
	} while (0)

/* ---- memory ---- */

TEST(cuda_memory)
{
	if (!cuda_ready())
		SKIP(why);
	size_t n = 1000;
	float *d = cu->alloc(n * sizeof(float)), *h = getf(d, n);
	for (size_t i = 0; i < n; i++)
		CHECK_MSG(h[i] == 0.0f, "alloc not zeroed at %zu", i);
	float *x = randn(n, 1);
	cu->to_device(d, x, n * sizeof(float));
	float *d2 = cu->alloc(n * sizeof(float));
	cu->copy(d2, d, n * sizeof(float));
	float *y = getf(d2, n);
	CHECK(!memcmp(x, y, n * sizeof(float)));
	cu->zero(d2, 10 * sizeof(float));
	cu->synchronize();
	float *z = getf(d2, n);
	CHECK(z[0] == 0 && z[9] == 0 && z[10] == x[10]);
	cu->free(d);
	cu->free(d2);
	free(h), free(x), free(y), free(z);
}

/* ---- embeddings ---- */

TEST(cuda_embed)
{
	NEED(embed_forward);
	NEED(embed_backward);
	int B = 3, T = 37, C = 70, Vp = 50, N = B * T;
	int32_t tok[3 * 37];
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)(rng_next(&seed) % 7) * 7; /* many repeats */
	float *wte = randn((size_t)Vp * C, 1), *wpe = randn((size_t)T * C, 1);
	float *out = fill((size_t)N * C, 0);
	ref->embed_forward(out, tok, wte, wpe, B, T, C);
	int32_t *dtok = put(tok, sizeof(tok));
	float *dwte_ = putf(wte, (size_t)Vp * C), *dwpe_ = putf(wpe, (size_t)T * C);
	float *dout_ = nan_dev((size_t)N * C);
	cu->embed_forward(dout_, dtok, dwte_, dwpe_, B, T, C);
	float *got = getf(dout_, (size_t)N * C);
	CHECK_CLOSE(got, out, (size_t)N * C, 0);
	free(got);
	poison(dout_, (size_t)N * C);
	cu->embed_forward(dout_, dtok, dwte_, NULL, B, T, C);
	got = getf(dout_, (size_t)N * C);
	for (size_t i = 0; i < (size_t)N * C; i++)
		CHECK(got[i] == wte[(size_t)tok[i / C] * C + i % C]);

	/* backward accumulates into non-zero gradients */
	float *g = randn((size_t)N * C, 1);
	float *gw = randn((size_t)Vp * C, 1), *gp = randn((size_t)T * C, 1);
	float *gw_c = putf(gw, (size_t)Vp * C), *gp_c = putf(gp, (size_t)T * C);
	float *g_c = putf(g, (size_t)N * C);
	ref->embed_backward(gw, gp, g, tok, B, T, C);
	cu->embed_backward(gw_c, gp_c, g_c, dtok, B, T, C);
	float *hw = getf(gw_c, (size_t)Vp * C), *hp = getf(gp_c, (size_t)T * C);
	CHECK_CLOSE(hw, gw, (size_t)Vp * C, 1e-5);
	CHECK_CLOSE(hp, gp, (size_t)T * C, 1e-5);
	/* determinism: again from the same start */
	float *gw2 = randn((size_t)Vp * C, 1);
	cu->to_device(gw_c, gw2, (size_t)Vp * C * sizeof(float));
	cu->embed_backward(gw_c, NULL, g_c, dtok, B, T, C);
	float *a = getf(gw_c, (size_t)Vp * C);
	cu->to_device(gw_c, gw2, (size_t)Vp * C * sizeof(float));
	cu->embed_backward(gw_c, NULL, g_c, dtok, B, T, C);
	float *b = getf(gw_c, (size_t)Vp * C);
	CHECK(!memcmp(a, b, (size_t)Vp * C * sizeof(float)));
	/* the order is the contract: per token, its rows summed from 0 in
	 * ascending position, then added (exact, computed here in fp32) */
	for (int v = 0; v < Vp; v++)
		for (int c = 0; c < C; c++) {
			float s = 0;
			for (int n = 0; n < N; n++)
				if (tok[n] == v)
					s += g[(size_t)n * C + c];
			gw2[(size_t)v * C + c] += s;
		}
	size_t off = 0;
	for (size_t i = 0; i < (size_t)Vp * C; i++)
		off += memcmp(&a[i], &gw2[i], sizeof(float)) != 0;
	CHECK_MSG(off == 0, "%zu of %zu dwte elements differ from the ordered sum", off,
		  (size_t)Vp * C);
	cu->free(dtok), cu->free(dwte_), cu->free(dwpe_), cu->free(dout_);
	cu->free(gw_c), cu->free(gp_c), cu->free(g_c);
	free(wte), free(wpe), free(out), free(got), free(g), free(gw), free(gp);
	free(hw), free(hp), free(gw2), free(a), free(b);
}

/* ---- norms ---- */

static void norm_case(int ln, int N, int C)
{
	size_t nc = (size_t)N * C;
	float *x = randn(nc, 2), *w = randn(C, 1), *bb = randn(C, 1);
	for (size_t i = 0; i < nc; i++)
		x[i] += 0.5f; /* non-zero mean */
	float *out = fill(nc, 0), *mean = fill(N, 0), *rstd = fill(N, 0);
	float *x_c = putf(x, nc), *w_c = putf(w, C), *b_c = putf(bb, C);
	float *out_c = nan_dev(nc), *mean_c = nan_dev(N), *rstd_c = nan_dev(N);
	if (ln) {
		ref->layernorm_forward(out, mean, rstd, x, w, bb, N, C, 1e-5f);
		cu->layernorm_forward(out_c, mean_c, rstd_c, x_c, w_c, b_c, N, C, 1e-5f);
	} else {
		ref->rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
		cu->rmsnorm_forward(out_c, rstd_c, x_c, w_c, N, C, 1e-5f);
	}
	float *o = getf(out_c, nc), *r = getf(rstd_c, N), *m = getf(mean_c, N);
	CHECK_CLOSE(o, out, nc, 1e-5);
	CHECK_CLOSE(r, rstd, N, 1e-5);
	if (ln)
		CHECK_CLOSE(m, mean, N, 1e-5);

	/* backward: dinp overwritten (prefilled with NaN), dw/db accumulated */
	float *dy = randn(nc, 1), *dw = randn(C, 1), *db = randn(C, 1), *dx = fill(nc, 0);
	float *dy_c = putf(dy, nc), *dw_c = putf(dw, C), *db_c = putf(db, C);
	float *dx_c = nan_dev(nc);
	float *dw0 = dupf(dw, C);
	if (ln) {
		ref->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C);
		cu->layernorm_backward(dx_c, dw_c, db_c, dy_c, x_c, w_c, mean_c, rstd_c, N, C);
	} else {
		ref->rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);
		cu->rmsnorm_backward(dx_c, dw_c, dy_c, x_c, w_c, rstd_c, N, C);
	}
	float *hx = getf(dx_c, nc), *hw = getf(dw_c, C), *hb = getf(db_c, C);
	CHECK_CLOSE(hx, dx, nc, 1e-5);
	CHECK_CLOSE(hw, dw, C, 1e-5);
	if (ln)
		CHECK_CLOSE(hb, db, C, 1e-5);
	/* determinism of the weight-gradient reduction */
	cu->to_device(dw_c, dw0, C * 4);
	if (ln)
		cu->layernorm_backward(dx_c, dw_c, db_c, dy_c, x_c, w_c, mean_c, rstd_c, N, C);
	else
		cu->rmsnorm_backward(dx_c, dw_c, dy_c, x_c, w_c, rstd_c, N, C);
	float *hw2 = getf(dw_c, C);
	CHECK(!memcmp(hw, hw2, C * sizeof(float)));
	cu->free(x_c), cu->free(w_c), cu->free(b_c), cu->free(out_c), cu->free(mean_c);
	cu->free(rstd_c), cu->free(dy_c), cu->free(dw_c), cu->free(db_c), cu->free(dx_c);
	free(x), free(w), free(bb), free(out), free(mean), free(rstd), free(o), free(r), free(m);
	free(dy), free(dw), free(db), free(dx), free(dw0), free(hx), free(hw);
	free(hb), free(hw2);
}

TEST(cuda_layernorm)
{
	NEED(layernorm_forward);
	NEED(layernorm_backward);
	norm_case(1, 67, 100);
	if (test_failed())
		return;
	norm_case(1, 600, 768); /* several row chunks */
}

TEST(cuda_rmsnorm)
{
	NEED(rmsnorm_forward);
	NEED(rmsnorm_backward);
	norm_case(0, 67, 100);
	if (test_failed())
		return;
	norm_case(0, 600, 576);
}

/* ---- matmul ---- */

static void matmul_case(int N, int C, int OC, int with_bias)
{
	float *x = randn((size_t)N * C, 1), *w = randn((size_t)OC * C, 0.1f);
	float *bias = with_bias ? randn(OC, 1) : NULL;
	float *out = fill((size_t)N * OC, 0);
	ref->matmul_forward(out, x, w, bias, N, C, OC);
	float *x_c = putf(x, (size_t)N * C), *w_c = putf(w, (size_t)OC * C);
	float *b_c = bias ? putf(bias, OC) : NULL, *o_c = nan_dev((size_t)N * OC);
	cu->matmul_forward(o_c, x_c, w_c, b_c, N, C, OC);
	float *o = getf(o_c, (size_t)N * OC);
	CHECK_CLOSE(o, out, (size_t)N * OC, 1e-2);

	float *dy = randn((size_t)N * OC, 1), *dx = fill((size_t)N * C, 0);
	float *dw = randn((size_t)OC * C, 1), *db = randn(OC, 1);
	float *dy_c = putf(dy, (size_t)N * OC), *dx_c = nan_dev((size_t)N * C);
	float *dw_c = putf(dw, (size_t)OC * C), *db_c = putf(db, OC);
	ref->matmul_backward(dx, dw, with_bias ? db : NULL, dy, x, w, N, C, OC);
	cu->matmul_backward(dx_c, dw_c, with_bias ? db_c : NULL, dy_c, x_c, w_c, N, C, OC);
	float *hx = getf(dx_c, (size_t)N * C), *hw = getf(dw_c, (size_t)OC * C);
	float *hb = getf(db_c, OC);
	CHECK_CLOSE(hx, dx, (size_t)N * C, 1e-2);
	CHECK_CLOSE(hw, dw, (size_t)OC * C, 1e-2);
	CHECK_CLOSE(hb, db, OC, 1e-5); /* fp32 column sums */
	cu->free(x_c), cu->free(w_c), cu->free(b_c), cu->free(o_c), cu->free(dy_c);
	cu->free(dx_c), cu->free(dw_c), cu->free(db_c);
	free(x), free(w), free(bias), free(out), free(o), free(dy), free(dx), free(dw);
	free(db), free(hx), free(hw), free(hb);
}

TEST(cuda_matmul)
{
	NEED(matmul_forward);
	NEED(matmul_backward);
	matmul_case(64, 96, 80, 1);
	if (!test_failed())
		matmul_case(33, 40, 24, 1); /* odd sizes */
	if (!test_failed())
		matmul_case(256, 768, 2304, 0);
	if (!test_failed())
		matmul_case(300, 256, 1000, 1);
}

/* ---- rope and attention ---- */

TEST(cuda_rope)
{
	NEED(rope_forward);
	NEED(rope_backward);
	int B = 2, T = 300, NH = 4, NKV = 2, HD = 64;
	size_t n = (size_t)B * T * (NH + 2 * NKV) * HD;
	float *x = randn(n, 1), *y = dupf(x, n), *x_c = putf(x, n);
	ref->rope_forward(y, B, T, NH, NKV, HD, 10000.0f);
	cu->rope_forward(x_c, B, T, NH, NKV, HD, 10000.0f);
	float *h = getf(x_c, n);
	CHECK_CLOSE(h, y, n, 1e-5);
	ref->rope_backward(y, B, T, NH, NKV, HD, 10000.0f);
	cu->rope_backward(x_c, B, T, NH, NKV, HD, 10000.0f);
	free(h);
	h = getf(x_c, n);
	CHECK_CLOSE(h, y, n, 1e-5);
	CHECK_CLOSE(h, x, n, 1e-5); /* the inverse rotation undoes it */
	cu->free(x_c);
	free(x), free(y), free(h);
}

/* ---- activations, residuals ---- */

TEST(cuda_gelu)
{
	NEED(gelu_forward);
	NEED(gelu_backward);
	size_t n = 10007;
	float *x = randn(n, 3), *dy = randn(n, 1), *y = fill(n, 0), *dx = fill(n, 0);
	ref->gelu_forward(y, x, n);
	ref->gelu_backward(dx, x, dy, n);
	float *x_c = putf(x, n), *dy_c = putf(dy, n), *y_c = nan_dev(n);
	float *dx_c = nan_dev(n);
	cu->gelu_forward(y_c, x_c, n);
	cu->gelu_backward(dx_c, x_c, dy_c, n);
	float *hy = getf(y_c, n), *hx = getf(dx_c, n);
	CHECK_CLOSE(hy, y, n, 1e-5);
	CHECK_CLOSE(hx, dx, n, 1e-5);
	cu->free(x_c), cu->free(dy_c), cu->free(y_c), cu->free(dx_c);
	free(x), free(dy), free(y), free(dx), free(hy), free(hx);
}

TEST(cuda_swiglu)
{
	NEED(swiglu_forward);
	NEED(swiglu_backward);
	int N = 37, F = 130;
	size_t ni = (size_t)N * 2 * F, no = (size_t)N * F;
	float *x = randn(ni, 2), *dy = randn(no, 1), *y = fill(no, 0), *dx = fill(ni, 0);
	ref->swiglu_forward(y, x, N, F);
	ref->swiglu_backward(dx, dy, x, N, F);
	float *x_c = putf(x, ni), *dy_c = putf(dy, no), *y_c = nan_dev(no);
	float *dx_c = nan_dev(ni);
	cu->swiglu_forward(y_c, x_c, N, F);
	cu->swiglu_backward(dx_c, dy_c, x_c, N, F);
	float *hy = getf(y_c, no), *hx = getf(dx_c, ni);
	CHECK_CLOSE(hy, y, no, 1e-5);
	CHECK_CLOSE(hx, dx, ni, 1e-5);
	cu->free(x_c), cu->free(dy_c), cu->free(y_c), cu->free(dx_c);
	free(x), free(dy), free(y), free(dx), free(hy), free(hx);
}

TEST(cuda_add_scale)
{
	NEED(add);
	NEED(scale);
	size_t n = 5000;
	float *a = randn(n, 1), *b = randn(n, 1), *s = fill(n, 0);
	ref->add(s, a, b, n);
	ref->scale(s, 0.37f, n);
	float *a_c = putf(a, n), *b_c = putf(b, n);
	cu->add(a_c, a_c, b_c, n); /* out aliases a */
	cu->scale(a_c, 0.37f, n);
	float *h = getf(a_c, n);
	CHECK_CLOSE(h, s, n, 0);
	cu->free(a_c), cu->free(b_c);
	free(a), free(b), free(s), free(h);
}

/* ---- loss ---- */

static void xent_case(int N, int V, int Vp)
{
	size_t nl = (size_t)N * Vp;
	float *logits = randn(nl, 4), *loss = fill(N, 0), *dl = fill(nl, 0);
	int32_t *tg = xmalloc((size_t)N * sizeof(int32_t));
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(rng_next(&seed) % V);
	tg[0] = V - 1;
	ref->softmax_xent(loss, dl, logits, tg, N, V, Vp, 1.0f / N);
	float *lg_c = putf(logits, nl), *loss_c = nan_dev(N), *dl_c = nan_dev(nl);
	int32_t *tg_c = put(tg, (size_t)N * sizeof(int32_t));
	cu->softmax_xent(loss_c, dl_c, lg_c, tg_c, N, V, Vp, 1.0f / N);
	float *hl = getf(loss_c, N), *hd = getf(dl_c, nl);
	CHECK_CLOSE(hl, loss, N, 1e-5);
	CHECK_CLOSE(hd, dl, nl, 1e-5);
	/* in place (dlogits aliases logits), and loss only */
	cu->softmax_xent(loss_c, lg_c, lg_c, tg_c, N, V, Vp, 1.0f / N);
	float *hd2 = getf(lg_c, nl);
	CHECK_CLOSE(hd2, dl, nl, 1e-5);
	cu->to_device(lg_c, logits, nl * 4);
	cu->softmax_xent(loss_c, NULL, lg_c, tg_c, N, V, Vp, 1.0f);
	free(hl);
	hl = getf(loss_c, N);
	CHECK_CLOSE(hl, loss, N, 1e-5);
	cu->free(lg_c), cu->free(loss_c), cu->free(dl_c), cu->free(tg_c);
	free(logits), free(loss), free(dl), free(hl), free(hd), free(hd2), free(tg);
}

TEST(cuda_softmax_xent)
{
	NEED(softmax_xent);
	xent_case(9, 1000, 1024);
	if (!test_failed())
		xent_case(3, 50257, 50304); /* GPT-2's vocabulary, padded */
}

#ifdef ASYNCPP_CUDA
static void bf16_xent_case(void);
static void xent_contract_case(void);
static int cuda_bf16_ready(void);
/* The vectorised kernel (cuda_flash.h, CUDA_XENT_VEC) through the same
 * cases as the plain one: against the CPU, in bf16, the contracts; then
 * against the plain kernel at GPT-2's size (fp32 sums in another order). */
TEST(cuda_softmax_xent_vec)
{
	NEED(softmax_xent);
	int prev = cuda_xent_set_impl(CUDA_XENT_VEC);
	xent_case(9, 1000, 1024);
	if (!test_failed())
		xent_case(3, 50257, 50304);
	if (!test_failed() && cuda_bf16_ready())
		bf16_xent_case();
	dev = cu;
	if (!test_failed())
		xent_contract_case();
	int N = 64, V = 50257, Vp = 50304;
	size_t nl = (size_t)N * Vp;
	float *lg = randn(nl, 4), *got[2][2];
	int32_t *tg = xmalloc((size_t)N * sizeof(int32_t));
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(rng_next(&seed) % V);
	float *lg_c = putf(lg, nl), *l_c = nan_dev(N), *d_c = nan_dev(nl);
	int32_t *tg_c = put(tg, (size_t)N * sizeof(int32_t));
	for (int k = 0; k < 2; k++) {
		cuda_xent_set_impl(k ? CUDA_XENT_VEC : CUDA_XENT_PLAIN);
		cu->softmax_xent(l_c, d_c, lg_c, tg_c, N, V, Vp, 1.0f / N);
		got[k][0] = getf(l_c, N), got[k][1] = getf(d_c, nl);
	}
	snprintf(ctx, sizeof(ctx), "softmax_xent vec against plain, N=%d V=%d", N, V);
	CHECK_MSG(rel_err(got[1][0], got[0][0], N) <= 1e-6 &&
			  rel_err(got[1][1], got[0][1], nl) <= 1e-5,
		  "%s: losses %.3g, dlogits %.3g apart" SEED_FMT, ctx,
		  rel_err(got[1][0], got[0][0], N), rel_err(got[1][1], got[0][1], nl), SEED_ARG);
	cuda_xent_set_impl(prev);
	cu->free(lg_c), cu->free(l_c), cu->free(d_c), cu->free(tg_c);
	free(lg), free(tg), free(got[0][0]), free(got[0][1]), free(got[1][0]), free(got[1][1]);
}
#endif

/* ---- optimizer pieces ---- */

TEST(cuda_adamw)
{
	NEED(adamw_dir);
	size_t n = 4099;
	float *g = randn(n, 1), *m = randn(n, 0.1f), *v = randn(n, 0.1f), *u = fill(n, 0);
	for (size_t i = 0; i < n; i++)
		v[i] = v[i] * v[i];
	float *g_c = putf(g, n), *m_c = putf(m, n), *v_c = putf(v, n), *u_c = nan_dev(n);
	ref->adamw_dir(u, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f);
	cu->adamw_dir(u_c, g_c, m_c, v_c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.05f);
	float *hu = getf(u_c, n), *hm = getf(m_c, n), *hv = getf(v_c, n);
	CHECK_CLOSE(hu, u, n, 1e-6);
	CHECK_CLOSE(hm, m, n, 1e-6);
	CHECK_CLOSE(hv, v, n, 1e-6);
	cu->free(g_c), cu->free(m_c), cu->free(v_c), cu->free(u_c);
	free(g), free(m), free(v), free(u), free(hu), free(hm), free(hv);
}

TEST(cuda_lion_momentum)
{
	NEED(lion_dir);
	NEED(momentum);
	size_t n = 3001;
	float *g = randn(n, 1), *m = randn(n, 1), *u = fill(n, 0);
	float *g_c = putf(g, n), *m_c = putf(m, n), *u_c = nan_dev(n);
	ref->lion_dir(u, g, m, n, 1e-4f, 0.9f, 0.99f);
	cu->lion_dir(u_c, g_c, m_c, n, 1e-4f, 0.9f, 0.99f);
	float *hu = getf(u_c, n), *hm = getf(m_c, n);
	CHECK_CLOSE(hu, u, n, 0);
	CHECK_CLOSE(hm, m, n, 1e-6);
	for (int nest = 0; nest < 2; nest++) {
		ref->momentum(u, g, m, n, 0.95f, nest);
		cu->momentum(u_c, g_c, m_c, n, 0.95f, nest);
		free(hu), free(hm);
		hu = getf(u_c, n), hm = getf(m_c, n);
		CHECK_CLOSE(hu, u, n, 1e-6);
		CHECK_CLOSE(hm, m, n, 1e-6);
	}
	cu->free(g_c), cu->free(m_c), cu->free(u_c);
	free(g), free(m), free(u), free(hu), free(hm);
}

/* The pieces of AdEMAMix, MARS, SOAP and NorMuon against the CPU's */
TEST(cuda_optimizer_pieces)
{
	NEED(ademamix_dir);
	NEED(mars_correct);
	NEED(ema);
	NEED(soap_adam);
	NEED(row_normalize);
	NEED(gemm);
	size_t n = 3001;
	float *g = randn(n, 1), *a = randn(n, 1), *b = randn(n, 1), *v = fill(n, 0.3f);
	float *u = fill(n, 0);
	float *g_c = putf(g, n), *a_c = putf(a, n), *b_c = putf(b, n), *v_c = putf(v, n);
	float *u_c = nan_dev(n);
	ref->ademamix_dir(u, g, a, b, v, n, 1e-3f, 0.9f, 0.999f, 0.9999f, 5.0f, 1e-8f, 0.1f, 0.001f);
	cu->ademamix_dir(u_c, g_c, a_c, b_c, v_c, n, 1e-3f, 0.9f, 0.999f, 0.9999f, 5.0f, 1e-8f,
			 0.1f, 0.001f);
	float *hu = getf(u_c, n), *ha = getf(a_c, n), *hb = getf(b_c, n), *hv = getf(v_c, n);
	CHECK_CLOSE(hu, u, n, 1e-5);
	CHECK_CLOSE(ha, a, n, 1e-6);
	CHECK_CLOSE(hb, b, n, 1e-6);
	CHECK_CLOSE(hv, v, n, 1e-6);
	free(hu), free(ha), free(hb), free(hv);

	ref->mars_correct(u, g, a, n, 0.475f);
	cu->mars_correct(u_c, g_c, a_c, n, 0.475f);
	hu = getf(u_c, n), ha = getf(a_c, n);
	CHECK_CLOSE(hu, u, n, 1e-6);
	CHECK_CLOSE(ha, a, n, 0);
	free(hu), free(ha);

	ref->ema(b, g, n, 0.95f);
	cu->ema(b_c, g_c, n, 0.95f);
	ref->soap_adam(u, b, g, v, n, 0.95f, 1e-8f);
	cu->soap_adam(u_c, b_c, g_c, v_c, n, 0.95f, 1e-8f);
	hu = getf(u_c, n), hb = getf(b_c, n), hv = getf(v_c, n);
	CHECK_CLOSE(hb, b, n, 1e-6);
	CHECK_CLOSE(hv, v, n, 1e-6);
	CHECK_CLOSE(hu, u, n, 1e-5);
	free(hu), free(hb), free(hv);

	/* rows of 3001 / 7 ... : v[rows] from a's first entries */
	int rows = 7, cols = 428; /* 2996 floats */
	ref->row_normalize(g, a, rows, cols, 0.95f, 1e-10f);
	cu->row_normalize(g_c, a_c, rows, cols, 0.95f, 1e-10f);
	float *hg = getf(g_c, n);
	ha = getf(a_c, n);
	CHECK_CLOSE(hg, g, (size_t)rows * cols, 1e-6);
	CHECK_CLOSE(ha, a, (size_t)rows, 1e-6);
	free(hg), free(ha);

	/* every transpose combination of a 37x29 by 29x41 product, beta 0.5 */
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			int M = 37, N = 41, K = 29;
			float *A = randn((size_t)M * K, 1), *B = randn((size_t)K * N, 1);
			float *C = randn((size_t)M * N, 1);
			float *A_c = putf(A, (size_t)M * K), *B_c = putf(B, (size_t)K * N);
			float *C_c = putf(C, (size_t)M * N);
			ref->gemm(C, A, B, M, N, K, ta, tb, 0.7f, 0.5f);
			cu->gemm(C_c, A_c, B_c, M, N, K, ta, tb, 0.7f, 0.5f);
			float *hc = getf(C_c, (size_t)M * N);
			CHECK_CLOSE(hc, C, (size_t)M * N, 1e-5);
			cu->free(A_c), cu->free(B_c), cu->free(C_c);
			free(A), free(B), free(C), free(hc);
		}
	cu->free(g_c), cu->free(a_c), cu->free(b_c), cu->free(v_c), cu->free(u_c);
	free(g), free(a), free(b), free(v), free(u);
}

TEST(cuda_apply_update)
{
	NEED(apply_update);
	size_t n = 2050;
	float *w = randn(n, 1), *u = randn(n, 0.01f), *up = randn(n, 0.01f);
	float *w_c = putf(w, n), *u_c = putf(u, n), *up_c = putf(up, n);
	ref->apply_update(w, u, up, n, 1e-3f, 0.7f);
	cu->apply_update(w_c, u_c, up_c, n, 1e-3f, 0.7f);
	float *hw = getf(w_c, n), *hp = getf(up_c, n);
	CHECK_CLOSE(hw, w, n, 1e-6);
	CHECK_CLOSE(hp, up, n, 0);
	ref->apply_update(w, u, NULL, n, 1e-2f, 0.7f);
	cu->apply_update(w_c, u_c, NULL, n, 1e-2f, 0.7f);
	free(hw);
	hw = getf(w_c, n);
	CHECK_CLOSE(hw, w, n, 1e-6);
	cu->free(w_c), cu->free(u_c), cu->free(up_c);
	free(w), free(u), free(up), free(hw), free(hp);
}

TEST(cuda_sumsq)
{
	NEED(sumsq);
	size_t sizes[] = {1, 1000, 1 << 20, 3000001};
	for (size_t k = 0; k < ARRAY_SIZE(sizes); k++) {
		size_t n = sizes[k];
		float *x = randn(n, 1), *x_c = putf(x, n);
		double want = ref->sumsq(x, n), got = cu->sumsq(x_c, n), again = cu->sumsq(x_c, n);
		CHECK_NEAR(got, want, 1e-9 * want);
		CHECK(memcmp(&got, &again, sizeof(got)) == 0);
		cu->free(x_c);
		free(x);
	}
}

/* The many-tensor form: the bits of one cu->sumsq per tensor, for tensors
 * of every size class (empty, one block, many, the block cap) and more
 * tensors than one launch group holds. */
TEST(cuda_sumsq_many)
{
	NEED(sumsq);
	if (!cu->sumsq_many)
		SKIP("cuda backend lacks sumsq_many");
	enum { COUNT = 203 };
	const float *xs[COUNT];
	float *owned[COUNT];
	size_t ns[COUNT];
	for (int k = 0; k < COUNT; k++) {
		ns[k] = k == 7 ? 0 : k % 50 == 3 ? 3000001 : (size_t)(1 + (k * 7919) % 70000);
		float *x = randn(ns[k] ? ns[k] : 1, 1);
		owned[k] = putf(x, ns[k] ? ns[k] : 1);
		xs[k] = owned[k];
		free(x);
	}
	double got[COUNT];
	cu->sumsq_many(got, xs, ns, COUNT);
	int bad = 0;
	for (int k = 0; k < COUNT; k++) {
		double one = cu->sumsq(xs[k], ns[k]);
		bad += memcmp(&one, &got[k], sizeof(one)) != 0;
	}
	CHECK_MSG(bad == 0, "%d of %d tensors' sums differ from cu->sumsq's bits", bad, COUNT);
	for (int k = 0; k < COUNT; k++)
		cu->free(owned[k]);
}

/* elementwise_step: the bits of adamw_dir / lion_dir + apply_update per
 * tensor, on the GPU, for 100 tensors (three launch groups) of odd sizes,
 * with and without error feedback and its correction. */
TEST(cuda_elementwise_step)
{
	NEED(adamw_dir);
	if (!cu->elementwise_step)
		SKIP("cuda backend lacks elementwise_step");
	enum { COUNT = 100 };
	for (int rule = OPTIM_ELEM_ADAMW; rule <= OPTIM_ELEM_LION; rule++) {
		struct optim_elem_tensor a[COUNT], b[COUNT];
		float *host[COUNT][5];
		size_t total_bad = 0;
		for (int k = 0; k < COUNT; k++) {
			size_t n = k % 17 == 3 ? 300007 : (size_t)(1 + (k * 3571) % 9000);
			for (int j = 0; j < 5; j++)
				host[k][j] = randn(n, 1); /* w, g, m, v, u_prev */
			for (size_t i = 0; i < n; i++)
				host[k][3][i] = fabsf(host[k][3][i]); /* v >= 0 */
			struct optim_elem_tensor *x[2] = {&a[k], &b[k]};
			for (int c = 0; c < 2; c++) {
				*x[c] = (struct optim_elem_tensor){
					.w = putf(host[k][0], n), .g = putf(host[k][1], n),
					.s0 = putf(host[k][2], n), .s1 = putf(host[k][3], n),
					.u_prev = k % 3 ? putf(host[k][4], n) : NULL, .n = n,
					.decay = k % 2 ? 1e-3f : 0.0f, .correct = k % 3 == 1};
			}
		}
		float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, bc1 = 0.271f, bc2 = 0.1426f;
		cu->elementwise_step(rule, a, COUNT, lr, b1, b2, eps, bc1, bc2, 0.7f);
		float *u = cu->alloc(300007 * sizeof(float));
		for (int k = 0; k < COUNT; k++) {
			struct optim_elem_tensor *e = &b[k];
			if (rule == OPTIM_ELEM_ADAMW)
				cu->adamw_dir(u, e->g, e->s0, e->s1, e->n, lr, b1, b2, eps, bc1, bc2);
			else
				cu->lion_dir(u, e->g, e->s0, e->n, lr, b1, b2);
			cu->apply_update(e->w, u, e->correct ? e->u_prev : NULL, e->n, e->decay, 0.7f);
			if (e->u_prev && !e->correct)
				cu->copy(e->u_prev, u, e->n * sizeof(float));
		}
		for (int k = 0; k < COUNT; k++) {
			float *pa[4] = {a[k].w, a[k].s0, a[k].s1, a[k].u_prev};
			float *pb[4] = {b[k].w, b[k].s0, b[k].s1, b[k].u_prev};
			for (int j = 0; j < 4; j++) {
				if (!pa[j])
					continue;
				float *ha = getf(pa[j], a[k].n), *hb = getf(pb[j], a[k].n);
				total_bad += memcmp(ha, hb, a[k].n * sizeof(float)) != 0;
				free(ha), free(hb);
				cu->free(pa[j]), cu->free(pb[j]);
			}
			cu->free((float *)a[k].g), cu->free((float *)b[k].g);
			for (int j = 0; j < 5; j++)
				free(host[k][j]);
		}
		cu->free(u);
		CHECK_MSG(total_bad == 0, "rule %d: %zu tensors' buffers differ from the per-tensor "
			  "calls", rule, total_bad);
	}
}

/* to_device may return before the copy is done (small uploads are staged
 * through pinned slots), but the source is free to reuse at once and the
 * data is there for what follows: 100 uploads (the staging ring holds 32)
 * from one host buffer rewritten after each call, a kernel queued behind
 * each, all checked at the end. */
TEST(cuda_upload_then_reuse_source)
{
	NEED(to_device);
	enum { UPLOADS = 100, N = 4099 };
	float *src = xmalloc(N * sizeof(float));
	float *dev[UPLOADS];
	for (int k = 0; k < UPLOADS; k++) {
		for (int i = 0; i < N; i++)
			src[i] = (float)(k * 10000 + i);
		dev[k] = cu->alloc(N * sizeof(float));
		cu->to_device(dev[k], src, N * sizeof(float));
		cu->scale(dev[k], 2.0f, N);
		memset(src, 0xff, N * sizeof(float)); /* NaNs: a late copy would show */
	}
	int bad = 0;
	for (int k = 0; k < UPLOADS; k++) {
		float *h = getf(dev[k], N);
		for (int i = 0; i < N; i++)
			bad += h[i] != 2.0f * (float)(k * 10000 + i);
		free(h);
		cu->free(dev[k]);
	}
	CHECK_MSG(bad == 0, "%d elements differ after staged uploads", bad);
	free(src);
}

/* loss_mean on the device: the double-precision mean within float rounding,
 * the same bits on every call. */
TEST(cuda_loss_mean)
{
	NEED(loss_mean);
	int Ns[] = {1, 255, 257, 16384, 65537};
	for (size_t k = 0; k < ARRAY_SIZE(Ns); k++) {
		int N = Ns[k];
		float *l = randn((size_t)N, 1);
		double sum = 0;
		for (int i = 0; i < N; i++)
			sum += l[i] = fabsf(l[i]) * 3.0f;
		float *d = putf(l, (size_t)N), *o = nan_dev(2), got[2];
		cu->loss_mean(o, d, N);
		cu->loss_mean(o + 1, d, N);
		cu->to_host(got, o, sizeof(got));
		CHECK_NEAR(got[0], sum / N, 1e-6 * (sum / N));
		CHECK(memcmp(&got[0], &got[1], sizeof(float)) == 0);
		cu->free(d), cu->free(o);
		free(l);
	}
}

/* ==== against references in double, written here ==== */

/* ---- attention ---- */

/* Host copies of one implementation's results. */
struct att_result {
	float *out, *lse, *dqkv;
};

static void att_result_free(struct att_result *r)
{
	free(r->out), free(r->lse), free(r->dqkv);
	memset(r, 0, sizeof(*r));
}

/* Forward and backward on dev with the attention kernels it runs now; the
 * backward gets the device's own out and lse, as in training, and runs twice:
 * the second must give the same bits. qkv and dout sit `off` floats past an
 * allocation (1: 4 bytes off every vector alignment). */
static void attention_run(struct att_result *r, const float *qkv, const float *dy, int B, int T,
			  int NH, int NKV, int HD, int off)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	float *qkv_b, *dy_b;
	float *qkv_d = put_at(qkv, nq, off, &qkv_b), *dy_d = put_at(dy, no, off, &dy_b);
	float *out_d = nan_dev(no), *lse_d = nan_dev(nl), *dq_d = nan_dev(nq);
	dev->attention_forward(out_d, lse_d, qkv_d, B, T, NH, NKV, HD);
	dev->attention_backward(dq_d, dy_d, qkv_d, out_d, lse_d, B, T, NH, NKV, HD);
	r->out = getf(out_d, no), r->lse = getf(lse_d, nl), r->dqkv = getf(dq_d, nq);
	poison(dq_d, nq); /* again: the same bits */
	dev->attention_backward(dq_d, dy_d, qkv_d, out_d, lse_d, B, T, NH, NKV, HD);
	float *hd2 = getf(dq_d, nq);
	dev->free(qkv_b), dev->free(dy_b), dev->free(out_d), dev->free(lse_d), dev->free(dq_d);
	int same = !memcmp(r->dqkv, hd2, nq * sizeof(float));
	free(hd2);
	CHECK_MSG(same, "%s: backward not deterministic" SEED_FMT, ctx, SEED_ARG);
}

/* r against the double reference (out, lse, dq laid out as r's), each of
 * out and lse within tf, each of dq, dk, dv within tb */
static void attention_check(const struct att_result *r, const double *out, const double *lse,
			    const double *dq, int B, int T, int NH, int NKV, int HD, double tf,
			    double tb)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nl = (size_t)B * NH * T;
	CHECK_REF(r->out, out, N, C, C, tf, "out");
	CHECK_REF(r->lse, lse, nl, 1, 1, tf, "lse");
	/* A query that sees one key (the first of every sequence; all of
	 * them at T = 1) has dq = 0 and gives its key dk = 0 exactly: the
	 * softmax of one score is 1 whatever the score. Computed, they are the
	 * difference of dP and D = rowsum(dout * out), two rounded sums of
	 * dout's size, so the backward's errors are relative to the largest
	 * of dq, dk and dv (dv = dout there), never to a block of zeros. */
	double gmax = 0;
	for (size_t i = 0; i < (size_t)N * QKV; i++)
		gmax = fmax(gmax, fabs(dq[i]));
	CHECK_REF_FLOOR(r->dqkv, dq, N, C, QKV, gmax, tb, "dq");
	CHECK_REF_FLOOR(r->dqkv + C, dq + C, N, (size_t)NKV * HD, QKV, gmax, tb, "dk");
	CHECK_REF_FLOOR(r->dqkv + C + NKV * HD, dq + C + NKV * HD, N, (size_t)NKV * HD, QKV, gmax,
			tb, "dv");
}

#ifdef ASYNCPP_CUDA
static double *dup_double(const float *x, size_t n)
{
	double *d = dnew(n);
	for (size_t i = 0; i < n; i++)
		d[i] = x[i];
	return d;
}
#endif

/* Forward and backward of one shape on dev against the double reference.
 * On the CUDA backend with a shape the flash kernels take (HD 64 or 128),
 * both implementations run (cuda_flash.h): SIMT within 1e-4 / 1e-3, flash
 * within 1e-2 / 2e-2 of the reference and of the SIMT results (the
 * tolerance table above); the choice in force before is restored. */
static void attention_case(int B, int T, int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	snprintf(ctx, sizeof(ctx), "attention B=%d T=%d NH=%d NKV=%d HD=%d", B, T, NH, NKV, HD);
	float *qkv = randn(nq, 1), *dy = randn(no, 1);
	double *out = dnew(no), *lse = dnew(nl), *dq = dnew(nq);
	ref_attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
	ref_attention_backward(dq, dy, qkv, B, T, NH, NKV, HD);
	struct att_result simt = {0}, flash = {0};
	int flash_too = 0;
#ifdef ASYNCPP_CUDA
	int prev = -1;
	if (dev == cu) {
		flash_too = cuda_attention_flash_supported(NH, NKV, HD);
		prev = cuda_attention_set_impl(CUDA_ATTENTION_SIMT);
	}
#endif
	attention_run(&simt, qkv, dy, B, T, NH, NKV, HD, 0);
	if (!test_failed())
		attention_check(&simt, out, lse, dq, B, T, NH, NKV, HD, 1e-4, 1e-3);
#ifdef ASYNCPP_CUDA
	if (flash_too && !test_failed()) {
		snprintf(ctx, sizeof(ctx), "flash attention B=%d T=%d NH=%d NKV=%d HD=%d", B, T,
			 NH, NKV, HD);
		cuda_attention_set_impl(CUDA_ATTENTION_FLASH);
		attention_run(&flash, qkv, dy, B, T, NH, NKV, HD, 0);
		if (!test_failed())
			attention_check(&flash, out, lse, dq, B, T, NH, NKV, HD, 1e-2, 2e-2);
		if (!test_failed()) {
			snprintf(ctx, sizeof(ctx), "flash vs SIMT attention B=%d T=%d NH=%d NKV=%d "
				 "HD=%d", B, T, NH, NKV, HD);
			double *so = dup_double(simt.out, no), *sl = dup_double(simt.lse, nl);
			double *sd = dup_double(simt.dqkv, nq);
			attention_check(&flash, so, sl, sd, B, T, NH, NKV, HD, 1e-2, 2e-2);
			free(so), free(sl), free(sd);
		}
	}
	if (prev >= 0)
		cuda_attention_set_impl(prev);
#endif
	(void)flash_too;
	att_result_free(&simt), att_result_free(&flash);
	free(qkv), free(dy), free(out), free(lse), free(dq);
}

TEST(cuda_attention)
{
	NEED(attention_forward);
	NEED(attention_backward);
	attention_case(2, 70, 4, 2, 64);   /* grouped-query, T not a tile multiple */
	if (!test_failed())
		attention_case(1, 33, 3, 3, 32);  /* multi-head */
	if (!test_failed())
		attention_case(1, 129, 2, 1, 128); /* widest head */
	if (!test_failed())
		attention_case(1, 17, 6, 2, 48);  /* HD not a multiple of 32 */
	if (!test_failed())
		attention_case(2, 1, 4, 2, 64);   /* one position */
	if (!test_failed())
		attention_case(1, 64, 2, 2, 128); /* exactly one tile */
}

/* Production shapes: GPT-2 124M heads, SmolLM-style grouped-query, wide
 * heads, odd T (the last tile partly past T), and T = 257 with HD = 128.
 * Both implementations where flash takes the shape (all of these). */
TEST(cuda_attention_production)
{
	static const int shapes[][5] = {
		{1, 1024, 12, 12, 64}, {1, 2048, 15, 5, 64}, {2, 1024, 8, 2, 128},
		{2, 1023, 4, 2, 64},   {3, 257, 6, 3, 128},
	};
	NEED(attention_forward);
	NEED(attention_backward);
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++)
		attention_case(shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3],
			       shapes[k][4]);
}

#ifdef ASYNCPP_CUDA
/* Three runs of one shape with the kernels in force: two alike, one with
 * qkv and dout 4 bytes off alignment; all must have the same bits. */
static void attention_repeat_case(int B, int T, int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * NH * HD, nl = (size_t)B * NH * T;
	snprintf(ctx, sizeof(ctx), "flash attention B=%d T=%d NH=%d NKV=%d HD=%d", B, T, NH, NKV,
		 HD);
	float *qkv = randn(nq, 1), *dy = randn(no, 1);
	struct att_result a = {0}, b = {0}, c = {0};
	attention_run(&a, qkv, dy, B, T, NH, NKV, HD, 0);
	if (!test_failed())
		attention_run(&b, qkv, dy, B, T, NH, NKV, HD, 0);
	if (!test_failed())
		attention_run(&c, qkv, dy, B, T, NH, NKV, HD, 1);
	int fwd = !test_failed() && !memcmp(a.out, b.out, no * sizeof(float)) &&
		  !memcmp(a.lse, b.lse, nl * sizeof(float));
	int bwd = fwd && !memcmp(a.dqkv, b.dqkv, nq * sizeof(float));
	int aligned = bwd && !memcmp(a.out, c.out, no * sizeof(float)) &&
		      !memcmp(a.lse, c.lse, nl * sizeof(float)) &&
		      !memcmp(a.dqkv, c.dqkv, nq * sizeof(float));
	att_result_free(&a), att_result_free(&b), att_result_free(&c);
	free(qkv), free(dy);
	if (test_failed())
		return;
	CHECK_MSG(fwd, "%s: forward not deterministic" SEED_FMT, ctx, SEED_ARG);
	CHECK_MSG(bwd, "%s: backward differs between calls" SEED_FMT, ctx, SEED_ARG);
	CHECK_MSG(aligned, "%s: misaligned qkv/dout change the bits" SEED_FMT, ctx, SEED_ARG);
}
#endif

/* The flash kernels' bits are a function of the shape and the inputs only:
 * forward and backward repeat bit for bit, and qkv and dout 4 bytes off
 * 16-byte alignment (the kernels' scalar load path) give the bits of aligned
 * ones, so a pipeline stage, whose buffers sit elsewhere, computes what one
 * device does. */
TEST(cuda_attention_flash_deterministic)
{
	NEED(attention_forward);
	NEED(attention_backward);
#ifdef ASYNCPP_CUDA
	int prev = cuda_attention_set_impl(CUDA_ATTENTION_FLASH);
	attention_repeat_case(1, 2048, 15, 5, 64);
	if (!test_failed())
		attention_repeat_case(2, 257, 4, 2, 128);
	cuda_attention_set_impl(prev);
#endif
}

/* ---- matmul at odd shapes, aligned and not ---- */

/* C[M,N] = A[M,K] B[N,K]^T in double, rows of C in parallel. */
static void dgemm_nt(double *Cm, const double *A, const double *Bm, int M, int N, int K)
{
#pragma omp parallel for schedule(static)
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int k = 0; k < K; k++)
				s += A[(size_t)i * K + k] * Bm[(size_t)j * K + k];
			Cm[(size_t)i * N + j] = s;
		}
}

/* x[rows, cols] as double, transposed when tr (-> [cols, rows]). */
static double *to_d(const float *x, int rows, int cols, int tr)
{
	double *d = dnew((size_t)rows * cols);
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < cols; c++)
			d[tr ? (size_t)c * rows + r : (size_t)r * cols + c] = x[(size_t)r * cols + c];
	return d;
}

/* The results of one matmul_forward + matmul_backward on dev. */
struct mm_out {
	float *out, *dx, *dw, *db;
};

/* Runs forward and backward with every operand `off` floats past its
 * allocation: x[N,C], w[OC,C], bias[OC] (or NULL), dy[N,OC]; dw and db start
 * from dw0, db0 (accumulated); out and dx start as NaN. */
static struct mm_out mm_run(int off, const float *x, const float *w, const float *bias,
			    const float *dy, const float *dw0, const float *db0, int N, int C,
			    int OC)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	float *base[8] = {0};
	float *x_d = put_at(x, nx, off, &base[0]), *w_d = put_at(w, nw, off, &base[1]);
	float *b_d = bias ? put_at(bias, OC, off, &base[2]) : NULL;
	float *o_d = put_at(NULL, no, off, &base[3]), *dy_d = put_at(dy, no, off, &base[4]);
	float *dx_d = put_at(NULL, nx, off, &base[5]), *dw_d = put_at(dw0, nw, off, &base[6]);
	float *db_d = bias ? put_at(db0, OC, off, &base[7]) : NULL;
	dev->matmul_forward(o_d, x_d, w_d, b_d, N, C, OC);
	dev->matmul_backward(dx_d, dw_d, db_d, dy_d, x_d, w_d, N, C, OC);
	struct mm_out r = {getf(o_d, no), getf(dx_d, nx), getf(dw_d, nw),
			   bias ? getf(db_d, OC) : NULL};
	for (int i = 0; i < 8; i++)
		if (base[i])
			dev->free(base[i]);
	return r;
}

static void mm_free(struct mm_out *r)
{
	free(r->out), free(r->dx), free(r->dw), free(r->db);
}

static void matmul_ref_case(int N, int C, int OC, int with_bias)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	snprintf(ctx, sizeof(ctx), "matmul N=%d C=%d OC=%d %s", N, C, OC,
		 with_bias ? "bias" : "no bias");
	float *x = randn(nx, 1), *w = randn(nw, 0.05f), *dy = randn(no, 1);
	float *bias = with_bias ? randn(OC, 1) : NULL, *dw0 = randn(nw, 1), *db0 = randn(OC, 1);

	/* out = x w^T + bias; dx = dy w; dw = dw0 + dy^T x; db = db0 + colsum dy */
	double *xd = to_d(x, N, C, 0), *wd = to_d(w, OC, C, 0), *wt = to_d(w, OC, C, 1);
	double *dyd = to_d(dy, N, OC, 0), *dyt = to_d(dy, N, OC, 1), *xt = to_d(x, N, C, 1);
	double *out = dnew(no), *dx = dnew(nx), *dw = dnew(nw), *db = dnew(OC);
	dgemm_nt(out, xd, wd, N, OC, C);
	dgemm_nt(dx, dyd, wt, N, C, OC);
	dgemm_nt(dw, dyt, xt, OC, C, N);
	for (size_t i = 0; i < no; i++)
		out[i] += bias ? bias[i % OC] : 0.0;
	for (size_t i = 0; i < nw; i++)
		dw[i] += dw0[i];
	for (int o = 0; o < OC; o++) {
		db[o] = db0[o];
		for (int n = 0; n < N; n++)
			db[o] += dy[(size_t)n * OC + o];
	}

	struct mm_out a = mm_run(0, x, w, bias, dy, dw0, db0, N, C, OC);
	struct mm_out m = mm_run(1, x, w, bias, dy, dw0, db0, N, C, OC);
	CHECK_REF(a.out, out, N, OC, OC, 1e-2, "out");
	CHECK_REF(a.dx, dx, N, C, C, 1e-2, "dinp");
	CHECK_REF(a.dw, dw, OC, C, C, 1e-2, "dw");
	if (bias)
		CHECK_REF(a.db, db, 1, OC, OC, 1e-5, "dbias");
	/* plans are keyed by shape only; misaligned operands are staged through
	 * aligned scratch, so where the buffers sit never changes the bits */
	CHECK_MSG(!memcmp(a.out, m.out, no * 4) && !memcmp(a.dx, m.dx, nx * 4) &&
		  !memcmp(a.dw, m.dw, nw * 4) && (!bias || !memcmp(a.db, m.db, OC * 4)),
		  "%s: misaligned operands change the result (out %d, dinp %d, dw %d, "
		  "dbias %d)" SEED_FMT, ctx, !!memcmp(a.out, m.out, no * 4),
		  !!memcmp(a.dx, m.dx, nx * 4), !!memcmp(a.dw, m.dw, nw * 4),
		  bias && memcmp(a.db, m.db, OC * 4), SEED_ARG);
	mm_free(&a), mm_free(&m);
	free(x), free(w), free(dy), free(bias), free(dw0), free(db0);
	free(xd), free(wd), free(wt), free(dyd), free(dyt), free(xt);
	free(out), free(dx), free(dw), free(db);
}

TEST(cuda_matmul_odd_shapes)
{
	static const int shapes[][3] = {{37, 53, 71}, {1000, 770, 2305}};
	NEED(matmul_forward);
	NEED(matmul_backward);
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++)
		for (int bias = 1; bias >= 0 && !test_failed(); bias--)
			matmul_ref_case(shapes[k][0], shapes[k][1], shapes[k][2], bias);
}

/* ---- Newton-Schulz ---- */

/* As backend.h states it, in double: X = in / (|in|_F + 1e-7), transposed
 * when rows > cols so X is m x n, m <= n; each step A = X X^T,
 * B = b A + c A A, X = a X + B X. out[rows, cols]. */
static void ref_newton_schulz(double *out, const float *in, int rows, int cols, int steps)
{
	int tr = rows > cols, m = tr ? cols : rows, n = tr ? rows : cols;
	size_t mn = (size_t)m * n, mm = (size_t)m * m;
	double *X = to_d(in, rows, cols, tr), *Xt = dnew(mn), *A = dnew(mm), *AA = dnew(mm);
	double *BX = dnew(mn), ss = 0;
	for (size_t i = 0; i < mn; i++)
		ss += X[i] * X[i];
	for (size_t i = 0; i < mn; i++)
		X[i] /= sqrt(ss) + 1e-7;
	for (int s = 0; s < steps; s++) {
		dgemm_nt(A, X, X, m, m, n);
		dgemm_nt(AA, A, A, m, m, m); /* A is symmetric: A A = A A^T */
		for (size_t i = 0; i < mm; i++)
			A[i] = -4.7750 * A[i] + 2.0315 * AA[i];
		for (int i = 0; i < m; i++)
			for (int j = 0; j < n; j++)
				Xt[(size_t)j * m + i] = X[(size_t)i * n + j];
		dgemm_nt(BX, A, Xt, m, n, m);
		for (size_t i = 0; i < mn; i++)
			X[i] = 3.4445 * X[i] + BX[i];
	}
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++)
			out[tr ? (size_t)j * m + i : (size_t)i * n + j] = X[(size_t)i * n + j];
	free(X), free(Xt), free(A), free(AA), free(BX);
}

/* bf16 Newton-Schulz is approximate by design: the quintic's coefficients
 * make it oscillate (|p'| up to ~1.6 per step on the singular values), so
 * the rounding of each bf16 operand is amplified over the 5 steps. An
 * emulation of the CUDA algorithm on the CPU (bf16 round-to-nearest-even
 * operands, fp32 accumulation) against this double reference gave Frobenius
 * errors of 0.017-0.032 at these shapes (max-abs 0.02-0.05 of max|ref|, as
 * the first H100 run saw), hence 6e-2. What Muon needs is checked directly:
 * the short side's Gram matrix (O O^T for wide O, O^T O for tall) has its
 * diagonal near 1 (squared row norms of an orthogonalised matrix; the
 * quintic leaves singular values in about [0.7, 1.2]). */
static void ns_case(int r, int c)
{
	size_t n = (size_t)r * c, ns = newton_schulz_scratch(r, c);
	snprintf(ctx, sizeof(ctx), "newton_schulz %dx%d", r, c);
	float *x = randn(n, 1);
	double *want = dnew(n), e2 = 0, w2 = 0;
	ref_newton_schulz(want, x, r, c, 5);
	float *x_d = putf(x, n), *y_d = nan_dev(n), *s_d = nan_dev(ns);
	dev->newton_schulz(y_d, x_d, r, c, 5, s_d);
	float *h = getf(y_d, n);
	dev->free(x_d), dev->free(y_d), dev->free(s_d);
	for (size_t i = 0; i < n; i++) {
		double d = h[i] - want[i];
		e2 += d * d;
		w2 += want[i] * want[i];
	}
	double fro = sqrt(e2 / w2);
	CHECK_MSG(fro <= 6e-2, "%s: Frobenius relative error %.4g > 6e-2" SEED_FMT, ctx, fro,
		  SEED_ARG);
	int wide = r <= c, m = wide ? r : c, len = wide ? c : r;
	for (int i = 0; i < m; i++) {
		double g = 0;
		for (int k = 0; k < len; k++) {
			double v = wide ? h[(size_t)i * c + k] : h[(size_t)k * c + i];
			g += v * v;
		}
		CHECK_MSG(g >= 0.5 && g <= 1.5, "%s: Gram diagonal [%d] = %.4g outside [0.5, 1.5]"
			  SEED_FMT, ctx, i, g, SEED_ARG);
	}
	free(x), free(want), free(h);
}

static const int ns_shapes[][2] = {{48, 96}, {96, 48}, {128, 128}, {300, 77}, {768, 3072}};

TEST(cuda_newton_schulz)
{
	NEED(newton_schulz);
	for (size_t k = 0; k < ARRAY_SIZE(ns_shapes) && !test_failed(); k++)
		ns_case(ns_shapes[k][0], ns_shapes[k][1]);
}

static const struct backend *tb; /* the bf16 section's tables (below) */
static int cuda_bf16_ready(void);
static void free_all(float **p, int n);

/* ---- products with a GELU epilogue (matmul_gelu_forward,
 * matmul_backward_dgelu) against the ops apart, on table t ---- */

/* t's activations of device floats f[n] (freed by the caller) */
static void *acts_of(const struct backend *t, const float *f, size_t n)
{
	void *a = t->alloc(n * act_dtype_size(t->act_dtype));
	t->act_from_f32(a, f, n);
	return a;
}

/* host floats of t's activations a[n] */
static float *floats_of(const struct backend *t, const void *a, size_t n)
{
	float *f = t->alloc(n * sizeof(float));
	t->act_to_f32(f, a, n);
	float *h = xmalloc(n * sizeof(float));
	t->to_host(h, f, n * sizeof(float));
	t->free(f);
	return h;
}

static void gelu_fused_case(const struct backend *t, int N, int C, int OC, double tol)
{
	size_t A = act_dtype_size(t->act_dtype), nx = (size_t)N * C, no = (size_t)N * OC;
	snprintf(ctx, sizeof(ctx), "fused gelu products N=%d C=%d OC=%d on %s %s", N, C, OC,
		 t->name, act_dtype_name(t->act_dtype));
	float *x = randn(nx, 1), *w = randn((size_t)OC * C, 0.2f), *b = randn(OC, 0.5f);
	float *w2 = randn((size_t)C * OC, 0.2f), *dy = randn(nx, 1);
	float *xf = putf(x, nx), *wf = putf(w, (size_t)OC * C), *bf = putf(b, OC);
	float *w2f = putf(w2, (size_t)C * OC), *dyf = putf(dy, nx);
	void *xa = acts_of(t, xf, nx), *dya = acts_of(t, dyf, nx);
	void *out[2], *pre[2], *dpre[2], *dfca = t->alloc(no * A);
	float *dw[2], *db[2];
	for (int k = 0; k < 2; k++) {
		out[k] = t->alloc(no * A), pre[k] = t->alloc(no * A), dpre[k] = t->alloc(no * A);
		dw[k] = t->alloc((size_t)C * OC * sizeof(float)), db[k] = t->alloc(C * sizeof(float));
		t->zero(dw[k], (size_t)C * OC * sizeof(float));
		t->zero(db[k], C * sizeof(float));
	}
	/* forward: fc and GELU; backward: the projection back to them */
	t->matmul_gelu_forward(out[0], pre[0], xa, wf, bf, N, C, OC);
	t->matmul_forward(pre[1], xa, wf, bf, N, C, OC);
	t->gelu_forward(out[1], pre[1], no);
	t->matmul_backward_dgelu(dpre[0], dw[0], db[0], dya, out[1], w2f, pre[1], N, OC, C);
	t->matmul_backward(dfca, dw[1], db[1], dya, out[1], w2f, N, OC, C);
	t->gelu_backward(dpre[1], pre[1], dfca, no);
	struct {
		const char *what;
		float *got, *want;
		size_t n;
	} r[] = {
		{"out", floats_of(t, out[0], no), floats_of(t, out[1], no), no},
		{"pre", floats_of(t, pre[0], no), floats_of(t, pre[1], no), no},
		{"dpre", floats_of(t, dpre[0], no), floats_of(t, dpre[1], no), no},
		{"dw", getf(dw[0], (size_t)C * OC), getf(dw[1], (size_t)C * OC), (size_t)C * OC},
		{"dbias", getf(db[0], C), getf(db[1], C), (size_t)C},
	};
	for (size_t i = 0; i < ARRAY_SIZE(r); i++) {
		double e = rel_err(r[i].got, r[i].want, r[i].n);
		CHECK_MSG(e <= tol, "%s: %s: relative error %.3g > %g" SEED_FMT, ctx, r[i].what, e,
			  tol, SEED_ARG);
		free(r[i].got), free(r[i].want);
	}
	for (int k = 0; k < 2; k++)
		t->free(out[k]), t->free(pre[k]), t->free(dpre[k]), t->free(dw[k]), t->free(db[k]);
	t->free(dfca), t->free(xa), t->free(dya), t->free(xf), t->free(wf), t->free(bf);
	t->free(w2f), t->free(dyf);
	free(x), free(w), free(b), free(w2), free(dy);
}

/* The epilogue's GELU and product may round apart from the kernels' (and
 * cuBLASLt may pick another algorithm with an epilogue): within 1e-2 of
 * max|ref| in f32 (the matmul tests' bound), 2e-2 in bf16. OC 100 is not a
 * multiple of 8: the ops run apart inside the fused slot. */
TEST(cuda_matmul_gelu)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	setenv("ASYNCPP_GEMM_EPILOGUES", "1", 1); /* off by default (NOTES.md) */
	CHECK_MSG(cu->matmul_gelu_forward && cu->matmul_backward_dgelu && tb->matmul_gelu_forward &&
			  tb->matmul_backward_dgelu,
		  "the cuda tables lack the fused gelu products");
	static const int shapes[][3] = {{256, 128, 512}, {1024, 768, 3072}, {37, 64, 100}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++) {
		dev = cu;
		gelu_fused_case(cu, shapes[k][0], shapes[k][1], shapes[k][2], 1e-2);
		dev = tb;
		gelu_fused_case(tb, shapes[k][0], shapes[k][1], shapes[k][2], 2e-2);
	}
	dev = cu;
	unsetenv("ASYNCPP_GEMM_EPILOGUES");
}

/* ---- residual add + norm in one kernel (add_norm_forward,
 * norm_backward_add) against the ops apart, on table t: the same bits ---- */
static void norm_fused_case(const struct backend *t, int ln, int N, int C)
{
	size_t n = (size_t)N * C, A = act_dtype_size(t->act_dtype);
	snprintf(ctx, sizeof(ctx), "fused %s N=%d C=%d on %s %s", ln ? "layernorm" : "rmsnorm", N,
		 C, t->name, t->act_dtype == ACT_BF16 ? "bf16" : "f32");
	float *ha = randn(n, 1.0f), *hb = randn(n, 0.5f), *hd = randn(n, 0.3f);
	float *hacc = randn(n, 0.7f), *hw = randn((size_t)C, 1.0f), *hbias = randn((size_t)C, 0.1f);
	float *fa = putf(ha, n), *fb = putf(hb, n), *fd = putf(hd, n), *facc = putf(hacc, n);
	float *w = putf(hw, (size_t)C), *bias = putf(hbias, (size_t)C);
	void *a = acts_of(t, fa, n), *b = acts_of(t, fb, n), *dout = acts_of(t, fd, n);
	void *acc1 = acts_of(t, facc, n), *acc2 = acts_of(t, facc, n);
	void *res1 = t->alloc(n * A), *res2 = t->alloc(n * A), *out1 = t->alloc(n * A),
	     *out2 = t->alloc(n * A), *dx = t->alloc(n * A);
	float *m1 = t->alloc(N * 4), *m2 = t->alloc(N * 4), *r1 = t->alloc(N * 4),
	      *r2 = t->alloc(N * 4);
	float *dw1 = t->alloc(C * 4), *dw2 = t->alloc(C * 4), *db1 = t->alloc(C * 4),
	      *db2 = t->alloc(C * 4);
	/* apart */
	t->add_act(res1, a, b, n);
	if (ln) {
		t->layernorm_forward(out1, m1, r1, res1, w, bias, N, C, 1e-5f);
		t->layernorm_backward(dx, dw1, db1, dout, res1, w, m1, r1, N, C);
	} else {
		t->rmsnorm_forward(out1, r1, res1, w, N, C, 1e-5f);
		t->rmsnorm_backward(dx, dw1, dout, res1, w, r1, N, C);
	}
	t->add_act(acc1, acc1, dx, n);
	/* fused */
	t->add_norm_forward(res2, out2, m2, r2, a, b, w, bias, N, C, 1e-5f, ln);
	t->norm_backward_add(acc2, dw2, db2, dout, res2, w, m2, r2, N, C, ln);
	struct {
		const char *what;
		const void *x, *y;
		size_t bytes;
	} cmp[] = {{"res", res1, res2, n * A},	 {"out", out1, out2, n * A},
		   {"rstd", r1, r2, (size_t)N * 4}, {"mean", m1, m2, ln ? (size_t)N * 4 : 0},
		   {"dacc", acc1, acc2, n * A},	 {"dw", dw1, dw2, (size_t)C * 4},
		   {"db", db1, db2, ln ? (size_t)C * 4 : 0}};
	for (size_t k = 0; k < ARRAY_SIZE(cmp); k++) {
		if (!cmp[k].bytes)
			continue;
		unsigned char *x = xmalloc(cmp[k].bytes), *y = xmalloc(cmp[k].bytes);
		t->to_host(x, cmp[k].x, cmp[k].bytes);
		t->to_host(y, cmp[k].y, cmp[k].bytes);
		CHECK_MSG(!memcmp(x, y, cmp[k].bytes), "%s: %s differs from the ops apart", ctx,
			  cmp[k].what);
		free(x);
		free(y);
	}
	void *dev_all[] = {fa, fb, fd, facc, w, bias, a, b, dout, acc1, acc2, res1, res2, out1,
			   out2, dx, m1, m2, r1, r2, dw1, dw2, db1, db2};
	for (size_t k = 0; k < ARRAY_SIZE(dev_all); k++)
		t->free(dev_all[k]);
	float *host_all[] = {ha, hb, hd, hacc, hw, hbias};
	free_all(host_all, 6);
}

/* The norms' weight and bias gradients (column sums) read 8 bytes at a
 * time where rows are 8-byte aligned and one element at a time elsewhere:
 * the same sums, so a buffer's offset (a pipeline stage's, say) never
 * changes the bits. */
static void colsum_offset_case(const struct backend *t, int ln, int N, int C)
{
	size_t n = (size_t)N * C, A = act_dtype_size(t->act_dtype);
	snprintf(ctx, sizeof(ctx), "%s weight gradients at offsets, N=%d C=%d on %s",
		 ln ? "layernorm" : "rmsnorm", N, C, t->act_dtype == ACT_BF16 ? "bf16" : "f32");
	float *hd = randn(n, 1.0f), *hx = randn(n, 1.0f), *hm = randn((size_t)N, 0.2f);
	float *hr = fill((size_t)N, 1.3f), *hw = randn((size_t)C, 1.0f);
	float *fd = putf(hd, n), *fx = putf(hx, n), *m = putf(hm, N), *r = putf(hr, N);
	float *w = putf(hw, C);
	float *dw[2], *db[2];
	for (int k = 0; k < 2; k++) { /* k = 0 aligned, 1 one element off */
		char *bd = t->alloc((n + 1) * A), *bx = t->alloc((n + 1) * A);
		void *d = bd + k * A, *x = bx + k * A;
		t->act_from_f32(d, fd, n);
		t->act_from_f32(x, fx, n);
		dw[k] = t->alloc(C * 4);
		db[k] = t->alloc(C * 4);
		if (ln)
			t->layernorm_backward(NULL, dw[k], db[k], d, x, w, m, r, N, C);
		else /* and the bias gradient of a product alone (db only) */
			t->rmsnorm_backward(NULL, dw[k], d, x, w, r, N, C),
				t->matmul_backward(NULL, NULL, db[k], d, x, NULL, N, C, C);
		t->free(bd);
		t->free(bx);
	}
	float *g[4] = {getf(dw[0], C), getf(dw[1], C), getf(db[0], C), getf(db[1], C)};
	CHECK_MSG(!memcmp(g[0], g[1], (size_t)C * 4), "%s: dw differs", ctx);
	CHECK_MSG(!memcmp(g[2], g[3], (size_t)C * 4), "%s: db differs", ctx);
	for (int k = 0; k < 2; k++) {
		t->free(dw[k]);
		t->free(db[k]);
	}
	void *dev_all[] = {fd, fx, m, r, w};
	for (size_t k = 0; k < ARRAY_SIZE(dev_all); k++)
		t->free(dev_all[k]);
	float *host_all[] = {hd, hx, hm, hr, hw, g[0], g[1], g[2], g[3]};
	free_all(host_all, 9);
}

/* Elementwise ops (gelu forward and backward, add) move 4 elements at a
 * time where every pointer allows it and one elsewhere: the same bits. */
static void elementwise_offset_case(const struct backend *t, size_t n)
{
	size_t A = act_dtype_size(t->act_dtype);
	snprintf(ctx, sizeof(ctx), "gelu and add at offsets, n=%zu on %s", n,
		 t->act_dtype == ACT_BF16 ? "bf16" : "f32");
	float *hx = randn(n, 2.0f), *hy = randn(n, 1.0f);
	float *fx = putf(hx, n), *fy = putf(hy, n);
	unsigned char *got[2][5];
	for (int k = 0; k < 2; k++) { /* k = 0 aligned, 1 one element off */
		char *b[5];
		void *p[5];
		for (int i = 0; i < 5; i++) {
			b[i] = t->alloc((n + 1) * A);
			p[i] = b[i] + k * A;
		}
		t->act_from_f32(p[0], fx, n);
		t->act_from_f32(p[1], fy, n);
		t->gelu_forward(p[2], p[0], n);
		t->gelu_backward(p[3], p[0], p[1], n);
		t->add_act(p[4], p[0], p[1], n);
		t->add_act(p[1], p[0], p[1], n); /* in place, as the model adds */
		for (int i = 0; i < 3; i++) {
			got[k][i] = xmalloc(n * A);
			t->to_host(got[k][i], p[2 + i], n * A);
		}
		got[k][3] = xmalloc(n * A);
		t->to_host(got[k][3], p[1], n * A);
		/* back to floats (a conversion), and the floats' add in place */
		char *fb = t->alloc((n + 1) * 4);
		float *f = (float *)(fb + k * 4);
		t->act_to_f32(f, p[1], n);
		t->add(f, f, fx, n);
		got[k][4] = xmalloc(n * 4);
		t->to_host(got[k][4], f, n * 4);
		t->free(fb);
		for (int i = 0; i < 5; i++)
			t->free(b[i]);
	}
	static const char *const what[] = {"gelu_forward", "gelu_backward", "add_act",
					   "add_act in place", "act_to_f32 + add"};
	for (int i = 0; i < 5; i++) {
		CHECK_MSG(!memcmp(got[0][i], got[1][i], i == 4 ? n * 4 : n * A), "%s: %s differs",
			  ctx, what[i]);
		free(got[0][i]);
		free(got[1][i]);
	}
	t->free(fx);
	t->free(fy);
	free(hx);
	free(hy);
}

TEST(cuda_elementwise_offsets)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	/* multiples of 4: the aligned runs take the 4-wide path */
	static const size_t sizes[] = {4096, 1000, 4100};
	for (size_t k = 0; k < ARRAY_SIZE(sizes) && !test_failed(); k++) {
		dev = cu;
		elementwise_offset_case(cu, sizes[k]);
		dev = tb;
		elementwise_offset_case(tb, sizes[k]);
	}
	dev = cu;
}

/* SwiGLU forward and backward: 4 neighbouring columns per thread where
 * F % 4 == 0 and the buffers are aligned, one elsewhere; the same bits. */
static void swiglu_offset_case(const struct backend *t, int N, int F)
{
	size_t A = act_dtype_size(t->act_dtype), n2 = (size_t)N * 2 * F, n1 = (size_t)N * F;
	snprintf(ctx, sizeof(ctx), "swiglu at offsets, N=%d F=%d on %s", N, F,
		 t->act_dtype == ACT_BF16 ? "bf16" : "f32");
	float *hx = randn(n2, 2.0f), *hd = randn(n1, 1.0f);
	float *fx = putf(hx, n2), *fd = putf(hd, n1);
	unsigned char *got[2][2];
	for (int k = 0; k < 2; k++) {
		char *bx = t->alloc((n2 + 1) * A), *bd = t->alloc((n1 + 1) * A);
		char *bo = t->alloc((n1 + 1) * A), *bg = t->alloc((n2 + 1) * A);
		void *x = bx + k * A, *d = bd + k * A, *o = bo + k * A, *g = bg + k * A;
		t->act_from_f32(x, fx, n2);
		t->act_from_f32(d, fd, n1);
		t->swiglu_forward(o, x, N, F);
		t->swiglu_backward(g, d, x, N, F);
		got[k][0] = xmalloc(n1 * A);
		got[k][1] = xmalloc(n2 * A);
		t->to_host(got[k][0], o, n1 * A);
		t->to_host(got[k][1], g, n2 * A);
		t->free(bx);
		t->free(bd);
		t->free(bo);
		t->free(bg);
	}
	CHECK_MSG(!memcmp(got[0][0], got[1][0], n1 * A), "%s: the forward differs", ctx);
	CHECK_MSG(!memcmp(got[0][1], got[1][1], n2 * A), "%s: the backward differs", ctx);
	for (int k = 0; k < 2; k++)
		free(got[k][0]), free(got[k][1]);
	t->free(fx);
	t->free(fd);
	free(hx);
	free(hd);
}

TEST(cuda_swiglu_offsets)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	static const int shapes[][2] = {{64, 2560}, {33, 100}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++) {
		dev = cu;
		swiglu_offset_case(cu, shapes[k][0], shapes[k][1]);
		dev = tb;
		swiglu_offset_case(tb, shapes[k][0], shapes[k][1]);
	}
	dev = cu;
}

/* RoPE reads cos and sin from a table made once per shape: the bits of
 * computing them in place (ASYNCPP_ROPE_TABLE=0), forward and backward,
 * at two lengths, f32 and bf16. Thetas no other test uses, so each table
 * run makes its table (counted). */
TEST(cuda_rope_table)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	const char *had = getenv("ASYNCPP_ROPE_TABLE");
	char *saved = had ? xstrdup(had) : NULL;
	static const int shapes[][5] = {{2, 128, 15, 5, 64}, {1, 2048, 4, 2, 128}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++)
		for (int b16 = 0; b16 < 2; b16++) {
			const struct backend *t = b16 ? tb : cu;
			dev = t;
			int B = shapes[k][0], T = shapes[k][1], NH = shapes[k][2], NKV = shapes[k][3],
			    HD = shapes[k][4];
			size_t n = (size_t)B * T * (NH + 2 * NKV) * HD, A = act_dtype_size(t->act_dtype);
			float *h = randn(n, 1.0f), *f = putf(h, n);
			unsigned char *got[2];
			for (int inplace = 0; inplace < 2; inplace++) {
				setenv("ASYNCPP_ROPE_TABLE", inplace ? "0" : "1", 1);
#ifdef ASYNCPP_CUDA
				int made = cuda_rope_tables_made();
#endif
				void *q = acts_of(t, f, n);
				t->rope_forward(q, B, T, NH, NKV, HD, 12345.0f);
				t->rope_backward(q, B, T, NH, NKV, HD, 777777.0f);
				got[inplace] = xmalloc(n * A);
				t->to_host(got[inplace], q, n * A);
				t->free(q);
#ifdef ASYNCPP_CUDA
				/* the first pass of each shape makes its two tables */
				if (!inplace && !b16)
					CHECK_MSG(cuda_rope_tables_made() == made + 2,
						  "rope T=%d: %d tables made, expected 2", T,
						  cuda_rope_tables_made() - made);
#endif
			}
			CHECK_MSG(!memcmp(got[0], got[1], n * A),
				  "rope T=%d HD=%d on %s: the table's bits differ from in place", T,
				  HD, b16 ? "bf16" : "f32");
			free(got[0]);
			free(got[1]);
			t->free(f);
			free(h);
		}
	if (saved)
		setenv("ASYNCPP_ROPE_TABLE", saved, 1);
	else
		unsetenv("ASYNCPP_ROPE_TABLE");
	free(saved);
	dev = cu;
}

TEST(cuda_colsum_offsets)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	static const int shapes[][2] = {{300, 768}, {1024, 64}, {77, 40}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++)
		for (int ln = 0; ln < 2; ln++) {
			dev = cu;
			colsum_offset_case(cu, ln, shapes[k][0], shapes[k][1]);
			dev = tb;
			colsum_offset_case(tb, ln, shapes[k][0], shapes[k][1]);
		}
	dev = cu;
}

TEST(cuda_fused_norms)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	CHECK_MSG(cu->add_norm_forward && cu->norm_backward_add && tb->add_norm_forward &&
			  tb->norm_backward_add,
		  "the cuda tables lack the fused norms (ASYNCPP_FUSED_NORM=0 in the environment?)");
	if (test_failed())
		return;
	static const int shapes[][2] = {{64, 768}, {37, 77}, {8, 2048}, {5, 31}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes) && !test_failed(); k++)
		for (int ln = 0; ln < 2; ln++) {
			dev = cu;
			norm_fused_case(cu, ln, shapes[k][0], shapes[k][1]);
			dev = tb;
			norm_fused_case(tb, ln, shapes[k][0], shapes[k][1]);
		}
	dev = cu;
}

/* The split backward's ops (model.h stage_backward_input/_weight): each
 * part alone, as B and W call it, the same bits as the one call, on both
 * tables; with the GELU epilogue on, so matmul_backward_dgelu's B part is
 * the fused kernel's (tests/split_ops.h). */
TEST(cuda_split_backward_ops)
{
	if (!cuda_bf16_ready())
		SKIP(why);
	setenv("ASYNCPP_GEMM_EPILOGUES", "1", 1);
	static const int shapes[][3] = {{256, 128, 512}, {1024, 768, 3072}, {37, 77, 100},
					{5, 31, 8}};
	const struct backend *tables[2] = {cu, tb};
	for (int k = 0; k < 2; k++)
		for (size_t i = 0; i < ARRAY_SIZE(shapes); i++) {
			dev = tables[k];
			const char *bad = split_ops_check(tables[k], shapes[i][0], shapes[i][1],
							  shapes[i][2], seed0 + i);
			CHECK_MSG(!bad, "%s N=%d C=%d OC=%d: %s" SEED_FMT,
				  k ? "bf16" : "f32", shapes[i][0], shapes[i][1], shapes[i][2], bad,
				  SEED_ARG);
		}
	dev = cu;
	unsetenv("ASYNCPP_GEMM_EPILOGUES");
}

/* weights_bf16's copies: a product reads a prepared copy (the same bits as
 * its own conversion), and memory freed forgets its copies, so weights
 * allocated later where an old range was are read as they are. */
TEST(cuda_weight_copies)
{
	if (!cuda_ready())
		SKIP(why);
	CHECK_MSG(cu->weights_bf16 != NULL, "the cuda table lacks weights_bf16");
	dev = cu;
	int N = 64, C = 96, OC = 160;
	size_t nw = (size_t)OC * C, no = (size_t)N * OC;
	float *x = randn((size_t)N * C, 1), *wa = randn(nw, 1), *wb = randn(nw, 1);
	float *x_d = putf(x, (size_t)N * C), *o1 = nan_dev(no), *o2 = nan_dev(no);
	/* the same product with and without a prepared copy: the same bits */
	float *w_d = putf(wa, nw), *other = putf(wa, nw);
	cu->weights_bf16(w_d, nw);
	cu->matmul_forward(o1, x_d, w_d, NULL, N, C, OC);
	cu->matmul_forward(o2, x_d, other, NULL, N, C, OC);
	float *h1 = getf(o1, no), *h2 = getf(o2, no);
	CHECK_MSG(!memcmp(h1, h2, no * sizeof(float)), "a prepared copy changes the product");
	free(h1), free(h2);
	/* freed, and new weights where they were (the allocator's first
	 * choice): read as they are, not through the old copy */
	cu->free(w_d);
	float *w2_d = putf(wb, nw);
	cu->to_device(other, wb, nw * sizeof(float));
	cu->matmul_forward(o1, x_d, w2_d, NULL, N, C, OC);
	cu->matmul_forward(o2, x_d, other, NULL, N, C, OC);
	h1 = getf(o1, no), h2 = getf(o2, no);
	CHECK_MSG(!memcmp(h1, h2, no * sizeof(float)),
		  "weights allocated after a free are read through an old copy (same address: %s)",
		  w2_d == w_d ? "yes" : "no");
	free(h1), free(h2);
	cu->free(w2_d), cu->free(other), cu->free(x_d), cu->free(o1), cu->free(o2);
	free(x), free(wa), free(wb);
}

/* newton_schulz_many: each matrix the bits newton_schulz gives it alone
 * (the batched GEMMs run the single product's algorithm; optim.c relies on
 * it for the schedule equivalences), at odd shapes, both orientations and
 * SmolLM's largest. */
TEST(cuda_newton_schulz_many)
{
	if (!cuda_ready())
		SKIP(why);
	CHECK_MSG(cu->newton_schulz_many != NULL, "the cuda table lacks newton_schulz_many");
	static const int cases[][3] = {{48, 96, 3}, {96, 48, 2}, {300, 77, 5}, {768, 768, 4},
				       {2560, 960, 3}};
	dev = cu;
	for (size_t c = 0; c < ARRAY_SIZE(cases) && !test_failed(); c++) {
		int r = cases[c][0], cl = cases[c][1], count = cases[c][2];
		size_t n = (size_t)r * cl;
		snprintf(ctx, sizeof(ctx), "newton_schulz_many %d x %dx%d", count, r, cl);
		float *x = randn(n * count, 1), *in[8], *out[8];
		for (int k = 0; k < count; k++)
			in[k] = putf(x + (size_t)k * n, n), out[k] = nan_dev(n);
		float *s_many = nan_dev(newton_schulz_many_scratch(count, r, cl));
		float *s_one = nan_dev(newton_schulz_scratch(r, cl)), *one = nan_dev(n);
		cu->newton_schulz_many(out, (const float *const *)in, count, r, cl, 5, s_many);
		for (int k = 0; k < count && !test_failed(); k++) {
			cu->newton_schulz(one, in[k], r, cl, 5, s_one);
			float *a = getf(out[k], n), *b = getf(one, n);
			CHECK_MSG(!memcmp(a, b, n * sizeof(float)),
				  "%s: matrix %d differs from newton_schulz alone" SEED_FMT, ctx, k,
				  SEED_ARG);
			free(a), free(b);
		}
		for (int k = 0; k < count; k++)
			cu->free(in[k]), cu->free(out[k]);
		cu->free(s_many), cu->free(s_one), cu->free(one);
		free(x);
	}
}

/* ==== bf16 activation storage (train.act_dtype = bf16) ==== */

/* Each bf16 op runs three times on the same bf16 inputs: on the bf16 table
 * under test (tb), on the f32 table it shares its kernels with (tf, given
 * the inputs widened), and on backend_cpu_bf16 (the reference). Outputs
 * come back as floats (bf16 values widened). Two checks per output:
 *  - tb's result is tf's rounded to bf16, bit for bit (float outputs such as
 *    mean, rstd, losses and parameter gradients: equal bits): the bf16
 *    kernels are the f32 kernels with widening loads and rounding stores
 *    (kernels/cuda/cuda_act.h), as the CPU's bf16 ops are its f32 ops.
 *    Matmul's out and dinp are the exception: cuBLASLt picks its algorithm
 *    for a bf16 D separately from an f32 D, so they agree within 1 bf16 ulp
 *    + 1e-4 of max|ref| (fp32 sums in another order), not bit for bit.
 *  - against the CPU's bf16 result: where CUDA's f32 op is bit-exact with
 *    the CPU's (embed_forward, add, the conversions) so is its bf16 op, bit
 *    for bit; elsewhere within one bf16 ulp of the element plus the f32
 *    op's tolerance (table at the top) times max|ref|: two f32 results that
 *    differ by e round to bf16 values at most e + 1 ulp apart.
 * cuda_ops_harness_on_cpu runs the same cases with the CPU's two tables as
 * tb and tf. */

static const struct backend *tb, *tf;
static const struct backend *const refb = &backend_cpu_bf16;

static int cuda_bf16_ready(void)
{
	if (!cuda_ready())
		return 0;
	tb = backend_cuda_bf16();
	tf = cu;
	return 1;
}

#define NEED_BF16(slot)                                                           \
	do {                                                                      \
		if (!cuda_bf16_ready())                                           \
			SKIP(why);                                                \
		if (!tb || !tb->slot)                                             \
			SKIP("the cuda bf16 table lacks " #slot);                 \
	} while (0)

/* n bf16 values (bits) of s * N(0,1) */
static uint16_t *randb(size_t n, float s)
{
	uint16_t *x = xmalloc(st_mult(n ? n : 1, sizeof(uint16_t)));
	for (size_t i = 0; i < n; i++)
		x[i] = f32_to_bf16(s * rng_normal(&seed));
	return x;
}

/* bf16 values x[n] uploaded to dev in its act_dtype (widened for f32),
 * `off` elements past a fresh allocation (*base, for free) */
static void *put_act_at(const uint16_t *x, size_t n, int off, void **base)
{
	int dt = dev->act_dtype;
	size_t esz = act_dtype_size(dt);
	void *h = xmalloc(st_mult(n + off, esz));
	for (size_t i = 0; i < n; i++)
		act_store(h, off + i, dt, bf16_to_f32(x[i]));
	*base = put(h, (n + off) * esz);
	free(h);
	return act_at(*base, off, esz);
}

static void *put_act(const uint16_t *x, size_t n)
{
	void *base;
	return put_act_at(x, n, 0, &base);
}

/* n activations of dev's act_dtype, all NaN */
static void *nan_act(size_t n)
{
	int dt = dev->act_dtype;
	void *h = xmalloc(st_mult(n ? n : 1, act_dtype_size(dt)));
	for (size_t i = 0; i < n; i++)
		act_store(h, i, dt, NAN);
	void *d = put(h, n * act_dtype_size(dt));
	free(h);
	return d;
}

/* n activations of dev's act_dtype, widened to floats on the host */
static float *get_act(const void *d, size_t n)
{
	int dt = dev->act_dtype;
	void *h = xmalloc(st_mult(n ? n : 1, act_dtype_size(dt)));
	float *f = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	dev->to_host(h, d, n * act_dtype_size(dt));
	for (size_t i = 0; i < n; i++)
		f[i] = act_load(h, i, dt);
	free(h);
	return f;
}

/* One bf16 ulp at x (the spacing of bf16 values around |x|) */
static double bf16_ulp(double x)
{
	int e;
	if (x == 0 || !isfinite(x))
		return 0;
	frexp(x, &e); /* |x| in [2^(e-1), 2^e): 8 significant bits */
	return ldexp(1.0, e - 8);
}

/* The three runs of one output (see above): got (tb), f32 (tf, unrounded),
 * want (CPU bf16); rows x cols with row stride `stride`. tb against tf
 * rounded: bit for bit when near < 0, else within 1 ulp + near * max|want|;
 * against want: bit for bit when tol < 0, else within 1 ulp + tol *
 * max|want|. */
static void bf16_check_floor(const char *what, const float *got, const float *f32,
			     const float *want, size_t rows, size_t cols, size_t stride,
			     double near, double tol, double floor)
{
	double mw = floor;
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++)
			mw = fmax(mw, fabs(want[r * stride + c]));
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++) {
			size_t i = r * stride + c;
			float g = got[i], rf = round_bf16(f32[i]), w = want[i];
			double ulp = fmax(bf16_ulp(g), bf16_ulp(w));
			int same_f = !memcmp(&g, &rf, sizeof(g));
			int ok_f = near < 0 ? same_f : fabs((double)g - rf) <= ulp + near * mw;
			CHECK_MSG(ok_f, "%s: %s[%zu][%zu] = %.9g on the bf16 table, %.9g = the f32 "
				  "table's %.9g rounded" SEED_FMT, ctx, what, r, c, g, rf, f32[i],
				  SEED_ARG);
			int ok_w = tol < 0 ? !memcmp(&g, &w, sizeof(g))
					   : fabs((double)g - w) <= ulp + tol * mw;
			CHECK_MSG(ok_w, "%s: %s[%zu][%zu] = %.9g, CPU bf16 %.9g (max %.3g, tol %g)"
				  SEED_FMT, ctx, what, r, c, g, w, mw, tol, SEED_ARG);
		}
}

/* max|want| at least floor: see attention_check */
static void bf16_check(const char *what, const float *got, const float *f32, const float *want,
		       size_t rows, size_t cols, size_t stride, double near, double tol)
{
	bf16_check_floor(what, got, f32, want, rows, cols, stride, near, tol, 0);
}

/* A float output of a bf16 op (statistics, losses, parameter gradients):
 * tb's bits are tf's; against the CPU within tol (relative, rel_err). */
static void bf16_check_f(const char *what, const float *got, const float *f32, const float *want,
			 size_t n, double tol)
{
	size_t diff = 0;
	for (size_t i = 0; i < n; i++)
		diff += memcmp(&got[i], &f32[i], sizeof(float)) != 0;
	CHECK_MSG(diff == 0, "%s: %s: %zu of %zu elements differ from the f32 table's" SEED_FMT,
		  ctx, what, diff, n, SEED_ARG);
	double e = rel_err(got, want, n);
	CHECK_MSG(e <= tol, "%s: %s: relative error %.3g > %g against the CPU" SEED_FMT, ctx,
		  what, e, tol, SEED_ARG);
}

/* the three backends of a bf16 case, in the order of the checks' arguments */
#define BF16_RUNS 3
static const struct backend *bf16_be(int k)
{
	return k == 0 ? tb : k == 1 ? tf : refb;
}

static void free_all(float **p, int n)
{
	for (int i = 0; i < n; i++)
		free(p[i]);
}

/* ---- conversions ---- */

static void bf16_convert_case(void)
{
	/* ties to even (both ways), overflow to infinity, denormals, signed
	 * zeros and infinities, then random values */
	static const uint32_t special[] = {
		0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
		0x3f80ffffu, 0x7f7fffffu, 0x7f7f7fffu, 0x7f7f8000u, 0xff7f8000u, 0x00008000u,
		0x00018000u, 0x00000001u, 0x807fffffu, 0x7f800000u, 0xff800000u,
	};
	size_t ns = sizeof(special) / sizeof(special[0]), n = 5000;
	snprintf(ctx, sizeof(ctx), "act_from_f32 / act_to_f32 on %s bf16", tb->name);
	float *x = randn(n, 100);
	for (size_t i = 0; i < ns; i++)
		x[i] = f32_from_bits(special[i]);
	x[ns] = NAN;
	dev = tb;
	float *x_d = putf(x, n), *back_d = nan_dev(n);
	void *a_d = nan_act(n);
	tb->act_from_f32(a_d, x_d, n);
	tb->act_to_f32(back_d, a_d, n);
	uint16_t *h = xmalloc(n * sizeof(uint16_t));
	tb->to_host(h, a_d, n * sizeof(uint16_t));
	float *back = getf(back_d, n);
	for (size_t i = 0; i < n; i++) {
		if (isnan(x[i])) {
			CHECK_MSG(isnan(bf16_to_f32(h[i])) && isnan(back[i]), "%s: NaN became %04x"
				  SEED_FMT, ctx, h[i], SEED_ARG);
			continue;
		}
		CHECK_MSG(h[i] == f32_to_bf16(x[i]), "%s: %08x rounded to %04x, CPU %04x" SEED_FMT,
			  ctx, f32_bits(x[i]), h[i], f32_to_bf16(x[i]), SEED_ARG);
		CHECK_MSG(f32_bits(back[i]) == f32_bits(bf16_to_f32(h[i])), "%s: %04x widened to "
			  "%08x" SEED_FMT, ctx, h[i], f32_bits(back[i]), SEED_ARG);
	}
	tb->free(x_d), tb->free(back_d), tb->free(a_d);
	free(x), free(h), free(back);
}

TEST(cuda_bf16_convert)
{
	NEED_BF16(act_from_f32);
	NEED_BF16(act_to_f32);
	bf16_convert_case();
}

/* ---- embeddings ---- */

static void bf16_embed_case(void)
{
	int B = 3, T = 37, C = 70, Vp = 50, N = B * T;
	size_t nc = (size_t)N * C, nw = (size_t)Vp * C, np = (size_t)T * C;
	snprintf(ctx, sizeof(ctx), "embed B=%d T=%d C=%d on %s bf16", B, T, C, tb->name);
	int32_t tok[3 * 37];
	for (int i = 0; i < N; i++)
		tok[i] = (int32_t)(rng_next(&seed) % 7) * 7; /* many repeats */
	float *wte = randn(nw, 1), *wpe = randn(np, 1), *gw0 = randn(nw, 1), *gp0 = randn(np, 1);
	uint16_t *dy = randb(nc, 1);
	float *r[BF16_RUNS][3];
	for (int k = 0; k < BF16_RUNS; k++) {
		dev = bf16_be(k);
		int32_t *tok_d = put(tok, sizeof(tok));
		float *wte_d = putf(wte, nw), *wpe_d = putf(wpe, np);
		float *gw_d = putf(gw0, nw), *gp_d = putf(gp0, np);
		void *out_d = nan_act(nc), *dy_d = put_act(dy, nc);
		dev->embed_forward(out_d, tok_d, wte_d, wpe_d, B, T, C);
		dev->embed_backward(gw_d, gp_d, dy_d, tok_d, B, T, C);
		r[k][0] = get_act(out_d, nc), r[k][1] = getf(gw_d, nw), r[k][2] = getf(gp_d, np);
		dev->free(tok_d), dev->free(wte_d), dev->free(wpe_d), dev->free(gw_d);
		dev->free(gp_d), dev->free(out_d), dev->free(dy_d);
	}
	bf16_check("out", r[0][0], r[1][0], r[2][0], 1, nc, nc, -1, -1);
	bf16_check_f("dwte", r[0][1], r[1][1], r[2][1], nw, 1e-5);
	bf16_check_f("dwpe", r[0][2], r[1][2], r[2][2], np, 1e-5);
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 3);
	free(wte), free(wpe), free(gw0), free(gp0), free(dy);
}

TEST(cuda_bf16_embed)
{
	NEED_BF16(embed_forward);
	NEED_BF16(embed_backward);
	bf16_embed_case();
}

/* ---- norms: every run's backward gets the CPU's mean and rstd ---- */

static void bf16_norm_case(int ln, int N, int C)
{
	size_t nc = (size_t)N * C;
	snprintf(ctx, sizeof(ctx), "%s N=%d C=%d on %s bf16", ln ? "layernorm" : "rmsnorm", N, C,
		 tb->name);
	uint16_t *x = randb(nc, 2), *dy = randb(nc, 1);
	float *w = randn(C, 1), *b = randn(C, 1), *dw0 = randn(C, 1), *db0 = randn(C, 1);
	float *r[BF16_RUNS][6];
	for (int k = BF16_RUNS - 1; k >= 0; k--) { /* the CPU first: its statistics */
		dev = bf16_be(k);
		void *x_d = put_act(x, nc), *dy_d = put_act(dy, nc);
		void *out_d = nan_act(nc), *dx_d = nan_act(nc);
		float *w_d = putf(w, C), *b_d = putf(b, C);
		float *dw_d = putf(dw0, C), *db_d = putf(db0, C);
		float *m_d = nan_dev(N), *rs_d = nan_dev(N);
		if (ln)
			dev->layernorm_forward(out_d, m_d, rs_d, x_d, w_d, b_d, N, C, 1e-5f);
		else
			dev->rmsnorm_forward(out_d, rs_d, x_d, w_d, N, C, 1e-5f);
		r[k][0] = get_act(out_d, nc), r[k][1] = getf(m_d, N), r[k][2] = getf(rs_d, N);
		dev->to_device(m_d, r[BF16_RUNS - 1][1], N * sizeof(float));
		dev->to_device(rs_d, r[BF16_RUNS - 1][2], N * sizeof(float));
		if (ln)
			dev->layernorm_backward(dx_d, dw_d, db_d, dy_d, x_d, w_d, m_d, rs_d, N, C);
		else
			dev->rmsnorm_backward(dx_d, dw_d, dy_d, x_d, w_d, rs_d, N, C);
		r[k][3] = get_act(dx_d, nc), r[k][4] = getf(dw_d, C), r[k][5] = getf(db_d, C);
		dev->free(x_d), dev->free(dy_d), dev->free(out_d), dev->free(dx_d), dev->free(w_d);
		dev->free(b_d), dev->free(dw_d), dev->free(db_d), dev->free(m_d), dev->free(rs_d);
	}
	bf16_check("out", r[0][0], r[1][0], r[2][0], 1, nc, nc, -1, 1e-5);
	if (ln)
		bf16_check_f("mean", r[0][1], r[1][1], r[2][1], N, 1e-5);
	bf16_check_f("rstd", r[0][2], r[1][2], r[2][2], N, 1e-5);
	bf16_check("dinp", r[0][3], r[1][3], r[2][3], 1, nc, nc, -1, 1e-5);
	bf16_check_f("dw", r[0][4], r[1][4], r[2][4], C, 1e-5);
	if (ln)
		bf16_check_f("db", r[0][5], r[1][5], r[2][5], C, 1e-5);
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 6);
	free(x), free(dy), free(w), free(b), free(dw0), free(db0);
}

TEST(cuda_bf16_norms)
{
	NEED_BF16(layernorm_forward);
	NEED_BF16(layernorm_backward);
	NEED_BF16(rmsnorm_forward);
	NEED_BF16(rmsnorm_backward);
	bf16_norm_case(1, 67, 100);
	if (!test_failed())
		bf16_norm_case(1, 600, 768); /* several row chunks */
	if (!test_failed())
		bf16_norm_case(0, 67, 100);
	if (!test_failed())
		bf16_norm_case(0, 600, 576);
}

/* ---- rope, in place ---- */

static void bf16_rope_case(void)
{
	int B = 2, T = 300, NH = 4, NKV = 2, HD = 64;
	size_t n = (size_t)B * T * (NH + 2 * NKV) * HD;
	snprintf(ctx, sizeof(ctx), "rope B=%d T=%d NH=%d NKV=%d HD=%d on %s bf16", B, T, NH, NKV,
		 HD, tb->name);
	uint16_t *x = randb(n, 1), *dy = randb(n, 1);
	float *r[BF16_RUNS][2];
	for (int k = 0; k < BF16_RUNS; k++) {
		dev = bf16_be(k);
		void *x_d = put_act(x, n), *dy_d = put_act(dy, n);
		dev->rope_forward(x_d, B, T, NH, NKV, HD, 10000.0f);
		dev->rope_backward(dy_d, B, T, NH, NKV, HD, 10000.0f);
		r[k][0] = get_act(x_d, n), r[k][1] = get_act(dy_d, n);
		dev->free(x_d), dev->free(dy_d);
	}
	bf16_check("forward", r[0][0], r[1][0], r[2][0], 1, n, n, -1, 1e-5);
	bf16_check("backward", r[0][1], r[1][1], r[2][1], 1, n, n, -1, 1e-5);
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 2);
	free(x), free(dy);
}

TEST(cuda_bf16_rope)
{
	NEED_BF16(rope_forward);
	NEED_BF16(rope_backward);
	bf16_rope_case();
}

/* ---- gelu, swiglu, add_act ---- */

static void bf16_pointwise_case(void)
{
	size_t n = 10007;
	int N = 37, F = 130;
	size_t ni = (size_t)N * 2 * F, no = (size_t)N * F;
	snprintf(ctx, sizeof(ctx), "gelu, swiglu, add_act on %s bf16", tb->name);
	uint16_t *x = randb(n, 3), *dy = randb(n, 1), *b = randb(n, 1);
	uint16_t *sx = randb(ni, 2), *sdy = randb(no, 1);
	float *r[BF16_RUNS][7];
	for (int k = 0; k < BF16_RUNS; k++) {
		dev = bf16_be(k);
		void *x_d = put_act(x, n), *dy_d = put_act(dy, n), *b_d = put_act(b, n);
		void *y_d = nan_act(n), *dx_d = nan_act(n), *s_d = nan_act(n);
		void *sx_d = put_act(sx, ni), *sdy_d = put_act(sdy, no);
		void *sy_d = nan_act(no), *sdx_d = nan_act(ni);
		dev->gelu_forward(y_d, x_d, n);
		dev->gelu_backward(dx_d, x_d, dy_d, n);
		dev->swiglu_forward(sy_d, sx_d, N, F);
		dev->swiglu_backward(sdx_d, sdy_d, sx_d, N, F);
		dev->add_act(s_d, x_d, b_d, n);
		dev->add_act(x_d, x_d, b_d, n); /* out aliases a */
		r[k][0] = get_act(y_d, n), r[k][1] = get_act(dx_d, n);
		r[k][2] = get_act(sy_d, no), r[k][3] = get_act(sdx_d, ni);
		r[k][4] = get_act(s_d, n), r[k][5] = get_act(x_d, n);
		r[k][6] = NULL;
		dev->free(x_d), dev->free(dy_d), dev->free(b_d), dev->free(y_d);
		dev->free(dx_d), dev->free(s_d), dev->free(sx_d), dev->free(sdy_d);
		dev->free(sy_d), dev->free(sdx_d);
	}
	bf16_check("gelu out", r[0][0], r[1][0], r[2][0], 1, n, n, -1, 1e-5);
	bf16_check("gelu dinp", r[0][1], r[1][1], r[2][1], 1, n, n, -1, 1e-5);
	bf16_check("swiglu out", r[0][2], r[1][2], r[2][2], 1, no, no, -1, 1e-5);
	bf16_check("swiglu dinp", r[0][3], r[1][3], r[2][3], 1, ni, ni, -1, 1e-5);
	bf16_check("add_act", r[0][4], r[1][4], r[2][4], 1, n, n, -1, -1);
	bf16_check("add_act in place", r[0][5], r[1][5], r[2][5], 1, n, n, -1, -1);
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 7);
	free(x), free(dy), free(b), free(sx), free(sdy);
}

TEST(cuda_bf16_pointwise)
{
	NEED_BF16(gelu_forward);
	NEED_BF16(gelu_backward);
	NEED_BF16(swiglu_forward);
	NEED_BF16(swiglu_backward);
	NEED_BF16(add_act);
	bf16_pointwise_case();
}

/* ---- softmax + cross-entropy: losses float, dlogits bf16 ---- */

static void bf16_xent_case(void)
{
	int N = 9, V = 1000, Vp = 1024;
	size_t nl = (size_t)N * Vp;
	snprintf(ctx, sizeof(ctx), "softmax_xent N=%d V=%d Vp=%d on %s bf16", N, V, Vp, tb->name);
	uint16_t *lg = randb(nl, 4);
	int32_t tg[9];
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(rng_next(&seed) % V);
	tg[0] = V - 1;
	tg[1] = -1; /* ignored: loss 0, zero row */
	float *r[BF16_RUNS][5];
	for (int k = 0; k < BF16_RUNS; k++) {
		dev = bf16_be(k);
		void *lg_d = put_act(lg, nl), *dl_d = nan_act(nl);
		int32_t *tg_d = put(tg, sizeof(tg));
		float *loss_d = nan_dev(N);
		dev->softmax_xent(loss_d, dl_d, lg_d, tg_d, N, V, Vp, 1.0f / N);
		r[k][0] = getf(loss_d, N), r[k][1] = get_act(dl_d, nl);
		poison(loss_d, N);
		dev->softmax_xent(loss_d, NULL, lg_d, tg_d, N, V, Vp, 1.0f / N); /* loss only */
		r[k][2] = getf(loss_d, N);
		poison(loss_d, N);
		dev->softmax_xent(loss_d, lg_d, lg_d, tg_d, N, V, Vp, 1.0f / N); /* in place */
		r[k][3] = getf(loss_d, N), r[k][4] = get_act(lg_d, nl);
		dev->free(lg_d), dev->free(dl_d), dev->free(tg_d), dev->free(loss_d);
	}
	bf16_check_f("losses", r[0][0], r[1][0], r[2][0], N, 1e-5);
	bf16_check("dlogits", r[0][1], r[1][1], r[2][1], 1, nl, nl, -1, 1e-5);
	for (int k = 0; k < BF16_RUNS && !test_failed(); k++) {
		const char *who = k == 0 ? "the bf16 table" : k == 1 ? "the f32 table" : "the CPU";
		CHECK_MSG(!memcmp(r[k][2], r[k][0], N * sizeof(float)) &&
			  !memcmp(r[k][3], r[k][0], N * sizeof(float)) &&
			  !memcmp(r[k][4], r[k][1], nl * sizeof(float)), "%s: on %s, the loss-only "
			  "or in-place call gives other bits" SEED_FMT, ctx, who, SEED_ARG);
	}
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 5);
	free(lg);
}

TEST(cuda_bf16_softmax_xent)
{
	NEED_BF16(softmax_xent);
	bf16_xent_case();
}

/* ---- matmul: bf16 activations, fp32 weights and weight gradients ---- */

/* n activations of dev's act_dtype, all NaN, `off` elements past a fresh
 * allocation (*base, for free) */
static void *nan_act_at(size_t n, int off, void **base)
{
	*base = nan_act(n + off);
	return act_at(*base, off, act_size(dev));
}

/* forward and backward on dev, every activation `off` elements past its
 * allocation: out[N,OC], dinp[N,C] (widened), dw[OC,C] = dw0 + ..., db[OC]
 * = db0 + ... (when bias) */
static void bf16_mm_run(float *r[4], int off, const uint16_t *x, const float *w,
			const float *bias, const uint16_t *dy, const float *dw0, const float *db0,
			int N, int C, int OC)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	void *base[4];
	void *x_d = put_act_at(x, nx, off, &base[0]), *dy_d = put_act_at(dy, no, off, &base[1]);
	void *o_d = nan_act_at(no, off, &base[2]), *dx_d = nan_act_at(nx, off, &base[3]);
	float *w_d = putf(w, nw), *dw_d = putf(dw0, nw);
	float *b_d = bias ? putf(bias, OC) : NULL, *db_d = bias ? putf(db0, OC) : NULL;
	dev->matmul_forward(o_d, x_d, w_d, b_d, N, C, OC);
	dev->matmul_backward(dx_d, dw_d, db_d, dy_d, x_d, w_d, N, C, OC);
	r[0] = get_act(o_d, no), r[1] = get_act(dx_d, nx), r[2] = getf(dw_d, nw);
	r[3] = bias ? getf(db_d, OC) : NULL;
	for (int i = 0; i < 4; i++)
		dev->free(base[i]);
	dev->free(w_d), dev->free(dw_d), dev->free(b_d), dev->free(db_d);
}

static void bf16_matmul_case(int N, int C, int OC, int with_bias)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	snprintf(ctx, sizeof(ctx), "matmul N=%d C=%d OC=%d %s on %s bf16", N, C, OC,
		 with_bias ? "bias" : "no bias", tb->name);
	uint16_t *x = randb(nx, 1), *dy = randb(no, 1);
	float *w = randn(nw, 0.1f), *bias = with_bias ? randn(OC, 1) : NULL;
	float *dw0 = randn(nw, 1), *db0 = randn(OC, 1);
	float *r[BF16_RUNS][4], *m[4];
	for (int k = 0; k < BF16_RUNS; k++) {
		dev = bf16_be(k);
		bf16_mm_run(r[k], 0, x, w, bias, dy, dw0, db0, N, C, OC);
	}
	dev = tb; /* activations 2 bytes off every vector alignment */
	bf16_mm_run(m, 1, x, w, bias, dy, dw0, db0, N, C, OC);
	bf16_check("out", r[0][0], r[1][0], r[2][0], N, OC, OC, 1e-4, 1e-2);
	bf16_check("dinp", r[0][1], r[1][1], r[2][1], N, C, C, 1e-4, 1e-2);
	bf16_check_f("dw", r[0][2], r[1][2], r[2][2], nw, 1e-2);
	if (with_bias)
		bf16_check_f("dbias", r[0][3], r[1][3], r[2][3], OC, 1e-5);
	CHECK_MSG(!memcmp(m[0], r[0][0], no * 4) && !memcmp(m[1], r[0][1], nx * 4) &&
		  !memcmp(m[2], r[0][2], nw * 4) && (!bias || !memcmp(m[3], r[0][3], OC * 4)),
		  "%s: activations 2 bytes off alignment change the result" SEED_FMT, ctx,
		  SEED_ARG);
	for (int k = 0; k < BF16_RUNS; k++)
		free_all(r[k], 4);
	free_all(m, 4);
	free(x), free(dy), free(w), free(bias), free(dw0), free(db0);
}

TEST(cuda_bf16_matmul)
{
	NEED_BF16(matmul_forward);
	NEED_BF16(matmul_backward);
	bf16_matmul_case(64, 96, 80, 1);
	if (!test_failed())
		bf16_matmul_case(33, 40, 24, 1);
	if (!test_failed())
		bf16_matmul_case(37, 53, 71, 1); /* odd leading dimensions */
	if (!test_failed())
		bf16_matmul_case(256, 768, 2304, 0);
	if (!test_failed())
		bf16_matmul_case(300, 256, 1000, 1);
}

/* ---- attention: bf16 qkv, out, dout, dqkv; lse float ---- */

/* One shape with the attention kernels the CUDA backend runs now; every
 * backward gets the CPU's out and lse. tolf, tolb: tolerances of the forward
 * and backward against the CPU (1 ulp + tol * max|ref|, dq, dk, dv each on
 * its own). */
/* On bf16 inputs qkv[N, QKV] and dy[N, C]; keep (or NULL): takes the bf16
 * table's out, lse and dqkv (as floats). */
static void bf16_attention_run(int B, int T, int NH, int NKV, int HD, double tolf, double tolb,
			       const uint16_t *qkv, const uint16_t *dy, float *keep[3])
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD, N = B * T;
	size_t nq = (size_t)N * QKV, no = (size_t)N * C, nl = (size_t)B * NH * T;
	uint16_t *out_ref = NULL;
	float *r[BF16_RUNS][3];
	for (int k = BF16_RUNS - 1; k >= 0; k--) { /* the CPU first: its out and lse */
		dev = bf16_be(k);
		void *q_d = put_act(qkv, nq), *dy_d = put_act(dy, no);
		void *o_d = nan_act(no), *dq_d = nan_act(nq);
		float *l_d = nan_dev(nl);
		dev->attention_forward(o_d, l_d, q_d, B, T, NH, NKV, HD);
		r[k][0] = get_act(o_d, no), r[k][1] = getf(l_d, nl);
		if (!out_ref) {
			out_ref = xmalloc(no * sizeof(uint16_t));
			for (size_t i = 0; i < no; i++)
				out_ref[i] = f32_to_bf16(r[k][0][i]); /* exact: bf16 values */
		}
		dev->free(o_d);
		o_d = put_act(out_ref, no);
		dev->to_device(l_d, r[BF16_RUNS - 1][1], nl * sizeof(float));
		dev->attention_backward(dq_d, dy_d, q_d, o_d, l_d, B, T, NH, NKV, HD);
		r[k][2] = get_act(dq_d, nq);
		dev->free(q_d), dev->free(dy_d), dev->free(o_d), dev->free(dq_d), dev->free(l_d);
	}
	bf16_check("out", r[0][0], r[1][0], r[2][0], N, C, C, -1, tolf);
	bf16_check_f("lse", r[0][1], r[1][1], r[2][1], nl, tolf);
	/* errors relative to the largest of dq, dk, dv (attention_check) */
	double gmax = 0;
	for (size_t i = 0; i < nq; i++)
		gmax = fmax(gmax, fabs(r[2][2][i]));
	bf16_check_floor("dq", r[0][2], r[1][2], r[2][2], N, C, QKV, -1, tolb, gmax);
	bf16_check_floor("dk", r[0][2] + C, r[1][2] + C, r[2][2] + C, N, (size_t)NKV * HD, QKV,
			 -1, tolb, gmax);
	size_t vo = (size_t)C + (size_t)NKV * HD;
	bf16_check_floor("dv", r[0][2] + vo, r[1][2] + vo, r[2][2] + vo, N, (size_t)NKV * HD, QKV,
			 -1, tolb, gmax);
	for (int k = 0; k < BF16_RUNS; k++) {
		if (k == 0 && keep) {
			memcpy(keep, r[0], sizeof(r[0]));
			continue;
		}
		free_all(r[k], 3);
	}
	free(out_ref);
}

/* SIMT (1e-4, 1e-3 as against double) and, on CUDA where the shape allows,
 * flash (1e-2, 2e-2); the choice in force before is restored. */
static void bf16_attention_case(int B, int T, int NH, int NKV, int HD)
{
	int nimpl = 1;
	static const char *names[] = {"", "flash ", "flash-sync "};
	float *kept[3][3] = {{NULL}};
	/* the same inputs for every implementation: flash and flash-sync are
	 * compared bit for bit below */
	size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
	uint16_t *qkv = randb(nq, 1), *dy = randb(no, 1);
#ifdef ASYNCPP_CUDA
	int prev = -1;
	static const int impls[] = {CUDA_ATTENTION_SIMT, CUDA_ATTENTION_FLASH,
				    CUDA_ATTENTION_FLASH_SYNC};
	if (tb == backend_cuda_bf16()) {
		nimpl = cuda_attention_flash_supported(NH, NKV, HD) ? 3 : 1;
		prev = cuda_attention_set_impl(CUDA_ATTENTION_SIMT);
	}
#endif
	for (int impl = 0; impl < nimpl && !test_failed(); impl++) {
		snprintf(ctx, sizeof(ctx), "%sattention B=%d T=%d NH=%d NKV=%d HD=%d on %s bf16",
			 names[impl], B, T, NH, NKV, HD, tb->name);
#ifdef ASYNCPP_CUDA
		cuda_attention_set_impl(impls[impl]);
#endif
		bf16_attention_run(B, T, NH, NKV, HD, impl ? 1e-2 : 1e-4, impl ? 2e-2 : 1e-3, qkv, dy,
				   kept[impl]);
	}
	/* tiles streamed by cp.async or loaded synchronously: the same bits */
	if (nimpl == 3 && !test_failed()) {
		size_t n[3] = {(size_t)B * T * NH * HD, (size_t)B * NH * T,
			       (size_t)B * T * (NH + 2 * NKV) * HD};
		for (int o = 0; o < 3; o++)
			CHECK_MSG(!memcmp(kept[1][o], kept[2][o], n[o] * sizeof(float)),
				  "%s: flash and flash-sync differ in %s" SEED_FMT, ctx,
				  (const char *[]){"out", "lse", "dqkv"}[o], SEED_ARG);
	}
	for (int impl = 0; impl < 3; impl++)
		if (kept[impl][0])
			free_all(kept[impl], 3);
	free(qkv), free(dy);
#ifdef ASYNCPP_CUDA
	if (prev >= 0)
		cuda_attention_set_impl(prev);
#endif
}

TEST(cuda_bf16_attention)
{
	NEED_BF16(attention_forward);
	NEED_BF16(attention_backward);
	static const int shapes[][5] = {
		{2, 70, 4, 2, 64}, {1, 33, 3, 3, 32}, {1, 129, 2, 1, 128}, {1, 17, 6, 2, 48},
		{2, 1, 4, 2, 64},  {1, 1024, 12, 12, 64}, {2, 1023, 4, 2, 64}, {3, 257, 6, 3, 128},
	};
	for (size_t i = 0; i < ARRAY_SIZE(shapes) && !test_failed(); i++)
		bf16_attention_case(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3],
				    shapes[i][4]);
}

#ifdef ASYNCPP_CUDA
/* bf16 forward and backward on dev (the bf16 table) with the attention in
 * force, qkv and dy `off` elements past an allocation; r gets out, lse and
 * dqkv (widened). The backward runs twice and must repeat bit for bit. */
static void bf16_attention_bits(float *r[3], const uint16_t *qkv, const uint16_t *dy, int B,
				int T, int NH, int NKV, int HD, int off)
{
	size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
	size_t nl = (size_t)B * NH * T;
	void *qb, *yb;
	void *q_d = put_act_at(qkv, nq, off, &qb), *y_d = put_act_at(dy, no, off, &yb);
	void *o_d = nan_act(no), *dq_d = nan_act(nq);
	float *l_d = nan_dev(nl);
	dev->attention_forward(o_d, l_d, q_d, B, T, NH, NKV, HD);
	dev->attention_backward(dq_d, y_d, q_d, o_d, l_d, B, T, NH, NKV, HD);
	r[0] = get_act(o_d, no), r[1] = getf(l_d, nl), r[2] = get_act(dq_d, nq);
	dev->free(dq_d);
	dq_d = nan_act(nq);
	dev->attention_backward(dq_d, y_d, q_d, o_d, l_d, B, T, NH, NKV, HD);
	float *again = get_act(dq_d, nq);
	int same = !memcmp(again, r[2], nq * sizeof(float));
	free(again);
	dev->free(qb), dev->free(yb), dev->free(o_d), dev->free(dq_d), dev->free(l_d);
	CHECK_MSG(same, "%s: backward not deterministic (off %d)" SEED_FMT, ctx, off, SEED_ARG);
}

/* cuDNN's fused attention (ASYNCPP_ATTENTION=cudnn) on the bf16 table:
 * against the f32 table and the CPU's bf16 attention (bf16_attention_run,
 * flash's tolerances 1e-2 / 2e-2: bf16 operands, fp32 accumulation) at the
 * production shapes (GPT-2's heads at B 2, the llama's GQA 15/5 at T 2048)
 * and odd ones (T 1023, T 1, T 257 with HD 128), and against attention in
 * double on the same values (1e-2 / 2e-2); every backward again bit
 * for bit, and with qkv and dout 2 elements (4 bytes) off alignment the same
 * bits; GPT-2's full shape (B 16, T 1024) against the flash kernels. Skips
 * when libcudnn cannot be loaded; fails when cuDNN is loaded but a
 * production shape ran elsewhere (an odd shape may fall back). */
static void cudnn_attention_cases(char *cwhy, size_t whylen);

TEST(cuda_bf16_attention_cudnn)
{
	NEED_BF16(attention_forward);
	NEED_BF16(attention_backward);
	char cwhy[512];
	int prev = cuda_attention_set_impl(CUDA_ATTENTION_CUDNN);
	if (cuda_attention_cudnn_calls(cwhy, sizeof(cwhy)) < 0) {
		cuda_attention_set_impl(prev);
		SKIP(cwhy);
	}
	cudnn_attention_cases(cwhy, sizeof(cwhy)); /* returns at the first failure */
	cuda_attention_set_impl(prev);
}

static void cudnn_attention_cases(char *cwhy, size_t whylen)
{
	static const int shapes[][6] = {
		/* B, T, NH, NKV, HD, production */
		{2, 1024, 12, 12, 64, 1}, {1, 2048, 15, 5, 64, 1}, {2, 1023, 4, 2, 64, 0},
		{2, 1, 4, 2, 64, 0},      {3, 257, 6, 3, 128, 0},  {1, 129, 2, 1, 128, 0},
	};
	for (size_t i = 0; i < ARRAY_SIZE(shapes) && !test_failed(); i++) {
		int B = shapes[i][0], T = shapes[i][1], NH = shapes[i][2], NKV = shapes[i][3];
		int HD = shapes[i][4];
		size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
		size_t n[3] = {no, (size_t)B * NH * T, nq};
		uint16_t *qkv = randb(nq, 1), *dy = randb(no, 1);
		long before = cuda_attention_cudnn_calls(cwhy, whylen);
		snprintf(ctx, sizeof(ctx), "cudnn attention B=%d T=%d NH=%d NKV=%d HD=%d", B, T,
			 NH, NKV, HD);
		bf16_attention_run(B, T, NH, NKV, HD, 1e-2, 2e-2, qkv, dy, NULL);
		long ran = cuda_attention_cudnn_calls(cwhy, whylen) - before;
		if (!test_failed() && shapes[i][5])
			CHECK_MSG(ran == 2, "%s: cuDNN ran %ld of 2 calls (%s)", ctx, ran, cwhy);
		if (!ran && !test_failed())
			fprintf(stderr, "note: %s ran the flash kernels (%s)\n", ctx, cwhy);
		float *a[3] = {NULL}, *b[3] = {NULL};
		dev = tb;
		if (!test_failed())
			bf16_attention_bits(a, qkv, dy, B, T, NH, NKV, HD, 0);
		if (!test_failed())
			bf16_attention_bits(b, qkv, dy, B, T, NH, NKV, HD, 2);
		for (int o = 0; o < 3 && !test_failed(); o++)
			CHECK_MSG(!memcmp(a[o], b[o], n[o] * sizeof(float)),
				  "%s: misaligned qkv/dout change the bits of %s" SEED_FMT, ctx,
				  (const char *[]){"out", "lse", "dqkv"}[o], SEED_ARG);
		/* against attention in double on the same (bf16) values */
		if (!test_failed()) {
			float *qf = xmalloc(nq * sizeof(float)), *yf = xmalloc(no * sizeof(float));
			for (size_t j = 0; j < nq; j++)
				qf[j] = bf16_to_f32(qkv[j]);
			for (size_t j = 0; j < no; j++)
				yf[j] = bf16_to_f32(dy[j]);
			double *out = dnew(no), *lse = dnew(n[1]), *dq = dnew(nq);
			ref_attention_forward(out, lse, qf, B, T, NH, NKV, HD);
			ref_attention_backward(dq, yf, qf, B, T, NH, NKV, HD);
			struct att_result r = {a[0], a[1], a[2]};
			attention_check(&r, out, lse, dq, B, T, NH, NKV, HD, 1e-2, 2e-2);
			free(qf), free(yf), free(out), free(lse), free(dq);
		}
		for (int o = 0; o < 3; o++)
			free(a[o]), free(b[o]);
		free(qkv), free(dy);
	}
	/* GPT-2 124M's shape as trained (B 16): cuDNN against flash */
	if (!test_failed()) {
		int B = 16, T = 1024, NH = 12, HD = 64;
		size_t nq = (size_t)B * T * 3 * NH * HD, no = (size_t)B * T * NH * HD;
		size_t n[3] = {no, (size_t)B * NH * T, nq};
		uint16_t *qkv = randb(nq, 1), *dy = randb(no, 1);
		float *c[3] = {NULL}, *f[3] = {NULL};
		snprintf(ctx, sizeof(ctx), "cudnn attention B=%d T=%d NH=%d HD=%d against flash", B,
			 T, NH, HD);
		dev = tb;
		long before = cuda_attention_cudnn_calls(cwhy, whylen);
		bf16_attention_bits(c, qkv, dy, B, T, NH, NH, HD, 0);
		long ran = cuda_attention_cudnn_calls(cwhy, whylen) - before;
		if (!test_failed())
			CHECK_MSG(ran == 3, "%s: cuDNN ran %ld of 3 calls (%s)", ctx, ran, cwhy);
		cuda_attention_set_impl(CUDA_ATTENTION_FLASH);
		if (!test_failed())
			bf16_attention_bits(f, qkv, dy, B, T, NH, NH, HD, 0);
		static const double tol[3] = {2e-2, 2e-2, 4e-2}; /* two bf16 kernels apart */
		for (int o = 0; o < 3 && !test_failed(); o++) {
			double e = rel_err(c[o], f[o], n[o]);
			CHECK_MSG(e <= tol[o], "%s: %s relative error %.3g > %g" SEED_FMT, ctx,
				  (const char *[]){"out", "lse", "dqkv"}[o], e, tol[o], SEED_ARG);
		}
		for (int o = 0; o < 3; o++)
			free(c[o]), free(f[o]);
		free(qkv), free(dy);
	}
}
#endif

/* Every bf16 case above, on dev's pair (tb, tf); for the harness */
static void bf16_all_cases(void)
{
	bf16_convert_case();
	if (!test_failed())
		bf16_embed_case();
	if (!test_failed())
		bf16_norm_case(1, 67, 100);
	if (!test_failed())
		bf16_norm_case(0, 67, 100);
	if (!test_failed())
		bf16_rope_case();
	if (!test_failed())
		bf16_pointwise_case();
	if (!test_failed())
		bf16_xent_case();
	if (!test_failed())
		bf16_matmul_case(33, 40, 24, 1);
	if (!test_failed())
		bf16_attention_case(2, 70, 4, 2, 64);
}

/* ==== contracts of backend.h, the same code on both backends ==== */

/* softmax_xent: target < 0 ignored (loss 0, zero gradient row), target >= V
 * NaN loss and a zero gradient row; valid rows as with valid targets. */
static void xent_contract_case(void)
{
	int N = 6, V = 1000, Vp = 1024;
	size_t nl = (size_t)N * Vp;
	int32_t tg[6] = {3, -1, 1000, 999, -7, 100000}, ok[6] = {3, 0, 0, 999, 0, 0};
	int kind[6] = {0, 1, 2, 0, 1, 2}; /* 0 valid, 1 ignored, 2 >= V */
	snprintf(ctx, sizeof(ctx), "softmax_xent targets outside [0, V) on %s", dev->name);
	float *logits = randn(nl, 4);
	float *lg_d = putf(logits, nl), *l_d = nan_dev(N), *d_d = nan_dev(nl);
	int32_t *tg_d = put(tg, sizeof(tg)), *ok_d = put(ok, sizeof(ok));
	dev->softmax_xent(l_d, d_d, lg_d, ok_d, N, V, Vp, 1.0f / N);
	float *lref = getf(l_d, N), *dref = getf(d_d, nl);
	poison(l_d, N), poison(d_d, nl);
	dev->softmax_xent(l_d, d_d, lg_d, tg_d, N, V, Vp, 1.0f / N);
	float *l = getf(l_d, N), *d = getf(d_d, nl);
	dev->softmax_xent(l_d, lg_d, lg_d, tg_d, N, V, Vp, 1.0f / N); /* in place */
	float *la = getf(l_d, N), *da = getf(lg_d, nl);
	dev->free(lg_d), dev->free(l_d), dev->free(d_d), dev->free(tg_d), dev->free(ok_d);
	for (int n = 0; n < N; n++) {
		const float *row = d + (size_t)n * Vp, *arow = da + (size_t)n * Vp;
		if (kind[n] == 0) {
			CHECK(l[n] == lref[n] && la[n] == lref[n]);
			CHECK(!memcmp(row, dref + (size_t)n * Vp, Vp * 4));
			CHECK(!memcmp(arow, row, Vp * 4));
			continue;
		}
		if (kind[n] == 1)
			CHECK_MSG(l[n] == 0.0f && la[n] == 0.0f, "%s: row %d (target %d): loss %g, "
				  "want 0" SEED_FMT, ctx, n, tg[n], l[n], SEED_ARG);
		else
			CHECK_MSG(isnan(l[n]) && isnan(la[n]), "%s: row %d (target %d): loss %g, "
				  "want NaN" SEED_FMT, ctx, n, tg[n], l[n], SEED_ARG);
		for (int c = 0; c < Vp; c++)
			CHECK_MSG(row[c] == 0.0f && arow[c] == 0.0f, "%s: row %d (target %d): "
				  "dlogits[%d] = %g, want 0" SEED_FMT, ctx, n, tg[n], c, row[c],
				  SEED_ARG);
	}
	free(logits), free(lref), free(dref), free(l), free(d), free(la), free(da);
}

/* copy with dst == src is a no-op. */
static void copy_contract_case(void)
{
	size_t n = 4097;
	float *x = randn(n, 1), *x_d = putf(x, n);
	dev->copy(x_d, x_d, n * sizeof(float));
	dev->copy(x_d + 5, x_d + 5, 17 * sizeof(float));
	dev->copy(x_d, x_d, 0);
	dev->synchronize();
	float *h = getf(x_d, n);
	dev->free(x_d);
	CHECK_MSG(!memcmp(h, x, n * sizeof(float)), "copy onto itself on %s changed the data"
		  SEED_FMT, dev->name, SEED_ARG);
	free(x), free(h);
}

/* layernorm: NULL weight means 1, NULL bias 0; the backward reads w = NULL
 * as 1 and skips dw or db when NULL. Against the same backend given explicit
 * ones and zeros (equal up to instruction choice: 1e-6). */
static void ln_null_contract_case(int N, int C)
{
	size_t nc = (size_t)N * C;
	snprintf(ctx, sizeof(ctx), "layernorm NULL weight/bias N=%d C=%d on %s", N, C, dev->name);
	float *x = randn(nc, 2), *dy = randn(nc, 1), *dw0 = randn(C, 1), *db0 = randn(C, 1);
	float *ones = fill(C, 1), *zeros = fill(C, 0);
	float *x_d = putf(x, nc), *dy_d = putf(dy, nc), *one_d = putf(ones, C);
	float *zero_d = putf(zeros, C), *o_d = nan_dev(nc), *m_d = nan_dev(N), *r_d = nan_dev(N);
	float *dx_d = nan_dev(nc), *dw_d = putf(dw0, C), *db_d = putf(db0, C);

	dev->layernorm_forward(o_d, m_d, r_d, x_d, one_d, zero_d, N, C, 1e-5f);
	dev->layernorm_backward(dx_d, dw_d, db_d, dy_d, x_d, one_d, m_d, r_d, N, C);
	float *o0 = getf(o_d, nc), *dx0 = getf(dx_d, nc), *dw1 = getf(dw_d, C);
	float *db1 = getf(db_d, C);
	for (int k = 1; k < 4 && !test_failed(); k++) { /* bit 0: w NULL, bit 1: b NULL */
		poison(o_d, nc), poison(m_d, N), poison(r_d, N);
		dev->layernorm_forward(o_d, m_d, r_d, x_d, k & 1 ? NULL : one_d,
				       k & 2 ? NULL : zero_d, N, C, 1e-5f);
		float *o = getf(o_d, nc);
		double e = rel_err(o, o0, nc);
		CHECK_MSG(e <= 1e-6, "%s: forward (w %s, b %s): error %.3g" SEED_FMT, ctx,
			  k & 1 ? "NULL" : "1", k & 2 ? "NULL" : "0", e, SEED_ARG);
		free(o);
	}
	/* dw only, db only, neither; w NULL each time */
	for (int k = 0; k < 3 && !test_failed(); k++) {
		dev->to_device(dw_d, dw0, C * sizeof(float));
		dev->to_device(db_d, db0, C * sizeof(float));
		poison(dx_d, nc);
		int no_dw = k != 0, no_db = k != 1;
		dev->layernorm_backward(dx_d, no_dw ? NULL : dw_d, no_db ? NULL : db_d, dy_d, x_d,
					NULL, m_d, r_d, N, C);
		float *dx = getf(dx_d, nc), *dw = getf(dw_d, C), *db = getf(db_d, C);
		double ex = rel_err(dx, dx0, nc);
		double ew = rel_err(dw, no_dw ? dw0 : dw1, C), eb = rel_err(db, no_db ? db0 : db1, C);
		CHECK_MSG(ex <= 1e-6 && ew <= 1e-6 && eb <= 1e-6, "%s: backward with %s: dinp "
			  "%.3g, dw %.3g, db %.3g" SEED_FMT, ctx,
			  k == 0 ? "db NULL" : k == 1 ? "dw NULL" : "dw and db NULL", ex, ew, eb,
			  SEED_ARG);
		free(dx), free(dw), free(db);
	}
	dev->free(x_d), dev->free(dy_d), dev->free(one_d), dev->free(zero_d), dev->free(o_d);
	dev->free(m_d), dev->free(r_d), dev->free(dx_d), dev->free(dw_d), dev->free(db_d);
	free(x), free(dy), free(dw0), free(db0), free(ones), free(zeros), free(o0), free(dx0);
	free(dw1), free(db1);
}

TEST(cuda_contracts)
{
	NEED(softmax_xent);
	NEED(copy);
	NEED(layernorm_forward);
	NEED(layernorm_backward);
	xent_contract_case();
	if (!test_failed())
		copy_contract_case();
	if (!test_failed())
		ln_null_contract_case(67, 100);
	if (!test_failed())
		ln_null_contract_case(600, 768);
}

/* ==== the harness itself, on the CPU backend (runs everywhere) ==== */

/* The double references and the case functions above, against the CPU
 * backend at small shapes: a wrong reference or a broken comparison shows
 * here in every run, not first on a GPU machine. */
TEST(cuda_ops_harness_on_cpu)
{
	seed_test();
	dev = &backend_cpu;
	attention_case(2, 70, 4, 2, 64);
	if (!test_failed())
		attention_case(1, 37, 6, 3, 128);
	if (!test_failed())
		matmul_ref_case(37, 53, 71, 1);
	if (!test_failed())
		matmul_ref_case(37, 53, 71, 0);
	for (size_t k = 0; k < 4 && !test_failed(); k++)
		ns_case(ns_shapes[k][0], ns_shapes[k][1]);
	if (!test_failed())
		xent_contract_case();
	if (!test_failed())
		copy_contract_case();
	if (!test_failed())
		ln_null_contract_case(67, 100);
	tb = &backend_cpu_bf16, tf = &backend_cpu;
	if (!test_failed())
		bf16_all_cases();
	dev = cu;
}
