/* trainer.h - training steps over S stage workers.
 *
 * A trainer holds the S stage workers of one model and runs optimizer
 * steps. train.schedule = none runs them on the calling thread, stage after
 * stage, micro-batch after micro-batch (with train.delay / delay_mode
 * emulating a pipeline's gradient delay); the pipeline schedules run each
 * stage on its own thread (sched/executor.c). Both end every step with the
 * same step_finish sequence, in the same order:
 *
 *   1. tied embeddings: the gradient of wte becomes embedding part + head
 *      part (S = 1: stage_finish_grads; S > 1: stage 0 and the last stage
 *      add each other's part, giving the same bits on both);
 *   2. per-tensor sums of squares (optim_grad_sumsq), added tensor by tensor
 *      in global order into the global norm;
 *   3. clip scale = grad_clip / norm when norm > grad_clip;
 *   4. every stage's worker_update with lr_at(step) (worker_finish) — or,
 *      when the norm is NaN or infinite, every stage skips the step
 *      (worker_skip: the weights and optimizer state stay; the step counts).
 *      The norm is global, so all stages and replicas skip together and the
 *      schedules' equivalences hold through a skipped step.
 *
 * Data parallelism (pipeline.data_parallel = N, sched/comm/replica.h): N replicas
 * of the S-stage pipeline. Replica r takes micro-batches [r*M/N, (r+1)*M/N)
 * of every step (the data indices of N = 1, so the global batch is the
 * same; pipedream, whose step is one micro-batch per pipeline, takes N
 * micro-batches per step, replica r the r-th). Each micro-batch's loss is
 * scaled by 1/(micro-batches per step) as with N = 1; before step 1 the
 * gradients of every stage are summed across the replicas in replica order
 * (g_0 + g_1 + ... + g_(N-1)), then 1-4 run identically on every replica,
 * which therefore keep bit-identical weights. The step's loss is the mean of
 * all its micro-batches' losses, added in micro-batch order. Replicas run
 * in sequence for train.schedule = none, as N x S threads for the pipeline
 * schedules, or one stage per process under MPI (rank = r*S + s).
 */
#ifndef ASYNCPP_TRAINER_H
#define ASYNCPP_TRAINER_H

#include <pthread.h>

#include "../io/config/config.h"
#include "../io/data/dataloader.h"
#include "../model/model.h"
#include "worker.h"

struct step_stats {
	double loss;          /* mean over the step's micro-batches */
	double grad_norm;     /* before clipping */
	double lr;
	int nonfinite;        /* the loss was NaN or inf */
	int skipped;          /* the gradient norm was not finite: no update */
	/* Mixture of experts (0 and NULL for a dense model), from what the
	 * router did in the step's forwards (stage_moe_stats): the mean over
	 * the step's micro-batches and the model's layers of the balance term
	 * and of the z-loss (moe.h, before their coefficients), and
	 * expert_tokens[e], the (token, expert) slots routed to expert e,
	 * summed over the micro-batches and layers (they add up to
	 * L * K * tokens of the step). The values are the same on every
	 * schedule; expert_tokens points into the trainer (moe_tokens) and
	 * holds until the next trainer_run. */
	double moe_balance, moe_z;
	const double *expert_tokens;
	/* now_sec() when the step finished: its update computed (one worker),
	 * or its gradient posted by the last of this process's stages (a
	 * pipeline, whose updates are applied lazily); for the metrics'
	 * wall_s, so that the steps of one segment keep their own times */
	double done_s;
};

struct dist;

struct trainer {
	struct dist *dist;         /* the process's distributed runtime (comm/dist.h):
				    * NULL in a one-process run */
	const struct config *cfg;
	const struct model *m;
	const struct backend *be;
	int S, M, B, T;            /* S: model pieces, stages x V */
	int V;                     /* chunks per stage (interleaved's
				    * pipeline.virtual_stages; else 1): stage s
				    * holds pieces c*S/V + s, each a worker of
				    * its own, so that w[], checkpoints and
				    * evaluation see S pieces as S stages */
	int stages;                /* S / V: the stages (threads, or processes) */
	int *piece_stage;          /* [S] the stage holding each piece (sched_piece_stage) */
	int *piece_chunk;          /* [S] its chunk there */
	struct stage_cut cut;      /* the layers of each piece (cut_from_config) */
	int N;                     /* data-parallel replicas (pipeline.data_parallel) */
	int mb_per_step;           /* micro-batches per optimizer step, all replicas
				    * together: M, or N for pipedream, whose step
				    * is one micro-batch per replica */
	int mb_per_replica;        /* mb_per_step / N */
	int kind;                  /* enum sched_kind, or -1 for none */
	struct stage_worker *w;    /* [N*S]: stage s of replica r is w[r*S + s],
				    * so w[0..S-1] is replica 0 (checkpoints, eval,
				    * logs). Under MPI a process initialises only
				    * its own (worker_alive). */
	long step;                 /* optimizer steps done */
	int ep_split;              /* P > 1: each replica keeps weights and
				    * optimizer state only for its own experts
				    * (expert_owned.c); 0 or 1: every replica
				    * every expert's */
	struct ep_view *ep_view;   /* [N*S] under ep_split in threads: the
				    * hooks outside training (expert_owned.c) */
	/* train.on_divergence = rollback (cmd/train_watch.h): after `rollbacks`
	 * rollbacks, step t reads the data of step t + data_skip and its
	 * learning rate is lr_at(step) * lr_scale, lr_scale being
	 * train.rollback_lr_factor ^ rollbacks (0, 0 and 1 in a run that never
	 * rolled back). Checkpoints keep them (trainer_set_rollbacks). */
	long rollbacks, data_skip;
	double lr_scale;
	struct dataloader *data;
	/* single-thread path: activations between stages, host batch */
	void **x, **dx;            /* [S+1][B*T*C] activations (act_dtype); with
				    * lanes x[s] sits on stage s-1's device */
	void **x_peer;             /* [S+1] with lanes: x[s] copied to stage s's
				    * device where that differs, else NULL */
	int32_t *inputs, *targets; /* [B*T]; with lanes on stage 0's and the
				    * last stage's device */
	float *tied_part;          /* [Vp*C] exchange buffer for tied weights (S > 1) */
	/* statistics of the last step */
	struct step_stats last;
	double *moe_tokens;        /* [n * E]: expert_tokens of trainer_run's n steps */
	/* when non-NULL and set, trainer_run stops after the current step
	 * (one worker) or a few steps later (pipelines: every stage and rank
	 * agrees on the step, see executor.c); the caller sees it in step */
	const volatile int *stop;
	/* For measuring (bench train), schedule none only: when non-NULL,
	 * called as each part of a step begins (enum trainer_phase), and with
	 * TRAINER_PHASE_END once the step's update is queued. */
	void (*on_phase)(void *ctx, int phase);
	void *on_phase_ctx;
};

enum trainer_phase {
	TRAINER_PHASE_DATA,      /* a micro-batch's tokens to the device */
	TRAINER_PHASE_FORWARD,   /* every stage forward, the loss, the head's backward */
	TRAINER_PHASE_BACKWARD,  /* every stage backward */
	TRAINER_PHASE_OPTIMIZER, /* replica sums, gradient norm, clipping, update */
	TRAINER_PHASE_END,
	TRAINER_PHASES = TRAINER_PHASE_END
};

/* What cfg and the process's runtime d (NULL: one process) tell about the
 * run trainer_init would build (transport, schedule, micro-batches,
 * replicas, delay, chunks): 0, or -1 after error(). For a command to call
 * before it writes anything; trainer_init calls it too. */
int trainer_check_config(const struct config *cfg, const struct dist *d);

/* Build N x S workers from the global host arena `params` (m->numel
 * floats), or, params NULL, from the weights model_init_weights_stage
 * gives the pieces this process holds for train.seed. Delays follow train.delay / train.delay_mode for schedule none;
 * 2bw uses 1 on every stage, pipedream S-1-s (the same on every replica). */
int trainer_init(struct trainer *tr, const struct config *cfg, const struct model *m,
		 const struct backend *be, const float *params, struct dataloader *data);
/* The same for a process of a multi-process run: d from dist_init (NULL:
 * one process, as trainer_init); the trainer keeps it (tr->dist) and runs
 * only the process's own stage. */
int trainer_init_on(struct trainer *tr, struct dist *d, const struct config *cfg,
		    const struct model *m, const struct backend *be, const float *params,
		    struct dataloader *data);
void trainer_free(struct trainer *tr); /* also after a trainer_init that failed */
/* Delay of stage s under cfg (the rule above). */
int trainer_stage_delay(const struct config *cfg, int s, int S);

/* The lane (backend.h: pipeline.devices) of piece q: its stage's. */
int trainer_lane(const struct trainer *tr, int q);

/* Does this process hold worker i (piece i % S of replica i / S)? Every
 * one in a one-process run; under MPI or TCP those of its stage's pieces. */
int trainer_holds(const struct trainer *tr, int i);

/* Run up to n optimizer steps; stats[i] receives step i's statistics (may
 * be NULL). tr->step tells how many were done (fewer than n when tr->stop
 * was set). A step whose gradient norm is not finite is skipped (stats
 * .skipped) and the run goes on: stopping is the caller's decision. Returns
 * 0, or -1 after error() (MPI failures). */
int trainer_run(struct trainer *tr, int n, struct step_stats *stats);

/* MoE statistics (step_stats): per_mb[mb_per_step][S][2 + E] holds, for
 * each of the step's micro-batches (in data order) and each stage, what
 * stage_moe_stats returned; *st gets the step's means, and its
 * expert_tokens the row `i` of tr->moe_tokens (sized by trainer_moe_begin
 * for n steps). Summed in micro-batch, then stage order on every schedule.
 * Nothing happens for a dense model (E = 0). */
size_t trainer_moe_width(const struct trainer *tr); /* S * (2 + E), 0 when dense */
void trainer_moe_begin(struct trainer *tr, int n);
void trainer_moe_step(struct trainer *tr, const double *per_mb, int i, struct step_stats *st);

/* Mean loss of the newest weights over `batches` micro-batches of `data`
 * (in order, no gradients); at most as many as the data holds windows for
 * (trainer_eval_batches), so no window counts twice. */
int trainer_eval_batches(const struct trainer *tr, const struct dataloader *data, int batches);
double trainer_eval(struct trainer *tr, struct dataloader *data, int batches);

/* The step_finish sequence for step `step` (1-based) when every stage of
 * every replica has accumulated its gradients; single-threaded form: the
 * sum across replicas, then 1-4 on each replica. Returns the norm. */
double trainer_finish_step(struct trainer *tr, long step, double *lr_out);

/* Stage s of replica r, and whether this process holds it (under MPI only
 * the process's own stage is initialised). */
static inline struct stage_worker *trainer_worker(struct trainer *tr, int r, int s)
{
	return &tr->w[r * tr->S + s];
}
static inline int worker_alive(const struct stage_worker *w) { return w->be != NULL; }

/* Global host arena of version `newest - back` (back 0 = newest) of
 * replica 0; for checkpoints, eval and export. */
void trainer_gather_weights(struct trainer *tr, int back, float *global);
/* Set step and every stage's versions (every replica's) from global
 * arenas: versions[i] is version step - i, for i < n (older missing
 * versions repeat the oldest). */
void trainer_restore(struct trainer *tr, long step, float *const *versions, int n);
/* Versions a checkpoint must hold: max delay + 1. */
int trainer_n_versions(const struct trainer *tr);
/* Set rollbacks and data_skip, and lr_scale from them. */
void trainer_set_rollbacks(struct trainer *tr, long rollbacks, long data_skip);



/* Expert parallelism's optimizer state (expert_owned.c). The replica
 * whose worker updates tensor k of piece s in replica r's group: r
 * itself, or for an expert's matrix under ep_split its owner. */
int trainer_expert_owner(const struct trainer *tr, int r, int s, int k);
/* At init, before the workers (model.expert_parallel = P > 1): each
 * replica keeps weights and optimizer state only of its own experts (sets
 * ep_split); trainer_held_experts says which ([e0, e1) of every layer,
 * for worker_init: every one without ep_split). After the workers,
 * trainer_expert_views sets the hooks of trainer_ep_view. */
void trainer_own_experts(struct trainer *tr);
void trainer_held_experts(const struct trainer *tr, int r, int *e0, int *e1);
void trainer_expert_views(struct trainer *tr);
/* Under ep_split in threads: the MoE hook of piece i = r*S + s outside a training
 * segment (evaluation, sampling): each expert runs with its owner's
 * weights of the same version, read in place (shared memory), on this
 * replica's rows alone (no other member need call it). NULL without. */
const struct moe_ep *trainer_ep_view(const struct trainer *tr, int i);
/* Before passes that run trainer_ep_view's hooks on the newest version
 * (evaluation): every worker's backend weight copy (weights_bf16) made
 * current, since a member may read an owner's arena before the owner's
 * own pass would have refreshed its copy after the updates. */
void trainer_ep_view_prepare(const struct trainer *tr);
/* Version v of piece s of replica r into the global host arena: its
 * weights, and under ep_split the other members' of their experts
 * (threads: every piece in this process). */
void trainer_save_version(struct trainer *tr, int r, int s, long v, float *global);

/* Run n optimizer steps under the pipeline schedule tr->kind, one thread per
 * stage (sched/executor.c). Called by trainer_run. */
int pipeline_run(struct trainer *tr, int n, struct step_stats *stats);
/* The most steps a pipeline (tr->kind >= 0) may still run once its process
 * is asked to stop: to its next optimizer step, the steps a stage may have
 * begun when every stage learns of the request, and the drain. */
int pipeline_stop_steps(const struct trainer *tr);
/* Checkpoints (sched/trainer_ckpt.c): every weight version the delay needs,
 * every optimizer state buffer, metadata (step, seed, data position, RNG
 * state) and the config text, in the model's global layout. A save writes
 * replica 0 (every replica holds the same bits); a load sets every replica,
 * so a checkpoint resumes with any pipeline.stages and data_parallel. */
struct ckpt;
int trainer_save(struct trainer *tr, const char *path, const char *config_text,
		 const char *extra_meta);
int trainer_load(struct trainer *tr, struct ckpt *k);
/* The parts of a save, for a writer that gathers them (pipeline_save,
 * dist.h: rank 0 takes the stages it holds and receives the others from
 * their ranks; trainer_save goes through it too): a sink takes tensors in
 * checkpoint order; a source fills the global arena of a weight version and
 * feeds stage s's optimizer-state tensors to a sink. */
typedef int (*tensor_sink)(void *ctx, const char *name, const float *data, size_t numel,
			   int rows, int cols);
struct ckpt_source {
	int (*weights)(void *ctx, int back, float *global); /* [m->numel] */
	int (*states)(void *ctx, int s, tensor_sink sink, void *sink_ctx);
	void *ctx;
};
int trainer_save_from(struct trainer *tr, const struct ckpt_source *src, const char *path,
		      const char *config_text, const char *extra_meta);
/* A worker's optimizer-state tensors, in checkpoint order, to sink (an
 * expert's from its owner: trainer_expert_owner). */
int worker_state_tensors(const struct trainer *tr, const struct stage_worker *wk,
			 tensor_sink sink, void *ctx);
/* Between processes under ep_split (expert_owned.c): replica 0's rank of
 * piece s takes state tensor `name` of an expert from the rank of owner
 * replica o (nothing when o has no part in that buffer), while each rank
 * of replicas 1..P-1 sends, in the order worker_state_tensors asks, the
 * state of the experts it owns (trainer_send_owned_state, during
 * pipeline_save). 0, or -1 after error(). */
int trainer_recv_owned_state(const struct trainer *tr, int s, int o, const char *name,
			     tensor_sink sink, void *ctx);
int trainer_send_owned_state(const struct trainer *tr);
/* Version v of replica 0's piece q (this process holds it) in the full
 * stage layout (host: st.numel floats at the gradients' offsets; the tied
 * copy too): its own tensors, and between processes under ep_split the
 * experts the group's other members own, received from their ranks,
 * which send them (trainer_send_owned_weights, during pipeline_save, for
 * each version the checkpoint holds, piece by piece, as
 * trainer_piece_weights asks) before their state. 0, or -1 after error(). */
int trainer_piece_weights(const struct trainer *tr, int q, long v, float *host);
int trainer_send_owned_weights(const struct trainer *tr);
/* Weights K = back steps before the newest, into a global host arena. */
int ckpt_load_weights(struct ckpt *k, const struct model *m, float *global, int back);

#endif
