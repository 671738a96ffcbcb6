/* test_watch.c - cmd/train_watch.c: which steps are bad, which losses are
 * spikes, and which checkpoint a divergence falls back to. */
#include <math.h>
#include <string.h>

#include "../../cmd/train_watch.h"
#include "../../io/config/config.h"
#include "../test.h"

/* A watch for a one-stage run with train.delay = delay. */
static void watch_for(struct watch *w, struct config *cfg, struct trainer *tr, const char *delay,
		      const char *factor, const char *window)
{
	config_defaults(cfg);
	config_set_key(cfg, "train", "delay", delay, "test");
	config_set_key(cfg, "train", "spike_factor", factor, "test");
	config_set_key(cfg, "train", "spike_window", window, "test");
	config_finish(cfg);
	memset(tr, 0, sizeof(*tr));
	tr->cfg = cfg;
	tr->S = 1;
	watch_init(w, cfg, tr);
}

static enum watch_verdict step(struct watch *w, long s, double loss, double norm)
{
	struct step_stats st = {.loss = loss, .grad_norm = norm, .skipped = !isfinite(norm),
				.nonfinite = !isfinite(loss)};
	return watch_step(w, s, &st);
}

TEST(checkpoint_is_good_once_the_next_step_measured_it)
{
	struct config cfg;
	struct trainer tr;
	struct watch w;
	watch_for(&w, &cfg, &tr, "0", "10", "2");
	CHECK(step(&w, 1, 6.0, 1) == WATCH_GOOD);
	watch_saved(&w, 1, "ck1");
	CHECK(!w.good.path && watch_holds(&w, "ck1"));
	CHECK(step(&w, 2, 5.9, 1) == WATCH_GOOD);
	CHECK(w.good.path && !strcmp(w.good.path, "ck1") && w.good.step == 1);
	/* a step worse than the first loss measures ck2: not good, dropped */
	watch_saved(&w, 2, "ck2");
	CHECK(step(&w, 3, 6.5, 1) == WATCH_GOOD);
	CHECK(!strcmp(w.good.path, "ck1") && !watch_holds(&w, "ck2"));
	/* a skipped step drops the waiting one; so does a non-finite loss */
	watch_saved(&w, 3, "ck3");
	CHECK(step(&w, 4, 5.0, NAN) == WATCH_BAD && w.bad_in_row == 1);
	CHECK(!watch_holds(&w, "ck3") && watch_holds(&w, "ck1"));
	CHECK(step(&w, 5, INFINITY, 1) == WATCH_BAD && w.bad_in_row == 2);
	CHECK(step(&w, 6, 5.0, 1) == WATCH_GOOD && w.bad_in_row == 0);
	watch_free(&w);
	config_free(&cfg);
}

TEST(delay_measures_a_checkpoint_later)
{
	struct config cfg;
	struct trainer tr;
	struct watch w;
	watch_for(&w, &cfg, &tr, "2", "10", "2");
	CHECK(w.delay == 2);
	step(&w, 1, 6.0, 1);
	watch_saved(&w, 1, "ck1");
	watch_saved(&w, 2, "ck2"); /* every step: two wait at once */
	CHECK(step(&w, 2, 5.9, 1) == WATCH_GOOD && !w.good.path);
	CHECK(step(&w, 3, 5.9, 1) == WATCH_GOOD && !w.good.path);
	CHECK(step(&w, 4, 5.8, 1) == WATCH_GOOD && !strcmp(w.good.path, "ck1"));
	CHECK(watch_holds(&w, "ck2"));
	CHECK(step(&w, 5, 5.8, 1) == WATCH_GOOD && !strcmp(w.good.path, "ck2"));
	watch_free(&w);
	config_free(&cfg);
}

TEST(spike_after_the_window)
{
	struct config cfg;
	struct trainer tr;
	struct watch w;
	watch_for(&w, &cfg, &tr, "0", "10", "3");
	/* no test until 3 good steps */
	CHECK(step(&w, 1, 1.0, 1) == WATCH_GOOD);
	CHECK(step(&w, 2, 1.0, 1) == WATCH_GOOD);
	CHECK(step(&w, 3, 15.0, 1) == WATCH_GOOD); /* mean 1 but only 2 steps seen */
	/* mean of (1, 1, 15) = 17/3: above 10x that is a spike */
	CHECK(step(&w, 4, 56.0, 1) == WATCH_GOOD);
	watch_saved(&w, 4, "ck4");
	CHECK(step(&w, 5, 1000.0, 1) == WATCH_SPIKE);
	CHECK(!watch_holds(&w, "ck4"));
	CHECK_NEAR(w.spike_mean, (1.0 + 15 + 56) / 3, 1e-9);
	/* a spike is not history: the same mean again */
	CHECK(step(&w, 6, 1000.0, 1) == WATCH_SPIKE);
	/* restarted (a rollback): no test until 3 good steps again */
	watch_restart(&w);
	CHECK(step(&w, 7, 1000.0, 1) == WATCH_GOOD);
	watch_free(&w);
	config_free(&cfg);
}

TEST(spike_factor_zero_disables)
{
	struct config cfg;
	struct trainer tr;
	struct watch w;
	watch_for(&w, &cfg, &tr, "0", "0", "1");
	step(&w, 1, 1.0, 1);
	CHECK(step(&w, 2, 1e30, 1) == WATCH_GOOD);
	watch_free(&w);
	config_free(&cfg);
}
