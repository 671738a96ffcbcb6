/* moe.h - a mixture-of-experts feed-forward for the llama block: router,
 * top-k, dropless dispatch, SwiGLU experts, an optional shared expert, and
 * the router's auxiliary losses. pass.c calls it in place of the dense
 * fcw/fcprojw pair when n_expert > 0.
 *
 * Legend: N = B*T tokens, C width, E experts, K experts per token, De an
 * expert's width (per gate), NK = N*K routed slots.
 *
 * Conventions (asyncpp-train(1), "Mixture of experts"):
 *   z = x @ router^T                       [N,E] router logits
 *   softmax router: score = softmax(z)     sigmoid router: score = sigmoid(z)
 *   sel = the K largest scores, best first, ties to the lower expert index
 *   gate_j = score[sel_j] / sum_j' score[sel_j'] when K > 1, score[sel_j]
 *     when K = 1 (Switch: the router keeps a gradient through the gate)
 *   out = shared(x) + sum_j gate_j * expert_{sel_j}(x)   (j = 0..K-1 in order)
 *   expert(x) = swiglu(x @ fcw^T) @ fcprojw^T (as the dense llama FFN)
 * The top-k choice is piecewise constant: no gradient flows through it.
 *
 * Dispatch is dropless and deterministic: the slots (n, j) routed to expert e
 * are rows [count[e], count[e+1]) of the dispatched buffers, in ascending
 * token order n; every sum has a fixed order, so results do not depend on
 * the thread count.
 *
 * Auxiliary losses, per layer and micro-batch, added to the objective with
 * the caller's coefficients (scaled by the same dloss as the cross-entropy):
 *   balance = E * sum_i f_i * P_i   (Switch), f_i = slots routed to i / NK,
 *     P_i = mean_n q[n,i] with q = score (softmax) or score / sum_e score
 *     (sigmoid: each token's scores normalised over all experts);
 *     f is piecewise constant, the gradient flows through P;
 *   zloss = mean_n logsumexp(z[n,:])^2   (ST-MoE), for both routers.
 *
 * Routing, dispatch, combine and the auxiliary losses are backend ops
 * (kernels/backend.h, moe_*; the CPU's are the reference), as are the
 * matrix products (the experts' each one call over every expert,
 * moe_expert_forward/backward) and SwiGLU; this file keeps the order of the
 * calls. The host reads no activation memory but the E+1 per-expert counts,
 * once per layer and pass, for the experts' GEMM shapes. Activations and
 * their gradients (void *: the router logits z and dz, the dispatched
 * inputs, the experts' hidden and output rows, the combined output) are
 * stored in act_dtype (kernels/act.h); scores, gates, the auxiliary losses
 * and every sum are float or double. The combine and its backward sum a
 * row in float and store it once (one rounding in bf16).
 */
#ifndef ASYNCPP_MOE_H
#define ASYNCPP_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"

enum moe_router { ROUTER_SOFTMAX = 0, ROUTER_SIGMOID = 1 };

struct moe_ep;

struct moe_dims {
	int N, C, E, K, De, shared, router; /* router: enum moe_router */
	float alpha, beta; /* aux_coef, z_coef */
	int act_dtype;     /* enum act_dtype of the backend (0: f32) */
	const struct moe_ep *ep; /* expert parallelism (below); NULL: every expert here */
	int w_e0, w_e1;    /* the experts whose weights the pass's fcw, fcprojw
			    * hold, back to back from w_e0's: [0, E) (also
			    * when both are 0), or under expert parallelism
			    * the owned ones (model.h: stage_hold_weights) */
};

/* Weights: fcw holds the experts' [2De,C] matrices back to back, fcprojw
 * their [C,De] (experts [d->w_e0, d->w_e1): every one, or the owned ones
 * under expert parallelism); sh_* are NULL without a shared expert. */
struct moe_params {
	const float *router, *fcw, *fcprojw, *sh_fcw, *sh_fcprojw;
};
struct moe_grads {
	float *router, *fcw, *fcprojw, *sh_fcw, *sh_fcprojw;
};

/* Saved per slot by the forward, read by the backward. */
struct moe_acts {
	void *z;          /* [N,E] router logits (act) */
	float *score;     /* [N,E] softmax or sigmoid scores */
	int32_t *sel;     /* [N,K] chosen experts, best first */
	float *gate;      /* [N,K] */
	int32_t *pos;     /* [N,K] row of slot (n, j) in the dispatched buffers */
	int32_t *count;   /* [E+1] expert e's rows: [count[e], count[e+1]) */
	int32_t *count_host; /* [E+1] host memory: the forward's copy of count,
			      * read again by the backward (or NULL: each
			      * pass copies; moe_acts_view leaves it NULL) */
	void *xd;         /* [NK,C] dispatched inputs (act) */
	void *h;          /* [NK,2De] (act) */
	void *act;        /* [NK,De] (act) */
	void *y;          /* [NK,C] expert outputs (act) */
	void *sh_h;       /* [N,2De] (shared; act) */
	void *sh_act;     /* [N,De] (shared; act) */
	float *aux;       /* [2]: balance, zloss of this micro-batch */
};

/* Activation gradients, shared by slots. */
struct moe_scratch {
	void *dy, *dact, *dh, *dxd;  /* [NK,C] [NK,De] [NK,2De] [NK,C] (act) */
	void *dz;                    /* [N,E] (act) */
	float *dgate;                /* [N,K] */
	void *dsh_act, *dsh_h;       /* [N,De] [N,2De] (act) */
	void *tmp;                   /* [N,C] (act): dy's memory, which the
				      * fused backward no longer needs by then */
};

/* What the split backward's input part keeps for its weight part, per
 * slot: the gradients at the outputs of the layer's products (act). */
struct moe_dsave {
	void *dy, *dh, *dz, *dsh_h;  /* [NK,C] [NK,2De] [N,E] [N,2De] (shared) */
};

/* ---- the experts' products, and expert parallelism ----
 *
 * Each pass (forward; backward, with or without the weight gradients; the
 * split backward's weight part) runs the experts' products on the
 * dispatched rows: expert e on rows [count[e], count[e+1]), as a GEMM of
 * that many rows. moe_experts does it for the experts [e0, e1) with the
 * weights it is given; what it reads and writes per pass:
 *   MOE_PASS_FORWARD:  xd -> h, act, y
 *   MOE_PASS_BACKWARD: dy, act, h, xd -> dact, dh, dxd; gfcprojw, gfcw +=
 *                      (when not NULL)
 *   MOE_PASS_WEIGHT:   dy, act, dh, xd -> gfcprojw, gfcw +=
 * A row's bits depend only on its expert's weights and on the rows of its
 * expert (the GEMM's shape), so running expert e elsewhere, on the same
 * rows with the same weights, gives the same bits.
 *
 * model.expert_parallel = P (sched/comm/experts.h): the layer calls
 * ep->experts in place of moe_experts(0, E). Expert e is owned by member
 * e / (E/P) of the replica's group of P replicas; the owner runs its
 * experts on the rows of every member (its weights are the members':
 * replicas hold the same bits) and the weight gradients of member q's rows
 * go where q's own would (q's accumulator), so the sums are those of P = 1.
 * Every member of a group calls it at the same point of the same pass. */
enum moe_pass { MOE_PASS_FORWARD, MOE_PASS_BACKWARD, MOE_PASS_WEIGHT };

struct moe_rows {
	const struct moe_dims *d;
	const int32_t *count;        /* host [E+1] */
	void *xd, *h, *act, *y;      /* [NK,C] [NK,2De] [NK,De] [NK,C] (act) */
	void *dy, *dact, *dh, *dxd;  /* [NK,C] [NK,De] [NK,2De] [NK,C] (act) */
	float *gfcw, *gfcprojw;      /* all E experts' gradients, or NULL */
};

/* fcw, fcprojw: expert e0's matrices, then the next ones' up to e1 - 1
 * (moe_expert_weights finds them in a pass's weights) */
void moe_experts(const struct backend *be, int pass, const struct moe_rows *rows,
		 const float *fcw, const float *fcprojw, int e0, int e1);

/* Expert e's fcw (proj 0) or fcprojw (proj 1) within w, a pass's weights of
 * experts [d->w_e0, d->w_e1) (NULL stays NULL: the weight part reads none).
 * An expert outside them is a broken invariant: its weights are not here. */
const float *moe_expert_weights(const struct moe_dims *d, const float *w, int proj, int e);

struct moe_ep {
	/* Run the pass's experts on this replica's rows, wherever they are
	 * owned; fcw, fcprojw: this replica's weights of the experts
	 * [rows->d->w_e0, w_e1) (all E, or its own: stage_hold_weights).
	 * Returns once every product of this replica's rows is done. */
	void (*experts)(const struct moe_ep *ep, int pass, const struct moe_rows *rows,
			const float *fcw, const float *fcprojw);
	/* Seconds the exchange blocked, added up by the hook (and by the
	 * owners' delivery of gradients); whoever times the passes takes them
	 * (ep_take_waited) as waiting, not work. NULL: not counted. */
	double *waited;
};

/* The seconds ep's exchange blocked since the last call, and zero them. */
static inline double ep_take_waited(const struct moe_ep *ep)
{
	if (!ep || !ep->waited)
		return 0.0;
	double w = *ep->waited;
	*ep->waited = 0.0;
	return w;
}

/* Bytes (each piece padded to 64) the views take; base NULL only sizes. */
size_t moe_acts_view(const struct moe_dims *d, void *base, struct moe_acts *a);
size_t moe_scratch_view(const struct moe_dims *d, void *base, struct moe_scratch *s);
size_t moe_dsave_view(const struct moe_dims *d, void *base, struct moe_dsave *s);

/* out[N,C] (overwritten) from x[N,C]; fills a. */
void moe_forward(const struct backend *be, const struct moe_dims *d, const struct moe_params *w,
		 const void *x, void *out, struct moe_acts *a);
/* dx[N,C] (overwritten) from dout[N,C]; parameter gradients accumulate into
 * g. dloss scales the auxiliary losses' gradients (the caller's 1/M).
 * With g NULL (the split backward's input part) no parameter gradient is
 * made and the products' output gradients stay in keep for
 * moe_backward_weight; keep NULL otherwise. */
void moe_backward(const struct backend *be, const struct moe_dims *d,
		  const struct moe_params *w, const struct moe_grads *g, const void *x,
		  const void *dout, void *dx, const struct moe_acts *a,
		  const struct moe_scratch *s, const struct moe_dsave *keep, float dloss);
/* The parameter gradients of moe_backward, accumulated into g from what
 * moe_backward(g NULL) kept, each tensor's the same bits as there. */
void moe_backward_weight(const struct backend *be, const struct moe_dims *d,
			 const struct moe_grads *g, const void *x, const void *dout,
			 const struct moe_acts *a, const struct moe_dsave *keep);

#endif
