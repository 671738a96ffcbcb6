/* nccl.h - pipeline stages and data-parallel replicas on GPUs in separate
 * processes, over NCCL (pipeline.transport = nccl).
 *
 * Ranks are laid out as for MPI (dist.h): rank = replica * stages + stage,
 * one GPU per process (its local rank). The channels (kernels/cuda/
 * cuda_nccl.h: a communicator with a stream of its own) are:
 *
 *   act  a -> b     the sender (channel rank 0) sends activations to b
 *   grad b -> a     the gradients back, b is channel rank 0
 *   dp   stage s    the N replicas' stage-s processes, rank = replica
 *
 * for every two neighbouring model pieces q, q+1 held by different stages
 * a = stage(q), b = stage(q+1) (pieces.h: with one piece per stage that
 * is s -> s+1; interleaved adds the turn from the last stage back to
 * stage 0, zb-v the way back up, s+1 -> s). One 2-rank channel per
 * direction and kind, because NCCL matches transfers by their order on a
 * communicator and a send blocks its stream until the receive is posted
 * (cuda_nccl.h says why one stream deadlocks 1F1B). Per channel the
 * sender's order of messages must be the receiver's, whatever pieces they
 * belong to: sched_check_channel_order (schedule.h) proves it of the
 * schedule before anything is sent. A handoff between two pieces of one
 * stage stays in the process.
 *
 * Setting up is collective (every rank calls nccl_world_open at the same
 * point, under MPI): each rank creates the unique ids of the channels it
 * sends on, every rank gets every id (dist_bcast from each rank in turn),
 * then the channels open in rounds (nccl_plan: in each round a stage
 * opens the channels of at most one neighbour, both ends in the same
 * order; with one piece per stage, pairs starting at an even stage, then
 * at an odd one) so that no rank waits on a chain of others. Each channel
 * is connected as it opens (a one-byte transfer: NCCL would otherwise
 * connect a pair at its first message, mid-segment, where connecting may
 * wait on a GPU whose send waits on the peer), and the channels close in
 * the order they opened, on every rank (ncclCommDestroy is collective).
 *
 * Waits have a deadline (pipeline.timeout): a transfer that does not
 * complete in time names the rank, the stage, the micro-batch and the
 * tensor, and aborts the job (dist_abort), as the mpi transport does.
 */
#ifndef ASYNCPP_NCCL_H
#define ASYNCPP_NCCL_H

#include <stddef.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"

struct cuda_nccl_chan;
struct transport;
struct replicas;

struct nccl_world {
	int rank, stages, replicas;      /* this process; the world's shape */
	int stage, replica;              /* rank % stages, rank / stages */
	int P;                           /* model pieces per pipeline (pieces.h) */
	int *piece_stage;                /* [P] the stage of each piece; NULL in a world
					  * made by hand (test_cuda_nccl): piece s is
					  * stage s */
	/* [2 * stages]: kind (MSG_ACT, MSG_GRAD) * stages + the peer's stage;
	 * NULL where this stage sends (receives) nothing of that kind to
	 * (from) that stage */
	struct cuda_nccl_chan **send, **recv;
	struct cuda_nccl_chan *dp;       /* the stage's replicas; NULL when 1 */
	/* [n_open] what is open, in the order it opened (nccl_plan_sequence,
	 * then dp): the order it closes in */
	struct cuda_nccl_chan **open;
	int n_open;
};

/* Which channels a pipeline needs and when each opens: channel i carries
 * kind[i] (MSG_ACT, MSG_GRAD) from stage from[i] to stage to[i], sent on
 * with id slot[i] of its sender (the sender's channels counted in this
 * order), opened in round[i]; no stage has channels with two different
 * peers in one round. Plain C, no NCCL: the same on every rank. */
struct nccl_plan {
	int n, rounds, ids;              /* channels, rounds, most ids one stage makes */
	int *kind, *from, *to, *slot, *round;
};
struct pieces;
void nccl_plan_make(struct nccl_plan *plan, const struct pieces *pc);
void nccl_plan_free(struct nccl_plan *plan);
/* The plan's channels that stage opens, in the order it opens them and,
 * as ncclCommDestroy is collective too, closes them: round by round,
 * within a round in plan order. Writes their indices to seq (room for
 * plan->n) and returns their number. Every stage follows the one order
 * (round, index) of all channels, so no ranks wait on each other in a
 * circle, and both ends of a channel meet at it. */
int nccl_plan_sequence(const struct nccl_plan *plan, int stage, int *seq);

/* What the process's environment must say before CUDA starts when the
 * pipeline's transport is NCCL (dist_init calls it before MPI or the
 * backend can touch CUDA): CUDA_MODULE_LOADING = EAGER, unless the user
 * set it. Lazy loading (CUDA's default since 12.2) loads a kernel's
 * module at its first launch, which may wait for the whole device to
 * drain (NVIDIA's CUDA Lazy Loading guide, "Potential hazards"); on a rank
 * whose channel stream holds a send that NCCL keeps until the peer
 * receives, that first launch would wait for a peer that waits for this
 * rank (zb-v's first chunk-1 forward after its first send up). */
void nccl_env_prepare(void);

/* Open this rank's channels for the N = replicas pipelines of pc's pieces
 * (rank = replica * pc->S + stage). 0, or -1 after error() (NCCL missing,
 * fewer GPUs on the node than processes, ...). */
struct dist;
int nccl_world_open(struct nccl_world *w, const struct dist *d, const struct pieces *pc,
		    int replicas, int rank);
void nccl_world_close(struct nccl_world *w);
/* A transfer between processes that cannot be queued or failed mid-segment:
 * the peers are inside NCCL waits that nothing can interrupt, so the job
 * ends, as a failed transfer of the mpi transport ends it (p2p.h): prints
 * the message with "; aborting the job" and calls dist_abort. */
NORETURN void nccl_fail(const char *fmt, ...) PRINTF_LIKE(1, 2);

/* A deadline for a call NCCL gives none (ncclCommInitRank waits for every
 * rank of the communicator, forever; a peer that died before joining
 * would leave this rank there): unless nccl_deadline_stop comes first,
 * after timeout seconds a thread of its own prints "rank R (stage s)
 * waited T s for WHAT, which never came: ..." (dist_never_came) and ends
 * the job. timeout 0: no deadline (NULL, which stop takes). */
struct nccl_deadline;
struct nccl_deadline *nccl_deadline_start(double timeout, int rank, int stage, const char *fmt,
					  ...) PRINTF_LIKE(4, 5);
void nccl_deadline_stop(struct nccl_deadline *dl);

/* The transport for this rank's stage over w's channels (w outlives it):
 * messages of msg_bytes, stages numbered as the mpi transport's (global
 * ranks; wrap in transport_shift for one replica's view). */
struct transport *transport_nccl(const struct backend *be, struct nccl_world *w,
				 size_t msg_bytes, double timeout);

/* The replicas' gradient sum over w->dp, in replica order (replica.h),
 * with grouped sends and receives and the backend's add: the same bits as
 * the local and mpi replicas. */
struct replicas *replicas_nccl(const struct backend *be, struct nccl_world *w, double timeout);

/* Wait for a transfer's event with a deadline; past it, or when NCCL
 * reports a failure, print "rank R (stage s) waited T s for WHAT ..." and
 * abort the job. Returns the seconds waited. */
struct cuda_nccl_event;
double nccl_wait(struct cuda_nccl_event *e, struct cuda_nccl_chan *ch, double timeout,
		 int rank, int stage, const char *fmt, ...) PRINTF_LIKE(6, 7);

#endif
