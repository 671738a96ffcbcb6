/* test_backward_split.c - the split backward of zero-bubble schedules
 * (model.h: stage_backward_input B, stage_backward_weight W) against the
 * fused stage_backward: for gpt2, llama and llama with experts (softmax
 * and sigmoid routers, with and without the shared expert), tied and
 * untied, f32 and bf16 activations, on the first, middle and last stage
 * of two 3-stage cuts (1,2,1 and 0,4,0) and on the whole model as one stage, two micro-batches
 * in the orders F0 F1 B0 B1 W0 W1, F0 B0 F1 B1 W0 W1, F0 F1 B0 W0 B1 W1
 * and F0 B0 F1 W0 B1 W1 leave every parameter gradient, the input
 * gradients, the losses and the grads_done reports the same bits as the
 * same orders fused (without the W's). The gradients start from random
 * values, not zero, so that the order in which the micro-batches'
 * contributions are added shows: W1 before W0 must differ (checked, so
 * the comparison can fail). Each with the head's gradient in the forward
 * and in W (SPLIT_HEAD). Runs on
 * test_backend() (the CPU unless ASYNCPP_TEST_DEVICE says otherwise;
 * experts are CPU-only). split_ops: each backend op called in parts, as B
 * and W call it, against the one call (tests/split_ops.h). */
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../model/model.h"
#include "../split_ops.h"
#include "../test.h"

enum { B_ = 2, T_ = 8, M_ = 2, L_ = 4, MAX_REPORTS = 64 };

/* What grads_done reported, in order. */
struct reports {
	size_t lo[MAX_REPORTS], n[MAX_REPORTS];
	int count;
};

static void record(void *ctx, size_t lo, size_t n)
{
	struct reports *r = ctx;
	if (r->count < MAX_REPORTS) {
		r->lo[r->count] = lo;
		r->n[r->count] = n;
	}
	r->count++;
}

static struct model_config tiny(int arch, int tied)
{
	struct model_config c;
	memset(&c, 0, sizeof(c));
	c.arch = arch;
	c.V = 67;
	c.L = L_;
	c.C = 32;
	c.NH = 4;
	c.NKV = arch == ARCH_LLAMA ? 2 : 0;
	c.T = T_;
	c.tied = tied;
	return c;
}

static struct model_config tiny_moe(int router, int K, int shared, int tied)
{
	struct model_config c = tiny(ARCH_LLAMA, tied);
	c.E = 4;
	c.K = K;
	c.De = 24;
	c.shared = shared;
	c.router = router;
	c.aux_coef = 0.5f; /* large, so a lost aux gradient would show */
	c.z_coef = 0.05f;
	return c;
}

static void frand(float *x, size_t n, uint64_t seed, float scale)
{
	uint64_t s = seed;
	for (size_t i = 0; i < n; i++)
		x[i] = scale * rng_normal(&s);
}

/* The orders the split backward runs in ("F0 F1 B0 B1 W0 W1": forward of
 * micro-batch 0, ...); the fused backward runs the same without the W's,
 * its B being the whole backward. W's come after their B, other
 * micro-batches' forwards and B's in between, in ascending order. */
static const char *const orders[] = {"F0 F1 B0 B1 W0 W1", "F0 B0 F1 B1 W0 W1",
				     "F0 F1 B0 W0 B1 W1", "F0 B0 F1 W0 B1 W1"};
/* the first order with its W's the other way round: it must differ */
static const char *const reversed_order = "F0 F1 B0 B1 W1 W0";

/* One stage's run; everything it produced. */
struct result {
	float *grads;         /* [numel] */
	void *dx_in[M_];      /* [N*C] act (non-first stages) */
	float loss[M_];
	struct reports rep;
};

struct inputs {
	const float *params;
	const int32_t *tok[M_], *tgt[M_]; /* [B*T] backend memory */
	void *x_in[M_], *dx_out[M_];     /* [B*T*C] act, backend memory */
	const float *grads0;         /* [numel] the gradients before */
};

/* Stage s run in order (orders above), fused (split < 0: B the whole
 * backward, W ignored) or split with stage_split_init(split); its results
 * in r. */
static int run(const struct model *m, const struct backend *be, const struct stage_cut *cut, int s,
	       const struct inputs *in, const char *order, int split, struct result *r)
{
	struct stage st;
	size_t NCb = (size_t)B_ * T_ * m->cfg.C * act_size(be);

	if (stage_init(&st, m, be, cut, s, B_, T_, M_))
		return -1;
	if (split >= 0 && stage_split_init(&st, split)) {
		stage_free(&st);
		return -1;
	}
	st.grads_done = record;
	st.grads_done_ctx = &r->rep;
	r->grads = be->alloc(st.numel * sizeof(float));
	be->copy(r->grads, in->grads0, st.numel * sizeof(float));
	for (int mb = 0; mb < M_; mb++)
		r->dx_in[mb] = be->alloc(NCb);
	void *x_out = be->alloc(NCb);
	for (const char *o = order; o[0] && o[1]; o += o[2] ? 3 : 2) {
		int mb = o[1] - '0';
		void *dx_in = st.has_embed ? NULL : r->dx_in[mb];
		if (o[0] == 'F')
			stage_forward(&st, mb, in->params, in->tok[mb], in->x_in[mb],
				      st.has_head ? in->tgt[mb] : NULL, st.has_head ? NULL : x_out,
				      st.has_head ? &r->loss[mb] : NULL, NULL, r->grads, 1.0f / M_);
		else if (o[0] == 'B' && split >= 0)
			stage_backward_input(&st, mb, in->params, in->dx_out[mb], dx_in);
		else if (o[0] == 'B')
			stage_backward(&st, mb, in->params, r->grads, in->dx_out[mb], dx_in);
		else if (o[0] == 'W' && split >= 0)
			stage_backward_weight(&st, mb, in->params, r->grads);
	}
	stage_finish_grads(&st, r->grads);
	be->free(x_out);
	stage_free(&st);
	return 0;
}

static void result_free(const struct backend *be, struct result *r)
{
	be->free(r->grads);
	for (int mb = 0; mb < M_; mb++)
		be->free(r->dx_in[mb]);
}

/* Whether a and b hold the same bits; names the first tensor that
 * differs in what (when it is non-NULL). */
static int same(const struct model *m, const struct stage *st, const struct backend *be,
		const struct result *a, const struct result *b, char *what, size_t len)
{
	size_t NCb = (size_t)B_ * T_ * m->cfg.C * act_size(be);
	size_t n = st->numel * sizeof(float);
	float *ga = xmalloc(n), *gb = xmalloc(n);
	int ok = 1;

	be->to_host(ga, a->grads, n);
	be->to_host(gb, b->grads, n);
	for (int i = 0; i < st->n_params && ok; i++) {
		const struct param_info *p = &m->params[st->params[i].global];
		size_t o = st->params[i].offset;
		if (memcmp(ga + o, gb + o, p->numel * sizeof(float))) {
			snprintf(what, len, "gradient of %s%s", p->name,
				 st->params[i].tied_copy ? " (tied copy)" : "");
			ok = 0;
		}
	}
	free(ga);
	free(gb);
	for (int mb = 0; mb < M_ && ok && !st->has_embed; mb++) {
		char *xa = xmalloc(NCb), *xb = xmalloc(NCb);
		be->to_host(xa, a->dx_in[mb], NCb);
		be->to_host(xb, b->dx_in[mb], NCb);
		if (memcmp(xa, xb, NCb)) {
			snprintf(what, len, "input gradient of micro-batch %d", mb);
			ok = 0;
		}
		free(xa);
		free(xb);
	}
	for (int mb = 0; mb < M_ && ok && st->has_head; mb++)
		if (memcmp(&a->loss[mb], &b->loss[mb], sizeof(float))) {
			snprintf(what, len, "loss of micro-batch %d", mb);
			ok = 0;
		}
	if (ok && (a->rep.count != b->rep.count ||
		   memcmp(a->rep.lo, b->rep.lo, sizeof(a->rep.lo)) ||
		   memcmp(a->rep.n, b->rep.n, sizeof(a->rep.n)))) {
		snprintf(what, len, "grads_done reports (%d vs %d)", a->rep.count, b->rep.count);
		ok = 0;
	}
	return ok;
}

/* Stage s of cut (NULL: the whole model) on be: split == fused in both
 * orders, and W in reverse order differs. */
static void check_stage(const struct model *m, const struct backend *be,
			const struct stage_cut *cut, int s, const float *params, const char *name)
{
	struct stage st;
	struct inputs in;
	size_t NC = (size_t)B_ * T_ * m->cfg.C;
	uint64_t seed = 1000 + (uint64_t)s;

	if (stage_init(&st, m, be, cut, s, B_, T_, 1)) {
		CHECK_MSG(0, "%s: stage %d: stage_init failed", name, s);
		return;
	}
	memset(&in, 0, sizeof(in));
	/* the stage's weights, gradients from an earlier step's micro-batches */
	float *p = xmalloc(st.numel * sizeof(float)), *g0 = xmalloc(st.numel * sizeof(float));
	float *pd = be->alloc(st.numel * sizeof(float)), *g0d = be->alloc(st.numel * sizeof(float));
	stage_gather(&st, p, params);
	frand(g0, st.numel, seed, 0.01f);
	be->to_device(pd, p, st.numel * sizeof(float));
	be->to_device(g0d, g0, st.numel * sizeof(float));
	in.params = pd;
	in.grads0 = g0d;
	float *f = xmalloc(NC * sizeof(float));
	int32_t tok[M_][B_ * T_], tgt[M_][B_ * T_], *tokd[M_], *tgtd[M_];
	for (int mb = 0; mb < M_; mb++) {
		uint64_t r = rng_mix(seed, mb);
		for (int i = 0; i < B_ * T_; i++) {
			tok[mb][i] = (int32_t)(rng_next(&r) % (uint64_t)m->cfg.V);
			tgt[mb][i] = (int32_t)(rng_next(&r) % (uint64_t)m->cfg.V);
		}
		tokd[mb] = be->alloc(sizeof(tok[mb]));
		tgtd[mb] = be->alloc(sizeof(tgt[mb]));
		be->to_device(tokd[mb], tok[mb], sizeof(tok[mb]));
		be->to_device(tgtd[mb], tgt[mb], sizeof(tgt[mb]));
		in.tok[mb] = tokd[mb];
		in.tgt[mb] = tgtd[mb];
		in.x_in[mb] = be->alloc(NC * act_size(be));
		in.dx_out[mb] = be->alloc(NC * act_size(be));
		float *fd = be->alloc(NC * sizeof(float));
		frand(f, NC, seed + 10 + mb, 1.0f);
		be->to_device(fd, f, NC * sizeof(float));
		be->act_from_f32(in.x_in[mb], fd, NC);
		frand(f, NC, seed + 20 + mb, 0.01f);
		be->to_device(fd, f, NC * sizeof(float));
		be->act_from_f32(in.dx_out[mb], fd, NC);
		be->free(fd);
	}
	free(f);

	/* the head in the forward (flags 0) and in W (SPLIT_HEAD) */
	for (int flags = 0; flags <= SPLIT_HEAD; flags += SPLIT_HEAD) {
		/* a last stage of the head alone has no W when the head is the
		 * forward's, so nothing for the reversed round to tell apart */
		int has_w = st.layer_end > st.layer_begin || st.has_embed ||
			    (st.has_head && flags);
		for (size_t k = 0; k < ARRAY_SIZE(orders) + has_w; k++) {
			/* the last round: the reversed W's must differ */
			int rev = k == ARRAY_SIZE(orders);
			const char *order = rev ? reversed_order : orders[k];
			struct result fused, split;
			char what[160] = "";
			memset(&fused, 0, sizeof(fused));
			memset(&split, 0, sizeof(split));
			if (run(m, be, cut, s, &in, order, -1, &fused) ||
			    run(m, be, cut, s, &in, order, flags, &split)) {
				CHECK_MSG(0, "%s: stage %d: a run failed", name, s);
				break;
			}
			if (!rev)
				CHECK_MSG(same(m, &st, be, &fused, &split, what, sizeof(what)),
					  "%s, stage %d of %d%s, %s: split differs from fused: %s",
					  name, s, cut ? cut->S : 1, flags ? ", head split" : "",
					  order, what);
			else /* the comparison sees the order of the W's (the input
			      * gradients and losses do not depend on it, the
			      * parameter gradients do) */
				CHECK_MSG(!same(m, &st, be, &fused, &split, what, sizeof(what)),
					  "%s, stage %d%s: %s gave the fused bits", name, s,
					  flags ? ", head split" : "", order);
			/* and the backward did something */
			float *gh = xmalloc(st.numel * sizeof(float));
			be->to_host(gh, fused.grads, st.numel * sizeof(float));
			CHECK_MSG(memcmp(gh, g0, st.numel * sizeof(float)) != 0, "%s: no gradient",
				  name);
			free(gh);
			result_free(be, &fused);
			result_free(be, &split);
		}
	}
	for (int mb = 0; mb < M_; mb++) {
		be->free(in.x_in[mb]);
		be->free(in.dx_out[mb]);
		be->free(tokd[mb]);
		be->free(tgtd[mb]);
	}
	be->free(pd);
	be->free(g0d);
	free(p);
	free(g0);
	stage_free(&st);
}

/* Every stage of the 3-stage cuts 1,2,1 and 0,4,0 (a first stage of the
 * embeddings alone, a last of the head alone) and the whole model, on be. */
static void check_model(struct model_config c, const struct backend *be, const char *name)
{
	struct model m;
	struct stage_cut cut;
	static const int counts[2][3] = {{1, 2, 1}, {0, 4, 0}};

	if (!be)
		SKIP("no such backend");
	if (c.E && !backend_has_moe(be))
		SKIP("the backend has no mixture-of-experts ops");
	CHECK(model_init(&m, &c) == 0);
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 7);
	/* norm weights and biases away from 1 and 0 */
	for (int i = 0; i < m.n_params; i++) {
		uint64_t r = rng_mix(8, i);
		if (m.params[i].cols == 0)
			for (size_t j = 0; j < m.params[i].numel; j++)
				params[m.params[i].offset + j] += 0.2f * rng_normal(&r);
	}
	check_stage(&m, be, NULL, 0, params, name);
	for (int k = 0; k < 2; k++) {
		CHECK(cut_from_counts(&cut, c.L, counts[k], 3) == 0);
		for (int s = 0; s < 3; s++)
			check_stage(&m, be, &cut, s, params, name);
		cut_free(&cut);
	}
	free(params);
	model_free(&m);
}

static const struct backend *f32(void)
{
	return backend_with_act_dtype(test_backend(), ACT_F32);
}

static const struct backend *bf16(void)
{
	return backend_with_act_dtype(test_backend(), ACT_BF16);
}

TEST(split_backward_gpt2_tied_f32) { check_model(tiny(ARCH_GPT2, 1), f32(), "gpt2 tied f32"); }
TEST(split_backward_gpt2_untied_f32) { check_model(tiny(ARCH_GPT2, 0), f32(), "gpt2 untied f32"); }
TEST(split_backward_gpt2_tied_bf16) { check_model(tiny(ARCH_GPT2, 1), bf16(), "gpt2 tied bf16"); }
TEST(split_backward_gpt2_untied_bf16)
{
	check_model(tiny(ARCH_GPT2, 0), bf16(), "gpt2 untied bf16");
}
TEST(split_backward_llama_tied_f32) { check_model(tiny(ARCH_LLAMA, 1), f32(), "llama tied f32"); }
TEST(split_backward_llama_untied_f32)
{
	check_model(tiny(ARCH_LLAMA, 0), f32(), "llama untied f32");
}
TEST(split_backward_llama_tied_bf16)
{
	check_model(tiny(ARCH_LLAMA, 1), bf16(), "llama tied bf16");
}
TEST(split_backward_llama_untied_bf16)
{
	check_model(tiny(ARCH_LLAMA, 0), bf16(), "llama untied bf16");
}
/* experts: softmax top-2 with the shared expert, sigmoid top-1 with it
 * (tied), sigmoid top-2 without (no d(res3) kept) */
TEST(split_backward_moe_f32)
{
	check_model(tiny_moe(ROUTER_SOFTMAX, 2, 1, 0), f32(), "moe softmax top-2 shared f32");
	check_model(tiny_moe(ROUTER_SIGMOID, 1, 1, 1), f32(), "moe sigmoid top-1 shared tied f32");
	check_model(tiny_moe(ROUTER_SIGMOID, 2, 0, 0), f32(), "moe sigmoid top-2 f32");
}
TEST(split_backward_moe_bf16)
{
	check_model(tiny_moe(ROUTER_SOFTMAX, 2, 1, 1), bf16(), "moe softmax top-2 shared bf16");
	check_model(tiny_moe(ROUTER_SIGMOID, 2, 1, 0), bf16(), "moe sigmoid top-2 shared bf16");
	check_model(tiny_moe(ROUTER_SIGMOID, 1, 0, 0), bf16(), "moe sigmoid top-1 bf16");
}

/* stage_split_init grows each slot by what stage_split_bytes predicts (a
 * second call with the same flags changes nothing, with others it is
 * refused), with and without SPLIT_HEAD. */
TEST(split_backward_memory_accounting)
{
	struct model_config c = tiny(ARCH_GPT2, 1);
	struct model m;
	struct stage st;
	struct stage_cut cut;
	int counts[3] = {1, 2, 1};

	CHECK(model_init(&m, &c) == 0);
	CHECK(cut_from_counts(&cut, c.L, counts, 3) == 0);
	for (int flags = 0; flags <= SPLIT_HEAD; flags += SPLIT_HEAD)
		for (int s = 0; s < 3; s++) {
			CHECK(stage_init(&st, &m, f32(), &cut, s, B_, T_, 2) == 0);
			size_t before = st.act_bytes_per_slot;
			size_t want = stage_split_bytes(&m, &cut, s, B_, T_, act_size(f32()), flags);
			CHECK(stage_split_init(&st, flags) == 0 && stage_split_init(&st, flags) == 0);
			CHECK(st.split_bytes_per_slot == want && st.act_bytes_per_slot == before + want);
			/* a stage without the head ignores SPLIT_HEAD; the head's
			 * stage refuses to change its mind */
			CHECK((stage_split_init(&st, flags ^ SPLIT_HEAD) == 0) == (s < 2));
			CHECK(s < 2 || strstr(last_error(), "the split backward is set up already"));
			/* per layer: 4 N*C + N*F + N*QKV; stage 0 one N*C more; the
			 * head split: the targets and one N*C more */
			size_t N = B_ * T_, per_layer = (4 * N * c.C + N * m.cfg.F + N * 3 * c.C) * 4;
			size_t expect = (size_t)counts[s] * per_layer + (s == 0 ? N * c.C * 4 : 0) +
					(s == 2 && flags ? 64 + N * c.C * 4 : 0);
			CHECK_MSG(want == expect, "stage %d, flags %d: %zu bytes kept, expected %zu", s,
				  flags, want, expect);
			stage_free(&st);
		}
	cut_free(&cut);
	model_free(&m);
}

/* Each op's parts against the one call, f32 and bf16 activations, shapes
 * whose rows and columns are not multiples of anything. */
TEST(split_backward_ops)
{
	static const int shapes[][3] = {{16, 32, 96}, {37, 77, 100}, {5, 31, 8}};
	const struct backend *tables[2] = {f32(), bf16()};
	for (int k = 0; k < 2; k++)
		for (size_t i = 0; i < ARRAY_SIZE(shapes); i++) {
			const char *bad = split_ops_check(tables[k], shapes[i][0], shapes[i][1],
							  shapes[i][2], 11 + i);
			CHECK_MSG(!bad, "%s %s N=%d C=%d OC=%d: %s", tables[k]->name,
				  k ? "bf16" : "f32", shapes[i][0], shapes[i][1], shapes[i][2],
				  bad);
		}
}
