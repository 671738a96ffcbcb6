/* train_run.h - one `asyncpp train` run once it is set up: its data, the
 * loop of segments with logging, evaluation, samples and checkpoints
 * (train_run.c). cmd/train.c parses the command, claims the output
 * directory, resumes, and hands the run to train_loop.
 */
#ifndef ASYNCPP_TRAIN_RUN_H
#define ASYNCPP_TRAIN_RUN_H

#include <stdint.h>

#include "../io/config/config.h"
#include "../io/data/dataloader.h"
#include "../io/report/metrics.h"
#include "../io/report/tensorboard.h"
#include "../model/model.h"
#include "../sched/trainer.h"
#include "train_watch.h"

struct sampler;

struct run {
	struct dist *dist; /* the process's runtime under a launcher (dist.h), else NULL */
	struct config cfg;
	struct model m;
	const struct backend *be;
	struct dataloader train, val;
	int has_val;
	struct trainer tr;
	struct metrics_file metrics;
	struct tb_writer tb; /* log.tensorboard; closed when not asked for */
	struct sampler *sampler; /* sample.every; NULL until the first sample */
	double flops_per_token, peak;
	int quiet, tty;
	const char *prog;  /* the program as invoked, for hints (cmd/cmd.h) */
	struct watch watch; /* bad steps, spikes, the newest good checkpoint */
	long sample_every; /* sample.every, 0 where it cannot run (under MPI) */
	uint64_t run_id;   /* cmd/train_dir.h: the run train.out_dir holds */
	double last_save;  /* now_sec() of the last checkpoint (or the start) */
	int lock_fd;       /* holds train.out_dir's lock (root only; else -1) */
	volatile int *stop; /* the signal that asked to stop (0: none); the
			     * ranks agree on it at each segment's end */
};

/* Open data.train (and data.val) for the run, preparing the built-in
 * corpus in OUT_DIR/data when data.train is empty, and check that the
 * shards and data.tokenizer agree. 0, or -1 after error(). */
int train_setup_data(struct run *r);

/* Train until train.steps, a stop signal or an error: 0 or -1. */
int train_loop(struct run *r);

/* A checkpoint of the trainer's step in train.out_dir, recording run_id
 * (rank 0 writes; the run's oldest beyond checkpoint.keep go, but never one
 * the watch holds, when w is not NULL: train_watch.h, nor another run's:
 * train_dir.h); its path in *saved when saved is not NULL.
 * 0, or -1 after error(). */
int train_save_checkpoint(struct trainer *tr, const struct config *cfg, uint64_t run_id,
			  const struct watch *w, char **saved);

/* What a run that diverged can go back to (train_watch.h), for its
 * message: the newest good checkpoint and how to resume it, or why none. */
void train_fallback(struct run *r, char *out, size_t len);

void train_sampler_free(struct sampler *sp);

#endif
