/* test_cuda_model.c - the whole model on the CUDA backend against the CPU
 * backend: one micro-batch's loss and every parameter gradient, and a
 * 50-step training run's loss curve, for tiny gpt2 and llama (tied and
 * untied, grouped-query).
 *
 * Tolerances (the CUDA GEMMs take bf16 operands with fp32 accumulation; the
 * CPU backend is fp32 throughout):
 *   loss                     2e-3 relative
 *   each parameter gradient  3e-2 of the tensor's max |cpu gradient|
 *   50-step loss curve       every step within 2e-2 relative, and the
 *                            curve falls on both backends
 * Every test SKIPs without a usable device; tests/run --cuda counts a SKIP
 * as a failure.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../../sched/trainer.h"
#include "../test.h"

static const struct backend *cuda_or_skip_reason(char *why, size_t n)
{
	const struct backend *cu = backend_cuda();
	if (!cu) {
		snprintf(why, n, "this binary has no CUDA backend");
		return NULL;
	}
	return cuda_available(why, n) ? cu : NULL;
}

#define NEED_CUDA(cu)                                                           \
	char why_[256];                                                         \
	const struct backend *cu = cuda_or_skip_reason(why_, sizeof(why_));     \
	if (!cu)                                                                \
		SKIP(why_)

static struct model_config tiny(int arch, int tied)
{
	struct model_config c;
	memset(&c, 0, sizeof(c));
	c.arch = arch;
	c.V = 67;
	c.L = 2;
	c.C = 64;
	c.NH = 4;
	c.NKV = arch == ARCH_LLAMA ? 2 : 0;
	c.T = 32;
	c.tied = tied;
	c.eps = 1e-5f;
	c.rope_theta = 10000.0f;
	c.init_std = 0.02f;
	return c;
}

/* One stage holding the whole model on backend be: loss and gradients of one
 * micro-batch, gradients copied to host memory (grads_host[numel]). */
static int loss_and_grads(const struct backend *be, const struct model *m,
			  const float *params_host, const int32_t *tok_host,
			  const int32_t *tgt_host, int B, int T, float *loss,
			  float *grads_host)
{
	struct stage st;
	if (stage_init(&st, m, be, NULL, 0, B, T, 1))
		return -1;
	size_t pbytes = st.numel * sizeof(float), tbytes = (size_t)B * T * sizeof(int32_t);
	float *arena = xmalloc(pbytes);
	stage_gather(&st, arena, params_host);
	float *params = be->alloc(pbytes), *grads = be->alloc(pbytes);
	int32_t *tok = be->alloc(tbytes), *tgt = be->alloc(tbytes);
	be->to_device(params, arena, pbytes);
	be->to_device(tok, tok_host, tbytes);
	be->to_device(tgt, tgt_host, tbytes);
	stage_forward(&st, 0, params, tok, NULL, tgt, NULL, loss, NULL, grads, 1.0f);
	stage_backward(&st, 0, params, grads, NULL, NULL);
	stage_finish_grads(&st, grads);
	be->synchronize();
	be->to_host(arena, grads, pbytes);
	memset(grads_host, 0, m->numel * sizeof(float));
	stage_scatter(&st, grads_host, arena);
	be->free(params), be->free(grads), be->free(tok), be->free(tgt);
	free(arena);
	stage_free(&st);
	return 0;
}

static void compare_grads(int arch, int tied)
{
	NEED_CUDA(cu);
	struct model_config c = tiny(arch, tied);
	struct model m;
	int B = 4, T = c.T;
	CHECK(model_init(&m, &c) == 0);
	float *params = xmalloc(m.numel * sizeof(float));
	float *g_cpu = xmalloc(m.numel * sizeof(float)), *g_cuda = xmalloc(m.numel * sizeof(float));
	int32_t *tok = xmalloc((size_t)B * T * 4), *tgt = xmalloc((size_t)B * T * 4);
	uint64_t s = 7 + arch + 2 * tied;
	model_init_weights(&m, params, s);
	/* weights in general position: larger matrices, norms away from 1 */
	for (int i = 0; i < m.n_params; i++) {
		const struct param_info *p = &m.params[i];
		for (size_t j = 0; j < p->numel; j++)
			params[p->offset + j] = p->cols == 0 ? params[p->offset + j] + 0.2f * rng_normal(&s)
							     : params[p->offset + j] * 4.0f;
	}
	for (int i = 0; i < B * T; i++) {
		tok[i] = (int32_t)(rng_next(&s) % (uint64_t)c.V);
		tgt[i] = (int32_t)(rng_next(&s) % (uint64_t)c.V);
	}
	float l_cpu = NAN, l_cuda = NAN;
	CHECK(loss_and_grads(&backend_cpu, &m, params, tok, tgt, B, T, &l_cpu, g_cpu) == 0);
	CHECK(loss_and_grads(cu, &m, params, tok, tgt, B, T, &l_cuda, g_cuda) == 0);
	CHECK_MSG(isfinite(l_cpu) && fabsf(l_cuda - l_cpu) <= 2e-3f * fabsf(l_cpu),
		  "loss cuda %.7g, cpu %.7g", l_cuda, l_cpu);
	for (int i = 0; i < m.n_params; i++) {
		const struct param_info *p = &m.params[i];
		double mx = 0, md = 0;
		for (size_t j = 0; j < p->numel; j++) {
			double a = g_cpu[p->offset + j], d = fabs(g_cuda[p->offset + j] - a);
			mx = fmax(mx, fabs(a));
			if (!(d <= md))
				md = d; /* NaN sticks */
		}
		CHECK_MSG(mx > 0, "%s: cpu gradient is all zero", p->name);
		CHECK_MSG(md <= 3e-2 * mx, "%s: max |cuda - cpu| %.3g, max |cpu| %.3g (%.3g)",
			  p->name, md, mx, md / mx);
	}
	free(params), free(g_cpu), free(g_cuda), free(tok), free(tgt);
	model_free(&m);
}

TEST(cuda_model_grads_gpt2) { compare_grads(ARCH_GPT2, 1); }
TEST(cuda_model_grads_llama_tied) { compare_grads(ARCH_LLAMA, 1); }
TEST(cuda_model_grads_llama_untied) { compare_grads(ARCH_LLAMA, 0); }

/* ---- training curves ---- */

#define STEPS 50

static int curve(const struct backend *be, const char *arch, const char *optim, double *loss)
{
	static uint32_t tok[40000];
	uint64_t s = 99;
	for (size_t i = 0; i < ARRAY_SIZE(tok); i++) /* a learnable stream */
		tok[i] = (rng_next(&s) % 4 == 0) ? (uint32_t)(rng_next(&s) % 67)
						 : (uint32_t)((i * 7) % 67);
	struct config cfg;
	config_defaults(&cfg);
	config_set_key(&cfg, "model", "arch", arch, "test");
	config_set_key(&cfg, "model", "n_layer", "2", "test");
	config_set_key(&cfg, "model", "d_model", "64", "test");
	config_set_key(&cfg, "model", "n_head", "4", "test");
	config_set_key(&cfg, "model", "seq_len", "32", "test");
	config_set_key(&cfg, "train", "batch_size", "4", "test");
	config_set_key(&cfg, "train", "steps", "50", "test");
	config_set_key(&cfg, "optim", "name", optim, "test");
	config_set_key(&cfg, "optim", "warmup", "5", "test");
	struct model_config mc;
	struct model m;
	struct dataloader dl;
	struct trainer tr;
	struct step_stats st[STEPS];
	int rc = -1;
	if (model_config_from(&mc, &cfg, 67) || model_init(&m, &mc))
		goto out_cfg;
	if (dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), 67, 4, 32, 7, 1))
		goto out_model;
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	if (trainer_init(&tr, &cfg, &m, be, params, &dl) == 0) {
		rc = trainer_run(&tr, STEPS, st);
		for (int i = 0; i < STEPS; i++)
			loss[i] = st[i].loss;
		trainer_free(&tr);
	}
	free(params);
	dataloader_close(&dl);
out_model:
	model_free(&m);
out_cfg:
	config_free(&cfg);
	return rc;
}

static void compare_curves(const char *arch, const char *optim)
{
	NEED_CUDA(cu);
	double a[STEPS], b[STEPS];
	CHECK_MSG(curve(&backend_cpu, arch, optim, a) == 0, "cpu run: %s", last_error());
	CHECK_MSG(curve(cu, arch, optim, b) == 0, "cuda run: %s", last_error());
	for (int i = 0; i < STEPS; i++)
		CHECK_MSG(fabs(a[i] - b[i]) <= 2e-2 * fabs(a[i]), "%s %s step %d: cuda %.6g, cpu %.6g",
			  arch, optim, i + 1, b[i], a[i]);
	CHECK_MSG(a[STEPS - 1] < a[0] - 0.5 && b[STEPS - 1] < b[0] - 0.5,
		  "loss did not fall: cpu %.4f -> %.4f, cuda %.4f -> %.4f", a[0], a[STEPS - 1], b[0],
		  b[STEPS - 1]);
}

TEST(cuda_curve_gpt2_adamw) { compare_curves("gpt2", "adamw"); }
TEST(cuda_curve_llama_muon) { compare_curves("llama", "muon"); }
