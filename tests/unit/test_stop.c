/* test_stop.c - a pipeline asked to stop (trainer.stop: SIGTERM, SIGINT)
 * stops within a few steps of the request, not at the end of its segment,
 * and what it ran is exactly the first steps of the uninterrupted run:
 * continuing from there to the end gives the same losses and the same
 * final weights, bit for bit. For every schedule, with 2 and 4 stages, and
 * with 2 data-parallel replicas (whose requests must agree too).
 */
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "../../sched/trainer.h"
#include "../test.h"
#include "../tiny_model.h"

#define STEPS 20

struct result {
	double loss[STEPS];
	float *weights; /* the newest weights, global arena */
	size_t numel;
	long stopped_at; /* steps done when the first trainer_run returned */
};

/* Train STEPS steps of cfg: a first trainer_run of all of them with the
 * stop already asked for when `stop` (it returns early), then the rest. */
static int train(const struct config *cfg, int stop, struct result *r)
{
	static uint32_t tok[20000];
	tiny_tokens(tok, ARRAY_SIZE(tok));
	struct dataloader dl;
	if (dataloader_from_tokens(&dl, tok, ARRAY_SIZE(tok), TINY_VOCAB,
				   (int)cfg->train_batch_size, (int)cfg->model_seq_len, 7, 1))
		return -1;
	struct model m;
	if (tiny_model(&m, cfg))
		return -1;
	float *params = xmalloc(m.numel * sizeof(float));
	model_init_weights(&m, params, 1234);
	struct trainer tr;
	int rc = trainer_init(&tr, cfg, &m, test_backend(), params, &dl);
	free(params);
	if (rc)
		return -1;
	volatile int asked = stop;
	tr.stop = &asked;
	struct step_stats st[STEPS];
	r->stopped_at = -1;
	while (!rc && tr.step < STEPS) {
		long first = tr.step;
		rc = trainer_run(&tr, (int)(STEPS - first), st);
		for (long i = first; !rc && i < tr.step; i++)
			r->loss[i] = st[i - first].loss;
		if (r->stopped_at < 0)
			r->stopped_at = tr.step;
		asked = 0;
	}
	r->numel = m.numel;
	r->weights = xmalloc(m.numel * sizeof(float));
	trainer_gather_weights(&tr, 0, r->weights);
	trainer_free(&tr);
	model_free(&m);
	dataloader_close(&dl);
	return rc;
}

static void set(struct config *cfg, const char *section, const char *key, const char *value)
{
	if (config_set_key(cfg, section, key, value, "test"))
		die("test: cannot set %s.%s = %s", section, key, value);
}

/* One schedule and shape: asked before the first step, the run stops
 * within S + 1 steps, and continuing it gives the uninterrupted run's bits. */
static int stops_early_and_exactly(const char *kind, const char *stages, const char *replicas)
{
	struct config cfg;
	tiny_config(&cfg, "llama", "adamw");
	/* "interleaved/V": V chunks per stage */
	char name[32];
	snprintf(name, sizeof(name), "%s", kind);
	char *v = strchr(name, '/');
	if (v) {
		*v++ = 0;
		set(&cfg, "pipeline", "virtual_stages", v);
	}
	set(&cfg, "train", "schedule", name);
	set(&cfg, "pipeline", "stages", stages);
	set(&cfg, "pipeline", "data_parallel", replicas);
	config_finish(&cfg);
	int S = atoi(stages), ok = 1;
	struct result whole = {0}, parts = {0};
	if (train(&cfg, 0, &whole) || train(&cfg, 1, &parts)) {
		test_fail(__FILE__, __LINE__, "%s, %s stages x %s replicas: %s", kind, stages,
			  replicas, last_error());
		ok = 0;
	} else if (whole.stopped_at != STEPS) {
		test_fail(__FILE__, __LINE__, "%s: an unasked run stopped at %ld", kind,
			  whole.stopped_at);
		ok = 0;
	} else if (parts.stopped_at < 1 || parts.stopped_at > S + 1) {
		/* the request rides on the first step's posts; a stage may have
		 * begun at most S more steps (pipedream) when it learns of it */
		test_fail(__FILE__, __LINE__, "%s, %d stages x %s replicas: asked to stop before "
			  "the first step, it ran %ld of the segment's %d steps", kind, S, replicas,
			  parts.stopped_at, STEPS);
		ok = 0;
	}
	for (int i = 0; ok && i < STEPS; i++)
		if (memcmp(&whole.loss[i], &parts.loss[i], sizeof(double))) {
			test_fail(__FILE__, __LINE__, "%s, %d stages x %s replicas, stopped "
				  "after %ld steps: step %d loss %.9g != %.9g", kind, S,
				  replicas, parts.stopped_at, i + 1, parts.loss[i], whole.loss[i]);
			ok = 0;
		}
	if (ok && memcmp(whole.weights, parts.weights, whole.numel * sizeof(float))) {
		test_fail(__FILE__, __LINE__, "%s, %d stages x %s replicas, stopped after %ld "
			  "steps: the final weights differ", kind, S, replicas, parts.stopped_at);
		ok = 0;
	}
	if (ok)
		fprintf(stderr, "# %s, %d stages x %s replicas: asked before step 1, stopped after "
			"step %ld\n", kind, S, replicas, parts.stopped_at);
	free(whole.weights);
	free(parts.weights);
	config_free(&cfg);
	return ok;
}

TEST(stop_within_a_segment_keeps_the_bits)
{
	static const char *const kinds[] = {"gpipe", "1f1b", "2bw", "pipedream", "zb-h1", "2bw-zb"};
	static const struct {
		const char *stages, *replicas;
	} shapes[] = {{"2", "1"}, {"4", "1"}, {"2", "2"}};
	for (size_t k = 0; k < ARRAY_SIZE(kinds); k++)
		for (size_t h = 0; h < ARRAY_SIZE(shapes); h++)
			if (!stops_early_and_exactly(kinds[k], shapes[h].stages,
						     shapes[h].replicas))
				return;
	/* several pieces per stage: a stage's thread stops its pieces alike */
	static const char *const chunked[][3] = {{"interleaved/2", "2", "1"},
						 {"interleaved/2", "2", "2"},
						 {"zb-v", "2", "1"}, {"zb-v", "1", "2"}};
	for (size_t k = 0; k < ARRAY_SIZE(chunked); k++)
		if (!stops_early_and_exactly(chunked[k][0], chunked[k][1], chunked[k][2]))
			return;
}
