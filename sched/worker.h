/* worker.h - one pipeline stage's training state: its model slice and
 * activation slots, its weight versions, gradient accumulators and
 * optimizer. The single-device trainer and the pipeline executor drive the
 * same workers, which is why their results agree bit for bit.
 *
 * Weight versions: version v is the stage's weights after v optimizer
 * steps. A worker with delay d keeps d + 1 versions in a ring
 * (ver[v % (d+1)]); a micro-batch of step t is computed on version
 * max(t - d, 0) and the update of step t turns version t into t + 1:
 *     w[t+1] = w[t] + U(g(w[t-d]))
 * d = 0 is ordinary training (one buffer, updated in place), d = 1 is
 * PipeDream-2BW, d = S-1-s is the original PipeDream's stage s.
 *
 * Weight prediction (optim.correction = predict, a delay d > 0): the
 * forward and backward of a micro-batch run on its version extrapolated by
 * the delay with the update that made it,
 *     p[v] = w[v] + d (w[v] - w[v-1]) = (1+d) w[v] - d w[v-1]
 * (SpecTrain/XPipe's idea: the gradient lands d updates later), and the
 * update still applies to w. p[v] is made when version v is (update, skip
 * or resume), by one function, so every schedule computes it alike. The
 * ring then holds d + 2 versions, so that a resumed run can remake p of
 * every version it will use (checkpoints hold one version more).
 *
 * Gradients accumulate into grads[step % 2], so a pipeline may start the
 * backward passes of step t+1 before step t's update has been applied. A
 * worker that runs steps one after another (schedule none) needs only one
 * accumulator: grads[1] is then grads[0].
 */
#ifndef ASYNCPP_WORKER_H
#define ASYNCPP_WORKER_H

#include "../io/config/config.h"
#include "../model/model.h"
#include "../optim/optim.h"

#define WORKER_MAX_VERSIONS 65

struct stage_worker {
	struct stage st;
	struct optimizer opt;
	const struct backend *be;
	int s, S;
	int lane;                           /* its stage's lane (backend.h): s, or with V
					     * pieces per stage the stage of piece s */
	int delay;                          /* steps of gradient delay */
	int predict;                        /* weight prediction (delay > 0) */
	int n_versions;                     /* delay + 1 (+ 1 with predict) */
	float *ver[WORKER_MAX_VERSIONS];    /* weight arenas (st.wnumel floats);
					     * ver[v % n] = version v */
	float *pred[WORKER_MAX_VERSIONS];   /* with predict: pred[v % n] = p[v] */
	long newest;                        /* newest version = updates applied */
	float *grads[2];                    /* [st.numel] each, by step parity (may alias) */
	double *sumsq;                      /* [opt.n] per-tensor gradient sumsq, and
					     * one more: the stop request the
					     * executor posts with them */
	int wte_param;                      /* index in st.params of wte or its tied copy, -1 */
	/* accounting for logs: seconds computing and waiting, buckets of the
	 * replicas' gradient sum started during a backward */
	double busy_s, idle_s;
	long buckets;
};

/* Build stage s of cut (NULL: the whole model) on lane `lane` with the given delay, n_slots activation slots for
 * B x T micro-batches, its optimizer from cfg, and version 0 copied from the
 * global host arena `params` (m->numel floats). overlapped: steps overlap
 * (a pipeline), so two gradient accumulators; else one. The worker keeps
 * weights (every version and predicted copy) and optimizer state only of
 * the experts [e0, e1) of each MoE layer ([0, E): every one; expert
 * parallelism's replica keeps none of the experts another replica owns:
 * model.h, stage_hold_weights; optim_init_owned); its gradients keep
 * every tensor. */
int worker_init(struct stage_worker *w, const struct model *m, const struct backend *be,
		const struct config *cfg, const struct stage_cut *cut, int s, int lane, int B,
		int T, int n_slots, int delay, int overlapped, const float *params, int e0,
		int e1);
void worker_free(struct stage_worker *w);

/* The weights of version v (v < 0 means version 0). The version must be
 * held: newest - (n_versions - 1) <= v <= newest. */
float *worker_weights(struct stage_worker *w, long v);
/* The weights a micro-batch computed on version v runs its forward and
 * backward with: worker_weights, or p[v] under weight prediction. */
float *worker_grad_weights(struct stage_worker *w, long v);
/* Remake p[v] for the versions held, after worker_load_version (resume). */
void worker_predict_held(struct stage_worker *w);
/* Gradient accumulator of 1-based optimizer step `step`. */
float *worker_grads(struct stage_worker *w, long step);
/* Apply optimizer step `step` (1-based; newest must be step - 1): version
 * step is made from version step - 1 with the gradient of that step scaled
 * by clip_scale; then the gradient buffer is zeroed for step + 2. */
void worker_update(struct stage_worker *w, long step, float lr, float clip_scale);
/* Skip optimizer step `step`: version step is a copy of version step - 1,
 * the optimizer state (and the error-feedback memory) stay as they are, and
 * the gradient buffer is zeroed as after an update. */
void worker_skip(struct stage_worker *w, long step);
/* Step 3-4 of trainer.h for one stage from the global gradient norm: a norm
 * that is not finite skips the step (worker_skip), so no NaN or infinity
 * reaches the weights; otherwise clip to max_norm (> 0) and update. Every
 * stage sees the same norm, so every stage decides the same. Returns 1 when
 * the step was skipped. */
int worker_finish(struct stage_worker *w, long step, double norm, double max_norm, float lr);

/* Copy this stage's slices of version v out to / in from a global host
 * arena (checkpoints): the tensors its weight arena holds. */
void worker_save_version(struct stage_worker *w, long v, float *global);
void worker_load_version(struct stage_worker *w, long v, const float *global);

#endif
