/* test_equivalence.c - the equivalences of DESIGN.md, bit for bit.
 *
 * Each test trains a tiny model twice in two configurations that must
 * compute the same thing and compares every step's loss with memcmp:
 *   sync pipeline (gpipe, 1f1b; S = 2, 4)  == one worker, same micro-batching
 *   2bw (S = 2, 4)                          == one worker with delay = 1
 *   pipedream (S = 4)                       == one worker, per-stage delay
 *   2bw + error feedback                    == delay = 1 + error feedback
 *   delay = 0                               == no delay
 *   ef with lambda = 0                      == no correction
 *   2bw / pipedream + weight prediction     == delay 1 / per-stage + prediction
 *   train N                                 == train K, checkpoint, resume, N - K
 * for both architectures (and llama with mixture-of-experts layers: 4
 * experts, top-2, a shared expert, "moe" below; its router statistics of
 * every step must agree too) and for AdamW and Muon, over 20 steps, on the
 * even cut and on uneven ones (pipeline.layers = 3,1 / 1,3 / 0,3,1 /
 * 1,2,1,0: stages without a layer at either end), on the
 * backend ASYNCPP_TEST_DEVICE names (cpu by default; tools/gpu-check runs
 * them on cuda). The bf16_* tests run the schedule equivalences and resume
 * again with train.act_dtype = bf16 (activations stored as bf16), skipped
 * on a backend without bf16 storage.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/formats/checkpoint.h"
#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../../sched/trainer.h"
#include "../test.h"
#include "../tiny_model.h"

#define STEPS 20
#define VOCAB TINY_VOCAB

#define MAX_E 8

struct run_result {
	double loss[STEPS];
	/* MoE: step_stats' balance, z-loss and expert_tokens (0 when dense) */
	double moe[STEPS][2 + MAX_E];
	int skipped; /* steps whose update was skipped (norm not finite) */
	double val[STEPS]; /* with eval_each_chunk: trainer_eval after each chunk */
	float *weights; /* final newest weights, global arena */
	size_t numel;
};

/* tests/tiny_model.h's model and optimizer (arch gpt2, llama or moe),
 * finished. */
static void base_config(struct config *cfg, const char *arch, const char *optim)
{
	tiny_config(cfg, arch, optim);
	config_finish(cfg); /* the optimizer's own betas */
}

/* pipeline.split = layers with pipeline.layers = list, and as many stages
 * as it lists. */
static void set_cut(struct config *cfg, const char *list)
{
	char n[16];
	int stages = 1;
	for (const char *p = list; *p; p++)
		stages += *p == ',';
	snprintf(n, sizeof(n), "%d", stages);
	config_set_key(cfg, "pipeline", "split", "layers", "test");
	config_set_key(cfg, "pipeline", "layers", list, "test");
	config_set_key(cfg, "pipeline", "stages", n, "test");
}

/* Uneven cuts of the 4 layers of base_config. */
static const char *const uneven[] = {"3,1", "1,3", "0,3,1", "1,2,1,0"};


/* the model pieces (workers per replica) of train()'s last trainer */
static int last_pieces;

/* when set, train() below runs on this table instead of test_backend() */
static const struct backend *train_with;

/* Train `steps` steps (in chunks of `chunk`) under cfg, optionally resuming
 * from checkpoint `resume_from`, optionally saving to `save_to` at the end.
 * Losses go to r->loss[first_step ...]. */
/* train() evaluates 2 batches after each chunk of steps (run_result.val) */
static int eval_each_chunk;

static int train(const struct config *cfg, int steps, int chunk, const char *resume_from,
		 const char *save_to, struct run_result *r)
{
	static uint32_t tok[20000];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	if (dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, (int)cfg->train_batch_size,
				   (int)cfg->model_seq_len, 7, 1))
		return -1;
	struct model m;
	if (tiny_model(&m, cfg)) {
		dataloader_close(&dl);
		return -1;
	}
	const struct backend *be = train_with ? train_with : test_backend();
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	struct trainer tr;
	int rc = -1, inited = 0;
	if (!strcmp(cfg->train_act_dtype, "bf16") && !(be = backend_with_act_dtype(be, ACT_BF16)))
		goto out;
	if (trainer_init(&tr, cfg, &m, be, params, &dl))
		goto out;
	inited = 1;
	if (resume_from) {
		struct ckpt *k;
		if (ckpt_open(&k, resume_from))
			goto out;
		int bad = trainer_load(&tr, k);
		ckpt_close(k);
		if (bad)
			goto out;
	}
	long first = tr.step;
	last_pieces = tr.S;
	struct step_stats st[STEPS];
	for (int done = 0; done < steps;) {
		int n = MIN(chunk, steps - done);
		if (trainer_run(&tr, n, st))
			goto out;
		if (eval_each_chunk)
			r->val[first + done + n - 1] = trainer_eval(&tr, &dl, 2);
		for (int i = 0; i < n; i++) {
			double *moe = r->moe[first + done + i];
			r->loss[first + done + i] = st[i].loss;
			r->skipped += st[i].skipped;
			moe[0] = st[i].moe_balance;
			moe[1] = st[i].moe_z;
			for (int e = 0; e < m.cfg.E && e < MAX_E; e++)
				moe[2 + e] = st[i].expert_tokens[e];
		}
		done += n;
	}
	r->numel = m.numel;
	free(r->weights);
	r->weights = xmalloc(m.numel * sizeof(float));
	trainer_gather_weights(&tr, 0, r->weights);
	rc = 0;
	if (save_to) {
		char *text = config_to_string(cfg);
		rc = trainer_save(&tr, save_to, text, NULL);
		free(text);
	}
out: /* every way out frees what was made (a refused resume too) */
	if (inited)
		trainer_free(&tr);
	model_free(&m);
	free(params);
	dataloader_close(&dl);
	return rc;
}

/* Run a and b, compare all losses and the final weights bit for bit. */
static int same_run(const char *what, const struct config *a, const struct config *b)
{
	struct run_result ra = {0}, rb = {0};
	int ok = !train(a, STEPS, 5, NULL, NULL, &ra) && !train(b, STEPS, 5, NULL, NULL, &rb);
	if (!ok) {
		test_fail(__FILE__, __LINE__, "%s: training failed: %s", what, last_error());
		return 0;
	}
	for (int i = 0; i < STEPS; i++)
		if (memcmp(&ra.loss[i], &rb.loss[i], sizeof(double))) {
			test_fail(__FILE__, __LINE__, "%s: step %d loss %.9g != %.9g", what, i + 1,
				  ra.loss[i], rb.loss[i]);
			ok = 0;
			break;
		}
	if (ok && memcmp(ra.weights, rb.weights, ra.numel * sizeof(float))) {
		test_fail(__FILE__, __LINE__, "%s: final weights differ", what);
		ok = 0;
	}
	for (int i = 0; ok && i < STEPS; i++)
		if (memcmp(ra.moe[i], rb.moe[i], sizeof(ra.moe[i]))) {
			test_fail(__FILE__, __LINE__, "%s: step %d: the router statistics differ "
				  "(balance %.9g, %.9g)", what, i + 1, ra.moe[i][0], rb.moe[i][0]);
			ok = 0;
		}
	/* the runs must have trained: a constant loss would make this vacuous */
	if (ok && !(ra.loss[STEPS - 1] < ra.loss[0] - 0.02)) {
		test_fail(__FILE__, __LINE__, "%s: loss did not fall (%.4f -> %.4f)", what, ra.loss[0],
			  ra.loss[STEPS - 1]);
		ok = 0;
	}
	free(ra.weights);
	free(rb.weights);
	return ok;
}

static void check_resume(const char *what, const struct config *cfg_a, const struct config *cfg_b,
			 int k);

static const char *const archs[] = {"llama", "gpt2", "moe"};
static const char *const optims[] = {"adamw", "muon"};

/* The moe runs need the backend's MoE ops (backend.h moe_*: the cpu's and
 * cuda's have them; tools/gpu-check runs every case on cuda). */
static int runs_here(const char *arch)
{
	const struct backend *be = test_backend();
	return strcmp(arch, "moe") || backend_has_moe(be);
}

#define FOR_EACH_ARCH_OPTIM(a, o)                                          \
	for (int ia = 0; ia < (int)ARRAY_SIZE(archs); ia++)                \
		for (int io = 0; io < 2; io++)                             \
			for (const char *a = archs[ia], *o = optims[io]; a && runs_here(a); \
			     a = NULL)

TEST(sync_pipeline_equals_one_worker)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		base_config(&one, arch, opt);
		const char *kinds[] = {"gpipe", "1f1b"};
		const char *stages[] = {"2", "4"};
		for (int k = 0; k < 2; k++)
			for (int s = 0; s < 2; s++) {
				base_config(&pipe, arch, opt);
				config_set_key(&pipe, "train", "schedule", kinds[k], "test");
				config_set_key(&pipe, "pipeline", "stages", stages[s], "test");
				char what[96];
				snprintf(what, sizeof(what), "%s S=%s %s %s", kinds[k], stages[s], arch, opt);
				if (!same_run(what, &one, &pipe))
					return;
				config_free(&pipe);
			}
		config_free(&one);
	}
}

/* The same over uneven cuts, and the balanced one. Each architecture and
 * optimizer takes two of the cuts (every cut meets both schedules), so the
 * suite stays quick. */
#define N_UNEVEN ((int)ARRAY_SIZE(uneven))
TEST(sync_pipeline_equals_one_worker_uneven)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		base_config(&one, arch, opt);
		const char *kinds[] = {"gpipe", "1f1b"};
		int i = 2 * ia + io;
		for (int k = 0; k < 2; k++)
			for (int c = 0; c <= N_UNEVEN; c++) {
				/* cut i for gpipe, i + 1 for 1f1b; balanced on the first */
				if (c < N_UNEVEN ? c != (i + k) % N_UNEVEN : i + k != 0)
					continue;
				base_config(&pipe, arch, opt);
				config_set_key(&pipe, "train", "schedule", kinds[k], "test");
				if (c < (int)ARRAY_SIZE(uneven)) {
					set_cut(&pipe, uneven[c]);
				} else {
					config_set_key(&pipe, "pipeline", "split", "balanced", "test");
					config_set_key(&pipe, "pipeline", "stages", "3", "test");
				}
				char what[96];
				snprintf(what, sizeof(what), "%s layers %s %s %s", kinds[k],
					 c < (int)ARRAY_SIZE(uneven) ? uneven[c] : "balanced", arch, opt);
				if (!same_run(what, &one, &pipe))
					return;
				config_free(&pipe);
			}
		config_free(&one);
	}
}

TEST(twobw_equals_delay_one)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		base_config(&one, arch, opt);
		config_set_key(&one, "train", "delay", "1", "test");
		const char *stages[] = {"2", "4"};
		for (int s = 0; s < 2; s++) {
			base_config(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", "2bw", "test");
			config_set_key(&pipe, "pipeline", "stages", stages[s], "test");
			char what[96];
			snprintf(what, sizeof(what), "2bw S=%s %s %s", stages[s], arch, opt);
			if (!same_run(what, &one, &pipe))
				return;
			config_free(&pipe);
		}
		config_free(&one);
	}
}

TEST(twobw_equals_delay_one_uneven)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		base_config(&one, arch, opt);
		config_set_key(&one, "train", "delay", "1", "test");
		for (int c = 0; c < N_UNEVEN; c++) {
			if (c != (2 * ia + io) % N_UNEVEN && c != (2 * ia + io + 2) % N_UNEVEN)
				continue;
			base_config(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", "2bw", "test");
			set_cut(&pipe, uneven[c]);
			if (c == 0) /* and error feedback once */
				config_set_key(&pipe, "optim", "correction", "ef", "test");
			struct config *ref = &one, ef;
			if (c == 0) {
				config_copy(&ef, &one);
				config_set_key(&ef, "optim", "correction", "ef", "test");
				ref = &ef;
			}
			char what[96];
			snprintf(what, sizeof(what), "2bw%s layers %s %s %s", c ? "" : "+ef", uneven[c],
				 arch, opt);
			int ok = same_run(what, ref, &pipe);
			if (ref != &one)
				config_free(&ef);
			config_free(&pipe);
			if (!ok)
				return;
		}
		config_free(&one);
	}
}

TEST(pipedream_equals_per_stage_delay)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		base_config(&one, arch, opt);
		config_set_key(&one, "train", "delay_mode", "per-stage", "test");
		config_set_key(&one, "pipeline", "stages", "4", "test");
		config_set_key(&one, "pipeline", "micro_batches", "1", "test");
		base_config(&pipe, arch, opt);
		config_set_key(&pipe, "train", "schedule", "pipedream", "test");
		config_set_key(&pipe, "pipeline", "stages", "4", "test");
		char what[96];
		snprintf(what, sizeof(what), "pipedream S=4 %s %s", arch, opt);
		if (!same_run(what, &one, &pipe))
			return;
		config_free(&one);
		config_free(&pipe);
	}
}

/* Per-stage delays follow the cut: the one-worker emulation and pipedream
 * take the same pipeline.layers. */
TEST(pipedream_equals_per_stage_delay_uneven)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		for (int c = 0; c < N_UNEVEN; c++) {
			if (c != (2 * ia + io) % N_UNEVEN && c != (2 * ia + io + 1) % N_UNEVEN)
				continue;
			struct config one, pipe;
			base_config(&one, arch, opt);
			config_set_key(&one, "train", "delay_mode", "per-stage", "test");
			config_set_key(&one, "pipeline", "micro_batches", "1", "test");
			set_cut(&one, uneven[c]);
			base_config(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", "pipedream", "test");
			set_cut(&pipe, uneven[c]);
			char what[96];
			snprintf(what, sizeof(what), "pipedream layers %s %s %s", uneven[c], arch, opt);
			int ok = same_run(what, &one, &pipe);
			config_free(&one);
			config_free(&pipe);
			if (!ok)
				return;
		}
	}
}

/* Guards the test above: under per-stage delays the cut decides which
 * layers see which delay, so 3,1 and 1,3 must train differently. */
TEST(per_stage_delay_depends_on_the_cut)
{
	struct config a, b;
	base_config(&a, "llama", "adamw");
	base_config(&b, "llama", "adamw");
	config_set_key(&a, "train", "delay_mode", "per-stage", "test");
	config_set_key(&b, "train", "delay_mode", "per-stage", "test");
	set_cut(&a, "3,1");
	set_cut(&b, "1,3");
	struct run_result ra = {0}, rb = {0};
	CHECK(!train(&a, STEPS, STEPS, NULL, NULL, &ra));
	CHECK(!train(&b, STEPS, STEPS, NULL, NULL, &rb));
	CHECK(ra.loss[0] == rb.loss[0]);
	CHECK(ra.loss[STEPS - 1] != rb.loss[STEPS - 1]);
	free(ra.weights);
	free(rb.weights);
	config_free(&a);
	config_free(&b);
}

/* 2bw over `stages` stages equals train.delay = 1 on one worker, both with
 * optim.correction = correction; with resume, a 2bw run stopped at step 7
 * and resumed also equals the uninterrupted one. lr NULL keeps the default.
 * 1 when everything held. */
static int twobw_vs_delay_one(const char *arch, const char *opt, const char *correction,
				  const char *stages, const char *lr, int resume)
{
	struct config one, pipe;
	base_config(&one, arch, opt);
	config_set_key(&one, "train", "delay", "1", "test");
	base_config(&pipe, arch, opt);
	config_set_key(&pipe, "train", "schedule", "2bw", "test");
	config_set_key(&pipe, "pipeline", "stages", stages, "test");
	for (struct config *c = &one; c; c = c == &one ? &pipe : NULL) {
		config_set_key(c, "optim", "correction", correction, "test");
		if (lr)
			config_set_key(c, "optim", "lr", lr, "test");
	}
	char what[128];
	snprintf(what, sizeof(what), "2bw+%s S=%s %s %s", correction, stages, arch, opt);
	int ok = same_run(what, &one, &pipe);
	if (ok && resume) {
		snprintf(what, sizeof(what), "resume 2bw+%s %s %s", correction, arch, opt);
		check_resume(what, &pipe, &pipe, 7);
	}
	config_free(&one);
	config_free(&pipe);
	return ok && !test_failed();
}

TEST(twobw_with_error_feedback_equals_delay_one_with_error_feedback)
{
	FOR_EACH_ARCH_OPTIM(arch, opt)
		if (!twobw_vs_delay_one(arch, opt, "ef", "4", NULL, 0))
			return;
}

TEST(twobw_with_prediction_equals_delay_one_with_prediction)
{
	FOR_EACH_ARCH_OPTIM(arch, opt)
		if (!twobw_vs_delay_one(arch, opt, "predict", "4", NULL, 0))
			return;
}

TEST(pipedream_with_prediction_equals_per_stage_with_prediction)
{
	struct config one, pipe;
	base_config(&one, "llama", "muon");
	config_set_key(&one, "train", "delay_mode", "per-stage", "test");
	config_set_key(&one, "pipeline", "stages", "4", "test");
	config_set_key(&one, "pipeline", "micro_batches", "1", "test");
	config_set_key(&one, "optim", "correction", "predict", "test");
	base_config(&pipe, "llama", "muon");
	config_set_key(&pipe, "train", "schedule", "pipedream", "test");
	config_set_key(&pipe, "pipeline", "stages", "4", "test");
	config_set_key(&pipe, "optim", "correction", "predict", "test");
	same_run("pipedream+predict S=4", &one, &pipe);
	config_free(&one);
	config_free(&pipe);
}

/* Prediction is a real change under a delay (the gradients run on other
 * weights), and none without one (nothing to extrapolate over). */
TEST(prediction_acts_only_under_a_delay)
{
	struct config none, pred;
	base_config(&none, "gpt2", "adamw");
	base_config(&pred, "gpt2", "adamw");
	config_set_key(&pred, "optim", "correction", "predict", "test");
	same_run("predict without delay", &none, &pred);
	config_set_key(&none, "train", "delay", "2", "test");
	config_set_key(&pred, "train", "delay", "2", "test");
	struct run_result a = {0}, b = {0};
	CHECK(!train(&none, STEPS, 5, NULL, NULL, &a) && !train(&pred, STEPS, 5, NULL, NULL, &b));
	CHECK(!memcmp(&a.loss[0], &b.loss[0], sizeof(double))); /* step 1: nothing to predict */
	CHECK(memcmp(&a.loss[STEPS - 1], &b.loss[STEPS - 1], sizeof(double)) != 0);
	free(a.weights);
	free(b.weights);
	config_free(&none);
	config_free(&pred);
}

/* The predicted weights are the extrapolation p = (1+d) w[v] - d w[v-1],
 * checked against the two versions the worker holds, in double. */
TEST(prediction_extrapolates_the_last_update)
{
	struct config cfg;
	base_config(&cfg, "llama", "adamw");
	config_set_key(&cfg, "train", "delay", "2", "test");
	config_set_key(&cfg, "optim", "correction", "predict", "test");
	static uint32_t tok[4000];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	struct model m;
	CHECK(!dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, 2, 16, 7, 1));
	CHECK(!tiny_model(&m, &cfg));
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	struct trainer tr;
	CHECK(!trainer_init(&tr, &cfg, &m, test_backend(), params, &dl));
	struct step_stats st[4];
	CHECK(!trainer_run(&tr, 4, st));
	struct stage_worker *w = trainer_worker(&tr, 0, 0);
	CHECK(w->predict && w->n_versions == 4);
	size_t n = w->st.numel;
	float *cur = xmalloc(n * sizeof(float)), *prev = xmalloc(n * sizeof(float));
	float *p = xmalloc(n * sizeof(float));
	long v = w->newest;
	tr.be->to_host(cur, worker_weights(w, v), n * sizeof(float));
	tr.be->to_host(prev, worker_weights(w, v - 1), n * sizeof(float));
	tr.be->to_host(p, worker_grad_weights(w, v), n * sizeof(float));
	double worst = 0, moved = 0;
	for (size_t i = 0; i < n; i++) {
		double want = 3.0 * cur[i] - 2.0 * prev[i];
		worst = fmax(worst, fabs(p[i] - want) / (fabs(cur[i]) + 1e-3));
		moved = fmax(moved, fabs((double)cur[i] - prev[i]));
	}
	CHECK_MSG(worst < 1e-5, "prediction off by %g (relative)", worst);
	CHECK(moved > 0); /* the update was not zero: the check is not vacuous */
	free(cur);
	free(prev);
	free(p);
	free(params);
	trainer_free(&tr);
	model_free(&m);
	dataloader_close(&dl);
	config_free(&cfg);
}

/* The optimizers beyond AdamW and Muon under the schedules: 2bw (with and
 * without error feedback or prediction) equals its emulation, and a resume
 * restores every state buffer (Adan's previous gradient included). */
TEST(other_optimizers_under_2bw_and_resume)
{
	static const char *const names[] = {"adan", "lion", "sgd", "mars", "ademamix", "soap", "normuon"};
	static const char *const corrections[] = {"none", "ef", "predict"};
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		for (size_t c = 0; c < ARRAY_SIZE(corrections); c++) {
			/* lion and sgd want a smaller step */
			int small = !strcmp(names[i], "lion") || !strcmp(names[i], "sgd");
			if (!twobw_vs_delay_one("llama", names[i], corrections[c], "2",
						    small ? "1e-3" : NULL, c == 0))
				return;
		}
}

/* The same for an MoE llama, with the optimizers whose state has a shape of
 * its own per expert matrix (NorMuon's rows, SOAP's factors) or that keep
 * the previous gradient (MARS, Adan): 2bw == delay 1, and resume. */
TEST(moe_other_optimizers_under_2bw_and_resume)
{
	static const char *const names[] = {"normuon", "soap", "mars", "adan"};
	if (!runs_here("moe"))
		SKIP("the backend has no MoE ops");
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (!twobw_vs_delay_one("moe", names[i], "none", "2", NULL, 1))
			return;
}

TEST(delay_zero_equals_no_delay)
{
	/* an explicit delay of 0 through the delay machinery (uniform and
	 * per-stage with S = 1, where S-1-s = 0) is plain training */
	struct config plain, d0, ps;
	base_config(&plain, "llama", "adamw");
	base_config(&d0, "llama", "adamw");
	config_set_key(&d0, "train", "delay", "0", "test");
	base_config(&ps, "llama", "adamw");
	config_set_key(&ps, "train", "delay_mode", "per-stage", "test");
	if (same_run("delay=0", &plain, &d0))
		same_run("per-stage S=1", &plain, &ps);
	config_free(&plain);
	config_free(&d0);
	config_free(&ps);
}

TEST(delay_changes_the_losses)
{
	/* guards the tests above: a delay must make a difference */
	struct config plain, d1;
	base_config(&plain, "llama", "adamw");
	base_config(&d1, "llama", "adamw");
	config_set_key(&d1, "train", "delay", "1", "test");
	struct run_result a = {0}, b = {0};
	CHECK(!train(&plain, STEPS, STEPS, NULL, NULL, &a));
	CHECK(!train(&d1, STEPS, STEPS, NULL, NULL, &b));
	config_free(&plain);
	config_free(&d1);
	CHECK(a.loss[0] == b.loss[0]);   /* step 1 sees version 0 either way */
	CHECK(a.loss[STEPS - 1] != b.loss[STEPS - 1]);
	free(a.weights);
	free(b.weights);
}

TEST(ef_lambda_zero_equals_no_correction)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config none, ef0;
		base_config(&none, arch, opt);
		config_set_key(&none, "train", "delay", "1", "test");
		base_config(&ef0, arch, opt);
		config_set_key(&ef0, "train", "delay", "1", "test");
		config_set_key(&ef0, "optim", "correction", "ef", "test");
		config_set_key(&ef0, "optim", "ef_lambda", "0", "test");
		int ok = same_run("ef lambda=0", &none, &ef0);
		config_free(&none);
		config_free(&ef0);
		if (!ok)
			return;
	}
}

/* train N == train K, checkpoint, resume, train N - K */
static void check_resume(const char *what, const struct config *cfg_a, const struct config *cfg_b,
			 int k)
{
	struct run_result full = {0}, part = {0};
	char path[512];
	snprintf(path, sizeof(path), "%s/resume.ckpt", test_tmpdir());
	CHECK_MSG(!train(cfg_a, STEPS, 5, NULL, NULL, &full), "%s: %s", what, last_error());
	CHECK_MSG(!train(cfg_a, k, 5, NULL, path, &part), "%s: %s", what, last_error());
	CHECK_MSG(!train(cfg_b, STEPS - k, 5, path, NULL, &part), "%s: resume: %s", what,
		  last_error());
	for (int i = 0; i < STEPS; i++)
		CHECK_MSG(!memcmp(&full.loss[i], &part.loss[i], sizeof(double)),
			  "%s: step %d: %.9g uninterrupted, %.9g resumed", what, i + 1, full.loss[i],
			  part.loss[i]);
	CHECK_MSG(!memcmp(full.weights, part.weights, full.numel * sizeof(float)),
		  "%s: final weights differ", what);
	CHECK_MSG(!memcmp(full.moe, part.moe, sizeof(full.moe)), "%s: router statistics differ",
		  what);
	free(full.weights);
	free(part.weights);
}

TEST(resume_is_exact_with_delay_and_correction)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config cfg;
		base_config(&cfg, arch, opt);
		config_set_key(&cfg, "train", "delay", "1", "test");
		config_set_key(&cfg, "optim", "correction", "ef", "test");
		check_resume("delay=1 ef", &cfg, &cfg, 7);
		if (test_failed())
			return;
		config_free(&cfg);
	}
}

TEST(resume_is_exact_for_pipelines)
{
	struct config bw, pd, d2;
	base_config(&bw, "llama", "muon");
	config_set_key(&bw, "train", "schedule", "2bw", "test");
	config_set_key(&bw, "pipeline", "stages", "2", "test");
	config_set_key(&bw, "optim", "correction", "ef", "test");
	check_resume("2bw S=2", &bw, &bw, 9);
	config_free(&bw);
	if (test_failed())
		return;
	base_config(&pd, "gpt2", "adamw");
	config_set_key(&pd, "train", "schedule", "pipedream", "test");
	config_set_key(&pd, "pipeline", "stages", "4", "test");
	check_resume("pipedream S=4", &pd, &pd, 6);
	config_free(&pd);
	if (test_failed())
		return;
	base_config(&d2, "llama", "adamw");
	config_set_key(&d2, "train", "delay", "3", "test");
	check_resume("delay=3", &d2, &d2, 5);
	config_free(&d2);
}

/* Weight prediction resumes exactly: the checkpoint holds one version
 * more, from which the predictions of every version still used are made
 * again (pipedream uses its oldest one right after a resume). */
TEST(resume_is_exact_with_prediction)
{
	struct config bw, pd, d2;
	base_config(&bw, "llama", "muon");
	config_set_key(&bw, "train", "schedule", "2bw", "test");
	config_set_key(&bw, "pipeline", "stages", "2", "test");
	config_set_key(&bw, "optim", "correction", "predict", "test");
	check_resume("2bw+predict S=2", &bw, &bw, 9);
	config_free(&bw);
	if (test_failed())
		return;
	base_config(&pd, "gpt2", "adamw");
	config_set_key(&pd, "train", "schedule", "pipedream", "test");
	config_set_key(&pd, "pipeline", "stages", "4", "test");
	config_set_key(&pd, "optim", "correction", "predict", "test");
	check_resume("pipedream+predict S=4", &pd, &pd, 6);
	config_free(&pd);
	if (test_failed())
		return;
	base_config(&d2, "llama", "adamw");
	config_set_key(&d2, "train", "delay", "2", "test");
	config_set_key(&d2, "optim", "correction", "predict", "test");
	check_resume("delay=2+predict", &d2, &d2, 5);
	config_free(&d2);
}

TEST(resume_is_exact_for_uneven_pipelines)
{
	struct config bw, pd;
	base_config(&bw, "gpt2", "muon");
	config_set_key(&bw, "train", "schedule", "2bw", "test");
	set_cut(&bw, "1,3");
	config_set_key(&bw, "optim", "correction", "ef", "test");
	check_resume("2bw layers 1,3", &bw, &bw, 9);
	config_free(&bw);
	if (test_failed())
		return;
	base_config(&pd, "llama", "adamw");
	config_set_key(&pd, "train", "schedule", "pipedream", "test");
	set_cut(&pd, "0,3,1");
	check_resume("pipedream layers 0,3,1", &pd, &pd, 6);
	config_free(&pd);
}

/* Checkpoints hold the global arena, so a run resumes under another cut:
 * 2bw on 3,1 for K steps, then on 1,2,1,0 (or balanced), equals 2bw all
 * along; the same for 1f1b from an even cut to 0,3,1. */
TEST(resume_under_another_cut_is_exact)
{
	struct config a, b;
	base_config(&a, "llama", "muon");
	config_set_key(&a, "train", "schedule", "2bw", "test");
	set_cut(&a, "3,1");
	base_config(&b, "llama", "muon");
	config_set_key(&b, "train", "schedule", "2bw", "test");
	set_cut(&b, "1,2,1,0");
	check_resume("2bw 3,1 -> 1,2,1,0", &a, &b, 8);
	config_free(&b);
	if (test_failed())
		return;
	base_config(&b, "llama", "muon");
	config_set_key(&b, "train", "schedule", "2bw", "test");
	config_set_key(&b, "pipeline", "split", "balanced", "test");
	config_set_key(&b, "pipeline", "stages", "3", "test");
	check_resume("2bw 3,1 -> balanced S=3", &a, &b, 11);
	config_free(&a);
	config_free(&b);
	if (test_failed())
		return;
	base_config(&a, "gpt2", "adamw");
	config_set_key(&a, "train", "schedule", "1f1b", "test");
	config_set_key(&a, "pipeline", "stages", "2", "test");
	base_config(&b, "gpt2", "adamw");
	config_set_key(&b, "train", "schedule", "1f1b", "test");
	set_cut(&b, "0,3,1");
	check_resume("1f1b even S=2 -> 0,3,1", &a, &b, 5);
	config_free(&a);
	config_free(&b);
}

/* MoE checkpoints resume exactly: 2bw with error feedback from an uneven
 * cut to another, pipedream on a cut with an empty first stage, and a
 * one-worker delay of 1 to 2bw; the sigmoid router once. */
TEST(moe_resume_is_exact)
{
	struct config a, b;
	if (!runs_here("moe"))
		SKIP("the backend has no MoE ops");
	base_config(&a, "moe", "muon");
	config_set_key(&a, "train", "schedule", "2bw", "test");
	config_set_key(&a, "optim", "correction", "ef", "test");
	set_cut(&a, "3,1");
	base_config(&b, "moe", "muon");
	config_set_key(&b, "train", "schedule", "2bw", "test");
	config_set_key(&b, "optim", "correction", "ef", "test");
	set_cut(&b, "1,2,1,0");
	check_resume("moe 2bw+ef 3,1 -> 1,2,1,0", &a, &b, 9);
	config_free(&a);
	config_free(&b);
	if (test_failed())
		return;
	base_config(&a, "moe", "adamw");
	config_set_key(&a, "model", "router", "sigmoid", "test");
	config_set_key(&a, "train", "schedule", "pipedream", "test");
	set_cut(&a, "0,3,1");
	check_resume("moe sigmoid pipedream 0,3,1", &a, &a, 6);
	config_free(&a);
	if (test_failed())
		return;
	base_config(&a, "moe", "adamw");
	config_set_key(&a, "train", "delay", "1", "test");
	base_config(&b, "moe", "adamw");
	config_set_key(&b, "train", "schedule", "2bw", "test");
	config_set_key(&b, "pipeline", "stages", "2", "test");
	check_resume("moe delay=1 -> 2bw S=2", &a, &b, 8);
	config_free(&a);
	config_free(&b);
}

/* Guards the moe runs above: the experts and the auxiliary losses take
 * part (the coefficients change the losses; the routing is not
 * collapsed onto one expert), so an equivalence over them is not an
 * equivalence of the dense parts alone. */
TEST(moe_runs_route_and_feel_their_losses)
{
	struct config a, b;
	struct run_result ra = {0}, rb = {0};
	if (!runs_here("moe"))
		SKIP("the backend has no MoE ops");
	base_config(&a, "moe", "adamw");
	base_config(&b, "moe", "adamw");
	config_set_key(&b, "model", "aux_loss_coef", "0", "test");
	config_set_key(&b, "model", "z_loss_coef", "0", "test");
	CHECK(!train(&a, STEPS, STEPS, NULL, NULL, &ra));
	CHECK(!train(&b, STEPS, STEPS, NULL, NULL, &rb));
	CHECK(ra.loss[0] == rb.loss[0]); /* the forward's loss is the cross-entropy */
	CHECK(ra.loss[STEPS - 1] != rb.loss[STEPS - 1]);
	for (int i = 0; i < STEPS; i++) {
		double sum = 0;
		for (int e = 0; e < 4; e++) {
			CHECK_MSG(ra.moe[i][2 + e] > 0, "step %d: expert %d got no token", i + 1, e);
			sum += ra.moe[i][2 + e];
		}
		/* L * K * tokens per step: 4 * 2 * (4 micro-batches of 2 x 16) */
		CHECK_MSG(sum == 4.0 * 2 * 4 * 2 * 16, "step %d: %g routed slots", i + 1, sum);
		CHECK(ra.moe[i][0] > 0.5 && ra.moe[i][0] < 2.0 && ra.moe[i][1] > 0);
	}
	free(ra.weights);
	free(rb.weights);
	config_free(&a);
	config_free(&b);
}

TEST(checkpoint_of_one_worker_resumes_as_a_pipeline)
{
	/* checkpoints are stage-independent: delay = 1 on one worker for K
	 * steps, then 2bw on 4 stages, equals 2bw all along */
	struct config one, bw;
	base_config(&one, "llama", "adamw");
	config_set_key(&one, "train", "delay", "1", "test");
	base_config(&bw, "llama", "adamw");
	config_set_key(&bw, "train", "schedule", "2bw", "test");
	config_set_key(&bw, "pipeline", "stages", "4", "test");
	check_resume("delay=1 -> 2bw S=4", &one, &bw, 8);
	config_free(&one);
	config_free(&bw);
}

/* A step whose gradient norm is not finite is skipped by every stage
 * alike: a diverging run gives the same losses, the same skipped steps and
 * the same (finite) weights one device and as a pipeline, sync and 2bw. */
TEST(skipped_steps_are_the_same_on_every_schedule)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe, one_d, twobw;
		base_config(&one, arch, opt);
		base_config(&pipe, arch, opt);
		base_config(&one_d, arch, opt);
		base_config(&twobw, arch, opt);
		struct config *all[] = {&one, &pipe, &one_d, &twobw};
		for (int i = 0; i < 4; i++) {
			config_set_key(all[i], "optim", "lr", "1e4", "test");
			config_set_key(all[i], "optim", "warmup", "0", "test");
			config_set_key(all[i], "train", "grad_clip", "0", "test");
		}
		config_set_key(&pipe, "train", "schedule", "1f1b", "test");
		config_set_key(&pipe, "pipeline", "stages", "2", "test");
		config_set_key(&one_d, "train", "delay", "1", "test");
		config_set_key(&twobw, "train", "schedule", "2bw", "test");
		config_set_key(&twobw, "pipeline", "stages", "2", "test");
		struct run_result r[4];
		memset(r, 0, sizeof(r));
		for (int i = 0; i < 4; i++)
			CHECK_MSG(!train(all[i], STEPS, 5, NULL, NULL, &r[i]), "%s %s run %d: %s",
				  arch, opt, i, last_error());
		CHECK_MSG(r[0].skipped > 0 && r[2].skipped > 0,
			  "%s %s: lr 1e4 skipped no step (%d, %d): the test needs divergence", arch,
			  opt, r[0].skipped, r[2].skipped);
		for (int pair = 0; pair < 4; pair += 2) {
			struct run_result *a = &r[pair], *b = &r[pair + 1];
			CHECK_MSG(a->skipped == b->skipped, "%s %s: %d vs %d skipped steps", arch, opt,
				  a->skipped, b->skipped);
			CHECK_MSG(!memcmp(a->loss, b->loss, sizeof(a->loss)),
				  "%s %s: the losses differ (pair %d)", arch, opt, pair / 2);
			CHECK_MSG(!memcmp(a->weights, b->weights, a->numel * sizeof(float)),
				  "%s %s: the weights differ (pair %d)", arch, opt, pair / 2);
			for (size_t j = 0; j < a->numel; j++)
				CHECK_MSG(isfinite(a->weights[j]), "%s %s: weight %zu is %g", arch, opt, j,
					  (double)a->weights[j]);
		}
		for (int i = 0; i < 4; i++) {
			free(r[i].weights);
			config_free(all[i]);
		}
	}
}

/* A checkpoint never holds a non-finite value: the write is refused, no
 * file appears, and the checkpoint written before is untouched. */
TEST(checkpoint_with_nan_is_refused)
{
	struct config cfg;
	base_config(&cfg, "llama", "adamw");
	char good[512], bad[512];
	snprintf(good, sizeof(good), "%s/good.ckpt", test_tmpdir());
	snprintf(bad, sizeof(bad), "%s/bad.ckpt", test_tmpdir());
	struct run_result r = {0};
	CHECK(train(&cfg, 3, 3, NULL, good, &r) == 0);
	struct model m;
	CHECK(tiny_model(&m, &cfg) == 0);
	static uint32_t tok[20000];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	CHECK(dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, 2, 16, 7, 1) == 0);
	float *params = xmalloc(m.numel * sizeof(float));
	memcpy(params, r.weights, m.numel * sizeof(float));
	params[m.numel / 2] = NAN;
	struct trainer tr;
	CHECK(trainer_init(&tr, &cfg, &m, test_backend(), params, &dl) == 0);
	set_error_quiet(1);
	int rc = trainer_save(&tr, bad, "", NULL);
	set_error_quiet(0);
	CHECK(rc != 0);
	CHECK_MSG(strstr(last_error(), "not writing checkpoint") && strstr(last_error(), "nan"),
		  "%s", last_error());
	CHECK(access(bad, F_OK) != 0);
	struct ckpt *k;
	CHECK(ckpt_open(&k, good) == 0 && ckpt_verify(k) == 0);
	ckpt_close(k);
	trainer_free(&tr);
	dataloader_close(&dl);
	model_free(&m);
	free(params);
	free(r.weights);
	config_free(&cfg);
}

/* A resume reads no non-finite optimizer state either: a checkpoint whose
 * moments hold a NaN (written by hand: train never writes one) is refused
 * naming the tensor. */
TEST(resume_with_nan_optimizer_state_is_refused)
{
	struct config cfg;
	base_config(&cfg, "llama", "adamw");
	char good[512], bad[512];
	snprintf(good, sizeof(good), "%s/state-good.ckpt", test_tmpdir());
	snprintf(bad, sizeof(bad), "%s/state-bad.ckpt", test_tmpdir());
	struct run_result r = {0};
	CHECK(train(&cfg, 3, 3, NULL, good, &r) == 0);
	struct ckpt *k;
	struct ckpt_writer *w;
	CHECK(ckpt_open(&k, good) == 0);
	CHECK(ckpt_create(&w, bad, ckpt_config(k), ckpt_meta(k)) == 0);
	int poisoned = -1;
	for (int i = 0; i < ckpt_count(k); i++) {
		int rows, cols;
		ckpt_shape(k, i, &rows, &cols);
		float *x = xmalloc(ckpt_numel(k, i) * sizeof(float));
		CHECK(ckpt_read(k, i, x) == 0);
		if (poisoned < 0 && strncmp(ckpt_name(k, i), "weights.", 8)) {
			x[ckpt_numel(k, i) - 1] = NAN; /* the first optimizer state tensor */
			poisoned = i;
		}
		CHECK(ckpt_add(w, ckpt_name(k, i), x, ckpt_numel(k, i), rows, cols) == 0);
		free(x);
	}
	CHECK(poisoned >= 0);
	CHECK(ckpt_commit(w) == 0);
	char name[128];
	snprintf(name, sizeof(name), "%s", ckpt_name(k, poisoned));
	ckpt_close(k);
	struct run_result r2 = {0};
	set_error_quiet(1);
	int rc = train(&cfg, 1, 1, bad, NULL, &r2);
	set_error_quiet(0);
	CHECK(rc != 0);
	CHECK_MSG(strstr(last_error(), name) && strstr(last_error(), "optimizer state"), "%s",
		  last_error());
	free(r.weights);
	free(r2.weights);
	config_free(&cfg);
}

/* ---- the weights' operand copies (backend.h, weights_bf16) ----
 *
 * The CUDA backend keeps a bf16 copy of a stage's weights that products read
 * instead of the weights, made when model/ asks (weights_bf16) and never
 * updated by itself. A product reading a copy older than its weights would
 * train on stale weights. The spy below is the cpu table with such copies
 * (exact float copies): its products read a weight from the copy whenever one
 * covers it and check, every time, that the copy still equals the weight. On
 * every schedule, delay, correction and resume, no copy may ever be stale,
 * the copies must be used, and the run must equal the plain cpu run bit for
 * bit. */

#define SPY_RANGES 64
static struct backend spy_table;
static const struct backend *spy_base;
static struct spy_range {
	const float *w;
	size_t n;
	float *copy;
} spy_ranges[SPY_RANGES];
static long spy_hits, spy_stale;
static pthread_mutex_t spy_mutex = PTHREAD_MUTEX_INITIALIZER;

/* ranges overlapping [lo, hi) are dropped (kept: keep); spy_mutex held */
static void spy_drop(const char *lo, const char *hi, const struct spy_range *keep)
{
	for (int i = 0; i < SPY_RANGES; i++) {
		struct spy_range *e = &spy_ranges[i];
		if (e != keep && e->w && (const char *)e->w < hi && lo < (const char *)(e->w + e->n))
			e->w = NULL;
	}
}

/* the allocations' sizes, so that free can drop the ranges in them, as the
 * CUDA backend's free does */
#define SPY_ALLOCS 4096
static struct {
	void *p;
	size_t bytes;
} spy_allocs[SPY_ALLOCS];

static void *spy_alloc(size_t bytes)
{
	void *p = spy_base->alloc(bytes);
	int i = 0;
	pthread_mutex_lock(&spy_mutex);
	for (; p && i < SPY_ALLOCS; i++)
		if (!spy_allocs[i].p) {
			spy_allocs[i].p = p, spy_allocs[i].bytes = bytes;
			break;
		}
	pthread_mutex_unlock(&spy_mutex);
	if (p && i == SPY_ALLOCS)
		test_fail(__FILE__, __LINE__, "spy: more than %d live allocations", SPY_ALLOCS);
	return p;
}

static void spy_free(void *p)
{
	pthread_mutex_lock(&spy_mutex);
	for (int i = 0; p && i < SPY_ALLOCS; i++)
		if (spy_allocs[i].p == p) {
			spy_drop(p, (const char *)p + spy_allocs[i].bytes, NULL);
			spy_allocs[i].p = NULL;
			break;
		}
	pthread_mutex_unlock(&spy_mutex);
	spy_base->free(p);
}

static void spy_prepare(const float *w, size_t n)
{
	pthread_mutex_lock(&spy_mutex);
	struct spy_range *e = NULL;
	for (int i = 0; i < SPY_RANGES && !e; i++)
		if (spy_ranges[i].w == w && spy_ranges[i].n == n)
			e = &spy_ranges[i];
	spy_drop((const char *)w, (const char *)(w + n), e); /* one copy per weight */
	for (int i = 0; i < SPY_RANGES && !e; i++)
		if (!spy_ranges[i].w)
			e = &spy_ranges[i];
	if (!e) {
		test_fail(__FILE__, __LINE__, "spy: more than %d weight ranges", SPY_RANGES);
	} else {
		if (e->w != w || e->n != n) {
			free(e->copy);
			e->copy = xmalloc(n * sizeof(float));
		}
		memcpy(e->copy, w, n * sizeof(float));
		e->w = w, e->n = n;
	}
	pthread_mutex_unlock(&spy_mutex);
}

/* w[count] as a product reads it: from a copy that covers it, else w */
static const float *spy_weight(const float *w, size_t count)
{
	const float *r = w;
	pthread_mutex_lock(&spy_mutex);
	for (int i = 0; i < SPY_RANGES; i++) {
		const struct spy_range *e = &spy_ranges[i];
		if (e->w && w >= e->w && w + count <= e->w + e->n) {
			r = e->copy + (w - e->w);
			spy_hits++;
			spy_stale += memcmp(r, w, count * sizeof(float)) != 0;
			break;
		}
	}
	pthread_mutex_unlock(&spy_mutex);
	return r;
}

static void spy_matmul_forward(void *out, const void *inp, const float *w, const float *bias,
			       int N, int C, int OC)
{
	spy_base->matmul_forward(out, inp, spy_weight(w, (size_t)OC * C), bias, N, C, OC);
}

static void spy_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
				const void *inp, const float *w, int N, int C, int OC)
{
	spy_base->matmul_backward(dinp, dw, dbias, dout, inp, spy_weight(w, (size_t)OC * C), N, C,
				  OC);
}

/* the experts' products read E matrices of OC x C from w */
static void spy_moe_forward(void *out, const void *inp, const float *w, const int32_t *count,
			    int E, int C, int OC)
{
	spy_base->moe_expert_forward(out, inp, spy_weight(w, (size_t)E * OC * C), count, E, C,
				     OC);
}

static void spy_moe_backward(void *dinp, float *dw, const void *dout, const void *inp,
			     const float *w, const int32_t *count, int E, int C, int OC)
{
	spy_base->moe_expert_backward(dinp, dw, dout, inp,
				      w ? spy_weight(w, (size_t)E * OC * C) : NULL, count, E, C,
				      OC);
}

static void spy_reset(void)
{
	for (int i = 0; i < SPY_RANGES; i++) {
		free(spy_ranges[i].copy);
		memset(&spy_ranges[i], 0, sizeof(spy_ranges[i]));
	}
	memset(spy_allocs, 0, sizeof(spy_allocs));
	spy_hits = spy_stale = 0;
	spy_base = test_backend();
	spy_table = *spy_base;
	spy_table.weights_bf16 = spy_prepare;
	spy_table.alloc = spy_alloc;
	spy_table.free = spy_free;
	spy_table.matmul_forward = spy_matmul_forward;
	spy_table.matmul_backward = spy_matmul_backward;
	spy_table.moe_expert_forward = spy_moe_forward;
	spy_table.moe_expert_backward = spy_moe_backward;
}

/* cfg on the cpu table and on the spy: the same bits, copies used and
 * never stale; with resume_at, the spy run also stops there and resumes. */
static void spy_check(const char *what, const struct config *cfg, int resume_at)
{
	struct run_result ra = {0}, rb = {0};
	const char *ck = "spy.ckpt";
	spy_reset();
	int ok = !train(cfg, STEPS, 5, NULL, NULL, &ra);
	train_with = &spy_table;
	if (resume_at)
		ok = ok && !train(cfg, resume_at, 3, NULL, ck, &rb) &&
		     !train(cfg, STEPS - resume_at, 4, ck, NULL, &rb);
	else
		ok = ok && !train(cfg, STEPS, 5, NULL, NULL, &rb);
	train_with = NULL;
	unlink(ck);
	CHECK_MSG(ok, "%s: training failed: %s", what, last_error());
	if (ok) {
		CHECK_MSG(spy_hits > 0, "%s: no product read a weight copy", what);
		CHECK_MSG(spy_stale == 0, "%s: %ld of %ld products read a stale weight copy", what,
			  spy_stale, spy_hits);
		CHECK_MSG(!memcmp(ra.loss, rb.loss, sizeof(ra.loss)), "%s: losses differ", what);
		CHECK_MSG(!memcmp(ra.val, rb.val, sizeof(ra.val)), "%s: evaluations differ", what);
		CHECK_MSG(ra.numel == rb.numel &&
				  !memcmp(ra.weights, rb.weights, ra.numel * sizeof(float)),
			  "%s: final weights differ", what);
	}
	free(ra.weights);
	free(rb.weights);
	spy_reset();
}

TEST(weight_copies_are_never_stale)
{
	if (strcmp(test_backend()->name, "cpu"))
		SKIP("the spy wraps the cpu backend (on cuda the copies are the backend's own)");
	/* ep: model.expert_parallel over as many replicas, evaluating after
	 * every chunk (a member runs its owners' experts from their arenas) */
	static const struct {
		const char *what, *arch, *optim, *schedule, *stages, *delay, *correction;
		int resume_at, ep;
	} runs[] = {
		{"one worker", "gpt2", "adamw", "none", "1", "0", "none", 0, 0},
		{"delay 1 + ef", "llama", "muon", "none", "1", "1", "ef", 0, 0},
		{"delay 1 + predict", "gpt2", "adamw", "none", "1", "1", "predict", 0, 0},
		{"1f1b S=2", "llama", "adamw", "1f1b", "2", "0", "none", 0, 0},
		{"2bw S=2 + ef, resumed", "gpt2", "muon", "2bw", "2", "0", "ef", 7, 0},
		{"2bw S=4 + predict", "llama", "adamw", "2bw", "4", "0", "predict", 0, 0},
		{"pipedream S=3", "gpt2", "adamw", "pipedream", "3", "0", "none", 0, 0},
		{"moe, 2 experts' owners, evaluated", "moe", "adamw", "1f1b", "1", "0", "none", 0, 2},
		{"moe 2bw, 2 owners, evaluated", "moe", "muon", "2bw", "2", "0", "none", 0, 2},
	};
	for (size_t i = 0; i < ARRAY_SIZE(runs) && !test_failed(); i++) {
		struct config cfg;
		base_config(&cfg, runs[i].arch, runs[i].optim);
		config_set_key(&cfg, "train", "schedule", runs[i].schedule, "test");
		config_set_key(&cfg, "pipeline", "stages", runs[i].stages, "test");
		config_set_key(&cfg, "train", "delay", runs[i].delay, "test");
		config_set_key(&cfg, "optim", "correction", runs[i].correction, "test");
		if (runs[i].ep) {
			char ep[16];
			snprintf(ep, sizeof(ep), "%d", runs[i].ep);
			config_set_key(&cfg, "pipeline", "data_parallel", ep, "test");
			config_set_key(&cfg, "model", "expert_parallel", ep, "test");
		}
		eval_each_chunk = runs[i].ep > 0;
		spy_check(runs[i].what, &cfg, runs[i].resume_at);
		eval_each_chunk = 0;
		config_free(&cfg);
	}
}

/* ---- fused products (backend.h: matmul_gelu_forward, matmul_backward_dgelu) ----
 * The model calls them for GPT-2's feed-forward where a backend has them
 * (CUDA). Here the cpu table gets them as exactly the ops they fuse, so
 * every schedule must give the plain run's bits: the model passes the right
 * buffers, shapes and weights to them, in the right place. */
static struct backend fused_table;
static int fused_calls[2]; /* forward, backward */

static void fused_gelu_forward(void *out, void *pre, const void *inp, const float *w,
			       const float *bias, int N, int C, int OC)
{
	__atomic_add_fetch(&fused_calls[0], 1, __ATOMIC_RELAXED);
	test_backend()->matmul_forward(pre, inp, w, bias, N, C, OC);
	test_backend()->gelu_forward(out, pre, (size_t)N * OC);
}

static void fused_backward_dgelu(void *dpre, float *dw, float *dbias, const void *dout,
				 const void *inp, const float *w, const void *pre, int N, int C,
				 int OC)
{
	__atomic_add_fetch(&fused_calls[1], 1, __ATOMIC_RELAXED);
	test_backend()->matmul_backward(dpre, dw, dbias, dout, inp, w, N, C, OC);
	test_backend()->gelu_backward(dpre, pre, dpre, (size_t)N * C);
}

TEST(fused_gelu_products_equal_the_ops_apart)
{
	if (strcmp(test_backend()->name, "cpu"))
		SKIP("the composites wrap the cpu backend (cuda has its own fused products)");
	fused_table = *test_backend();
	fused_table.matmul_gelu_forward = fused_gelu_forward;
	fused_table.matmul_backward_dgelu = fused_backward_dgelu;
	static const char *const sched[][2] = {{"none", "1"}, {"2bw", "2"}, {"1f1b", "4"}};
	for (size_t i = 0; i < ARRAY_SIZE(sched) && !test_failed(); i++) {
		struct config cfg;
		struct run_result ra = {0}, rb = {0};
		base_config(&cfg, "gpt2", "adamw");
		config_set_key(&cfg, "train", "schedule", sched[i][0], "test");
		config_set_key(&cfg, "pipeline", "stages", sched[i][1], "test");
		fused_calls[0] = fused_calls[1] = 0;
		int ok = !train(&cfg, STEPS, 5, NULL, NULL, &ra);
		train_with = &fused_table;
		ok = ok && !train(&cfg, STEPS, 5, NULL, NULL, &rb);
		train_with = NULL;
		CHECK_MSG(ok, "%s: training failed: %s", sched[i][0], last_error());
		CHECK_MSG(fused_calls[0] > 0 && fused_calls[1] > 0,
			  "%s: the model called the fused forward %d times, the backward %d",
			  sched[i][0], fused_calls[0], fused_calls[1]);
		CHECK_MSG(ok && !memcmp(ra.loss, rb.loss, sizeof(ra.loss)) &&
				  !memcmp(ra.weights, rb.weights, ra.numel * sizeof(float)),
			  "%s: the fused products change the run", sched[i][0]);
		free(ra.weights);
		free(rb.weights);
		config_free(&cfg);
	}
}

/* ---- fused residual add + norm (backend.h: add_norm_forward,
 * norm_backward_add) ----
 * CUDA fuses each residual add into the norm beside it. Here the cpu table
 * gets them as exactly the ops they fuse: every schedule must give the
 * plain run's bits, for LayerNorm (gpt2) and RMSNorm (llama), so the model
 * hands them the right buffers and is_ln. */
static struct backend norm_table;
static int norm_calls[2]; /* forward, backward */

static void fused_add_norm_forward(void *res, void *out, float *mean, float *rstd, const void *a,
				   const void *b, const float *w, const float *bias, int N, int C,
				   float eps, int is_ln)
{
	const struct backend *be = test_backend();
	__atomic_add_fetch(&norm_calls[0], 1, __ATOMIC_RELAXED);
	be->add_act(res, a, b, (size_t)N * C);
	if (is_ln)
		be->layernorm_forward(out, mean, rstd, res, w, bias, N, C, eps);
	else
		be->rmsnorm_forward(out, rstd, res, w, N, C, eps);
}

static void fused_norm_backward_add(void *dacc, float *dw, float *db, const void *dout,
				    const void *inp, const float *w, const float *mean,
				    const float *rstd, int N, int C, int is_ln)
{
	const struct backend *be = test_backend();
	__atomic_add_fetch(&norm_calls[1], 1, __ATOMIC_RELAXED);
	void *d = be->alloc((size_t)N * C * act_size(be));
	if (is_ln)
		be->layernorm_backward(d, dw, db, dout, inp, w, mean, rstd, N, C);
	else
		be->rmsnorm_backward(d, dw, dout, inp, w, rstd, N, C);
	be->add_act(dacc, dacc, d, (size_t)N * C);
	be->free(d);
}

TEST(fused_norms_equal_the_ops_apart)
{
	if (strcmp(test_backend()->name, "cpu"))
		SKIP("the composites wrap the cpu backend (cuda has its own fused kernels)");
	norm_table = *test_backend();
	norm_table.add_norm_forward = fused_add_norm_forward;
	norm_table.norm_backward_add = fused_norm_backward_add;
	static const char *const runs[][3] = {{"gpt2", "none", "1"}, {"gpt2", "2bw", "2"},
					      {"llama", "1f1b", "4"}, {"llama", "pipedream", "2"}};
	for (size_t i = 0; i < ARRAY_SIZE(runs) && !test_failed(); i++) {
		struct config cfg;
		struct run_result ra = {0}, rb = {0};
		base_config(&cfg, runs[i][0], "adamw");
		config_set_key(&cfg, "train", "schedule", runs[i][1], "test");
		config_set_key(&cfg, "pipeline", "stages", runs[i][2], "test");
		norm_calls[0] = norm_calls[1] = 0;
		int ok = !train(&cfg, STEPS, 5, NULL, NULL, &ra);
		train_with = &norm_table;
		ok = ok && !train(&cfg, STEPS, 5, NULL, NULL, &rb);
		train_with = NULL;
		CHECK_MSG(ok, "%s %s: training failed: %s", runs[i][0], runs[i][1], last_error());
		/* per micro-batch and stage of nl layers: 2 nl - 1 forward (each
		 * layer's ln2, and ln1 after the first, which take the layer
		 * before's last add), 2 nl backward; nl = 1 on the 4-stage run */
		CHECK_MSG(norm_calls[0] > 0 && norm_calls[1] > norm_calls[0],
			  "%s %s: the model called the fused forward %d times, the backward %d",
			  runs[i][0], runs[i][1], norm_calls[0], norm_calls[1]);
		CHECK_MSG(ok && !memcmp(ra.loss, rb.loss, sizeof(ra.loss)) &&
				  !memcmp(ra.weights, rb.weights, ra.numel * sizeof(float)),
			  "%s %s: the fused norms change the run", runs[i][0], runs[i][1]);
		free(ra.weights);
		free(rb.weights);
		config_free(&cfg);
	}
}

/* ---- the same in bf16 storage (train.act_dtype = bf16) ---- */

/* the cpu backend's bf16 twin, or CUDA's on the GPU (tools/gpu-check) */
static int bf16_here(void)
{
	return backend_with_act_dtype(test_backend(), ACT_BF16) != NULL;
}

static void base_config_bf16(struct config *cfg, const char *arch, const char *optim)
{
	base_config(cfg, arch, optim);
	config_set_key(cfg, "train", "act_dtype", "bf16", "test");
}

/* bf16 really changes the computation: its losses differ from f32's (by
 * rounding: closely), or the tests below would prove nothing new. */
TEST(bf16_runs_differ_from_f32_closely)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	for (int ia = 0; ia < (int)ARRAY_SIZE(archs); ia++) {
		if (!runs_here(archs[ia]))
			continue;
		struct config a, b;
		struct run_result ra = {0}, rb = {0};
		base_config(&a, archs[ia], "adamw");
		base_config_bf16(&b, archs[ia], "adamw");
		CHECK_MSG(!train(&a, STEPS, 5, NULL, NULL, &ra) && !train(&b, STEPS, 5, NULL, NULL, &rb),
			  "%s: %s", archs[ia], last_error());
		int differ = 0;
		for (int i = 0; i < STEPS; i++) {
			differ |= ra.loss[i] != rb.loss[i];
			/* 20 steps of a tiny model: the two stay within a few
			 * thousandths of a nat (rounding noise, not a bias) */
			CHECK_MSG(fabs(ra.loss[i] - rb.loss[i]) < 0.02, "%s step %d: f32 %.6f bf16 %.6f",
				  archs[ia], i + 1, ra.loss[i], rb.loss[i]);
		}
		CHECK_MSG(differ, "%s: bf16 losses are f32's bit for bit", archs[ia]);
		CHECK_MSG(rb.loss[STEPS - 1] < rb.loss[0] - 0.02, "%s: bf16 did not learn (%.4f -> %.4f)",
			  archs[ia], rb.loss[0], rb.loss[STEPS - 1]);
		free(ra.weights);
		free(rb.weights);
		config_free(&a);
		config_free(&b);
		if (test_failed())
			return;
	}
}

TEST(bf16_sync_pipeline_equals_one_worker)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	for (int ia = 0; ia < (int)ARRAY_SIZE(archs); ia++) {
		if (!runs_here(archs[ia]))
			continue;
		const char *arch = archs[ia], *opt = optims[ia % 2];
		struct config one, pipe;
		base_config_bf16(&one, arch, opt);
		const char *kinds[] = {"1f1b", "gpipe"};
		const char *stages[] = {"2", "4"};
		for (int k = 0; k < 2; k++) {
			base_config_bf16(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", kinds[k], "test");
			config_set_key(&pipe, "pipeline", "stages", stages[k], "test");
			char what[96];
			snprintf(what, sizeof(what), "bf16 %s S=%s %s %s", kinds[k], stages[k], arch, opt);
			if (!same_run(what, &one, &pipe))
				return;
			config_free(&pipe);
		}
		config_free(&one);
	}
}

TEST(bf16_twobw_equals_delay_one)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	for (int ia = 0; ia < (int)ARRAY_SIZE(archs); ia++) {
		if (!runs_here(archs[ia]))
			continue;
		const char *arch = archs[ia], *opt = optims[(ia + 1) % 2];
		struct config one, pipe;
		base_config_bf16(&one, arch, opt);
		config_set_key(&one, "train", "delay", "1", "test");
		const char *stages[] = {"2", "4"};
		for (int s = 0; s < 2; s++) {
			base_config_bf16(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", "2bw", "test");
			config_set_key(&pipe, "pipeline", "stages", stages[s], "test");
			char what[96];
			snprintf(what, sizeof(what), "bf16 2bw S=%s %s %s", stages[s], arch, opt);
			if (!same_run(what, &one, &pipe))
				return;
			config_free(&pipe);
		}
		config_free(&one);
	}
}

TEST(bf16_pipedream_equals_per_stage_delay)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	struct config one, pipe;
	base_config_bf16(&one, "gpt2", "adamw");
	config_set_key(&one, "train", "delay_mode", "per-stage", "test");
	config_set_key(&one, "pipeline", "stages", "4", "test");
	config_set_key(&one, "pipeline", "micro_batches", "1", "test");
	base_config_bf16(&pipe, "gpt2", "adamw");
	config_set_key(&pipe, "train", "schedule", "pipedream", "test");
	config_set_key(&pipe, "pipeline", "stages", "4", "test");
	same_run("bf16 pipedream S=4 gpt2 adamw", &one, &pipe);
	config_free(&one);
	config_free(&pipe);
}

TEST(bf16_resume_is_exact)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	struct config bw, d1, moe;
	base_config_bf16(&bw, "llama", "muon");
	config_set_key(&bw, "train", "schedule", "2bw", "test");
	config_set_key(&bw, "pipeline", "stages", "2", "test");
	config_set_key(&bw, "optim", "correction", "ef", "test");
	check_resume("bf16 2bw S=2", &bw, &bw, 9);
	config_free(&bw);
	if (test_failed())
		return;
	base_config_bf16(&d1, "gpt2", "adamw");
	config_set_key(&d1, "train", "delay", "1", "test");
	check_resume("bf16 delay=1", &d1, &d1, 7);
	config_free(&d1);
	if (test_failed() || !runs_here("moe"))
		return;
	base_config_bf16(&moe, "moe", "adamw");
	config_set_key(&moe, "train", "schedule", "1f1b", "test");
	config_set_key(&moe, "pipeline", "stages", "2", "test");
	check_resume("bf16 1f1b S=2 moe", &moe, &moe, 6);
	config_free(&moe);
}

/* ---- the zero-bubble kinds: the backward split into B and W ---- */

/* Train cfg and compare with ref's losses and final weights bit for bit;
 * 0 (after test_fail) when they differ. */
static int same_as(const char *what, const struct run_result *ref, const struct config *cfg)
{
	struct run_result r = {0};
	if (train(cfg, STEPS, 5, NULL, NULL, &r)) {
		test_fail(__FILE__, __LINE__, "%s: training failed: %s", what, last_error());
		return 0;
	}
	int ok = 1;
	for (int i = 0; i < STEPS && ok; i++)
		if (memcmp(&ref->loss[i], &r.loss[i], sizeof(double))) {
			test_fail(__FILE__, __LINE__, "%s: step %d loss %.9g != %.9g", what, i + 1,
				  ref->loss[i], r.loss[i]);
			ok = 0;
		}
	if (ok && memcmp(ref->weights, r.weights, ref->numel * sizeof(float))) {
		test_fail(__FILE__, __LINE__, "%s: final weights differ", what);
		ok = 0;
	}
	if (ok && memcmp(ref->moe, r.moe, sizeof(r.moe))) {
		test_fail(__FILE__, __LINE__, "%s: the router statistics differ", what);
		ok = 0;
	}
	free(r.weights);
	return ok;
}

/* kind (zb-h1 or 2bw-zb) on S = 1..4 stages for M = 1..8 (2bw-zb needs
 * M >= S) against one worker with the same M (with delay 1 for 2bw-zb),
 * llama and gpt2, in f32 or bf16 activations. The reference is trained
 * once per M. To stay quick, by default M = 1, 2, 3, 5, 8 (bf16: 2, 5, 8),
 * each (architecture, M) with one S (every S is met: S = 1 + (M + arch) %
 * 4, at most M for 2bw-zb); ASYNCPP_TEST_FULL=1 runs the whole grid (about
 * 40 s). */
static void zero_bubble_grid(const char *kind, const char *act_dtype)
{
	int async = !strcmp(kind, "2bw-zb");
	int full = getenv("ASYNCPP_TEST_FULL") && atoi(getenv("ASYNCPP_TEST_FULL"));
	int bf16 = !strcmp(act_dtype, "bf16");
	static const char *const two[] = {"llama", "gpt2"};
	for (int ia = 0; ia < 2; ia++)
		for (int M = 1; M <= 8; M++) {
			if (!full && (bf16 ? M % 3 != 2 : M == 4 || M == 6 || M == 7))
				continue;
			int pick = 1 + (M + ia) % 4;
			if (async)
				pick = MIN(pick, M);
			const char *opt = optims[(ia + M) % 2];
			char m[8], what[128];
			snprintf(m, sizeof(m), "%d", M);
			struct config one;
			base_config(&one, two[ia], opt);
			config_set_key(&one, "train", "act_dtype", act_dtype, "test");
			config_set_key(&one, "pipeline", "micro_batches", m, "test");
			if (async)
				config_set_key(&one, "train", "delay", "1", "test");
			struct run_result ref = {0};
			if (train(&one, STEPS, 5, NULL, NULL, &ref)) {
				test_fail(__FILE__, __LINE__, "one worker M=%d %s: %s", M, two[ia],
					  last_error());
				return;
			}
			CHECK_MSG(ref.loss[STEPS - 1] < ref.loss[0] - 0.02, "M=%d %s: loss did not fall",
				  M, two[ia]);
			for (int S = 1; S <= 4 && !test_failed(); S++) {
				if ((async && M < S) || (!full && S != pick))
					continue;
				struct config pipe;
				char st[8];
				snprintf(st, sizeof(st), "%d", S);
				base_config(&pipe, two[ia], opt);
				config_set_key(&pipe, "train", "act_dtype", act_dtype, "test");
				config_set_key(&pipe, "train", "schedule", kind, "test");
				config_set_key(&pipe, "pipeline", "stages", st, "test");
				config_set_key(&pipe, "pipeline", "micro_batches", m, "test");
				snprintf(what, sizeof(what), "%s %s S=%d M=%d %s %s", act_dtype, kind, S,
					 M, two[ia], opt);
				same_as(what, &ref, &pipe);
				config_free(&pipe);
			}
			free(ref.weights);
			config_free(&one);
			if (test_failed())
				return;
		}
}

TEST(zbh1_equals_one_worker)
{
	zero_bubble_grid("zb-h1", "f32");
}

TEST(twobw_zb_equals_delay_one)
{
	zero_bubble_grid("2bw-zb", "f32");
}

/* zb-h1 == 1f1b directly (both == one worker; this names the pair), and
 * 2bw-zb == 2bw, on 4 stages with 6 micro-batches. */
TEST(zero_bubble_kinds_equal_their_fused_twins)
{
	static const char *const pairs[][2] = {{"1f1b", "zb-h1"}, {"2bw", "2bw-zb"}};
	for (int k = 0; k < 2 && !test_failed(); k++) {
		struct config a, b;
		base_config(&a, k ? "gpt2" : "llama", "adamw");
		base_config(&b, k ? "gpt2" : "llama", "adamw");
		config_set_key(&a, "train", "schedule", pairs[k][0], "test");
		config_set_key(&b, "train", "schedule", pairs[k][1], "test");
		for (struct config *c = &a; c; c = c == &a ? &b : NULL) {
			config_set_key(c, "pipeline", "stages", "4", "test");
			config_set_key(c, "pipeline", "micro_batches", "6", "test");
		}
		char what[64];
		snprintf(what, sizeof(what), "%s == %s S=4 M=6", pairs[k][1], pairs[k][0]);
		same_run(what, &a, &b);
		config_free(&a);
		config_free(&b);
	}
}

/* Uneven cuts (stages without a layer at either end), every architecture
 * (the MoE layers' B and W too) and both optimizers; 2bw-zb once with
 * error feedback and once with weight prediction. */
TEST(zero_bubble_kinds_equal_their_emulation_uneven)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		int i = 2 * ia + io;
		for (int k = 0; k < 2 && !test_failed(); k++) {
			const char *cut = uneven[(i + k) % N_UNEVEN];
			const char *corr = k && io == 0 ? (ia % 2 ? "predict" : "ef") : "none";
			struct config one, pipe;
			base_config(&one, arch, opt);
			base_config(&pipe, arch, opt);
			config_set_key(&pipe, "train", "schedule", k ? "2bw-zb" : "zb-h1", "test");
			set_cut(&pipe, cut);
			if (k) {
				config_set_key(&one, "train", "delay", "1", "test");
				config_set_key(&one, "optim", "correction", corr, "test");
				config_set_key(&pipe, "optim", "correction", corr, "test");
			}
			char what[128];
			snprintf(what, sizeof(what), "%s%s%s layers %s %s %s", k ? "2bw-zb" : "zb-h1",
				 k ? "+" : "", k ? corr : "", cut, arch, opt);
			same_run(what, &one, &pipe);
			config_free(&one);
			config_free(&pipe);
		}
		if (test_failed())
			return;
	}
}

/* A checkpoint mid-run resumes exactly, and a checkpoint of the fused twin
 * resumes under the zero-bubble kind (the same state) as if run so all
 * along. */
TEST(resume_is_exact_for_zero_bubble_kinds)
{
	struct config zb, bw, one_f;
	base_config(&zb, "llama", "muon");
	config_set_key(&zb, "train", "schedule", "zb-h1", "test");
	config_set_key(&zb, "pipeline", "stages", "3", "test");
	check_resume("zb-h1 S=3", &zb, &zb, 7);
	base_config(&one_f, "llama", "muon");
	config_set_key(&one_f, "train", "schedule", "1f1b", "test");
	config_set_key(&one_f, "pipeline", "stages", "2", "test");
	check_resume("1f1b S=2 -> zb-h1 S=3", &one_f, &zb, 6);
	config_free(&zb);
	config_free(&one_f);
	if (test_failed())
		return;
	base_config(&bw, "gpt2", "adamw");
	config_set_key(&bw, "train", "schedule", "2bw-zb", "test");
	config_set_key(&bw, "pipeline", "stages", "2", "test");
	config_set_key(&bw, "optim", "correction", "ef", "test");
	check_resume("2bw-zb+ef S=2", &bw, &bw, 9);
	struct config fused;
	base_config(&fused, "gpt2", "adamw");
	config_set_key(&fused, "train", "schedule", "2bw", "test");
	config_set_key(&fused, "pipeline", "stages", "4", "test");
	config_set_key(&fused, "optim", "correction", "ef", "test");
	check_resume("2bw S=4 -> 2bw-zb S=2", &fused, &bw, 8);
	config_free(&bw);
	config_free(&fused);
	if (test_failed())
		return;
	base_config(&bw, "llama", "adamw");
	config_set_key(&bw, "train", "schedule", "2bw-zb", "test");
	config_set_key(&bw, "pipeline", "stages", "4", "test");
	config_set_key(&bw, "optim", "correction", "predict", "test");
	check_resume("2bw-zb+predict S=4", &bw, &bw, 7);
	config_free(&bw);
}

TEST(bf16_zbh1_equals_one_worker)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	zero_bubble_grid("zb-h1", "bf16");
}

TEST(bf16_twobw_zb_equals_delay_one)
{
	if (!bf16_here())
		SKIP("the backend has no bf16 activation storage");
	zero_bubble_grid("2bw-zb", "bf16");
}

/* ---- interleaved: V model chunks per stage ---- */

/* interleaved with V chunks on S stages (S*V pieces of the cut) == one
 * worker: M a multiple of S (Megatron's condition), llama and gpt2, the
 * even cut and uneven ones over the pieces (pipeline.layers lists one
 * count per piece: the model's 4 layers allow at most 6), V = 1 (1f1b)
 * to 4, one stage (every handoff local) to three. */
TEST(interleaved_equals_one_worker)
{
	static const struct {
		const char *arch, *opt, *S, *V, *M, *layers;
	} runs[] = {
		{"llama", "adamw", "2", "2", "4", NULL},   {"gpt2", "muon", "2", "2", "6", NULL},
		{"gpt2", "adamw", "1", "4", "3", NULL},    {"llama", "muon", "1", "2", "4", NULL},
		{"llama", "adamw", "2", "1", "4", NULL},   {"gpt2", "adamw", "3", "2", "6", NULL},
		{"llama", "muon", "2", "3", "4", "0,1,1,1,1,0"},
		{"gpt2", "adamw", "2", "2", "8", "2,1,1,0"},
		{"llama", "adamw", "2", "2", "2", "0,2,1,1"},
	};
	for (size_t i = 0; i < ARRAY_SIZE(runs) && !test_failed(); i++) {
		struct config one, pipe;
		base_config(&one, runs[i].arch, runs[i].opt);
		config_set_key(&one, "pipeline", "micro_batches", runs[i].M, "test");
		base_config(&pipe, runs[i].arch, runs[i].opt);
		config_set_key(&pipe, "train", "schedule", "interleaved", "test");
		config_set_key(&pipe, "pipeline", "micro_batches", runs[i].M, "test");
		config_set_key(&pipe, "pipeline", "virtual_stages", runs[i].V, "test");
		if (runs[i].layers) {
			config_set_key(&pipe, "pipeline", "split", "layers", "test");
			config_set_key(&pipe, "pipeline", "layers", runs[i].layers, "test");
		}
		config_set_key(&pipe, "pipeline", "stages", runs[i].S, "test");
		char what[128];
		snprintf(what, sizeof(what), "interleaved S=%s V=%s M=%s%s%s %s %s", runs[i].S,
			 runs[i].V, runs[i].M, runs[i].layers ? " layers " : "",
			 runs[i].layers ? runs[i].layers : "", runs[i].arch, runs[i].opt);
		if (same_run(what, &one, &pipe))
			CHECK_MSG(last_pieces == atoi(runs[i].S) * atoi(runs[i].V),
				  "%s: %d pieces, not stages x chunks", what, last_pieces);
		config_free(&one);
		config_free(&pipe);
	}
}

/* interleaved resumes exactly (a checkpoint of S x V pieces holds the
 * global arena), from its own checkpoint and from 1f1b's; with replicas
 * it equals the serial replicas. */
TEST(interleaved_resumes_and_replicates_exactly)
{
	struct config il, f;
	base_config(&il, "llama", "muon");
	config_set_key(&il, "train", "schedule", "interleaved", "test");
	config_set_key(&il, "pipeline", "stages", "2", "test");
	config_set_key(&il, "pipeline", "virtual_stages", "2", "test");
	check_resume("interleaved S=2 V=2", &il, &il, 7);
	base_config(&f, "llama", "muon");
	config_set_key(&f, "train", "schedule", "1f1b", "test");
	config_set_key(&f, "pipeline", "stages", "3", "test");
	check_resume("1f1b S=3 -> interleaved S=2 V=2", &f, &il, 6);
	config_free(&il);
	config_free(&f);
	if (test_failed())
		return;
	struct config one, pipe;
	base_config(&one, "gpt2", "adamw");
	config_set_key(&one, "pipeline", "micro_batches", "8", "test");
	config_set_key(&one, "pipeline", "data_parallel", "2", "test");
	base_config(&pipe, "gpt2", "adamw");
	config_set_key(&pipe, "train", "schedule", "interleaved", "test");
	config_set_key(&pipe, "pipeline", "stages", "2", "test");
	config_set_key(&pipe, "pipeline", "virtual_stages", "2", "test");
	config_set_key(&pipe, "pipeline", "micro_batches", "8", "test");
	config_set_key(&pipe, "pipeline", "data_parallel", "2", "test");
	config_set_key(&pipe, "pipeline", "bucket_mb", "0.0001", "test");
	same_run("interleaved S=2 V=2 N=2 M=8 gpt2 adamw, buckets", &one, &pipe);
	config_free(&one);
	config_free(&pipe);
}

/* zb-v: two chunks per stage in a V (stage s holds pieces s and 2S-1-s),
 * the backward split == one worker, M >= 2S; one stage (both handoffs
 * local) to three, an uneven cut over the pieces, resume. */
TEST(zbv_equals_one_worker)
{
	static const struct {
		const char *arch, *opt, *S, *M, *layers;
	} runs[] = {
		{"llama", "adamw", "2", "4", NULL}, {"gpt2", "muon", "2", "7", NULL},
		{"gpt2", "adamw", "1", "3", NULL},  {"llama", "muon", "3", "6", NULL},
		{"gpt2", "adamw", "2", "5", "0,2,1,1"},
	};
	for (size_t i = 0; i < ARRAY_SIZE(runs) && !test_failed(); i++) {
		struct config one, pipe;
		base_config(&one, runs[i].arch, runs[i].opt);
		config_set_key(&one, "pipeline", "micro_batches", runs[i].M, "test");
		base_config(&pipe, runs[i].arch, runs[i].opt);
		config_set_key(&pipe, "train", "schedule", "zb-v", "test");
		config_set_key(&pipe, "pipeline", "micro_batches", runs[i].M, "test");
		if (runs[i].layers) {
			config_set_key(&pipe, "pipeline", "split", "layers", "test");
			config_set_key(&pipe, "pipeline", "layers", runs[i].layers, "test");
		}
		config_set_key(&pipe, "pipeline", "stages", runs[i].S, "test");
		char what[128];
		snprintf(what, sizeof(what), "zb-v S=%s M=%s%s%s %s %s", runs[i].S, runs[i].M,
			 runs[i].layers ? " layers " : "", runs[i].layers ? runs[i].layers : "",
			 runs[i].arch, runs[i].opt);
		if (same_run(what, &one, &pipe))
			CHECK_MSG(last_pieces == 2 * atoi(runs[i].S), "%s: %d pieces, not 2 per stage",
				  what, last_pieces);
		config_free(&one);
		config_free(&pipe);
	}
	if (test_failed())
		return;
	struct config zv;
	base_config(&zv, "llama", "muon");
	config_set_key(&zv, "train", "schedule", "zb-v", "test");
	config_set_key(&zv, "pipeline", "stages", "2", "test");
	check_resume("zb-v S=2", &zv, &zv, 7);
	config_free(&zv);
}
