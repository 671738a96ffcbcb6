/* train_watch.h - what a training run's steps say about its health, and
 * which of its checkpoints is the newest one to fall back to (train_run.c).
 *
 * A step is bad when its update was skipped (gradient norm NaN or
 * infinite) or its loss is not finite; bad steps in a row are counted. A
 * good step whose loss is above train.spike_factor times the mean of the
 * losses of the last train.spike_window good steps is a spike (no test
 * until that many good steps were seen in this process).
 *
 * A checkpoint written at step j holds the weights whose loss step
 * j + 1 + D measures (D: the run's largest delay, trainer_n_versions - 1).
 * It becomes the newest good checkpoint when that step is good, is no
 * spike and its loss is at most the first loss this process logged, with
 * no bad step or spike in between (a bad step or spike drops the
 * checkpoints still waiting). The run's first checkpoint (a resumed one) waits like
 * any other. The decisions come from the steps' losses and norms alone,
 * which every rank of a distributed run holds alike (executor.c shares
 * the losses), so every rank decides the same.
 */
#ifndef ASYNCPP_TRAIN_WATCH_H
#define ASYNCPP_TRAIN_WATCH_H

#include "../io/config/config.h"
#include "../sched/trainer.h"

struct ckpt_mark {
	long step;
	char *path; /* NULL: none */
};

struct watch {
	double factor;      /* train.spike_factor; 0: no spike test */
	long window;        /* train.spike_window */
	double *recent;     /* [window]: ring of the last good steps' losses */
	long n_recent;      /* good steps seen (the ring holds the last window) */
	double first_loss;  /* the first loss logged; NAN before it */
	long delay;         /* D above */
	struct ckpt_mark *pending; /* written, not yet measured good (oldest first) */
	int n_pending;
	struct ckpt_mark good;     /* the newest good checkpoint */
	long bad_in_row;    /* bad steps in a row, up to the last one seen */
	double spike_mean;  /* WATCH_SPIKE: the mean the loss was above */
};

enum watch_verdict { WATCH_GOOD, WATCH_BAD, WATCH_SPIKE };

void watch_init(struct watch *w, const struct config *cfg, const struct trainer *tr);
void watch_free(struct watch *w);
/* A checkpoint of step `step` was written (or resumed from) at path. */
void watch_saved(struct watch *w, long step, const char *path);
/* Step `step`'s statistics; see above. */
enum watch_verdict watch_step(struct watch *w, long step, const struct step_stats *st);
/* Whether path is the good checkpoint or one still waiting: checkpoint
 * rotation keeps them whatever checkpoint.keep says. */
int watch_holds(const struct watch *w, const char *path);
/* After a rollback to w->good: the loss history, the waiting checkpoints
 * and the bad steps in a row start again (first_loss and good stay). */
void watch_restart(struct watch *w);

#endif
