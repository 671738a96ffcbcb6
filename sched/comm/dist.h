/* dist.h - multi-process runs: where this process stands, and the hooks
 * cmd/train.c calls so that S processes behave like one threaded run.
 *
 * `mpirun -np S asyncpp train ...` (or `srun -n S`; or, for pipeline.transport
 * = nccl, `torchrun --nproc-per-node S`) starts S processes;
 * process r runs pipeline stage r only. With pipeline.data_parallel = N
 * replicas, S*N processes: rank r*S + s runs stage s of replica r, so the
 * ranks of one replica are consecutive (on a node, with a by-slot mapping).
 * Before MPI is touched, the rank and world size are read from the
 * environment, in this order:
 *   OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK   (Open MPI's mpirun)
 *   PMI_RANK / PMI_SIZE, MPI_LOCALRANKID          (MPICH's hydra)
 *   SLURM_PROCID / SLURM_STEP_NUM_TASKS (or SLURM_NTASKS) / SLURM_LOCALID,
 *                                                  only inside a job step
 *                                                  (SLURM_STEP_ID is set)
 *   RANK / WORLD_SIZE / LOCAL_RANK                (torchrun style, generic)
 * With no variables (or a world of 1) the run is an ordinary one-process
 * run and MPI is never initialised. With a world of S > 1, dist_init()
 * checks the configuration (a pipeline schedule, pipeline.stages times
 * pipeline.data_parallel = S, micro-batches divisible by the replicas),
 * connects the ranks and checks that every rank runs the same
 * configuration (rank 0 names the first key that differs, and the rank).
 * The ranks connect in one of two ways:
 *
 *   MPI    pipeline.transport = mpi, or nccl under an MPI launcher
 *          (OMPI_*, PMI_*, or SLURM_* without MASTER_ADDR/MASTER_PORT):
 *          MPI_Init_thread (FUNNELED: only the main thread, which runs the
 *          stage, calls MPI), and MPI_COMM_WORLD must agree with the
 *          environment. The rendezvous is MPI's own: the launcher (mpirun's
 *          PMIx server, or Slurm's PMI) wires the processes. dist_mpi().
 *   TCP    pipeline.transport = tcp (any launcher), or nccl otherwise
 *          (torchrun, or srun with MASTER_ADDR and MASTER_PORT set; or any
 *          launcher when MPI is not built in): rank 0 listens on
 *          MASTER_PORT, the others connect to MASTER_ADDR:MASTER_PORT
 *          (rendezvous.h), for up to ASYNCPP_CONNECT_TIMEOUT seconds
 *          (default 300; 0 forever); later waits have pipeline.timeout. The
 *          rendezvous carries dist_bcast (NCCL's unique ids), dist_max_int
 *          and the configuration check; a mesh of TCP connections between
 *          the ranks (p2p_tcp.c) carries every other message: activations
 *          (tcp), the board, the replicas' sums (tcp), dist_send/dist_recv.
 *          dist_rendezvous().
 *
 * pipeline.transport = nccl with S > 1 is refused where CUDA is not built
 * in. Without ASYNCPP_MPI (built where no MPI was found) the environment is
 * still read, and a world > 1 with another transport is an error naming
 * the fix.
 */
#ifndef ASYNCPP_DIST_H
#define ASYNCPP_DIST_H

#include <stdarg.h>
#include <stddef.h>

#include "../../io/config/config.h"
#include "../../io/data/dataloader.h"
#include "../../kernels/backend.h"

struct dist_env {
	int rank, world, local_rank;
	const char *from;   /* which variables: "OMPI_COMM_WORLD_*", ... or NULL */
};

/* Read rank, world size and local rank from the environment. A malformed
 * or inconsistent value is an error naming the variable; with none set *e
 * is rank 0 of 1. */
int dist_env_read(struct dist_env *e);

/* The distributed runtime of one process: its rank and world, what
 * connects it to the others (MPI or the TCP rendezvous and mesh, the
 * control channel), and the pipeline's side (its transport, board and
 * replica group, kept by sched/executor.c from segment to segment). It is
 * made once, by dist_init, and passed to whatever talks to other ranks
 * (the trainer holds it: trainer.h); nothing of it is global. A
 * one-process run has none: every function below takes NULL as rank 0 of
 * a world of 1. */
struct dist;
struct p2p_carrier;

/* Once the configuration is final: read the environment, check cfg against
 * it and, when the world is > 1, start MPI or the TCP rendezvous and set
 * *d to the runtime (NULL for a world of 1). Returns 0 or -1 after error()
 * (only rank 0 prints the configuration errors every rank finds). */
int dist_init(const struct config *cfg, struct dist **d);
/* Free the pipeline's side, close the connections, shut MPI down if
 * dist_init started it, and free d (NULL: nothing). Once, at the end. */
void dist_finalize(struct dist *d);

int dist_rank(const struct dist *d);      /* 0 when not distributed */
int dist_world(const struct dist *d);     /* 1 when not distributed */
int dist_local_rank(const struct dist *d);
int dist_active(const struct dist *d);    /* a world > 1 is connected, over MPI or TCP */
int dist_mpi(const struct dist *d);       /* ... over MPI */
int dist_rendezvous(const struct dist *d); /* ... over the TCP rendezvous (no MPI) */
int dist_is_root(const struct dist *d);   /* rank 0: writes metrics and checkpoints, prints */
double dist_timeout(const struct dist *d); /* pipeline.timeout (0 when not distributed) */
/* What carries messages between the processes (p2p.h), NULL when none. */
const struct p2p_carrier *dist_carrier(const struct dist *d);
/* The pipeline's side of the runtime (sched/executor.c): set once, freed
 * with pipe_free by dist_finalize before the connections close. */
void dist_set_pipeline(struct dist *d, void *pipe, void (*pipe_free)(void *pipe));
void *dist_pipeline(const struct dist *d);

/* The seconds between the SIGTERM the launcher sends the ranks when it is
 * told to stop and its SIGKILL, when the environment says: Open MPI's
 * mpirun (4.x) sends SIGCONT, then SIGTERM odls_base_sigkill_timeout
 * seconds later, then SIGKILL as long again (1 s unless --mca or
 * OMPI_MCA_odls_base_sigkill_timeout sets it; a parameter file is not
 * seen here). 0 when unknown (no mpirun; Slurm's KillWait is the
 * cluster's, see asyncpp-distributed(7)). */
double dist_kill_grace(void);

/* Every rank gets the largest of the ranks' v (v itself when not
 * distributed; over MPI or the TCP rendezvous). Used to agree on stopping
 * at a step boundary. */
int dist_max_int(const struct dist *d, int v);
/* Every process's verdict on a step that may fail on some of them (setting
 * up, a segment's start, a checkpoint): each rank passes whether it failed
 * (after its error() said why) and every rank gets -1 when any one did, so
 * that no rank goes on to wait for one that has given up; the ranks that
 * did not fail print "rank R: stopping: another rank failed WHAT (its
 * message above says why)". Collective. One process: -1 when it failed. */
int dist_agree(const struct dist *d, int failed, const char *what);
/* Faults on purpose, for tests: ASYNCPP_FAULT=POINT:STEP[:RANK] names a
 * point of the run ("segment": the pipeline segment that would run
 * optimizer step STEP fails to start; "buffer": stage 0's first activation
 * of step STEP cannot be allocated, mid-segment; "setup": the process's
 * part of the run cannot be set up, STEP 0; "attach": its step-finish
 * board between processes cannot be set up, STEP 0; "ep_version": its
 * expert-parallel hook calls of step STEP claim a weight version one off,
 * executor.c) on rank RANK (default 0; the process when
 * not distributed). 1, after error("[rank R: ]cannot WHAT: a fault
 * injected by ..."), when it names this point with first <= STEP <= last on this
 * rank; else 0. */
int dist_fault(const struct dist *d, const char *point, long first, long last,
	       const char *what);

/* End the whole job now, after an error() that said why: MPI_Abort while
 * MPI runs (the launcher stops every rank), else _exit(1) (under the TCP
 * rendezvous the other ranks see this one's socket close; not exit(1),
 * whose teardown of the CUDA runtime can wait for NCCL kernels that wait
 * for those ranks). The files this process has staged (io/staged.h) are
 * removed and every output stream is flushed first. */
void dist_abort(void) __attribute__((noreturn));
/* A wait on another rank past pipeline.timeout: prints "rank R (stage s)
 * waited T s for WHAT, which never came: ..." (WHAT from fmt and ap) and
 * ends the job (dist_abort). */
void dist_never_came(int rank, int stage, double waited, double timeout, const char *fmt,
		     va_list ap) __attribute__((noreturn));

/* Point to point and collectives on a communicator of their own, for the
 * control traffic between segments (any size: large buffers go in pieces).
 * Each returns 0 or -1 after error(). dist_send and dist_recv go over
 * p2p.h (MPI, or the TCP mesh); dist_bcast (rank root's bytes to every
 * rank: NCCL's unique ids) over MPI when it runs, over the TCP rendezvous
 * otherwise; in a one-process run it does nothing. */
int dist_send(const struct dist *d, const void *buf, size_t bytes, int to, int tag);
int dist_recv(const struct dist *d, void *buf, size_t bytes, int from, int tag);
int dist_bcast(const struct dist *d, void *buf, size_t bytes, int root);

/* Whether backend memory is host memory MPI or a socket may read and
 * write directly (else the messages are staged through host buffers). */
int dist_backend_is_host(const struct backend *be);

/* The mpi and tcp transports (sched/comm/transport_p2p.c over p2p.h; belongs in
 * transport.h): the N replicas' pipelines of pc->P pieces each (pieces.h),
 * addressed by global piece r*P + q (transport_shift of replica.h maps a
 * replica's pieces to them); ranks are replica * pc->S + stage; messages of
 * msg_bytes bytes; a receive that waits more than timeout seconds (0:
 * forever) names what it waits for and aborts the job. Collective (every
 * rank creates its transport at the same point); NULL after error() when
 * no carrier runs. Its name is the carrier's: "mpi" or "tcp". */
struct transport;
struct pieces;
struct transport *transport_p2p(const struct dist *d, const struct backend *be,
				const struct pieces *pc, int N, int rank, size_t msg_bytes,
				double timeout);

/* ---- hooks for cmd/train.c (sched/executor.c) ---- */
struct trainer;
/* Every checkpoint is written here (trainer_save too): rank 0 writes the
 * file in the global layout from the stages it holds (all of them in a
 * one-process run, tr->dist NULL) and from what each other rank of replica
 * 0 sends of its stage (weight versions, optimizer state); the other
 * replicas hold the same bits and send nothing. The same file whatever
 * the processes. Every rank gets -1 when any rank failed (rank 0 to
 * write, another to send); the other ranks write nothing. */
int pipeline_save(struct trainer *tr, const char *path, const char *config_text,
		  const char *extra_meta);
/* trainer_eval through the pipeline, one path for threads and processes:
 * each stage (a thread over local transports, or this process's rank)
 * runs its forward of the batches (with replicas, replica r takes batches
 * r, r+N, ...) on the newest weights, as trainer_eval does (schedule none
 * is trainer_eval itself); every rank gets the loss in *loss, the
 * per-batch losses added in batch order as trainer_eval does.
 * 0, or -1 on every rank when any rank failed (the failing one said why). */
int pipeline_eval(struct trainer *tr, struct dataloader *data, int batches, double *loss);

#endif
