/* experts.h - expert parallelism (model.expert_parallel = P): each MoE
 * layer's experts split over the P replicas of a data-parallel group.
 *
 * Replicas r with the same r / P form a group; member q = r % P of it owns
 * experts [q*E/P, (q+1)*E/P) of every layer. Routing, dispatch, combine
 * and the router stay with each replica (its own tokens); the experts'
 * products of a pass (moe.h: moe_experts) run on the owner, on the rows of
 * every member, and come back (an all-to-all there and back). The owner
 * runs expert e on member q's rows as one GEMM of the same rows with the
 * same weights as q would, so every row has the bits of P = 1; the weight
 * gradients of q's rows accumulate into q's accumulator in q's
 * micro-batch order, so the replicas' sum (replica.h) and everything after
 * it (norm, clip, update, checkpoints) are P = 1's, bit for bit.
 *
 * Memory. A replica keeps optimizer state only for its own experts and
 * updates only those (sched/expert_owned.c). Its weight arenas (every
 * version, every predicted copy, and a backend's operand copy made of
 * them) hold only its own experts too (model.h: stage_hold_weights): a
 * pass holds the weights of the experts its replica owns, and only the
 * owner's hook call reads them. Outside training, in threads evaluation
 * and sampling run each expert with its owner's weights in place
 * (trainer_ep_view); between processes evaluation runs through the hook
 * as training does, every replica running the same lists to the end (a
 * batch past the last one padded, its loss dropped: executor.c's
 * eval_ctx.pad), so every member makes every call. Checkpoints take an
 * expert's weights from its owner (its worker, or its rank). Every
 * carrier alike (threads, p2p, NCCL: the hook is given its member's
 * weights of its own experts, moe.h's w_e0 on).
 *
 * The gradients cannot shrink so and stay P = 1's bits: P = 1 sums each
 * replica's micro-batch gradients apart, then the replicas in replica
 * order (replica.h), so an owner must keep each member's accumulation of
 * its experts apart until the step ends: E experts' worth of accumulators
 * per replica either way. So the gradient arena keeps P = 1's layout (an
 * owner writes member q's rows' gradients into q's, in place or through
 * deliver), and the weight arena has its own, without the others'
 * experts: a stage has two offset tables (model/stage_layout.h: PW, GW).
 * Checkpoints, evaluation and resume with any P are P = 1's.
 *
 * Every member of a group calls its hook (moe.h: struct moe_ep) at the
 * same point of the same pass: the replicas run the same action lists
 * (executor.c), and a hook call is matched with the others' in the order
 * they are made (between processes a rank's pieces share one channel:
 * the calls match in the rank's order of calls, the same on every member).
 * Before each pass the executor names the work (struct ep_work: the
 * piece, step, micro-batch and the weight version it computes on), and
 * the carriers check that the members of a call agree on it before an
 * owner runs anything: a member on another weight version (a schedule's
 * bug) would otherwise have its rows computed with the owner's weights.
 * What an exchange holds of its own (the owners' kept rows, scratch and
 * accumulators between processes; nothing in threads) is bounded from the
 * plan by experts_plan.h's ep_owner_mem (sched/expert_mem.h for a trainer).
 */
#ifndef ASYNCPP_EXPERTS_H
#define ASYNCPP_EXPERTS_H

#include "../../kernels/backend.h"
#include "../../model/moe.h"

/* What a hook call computes, the same on every member of a call. */
struct ep_work {
	long step, version; /* the optimizer step; the weight version computed on */
	int piece, mb;      /* the model piece; the replica's micro-batch of the step (0..) */
};

struct experts {
	const char *name;
	int N, P, S; /* replicas, the expert-parallel degree, model pieces */
	/* The hook of piece s of replica r (what its stage's moe_ep is set to
	 * during a training segment) */
	const struct moe_ep *(*member)(struct experts *x, int r, int s);
	/* The work of the hook calls of piece s of replica r from now on
	 * (until the next call: the executor's, before each pass). Members of
	 * a call on different work end the run: bug() in threads, an error
	 * naming the rank, the piece and both sides' work then dist_abort
	 * between processes. */
	void (*work)(struct experts *x, int r, int s, const struct ep_work *w);
	/* A stage failed and the segment is called off: every hook call
	 * blocked returns at once, and so does every later one (leaving no
	 * products). */
	void (*abort)(struct experts *x);
	/* Optional (NULL where the owners write the members' accumulators in
	 * place: threads). Between processes an owner accumulates the weight
	 * gradients of member q's rows in an accumulator of its own for q;
	 * before the replicas' sum of step t's gradient arena g (n floats) of
	 * piece s, every member calls deliver, which copies what the owners
	 * accumulated for it into its slices of g (left at zero by its own
	 * passes: it runs no other member's experts) and zeroes the owners'
	 * accumulators. Then g holds what P = 1 accumulates, and the sum may
	 * run (not in buckets during the backward: executor.c). */
	void (*deliver)(struct experts *x, int r, int s, float *g, size_t n);
	void (*destroy)(struct experts *x);
};

/* The N x S stage threads of one process (shared memory); N % P == 0,
 * E % P == 0. */
struct experts *experts_local(const struct backend *be, int N, int P, int S, int E);

/* One stage per process, over p2p.h (MPI or TCP): this process is replica
 * rank / S, stage rank % S (S = pc->S) and runs that stage's pieces
 * (pieces.h; x->S is pc->P), and member q of its group is rank
 * (r - r % P + q) * S + s. A stage's pieces exchange one after another,
 * in the same order on every member (the same lists). An owner receives a
 * member's rows of its experts, runs them and sends the results back (an
 * all-to-all each way per pass); it keeps the experts' inputs and hidden
 * rows of a member's rows (xd, h, act; and dy, dh for a split backward's
 * weight part) from the member's forward to its last pass of them, so only
 * xd goes out and y comes back in the forward, only dy and dxd in the
 * backward, and nothing in the weight part (experts_plan.h). A device
 * backend's rows are staged through host memory (dist_backend_is_host).
 * Collective: every rank creates its group at the same point. A wait
 * longer than timeout seconds (pipeline.timeout; 0 = forever) names what
 * it waits for and aborts the job. NULL after error(). */
struct dist;
struct pieces;
struct experts *experts_p2p(const struct dist *d, const struct backend *be, int N, int P,
			    const struct pieces *pc, int E, int rank, double timeout);

/* One stage per GPU process, over NCCL (pipeline.transport = nccl;
 * experts_nccl.c): the same exchange as experts_p2p, on the stage's dp
 * channel of w (whose ranks are the N replicas), from and into device
 * memory. w outlives it. NULL after error() (a build without CUDA). */
struct nccl_world;
struct experts *experts_nccl(const struct backend *be, struct nccl_world *w, int P,
			     const struct pieces *pc, int E, double timeout);

#endif
