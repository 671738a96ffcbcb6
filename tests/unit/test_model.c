/* test_model.c - the model: parameter counts, initialisation, whole-model
 * gradients by finite differences, stage-split equivalence, sampling logits.
 * Mixture-of-experts models: their tensor table, gradients through the
 * stage, dloss, thread-count invariance and stage splits (the layer alone
 * is test_moe's). Everything runs on the CPU reference backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../model/model.h"
#include "../test.h"

static const struct backend *be(void)
{
	return &backend_cpu;
}

/* A backend test can use only when it has every slot the model calls. */
#define NEED_BACKEND()                                                          \
	do {                                                                    \
		if (!be()->matmul_backward || !be()->attention_backward ||      \
		    !be()->softmax_xent || !be()->alloc)                        \
			SKIP("the cpu backend's table is not filled in yet");   \
	} while (0)

static struct model_config tiny(int arch, int tied)
{
	struct model_config c;
	memset(&c, 0, sizeof(c));
	c.arch = arch;
	c.V = 67;
	c.L = 2;
	c.C = 32;
	c.NH = 4;
	c.NKV = arch == ARCH_LLAMA ? 2 : 0;
	c.T = 8;
	c.tied = tied;
	return c;
}

/* tiny's llama with 4 experts of width 24 per layer. */
static struct model_config tiny_moe(int router, int K, int shared)
{
	struct model_config c = tiny(ARCH_LLAMA, 0);
	c.E = 4;
	c.K = K;
	c.De = 24;
	c.shared = shared;
	c.router = router;
	/* large coefficients so that a wrong aux or z gradient shows */
	c.aux_coef = 0.5f;
	c.z_coef = 0.05f;
	return c;
}

static void fill_tokens(int32_t *tok, size_t n, int V, uint64_t seed)
{
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		tok[i] = (int32_t)(rng_next(&s) % (uint64_t)V);
}

/* Weights in general position for gradient checks: larger matrices than at
 * init (so gradients are well above fp32 round-off) and norm weights and
 * biases away from 1 and 0. */
static void perturb(const struct model *m, float *params, uint64_t seed, float scale)
{
	for (int i = 0; i < m->n_params; i++) {
		const struct param_info *p = &m->params[i];
		uint64_t s = rng_mix(seed, i);
		for (size_t j = 0; j < p->numel; j++) {
			if (p->cols == 0)
				params[p->offset + j] += 0.2f * rng_normal(&s);
			else
				params[p->offset + j] *= scale;
		}
	}
}

/* ---- parameter counts ---- */

TEST(param_count_gpt2_124m)
{
	struct model_config c;
	struct model m;
	memset(&c, 0, sizeof(c));
	c.arch = ARCH_GPT2;
	c.V = 50257;
	c.L = 12;
	c.C = 768;
	c.NH = 12;
	c.T = 1024;
	c.tied = 1;
	CHECK(model_init(&m, &c) == 0);
	CHECK(m.cfg.Vp == 50304);
	CHECK(m.cfg.F == 3072);
	/* llm.c prints "num_parameters: 124475904" for this model */
	CHECK_MSG(m.numel == 124475904, "numel %zu", m.numel);
	CHECK(m.n_params == 2 + 12 * 12 + 2);
	/* 6N excludes the position table only (wte is the tied head) */
	CHECK(model_flops_params(&m) == 124475904 - 1024 * 768);
	CHECK_NEAR(model_flops_per_token(&m),
		   6.0 * (124475904 - 786432) + 6.0 * 12 * 768 * 1024, 1.0);
	model_free(&m);
}

TEST(param_count_smollm)
{
	struct model_config c;
	struct model m;
	memset(&c, 0, sizeof(c));
	c.arch = ARCH_LLAMA;
	c.V = 49152;
	c.L = 32;
	c.C = 960;
	c.NH = 15;
	c.NKV = 5;
	c.T = 2048;
	c.tied = 1;
	/* F = 0 takes the default round(8*960/3) = 2560 (already a multiple
	 * of 64), SmolLM-360M's FFN width.
	 * wte 49152*960 = 47,185,920;
	 * per layer: ln1w 960 + qkvw (15+2*5)*64*960 = 1,536,000
	 *   + attprojw 960*960 = 921,600 + ln2w 960 + fcw 2*2560*960 = 4,915,200
	 *   + fcprojw 960*2560 = 2,457,600  = 9,832,320; x32 = 314,634,240;
	 * lnfw 960.  Total 361,821,120 (SmolLM-360M: 361.82M). */
	CHECK(model_init(&m, &c) == 0);
	CHECK(m.cfg.F == 2560 && m.cfg.HD == 64 && m.cfg.Vp == 49152);
	CHECK_MSG(m.numel == 361821120, "numel %zu", m.numel);
	model_free(&m);
	/* SmolLM-135M: wte 28,311,552; per layer 576 + 960*576 + 576*576 + 576
	 * + 3072*576 + 576*1536 = 3,540,096, x30 = 106,202,880; lnfw 576:
	 * 134,515,008 */
	c.L = 30;
	c.C = 576;
	c.NH = 9;
	c.NKV = 3;
	c.F = 1536;
	CHECK(model_init(&m, &c) == 0);
	CHECK_MSG(m.numel == 134515008, "numel %zu", m.numel);
	model_free(&m);
	/* default F for C = 32: round(85.33) = 85 -> 128 */
	c = tiny(ARCH_LLAMA, 0);
	CHECK(model_init(&m, &c) == 0);
	CHECK(m.cfg.F == 128 && m.cfg.Vp == 128 && m.cfg.HD == 8);
	CHECK(model_find_param(&m, "head") == m.n_params - 1);
	CHECK(model_find_param(&m, "h.1.fcw") >= 0 && model_find_param(&m, "wpe") < 0);
	CHECK(m.params[model_find_param(&m, "h.1.fcw")].rows == 256);
	CHECK(m.params[model_find_param(&m, "h.0.qkvw")].rows == (4 + 2 * 2) * 8);
	model_free(&m);
}

TEST(bad_shapes_rejected)
{
	struct model_config c = tiny(ARCH_LLAMA, 1);
	struct model m;
	struct stage st;
	set_error_quiet(1);
	c.NH = 5; /* 32 % 5 */
	CHECK(model_init(&m, &c) == -1);
	c.NH = 4;
	c.NKV = 3; /* 4 % 3 */
	CHECK(model_init(&m, &c) == -1);
	c = tiny(ARCH_LLAMA, 1);
	c.C = 12;
	c.NH = 4; /* head width 3: RoPE needs it even */
	CHECK(model_init(&m, &c) == -1);
	c = tiny(ARCH_GPT2, 1);
	c.NKV = 2; /* gpt2 has no GQA */
	CHECK(model_init(&m, &c) == -1);
	c = tiny(ARCH_GPT2, 1);
	c.V = 0;
	CHECK(model_init(&m, &c) == -1);
	c = tiny(ARCH_GPT2, 1);
	CHECK(model_init(&m, &c) == 0);
	{
		struct stage_cut cut;
		static const int holey[3] = {1, 0, 1};
		CHECK(cut_even(&cut, 2, 3) == -1); /* 3 stages, 2 layers */
		CHECK(cut_from_counts(&cut, 2, holey, 3) == -1); /* a middle stage of none */
	}
	CHECK(stage_init(&st, &m, be(), NULL, 0, 2, 9, 1) == -1); /* T > seq_len */
	set_error_quiet(0);
	model_free(&m);
}

/* A backend out of memory: stage_init fails and its message names the
 * bytes it asked for (once reported as 0: the size was read after the
 * stage was cleared). */
static void *alloc_fails(size_t bytes)
{
	(void)bytes;
	return NULL;
}

TEST(failed_allocation_names_its_size)
{
	struct model_config c = tiny(ARCH_LLAMA, 1);
	struct model m;
	struct stage st;
	CHECK(model_init(&m, &c) == 0);
	struct backend oom = *be();
	oom.alloc = alloc_fails;
	set_error_quiet(1);
	CHECK(stage_init(&st, &m, &oom, NULL, 0, 2, 8, 1) == -1);
	set_error_quiet(0);
	unsigned long long bytes = 0;
	const char *at = strstr(last_error(), "cannot allocate ");
	CHECK(at && sscanf(at, "cannot allocate %llu bytes of activations", &bytes) == 1);
	CHECK(bytes > 0);
	model_free(&m);
}

/* ---- initialisation ---- */

TEST(init_deterministic_and_split_independent)
{
	struct model_config c = tiny(ARCH_LLAMA, 1);
	struct model m;
	float *a, *b;
	c.L = 4;
	CHECK(model_init(&m, &c) == 0);
	a = xmalloc(m.numel * sizeof(float));
	b = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, a, 42);
	model_init_weights(&m, b, 42);
	CHECK(memcmp(a, b, m.numel * sizeof(float)) == 0);
	model_init_weights(&m, b, 43);
	CHECK(memcmp(a, b, m.numel * sizeof(float)) != 0);
	/* A tensor depends only on (seed, index): a model with more layers
	 * has the same embedding and the same first-layer tensors. */
	{
		struct model_config c2 = c;
		struct model m2;
		float *w2;
		c2.L = 6;
		CHECK(model_init(&m2, &c2) == 0);
		w2 = xmalloc(m2.numel * sizeof(float));
		model_init_weights(&m2, w2, 42);
		for (int i = 0; i < m.n_params - 1; i++) {
			const struct param_info *p = &m.params[i];
			const struct param_info *q = &m2.params[i];
			if (p->layer < 0 && i > 0)
				break;
			CHECK(!strcmp(p->name, q->name));
			if (strstr(p->name, "proj"))
				continue; /* scaled by 1/sqrt(2L): differs by design */
			CHECK(memcmp(a + p->offset, w2 + q->offset, p->numel * 4) == 0);
		}
		free(w2);
		model_free(&m2);
	}
	/* Norm weights 1, statistics of the matrices, padded rows zero. */
	for (int i = 0; i < m.n_params; i++) {
		const struct param_info *p = &m.params[i];
		double s = 0, s2 = 0;
		if (p->cols == 0) {
			for (size_t j = 0; j < p->numel; j++)
				CHECK(a[p->offset + j] == 1.0f);
			continue;
		}
		for (size_t j = 0; j < p->numel; j++) {
			s += a[p->offset + j];
			s2 += (double)a[p->offset + j] * a[p->offset + j];
		}
		{
			double n = (double)p->numel, want = 0.02;
			if (strstr(p->name, "proj"))
				want /= sqrt(2.0 * c.L);
			if (!strcmp(p->name, "wte"))
				n = (double)c.V * c.C; /* padded rows are zero */
			CHECK_MSG(fabs(sqrt(s2 / n) - want) < 0.1 * want, "%s std %g", p->name,
				  sqrt(s2 / n));
			CHECK_MSG(fabs(s / n) < 4 * want / sqrt(n), "%s mean %g", p->name, s / n);
		}
	}
	{
		const struct param_info *w = &m.params[model_find_param(&m, "wte")];
		for (size_t j = (size_t)c.V * c.C; j < w->numel; j++)
			CHECK(a[w->offset + j] == 0.0f);
	}
	/* Every split's stage arenas are slices of the one global arena, the
	 * tied copy equal to wte. */
	if (be()->alloc)
		for (int S = 2; S <= 4; S++) {
			struct stage_cut cut;
			CHECK(cut_even(&cut, m.cfg.L, S) == 0);
			for (int s = 0; s < S; s++) {
				struct stage st;
				float *sa;
				CHECK(stage_init(&st, &m, be(), &cut, s, 1, 8, 1) == 0);
				/* what MPI ranks count for the stages they do not build */
				CHECK(stage_param_count(&m, &cut, s) == st.n_params);
				sa = xmalloc(st.numel * sizeof(float));
				stage_gather(&st, sa, a);
				for (int i = 0; i < st.n_params; i++) {
					const struct param_info *p = &m.params[st.params[i].global];
					CHECK(memcmp(sa + st.params[i].offset, a + p->offset,
						     p->numel * 4) == 0);
				}
				if (s == S - 1) {
					long o = stage_wte_offset(&st);
					CHECK(o >= 0 && stage_head_offset(&st) == o);
					CHECK(memcmp(sa + o, a, (size_t)m.cfg.Vp * c.C * 4) == 0);
				} else if (s > 0) {
					CHECK(stage_wte_offset(&st) == -1);
				}
				free(sa);
				stage_free(&st);
			}
			cut_free(&cut);
		}
	free(a);
	free(b);
	model_free(&m);
}

/* ---- single-stage helpers ---- */

struct run {
	struct model m;
	struct stage st;
	float *params, *grads;
	int32_t *tok, *tgt;
	int B, T;
};

static int run_open(struct run *r, const struct model_config *c, int B, int T, uint64_t seed)
{
	memset(r, 0, sizeof(*r));
	if (model_init(&r->m, c) || stage_init(&r->st, &r->m, be(), NULL, 0, B, T, 2))
		return -1;
	r->B = B;
	r->T = T;
	r->params = xcalloc(r->m.numel, sizeof(float));
	r->grads = xcalloc(r->m.numel, sizeof(float));
	r->tok = xmalloc((size_t)B * T * 4);
	r->tgt = xmalloc((size_t)B * T * 4);
	model_init_weights(&r->m, r->params, seed);
	fill_tokens(r->tok, (size_t)B * T, c->V, seed + 1);
	fill_tokens(r->tgt, (size_t)B * T, c->V, seed + 2);
	return 0;
}

static void run_close(struct run *r)
{
	stage_free(&r->st);
	model_free(&r->m);
	free(r->params);
	free(r->grads);
	free(r->tok);
	free(r->tgt);
}

static float run_loss(struct run *r)
{
	float loss = NAN;
	stage_forward(&r->st, 0, r->params, r->tok, NULL, r->tgt, NULL, &loss, NULL, NULL, 1.0f);
	return loss;
}

static float run_grad(struct run *r)
{
	float loss = NAN;
	memset(r->grads, 0, r->m.numel * sizeof(float));
	stage_forward(&r->st, 1, r->params, r->tok, NULL, r->tgt, NULL, &loss, NULL, r->grads, 1.0f);
	stage_backward(&r->st, 1, r->params, r->grads, NULL, NULL);
	stage_finish_grads(&r->st, r->grads);
	return loss;
}

/* Cut number k of L layers over S stages, k counting every vector of
 * counts 0..L (the last stage's implied); 1 when it is a valid cut (the
 * first and the last stage may have no layer, the others need one), 0 when
 * not, -1 when k is past the last. */
static int nth_cut(struct stage_cut *cut, int L, int S, long k)
{
	int counts[8], sum = 0;
	for (int s = 0; s < S - 1; s++) {
		counts[s] = (int)(k % (L + 1));
		k /= L + 1;
		sum += counts[s];
	}
	if (k)
		return -1;
	counts[S - 1] = L - sum;
	if (counts[S - 1] < 0)
		return 0;
	set_error_quiet(1);
	int ok = cut_from_counts(cut, L, counts, S) == 0;
	set_error_quiet(0);
	return ok;
}

/* Stage s of cut as an MPI rank sees it (stage_param_count,
 * model_init_weights_stage) against the stage stage_init builds. */
static void check_rank_view(const struct model *m, const struct stage_cut *cut, int s,
			    const float *all, float *part, char *reads)
{
	struct stage st;
	char what[64];
	snprintf(what, sizeof(what), "arch %d tied %d stage %d of %d (%d layers)", m->cfg.arch,
		 m->cfg.tied, s, cut->S, cut_layers(cut, s));
	CHECK(stage_init(&st, m, be(), cut, s, 1, 8, 1) == 0);
	CHECK_MSG(stage_param_count(m, cut, s) == st.n_params, "%s: %d, built %d", what,
		  stage_param_count(m, cut, s), st.n_params);
	for (size_t j = 0; j < m->numel; j++)
		part[j] = 12345.0f; /* untouched marker */
	model_init_weights_stage(m, part, 7, cut, s);
	memset(reads, 0, (size_t)m->n_params);
	for (int k = 0; k < st.n_params; k++)
		reads[st.params[k].global] = 1;
	for (int k = 0; k < m->n_params; k++) {
		const struct param_info *p = &m->params[k];
		int same = !memcmp(part + p->offset, all + p->offset, p->numel * sizeof(float));
		int untouched = 1;
		for (size_t j = 0; j < p->numel; j++)
			untouched &= part[p->offset + j] == 12345.0f;
		CHECK_MSG(reads[k] ? same : untouched, "%s: %s %s", what, p->name,
			  reads[k] ? "differs" : "was written");
	}
	stage_free(&st);
}

/* What an MPI rank computes for a stage without the whole model agrees with
 * stage_init, for both architectures, tied and untied, and every cut of 5
 * layers over 1 to 4 stages (empty first and last stages included):
 * stage_param_count is its n_params, and model_init_weights_stage writes
 * exactly the tensors the stage reads (its own, wte for a tied copy), with
 * model_init_weights's values, and leaves every other tensor untouched. */
TEST(stage_counts_and_init_match_stage_init)
{
	if (!be()->alloc)
		SKIP("no backend");
	for (int arch = 0; arch < 3; arch++) /* llama, gpt2, llama with experts */
		for (int tied = 0; tied <= 1; tied++) {
			struct model_config c = arch == 2 ? tiny_moe(ROUTER_SOFTMAX, 2, tied)
							  : tiny(arch ? ARCH_GPT2 : ARCH_LLAMA, tied);
			c.tied = tied;
			c.L = 5;
			struct model m;
			CHECK(model_init(&m, &c) == 0);
			float *all = xmalloc(m.numel * sizeof(float));
			float *part = xmalloc(m.numel * sizeof(float));
			char *reads = xmalloc((size_t)m.n_params);
			model_init_weights(&m, all, 7);
			int cuts = 0;
			for (int S = 1; S <= 4; S++) {
				struct stage_cut cut;
				int r;
				for (long k = 0; (r = nth_cut(&cut, c.L, S, k)) >= 0; k++) {
					if (!r)
						continue;
					for (int s = 0; s < S; s++)
						check_rank_view(&m, &cut, s, all, part, reads);
					cut_free(&cut);
					cuts++;
				}
			}
			/* S stages: the compositions of 5 - (S - 2) into S parts >= 0 */
			CHECK_MSG(cuts == 1 + 6 + 15 + 20, "%d cuts", cuts);
			free(all);
			free(part);
			free(reads);
			model_free(&m);
			if (test_failed())
				return;
		}
}

TEST(loss_at_init_is_log_vocab)
{
	for (int arch = 0; arch < 2; arch++) {
		struct model_config c = tiny(arch, 1);
		struct run r;
		float loss;
		NEED_BACKEND();
		CHECK(run_open(&r, &c, 4, 8, 7) == 0);
		loss = run_loss(&r);
		/* near-uniform predictions at init: loss ~ log(V) = 4.205 */
		CHECK_NEAR(loss, log(67.0), 0.05);
		/* the forward with gradients reports the same loss */
		CHECK(run_grad(&r) == loss);
		run_close(&r);
	}
}

/* Central differences of the model's own loss against the backward, for a
 * sample of entries of every tensor.
 *
 * Tolerance: the loss is an fp32 number near 4.2, whose spacing is 4.8e-7;
 * divided by 2*eps = 2e-3 a difference quotient is quantised to 2.4e-4, and
 * the truncation error O(eps^2 f''') is far below that (observed
 * |fd - g| <= 2.8e-4). So an entry passes when |fd - g| <= 5e-4 + 0.02 |g|.
 * Weights are scaled up (x8) so typical gradients are 1e-2..3e-1, well
 * above that floor, and each tensor must have a sampled gradient above
 * 5e-3 so the check cannot pass vacuously (a wrong sign, a missing term or
 * a factor of 2 fails it). */
static void grad_check(int arch, int tied)
{
	struct model_config c = tiny(arch, tied);
	struct run r;
	const float eps = 1e-3f;
	int checked = 0;

	CHECK(run_open(&r, &c, 2, 8, 11 + arch + 2 * tied) == 0);
	perturb(&r.m, r.params, 99, 8.0f);
	run_grad(&r);
	for (int i = 0; i < r.m.n_params; i++) {
		const struct param_info *p = &r.m.params[i];
		uint64_t s = rng_mix(5, i);
		double gmax = 0;
		int bad = 0;
		char why[256] = "";
		for (int k = 0; k < 8; k++) {
			size_t j = rng_next(&s) % p->numel;
			float *w, w0;
			double fd, g;
			if ((!strcmp(p->name, "wte") || !strcmp(p->name, "head")) &&
			    j >= (size_t)c.V * c.C)
				j %= (size_t)c.V * c.C; /* padded rows: gradient 0 */
			w = &r.params[p->offset + j];
			w0 = *w;
			g = r.grads[p->offset + j];
			*w = w0 + eps;
			fd = run_loss(&r);
			*w = w0 - eps;
			fd -= run_loss(&r);
			*w = w0;
			fd /= 2 * eps;
			if (fabs(g) > gmax)
				gmax = fabs(g);

			if (!(fabs(fd - g) <= 5e-4 + 0.02 * fabs(g)) && !bad) {
				bad = 1;
				snprintf(why, sizeof(why), "%s[%zu]: backward %.6g, fd %.6g",
					 p->name, j, g, fd);
			}
			checked++;
		}
		CHECK_MSG(!bad, "%s", why);
		CHECK_MSG(gmax > 5e-3, "%s: sampled gradients all below %g", p->name, gmax);
	}
	CHECK(checked == 8 * r.m.n_params);
	run_close(&r);
}

/* The head in chunks of a few rows (3 rows, which divide neither B*T nor
 * B) gives the loss and every gradient of the head in one chunk: the same
 * logits row by row, the head's gradient summed chunk after chunk. Both
 * tied (the head's gradient goes to wte) and untied. */
static void head_chunks(int arch, int tied)
{
	struct model_config c = tiny(arch, tied);
	struct run r;
	CHECK(run_open(&r, &c, 2, 8, 21 + arch + 2 * tied) == 0);
	perturb(&r.m, r.params, 98, 8.0f);
	CHECK(r.st.head_rows == r.B * r.T); /* a tiny model's logits fit at once */
	float whole = run_grad(&r);
	float *g1 = xmalloc(r.m.numel * sizeof(float));
	memcpy(g1, r.grads, r.m.numel * sizeof(float));
	r.st.head_rows = 3;
	float chunked = run_grad(&r);
	CHECK_MSG(fabsf(chunked - whole) <= 1e-6f * fabsf(whole), "loss %.9g chunked, %.9g whole",
		  chunked, whole);
	double gmax = 0, dmax = 0;
	for (size_t i = 0; i < r.m.numel; i++) {
		gmax = fmax(gmax, fabs(g1[i]));
		dmax = fmax(dmax, fabs(g1[i] - r.grads[i]));
	}
	CHECK_MSG(gmax > 0 && dmax <= 1e-5 * gmax, "gradients differ by %g (largest %g)", dmax, gmax);
	float loss_only = run_loss(&r);
	CHECK(loss_only == chunked); /* without gradients: the same chunks, the same loss */
	free(g1);
	run_close(&r);
}

TEST(head_chunks_match_one_chunk_gpt2)
{
	NEED_BACKEND();
	head_chunks(ARCH_GPT2, 1);
}

TEST(head_chunks_match_one_chunk_llama_untied)
{
	NEED_BACKEND();
	head_chunks(ARCH_LLAMA, 0);
}

TEST(grad_check_gpt2)
{
	NEED_BACKEND();
	grad_check(ARCH_GPT2, 1);
}

TEST(grad_check_llama_tied)
{
	NEED_BACKEND();
	grad_check(ARCH_LLAMA, 1);
}

TEST(grad_check_llama_untied)
{
	NEED_BACKEND();
	grad_check(ARCH_LLAMA, 0);
}

/* ---- mixture of experts ---- */

/* The tensor table of an MoE layer (model.h): the router, E experts' fcw
 * and fcprojw, the shared expert's, in that order and in place of fcw and
 * fcprojw; 6N counts the K active experts of E. */
TEST(moe_param_table)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 1);
	struct model m;
	static const char *const want[] = {
		"h.0.ln1w", "h.0.qkvw", "h.0.attprojw", "h.0.ln2w", "h.0.router",
		"h.0.experts.0.fcw", "h.0.experts.1.fcw", "h.0.experts.2.fcw", "h.0.experts.3.fcw",
		"h.0.experts.0.fcprojw", "h.0.experts.1.fcprojw", "h.0.experts.2.fcprojw",
		"h.0.experts.3.fcprojw", "h.0.shared.fcw", "h.0.shared.fcprojw", "h.1.ln1w"};
	CHECK(model_init(&m, &c) == 0);
	for (size_t i = 0; i < ARRAY_SIZE(want); i++)
		CHECK_MSG(!strcmp(m.params[1 + i].name, want[i]), "tensor %zu is %s, want %s", 1 + i,
			  m.params[1 + i].name, want[i]);
	CHECK(model_find_param(&m, "h.1.fcw") < 0);
	const struct param_info *r = &m.params[model_find_param(&m, "h.1.router")];
	const struct param_info *f = &m.params[model_find_param(&m, "h.1.experts.2.fcw")];
	const struct param_info *pr = &m.params[model_find_param(&m, "h.1.experts.3.fcprojw")];
	CHECK(r->rows == 4 && r->cols == 32 && r->group == GROUP_OTHER);
	CHECK(f->rows == 48 && f->cols == 32 && f->group == GROUP_MATRIX);
	CHECK(pr->rows == 32 && pr->cols == 24 && pr->group == GROUP_MATRIX);
	/* the E fcw are one [E, 2De, C] block, the E fcprojw one [E, C, De] */
	CHECK(f->offset == m.params[model_find_param(&m, "h.1.experts.0.fcw")].offset +
				   2 * f->numel);
	/* per layer: ln1w 32 + qkvw 64*32 + attprojw 32*32 + ln2w 32 + router
	 * 4*32 + 4 experts x 3*24*32 + shared 3*24*32 = 15552; active: 2
	 * experts of 4, so 4608 fewer; wte 128*32, head 128*32, lnfw 32 */
	size_t layer = 32 + 64 * 32 + 32 * 32 + 32 + 4 * 32 + 4 * 3 * 24 * 32 + 3 * 24 * 32;
	CHECK_MSG(m.numel == 2 * layer + 2 * 128 * 32 + 32, "numel %zu", m.numel);
	CHECK_MSG(model_flops_params(&m) == 2 * (layer - 2 * 3 * 24 * 32) + 128 * 32 + 32,
		  "flops params %zu", model_flops_params(&m));
	/* the cut's cost model splits the same FLOPs */
	struct stage_cut cut;
	CHECK(cut_even(&cut, c.L, 2) == 0);
	CHECK_NEAR(cut_stage_flops(&m, &cut, 0) + cut_stage_flops(&m, &cut, 1),
		   model_flops_per_token(&m), 1e-6 * model_flops_per_token(&m));
	cut_free(&cut);
	model_free(&m);
	/* d_expert 0 takes d_ff; a dense model keeps no MoE field */
	c.De = 0;
	CHECK(model_init(&m, &c) == 0 && m.cfg.De == m.cfg.F);
	model_free(&m);
	c = tiny(ARCH_LLAMA, 0);
	c.K = 3;
	c.aux_coef = 1;
	CHECK(model_init(&m, &c) == 0 && m.cfg.K == 0 && m.cfg.aux_coef == 0.0f);
	model_free(&m);
}

TEST(moe_bad_configs_rejected)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 0);
	struct model m;
	set_error_quiet(1);
	c.K = 5; /* more than E = 4 */
	CHECK(model_init(&m, &c) == -1);
	CHECK(strstr(last_error(), "model.top_k = 5") && strstr(last_error(), "model.n_expert = 4"));
	c = tiny_moe(ROUTER_SOFTMAX, 2, 0);
	c.arch = ARCH_GPT2;
	c.NKV = 0;
	c.tied = 1;
	CHECK(model_init(&m, &c) == -1);
	CHECK(strstr(last_error(), "model.arch = llama"));
	c = tiny_moe(ROUTER_SOFTMAX, 2, 0);
	CHECK(model_init(&m, &c) == 0);
	/* the layer is the backend's moe ops: any backend with them builds
	 * the stage (cuda's name was once refused), one without is refused */
	struct backend other = *be();
	struct stage st;
	other.name = "cuda";
	CHECK(stage_init(&st, &m, &other, NULL, 0, 2, 8, 1) == 0);
	stage_free(&st);
	other.moe_dispatch = NULL;
	CHECK(stage_init(&st, &m, &other, NULL, 0, 2, 8, 1) == -1);
	CHECK(strstr(last_error(), "model.n_expert = 4") && strstr(last_error(), "moe ops") &&
	      strstr(last_error(), "cuda"));
	set_error_quiet(0);
	model_free(&m);
}

/* The experts' row counts cross to the host once per layer and slot, in
 * the forward: the backward and the step's statistics read that copy, and
 * the statistics read every layer's auxiliary losses in one copy (on a GPU
 * every copy waits for the stream). */
static size_t count_bytes;
static long counts_copied, copies;

static void counting_to_host(void *dst, const void *src, size_t n)
{
	copies++;
	counts_copied += n == count_bytes;
	be()->to_host(dst, src, n);
}

TEST(moe_counts_cross_to_the_host_once_per_layer)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 1);
	struct model m;
	struct stage st;
	struct backend spy = *be();
	spy.to_host = counting_to_host;
	CHECK(model_init(&m, &c) == 0);
	CHECK(stage_init(&st, &m, &spy, NULL, 0, 2, 8, 2) == 0);
	float *params = xcalloc(m.numel, sizeof(float)), *grads = xcalloc(m.numel, sizeof(float));
	int32_t tok[16], tgt[16];
	model_init_weights(&m, params, 5);
	fill_tokens(tok, 16, c.V, 6);
	fill_tokens(tgt, 16, c.V, 7);
	count_bytes = sizeof(int32_t) * (size_t)(c.E + 1);
	double stats[2 + 8];
	float loss = NAN;
	for (int slot = 0; slot < 2; slot++) {
		counts_copied = 0;
		stage_forward(&st, slot, params, tok, NULL, tgt, NULL, &loss, NULL, grads, 1.0f);
		CHECK_MSG(counts_copied == c.L, "slot %d: the forward copied the counts %ld times "
			  "for %d layers", slot, counts_copied, c.L);
		counts_copied = copies = 0;
		CHECK(stage_moe_stats(&st, slot, stats) == c.E);
		CHECK_MSG(copies == 1, "slot %d: the statistics took %ld copies (one: the layers' "
			  "auxiliary losses gathered)", slot, copies);
		stage_backward(&st, slot, params, grads, NULL, NULL);
		CHECK_MSG(counts_copied == 0, "slot %d: the statistics and the backward copied "
			  "the counts %ld times", slot, counts_copied);
	}
	free(params);
	free(grads);
	stage_free(&st);
	model_free(&m);
}

/* The objective the backward differentiates: the cross-entropy plus the
 * router's auxiliary losses (the forward's loss is the cross-entropy). */
static double moe_objective(struct run *r)
{
	double ce = run_loss(r);
	return ce + stage_aux_loss(&r->st, 0);
}

/* The routed counts of the last forward (summed over layers), to leave
 * out a perturbation that moved a token to another expert: the objective
 * jumps there (top-k is piecewise constant). */
static void moe_counts(struct run *r, double *counts)
{
	stage_moe_stats(&r->st, 0, counts);
	counts[0] = counts[1] = 0; /* the losses move continuously */
}

/* Central differences of the whole model's objective against the backward
 * for a sample of entries of every tensor, as grad_check does (same
 * tolerance), through the stage: slots, dloss and the aux losses' place in
 * the objective. Perturbations that change a route are skipped (at most a
 * quarter of a tensor's); the routers, the shared expert and the experts
 * together must show a gradient above 5e-3 (not vacuous). Every MoE gradient formula is
 * checked more tightly, term by term, in test_moe. */
static void moe_grad_check(int router, int K, int shared, uint64_t seed)
{
	struct model_config c = tiny_moe(router, K, shared);
	struct run r;
	const float eps = 1e-3f;
	double base[6], moved[6], experts_max = 0;

	CHECK(run_open(&r, &c, 2, 8, seed) == 0);
	perturb(&r.m, r.params, seed + 99, 4.0f);
	run_grad(&r);
	CHECK(stage_aux_loss(&r.st, 1) > 0.0);
	run_loss(&r);
	moe_counts(&r, base);
	for (int i = 0; i < r.m.n_params; i++) {
		const struct param_info *p = &r.m.params[i];
		uint64_t s = rng_mix(5, i);
		double gmax = 0;
		int skipped = 0;
		for (int k = 0; k < 8; k++) {
			size_t j = rng_next(&s) % p->numel;
			float *w, w0;
			double fd, g;
			int same;
			if ((!strcmp(p->name, "wte") || !strcmp(p->name, "head")) &&
			    j >= (size_t)c.V * c.C)
				j %= (size_t)c.V * c.C;
			w = &r.params[p->offset + j];
			w0 = *w;
			g = r.grads[p->offset + j];
			*w = w0 + eps;
			fd = moe_objective(&r);
			moe_counts(&r, moved);
			same = !memcmp(base, moved, sizeof(base));
			*w = w0 - eps;
			fd -= moe_objective(&r);
			moe_counts(&r, moved);
			same &= !memcmp(base, moved, sizeof(base));
			*w = w0;
			fd /= 2 * eps;
			if (!same) {
				skipped++;
				continue;
			}
			gmax = fmax(gmax, fabs(g));
			CHECK_MSG(fabs(fd - g) <= 5e-4 + 0.02 * fabs(g),
				  "router %d K %d shared %d: %s[%zu]: backward %.6g, fd %.6g", router, K,
				  shared, p->name, j, g, fd);
		}
		CHECK_MSG(skipped <= 2, "%s: %d of 8 perturbations changed a route", p->name,
			  skipped);
		if (strstr(p->name, "experts."))
			experts_max = fmax(experts_max, gmax);
		else if (strstr(p->name, "router") || strstr(p->name, "shared"))
			CHECK_MSG(gmax > 5e-3, "router %d K %d: %s: sampled gradients all below %g",
				  router, K, p->name, gmax);
	}
	/* an expert few tokens reached has small gradients: the floor is for
	 * the experts together */
	CHECK_MSG(experts_max > 5e-3, "router %d K %d: the experts' sampled gradients are all "
		  "below %g", router, K, experts_max);
	run_close(&r);
}

TEST(moe_grad_check_softmax_top2_shared)
{
	NEED_BACKEND();
	moe_grad_check(ROUTER_SOFTMAX, 2, 1, 21);
}

TEST(moe_grad_check_sigmoid_top2)
{
	NEED_BACKEND();
	moe_grad_check(ROUTER_SIGMOID, 2, 0, 22);
}

TEST(moe_grad_check_softmax_top1)
{
	NEED_BACKEND();
	moe_grad_check(ROUTER_SOFTMAX, 1, 0, 23);
}

/* A stage's forward and backward give the same bits for 1 and 2 threads
 * (and 3): routing, dispatch and every sum have a fixed order. */
TEST(moe_thread_count_invariance)
{
	struct model_config c = tiny_moe(ROUTER_SIGMOID, 2, 1);
	struct run r;
	NEED_BACKEND();
	c.C = 64;
	c.NH = 4;
	c.De = 96;
	c.T = 32;
	CHECK(run_open(&r, &c, 4, 32, 41) == 0);
	perturb(&r.m, r.params, 42, 2.0f);
	float *g1 = xmalloc(r.m.numel * sizeof(float));
	double st1[6], st2[6];
	be()->set_threads(1);
	float l1 = run_grad(&r);
	memcpy(g1, r.grads, r.m.numel * sizeof(float));
	stage_moe_stats(&r.st, 1, st1);
	for (int th = 2; th <= 3; th++) {
		be()->set_threads(th);
		float l2 = run_grad(&r);
		stage_moe_stats(&r.st, 1, st2);
		CHECK_MSG(!memcmp(&l1, &l2, sizeof(l1)), "loss differs: 1 and %d threads", th);
		CHECK_MSG(!memcmp(st1, st2, sizeof(st1)), "routing differs: 1 and %d threads", th);
		CHECK_MSG(!memcmp(g1, r.grads, r.m.numel * sizeof(float)),
			  "gradients differ: 1 and %d threads", th);
	}
	be()->set_threads(0);
	CHECK(be()->sumsq(g1, r.m.numel) > 1e-6);
	free(g1);
	run_close(&r);
}

/* The micro-batch's loss scale (stage_forward's dloss, 1/M in training)
 * scales the whole objective's gradient, the auxiliary losses' included:
 * with a power of two every product scales exactly, so dloss 1/4 gives
 * exactly a quarter of dloss 1's gradients, whatever the slot. */
TEST(moe_dloss_scales_every_gradient)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 1);
	struct run r;
	NEED_BACKEND();
	c.aux_coef = 2.0f; /* the aux terms well above the rest */
	CHECK(run_open(&r, &c, 2, 8, 61) == 0);
	perturb(&r.m, r.params, 62, 4.0f);
	run_grad(&r);
	float *g1 = xmalloc(r.m.numel * sizeof(float)), loss;
	memcpy(g1, r.grads, r.m.numel * sizeof(float));
	memset(r.grads, 0, r.m.numel * sizeof(float));
	/* forward into slot 0 at dloss 1/4, then another forward into slot 1
	 * at dloss 1: slot 0's backward must use its own scale */
	stage_forward(&r.st, 0, r.params, r.tok, NULL, r.tgt, NULL, &loss, NULL, r.grads, 0.25f);
	stage_forward(&r.st, 1, r.params, r.tok, NULL, r.tgt, NULL, &loss, NULL, NULL, 1.0f);
	stage_backward(&r.st, 0, r.params, r.grads, NULL, NULL);
	stage_finish_grads(&r.st, r.grads);
	for (size_t j = 0; j < r.m.numel; j++)
		CHECK_MSG(r.grads[j] == 0.25f * g1[j], "entry %zu: %g, a quarter of %g", j,
			  (double)r.grads[j], (double)g1[j]);
	free(g1);
	run_close(&r);
}

/* stage_moe_stats: the counts of every layer add up to L*K tokens per
 * token, and the losses are what the stage's objective adds. */
TEST(moe_stats_of_a_forward)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 0);
	struct run r;
	double out[6], sum = 0;
	NEED_BACKEND();
	CHECK(run_open(&r, &c, 2, 8, 51) == 0);
	run_loss(&r);
	CHECK(stage_moe_stats(&r.st, 0, out) == 4);
	for (int e = 0; e < 4; e++)
		sum += out[2 + e];
	CHECK(sum == 2.0 * 2 * 16); /* L * K * B*T */
	/* near-uniform scores at init: P_i ~ 1/E, so balance ~ sum_i f_i = 1
	 * per layer; z ~ log(E)^2 per layer */
	CHECK_NEAR(out[0], 2.0, 0.1);
	CHECK_NEAR(out[1], 2 * log(4.0) * log(4.0), 0.1);
	CHECK_NEAR(stage_aux_loss(&r.st, 0), 0.5 * out[0] + 0.05 * out[1], 1e-6);
	run_close(&r);
	/* a dense model has none */
	c = tiny(ARCH_LLAMA, 0);
	CHECK(run_open(&r, &c, 2, 8, 51) == 0);
	run_loss(&r);
	out[0] = 7;
	CHECK(stage_moe_stats(&r.st, 0, out) == 0 && out[0] == 7 && stage_aux_loss(&r.st, 0) == 0);
	run_close(&r);
}

/* ---- stage split equivalence ---- */

/* Train-step gradients and losses of M micro-batches with S stages,
 * GPipe order (all forwards, then all backwards, one slot each), each stage
 * on its own arena; the result is scattered into a global gradient arena
 * with the tied copies summed as documented in model.h. */
static int split_run(const struct model *m, const float *params, const struct stage_cut *cut,
		     int B, int T, int M, const int32_t *tok, const int32_t *tgt, float *grads_out,
		     float *losses)
{
	int S = cut->S;
	struct stage *st = xcalloc(S, sizeof(*st));
	float **p = xcalloc(S, sizeof(float *)), **g = xcalloc(S, sizeof(float *));
	size_t NC = (size_t)B * T * m->cfg.C, N = (size_t)B * T;
	float *x = xmalloc(NC * 4 * M * (S + 1)), *dx = xmalloc(NC * 4 * (S + 1));
	int ok = 0;

	for (int s = 0; s < S; s++) {
		if (stage_init(&st[s], m, be(), cut, s, B, T, M))
			return -1;
		p[s] = xmalloc(st[s].numel * 4);
		g[s] = xcalloc(st[s].numel, 4);
		stage_gather(&st[s], p[s], params);
	}
	/* x[(mb * (S+1) + s) * NC]: input of stage s for micro-batch mb */
	for (int mb = 0; mb < M; mb++)
		for (int s = 0; s < S; s++)
			stage_forward(&st[s], mb, p[s], tok + mb * N, x + (mb * (S + 1) + s) * NC,
				      tgt + mb * N, x + (mb * (S + 1) + s + 1) * NC, &losses[mb],
				      NULL, g[s], 1.0f / M);
	if (S == 1) {
		/* the forward with grads already ran the head's backward;
		 * the single-stage loop runs F, B per micro-batch instead, so
		 * this path is only used for S > 1 */
	}
	for (int mb = 0; mb < M; mb++)
		for (int s = S - 1; s >= 0; s--)
			stage_backward(&st[s], mb, p[s], g[s], dx + (s + 1) * NC, dx + s * NC);
	for (int s = 0; s < S; s++)
		stage_finish_grads(&st[s], g[s]);
	if (m->cfg.tied && S > 1) {
		long o0 = stage_wte_offset(&st[0]), o1 = stage_wte_offset(&st[S - 1]);
		size_t n = (size_t)m->cfg.Vp * m->cfg.C;
		if (o0 < 0 || o1 < 0)
			goto out;
		for (size_t i = 0; i < n; i++)
			g[0][o0 + i] = g[0][o0 + i] + g[S - 1][o1 + i];
	}
	for (int s = 0; s < S; s++)
		stage_scatter(&st[s], grads_out, g[s]);
	ok = 1;
out:
	for (int s = 0; s < S; s++) {
		stage_free(&st[s]);
		free(p[s]);
		free(g[s]);
	}
	free(st);
	free(p);
	free(g);
	free(x);
	free(dx);
	return ok ? 0 : -1;
}

/* The same M micro-batches on one stage, forward/backward per micro-batch. */
static void single_run(const struct model *m, const float *params, int B, int T, int M,
		       const int32_t *tok, const int32_t *tgt, float *grads, float *losses)
{
	struct stage st;
	size_t N = (size_t)B * T;
	if (stage_init(&st, m, be(), NULL, 0, B, T, 1))
		return;
	for (int mb = 0; mb < M; mb++) {
		stage_forward(&st, 0, params, tok + mb * N, NULL, tgt + mb * N, NULL, &losses[mb],
			      NULL, grads, 1.0f / M);
		stage_backward(&st, 0, params, grads, NULL, NULL);
	}
	stage_finish_grads(&st, grads);
	stage_free(&st);
}

static void split_equivalence_of(struct model_config c)
{
	struct model m;
	const int B = 2, T = 8, M = 2;
	float *params, *g1, *gs, l1[2], ls[2];
	int32_t tok[2 * 2 * 8], tgt[2 * 2 * 8];

	c.L = 4;
	CHECK(model_init(&m, &c) == 0);
	params = xmalloc(m.numel * 4);
	g1 = xcalloc(m.numel, 4);
	gs = xcalloc(m.numel, 4);
	model_init_weights(&m, params, 3);
	perturb(&m, params, 4, 4.0f);
	fill_tokens(tok, B * T * M, c.V, 5);
	fill_tokens(tgt, B * T * M, c.V, 6);
	single_run(&m, params, B, T, M, tok, tgt, g1, l1);
	/* even cuts over 2..4 stages, then uneven ones, empty ends included */
	static const char *const lists[] = {"1,3", "3,1", "0,4", "4,0", "0,3,1", "1,2,1,0",
					    "0,2,2,0"};
	for (int k = 0; k < 3 + (int)ARRAY_SIZE(lists); k++) {
		struct stage_cut cut;
		int counts[4], S = k + 2;
		char what[32];
		if (k < 3) {
			CHECK(cut_even(&cut, c.L, S) == 0);
		} else {
			char err[64];
			S = cut_parse_list(lists[k - 3], counts, 4, err, sizeof(err));
			CHECK(cut_from_counts(&cut, c.L, counts, S) == 0);
		}
		cut_format(&cut, what, sizeof(what));
		memset(gs, 0xff, m.numel * 4); /* every entry must be written */
		CHECK(split_run(&m, params, &cut, B, T, M, tok, tgt, gs, ls) == 0);
		for (int mb = 0; mb < M; mb++)
			CHECK_MSG(memcmp(&l1[mb], &ls[mb], 4) == 0, "cut %s mb %d loss %.9g vs %.9g",
				  what, mb, l1[mb], ls[mb]);
		for (int i = 0; i < m.n_params; i++) {
			const struct param_info *p = &m.params[i];
			CHECK_MSG(memcmp(g1 + p->offset, gs + p->offset, p->numel * 4) == 0,
				  "cut %s: gradient of %s differs", what, p->name);
		}
		cut_free(&cut);
	}
	/* the gradients are not trivially zero */
	CHECK(be()->sumsq(g1, m.numel) > 1e-6);
	free(params);
	free(g1);
	free(gs);
	model_free(&m);
}

static void split_equivalence(int arch, int tied)
{
	split_equivalence_of(tiny(arch, tied));
}

TEST(split_equivalence_gpt2)
{
	NEED_BACKEND();
	split_equivalence(ARCH_GPT2, 1);
}

TEST(split_equivalence_llama_tied)
{
	NEED_BACKEND();
	split_equivalence(ARCH_LLAMA, 1);
}

TEST(split_equivalence_llama_untied)
{
	NEED_BACKEND();
	split_equivalence(ARCH_LLAMA, 0);
}

/* MoE layers split like dense ones: every cut, both routers, tied and
 * untied, with the shared expert; M = 2 micro-batches at dloss 1/2. */
TEST(split_equivalence_moe)
{
	NEED_BACKEND();
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 1);
	split_equivalence_of(c);
	c = tiny_moe(ROUTER_SIGMOID, 1, 0);
	c.tied = 1;
	split_equivalence_of(c);
}

/* ---- stage layout ---- */

TEST(stage_layout)
{
	struct model_config c = tiny(ARCH_GPT2, 1);
	struct model m;
	size_t total = 0;
	c.L = 5;
	CHECK(model_init(&m, &c) == 0);
	if (!be()->alloc)
		SKIP("the cpu backend's table is not filled in yet");
	/* 5 layers on 3 stages: 2, 2, 1; arenas cover the model exactly once
	 * plus the tied copy */
	struct stage_cut cut;
	CHECK(cut_even(&cut, c.L, 3) == 0);
	for (int s = 0; s < 3; s++) {
		struct stage st;
		static const int want[3][2] = {{0, 2}, {2, 4}, {4, 5}};
		CHECK(stage_init(&st, &m, be(), &cut, s, 2, 4, 2) == 0);
		CHECK(st.layer_begin == want[s][0] && st.layer_end == want[s][1]);
		CHECK(st.has_embed == (s == 0) && st.has_head == (s == 2));
		CHECK(st.act_bytes_per_slot > 0 && st.scratch_bytes > 0);
		CHECK((s == 2) == (stage_head_offset(&st) >= 0));
		total += st.numel;
		for (int i = 1; i < st.n_params; i++)
			CHECK(st.params[i].offset >= st.params[i - 1].offset +
			      m.params[st.params[i - 1].global].numel);
		stage_free(&st);
	}
	CHECK(total == m.numel + (size_t)m.cfg.Vp * c.C);
	cut_free(&cut);
	model_free(&m);
}

/* stage_hold_weights (expert parallelism's weights): the weight arena keeps
 * the held tensors back to back in tensor order and nothing else, the
 * gradient layout stays, the MoE blocks start at the first held expert,
 * gather and scatter move exactly the held tensors; a mask that leaves out
 * a tensor other than an expert's, or holds no range of experts, is
 * refused. */
TEST(stage_hold_weights_layout)
{
	struct model_config c = tiny_moe(ROUTER_SOFTMAX, 2, 1);
	struct model m;
	CHECK(model_init(&m, &c) == 0);
	if (!be()->alloc)
		SKIP("the cpu backend's table is not filled in yet");
	struct stage_cut cut;
	CHECK(cut_even(&cut, c.L, 2) == 0);
	float *global = xmalloc(m.numel * sizeof(float)), *back = xmalloc(m.numel * sizeof(float));
	for (size_t i = 0; i < m.numel; i++)
		global[i] = (float)i;
	for (int s = 0; s < 2; s++) {
		struct stage st;
		CHECK(stage_init(&st, &m, be(), &cut, s, 2, 4, 1) == 0);
		unsigned char *mine = xmalloc((size_t)st.n_params);
		size_t numel = st.numel, dropped = 0;
		for (int k = 0; k < st.n_params; k++) {
			int e = model_param_expert(&m, &m.params[st.params[k].global]);
			mine[k] = e < 0 || e >= 2; /* experts [2, 4) */
			dropped += mine[k] ? 0 : m.params[st.params[k].global].numel;
		}
		CHECK(stage_hold_weights(&st, mine) == 0);
		CHECK(st.numel == numel && st.wnumel == numel - dropped && dropped > 0);
		CHECK(st.w_e0 == 2 && st.w_e1 == 4);
		size_t at = 0;
		for (int k = 0; k < st.n_params; k++) {
			CHECK(st.params[k].woffset == (mine[k] ? at : (size_t)-1));
			at += mine[k] ? m.params[st.params[k].global].numel : 0;
		}
		float *arena = xmalloc(st.wnumel * sizeof(float));
		stage_gather(&st, arena, global);
		for (int k = 0; k < st.n_params; k++) {
			const struct param_info *p = &m.params[st.params[k].global];
			if (mine[k])
				CHECK(!memcmp(arena + st.params[k].woffset, global + p->offset,
					      p->numel * sizeof(float)));
			/* the held block of a layer starts at expert 2's fcw */
			if (!strcmp(p->name + 4, "experts.2.fcw"))
				CHECK(arena[st.params[k].woffset] == (float)p->offset);
		}
		for (size_t i = 0; i < m.numel; i++)
			back[i] = -1.0f;
		stage_scatter(&st, back, arena);
		for (int k = 0; k < st.n_params; k++) {
			const struct param_info *p = &m.params[st.params[k].global];
			if (st.params[k].tied_copy)
				continue;
			CHECK(mine[k] ? !memcmp(back + p->offset, global + p->offset,
						p->numel * sizeof(float))
				      : back[p->offset] == -1.0f);
		}
		free(arena);
		stage_free(&st);
		/* refused: a dense tensor left out; experts 0 and 2 (no range) */
		CHECK(stage_init(&st, &m, be(), &cut, s, 2, 4, 1) == 0);
		for (int k = 0; k < st.n_params; k++)
			mine[k] = k != 1;
		CHECK(model_param_expert(&m, &m.params[st.params[1].global]) < 0);
		CHECK(stage_hold_weights(&st, mine) == -1);
		for (int k = 0; k < st.n_params; k++) {
			int e = model_param_expert(&m, &m.params[st.params[k].global]);
			mine[k] = e < 0 || e % 2 == 0;
		}
		CHECK(stage_hold_weights(&st, mine) == -1);
		/* refused: no expert of its MoE layers ((0, 0) would read as all) */
		int moe_layers = 0;
		for (int k = 0; k < st.n_params; k++) {
			int e = model_param_expert(&m, &m.params[st.params[k].global]);
			mine[k] = e < 0;
			moe_layers |= e >= 0;
		}
		if (moe_layers) {
			CHECK(stage_hold_weights(&st, mine) == -1);
			CHECK(strstr(last_error(), "none of its MoE layers' experts"));
		}
		stage_free(&st);
		free(mine);
	}
	free(global);
	free(back);
	cut_free(&cut);
	model_free(&m);
}

/* ---- sampling ---- */

TEST(logits_at_matches_loss)
{
	struct model_config c = tiny(ARCH_LLAMA, 0);
	struct run r, r1;
	float *logits, *full;
	const int B = 2, T = 8, pos = 5;
	NEED_BACKEND();
	CHECK(run_open(&r, &c, B, T, 21) == 0);
	perturb(&r.m, r.params, 22, 4.0f);
	logits = xmalloc((size_t)B * r.m.cfg.Vp * 4);
	full = xmalloc((size_t)B * r.m.cfg.Vp * 4);
	model_logits_at(&r.st, r.params, r.tok, pos, full);
	/* causal: tokens after pos do not change the logits at pos */
	for (int b = 0; b < B; b++)
		for (int t = pos + 1; t < T; t++)
			r.tok[b * T + t] = (r.tok[b * T + t] + 1) % c.V;
	model_logits_at(&r.st, r.params, r.tok, pos, logits);
	for (int i = 0; i < B * r.m.cfg.Vp; i++)
		CHECK_NEAR(logits[i], full[i], 1e-5 * (1 + fabs(full[i])));
	/* and they are the logits the loss uses: one sequence of length pos+1
	 * with one target at the end agrees with -log softmax at pos */
	CHECK(run_open(&r1, &c, 1, 1, 23) == 0);
	memcpy(r1.params, r.params, r.m.numel * 4);
	{
		float l, m = -INFINITY;
		double sum = 0;
		model_logits_at(&r1.st, r1.params, r1.tok, 0, logits);
		for (int v = 0; v < c.V; v++)
			m = fmaxf(m, logits[v]);
		for (int v = 0; v < c.V; v++)
			sum += exp(logits[v] - m);
		l = run_loss(&r1);
		CHECK_NEAR(l, log(sum) + m - logits[r1.tgt[0]], 1e-5);
	}
	run_close(&r1);
	run_close(&r);
	free(logits);
	free(full);
}
