/* test_moe_ops.c - the mixture-of-experts ops of kernels/backend.h (moe_*)
 * against a plain double-precision re-derivation written here from moe.h's
 * maths, at odd shapes: E not dividing N, an expert that gets no token,
 * top-k = E, tied scores (the lower index wins), both routers. Routing
 * choices, counts and positions must be equal; values within float
 * round-off; the router's backward against central differences of the
 * per-token objective it differentiates. Runs on test_backend() with f32
 * activations (the CPU unless ASYNCPP_TEST_DEVICE names cuda), through
 * to_device/to_host, so it checks a GPU's ops as it checks the CPU's.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../test.h"

struct shape {
	int N, E, K, C, router;
	int empty;  /* expert E-1 gets no token (its logits far below) */
	int ties;   /* token 0: all logits equal; token 1: two equal maxima */
};

static const struct shape shapes[] = {
	{7, 3, 2, 5, 0, 0, 1},  /* E does not divide N, ties */
	{9, 5, 1, 3, 0, 1, 0},  /* top-1 (Switch gate), an empty expert */
	{5, 4, 4, 6, 1, 0, 1},  /* top-k = E, sigmoid, ties */
	{11, 6, 2, 7, 1, 1, 0}, /* sigmoid, an empty expert */
};

static void frand(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal(&s);
}

static void *dev(const struct backend *be, const void *src, size_t bytes)
{
	void *p = be->alloc(bytes ? bytes : 1);
	if (src)
		be->to_device(p, src, bytes);
	return p;
}

static void host(const struct backend *be, void *dst, const void *src, size_t bytes)
{
	be->synchronize();
	be->to_host(dst, src, bytes);
}

/* ---- the re-derivation (double) ---- */

static double ref_lse(const float *z, int E)
{
	double mx = z[0], s = 0;
	for (int e = 1; e < E; e++)
		mx = z[e] > mx ? z[e] : mx;
	for (int e = 0; e < E; e++)
		s += exp((double)z[e] - mx);
	return mx + log(s);
}

static void ref_scores(const float *z, int E, int router, double *sc)
{
	double l = ref_lse(z, E);
	for (int e = 0; e < E; e++)
		sc[e] = router == 0 ? exp(z[e] - l) : 1.0 / (1.0 + exp(-(double)z[e]));
}

/* sel: the K best by score, best first, ties to the lower index (a stable
 * selection sort on descending score) */
static void ref_select(const double *sc, int E, int K, int *sel)
{
	int used[64] = {0};
	for (int j = 0; j < K; j++) {
		int b = -1;
		for (int e = 0; e < E; e++)
			if (!used[e] && (b < 0 || sc[e] > sc[b]))
				b = e;
		used[b] = 1;
		sel[j] = b;
	}
}

static double ref_gate(const double *sc, const int *sel, int K, int j)
{
	double s = 0;
	for (int i = 0; i < K; i++)
		s += sc[sel[i]];
	return K > 1 ? sc[sel[j]] / s : sc[sel[j]];
}

/* The part of dloss*(alpha*balance + beta*zloss) + sum dgate*gate that
 * depends on token n's logits (f and the choice fixed; dgate carries its
 * own scale), the objective moe_router_backward differentiates. */
static double ref_token_objective(const float *z, int E, int K, int router, const int *sel,
				  const float *dg, const double *f, int N, double dloss,
				  double alpha, double beta)
{
	double sc[64], J = 0, norm = 0, l = ref_lse(z, E);
	ref_scores(z, E, router, sc);
	for (int j = 0; j < K; j++)
		J += dg[j] * ref_gate(sc, sel, K, j);
	for (int e = 0; e < E; e++)
		norm += router == 0 ? 0 : sc[e];
	for (int e = 0; e < E; e++)
		J += dloss * alpha * E * f[e] * (router == 0 ? sc[e] : sc[e] / norm) / N;
	return J + dloss * beta * l * l / N;
}

static int close(double got, double want, double tol)
{
	return fabs(got - want) <= tol * (1 + fabs(want));
}

static void run_shape(const struct shape *s)
{
	const struct backend *be = backend_with_act_dtype(test_backend(), ACT_F32);
	int N = s->N, E = s->E, K = s->K, C = s->C, NK = N * K;
	float *z = xmalloc(sizeof(float) * N * E), *x = xmalloc(sizeof(float) * N * C);
	float *y = xmalloc(sizeof(float) * NK * C), *dout = xmalloc(sizeof(float) * N * C);
	float *out0 = xmalloc(sizeof(float) * N * C), *dgate_in = xmalloc(sizeof(float) * NK);
	float *score = xmalloc(sizeof(float) * N * E), *gate = xmalloc(sizeof(float) * NK);
	float *xd = xmalloc(sizeof(float) * NK * C), *out = xmalloc(sizeof(float) * N * C);
	float *dy = xmalloc(sizeof(float) * NK * C), *dgate = xmalloc(sizeof(float) * NK);
	float *dz = xmalloc(sizeof(float) * N * E), aux[2];
	int32_t *sel = xmalloc(sizeof(int32_t) * NK), *pos = xmalloc(sizeof(int32_t) * NK);
	int32_t *count = xmalloc(sizeof(int32_t) * (E + 1));
	int rsel[64], rcount[65] = {0};
	double sc[64], f[64], P[64] = {0}, zs = 0, bal = 0;
	const float dloss = 0.7f, alpha = 0.3f, beta = 0.2f;

	frand(z, (size_t)N * E, 11 + N, 1.5f);
	frand(x, (size_t)N * C, 12 + N, 1.0f);
	frand(y, (size_t)NK * C, 13 + N, 1.0f);
	frand(dout, (size_t)N * C, 14 + N, 1.0f);
	frand(out0, (size_t)N * C, 15 + N, 1.0f);
	frand(dgate_in, (size_t)NK, 16 + N, 1.0f);
	if (s->empty)
		for (int n = 0; n < N; n++)
			z[n * E + E - 1] = -9.0f;
	if (s->ties) {
		for (int e = 0; e < E; e++)
			z[e] = 0.25f;
		z[E + 1] = z[E + 2] = 2.0f;
		z[E] = z[E + 3 < 2 * E ? E + 3 : E] = -1.0f;
	}

	float *d_z = dev(be, z, sizeof(float) * N * E), *d_x = dev(be, x, sizeof(float) * N * C);
	float *d_y = dev(be, y, sizeof(float) * NK * C);
	float *d_dout = dev(be, dout, sizeof(float) * N * C);
	float *d_out = dev(be, out0, sizeof(float) * N * C);
	float *d_score = dev(be, NULL, sizeof(float) * N * E), *d_gate = dev(be, NULL, 4 * NK);
	int32_t *d_sel = dev(be, NULL, 4 * NK), *d_pos = dev(be, NULL, 4 * NK);
	int32_t *d_count = dev(be, NULL, 4 * (E + 1));
	float *d_xd = dev(be, NULL, sizeof(float) * NK * C), *d_dy = dev(be, NULL, 4 * NK * C);
	float *d_dgate = dev(be, NULL, 4 * NK), *d_dgin = dev(be, dgate_in, 4 * NK);
	float *d_aux = dev(be, NULL, 8), *d_dz = dev(be, NULL, sizeof(float) * N * E);

	be->moe_route(d_score, d_sel, d_gate, d_z, N, E, K, s->router);
	be->moe_dispatch(d_count, d_pos, d_sel, N, K, E);
	be->moe_gather(d_xd, d_x, d_pos, N, K, C);
	be->moe_combine(d_out, d_y, d_gate, d_pos, N, K, C);
	be->moe_combine_backward(d_dy, d_dgate, d_dout, d_y, d_gate, d_pos, N, K, C);
	be->moe_aux(d_aux, d_z, d_score, d_count, N, E, K, s->router);
	be->moe_router_backward(d_dz, d_z, d_score, d_sel, d_gate, d_dgin, d_count, N, E, K,
				s->router, dloss, alpha, beta);
	host(be, score, d_score, 4 * N * E);
	host(be, sel, d_sel, 4 * NK);
	host(be, gate, d_gate, 4 * NK);
	host(be, count, d_count, 4 * (E + 1));
	host(be, pos, d_pos, 4 * NK);
	host(be, xd, d_xd, 4 * NK * C);
	host(be, out, d_out, 4 * N * C);
	host(be, dy, d_dy, 4 * NK * C);
	host(be, dgate, d_dgate, 4 * NK);
	host(be, aux, d_aux, 8);
	host(be, dz, d_dz, 4 * N * E);

	/* routing: the choice exactly, scores and gates to round-off */
	for (int n = 0; n < N; n++) {
		ref_scores(z + n * E, E, s->router, sc);
		ref_select(sc, E, K, rsel);
		for (int e = 0; e < E; e++)
			CHECK_MSG(close(score[n * E + e], sc[e], 1e-6), "score[%d,%d] %g want %g",
				  n, e, score[n * E + e], sc[e]);
		for (int j = 0; j < K; j++) {
			CHECK_MSG(sel[n * K + j] == rsel[j], "sel[%d,%d] %d want %d", n, j,
				  sel[n * K + j], rsel[j]);
			CHECK_MSG(close(gate[n * K + j], ref_gate(sc, rsel, K, j), 1e-6),
				  "gate[%d,%d]", n, j);
			rcount[rsel[j] + 1]++;
		}
		zs += ref_lse(z + n * E, E) * ref_lse(z + n * E, E);
		double norm = 0;
		for (int e = 0; e < E; e++)
			norm += sc[e];
		for (int e = 0; e < E; e++)
			P[e] += (s->router == 0 ? sc[e] : sc[e] / norm) / N;
	}
	if (s->ties) {
		for (int j = 0; j < K; j++)
			CHECK_MSG(sel[j] == j, "all-equal token: sel[%d] = %d", j, sel[j]);
		CHECK(sel[K] == 1);
	}
	/* dispatch: counts, and each slot's row from its rank among its expert's
	 * slots in (token, j) order */
	for (int e = 0; e < E; e++)
		rcount[e + 1] += rcount[e];
	for (int e = 0; e <= E; e++)
		CHECK_MSG(count[e] == rcount[e], "count[%d] %d want %d", e, count[e], rcount[e]);
	if (s->empty)
		CHECK(count[E] == count[E - 1]);
	for (int i = 0; i < NK; i++) {
		int rank = 0;
		for (int k = 0; k < i; k++)
			rank += sel[k] == sel[i];
		CHECK_MSG(pos[i] == rcount[sel[i]] + rank, "pos[%d] %d want %d", i, pos[i],
			  rcount[sel[i]] + rank);
		CHECK(!memcmp(xd + (size_t)pos[i] * C, x + (size_t)(i / K) * C, 4 * C));
	}
	/* combine and its backward */
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			double want = out0[n * C + c];
			for (int j = 0; j < K; j++)
				want += (double)gate[n * K + j] * y[(size_t)pos[n * K + j] * C + c];
			CHECK_MSG(close(out[n * C + c], want, 1e-6), "out[%d,%d]", n, c);
		}
	for (int i = 0; i < NK; i++) {
		double dot = 0;
		for (int c = 0; c < C; c++) {
			float dv = dout[(i / K) * C + c];
			dot += (double)dv * y[(size_t)pos[i] * C + c];
			CHECK(close(dy[(size_t)pos[i] * C + c], (double)gate[i] * dv, 1e-6));
		}
		CHECK_MSG(close(dgate[i], dot, 1e-6), "dgate[%d] %g want %g", i, dgate[i], dot);
	}
	/* auxiliary losses */
	for (int e = 0; e < E; e++) {
		f[e] = (double)(rcount[e + 1] - rcount[e]) / NK;
		bal += f[e] * P[e];
	}
	CHECK_MSG(close(aux[0], E * bal, 1e-5), "balance %g want %g", aux[0], E * bal);
	CHECK_MSG(close(aux[1], zs / N, 1e-5), "zloss %g want %g", aux[1], zs / N);
	/* router backward: central differences of the token's objective */
	for (int n = 0; n < N; n++) {
		float zr[64];
		for (int e = 0; e < E; e++) {
			const double h = 1e-3;
			double jp, jm, want;
			memcpy(zr, z + n * E, 4 * E);
			zr[e] = (float)(z[n * E + e] + h);
			double hp = (double)zr[e] - z[n * E + e];
			jp = ref_token_objective(zr, E, K, s->router, sel + n * K, dgate_in + n * K,
						 f, N, dloss, alpha, beta);
			zr[e] = (float)(z[n * E + e] - h);
			double hm = z[n * E + e] - (double)zr[e];
			jm = ref_token_objective(zr, E, K, s->router, sel + n * K, dgate_in + n * K,
						 f, N, dloss, alpha, beta);
			want = (jp - jm) / (hp + hm);
			CHECK_MSG(fabs(dz[n * E + e] - want) <= 2e-5 + 1e-3 * fabs(want),
				  "dz[%d,%d] %g want %g", n, e, dz[n * E + e], want);
		}
	}

	void *devs[] = {d_z, d_x, d_y, d_dout, d_out, d_score, d_gate, d_sel, d_pos, d_count,
			d_xd, d_dy, d_dgate, d_dgin, d_aux, d_dz};
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
		be->free(devs[i]);
	free(z), free(x), free(y), free(dout), free(out0), free(dgate_in), free(score);
	free(gate), free(xd), free(out), free(dy), free(dgate), free(dz), free(sel), free(pos);
	free(count);
}

TEST(moe_ops_softmax_ties_top2)
{
	run_shape(&shapes[0]);
}

TEST(moe_ops_top1_empty_expert)
{
	run_shape(&shapes[1]);
}

TEST(moe_ops_sigmoid_top_k_all_ties)
{
	run_shape(&shapes[2]);
}

TEST(moe_ops_sigmoid_empty_expert)
{
	run_shape(&shapes[3]);
}

/* The gather's backward: moe_combine with gate NULL adds the rows unscaled. */
TEST(moe_ops_combine_ungated)
{
	const struct backend *be = backend_with_act_dtype(test_backend(), ACT_F32);
	enum { N = 3, K = 2, C = 4 };
	int32_t pos[N * K] = {5, 0, 1, 4, 2, 3};
	float y[N * K * C], acc[N * C], out[N * C];

	frand(y, N * K * C, 3, 1.0f);
	frand(acc, N * C, 4, 1.0f);
	float *d_y = dev(be, y, sizeof(y)), *d_acc = dev(be, acc, sizeof(acc));
	int32_t *d_pos = dev(be, pos, sizeof(pos));
	be->moe_combine(d_acc, d_y, NULL, d_pos, N, K, C);
	host(be, out, d_acc, sizeof(out));
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++) {
			float want = acc[n * C + c];
			for (int j = 0; j < K; j++)
				want += y[pos[n * K + j] * C + c];
			CHECK(out[n * C + c] == want);
		}
	be->free(d_y), be->free(d_acc), be->free(d_pos);
}
