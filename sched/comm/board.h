/* board.h - the exchange behind a pipeline's step-finish sequence.
 *
 * trainer.h lists the sequence that ends every optimizer step: the tied
 * embedding gradient summed between stage 0 and the last stage, per-tensor
 * sums of squares added in global order into the norm, clip, lr, update.
 * The executor does all of that arithmetic itself (sched/executor.c), the
 * same way whatever the board; a board only carries the data between the
 * stages, per (global, 1-based) optimizer step:
 *
 *   tied_post  piece 0 posts the raw embedding part of wte's gradient, the
 *              last piece the raw head part (S > 1 with tied weights only;
 *              under zb-v both are stage 0's);
 *              the board copies it
 *   tied_wait  the other end's part (stage 0 needs it before its sums of
 *              squares, the last stage when it completes the step); blocks
 *   post       the stage's per-tensor sums of squares; the board copies them
 *              (the executor counts one value more per stage and posts
 *              there whether the stage's process was asked to stop)
 *   wait       every stage's sums, concatenated in global order (stage 0's
 *              tensors first): exactly the order the norm is summed in; blocks
 *   done       the stage has applied the step; the board may free its data
 *   abort      a stage failed and the segment is called off: every wait
 *              blocked returns NULL, and so does every later one (the
 *              local board; NULL where a failed stage ends the job)
 * tied_post returns -1 and tied_wait NULL after error() when the board
 * cannot allocate the part's copy.
 *
 * A stage posts its steps in order and completes them in order; posting
 * step t never waits for step t's completion elsewhere, which is what lets
 * the executor complete updates lazily (no bubble for 2bw). A segment
 * brackets the steps (first_step, first_step + n_steps]: begin before any
 * stage posts, end after every local stage is done.
 *
 * Two boards: local (stages are threads of one process, shared memory) and
 * p2p (one stage per process, nonblocking point-to-point messages tagged by
 * step, over MPI or TCP: p2p.h). Both give each stage the same bytes, so the norm, the clip scale
 * and the updates are bit for bit those of the threaded run.
 *
 * A board serves one pipeline. Data-parallel replicas (replica.h) each have
 * their own: by the time a stage posts, its gradients are already summed
 * across the replicas, so every replica's board carries the same bytes.
 */
#ifndef ASYNCPP_BOARD_H
#define ASYNCPP_BOARD_H

#include <stddef.h>

#include "../../kernels/backend.h"

struct board {
	const char *name;
	int S;
	const int *n_tensors;  /* [S] sums of squares each stage posts */
	size_t total;          /* their sum */
	void (*begin)(struct board *b, long first_step, int n_steps);
	int (*tied_post)(struct board *b, int s, long step, const float *part);
	/* backend memory of tied_n floats, valid until done(); *waited gets
	 * the seconds spent blocked */
	const float *(*tied_wait)(struct board *b, int s, long step, double *waited);
	void (*post)(struct board *b, int s, long step, const double *sumsq);
	const double *(*wait)(struct board *b, int s, long step, double *waited);
	void (*done)(struct board *b, int s, long step);
	/* make progress on pending messages without blocking (may be NULL) */
	void (*poll)(struct board *b);
	void (*end)(struct board *b);
	void (*destroy)(struct board *b);
	void (*abort)(struct board *b);
};

/* Shared memory between the S stage threads of one process (or S pieces
 * of fewer threads: stage s on lane lane[s], NULL: lane s). n_tensors[S]
 * and lane[S] are copied; tied parts of tied_n floats live in backend
 * memory. */
struct board *board_local(const struct backend *be, int S, const int *lane,
			  const int *n_tensors, size_t tied_n);

/* One stage per process, over p2p.h (MPI or TCP): this process runs
 * stage s of a pipeline of pc->P pieces on pc->S stages (pieces.h) whose
 * stage q is rank base + q (replica r's pipeline has base r*S); b->S is
 * P and n_tensors[P] what each piece posts. NULL after error() when no
 * carrier runs. Collective: every rank creates its board at the same
 * point. A wait longer than timeout seconds (pipeline.timeout; 0 =
 * forever) names what it waits for and aborts the job (p2p_wait). */
struct dist;
struct pieces;
struct board *board_p2p(const struct dist *d, const struct backend *be, const struct pieces *pc,
			int s, int base, const int *n_tensors, size_t tied_n, double timeout);

#endif
