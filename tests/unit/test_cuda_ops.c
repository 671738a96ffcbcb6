/* test_cuda_ops.c - every CUDA backend operation against the CPU reference.
 *
 * Every test SKIPs when this binary has no CUDA backend or no usable device
 * (cuda_available() says why), and per operation when either backend lacks
 * the slot. Tolerances, per operation (fp32 kernels unless stated):
 *   memory, embed_forward, add, scale         exact
 *   norms, rope, gelu, swiglu, softmax_xent   1e-5 relative to the data's scale
 *   optimizer pieces                          1e-6 (lion: exact signs)
 *   sumsq                                     1e-9 relative (both in double)
 *   attention forward                         1e-4; backward 1e-3 of max|ref|
 *   matmul (bf16 operands, fp32 accumulate)   1e-2 of max|ref|
 *   newton_schulz (bf16 GEMMs, 5 steps)       5e-2 of max|ref|
 * Reductions must also repeat bit for bit (determinism tests).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../test.h"

static const struct backend *cu;
static const struct backend *ref = &backend_cpu;
static int ready = -1;
static char why[256];

static int cuda_ready(void)
{
	if (ready < 0) {
		cu = backend_cuda();
		if (!cu)
			snprintf(why, sizeof(why), "this binary has no CUDA backend");
		ready = cu && cuda_available(why, sizeof(why));
	}
	return ready;
}

#define NEED(slot)                                                                \
	do {                                                                      \
		if (!cuda_ready())                                                \
			SKIP(why);                                                \
		if (!ref->slot || !cu->slot)                                      \
			SKIP("cpu or cuda backend lacks " #slot);                 \
	} while (0)

static uint64_t seed = 12345;

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

static float *dup(const float *x, size_t n)
{
	return memcpy(xmalloc(st_mult(n ? n : 1, sizeof(float))), x, n * sizeof(float));
}

static void *put(const void *h, size_t bytes)
{
	void *d = cu->alloc(bytes);
	cu->to_device(d, h, bytes);
	return d;
}

static float *putf(const float *h, size_t n)
{
	return put(h, n * sizeof(float));
}

static float *getf(const float *d, size_t n)
{
	float *h = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	cu->to_host(h, d, n * sizeof(float));
	return h;
}

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
		CHECK_MSG(e_ <= (tol), "%s vs %s: relative error %.3g > %g", #got, #want, \
			  e_, (double)(tol));                                     \
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
	float *dout_ = cu->alloc((size_t)N * C * sizeof(float));
	cu->embed_forward(dout_, dtok, dwte_, dwpe_, B, T, C);
	float *got = getf(dout_, (size_t)N * C);
	CHECK_CLOSE(got, out, (size_t)N * C, 0);
	cu->embed_forward(dout_, dtok, dwte_, NULL, B, T, C);
	free(got);
	got = getf(dout_, (size_t)N * C);
	CHECK(got[5] == wte[(size_t)tok[0] * C + 5]);

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
	float *out_c = cu->alloc(nc * 4), *mean_c = cu->alloc(N * 4), *rstd_c = cu->alloc(N * 4);
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

	/* backward: dinp overwritten (prefilled with junk), dw/db accumulated */
	float *dy = randn(nc, 1), *dw = randn(C, 1), *db = randn(C, 1), *dx = fill(nc, 0);
	float *dy_c = putf(dy, nc), *dw_c = putf(dw, C), *db_c = putf(db, C);
	float *junk = fill(nc, 1e30f), *dx_c = putf(junk, nc);
	float *dw0 = dup(dw, C);
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
	free(dy), free(dw), free(db), free(dx), free(junk), free(dw0), free(hx), free(hw);
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
	float *b_c = bias ? putf(bias, OC) : NULL, *o_c = cu->alloc((size_t)N * OC * 4);
	cu->matmul_forward(o_c, x_c, w_c, b_c, N, C, OC);
	float *o = getf(o_c, (size_t)N * OC);
	CHECK_CLOSE(o, out, (size_t)N * OC, 1e-2);

	float *dy = randn((size_t)N * OC, 1), *dx = fill((size_t)N * C, 0);
	float *dw = randn((size_t)OC * C, 1), *db = randn(OC, 1);
	float *dy_c = putf(dy, (size_t)N * OC), *dx_c = cu->alloc((size_t)N * C * 4);
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
	float *x = randn(n, 1), *y = dup(x, n), *x_c = putf(x, n);
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

static void attention_case(int B, int T, int NH, int NKV, int HD)
{
	int QKV = (NH + 2 * NKV) * HD, C = NH * HD;
	size_t nq = (size_t)B * T * QKV, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
	float *qkv = randn(nq, 1), *out = fill(no, 0), *lse = fill(nl, 0);
	ref->attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
	float *qkv_c = putf(qkv, nq), *out_c = cu->alloc(no * 4), *lse_c = cu->alloc(nl * 4);
	cu->attention_forward(out_c, lse_c, qkv_c, B, T, NH, NKV, HD);
	float *ho = getf(out_c, no), *hl = getf(lse_c, nl);
	CHECK_CLOSE(ho, out, no, 1e-4);
	CHECK_CLOSE(hl, lse, nl, 1e-4);

	float *dy = randn(no, 1), *dq = fill(nq, 0);
	float *dy_c = putf(dy, no), *junk = fill(nq, 1e30f), *dq_c = putf(junk, nq);
	ref->attention_backward(dq, dy, qkv, out, lse, B, T, NH, NKV, HD);
	cu->attention_backward(dq_c, dy_c, qkv_c, out_c, lse_c, B, T, NH, NKV, HD);
	float *hd = getf(dq_c, nq);
	CHECK_CLOSE(hd, dq, nq, 1e-3);
	cu->to_device(dq_c, junk, nq * 4);
	cu->attention_backward(dq_c, dy_c, qkv_c, out_c, lse_c, B, T, NH, NKV, HD);
	float *hd2 = getf(dq_c, nq);
	CHECK(!memcmp(hd, hd2, nq * sizeof(float)));
	cu->free(qkv_c), cu->free(out_c), cu->free(lse_c), cu->free(dy_c), cu->free(dq_c);
	free(qkv), free(out), free(lse), free(ho), free(hl), free(dy), free(dq), free(junk);
	free(hd), free(hd2);
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
	float *x_c = putf(x, n), *dy_c = putf(dy, n), *y_c = cu->alloc(n * 4);
	float *dx_c = cu->alloc(n * 4);
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
	float *x_c = putf(x, ni), *dy_c = putf(dy, no), *y_c = cu->alloc(no * 4);
	float *dx_c = cu->alloc(ni * 4);
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

TEST(cuda_softmax_xent)
{
	NEED(softmax_xent);
	int N = 9, V = 1000, Vp = 1024;
	size_t nl = (size_t)N * Vp;
	float *logits = randn(nl, 4), *loss = fill(N, 0), *dl = fill(nl, 0);
	int32_t tg[9];
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(rng_next(&seed) % V);
	tg[0] = V - 1;
	ref->softmax_xent(loss, dl, logits, tg, N, V, Vp, 1.0f / N);
	float *lg_c = putf(logits, nl), *loss_c = cu->alloc(N * 4), *dl_c = cu->alloc(nl * 4);
	int32_t *tg_c = put(tg, sizeof(tg));
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
	free(logits), free(loss), free(dl), free(hl), free(hd), free(hd2);
}

/* ---- optimizer pieces ---- */

TEST(cuda_adamw)
{
	NEED(adamw_dir);
	size_t n = 4099;
	float *g = randn(n, 1), *m = randn(n, 0.1f), *v = randn(n, 0.1f), *u = fill(n, 0);
	for (size_t i = 0; i < n; i++)
		v[i] = v[i] * v[i];
	float *g_c = putf(g, n), *m_c = putf(m, n), *v_c = putf(v, n), *u_c = cu->alloc(n * 4);
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
	float *g_c = putf(g, n), *m_c = putf(m, n), *u_c = cu->alloc(n * 4);
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

TEST(cuda_newton_schulz)
{
	NEED(newton_schulz);
	int shapes[][2] = {{48, 96}, {96, 48}, {128, 128}, {300, 77}};
	for (size_t k = 0; k < ARRAY_SIZE(shapes); k++) {
		int r = shapes[k][0], c = shapes[k][1];
		size_t n = (size_t)r * c, ns = newton_schulz_scratch(r, c);
		float *x = randn(n, 1), *y = fill(n, 0), *s = fill(ns, 0);
		ref->newton_schulz(y, x, r, c, 5, s);
		float *x_c = putf(x, n), *y_c = cu->alloc(n * 4), *s_c = cu->alloc(ns * 4);
		cu->newton_schulz(y_c, x_c, r, c, 5, s_c);
		float *h = getf(y_c, n);
		CHECK_CLOSE(h, y, n, 5e-2);
		cu->free(x_c), cu->free(y_c), cu->free(s_c);
		free(x), free(y), free(s), free(h);
	}
}
