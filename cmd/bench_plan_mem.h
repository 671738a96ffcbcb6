/* bench_plan_mem.h - the memory of a GPU in `asyncpp bench plan`, sized by
 * asyncpp's own code, not by a formula: model/'s stage_size (the layout a
 * run allocates) and optim/'s optim_size (the optimizer's state and
 * scratch), over the real schedule (sched/: slots per piece, weight
 * versions). What one pipeline stage's GPU holds, per piece it runs (the
 * model cut evenly into S x V pieces, cut_even; a stage runs V of them):
 *   weights      fp32 master x the stage's weight versions (sched_stage
 *                nversions: 2 under 2bw), and on the CUDA backend a bf16
 *                copy of each version a pass runs on (kernels/cuda:
 *                cuda_weights_bf16; bench train counts it the same way)
 *   gradients    two fp32 accumulators, by step parity (sched/worker.h:
 *                grads[2] for every pipeline schedule)
 *   optimizer    optim_size: the state of the configured optimizer and its
 *                update scratch
 *   activations  sched_piece_slots x one micro-batch's saved activations
 *                (with the split kinds, also what B keeps for W), plus the
 *                backward scratch and the head's logits chunk
 * With expert parallelism EP, a replica keeps optimizer state for its E/EP
 * experts only (sched/expert_owned.c), and weights (every version and bf16
 * copy) of those only (model.h: stage_hold_weights), but gradient
 * accumulators of all E (comm/experts.h: a replica accumulates every expert's gradient to
 * stay bit-identical to EP = 1). Not counted: the hand-off buffers between
 * stages, the transports' and the expert exchange's buffers, CUDA's
 * libraries and allocator slack. */
#ifndef ASYNCPP_BENCH_PLAN_MEM_H
#define ASYNCPP_BENCH_PLAN_MEM_H

#include "../io/config/config.h"
#include "../model/model.h"
#include "../sched/schedule.h"

/* The backend whose memory is sized. */
struct plan_device {
	int act_dtype; /* enum act_dtype (train.act_dtype) */
	int cuda;      /* 1: the CUDA backend (fused norm backward, bf16 weight
			* copies, batched Newton-Schulz); 0: the CPU backend */
};

/* Bytes on one GPU (a pipeline stage of one replica). */
struct plan_mem {
	double weights, copies, grads, optim, acts;
	double slot;   /* one micro-batch's saved activations, over its pieces */
	int stage;     /* which stage (plan_memory: the fullest) */
};

static inline double plan_mem_total(const struct plan_mem *pm)
{
	return pm->weights + pm->copies + pm->grads + pm->optim + pm->acts;
}

/* Stage s of sc (its V pieces of m cut evenly into sc->S * sc->V pieces)
 * at micro-batches of B x T, optimizer of cfg (optim.name and its keys),
 * ep replicas sharing out the experts (1: none). -1 after error(). */
int plan_stage_memory(const struct model *m, const struct config *cfg,
		      const struct schedule *sc, int s, int B, int T,
		      const struct plan_device *dev, long ep, struct plan_mem *out);
/* The fullest stage of sc's (the largest plan_mem_total). */
int plan_memory(const struct model *m, const struct config *cfg, const struct schedule *sc,
		int B, int T, const struct plan_device *dev, long ep, struct plan_mem *out);

#endif
