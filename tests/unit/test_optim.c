/* test_optim.c - optimizers, error feedback and the lr schedule against
 * scalar references written here independently of the backend. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/cpu/cpu.h"
#include "../../optim/optim.h"
#include "../../optim/soap.h"
#include "../test.h"
#include "fixtures/optim_reference.h"

#ifndef OPTIM_TEST_BACKEND
#define OPTIM_TEST_BACKEND backend_cpu
#endif
extern const struct backend OPTIM_TEST_BACKEND;
static const struct backend *const be = &OPTIM_TEST_BACKEND;

/* The CPU backend's optimizer kernels land separately; until then skip. */
#define NEED_BACKEND()                                                          \
	do {                                                                    \
		if (!be->alloc || !be->free || !be->copy || !be->adamw_dir ||   \
		    !be->lion_dir || !be->momentum || !be->newton_schulz ||     \
		    !be->apply_update || !be->sumsq || !be->scale)              \
			SKIP("backend lacks optimizer operations");             \
	} while (0)

/* ---- fixtures ---- */

/* [optim] keys set by hand (the config defaults, without io/config/config.c). */
static void test_config(struct config *cfg, const char *name)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->optim_name = (char *)name;
	cfg->optim_lr = 0.01;
	cfg->optim_min_lr_ratio = 0.1;
	cfg->optim_warmup = 10;
	cfg->optim_decay = (char *)"cosine";
	cfg->optim_wsd_decay_frac = 0.2;
	cfg->optim_weight_decay = 0.1;
	cfg->optim_beta1 = 0.9;
	cfg->optim_beta2 = 0.95;
	cfg->optim_beta3 = 0.99;
	cfg->optim_eps = 1e-8;
	cfg->optim_mars_gamma = 0.025;
	cfg->optim_ademamix_alpha = 5;
	cfg->optim_ademamix_warmup = 0;
	cfg->optim_soap_every = 10;
	cfg->optim_momentum = 0.9;
	cfg->optim_nesterov = 1;
	cfg->optim_ns_steps = 5;
	cfg->optim_muon_scale = (char *)"rms";
	cfg->optim_correction = (char *)"none";
	cfg->optim_ef_lambda = 1.0;
	cfg->optim_ef_groups = (char *)"all";
	cfg->train_steps = 110;
}

#define MAX_T 8

/* A fake model (no model/ code) of up to MAX_T tensors laid out back to
 * back; the stage holds all of them. */
struct fixture {
	struct model m;
	struct param_info info[MAX_T];
	struct stage_param sp[MAX_T];
	size_t numel;
};

static void fx_add(struct fixture *fx, const char *name, int rows, int cols, int group, int decay)
{
	struct param_info *pi = &fx->info[fx->m.n_params];
	struct stage_param *sp = &fx->sp[fx->m.n_params];

	memset(pi, 0, sizeof(*pi));
	snprintf(pi->name, sizeof(pi->name), "%s", name);
	pi->rows = rows;
	pi->cols = cols;
	pi->numel = (size_t)rows * (size_t)(cols ? cols : 1);
	pi->offset = fx->numel;
	pi->group = group;
	pi->decay = decay;
	sp->global = fx->m.n_params;
	sp->offset = fx->numel;
	sp->tied_copy = 0;
	fx->numel += pi->numel;
	fx->m.n_params++;
	fx->m.params = fx->info;
	fx->m.numel = fx->numel;
}

/* The small fixture: a 2x3 hidden matrix (decayed) and a 3-vector. */
static void fx_small(struct fixture *fx)
{
	memset(fx, 0, sizeof(*fx));
	fx_add(fx, "h.0.qkvw", 2, 3, GROUP_MATRIX, 1);
	fx_add(fx, "h.0.ln1w", 3, 0, GROUP_OTHER, 0);
}

static float *falloc(size_t n)
{
	return xcalloc(n, sizeof(float));
}

/* Backend copies of host arrays (the CPU backend's memory is host memory,
 * but go through the table anyway). */
static float *be_floats(const float *host, size_t n)
{
	float *p = be->alloc(n * sizeof(float));

	if (host)
		be->copy(p, host, n * sizeof(float));
	return p;
}

/* Deterministic gradient of step t (1-based), element i. */
static float grad_of(int t, size_t i)
{
	return 0.5f * (float)sin(1.0 + 0.7 * (double)i + 2.3 * (double)t + 0.13 * (double)i * t);
}

/* grad_of, but the matrix's row 0 dominates at step 1 and row 1 after it
 * (tests/optim_reference.py's grad_swap) */
static float grad_swap(int t, size_t i)
{
	if (i >= 6)
		return grad_of(t, i);
	int strong = (i / 3 == 0) == (t == 1);
	return grad_of(t, i) * (strong ? 1.0f : 0.05f);
}

/* grad_of at 0.2 the size (tests/optim_reference.py's grad_small) */
static float grad_small(int t, size_t i)
{
	return 0.2f * grad_of(t, i);
}

/* the gradient run_steps feeds */
static float (*gradient)(int t, size_t i) = grad_of;

static void init_weights(float *w, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		w[i] = 1.0f - 0.1f * (float)i;
}

/* Run `steps` steps of optimizer cfg on the fixture from init_weights and
 * grad_of, constant lr; weights end in w_out[numel]. */
static int run_steps(const struct config *cfg, const struct fixture *fx, int steps, float lr,
		     float *w_out)
{
	struct optimizer o;
	float *w, *g, *hg = falloc(fx->numel);
	int t;
	size_t i;

	if (optim_init(&o, be, cfg, &fx->m, fx->sp, fx->m.n_params, fx->numel)) {
		free(hg);
		return -1;
	}
	init_weights(hg, fx->numel);
	w = be_floats(hg, fx->numel);
	g = be_floats(NULL, fx->numel);
	for (t = 1; t <= steps; t++) {
		for (i = 0; i < fx->numel; i++)
			hg[i] = gradient(t, i);
		be->copy(g, hg, fx->numel * sizeof(float));
		optim_step(&o, w, g, lr, t);
	}
	be->copy(w_out, w, fx->numel * sizeof(float));
	be->free(w);
	be->free(g);
	optim_free(&o);
	free(hg);
	return 0;
}

/* ---- scalar references (one element at a time) ---- */

struct ref {
	float m, v, w;
};

static float ref_adamw(struct ref *r, float g, float lr, int t, float wd)
{
	const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
	double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
	float u;

	r->m = b1 * r->m + (1 - b1) * g;
	r->v = b2 * r->v + (1 - b2) * g * g;
	u = (float)(-lr * (r->m / bc1) / (sqrt(r->v / bc2) + eps));
	r->w = r->w * (1 - lr * wd) + u;
	return u;
}

static float ref_lion(struct ref *r, float g, float lr, float wd)
{
	const float b1 = 0.9f, b2 = 0.95f;
	float c = b1 * r->m + (1 - b1) * g;
	float u = c > 0 ? -lr : c < 0 ? lr : 0.0f;

	r->m = b2 * r->m + (1 - b2) * g;
	r->w = r->w * (1 - lr * wd) + u;
	return u;
}

/* momentum buffer r->m; returns the (Nesterov) output, not times -lr */
static float ref_momentum(struct ref *r, float g, float mu, int nesterov)
{
	r->m = mu * r->m + g;
	return nesterov ? g + mu * r->m : r->m;
}

static int close_rel(double a, double b, double tol)
{
	return fabs(a - b) <= tol * fmax(1.0, fabs(b));
}

/* ---- each optimizer against its reference ---- */

TEST(adamw_matches_reference)
{
	struct config cfg;
	struct fixture fx;
	struct ref r[16];
	float w[16];
	int wdi, t;
	size_t i;

	NEED_BACKEND();
	fx_small(&fx);
	for (wdi = 0; wdi < 2; wdi++) {
		float wd = wdi ? 0.1f : 0.0f;

		test_config(&cfg, "adamw");
		cfg.optim_weight_decay = wd;
		for (t = 1; t <= 3; t++) {
			CHECK(run_steps(&cfg, &fx, t, 0.01f, w) == 0);
			for (i = 0; i < fx.numel; i++) {
				if (t == 1) {
					r[i].m = r[i].v = 0;
					r[i].w = 1.0f - 0.1f * (float)i;
				}
			}
			for (i = 0; i < fx.numel; i++) {
				/* decay only on the matrix (elements 0..5) */
				ref_adamw(&r[i], grad_of(t, i), 0.01f, t, i < 6 ? wd : 0.0f);
				CHECK_MSG(close_rel(w[i], r[i].w, 2e-6),
					  "wd %g step %d elem %zu: %.9g vs %.9g", wd, t, i, w[i],
					  r[i].w);
			}
		}
	}
}

/* Adan against tests/optim_reference.py's double-precision weights over six
 * steps: the previous gradient enters from step 2 on (a version that
 * ignored it fails from step 2). */
TEST(adan_matches_reference_fixture)
{
	struct config cfg;
	struct fixture fx;
	float w[16];

	NEED_BACKEND();
	fx_small(&fx);
	test_config(&cfg, "adan");
	cfg.optim_beta1 = 0.98;
	cfg.optim_beta2 = 0.92;
	cfg.optim_beta3 = 0.99;
	cfg.optim_weight_decay = 0.02;
	for (int t = 1; t <= 6; t++) {
		CHECK(run_steps(&cfg, &fx, t, 0.01f, w) == 0);
		for (size_t i = 0; i < fx.numel; i++)
			CHECK_MSG(close_rel(w[i], adan_reference[t - 1][i], 2e-6),
				  "step %d elem %zu: %.9g vs %.9g", t, i, w[i], adan_reference[t - 1][i]);
	}
}

/* The weights of cfg's optimizer over `steps` steps of the small fixture
 * against a double-precision reference from tests/optim_reference.py. */
static void check_reference(const struct config *cfg, const double (*ref)[9], int steps,
			    double tol)
{
	struct fixture fx;
	float w[16];

	fx_small(&fx);
	for (int t = 1; t <= steps; t++) {
		CHECK(run_steps(cfg, &fx, t, 0.01f, w) == 0);
		for (size_t i = 0; i < fx.numel; i++)
			CHECK_MSG(close_rel(w[i], ref[t - 1][i], tol), "%s step %d elem %zu: %.9g vs %.9g",
				  cfg->optim_name, t, i, w[i], ref[t - 1][i]);
		if (test_failed())
			return;
	}
}

/* MARS: the correction uses the previous gradient (zero before step 1), the
 * corrected gradient is clipped to norm 1, the vector takes AdamW. */
TEST(mars_matches_reference_fixture)
{
	struct config cfg;
	NEED_BACKEND();
	test_config(&cfg, "mars");
	cfg.optim_beta1 = 0.95;
	cfg.optim_beta2 = 0.99;
	check_reference(&cfg, mars_reference, 6, 2e-6); /* clipped at every step */
	gradient = grad_small; /* never clipped */
	check_reference(&cfg, mars_small_reference, 6, 2e-6);
	gradient = grad_of;
}

/* AdEMAMix with a 4-step warm-up of alpha and beta3 (steps 1-3 inside it) */
TEST(ademamix_matches_reference_fixture)
{
	struct config cfg;
	NEED_BACKEND();
	test_config(&cfg, "ademamix");
	cfg.optim_beta1 = 0.9;
	cfg.optim_beta2 = 0.999;
	cfg.optim_beta3 = 0.9999;
	cfg.optim_ademamix_alpha = 5;
	cfg.optim_ademamix_warmup = 4;
	check_reference(&cfg, ademamix_reference, 6, 2e-6);
}

/* NorMuon under both scales: Newton-Schulz in float against double, so a
 * looser tolerance; the row normalisation changes the result from Muon's. */
TEST(normuon_matches_reference_fixture)
{
	struct config cfg;
	NEED_BACKEND();
	test_config(&cfg, "normuon");
	check_reference(&cfg, normuon_rms_reference, 6, 1e-5);
	cfg.optim_muon_scale = (char *)"shape";
	check_reference(&cfg, normuon_shape_reference, 6, 1e-5);
}

/* The four optimizers asyncpp started with, against the same independent
 * double-precision implementation as the paper's five (beside the float
 * references above): AdamW, Lion, SGD with and without Nesterov, and Muon
 * under both scales, whose Newton-Schulz runs in float here, so a looser
 * tolerance for it. */
TEST(first_optimizers_match_reference_fixture)
{
	struct config cfg;
	NEED_BACKEND();
	test_config(&cfg, "adamw");
	check_reference(&cfg, adamw_reference, 6, 2e-6);
	test_config(&cfg, "lion");
	check_reference(&cfg, lion_reference, 6, 1e-6);
	test_config(&cfg, "sgd");
	check_reference(&cfg, sgd_nesterov_reference, 6, 1e-6);
	cfg.optim_nesterov = 0;
	check_reference(&cfg, sgd_reference, 6, 1e-6);
	test_config(&cfg, "muon");
	check_reference(&cfg, muon_rms_reference, 6, 1e-5);
	cfg.optim_muon_scale = (char *)"shape";
	check_reference(&cfg, muon_shape_reference, 6, 1e-5);
}

/* SOAP over 8 steps with a refresh every 2: step 1 builds the bases without
 * an update, steps 3, 5 and 7 reorder and re-orthogonalise them. */
TEST(soap_matches_reference_fixture)
{
	struct config cfg;
	NEED_BACKEND();
	test_config(&cfg, "soap");
	cfg.optim_beta1 = 0.95;
	cfg.optim_beta2 = 0.95;
	cfg.optim_weight_decay = 0.01;
	cfg.optim_soap_every = 2;
	check_reference(&cfg, soap_reference, 8, 1e-5);
	/* L's eigenvalues change order by step 3: the refresh must reorder the
	 * basis and the second moment with it (without, step 4 differs) */
	gradient = grad_swap;
	check_reference(&cfg, soap_swap_reference, 8, 1e-5);
	gradient = grad_of;
}

/* The numbers of the comment below, worked by hand: lr 0.01, betas
 * (0.9, 0.95), wd 0.1, w = 1, g = 0.5 then -0.25.
 *   step 1: m = 0.05, v = 0.0125, bc1 = 0.1, bc2 = 0.05 -> u = -0.01 * 0.5 /
 *           (0.5 + 1e-8) = -0.0099999998; w = 1 * (1 - 0.001) + u = 0.9890000002
 *   step 2: m = 0.045 - 0.025 = 0.02, v = 0.011875 + 0.003125 = 0.015,
 *           bc1 = 0.19, bc2 = 0.0975 -> u = -0.01 * 0.1052632 / 0.3922323
 *           = -0.0026836944; w = 0.989 * 0.999 + u = 0.9853273058 */
TEST(adamw_hand_values)
{
	struct config cfg;
	struct fixture fx;
	struct optimizer o;
	float *w, *g, hw[9], hg[9] = { 0 };

	NEED_BACKEND();
	fx_small(&fx);
	test_config(&cfg, "adamw");
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
	hw[0] = 1.0f;
	w = be_floats(hw, 9);
	g = be_floats(NULL, 9);
	hg[0] = 0.5f;
	be->copy(g, hg, sizeof(hg));
	optim_step(&o, w, g, 0.01f, 1);
	be->copy(hw, w, sizeof(hw));
	CHECK_NEAR(hw[0], 0.9890000002, 1e-7);
	hg[0] = -0.25f;
	be->copy(g, hg, sizeof(hg));
	optim_step(&o, w, g, 0.01f, 2);
	be->copy(hw, w, sizeof(hw));
	CHECK_NEAR(hw[0], 0.9853273058, 2e-7);
	be->free(w);
	be->free(g);
	optim_free(&o);
}

/* Lion by hand (lr 0.01, betas 0.9/0.95, wd 0.1, w = 1, g = 0.5, -0.25):
 *   step 1: c = 0.05 > 0, u = -0.01, w = 0.999 - 0.01 = 0.989, m = 0.025
 *   step 2: c = 0.0225 - 0.025 = -0.0025 < 0, u = +0.01,
 *           w = 0.989 * 0.999 + 0.01 = 0.998011 */
TEST(lion_matches_reference)
{
	struct config cfg;
	struct fixture fx;
	struct ref r[16];
	float w[16];
	int wdi, t;
	size_t i;

	NEED_BACKEND();
	fx_small(&fx);
	for (wdi = 0; wdi < 2; wdi++) {
		float wd = wdi ? 0.1f : 0.0f;

		test_config(&cfg, "lion");
		cfg.optim_weight_decay = wd;
		for (i = 0; i < fx.numel; i++) {
			r[i].m = r[i].v = 0;
			r[i].w = 1.0f - 0.1f * (float)i;
		}
		for (t = 1; t <= 3; t++) {
			CHECK(run_steps(&cfg, &fx, t, 0.01f, w) == 0);
			for (i = 0; i < fx.numel; i++) {
				ref_lion(&r[i], grad_of(t, i), 0.01f, i < 6 ? wd : 0.0f);
				CHECK_MSG(close_rel(w[i], r[i].w, 1e-6),
					  "wd %g step %d elem %zu: %.9g vs %.9g", wd, t, i, w[i],
					  r[i].w);
			}
		}
	}
	{
		struct optimizer o;
		float *wb, *gb, hw[9] = { 1.0f }, hg[9] = { 0.5f };

		test_config(&cfg, "lion");
		CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		wb = be_floats(hw, 9);
		gb = be_floats(hg, 9);
		optim_step(&o, wb, gb, 0.01f, 1);
		be->copy(hw, wb, sizeof(hw));
		CHECK_NEAR(hw[0], 0.989, 1e-7);
		hg[0] = -0.25f;
		be->copy(gb, hg, sizeof(hg));
		optim_step(&o, wb, gb, 0.01f, 2);
		be->copy(hw, wb, sizeof(hw));
		CHECK_NEAR(hw[0], 0.998011, 1e-7);
		be->free(wb);
		be->free(gb);
		optim_free(&o);
	}
}

/* SGD by hand (lr 0.01, mu 0.9, Nesterov, no decay, w = 1, g = 0.5, -0.25):
 *   step 1: m = 0.5, out = 0.5 + 0.45 = 0.95, w = 1 - 0.0095 = 0.9905
 *   step 2: m = 0.45 - 0.25 = 0.2, out = -0.25 + 0.18 = -0.07,
 *           w = 0.9905 + 0.0007 = 0.9912 */
TEST(sgd_matches_reference)
{
	struct config cfg;
	struct fixture fx;
	struct ref r[16];
	float w[16];
	int variant, t;
	size_t i;

	NEED_BACKEND();
	fx_small(&fx);
	for (variant = 0; variant < 4; variant++) {
		float wd = variant & 1 ? 0.1f : 0.0f;
		int nesterov = variant >> 1;

		test_config(&cfg, "sgd");
		cfg.optim_weight_decay = wd;
		cfg.optim_nesterov = nesterov;
		for (i = 0; i < fx.numel; i++) {
			r[i].m = r[i].v = 0;
			r[i].w = 1.0f - 0.1f * (float)i;
		}
		for (t = 1; t <= 3; t++) {
			CHECK(run_steps(&cfg, &fx, t, 0.01f, w) == 0);
			for (i = 0; i < fx.numel; i++) {
				float out = ref_momentum(&r[i], grad_of(t, i), 0.9f, nesterov);
				float d = i < 6 ? wd : 0.0f;

				r[i].w = r[i].w * (1 - 0.01f * d) + -0.01f * out;
				CHECK_MSG(close_rel(w[i], r[i].w, 1e-6),
					  "variant %d step %d elem %zu: %.9g vs %.9g", variant, t,
					  i, w[i], r[i].w);
			}
		}
	}
	{
		struct optimizer o;
		float *wb, *gb, hw[9] = { 0 }, hg[9] = { 0 };

		test_config(&cfg, "sgd");
		cfg.optim_weight_decay = 0;
		fx_small(&fx);
		/* the vector (no decay anyway): element 6 */
		hw[6] = 1.0f;
		hg[6] = 0.5f;
		CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		wb = be_floats(hw, 9);
		gb = be_floats(hg, 9);
		optim_step(&o, wb, gb, 0.01f, 1);
		be->copy(hw, wb, sizeof(hw));
		CHECK_NEAR(hw[6], 0.9905, 1e-7);
		hg[6] = -0.25f;
		be->copy(gb, hg, sizeof(hg));
		optim_step(&o, wb, gb, 0.01f, 2);
		be->copy(hw, wb, sizeof(hw));
		CHECK_NEAR(hw[6], 0.9912, 1e-7);
		be->free(wb);
		be->free(gb);
		optim_free(&o);
	}
}

/* Muon: the matrix follows Nesterov momentum -> Newton-Schulz -> -lr*scale
 * (Newton-Schulz itself is the kernel's, tested with the kernels); the
 * vector follows AdamW exactly. */
TEST(muon_routes_matrices_and_others)
{
	struct config cfg;
	struct fixture fx;
	struct ref r[16];
	float w[16], nsin[6], nsout[6];
	float *bin, *bout, *bscr;
	int sc, t;
	size_t i;

	NEED_BACKEND();
	fx_small(&fx);
	bin = be_floats(NULL, 6);
	bout = be_floats(NULL, 6);
	bscr = be_floats(NULL, newton_schulz_scratch(2, 3));
	for (sc = 0; sc < 2; sc++) {
		/* 2x3: rms scale 0.2*sqrt(3); shape scale sqrt(max(1, 2/3)) = 1 */
		float scale = sc ? 1.0f : 0.2f * sqrtf(3.0f);

		test_config(&cfg, "muon");
		cfg.optim_muon_scale = (char *)(sc ? "shape" : "rms");
		for (i = 0; i < fx.numel; i++) {
			r[i].m = r[i].v = 0;
			r[i].w = 1.0f - 0.1f * (float)i;
		}
		for (t = 1; t <= 3; t++) {
			CHECK(run_steps(&cfg, &fx, t, 0.01f, w) == 0);
			for (i = 0; i < 6; i++)
				nsin[i] = ref_momentum(&r[i], grad_of(t, i), 0.9f, 1);
			be->copy(bin, nsin, sizeof(nsin));
			be->newton_schulz(bout, bin, 2, 3, 5, bscr);
			be->copy(nsout, bout, sizeof(nsout));
			for (i = 0; i < 6; i++) {
				r[i].w = r[i].w * (1 - 0.01f * 0.1f) + -0.01f * scale * nsout[i];
				CHECK_MSG(close_rel(w[i], r[i].w, 2e-6),
					  "scale %s step %d elem %zu: %.9g vs %.9g",
					  cfg.optim_muon_scale, t, i, w[i], r[i].w);
			}
			for (i = 6; i < 9; i++) {
				ref_adamw(&r[i], grad_of(t, i), 0.01f, t, 0.0f);
				CHECK_MSG(close_rel(w[i], r[i].w, 2e-6),
					  "step %d elem %zu: %.9g vs %.9g", t, i, w[i], r[i].w);
			}
		}
	}
	be->free(bin);
	be->free(bout);
	be->free(bscr);

	/* the vector's update is AdamW's, bit for bit */
	{
		float wa[16], wm[16];

		test_config(&cfg, "adamw");
		CHECK(run_steps(&cfg, &fx, 3, 0.01f, wa) == 0);
		test_config(&cfg, "muon");
		CHECK(run_steps(&cfg, &fx, 3, 0.01f, wm) == 0);
		CHECK(!memcmp(wa + 6, wm + 6, 3 * sizeof(float)));
		CHECK(memcmp(wa, wm, 6 * sizeof(float)) != 0);
	}
}

/* Newton-Schulz leaves singular values near 1, so an orthogonalised
 * rows x cols matrix O has ||O||_F^2 ~ min(rows, cols) and
 * RMS(O) ~ sqrt(min/(rows*cols)) = 1/sqrt(max(rows, cols)). Hence
 *   rms scale:   RMS(u) ~ lr * 0.2*sqrt(max) / sqrt(max) = 0.2*lr, any shape;
 *   shape scale: RMS(u) ~ lr * sqrt(max(1, rows/cols)) / sqrt(max(rows, cols)).
 * The quintic iteration only brings singular values into about [0.7, 1.2],
 * so the check allows that band. */
TEST(muon_update_rms)
{
	static const int shapes[][2] = { { 16, 64 }, { 64, 16 }, { 24, 40 } };
	struct config cfg;
	size_t s;
	int sc;

	NEED_BACKEND();
	for (sc = 0; sc < 2; sc++) {
		for (s = 0; s < ARRAY_SIZE(shapes); s++) {
			int rows = shapes[s][0], cols = shapes[s][1];
			struct fixture fx;
			struct optimizer o;
			float *w, *g, *hw;
			uint64_t rng = 42 + s;
			double ss = 0, rms, want, lr = 0.02;
			size_t i, n = (size_t)rows * cols;

			memset(&fx, 0, sizeof(fx));
			fx_add(&fx, "h.0.fcw", rows, cols, GROUP_MATRIX, 1);
			test_config(&cfg, "muon");
			cfg.optim_weight_decay = 0;
			cfg.optim_muon_scale = (char *)(sc ? "shape" : "rms");
			CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, 1, n) == 0);
			hw = falloc(n);
			for (i = 0; i < n; i++)
				hw[i] = rng_normal(&rng);
			g = be_floats(hw, n);
			w = be_floats(NULL, n);
			optim_step(&o, w, g, (float)lr, 1);
			be->copy(hw, w, n * sizeof(float));
			for (i = 0; i < n; i++)
				ss += (double)hw[i] * hw[i];
			rms = sqrt(ss / (double)n);
			want = sc ? lr * sqrt(fmax(1.0, (double)rows / cols)) / sqrt(fmax(rows, cols)) :
				    0.2 * lr;
			CHECK_MSG(rms > 0.7 * want && rms < 1.2 * want,
				  "%dx%d %s: update rms %g, expected about %g", rows, cols,
				  cfg.optim_muon_scale, rms, want);
			be->free(w);
			be->free(g);
			free(hw);
			optim_free(&o);
		}
	}
}

/* ---- mixture of experts ---- */

/* Two steps (wd 0, lr 0.02) of optimizer cfg on rows x cols weights
 * starting at zero, with gradients g then g2; the weights into u. Two, so
 * that SOAP (whose step 1 only builds its bases) moves too. */
static int matrix_steps(const struct config *cfg, int rows, int cols, const float *g,
			const float *g2, float *u)
{
	struct fixture fx;
	struct optimizer o;
	size_t n = (size_t)rows * cols;
	memset(&fx, 0, sizeof(fx));
	fx_add(&fx, "h.0.fcw", rows, cols, GROUP_MATRIX, 1);
	if (optim_init(&o, be, cfg, &fx.m, fx.sp, 1, n))
		return -1;
	float *w = be_floats(NULL, n), *bg = be_floats(g, n);
	optim_step(&o, w, bg, 0.02f, 1);
	be->copy(bg, g2, n * sizeof(float));
	optim_step(&o, w, bg, 0.02f, 2);
	be->copy(u, w, n * sizeof(float));
	be->free(w);
	be->free(bg);
	optim_free(&o);
	return 0;
}

/* A small llama MoE (L layers of E experts of width 12, top-2, a shared
 * expert) in m, and the table of every parameter as one stage's; NULL
 * after a test failure. */
static struct stage_param *moe_table(struct model *m, int L, int E)
{
	struct model_config mc = {.arch = ARCH_LLAMA, .V = 64, .L = L, .C = 16, .NH = 2, .T = 8,
				  .E = E, .K = 2, .De = 12, .shared = 1};
	if (model_init(m, &mc)) {
		test_fail(__FILE__, __LINE__, "model_init: %s", last_error());
		return NULL;
	}
	struct stage_param *sp = xcalloc((size_t)m->n_params, sizeof(*sp));
	for (int i = 0; i < m->n_params; i++) {
		sp[i].global = i;
		sp[i].offset = m->params[i].offset;
	}
	return sp;
}

/* The optimizer rule for experts (optim.h): an MoE layer's E experts'
 * fcw are one [E, 2De, C] block of the arena, but E tensors of the table,
 * so a matrix optimizer treats each expert's [2De, C] matrix on its own:
 * Muon orthogonalises and scales each (never the one tall [E*2De, C]
 * matrix), NorMuon normalises its rows, MARS clips its norm, SOAP keeps
 * its factors; the router takes AdamW. Checked on a real MoE model's
 * table: two steps on the whole stage equal, expert by expert and bit for
 * bit, two steps on that expert's matrix alone, and differ from two steps
 * on the stack. */
TEST(matrix_optimizers_take_each_expert_on_its_own)
{
	static const char *const names[] = {"muon", "normuon", "mars", "soap"};
	struct model m;
	NEED_BACKEND();
	struct stage_param *sp = moe_table(&m, 1, 3);
	if (!sp)
		return;
	float *hg = falloc(m.numel), *hg2 = falloc(m.numel), *u = falloc(m.numel);
	uint64_t rng = 3;
	for (size_t i = 0; i < m.numel; i++) {
		hg[i] = rng_normal(&rng);
		hg2[i] = rng_normal(&rng);
	}
	int rows = 2 * m.cfg.De, cols = m.cfg.C;
	size_t n = (size_t)rows * cols;
	const struct param_info *e0 = &m.params[model_find_param(&m, "h.0.experts.0.fcw")];
	float *one = falloc(n), *stack = falloc(3 * n);
	for (size_t k = 0; k < ARRAY_SIZE(names) && !test_failed(); k++) {
		struct config cfg;
		struct optimizer o;
		test_config(&cfg, names[k]);
		cfg.optim_weight_decay = 0;
		cfg.optim_muon_scale = (char *)"shape"; /* the stack would scale by sqrt(3) more */
		CHECK(optim_init(&o, be, &cfg, &m, sp, m.n_params, m.numel) == 0);
		for (int t = 0; t < o.n; t++) {
			const char *name = o.t[t].info.name;
			int matrix = strstr(name, "experts.") || strstr(name, "shared.") ||
				     strstr(name, "qkvw") || strstr(name, "attprojw");
			CHECK_MSG(matrix == (o.t[t].rule != RULE_ADAMW), "%s: %s follows %s", names[k],
				  name, optim_rule_name(o.t[t].rule));
		}
		float *w = be_floats(NULL, m.numel), *g = be_floats(hg, m.numel);
		optim_step(&o, w, g, 0.02f, 1);
		be->copy(g, hg2, m.numel * sizeof(float));
		optim_step(&o, w, g, 0.02f, 2);
		be->copy(u, w, m.numel * sizeof(float));
		be->free(w);
		be->free(g);
		optim_free(&o);
		/* expert by expert: the same bits as the matrix alone */
		for (int e = 0; e < 3; e++) {
			char name[48];
			snprintf(name, sizeof(name), "h.0.experts.%d.fcw", e);
			const struct param_info *p = &m.params[model_find_param(&m, name)];
			CHECK(p->offset == e0->offset + e * n); /* one [E, 2De, C] block */
			CHECK(matrix_steps(&cfg, rows, cols, hg + p->offset, hg2 + p->offset, one) == 0);
			CHECK_MSG(!memcmp(one, u + p->offset, n * sizeof(float)),
				  "%s: expert %d's update is not that of its matrix alone", names[k], e);
		}
		/* and not the update of the stack as one tall matrix */
		CHECK(matrix_steps(&cfg, 3 * rows, cols, hg + e0->offset, hg2 + e0->offset,
				   stack) == 0);
		double diff = 0, norm = 0;
		for (size_t i = 0; i < 3 * n; i++) {
			double d = (double)stack[i] - u[e0->offset + i];
			diff += d * d;
			norm += (double)u[e0->offset + i] * u[e0->offset + i];
		}
		/* MARS's clip is the only matrix-wide step in its update, and
		 * AdamW's normalisation undoes most of it: a smaller gap */
		double gap = strcmp(names[k], "mars") ? 1e-2 : 1e-4;
		CHECK_MSG(norm > 0 && diff > gap * gap * norm,
			  "%s: the stacked update is within %g of the per-expert one", names[k],
			  sqrt(diff / norm));
	}
	free(one);
	free(stack);
	free(hg);
	free(hg2);
	free(u);
	free(sp);
	model_free(&m);
}

/* optim_init_owned (expert parallelism: a replica keeps only its own
 * experts): the tensors it keeps get optim_init's bits, step after step
 * (Newton-Schulz batches and elementwise batches hold fewer tensors), the
 * others no state and no update; the buffers are listed alike. */
TEST(owned_tensors_keep_their_bits)
{
	static const char *const names[] = {"adamw", "muon", "normuon", "soap", "lion",
					    "adan", "mars", "ademamix"};
	struct model m;
	NEED_BACKEND();
	struct stage_param *sp = moe_table(&m, 2, 4);
	if (!sp)
		return;
	unsigned char *mine = xcalloc((size_t)m.n_params, 1);
	size_t skipped = 0;
	for (int i = 0; i < m.n_params; i++) {
		mine[i] = model_param_expert(&m, &m.params[i]) < 2; /* member 0 of P = 2 */
		skipped += mine[i] ? 0 : m.params[i].numel;
	}
	CHECK(skipped == 2 * 2 * 3 * (size_t)m.cfg.De * m.cfg.C); /* 2 layers x experts 2, 3 */
	float *h0 = falloc(m.numel), *hg = falloc(m.numel), *a = falloc(m.numel),
	      *b = falloc(m.numel);
	uint64_t rng = 5;
	for (size_t i = 0; i < m.numel; i++) {
		h0[i] = 0.1f * rng_normal(&rng);
		hg[i] = rng_normal(&rng);
	}
	for (size_t k = 0; k < ARRAY_SIZE(names) && !test_failed(); k++) {
		struct config cfg;
		struct optimizer full, own;
		test_config(&cfg, names[k]);
		cfg.optim_correction = (char *)"ef";
		cfg.optim_ef_lambda = 0.5;
		cfg.optim_soap_every = 2;
		CHECK(optim_init(&full, be, &cfg, &m, sp, m.n_params, m.numel) == 0);
		CHECK(optim_init_owned(&own, be, &cfg, &m, sp, m.n_params, m.numel, mine) == 0);
		size_t sf = 0, so = 0, per = 0;
		CHECK(optim_state_count(&full) == optim_state_count(&own));
		for (int i = 0; i < optim_state_count(&full) && !test_failed(); i++) {
			CHECK(!strcmp(optim_state(&full, i).name, optim_state(&own, i).name));
			sf += optim_state(&full, i).numel;
			so += optim_state(&own, i).numel;
			for (int t = 0; t < full.n; t++) {
				struct optim_part part;
				if (!mine[t] && optim_state_tensor(&full, i, t, &part))
					per += part.numel;
				CHECK(mine[t] || !optim_state_tensor(&own, i, t, NULL));
			}
		}
		CHECK_MSG(so == sf - per && per > 0, "%s: %zu state floats of %zu, %zu skipped",
			  names[k], so, sf, per);
		float *wf = be_floats(h0, m.numel), *wo = be_floats(h0, m.numel);
		float *g = be_floats(NULL, m.numel);
		for (long step = 1; step <= 3; step++) {
			be->copy(g, hg, m.numel * sizeof(float));
			optim_step(&full, wf, g, 0.02f, step);
			be->copy(g, hg, m.numel * sizeof(float));
			optim_step(&own, wo, g, 0.02f, step);
			for (size_t i = 0; i < m.numel; i++)
				hg[i] = 0.5f * hg[i] + rng_normal(&rng);
		}
		be->copy(a, wf, m.numel * sizeof(float));
		be->copy(b, wo, m.numel * sizeof(float));
		for (int t = 0; t < m.n_params; t++) {
			const struct param_info *p = &m.params[t];
			const float *want = mine[t] ? a : h0;
			size_t bytes = p->numel * sizeof(float);
			CHECK_MSG(!memcmp(b + p->offset, want + p->offset, bytes),
				  "%s: %s is not %s", names[k], p->name, mine[t] ? "optim_init's update" : "left as it was");
		}
		be->free(wf);
		be->free(wo);
		be->free(g);
		optim_free(&full);
		optim_free(&own);
	}
	free(h0);
	free(hg);
	free(a);
	free(b);
	free(mine);
	free(sp);
	model_free(&m);
}

/* ---- error feedback ---- */

TEST(ef_lambda0_is_none)
{
	static const char *names[] = { "adamw", "muon", "lion", "sgd" };
	struct config cfg;
	struct fixture fx;
	float a[16], b[16];
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < ARRAY_SIZE(names); k++) {
		test_config(&cfg, names[k]);
		CHECK(run_steps(&cfg, &fx, 5, 0.01f, a) == 0);
		cfg.optim_correction = (char *)"ef";
		cfg.optim_ef_lambda = 0.0;
		CHECK(run_steps(&cfg, &fx, 5, 0.01f, b) == 0);
		CHECK_MSG(!memcmp(a, b, fx.numel * sizeof(float)), "%s: lambda 0 differs from none",
			  names[k]);
		/* and lambda != 0 does change something (the test can fail) */
		cfg.optim_ef_lambda = 1.0;
		CHECK(run_steps(&cfg, &fx, 5, 0.01f, b) == 0);
		CHECK_MSG(memcmp(a, b, fx.numel * sizeof(float)) != 0, "%s: ef had no effect",
			  names[k]);
	}
}

/* Run optimizer cfg with ef (lambda, groups) next to a probe optimizer with
 * no correction whose weights are reset to 0 before every step: with w = 0,
 * w*(1-d) + u = u exactly, so the probe hands out the very u[t] the ef
 * optimizer computes (same gradients, same state). The ef weights must
 * follow w[t+1] = w[t]*(1 - lr*wd*decay) + u[t] + lambda*(u[t] - u[t-1]),
 * with u[-1] = u[0], on the selected tensors and w*(1-d) + u elsewhere,
 * exactly: the reference evaluates backend.h's expression in C's order
 * (and -std=c11 does not contract it into FMAs). */
static int ef_follows_reference(const char *name, const char *groups, float lambda,
				const struct fixture *fx, char *why, size_t why_len)
{
	struct config cfg;
	struct optimizer oe, op;
	float *we, *wp, *g, *hw = falloc(fx->numel), *hu = falloc(fx->numel);
	float *hprev = falloc(fx->numel), *ref = falloc(fx->numel), *hg = falloc(fx->numel);
	float lr = 0.01f;
	int t, k, bad = 0;
	size_t i;

	test_config(&cfg, name);
	cfg.optim_correction = (char *)"ef";
	cfg.optim_ef_lambda = lambda;
	cfg.optim_ef_groups = (char *)groups;
	if (optim_init(&oe, be, &cfg, &fx->m, fx->sp, fx->m.n_params, fx->numel))
		return snprintf(why, why_len, "init failed"), -1;
	cfg.optim_correction = (char *)"none";
	if (optim_init(&op, be, &cfg, &fx->m, fx->sp, fx->m.n_params, fx->numel))
		return snprintf(why, why_len, "init failed"), -1;
	init_weights(ref, fx->numel);
	we = be_floats(ref, fx->numel);
	wp = be_floats(NULL, fx->numel);
	g = be_floats(NULL, fx->numel);
	for (t = 1; t <= 6 && !bad; t++) {
		for (i = 0; i < fx->numel; i++)
			hg[i] = grad_of(t, i);
		be->copy(g, hg, fx->numel * sizeof(float));
		memset(hu, 0, fx->numel * sizeof(float));
		be->copy(wp, hu, fx->numel * sizeof(float));
		optim_step(&op, wp, g, lr, t);
		optim_step(&oe, we, g, lr, t);
		be->copy(hu, wp, fx->numel * sizeof(float));
		be->copy(hw, we, fx->numel * sizeof(float));
		for (k = 0; k < fx->m.n_params; k++) {
			const struct param_info *pi = &fx->info[k];
			int sel = !strcmp(groups, "all") ||
				  (!strcmp(groups, "muon") && pi->group == GROUP_MATRIX) ||
				  (!strcmp(groups, "adamw") && pi->group != GROUP_MATRIX);
			float d = pi->decay ? lr * 0.1f : 0.0f;

			for (i = pi->offset; i < pi->offset + pi->numel; i++) {
				float u = hu[i], up = t == 1 ? u : hprev[i];

				/* backend.h's expression, evaluated as C evaluates it */
				if (sel)
					ref[i] = ref[i] * (1 - d) + u + lambda * (u - up);
				else
					ref[i] = ref[i] * (1 - d) + u;
				hprev[i] = u;
				if (ref[i] != hw[i]) {
					snprintf(why, why_len,
						 "%s groups %s lambda %g step %d elem %zu: %.9g vs %.9g",
						 name, groups, lambda, t, i, hw[i], ref[i]);
					bad = 1;
					break;
				}
			}
		}
	}
	be->free(we);
	be->free(wp);
	be->free(g);
	optim_free(&oe);
	optim_free(&op);
	free(hw);
	free(hu);
	free(hprev);
	free(ref);
	free(hg);
	return bad ? -1 : 0;
}

TEST(ef_lambda1_follows_formula)
{
	static const char *names[] = { "adamw", "muon", "lion", "sgd" };
	struct fixture fx;
	char why[256];
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < ARRAY_SIZE(names); k++)
		CHECK_MSG(ef_follows_reference(names[k], "all", 1.0f, &fx, why, sizeof(why)) == 0,
			  "%s", why);
	CHECK_MSG(ef_follows_reference("adamw", "all", 0.5f, &fx, why, sizeof(why)) == 0, "%s",
		  why);
}

TEST(ef_groups_select_tensors)
{
	static const char *groups[] = { "all", "muon", "adamw" };
	struct fixture fx;
	struct config cfg;
	char why[256];
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < ARRAY_SIZE(groups); k++) {
		CHECK_MSG(ef_follows_reference("muon", groups[k], 1.0f, &fx, why, sizeof(why)) == 0,
			  "%s", why);
		CHECK_MSG(ef_follows_reference("adamw", groups[k], 1.0f, &fx, why, sizeof(why)) == 0,
			  "%s", why);
	}
	/* and directly: only the selected group's weights move off the none run */
	for (k = 1; k < ARRAY_SIZE(groups); k++) {
		float a[16], b[16];
		int matrix_same, vector_same;

		test_config(&cfg, "muon");
		CHECK(run_steps(&cfg, &fx, 4, 0.01f, a) == 0);
		cfg.optim_correction = (char *)"ef";
		cfg.optim_ef_groups = (char *)groups[k];
		CHECK(run_steps(&cfg, &fx, 4, 0.01f, b) == 0);
		matrix_same = !memcmp(a, b, 6 * sizeof(float));
		vector_same = !memcmp(a + 6, b + 6, 3 * sizeof(float));
		if (k == 1)
			CHECK(!matrix_same && vector_same);
		else
			CHECK(matrix_same && !vector_same);
	}
}

/* ---- state listing ---- */

TEST(state_lists_every_buffer)
{
	static const struct {
		const char *name;
		const char *bufs[10];
	} want[] = {
		{ "adamw", { "adam_m", "adam_v", "ef_prev_update" } },
		{ "muon", { "adam_m", "adam_v", "muon_momentum", "ef_prev_update" } },
		{ "lion", { "lion_m", "ef_prev_update" } },
		{ "sgd", { "sgd_momentum", "ef_prev_update" } },
		{ "adan", { "adan_m", "adan_v", "adan_n", "adan_prev_grad", "ef_prev_update" } },
		{ "mars", { "adam_m", "adam_v", "mars_m", "mars_v", "mars_prev_grad",
			    "ef_prev_update" } },
		{ "ademamix", { "ademamix_m1", "ademamix_m2", "ademamix_nu", "ef_prev_update" } },
		{ "normuon", { "adam_m", "adam_v", "normuon_momentum", "normuon_v",
			       "ef_prev_update" } },
		{ "soap", { "adam_m", "adam_v", "soap_m", "soap_v", "soap_l", "soap_r", "soap_ql",
			    "soap_qr", "ef_prev_update" } },
	};
	struct fixture fx;
	struct config cfg;
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < ARRAY_SIZE(want); k++) {
		struct optimizer o;
		int n = 0, i, j, t;

		while (n < 10 && want[k].bufs[n])
			n++;
		test_config(&cfg, want[k].name);
		cfg.optim_correction = (char *)"ef";
		CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		CHECK_MSG(optim_state_count(&o) == n, "%s: %d buffers, want %d", want[k].name,
			  optim_state_count(&o), n);
		for (i = 0; i < n; i++) {
			struct optim_state_buf sb = optim_state(&o, i);
			size_t covered = 0, end = 0;

			CHECK(sb.name && sb.data && sb.numel > 0);
			for (j = 0; j < i; j++)
				CHECK(strcmp(optim_state(&o, j).name, sb.name) != 0);
			for (j = 0; j < n; j++)
				if (!strcmp(want[k].bufs[j], sb.name))
					break;
			CHECK_MSG(j < n, "%s: unexpected buffer %s", want[k].name, sb.name);
			/* the tensors a buffer holds tile it exactly, in order */
			for (t = 0; t < o.n; t++) {
				struct optim_part part;

				if (!optim_state_tensor(&o, i, t, &part))
					continue;
				CHECK(part.off == end);
				CHECK(part.numel == (size_t)part.rows * (part.cols ? part.cols : 1));
				end += part.numel;
				covered += part.numel;
			}
			CHECK_MSG(covered == sb.numel, "%s %s: tensors cover %zu of %zu",
				  want[k].name, sb.name, covered, sb.numel);
		}
		/* every tensor has direction state somewhere */
		for (t = 0; t < o.n; t++) {
			int held = 0;

			for (i = 0; i < n; i++)
				if (strcmp(optim_state(&o, i).name, "ef_prev_update"))
					held += optim_state_tensor(&o, i, t, NULL);
			CHECK(held >= 1);
		}
		CHECK(optim_state(&o, n).data == NULL);
		optim_free(&o);
	}
	/* no correction: no ef buffer */
	{
		struct optimizer o;
		int i;

		test_config(&cfg, "adamw");
		CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		CHECK(optim_state_count(&o) == 2);
		for (i = 0; i < 2; i++)
			CHECK(strcmp(optim_state(&o, i).name, "ef_prev_update"));
		optim_free(&o);
	}
}

/* State restored into a fresh optimizer continues exactly (the resume
 * property the checkpoint code relies on). */
TEST(state_restore_continues_exactly)
{
	static const char *names[] = { "adamw", "muon", "lion", "sgd" };
	struct fixture fx;
	struct config cfg;
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < ARRAY_SIZE(names); k++) {
		struct optimizer a, b;
		float *w, *g, hw[16], hg[16], full[16];
		int t, i;
		size_t j;

		test_config(&cfg, names[k]);
		cfg.optim_correction = (char *)"ef";
		CHECK(run_steps(&cfg, &fx, 5, 0.01f, full) == 0);
		CHECK(optim_init(&a, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		CHECK(optim_init(&b, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		init_weights(hw, fx.numel);
		w = be_floats(hw, fx.numel);
		g = be_floats(NULL, fx.numel);
		for (t = 1; t <= 5; t++) {
			struct optimizer *o = t <= 3 ? &a : &b;

			if (t == 4)
				for (i = 0; i < optim_state_count(&a); i++) {
					struct optim_state_buf sa = optim_state(&a, i);
					struct optim_state_buf sb = optim_state(&b, i);

					CHECK(!strcmp(sa.name, sb.name) && sa.numel == sb.numel);
					be->copy(sb.data, sa.data, sa.numel * sizeof(float));
				}
			for (j = 0; j < fx.numel; j++)
				hg[j] = grad_of(t, j);
			be->copy(g, hg, fx.numel * sizeof(float));
			optim_step(o, w, g, 0.01f, t);
		}
		be->copy(hw, w, fx.numel * sizeof(float));
		CHECK_MSG(!memcmp(hw, full, fx.numel * sizeof(float)), "%s: resumed run differs",
			  names[k]);
		be->free(w);
		be->free(g);
		optim_free(&a);
		optim_free(&b);
	}
}

/* ---- gradient norm ---- */

TEST(grad_sumsq_skips_tied_copy)
{
	struct fixture fx;
	struct config cfg;
	struct optimizer o;
	double per[3];
	float hg[16], *g;
	size_t i;

	NEED_BACKEND();
	memset(&fx, 0, sizeof(fx));
	fx_add(&fx, "h.0.fcw", 2, 2, GROUP_MATRIX, 1);
	fx_add(&fx, "lnfw", 2, 0, GROUP_OTHER, 0);
	fx_add(&fx, "wte", 3, 2, GROUP_OTHER, 1);
	fx.sp[2].tied_copy = 1;
	for (i = 0; i < fx.numel; i++)
		hg[i] = (float)i + 1.0f;
	test_config(&cfg, "adamw");
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, 3, fx.numel) == 0);
	g = be_floats(hg, fx.numel);
	optim_grad_sumsq(&o, g, per);
	CHECK_NEAR(per[0], 1 + 4 + 9 + 16, 0);
	CHECK_NEAR(per[1], 25 + 36, 0);
	CHECK_NEAR(per[2], 0, 0);
	be->free(g);
	optim_free(&o);
}

TEST(clip_scale)
{
	CHECK(optim_clip_scale(16.0, 1.0) == 0.25f);
	CHECK(optim_clip_scale(16.0, 4.0) == 1.0f);
	CHECK(optim_clip_scale(16.0, 5.0) == 1.0f);
	CHECK(optim_clip_scale(16.0, 0.0) == 1.0f);
	CHECK(optim_clip_scale(0.0, 1.0) == 1.0f);
}

/* ---- stages in threads: no shared mutable state ---- */

struct thread_job {
	const struct fixture *fx;
	const char *name;
	float w[16];
	int rc;
};

static void *thread_run(void *arg)
{
	struct thread_job *j = arg;
	struct config cfg;

	test_config(&cfg, j->name);
	cfg.optim_correction = (char *)"ef";
	j->rc = run_steps(&cfg, j->fx, 6, 0.01f, j->w);
	return NULL;
}

TEST(optimizers_in_threads_match_sequential)
{
	static const char *names[] = { "muon", "adamw", "lion", "sgd" };
	struct thread_job jobs[4];
	pthread_t th[4];
	struct fixture fx;
	size_t k;

	NEED_BACKEND();
	fx_small(&fx);
	for (k = 0; k < 4; k++) {
		memset(&jobs[k], 0, sizeof(jobs[k]));
		jobs[k].fx = &fx;
		jobs[k].name = names[k];
		CHECK(pthread_create(&th[k], NULL, thread_run, &jobs[k]) == 0);
	}
	for (k = 0; k < 4; k++)
		pthread_join(th[k], NULL);
	for (k = 0; k < 4; k++) {
		struct thread_job seq = jobs[k];

		CHECK(jobs[k].rc == 0);
		thread_run(&seq);
		CHECK(seq.rc == 0);
		CHECK_MSG(!memcmp(seq.w, jobs[k].w, fx.numel * sizeof(float)),
			  "%s: threaded run differs", names[k]);
	}
}

/* SOAP refreshes its two bases on two threads at once: the bits are the
 * one-thread run's (each LAPACK call runs on one thread either way) */
TEST(soap_refresh_bits_do_not_depend_on_threads)
{
	struct config cfg;
	struct fixture fx;
	float one[16], two[16];

	NEED_BACKEND();
	fx_small(&fx);
	test_config(&cfg, "soap");
	cfg.optim_soap_every = 2;
	gradient = grad_swap; /* the refreshes reorder */
	cpu_set_threads(1);
	int rc1 = run_steps(&cfg, &fx, 8, 0.01f, one);
	cpu_set_threads(2);
	int rc2 = run_steps(&cfg, &fx, 8, 0.01f, two);
	cpu_set_threads(0); /* the other tests' setting, before any CHECK returns */
	gradient = grad_of;
	CHECK(rc1 == 0 && rc2 == 0);
	CHECK(!memcmp(one, two, fx.numel * sizeof(float)));
}

/* ---- configuration errors ---- */

TEST(init_rejects_bad_config)
{
	struct fixture fx;
	struct config cfg;
	struct optimizer o;

	NEED_BACKEND();
	fx_small(&fx);
	set_error_quiet(1);
	test_config(&cfg, "adam");
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == -1);
	CHECK(strstr(last_error(), "optim.name"));
	test_config(&cfg, "adamw");
	cfg.optim_beta1 = 1.0;
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == -1);
	CHECK(strstr(last_error(), "optim.beta1"));
	test_config(&cfg, "muon");
	cfg.optim_ns_steps = 0;
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == -1);
	CHECK(strstr(last_error(), "optim.ns_steps"));
	test_config(&cfg, "adamw");
	CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel - 1) == -1);
	CHECK(strstr(last_error(), "h.0.ln1w"));
	set_error_quiet(0);
}

/* ---- learning-rate schedule ---- */

TEST(lr_schedule_values)
{
	struct config cfg;

	test_config(&cfg, "adamw");
	cfg.optim_lr = 1.0;
	cfg.optim_min_lr_ratio = 0.1;
	cfg.optim_warmup = 10;
	cfg.train_steps = 110;

	/* warmup: lr * step / W, the same for every kind */
	cfg.optim_decay = (char *)"cosine";
	CHECK_NEAR(lr_at(&cfg, 1), 0.1, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 5), 0.5, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 10), 1.0, 1e-12);
	/* cosine: p = (step - 10) / 100 */
	CHECK_NEAR(lr_at(&cfg, 60), 0.55, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 35), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
	CHECK_NEAR(lr_at(&cfg, 110), 0.1, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 500), 0.1, 1e-12);

	cfg.optim_decay = (char *)"linear";
	CHECK_NEAR(lr_at(&cfg, 5), 0.5, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 10), 1.0, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 35), 1.0 - 0.9 * 0.25, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 60), 0.55, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 110), 0.1, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 111), 0.1, 1e-12);

	cfg.optim_decay = (char *)"constant";
	CHECK_NEAR(lr_at(&cfg, 5), 0.5, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 60), 1.0, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 110), 1.0, 1e-12);

	/* wsd with frac 0.2: decay starts at D = 110 - 22 = 88 */
	cfg.optim_decay = (char *)"wsd";
	CHECK_NEAR(lr_at(&cfg, 5), 0.5, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 60), 1.0, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 88), 1.0, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 99), 0.55, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 110), 0.1, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 200), 0.1, 1e-12);

	/* no warmup: step 1 is already in the decay */
	cfg.optim_warmup = 0;
	cfg.optim_decay = (char *)"linear";
	cfg.train_steps = 101;
	CHECK_NEAR(lr_at(&cfg, 1), 1.0 - 0.9 / 101, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 101), 0.1, 1e-12);

	/* warmup longer than the run: min after it */
	cfg.optim_warmup = 200;
	cfg.optim_decay = (char *)"cosine";
	CHECK_NEAR(lr_at(&cfg, 100), 0.5, 1e-12);
	CHECK_NEAR(lr_at(&cfg, 201), 0.1, 1e-12);
}

/* SOAP's step 1 applies nothing, so its first real update (step 2) takes no
 * error-feedback correction: ef equals none through step 2 */
TEST(soap_first_update_has_no_correction)
{
	struct config cfg;
	struct fixture fx;
	float a[16], b[16];
	NEED_BACKEND();
	fx_small(&fx);
	test_config(&cfg, "soap");
	CHECK(run_steps(&cfg, &fx, 2, 0.01f, a) == 0);
	cfg.optim_correction = (char *)"ef";
	CHECK(run_steps(&cfg, &fx, 2, 0.01f, b) == 0);
	for (size_t i = 0; i < 6; i++) /* the matrix; the vector is AdamW's */
		CHECK_MSG(a[i] == b[i], "elem %zu: %.9g vs %.9g", i, a[i], b[i]);
}

/* A backend that records where in the optimizer's work buffer the
 * Newton-Schulz scratch and the SOAP GEMM operands start: every slice must
 * sit at a multiple of 64 floats from o->work, or the CUDA kernels stage it
 * through a copy (GEMM) or allocate scratch mid-step (Newton-Schulz). */
static const float *spy_work_lo, *spy_work_hi;
static int spy_slices, spy_misaligned;

static void spy_note(const float *p)
{
	if (p >= spy_work_lo && p < spy_work_hi) {
		spy_slices++;
		spy_misaligned += (p - spy_work_lo) % 64 != 0;
	}
}

static void spy_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
			      float *scratch)
{
	spy_note(scratch);
	be->newton_schulz(out, in, rows, cols, steps, scratch);
}

static void spy_gemm(float *c, const float *a, const float *b, int M, int N, int K, int ta,
		     int tb, float alpha, float beta)
{
	spy_note(c);
	spy_note(a);
	spy_note(b);
	be->gemm(c, a, b, M, N, K, ta, tb, alpha, beta);
}

TEST(work_slices_start_256_bytes_apart)
{
	static const char *const names[] = {"muon", "normuon", "soap"};
	struct backend spy = *be;
	NEED_BACKEND();
	spy.newton_schulz = spy_newton_schulz;
	spy.gemm = spy_gemm;
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct config cfg;
		struct fixture fx;
		struct optimizer o;
		memset(&fx, 0, sizeof(fx));
		fx_add(&fx, "h.0.qkvw", 3, 5, GROUP_MATRIX, 1); /* 15 floats: not a multiple of 64 */
		test_config(&cfg, names[k]);
		CHECK(optim_init(&o, &spy, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		float *w = be_floats(NULL, fx.numel), *g = be_floats(NULL, fx.numel);
		float hg[15];
		for (int i = 0; i < 15; i++)
			hg[i] = grad_of(1, (size_t)i);
		be->copy(g, hg, sizeof(hg));
		spy_work_lo = o.work;
		spy_work_hi = o.work + (k < 2 ? scratch_floats_aligned(15) + newton_schulz_scratch(3, 5)
					      : soap_work_floats(3, 5));
		spy_slices = spy_misaligned = 0;
		for (long t = 1; t <= 3; t++)
			optim_step(&o, w, g, 0.01f, t);
		CHECK_MSG(spy_slices > 0, "%s: no slice of the work buffer seen", names[k]);
		CHECK_MSG(spy_misaligned == 0, "%s: %d of %d slices off a 64-float boundary",
			  names[k], spy_misaligned, spy_slices);
		be->free(w);
		be->free(g);
		optim_free(&o);
	}
}

/* The bound a checkpoint gather checks a peer's state tensor against holds
 * every part of every optimizer, also SOAP's cols x cols factor of a wide
 * matrix, which is larger than the whole model. */
TEST(part_bound_covers_every_part)
{
	static const char *const names[] = {"adamw", "muon", "lion", "sgd", "adan",
					     "mars", "ademamix", "normuon", "soap"};
	struct fixture fx;
	memset(&fx, 0, sizeof(fx));
	fx_add(&fx, "h.0.mlp_proj", 2, 40, GROUP_MATRIX, 1); /* 80 floats, R is 1600 */
	fx_add(&fx, "h.0.ln1w", 40, 0, GROUP_OTHER, 0);
	size_t bound = optim_part_bound(&fx.m), most = 0;
	CHECK(bound >= 1600);
	for (size_t k = 0; k < ARRAY_SIZE(names); k++) {
		struct config cfg;
		struct optimizer o;
		test_config(&cfg, names[k]);
		cfg.optim_correction = (char *)"ef";
		CHECK(optim_init(&o, be, &cfg, &fx.m, fx.sp, fx.m.n_params, fx.numel) == 0);
		for (int i = 0; i < optim_state_count(&o); i++)
			for (int t = 0; t < fx.m.n_params; t++) {
				struct optim_part p;
				if (optim_state_tensor(&o, i, t, &p)) {
					CHECK_MSG(p.numel <= bound, "%s: a part of %zu > bound %zu",
						  names[k], p.numel, bound);
					most = MAX(most, p.numel);
				}
			}
		optim_free(&o);
	}
	CHECK_MSG(most > fx.numel, "no part larger than the model (%zu <= %zu): the case "
		  "the bound exists for is not exercised", most, fx.numel);
}

/* elementwise_step (AdamW and Lion tensors in one call, no u scratch) gives
 * the bits of the per-tensor adamw_dir/lion_dir + apply_update calls it
 * replaces: weights and every state buffer, over steps, with and without
 * error feedback (lambda 1 and 0), and for the AdamW tensors under Muon. */
static int steps_and_state(const struct backend *b, const struct config *cfg,
			   const struct fixture *fx, int steps, float *w_out, float *state_out,
			   size_t state_cap, size_t *state_n)
{
	struct optimizer o;
	float *hg = falloc(fx->numel);
	if (optim_init(&o, b, cfg, &fx->m, fx->sp, fx->m.n_params, fx->numel)) {
		free(hg);
		return -1;
	}
	init_weights(hg, fx->numel);
	float *w = be_floats(hg, fx->numel), *g = be_floats(NULL, fx->numel);
	for (int t = 1; t <= steps; t++) {
		for (size_t i = 0; i < fx->numel; i++)
			hg[i] = grad_of(t, i);
		be->copy(g, hg, fx->numel * sizeof(float));
		optim_step(&o, w, g, 0.01f, t);
	}
	be->copy(w_out, w, fx->numel * sizeof(float));
	*state_n = 0;
	for (int i = 0; i < optim_state_count(&o); i++) {
		struct optim_state_buf sb = optim_state(&o, i);
		if (*state_n + sb.numel <= state_cap)
			be->copy(state_out + *state_n, sb.data, sb.numel * sizeof(float));
		*state_n += sb.numel;
	}
	be->free(w);
	be->free(g);
	optim_free(&o);
	free(hg);
	return 0;
}

TEST(elementwise_step_matches_per_tensor_calls)
{
	static const struct {
		const char *name, *correction;
		float lambda;
	} cases[] = {{"adamw", "none", 0}, {"adamw", "ef", 1}, {"adamw", "ef", 0},
		     {"lion", "none", 0},  {"lion", "ef", 1},  {"muon", "ef", 1}};
	NEED_BACKEND();
	if (!be->elementwise_step)
		SKIP("backend lacks elementwise_step");
	struct backend plain = *be;
	plain.elementwise_step = NULL;
	struct fixture fx;
	memset(&fx, 0, sizeof(fx));
	fx_add(&fx, "h.0.qkvw", 24, 40, GROUP_MATRIX, 1);
	fx_add(&fx, "h.0.ln1w", 40, 0, GROUP_OTHER, 0);
	fx_add(&fx, "wte", 70, 40, GROUP_OTHER, 1);
	enum { CAP = 20000 };
	static float wa[4096], wb[4096], sa[CAP], sb[CAP];
	for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
		struct config cfg;
		size_t na = 0, nb = 0;
		test_config(&cfg, cases[k].name);
		cfg.optim_correction = (char *)cases[k].correction;
		cfg.optim_ef_lambda = cases[k].lambda;
		CHECK(steps_and_state(be, &cfg, &fx, 5, wa, sa, CAP, &na) == 0);
		CHECK(steps_and_state(&plain, &cfg, &fx, 5, wb, sb, CAP, &nb) == 0);
		CHECK(na == nb && na <= CAP);
		CHECK_MSG(memcmp(wa, wb, fx.numel * sizeof(float)) == 0, "%s/%s lambda %g: weights differ",
			  cases[k].name, cases[k].correction, cases[k].lambda);
		CHECK_MSG(memcmp(sa, sb, MIN(na, (size_t)CAP) * sizeof(float)) == 0,
			  "%s/%s lambda %g: state differs", cases[k].name, cases[k].correction,
			  cases[k].lambda);
	}
}

/* ---- Newton-Schulz in batches of one shape (optim.c ns_batches) ---- */

/* The backend's newton_schulz_many, or (the cpu has none) one matrix after
 * another through newton_schulz; records the largest batch and the calls. */
static int ns_calls, ns_most, ns_misaligned;
static void ns_many_loop(float *const *out, const float *const *in, int count, int rows, int cols,
			 int steps, float *scratch)
{
	ns_calls++;
	ns_most = MAX(ns_most, count);
	/* every slice where the CUDA batch wants it: 256-byte offsets from the
	 * start of the optimizer's buffer (in[0]; the cpu allocates 64-byte
	 * aligned, the GPU 256) */
	for (int k = 0; k < count; k++)
		ns_misaligned += (in[k] - in[0]) % 64 != 0 || (out[k] - in[0]) % 64 != 0;
	ns_misaligned += (scratch - in[0]) % 64 != 0;
	if (be->newton_schulz_many) {
		be->newton_schulz_many(out, in, count, rows, cols, steps, scratch);
		return;
	}
	for (int k = 0; k < count; k++)
		be->newton_schulz(out[k], in[k], rows, cols, steps, scratch);
}

TEST(newton_schulz_batches_match_per_tensor_calls)
{
	static const struct {
		const char *name, *correction;
		float lambda;
	} cases[] = {{"muon", "none", 1}, {"muon", "ef", 1}, {"muon", "ef", 0},
		     {"normuon", "none", 1}, {"normuon", "ef", 1}};
	NEED_BACKEND();
	struct backend batched = *be, plain = *be;
	batched.newton_schulz_many = ns_many_loop;
	plain.newton_schulz_many = NULL;
	/* three 24 x 40 matrices, two 40 x 24, one 16 x 40 alone, and AdamW's */
	struct fixture fx;
	memset(&fx, 0, sizeof(fx));
	fx_add(&fx, "h.0.qkvw", 24, 40, GROUP_MATRIX, 1);
	fx_add(&fx, "h.0.fcw", 40, 24, GROUP_MATRIX, 1);
	fx_add(&fx, "h.1.qkvw", 24, 40, GROUP_MATRIX, 1);
	fx_add(&fx, "h.0.ln1w", 40, 0, GROUP_OTHER, 0);
	fx_add(&fx, "h.1.fcw", 40, 24, GROUP_MATRIX, 1);
	fx_add(&fx, "h.2.qkvw", 24, 40, GROUP_MATRIX, 1);
	fx_add(&fx, "h.0.attprojw", 16, 40, GROUP_MATRIX, 1);
	fx_add(&fx, "wte", 70, 40, GROUP_OTHER, 1);
	enum { CAP = 40000 };
	static float wa[16384], wb[16384], sa[CAP], sb[CAP];
	CHECK(fx.numel <= ARRAY_SIZE(wa));
	/* all of a shape in one batch, then at most 2 (a batch of 2 and one
	 * of 1 for the three 24 x 40 matrices) */
	size_t limits[] = {0, 2 * scratch_floats_aligned(24 * 40)};
	for (size_t l = 0; l < ARRAY_SIZE(limits); l++)
		for (size_t k = 0; k < ARRAY_SIZE(cases); k++) {
			struct config cfg;
			size_t na = 0, nb = 0, prev = 0;
			test_config(&cfg, cases[k].name);
			cfg.optim_correction = (char *)cases[k].correction;
			cfg.optim_ef_lambda = cases[k].lambda;
			if (limits[l])
				prev = optim_ns_batch_limit(limits[l]);
			ns_calls = ns_most = ns_misaligned = 0;
			int rc = steps_and_state(&batched, &cfg, &fx, 5, wa, sa, CAP, &na);
			if (limits[l])
				optim_ns_batch_limit(prev);
			CHECK(rc == 0 && steps_and_state(&plain, &cfg, &fx, 5, wb, sb, CAP, &nb) == 0);
			CHECK(na == nb && na <= CAP);
			/* 5 steps: the 24 x 40 group (1 batch, or 2) and the 40 x 24 one */
			CHECK_MSG(ns_most == (limits[l] ? 2 : 3) && ns_calls == 5 * (limits[l] ? 3 : 2),
				  "%s: %d calls, the largest of %d matrices", cases[k].name, ns_calls,
				  ns_most);
			CHECK_MSG(!ns_misaligned, "%s: %d slices off 256-byte alignment",
				  cases[k].name, ns_misaligned);
			CHECK_MSG(memcmp(wa, wb, fx.numel * sizeof(float)) == 0,
				  "%s/%s, limit %zu: weights differ", cases[k].name,
				  cases[k].correction, limits[l]);
			CHECK_MSG(memcmp(sa, sb, MIN(na, (size_t)CAP) * sizeof(float)) == 0,
				  "%s/%s, limit %zu: state differs", cases[k].name,
				  cases[k].correction, limits[l]);
			if (test_failed())
				return;
		}
}
