/* nccl.h - pipeline stages and data-parallel replicas on GPUs in separate
 * processes, over NCCL (pipeline.transport = nccl).
 *
 * Ranks are laid out as for MPI (dist.h): rank = replica * stages + stage,
 * one GPU per process (its local rank). The channels (kernels/cuda/
 * cuda_nccl.h: a communicator with a stream of its own) are:
 *
 *   act  s -> s+1   rank 0 = stage s sends activations, rank 1 receives
 *   grad s+1 -> s   rank 0 = stage s receives gradients, rank 1 sends
 *   dp   stage s    the N replicas' stage-s processes, rank = replica
 *
 * one 2-rank channel per direction of each neighbour pair, because NCCL
 * matches transfers by their order on a communicator and a send blocks its
 * stream until the receive is posted (cuda_nccl.h says why one stream
 * deadlocks 1F1B). Per channel the sender's order of micro-batches must be
 * the receiver's: sched_check_channel_order (schedule.h) proves it of the
 * schedule before anything is sent.
 *
 * Setting up is collective (every rank calls nccl_world_open at the same
 * point, under MPI): each rank creates the unique ids of the channels it
 * is rank 0 of, every rank gets every id (dist_bcast from each rank in
 * turn), then the channels open in two rounds (pairs starting at an even
 * stage, then at an odd one) so that no rank waits on a chain of others.
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
	struct cuda_nccl_chan *act_in;   /* from stage - 1; NULL on stage 0 */
	struct cuda_nccl_chan *grad_out; /* to stage - 1 (the same pair) */
	struct cuda_nccl_chan *act_out;  /* to stage + 1; NULL on the last stage */
	struct cuda_nccl_chan *grad_in;  /* from stage + 1 */
	struct cuda_nccl_chan *dp;       /* the stage's replicas; NULL when 1 */
};

/* Open this rank's channels. 0, or -1 after error() (NCCL missing, fewer
 * GPUs on the node than processes, ...). */
struct dist;
int nccl_world_open(struct nccl_world *w, const struct dist *d, int stages, int replicas,
		    int rank);
void nccl_world_close(struct nccl_world *w);
/* A transfer between processes that cannot be queued or failed mid-segment:
 * the peers are inside NCCL waits that nothing can interrupt, so the job
 * ends, as a failed transfer of the mpi transport ends it (p2p.h): prints
 * the message with "; aborting the job" and calls dist_abort. */
NORETURN void nccl_fail(const char *fmt, ...) PRINTF_LIKE(1, 2);

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
