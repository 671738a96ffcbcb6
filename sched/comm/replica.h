/* replica.h - data-parallel replicas of a pipeline (pipeline.data_parallel).
 *
 * N replicas of the same S-stage pipeline share every optimizer step: the
 * step's micro-batches are split between them (trainer.h), each replica
 * accumulates its stages' gradients over its own micro-batches, and at the
 * step's end the gradients of each stage are summed across the replicas,
 * before the step-finish sequence (tied sum, norm, clip, update), which then
 * runs identically on every replica. The sum is in replica order,
 *
 *     g = ((g_0 + g_1) + g_2) + ... + g_(N-1)      element by element,
 *
 * never the order in which messages happen to arrive, so every replica gets
 * the same bits and the replicas' weights stay bit-identical to each other,
 * in threads and over MPI alike (MPI_Allreduce promises no fixed order).
 *
 * A group is built once per segment (local) or per process (mpi). Stage s of
 * replica r calls allreduce with its buffer; the calls of one stage are
 * matched in the order they are made, so a stage may reduce several buffers
 * per step (the gradient arena, then the S = 1 tied head part) as long as
 * every replica makes the same calls.
 *
 * Every implementation splits the buffer into N chunks, replica q reduces
 * chunk q (summing all N replicas' chunk q in replica order) and hands the
 * result to the others: a reduce-scatter then an all-gather, each element
 * summed once, in the fixed order.
 */
#ifndef ASYNCPP_REPLICA_H
#define ASYNCPP_REPLICA_H

#include <stddef.h>

#include "../../kernels/backend.h"

struct transport;

struct replicas {
	const char *name;
	int N, S;
	/* Replace the n floats at g (backend memory; the same n on every
	 * replica) by their sum over the N replicas of stage s, in replica
	 * order. Blocks until the stage's other replicas made the same call;
	 * *waited gets the seconds spent blocked. */
	void (*allreduce)(struct replicas *x, int r, int s, float *g, size_t n, double *waited);
	/* Optional (NULL: allreduce only). The same sum in buckets, started
	 * while the step's last backward still runs (stage.grads_done) and
	 * finished at the step's end: bucket(x, r, s, g, n) starts the sum of
	 * the n floats at g (it may return before the sum is done: g must not
	 * change until finish); finish(x, r, s, waited) completes every bucket
	 * started since the last finish. Each element is summed in replica
	 * order as allreduce sums it, so any split into buckets gives
	 * allreduce's bits. Every replica of stage s starts the same buckets in
	 * the same order. Between processes a rank keeps one list of buckets
	 * for all the pieces of its stage (pieces.h): a piece's finish
	 * completes its siblings' buckets too (their later finish finds none),
	 * so no piece may allreduce while a sibling's buckets are in flight;
	 * the executor's OPTIM_STEP posts every piece of the stage in one go
	 * after every piece's last backward, which keeps that true. */
	void (*bucket)(struct replicas *x, int r, int s, float *g, size_t n, double *waited);
	void (*finish)(struct replicas *x, int r, int s, double *waited);
	void (*destroy)(struct replicas *x);
	/* A stage failed and the segment is called off: every call blocked in
	 * x returns at once, and so does every later one (what they leave in
	 * g is then no sum). NULL where a failed stage ends the job instead
	 * (between processes). */
	void (*abort)(struct replicas *x);
};

/* The N x S stage threads of one process (shared memory). */
struct replicas *replicas_local(const struct backend *be, int N, int S);

/* One stage per process, over p2p.h (MPI or TCP); this process is replica
 * rank / S, stage rank % S (rank = r * S + s, S = pc->S), and sums the
 * pieces that stage holds (pieces.h: x->S is pc->P), one call after
 * another in the same order on every replica. Collective: every rank
 * creates its group at the same point. A wait longer than timeout seconds
 * (pipeline.timeout; 0 = forever) names what it waits for and aborts the
 * job. NULL after error() when no carrier runs. */
struct dist;
struct pieces;
struct replicas *replicas_p2p(const struct dist *d, const struct backend *be, int N,
			      const struct pieces *pc, int rank, double timeout);

/* The same sum within one thread, for train.schedule = none: g[0] becomes
 * ((g[0] + g[1]) + ...) + g[N-1] and is copied into every g[r]. */
void replicas_sum_serial(const struct backend *be, float *const *g, int N, size_t n);

/* A transport for the S stages of one replica over a transport whose
 * stages are all the processes: stage s is `inner` stage base + s. The
 * result owns inner (its destroy destroys both). */
struct transport *transport_shift(struct transport *inner, int base);

#endif
