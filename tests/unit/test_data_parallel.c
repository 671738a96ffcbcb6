/* test_data_parallel.c - data-parallel replicas (pipeline.data_parallel = N)
 * against one replica, in threads.
 *
 * What must hold, and how exactly:
 *
 * 1. Bit for bit, on any data: a replicated pipeline equals the replicated
 *    single-thread trainer (train.schedule = none) with the same N and M.
 *    Both accumulate each replica's micro-batches in ascending order and sum
 *    the replicas in replica order; the executor's threads and messages
 *    change nothing. Likewise 2bw == delay 1, pipedream == per-stage delay.
 *
 * 2. Bit for bit, where the arithmetic is the same: N = 2 replicas of one
 *    micro-batch each (M = 2) against N = 1 with M = 2. One replica adds
 *    g1 into the accumulator holding g0; two replicas compute g1 from zero
 *    and add g0 + g1. The two agree when every kernel computes a
 *    micro-batch's contribution and then adds it (matrix products, whose
 *    K = B*T fits one OpenBLAS block; bias and norm gradients, summed in a
 *    local accumulator first). The embedding backward adds rows one at a
 *    time into the accumulator, so a token that occurs twice in a
 *    micro-batch (or wpe with B > 1) gets (g0 + a) + b instead of
 *    g0 + (a + b). The exact test therefore uses B = 1 and a token stream in
 *    which no token repeats within 17 consecutive positions; on such data
 *    every step's loss and the final weights must be identical.
 *
 * 3. Within a tolerance otherwise: N = 2 with M = 4 sums
 *    (g0 + g1) + (g2 + g3) where N = 1 sums ((g0 + g1) + g2) + g3. The
 *    difference starts at one rounding of the gradient (relative ~6e-8) and
 *    the optimizer carries it on; over 20 steps the losses must agree to a
 *    relative 1e-5 (measured: below 1e-6; see LOSS_RTOL) and step 1's loss,
 *    computed before any update, exactly.
 *
 * 4. The replicas' weights and optimizer state stay bit-identical to each
 *    other; a checkpoint of a replicated run resumes exactly; bad
 *    configurations are refused with a message that names the fix.
 *
 * Both architectures, AdamW and Muon, over 20 steps.
 */
#include <stdlib.h>
#include <string.h>

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
/* relative tolerance on every step's loss when the sum order differs (3.) */
#define LOSS_RTOL 1e-5

enum data_kind { DATA_NOISY, DATA_NO_REPEAT };

struct run_result {
	double loss[STEPS];
	float *weights; /* final newest weights of replica 0, global arena */
	size_t numel;
	long buckets;   /* of the replicas' sum, every stage of every replica */
};

static void set(struct config *cfg, const char *section, const char *key, const char *value)
{
	config_set_key(cfg, section, key, value, "test");
}

/* DATA_NOISY: test_equivalence's stream (a cycle with 1 in 4 tokens
 * random). DATA_NO_REPEAT: every token differs from the 16 before it, so a
 * window of seq_len + 1 = 17 tokens holds no token twice. */
static void tokens_for_test(uint32_t *tok, size_t n, enum data_kind kind)
{
	if (kind == DATA_NOISY) {
		tiny_tokens(tok, n);
		return;
	}
	uint64_t s = 99;
	for (size_t i = 0; i < n; i++) {
		for (;;) {
			/* mostly the cycle, so there is something to learn */
			uint32_t t = (rng_next(&s) % 4 == 0) ? (uint32_t)(rng_next(&s) % VOCAB)
							     : (uint32_t)((i * 7) % VOCAB);
			int clash = 0;
			for (size_t j = i > 16 ? i - 16 : 0; j < i; j++)
				clash |= tok[j] == t;
			if (!clash) {
				tok[i] = t;
				break;
			}
		}
	}
}

/* Every replica's stages against replica 0's: each alive weight version and
 * every optimizer state buffer, bit for bit. Returns 1 when they agree. */
static int replicas_identical(struct trainer *tr, char *why, size_t len)
{
	size_t n = tr->m->numel;
	float *a = xcalloc(n, sizeof(float)), *b = xcalloc(n, sizeof(float));
	int ok = 1;
	for (int r = 1; r < tr->N && ok; r++)
		for (int s = 0; s < tr->S && ok; s++) {
			struct stage_worker *w0 = trainer_worker(tr, 0, s), *wr = trainer_worker(tr, r, s);
			if (w0->newest != wr->newest) {
				snprintf(why, len, "replica %d stage %d at version %ld, replica 0 %ld", r,
					 s, wr->newest, w0->newest);
				ok = 0;
				break;
			}
			for (int back = 0; back <= w0->delay && ok; back++) {
				long v = w0->newest - back;
				if (v < 0)
					break;
				worker_save_version(w0, v, a);
				worker_save_version(wr, v, b);
				if (memcmp(a, b, n * sizeof(float))) {
					snprintf(why, len, "replica %d stage %d version %ld differs", r, s, v);
					ok = 0;
				}
			}
			for (int i = 0; i < optim_state_count(&w0->opt) && ok; i++) {
				struct optim_state_buf x = optim_state(&w0->opt, i);
				struct optim_state_buf y = optim_state(&wr->opt, i);
				if (x.numel != y.numel ||
				    memcmp(x.data, y.data, x.numel * sizeof(float))) {
					snprintf(why, len, "replica %d stage %d optimizer state '%s' differs",
						 r, s, x.name);
					ok = 0;
				}
			}
		}
	free(a);
	free(b);
	return ok;
}

/* Train `steps` steps (in chunks of `chunk`) under cfg on `data`,
 * optionally resuming from `resume_from` and saving to `save_to` at the
 * end; losses go to r->loss[first_step ...]. Checks after every chunk that
 * the replicas agree. */
static int train(const struct config *cfg, enum data_kind data, int steps, int chunk,
		 const char *resume_from, const char *save_to, struct run_result *r)
{
	static uint32_t tok[20000];
	tokens_for_test(tok, ARRAY_SIZE(tok), data);
	struct dataloader dl;
	if (dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, (int)cfg->train_batch_size,
				   (int)cfg->model_seq_len, 7, 1))
		return -1;
	struct model m;
	if (tiny_model(&m, cfg))
		return -1;
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	struct trainer tr;
	const struct backend *be = strcmp(cfg->train_act_dtype, "bf16") ? &backend_cpu
									: &backend_cpu_bf16;
	int rc = trainer_init(&tr, cfg, &m, be, params, &dl);
	free(params);
	if (rc)
		return -1;
	if (resume_from) {
		struct ckpt *k;
		if (ckpt_open(&k, resume_from) || trainer_load(&tr, k))
			return -1;
		ckpt_close(k);
	}
	char why[160];
	if (!replicas_identical(&tr, why, sizeof(why)))
		return error("after loading: %s", why);
	long first = tr.step;
	struct step_stats st[STEPS];
	for (int done = 0; done < steps;) {
		int n = MIN(chunk, steps - done);
		if (trainer_run(&tr, n, st))
			return error("trainer_run failed at step %ld", tr.step + 1);
		for (int i = 0; i < n; i++)
			r->loss[first + done + i] = st[i].loss;
		done += n;
		if (!replicas_identical(&tr, why, sizeof(why)))
			return error("after step %ld: %s", tr.step, why);
	}
	r->numel = m.numel;
	r->buckets = 0;
	for (int i = 0; i < tr.N * tr.S; i++)
		r->buckets += tr.w[i].buckets;
	free(r->weights);
	r->weights = xmalloc(m.numel * sizeof(float));
	trainer_gather_weights(&tr, 0, r->weights);
	if (save_to) {
		char *text = config_to_string(cfg);
		rc = trainer_save(&tr, save_to, text, NULL);
		free(text);
	}
	trainer_free(&tr);
	model_free(&m);
	dataloader_close(&dl);
	return rc;
}

/* Run a and b; compare all losses and the final weights bit for bit
 * (rtol = 0) or the losses within rtol (step 1 exactly). */
static int compare_runs(const char *what, const struct config *a, const struct config *b,
			enum data_kind data, double rtol, double *max_rel)
{
	struct run_result ra = {0}, rb = {0};
	int ok = !train(a, data, STEPS, 5, NULL, NULL, &ra) &&
		 !train(b, data, STEPS, 5, NULL, NULL, &rb);
	if (!ok) {
		test_fail(__FILE__, __LINE__, "%s: training failed: %s", what, last_error());
		return 0;
	}
	double worst = 0.0;
	for (int i = 0; i < STEPS && ok; i++) {
		double rel = fabs(ra.loss[i] - rb.loss[i]) / fabs(ra.loss[i]);
		worst = MAX(worst, rel);
		int same = !memcmp(&ra.loss[i], &rb.loss[i], sizeof(double));
		if (rtol == 0 ? !same : (i == 0 ? !same : !(rel <= rtol))) {
			test_fail(__FILE__, __LINE__, "%s: step %d loss %.9g != %.9g (relative %.2g)",
				  what, i + 1, ra.loss[i], rb.loss[i], rel);
			ok = 0;
		}
	}
	if (ok && rtol == 0 && memcmp(ra.weights, rb.weights, ra.numel * sizeof(float))) {
		test_fail(__FILE__, __LINE__, "%s: final weights differ", what);
		ok = 0;
	}
	/* the runs must have trained: a constant loss would make this vacuous */
	if (ok && !(ra.loss[STEPS - 1] < ra.loss[0] - 0.02)) {
		test_fail(__FILE__, __LINE__, "%s: loss did not fall (%.4f -> %.4f)", what, ra.loss[0],
			  ra.loss[STEPS - 1]);
		ok = 0;
	}
	if (max_rel)
		*max_rel = MAX(*max_rel, worst);
	free(ra.weights);
	free(rb.weights);
	return ok;
}

static int same_run(const char *what, const struct config *a, const struct config *b,
		    enum data_kind data)
{
	return compare_runs(what, a, b, data, 0.0, NULL);
}

static const char *const archs[] = {"llama", "gpt2"};
static const char *const optims[] = {"adamw", "muon"};

#define FOR_EACH_ARCH_OPTIM(a, o)                    \
	for (int ia = 0; ia < 2; ia++)               \
		for (int io = 0; io < 2; io++)       \
			for (const char *a = archs[ia], *o = optims[io]; a; a = NULL)

/* 1. the executor's replicas == the serial replicas, any data */
TEST(replicated_pipelines_equal_replicated_one_worker)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, pipe;
		char what[128];
		/* gpipe, 1f1b: S = 2, N = 2, M = 4 (two micro-batches per replica) */
		tiny_config(&one, arch, opt);
		set(&one, "pipeline", "data_parallel", "2");
		const char *kinds[] = {"gpipe", "1f1b"};
		for (int k = 0; k < 2; k++) {
			tiny_config(&pipe, arch, opt);
			set(&pipe, "train", "schedule", kinds[k]);
			set(&pipe, "pipeline", "stages", "2");
			set(&pipe, "pipeline", "data_parallel", "2");
			snprintf(what, sizeof(what), "%s S=2 N=2 %s %s", kinds[k], arch, opt);
			if (!same_run(what, &one, &pipe, DATA_NOISY))
				return;
			config_free(&pipe);
		}
		config_free(&one);
		/* 2bw S=2 N=2 == delay 1 N=2 */
		tiny_config(&one, arch, opt);
		set(&one, "train", "delay", "1");
		set(&one, "pipeline", "data_parallel", "2");
		tiny_config(&pipe, arch, opt);
		set(&pipe, "train", "schedule", "2bw");
		set(&pipe, "pipeline", "stages", "2");
		set(&pipe, "pipeline", "data_parallel", "2");
		snprintf(what, sizeof(what), "2bw S=2 N=2 %s %s", arch, opt);
		if (!same_run(what, &one, &pipe, DATA_NOISY))
			return;
		config_free(&one);
		config_free(&pipe);
	}
}

/* The replicas' sum in buckets started during the step's last backward
 * (the zero-bubble kinds: its last W) (pipeline.bucket_mb) gives the one sum's bits, on every schedule. Tiny
 * buckets (26 floats) make one bucket per run of tensors finished together
 * (the head's, each layer's, the embeddings'), so every point of the
 * backward that reports ranges is crossed; 0.1 MiB joins neighbouring
 * layers into one bucket. */
TEST(bucketed_replica_sums_equal_one_sum)
{
	static const char *const kinds[][2] = {{"gpipe", "2"}, {"1f1b", "2"}, {"2bw", "2"},
					       {"pipedream", "3"}, {"1f1b", "1"}, {"zb-h1", "3"},
					       {"2bw-zb", "2"}};
	static const char *const sizes[] = {"0", "0.0001", "0.1"};
	for (size_t k = 0; k < ARRAY_SIZE(kinds) && !test_failed(); k++)
		for (int ia = 0; ia < 2 && !test_failed(); ia++) {
			struct run_result r[3];
			memset(r, 0, sizeof(r));
			char what[96];
			for (int i = 0; i < 3; i++) {
				struct config cfg;
				tiny_config(&cfg, archs[ia], "adamw");
				set(&cfg, "train", "schedule", kinds[k][0]);
				set(&cfg, "pipeline", "stages", kinds[k][1]);
				set(&cfg, "pipeline", "data_parallel", "2");
				set(&cfg, "pipeline", "bucket_mb", sizes[i]);
				snprintf(what, sizeof(what), "%s S=%s N=2 %s, bucket_mb %s",
					 kinds[k][0], kinds[k][1], archs[ia], sizes[i]);
				if (train(&cfg, DATA_NOISY, STEPS, 7, NULL, NULL, &r[i]))
					test_fail(__FILE__, __LINE__, "%s: %s", what, last_error());
				else if (i && (memcmp(r[0].loss, r[i].loss, sizeof(r[0].loss)) ||
					       memcmp(r[0].weights, r[i].weights,
						      r[0].numel * sizeof(float))))
					test_fail(__FILE__, __LINE__, "%s: the bits differ from one sum's "
						  "(step 1 %.9g vs %.9g)", what, r[0].loss[0],
						  r[i].loss[0]);
				config_free(&cfg);
			}
			/* none with 0; with tiny ones, at least one per stage of both
			 * replicas and step, more than with 0.1 MiB, which has some */
			long S = atol(kinds[k][1]);
			CHECK_MSG(r[0].buckets == 0 && r[1].buckets >= 2 * STEPS * 2 * S &&
					  r[2].buckets >= 2 * STEPS * S && r[2].buckets < r[1].buckets,
				  "%s S=%s %s: %ld / %ld / %ld buckets", kinds[k][0], kinds[k][1],
				  archs[ia], r[0].buckets, r[1].buckets, r[2].buckets);
			for (int i = 0; i < 3; i++)
				free(r[i].weights);
		}
}

/* The zero-bubble kinds: the replicas' sum starts after the step's last W
 * (B leaves the gradients alone), so zb-h1 == the serial replicas and
 * 2bw-zb == delay 1, S = 2 and 4, N = 2. */
TEST(replicated_zero_bubble_kinds_equal_their_emulation)
{
	for (int ia = 0; ia < 2; ia++)
		for (int k = 0; k < 2; k++) {
			struct config one, pipe;
			char what[128];
			const char *S = ia ? "4" : "2", *opt = optims[(ia + k) % 2];
			tiny_config(&one, archs[ia], opt);
			set(&one, "pipeline", "data_parallel", "2");
			set(&one, "pipeline", "micro_batches", "8");
			set(&one, "train", "delay", k ? "1" : "0");
			tiny_config(&pipe, archs[ia], opt);
			set(&pipe, "train", "schedule", k ? "2bw-zb" : "zb-h1");
			set(&pipe, "pipeline", "stages", S);
			set(&pipe, "pipeline", "data_parallel", "2");
			set(&pipe, "pipeline", "micro_batches", "8");
			snprintf(what, sizeof(what), "%s S=%s N=2 M=8 %s %s", k ? "2bw-zb" : "zb-h1", S,
				 archs[ia], opt);
			if (!same_run(what, &one, &pipe, DATA_NOISY))
				return;
			config_free(&one);
			config_free(&pipe);
		}
}

/* The same with activations stored as bf16 (train.act_dtype = bf16). */
TEST(bf16_replicated_pipelines_equal_replicated_one_worker)
{
	static const char *const kinds[] = {"llama", "gpt2"};
	for (int k = 0; k < 2; k++) {
		struct config one, pipe;
		char what[128];
		tiny_config(&one, kinds[k], "adamw");
		set(&one, "train", "act_dtype", "bf16");
		set(&one, "pipeline", "data_parallel", "2");
		set(&one, "train", "delay", k ? "1" : "0");
		tiny_config(&pipe, kinds[k], "adamw");
		set(&pipe, "train", "act_dtype", "bf16");
		set(&pipe, "train", "schedule", k ? "2bw" : "1f1b");
		set(&pipe, "pipeline", "stages", "2");
		set(&pipe, "pipeline", "data_parallel", "2");
		snprintf(what, sizeof(what), "bf16 %s S=2 N=2 %s adamw", k ? "2bw" : "1f1b", kinds[k]);
		if (!same_run(what, &one, &pipe, DATA_NOISY))
			return;
		config_free(&one);
		config_free(&pipe);
	}
}

TEST(replicated_2bw_with_correction_and_pipedream_equal_their_emulation)
{
	struct config one, pipe;
	/* 2bw + error feedback on 4 stages, 2 replicas of 4 micro-batches */
	tiny_config(&one, "gpt2", "muon");
	set(&one, "train", "delay", "1");
	set(&one, "optim", "correction", "ef");
	set(&one, "pipeline", "micro_batches", "8");
	set(&one, "pipeline", "data_parallel", "2");
	tiny_config(&pipe, "gpt2", "muon");
	set(&pipe, "train", "schedule", "2bw");
	set(&pipe, "optim", "correction", "ef");
	set(&pipe, "pipeline", "stages", "4");
	set(&pipe, "pipeline", "micro_batches", "8");
	set(&pipe, "pipeline", "data_parallel", "2");
	if (!same_run("2bw+ef S=4 N=2 gpt2 muon", &one, &pipe, DATA_NOISY))
		return;
	config_free(&one);
	config_free(&pipe);
	/* pipedream's step is one micro-batch per replica: N = 2 on 4 stages
	 * == one worker, per-stage delay, 2 micro-batches, 2 replicas */
	tiny_config(&one, "llama", "adamw");
	set(&one, "train", "delay_mode", "per-stage");
	set(&one, "pipeline", "stages", "4");
	set(&one, "pipeline", "micro_batches", "2");
	set(&one, "pipeline", "data_parallel", "2");
	tiny_config(&pipe, "llama", "adamw");
	set(&pipe, "train", "schedule", "pipedream");
	set(&pipe, "pipeline", "stages", "4");
	set(&pipe, "pipeline", "data_parallel", "2");
	if (!same_run("pipedream S=4 N=2 llama adamw", &one, &pipe, DATA_NOISY))
		return;
	config_free(&one);
	config_free(&pipe);
	/* three replicas (chunks of unequal length), S = 1 with the tied head
	 * kept apart: 1f1b S=1 N=3 M=6 == one worker N=3 */
	tiny_config(&one, "llama", "muon");
	set(&one, "pipeline", "micro_batches", "6");
	set(&one, "pipeline", "data_parallel", "3");
	tiny_config(&pipe, "llama", "muon");
	set(&pipe, "train", "schedule", "1f1b");
	set(&pipe, "pipeline", "micro_batches", "6");
	set(&pipe, "pipeline", "data_parallel", "3");
	if (!same_run("1f1b S=1 N=3 llama muon", &one, &pipe, DATA_NOISY))
		return;
	config_free(&pipe);
	tiny_config(&pipe, "llama", "muon");
	set(&pipe, "train", "schedule", "gpipe");
	set(&pipe, "pipeline", "stages", "3");
	set(&pipe, "pipeline", "micro_batches", "6");
	set(&pipe, "pipeline", "data_parallel", "3");
	if (!same_run("gpipe S=3 N=3 llama muon", &one, &pipe, DATA_NOISY))
		return;
	config_free(&one);
	config_free(&pipe);
}

/* 2. one micro-batch per replica == N = 1, bit for bit (B = 1, no token
 * twice in a window: see the top of the file) */
TEST(two_replicas_of_one_micro_batch_equal_one_replica_exactly)
{
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, dp;
		char what[128];
		/* one: N = 1 on one worker (sync pipelines equal it, 2bw equals
		 * delay 1); dp: 2 replicas of one micro-batch each */
		struct {
			const char *one_delay, *schedule, *stages, *delay;
		} v[] = {
			{"0", "none", "1", "0"},  {"0", "gpipe", "2", "0"}, {"0", "1f1b", "2", "0"},
			{"1", "2bw", "1", "0"},   {"1", "none", "1", "1"},
		};
		for (size_t i = 0; i < ARRAY_SIZE(v); i++) {
			tiny_config(&one, arch, opt);
			set(&one, "train", "batch_size", "1");
			set(&one, "pipeline", "micro_batches", "2");
			set(&one, "train", "delay", v[i].one_delay);
			tiny_config(&dp, arch, opt);
			set(&dp, "train", "batch_size", "1");
			set(&dp, "pipeline", "micro_batches", "2");
			set(&dp, "pipeline", "data_parallel", "2");
			set(&dp, "train", "schedule", v[i].schedule);
			set(&dp, "pipeline", "stages", v[i].stages);
			set(&dp, "train", "delay", v[i].delay);
			snprintf(what, sizeof(what), "N=2 M=2 %s S=%s delay=%s vs N=1 delay=%s %s %s",
				 v[i].schedule, v[i].stages, v[i].delay, v[i].one_delay, arch, opt);
			if (!same_run(what, &one, &dp, DATA_NO_REPEAT))
				return;
			config_free(&one);
			config_free(&dp);
		}
	}
}

TEST(pipedream_replicas_of_one_micro_batch_equal_one_worker_exactly)
{
	/* pipedream N=2 S=2: each step is micro-batches 2t and 2t+1 */
	struct config one, dp;
	tiny_config(&one, "gpt2", "adamw");
	set(&one, "train", "batch_size", "1");
	set(&one, "train", "delay_mode", "per-stage");
	set(&one, "pipeline", "stages", "2");
	set(&one, "pipeline", "micro_batches", "2");
	tiny_config(&dp, "gpt2", "adamw");
	set(&dp, "train", "batch_size", "1");
	set(&dp, "train", "schedule", "pipedream");
	set(&dp, "pipeline", "stages", "2");
	set(&dp, "pipeline", "data_parallel", "2");
	same_run("pipedream N=2 S=2 vs per-stage delay M=2 N=1", &one, &dp, DATA_NO_REPEAT);
	config_free(&one);
	config_free(&dp);
}

static void check_resume(const char *what, const struct config *cfg_a, const struct config *cfg_b,
			 enum data_kind data, int k);

/* 1. and 4. for a mixture-of-experts llama (4 experts, top-2, a shared
 * expert): replicated 1f1b and 2bw equal their replicated one-worker
 * forms, and a replicated 2bw run resumes exactly. */
TEST(replicated_moe_equals_its_emulation_and_resumes)
{
	struct config one, pipe;
	static const char *const keys[][2] = {{"n_expert", "4"}, {"top_k", "2"},
					      {"d_expert", "16"}, {"shared_expert", "1"},
					      {"aux_loss_coef", "0.1"}};
	if (!test_backend()->moe_route || !test_backend()->moe_expert_forward)
		SKIP("the backend has no MoE ops");
	for (int bw = 0; bw < 2; bw++) {
		tiny_config(&one, "llama", bw ? "muon" : "adamw");
		tiny_config(&pipe, "llama", bw ? "muon" : "adamw");
		for (size_t i = 0; i < ARRAY_SIZE(keys); i++) {
			set(&one, "model", keys[i][0], keys[i][1]);
			set(&pipe, "model", keys[i][0], keys[i][1]);
		}
		set(&one, "pipeline", "data_parallel", "2");
		set(&pipe, "pipeline", "data_parallel", "2");
		set(&pipe, "pipeline", "stages", "2");
		set(&pipe, "train", "schedule", bw ? "2bw" : "1f1b");
		if (bw)
			set(&one, "train", "delay", "1");
		if (!same_run(bw ? "moe 2bw S=2 N=2" : "moe 1f1b S=2 N=2", &one, &pipe, DATA_NOISY))
			return;
		if (bw)
			check_resume("moe 2bw S=2 N=2", &pipe, &pipe, DATA_NOISY, 9);
		config_free(&one);
		config_free(&pipe);
	}
}

/* 3. half the micro-batches each == N = 1 within LOSS_RTOL */
TEST(two_replicas_match_one_replica_within_tolerance)
{
	double worst = 0.0;
	FOR_EACH_ARCH_OPTIM(arch, opt) {
		struct config one, dp;
		char what[128];
		struct {
			const char *schedule, *stages;
		} v[] = {{"none", "1"}, {"1f1b", "2"}, {"2bw", "2"}};
		for (size_t i = 0; i < ARRAY_SIZE(v); i++) {
			int bw = !strcmp(v[i].schedule, "2bw");
			tiny_config(&one, arch, opt);
			if (bw)
				set(&one, "train", "delay", "1");
			tiny_config(&dp, arch, opt);
			set(&dp, "pipeline", "data_parallel", "2");
			set(&dp, "train", "schedule", v[i].schedule);
			set(&dp, "pipeline", "stages", v[i].stages);
			snprintf(what, sizeof(what), "N=2 M=4 %s S=%s vs N=1 %s %s", v[i].schedule,
				 v[i].stages, arch, opt);
			if (!compare_runs(what, &one, &dp, DATA_NOISY, LOSS_RTOL, &worst))
				return;
			config_free(&one);
			config_free(&dp);
		}
	}
	/* the bound is not vacuous: the sums really differ somewhere */
	CHECK_MSG(worst > 0, "no difference at all: is the tolerance test testing anything?");
	printf("# largest relative loss difference over 20 steps: %.3g (tolerance %g)\n", worst,
	       LOSS_RTOL);
}

/* 4. checkpoints */
static void check_resume(const char *what, const struct config *cfg_a, const struct config *cfg_b,
			 enum data_kind data, int k)
{
	struct run_result full = {0}, part = {0};
	char path[512];
	snprintf(path, sizeof(path), "%s/resume.ckpt", test_tmpdir());
	CHECK_MSG(!train(cfg_a, data, STEPS, 5, NULL, NULL, &full), "%s: %s", what, last_error());
	CHECK_MSG(!train(cfg_a, data, k, 5, NULL, path, &part), "%s: %s", what, last_error());
	CHECK_MSG(!train(cfg_b, data, STEPS - k, 4, path, NULL, &part), "%s: resume: %s", what,
		  last_error());
	for (int i = 0; i < STEPS; i++)
		CHECK_MSG(!memcmp(&full.loss[i], &part.loss[i], sizeof(double)),
			  "%s: step %d: %.9g uninterrupted, %.9g resumed", what, i + 1, full.loss[i],
			  part.loss[i]);
	CHECK_MSG(!memcmp(full.weights, part.weights, full.numel * sizeof(float)),
		  "%s: final weights differ", what);
	free(full.weights);
	free(part.weights);
}

TEST(replicated_checkpoint_resumes_exactly)
{
	struct config bw, none, one;
	tiny_config(&bw, "llama", "muon");
	set(&bw, "train", "schedule", "2bw");
	set(&bw, "pipeline", "stages", "2");
	set(&bw, "pipeline", "data_parallel", "2");
	set(&bw, "optim", "correction", "ef");
	check_resume("2bw S=2 N=2", &bw, &bw, DATA_NOISY, 9);
	config_free(&bw);
	if (test_failed())
		return;
	tiny_config(&none, "gpt2", "adamw");
	set(&none, "train", "delay", "1");
	set(&none, "pipeline", "data_parallel", "2");
	check_resume("delay=1 N=2", &none, &none, DATA_NOISY, 7);
	config_free(&none);
	if (test_failed())
		return;
	/* the file does not depend on the replicas: a run of 2 replicas of
	 * one micro-batch goes on as 1 replica of 2, exactly (see 2.) */
	tiny_config(&one, "llama", "adamw");
	set(&one, "train", "batch_size", "1");
	set(&one, "pipeline", "micro_batches", "2");
	set(&one, "train", "schedule", "1f1b");
	set(&one, "pipeline", "stages", "2");
	struct config dp;
	tiny_config(&dp, "llama", "adamw");
	set(&dp, "train", "batch_size", "1");
	set(&dp, "pipeline", "micro_batches", "2");
	set(&dp, "train", "schedule", "1f1b");
	set(&dp, "pipeline", "stages", "2");
	set(&dp, "pipeline", "data_parallel", "2");
	check_resume("1f1b N=2 -> N=1", &dp, &one, DATA_NO_REPEAT, 8);
	config_free(&one);
	config_free(&dp);
}

TEST(bad_replica_configurations_are_refused)
{
	static uint32_t tok[4000];
	tokens_for_test(tok, ARRAY_SIZE(tok), DATA_NOISY);
	struct dataloader dl;
	CHECK(!dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), VOCAB, 2, 16, 7, 1));
	struct config cfg;
	tiny_config(&cfg, "llama", "adamw");
	struct model m;
	CHECK(!tiny_model(&m, &cfg));
	float *params = xcalloc(m.numel, sizeof(float));
	struct {
		const char *key, *value, *key2, *value2, *msg;
	} bad[] = {
		{"data_parallel", "3", NULL, NULL, "not divisible by pipeline.data_parallel = 3"},
		{"data_parallel", "0", NULL, NULL, "pipeline.data_parallel = 0"}, /* past config */
		{"data_parallel", "2", "transport", "nccl", "nccl"},
		{"data_parallel", "4", "stages", "2", "2bw needs at least pipeline.stages = 2"},
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		struct config c;
		tiny_config(&c, "llama", "adamw");
		set(&c, "pipeline", bad[i].key, bad[i].value);
		if (!strcmp(bad[i].value, "0")) /* the config refuses it; trainer_init too */
			c.pipeline_data_parallel = 0;
		if (bad[i].key2)
			set(&c, "pipeline", bad[i].key2, bad[i].value2);
		if (strstr(bad[i].msg, "2bw"))
			set(&c, "train", "schedule", "2bw");
		struct trainer tr;
		int rc = trainer_init(&tr, &c, &m, &backend_cpu, params, &dl);
		CHECK_MSG(rc == -1, "%s = %s accepted", bad[i].key, bad[i].value);
		CHECK_MSG(strstr(last_error(), bad[i].msg), "%s = %s: '%s' does not say '%s'",
			  bad[i].key, bad[i].value, last_error(), bad[i].msg);
		trainer_free(&tr);
		config_free(&c);
	}
	free(params);
	model_free(&m);
	config_free(&cfg);
	dataloader_close(&dl);
}
