/* test_plan_memory.c - bench plan's memory of a GPU (cmd/bench_plan_mem.h)
 * is what a run allocates: for the tiny models (gpt2, llama, moe), every
 * schedule at S = 2 and 4 (interleaved and zb-v as S x 2 pieces), a
 * stage's planned weights, gradients, optimizer bytes and activations
 * (slots x one micro-batch + scratch) equal, to the byte, what the
 * trainer's workers of that stage hold (the figures bench train's memory
 * table sums: numel x versions, the accumulators, optim_bytes,
 * act_bytes_per_slot x n_slots + scratch_bytes), and the sizing of
 * model/ and optim/ (stage_size, optim_size) equals stage_init's and
 * optim_init's; with expert parallelism over 2 replicas, the optimizer
 * of replica 0's stage holds only its experts' state. On CUDA
 * (ASYNCPP_TEST_DEVICE) the bf16 weight copies count too; the mixtures
 * run on the CPU only. */
#include <stdlib.h>
#include <string.h>

#include "../../cmd/bench_plan_mem.h"
#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../../optim/optim.h"
#include "../../sched/schedule.h"
#include "../../sched/trainer.h"
#include "../test.h"
#include "../tiny_model.h"

static void set(struct config *cfg, const char *section, const char *key, const char *value)
{
	if (config_set_key(cfg, section, key, value, "test"))
		die("test: cannot set %s.%s", section, key);
}

/* Replica 0's workers of stage s (its pieces) against the plan. */
static void check_stage(const struct trainer *tr, const struct model *m, const struct config *cfg,
			const struct schedule *sc, int s, long ep, const char *what)
{
	double w = 0, c = 0, g = 0, o = 0, a = 0;
	for (int q = 0; q < tr->S; q++) {
		const struct stage_worker *wk = &tr->w[q];
		if (tr->piece_stage[q] != s)
			continue;
		double bytes = (double)wk->st.numel * sizeof(float);
		w += (double)wk->st.wnumel * sizeof(float) * wk->n_versions;
		c += tr->be->weights_bf16 ? (double)wk->st.wnumel * 2 * wk->n_versions : 0;
		g += bytes * (wk->grads[1] != wk->grads[0] ? 2 : 1);
		o += (double)optim_bytes(&wk->opt);
		a += (double)wk->st.act_bytes_per_slot * wk->st.n_slots +
		     (double)wk->st.scratch_bytes;
	}
	/* the CPU backend, or CUDA's (ASYNCPP_TEST_DEVICE=cuda): bench plan
	 * takes CUDA's bf16 copies, fused norm backward and batched
	 * Newton-Schulz together */
	struct plan_device dev = {tr->be->act_dtype, tr->be->weights_bf16 != NULL};
	CHECK((tr->be->norm_backward_add != NULL) == dev.cuda);
	CHECK((tr->be->newton_schulz_many != NULL) == dev.cuda);
	struct plan_mem pm;
	CHECK(plan_stage_memory(m, cfg, sc, s, tr->B, tr->T, &dev, ep, &pm) == 0);
	if (pm.weights != w || pm.grads != g || pm.optim != o || pm.acts != a || pm.copies != c)
		printf("  %s stage %d: planned %.0f %.0f %.0f %.0f, built %.0f %.0f %.0f %.0f\n",
		       what, s, pm.weights, pm.grads, pm.optim, pm.acts, w, g, o, a);
	CHECK(pm.weights == w);
	CHECK(pm.grads == g);
	CHECK(pm.optim == o);
	CHECK(pm.acts == a);
	CHECK(pm.copies == c);
}

static void check(const char *arch, const char *optim, const char *kind, int S, long ep,
		  const char *act)
{
	char what[128], n[16];
	snprintf(what, sizeof(what), "%s %s %s S=%d ep=%ld %s", arch, optim, kind, S, ep, act);
	struct config cfg;
	tiny_config(&cfg, arch, optim);
	snprintf(n, sizeof(n), "%d", S);
	set(&cfg, "pipeline", "stages", n);
	set(&cfg, "pipeline", "split", "even");
	set(&cfg, "train", "schedule", kind);
	set(&cfg, "train", "act_dtype", act);
	set(&cfg, "pipeline", "micro_batches", "8");
	if (!strcmp(kind, "interleaved")) /* bench plan's interleaved/2 */
		set(&cfg, "pipeline", "virtual_stages", "2");
	if (ep > 1) {
		set(&cfg, "pipeline", "data_parallel", "2");
		set(&cfg, "model", "expert_parallel", "2");
	}
	CHECK(config_finish(&cfg) == 0);
	static uint32_t tok[4096];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	struct model m;
	struct trainer tr;
	CHECK(dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), TINY_VOCAB,
				     (int)cfg.train_batch_size, (int)cfg.model_seq_len, 7, 1) == 0);
	CHECK(tiny_model(&m, &cfg) == 0);
	const struct backend *be = backend_with_act_dtype(test_backend(),
							  strcmp(act, "bf16") ? ACT_F32 : ACT_BF16);
	CHECK(be != NULL);
	if (trainer_init(&tr, &cfg, &m, be, NULL, &dl)) {
		CHECK(!"trainer_init");
		printf("  %s\n", what);
	} else {
		int k = sched_kind_from_name(kind);
		char err[256];
		struct schedule *sc = sched_build_virtual(k, tr.stages, tr.mb_per_replica, tr.V,
							  sched_kind_async(k) ? 6 : 1, 0, err,
							  sizeof(err));
		CHECK(sc != NULL);
		CHECK(sc->S * sc->V == tr.S);
		for (int s = 0; sc && s < sc->S; s++)
			check_stage(&tr, &m, &cfg, sc, s, ep, what);
		sched_free(sc);
	}
	trainer_free(&tr);
	model_free(&m);
	dataloader_close(&dl);
	config_free(&cfg);
}

TEST(plan_memory_every_schedule)
{
	/* the chunked kinds cut the 4 layers into S x 2 pieces: S = 2 only */
	static const struct {
		const char *kind;
		int max_S;
	} kinds[] = {{"1f1b", 4}, {"interleaved", 2}, {"zb-h1", 4}, {"zb-v", 2}, {"2bw", 4},
		     {"2bw-zb", 4}, {"gpipe", 4}};
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++)
		for (int S = 2; S <= kinds[k].max_S; S += 2) {
			check("gpt2", "adamw", kinds[k].kind, S, 1, "f32");
			check("llama", "muon", kinds[k].kind, S, 1, "bf16");
		}
}

TEST(plan_memory_moe_and_optimizers)
{
	if (!backend_has_moe(test_backend()))
		SKIP("the backend has no mixture-of-experts ops");
	check("moe", "adamw", "1f1b", 2, 1, "f32");
	check("moe", "adamw", "2bw", 2, 1, "f32");
	check("moe", "normuon", "zb-h1", 2, 1, "bf16");
	check("gpt2", "soap", "1f1b", 2, 1, "f32");
	check("gpt2", "adan", "2bw", 2, 1, "f32");
}

/* replica 0 owns experts [0, E/2): its optimizer keeps only their state */
TEST(plan_memory_expert_parallel)
{
	if (!backend_has_moe(test_backend()))
		SKIP("the backend has no mixture-of-experts ops");
	check("moe", "adamw", "1f1b", 2, 2, "f32");
	check("moe", "muon", "2bw", 2, 2, "f32");
}



/* Hand-computed: GPT-2 of 4 layers of width 64 over a 1000-token vocabulary
 * (64-padded: 1024), context 32, tied head, cut in 4 stages. A layer holds
 * 12 C^2 + 13 C floats (qkv 3C^2 + 3C, proj C^2 + C, fc 4C^2 + 4C, fcproj
 * 4C^2 + C, two norms 4C); stage 0 also wte (1024 C) and wpe (32 C), the
 * last stage lnf (2C) and its tied copy of wte. On the CUDA backend each
 * version has a bf16 copy; 2bw keeps two versions; two accumulators. */
TEST(plan_memory_hand_computed_dense_s4)
{
	struct model_config mc = {.arch = ARCH_GPT2, .V = 1000, .L = 4, .C = 64, .NH = 1, .T = 32,
				  .tied = 1};
	struct model m;
	CHECK(model_init(&m, &mc) == 0);
	struct config cfg;
	config_defaults(&cfg);
	CHECK(config_finish(&cfg) == 0);
	const double layer = 12 * 64 * 64 + 13 * 64;
	const double numel[4] = {1024 * 64 + 32 * 64 + layer, layer, layer,
				 layer + 2 * 64 + 1024 * 64};
	CHECK(numel[0] == 117568 && numel[3] == 115648);
	struct plan_device dev = {ACT_BF16, 1};
	static const int kinds[] = {SCHED_1F1B, SCHED_2BW};
	for (int k = 0; k < 2; k++) {
		char err[256];
		struct schedule *sc = sched_build_virtual(kinds[k], 4, 8, 1, k ? 6 : 1, 0, err,
							  sizeof(err));
		CHECK(sc != NULL);
		int versions = k ? 2 : 1;
		for (int s = 0; s < 4; s++) {
			struct plan_mem pm;
			CHECK(plan_stage_memory(&m, &cfg, sc, s, 1, 32, &dev, 1, &pm) == 0);
			CHECK(pm.weights == numel[s] * 4 * versions);
			CHECK(pm.copies == numel[s] * 2 * versions);
			CHECK(pm.grads == numel[s] * 4 * 2);
		}
		sched_free(sc);
	}
	config_free(&cfg);
	model_free(&m);
}
