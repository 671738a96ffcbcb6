/* model.h - decoder-only transformer: parameter table, stages, forward and
 * backward per layer, written against kernels/backend.h.
 *
 * One table (struct param_info, built by model_init) lays out every
 * parameter tensor in one arena, in this order:
 *   wte [Vp,C], wpe [T,C] (gpt2), then per layer l:
 *     ln1w [C], ln1b [C] (gpt2), qkvw [QKV,C], qkvb [QKV] (gpt2),
 *     attprojw [C,C], attprojb [C] (gpt2), ln2w [C], ln2b [C] (gpt2),
 *     fcw [FC,C] (FC = 4C gpt2, 2F llama: [gate|up]), fcb [FC] (gpt2),
 *     fcprojw [C,F'] (F' = 4C gpt2, F llama), fcprojb [C] (gpt2),
 *   lnfw [C], lnfb [C] (gpt2), head [Vp,C] (only when untied).
 * A mixture-of-experts layer (llama with n_expert E > 0; see moe.h) has,
 * in place of fcw and fcprojw:
 *     router [E,C], experts.0.fcw .. experts.{E-1}.fcw [2De,C] ([gate|up]),
 *     experts.0.fcprojw .. experts.{E-1}.fcprojw [C,De],
 *     shared.fcw [2De,C], shared.fcprojw [C,De] (only with shared_expert).
 * One 2-D tensor per expert keeps checkpoints, inspect, Muon and the stage
 * partition unchanged; the E fcw (and the E fcprojw) are adjacent in the
 * arena, so together they are one [E,2De,C] (and [E,C,De]) block.
 * Names follow llm.c ("h.3.qkvw"); matrices are (out, in) row-major, so
 * allocation, checkpoints, stage partitioning, inspect and import/export
 * all walk the same table.
 *
 * Stages: stage s of a cut (model/cut.h) owns layers [layer_begin,
 * layer_end), stage 0 also the embeddings, the last stage lnf and the head
 * (the first and the last stage may own no layer). A stage's tensors are a
 * contiguous range of the global arena, except a tied head on a last stage
 * that is not stage 0: that stage keeps its own copy of wte ("tied copy"),
 * whose gradient the caller sums with stage 0's in a fixed order
 * (embedding part first, then head part) so both copies stay identical.
 * With S = 1 and tied weights, the head's gradient also goes to a separate
 * buffer (stage->tied_head_grad) and is added after the embedding part, so
 * single-device and pipelined runs sum in the same order.
 */
#ifndef ASYNCPP_MODEL_H
#define ASYNCPP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"
#include "cut.h"
#include "moe.h"

enum arch { ARCH_LLAMA = 0, ARCH_GPT2 = 1 };

struct model_config {
	int arch;
	int V, Vp;      /* vocabulary, padded to a multiple of 64 */
	int L, C;       /* layers, width */
	int NH, NKV, HD;/* heads, kv heads, head width */
	int F;          /* feed-forward width (llama: per gate; gpt2: 4C) */
	int T;          /* max sequence length */
	int tied;
	float eps, rope_theta, init_std;
	/* mixture of experts (llama; E = 0 is the dense model) */
	int E, K;       /* experts per layer, experts per token */
	int De;         /* expert width (per gate); 0 at init means F */
	int shared;     /* 1: a shared expert of width De */
	int router;     /* enum moe_router */
	float aux_coef, z_coef; /* load-balancing alpha, z-loss beta */
};

/* Parameter groups for optimizers: hidden 2-D matrices go to Muon. */
enum param_group { GROUP_MATRIX = 0, GROUP_OTHER = 1 };

struct param_info {
	char name[48];
	int layer;        /* -1 for embeddings, final norm and head */
	int rows, cols;   /* cols = 0 for vectors; numel = rows * max(cols,1) */
	size_t offset;    /* in floats, within the global arena */
	size_t numel;
	int group;        /* GROUP_MATRIX: qkvw, attprojw, fcw, fcprojw, and the
			   * experts' (and shared expert's) fcw, fcprojw; the
			   * router is GROUP_OTHER (AdamW) */
	int decay;        /* 1 for 2-D weights (weight decay applies) */
};

struct model {
	struct model_config cfg;
	struct param_info *params;
	int n_params;     /* tensors */
	size_t numel;     /* total floats in the arena */
};

/* Fill m from cfg (derives Vp, HD, F defaults); returns -1 on a bad shape.
 * Defaults for zero fields: Vp = V rounded up to 64 (a nonzero Vp >= V is
 * kept, e.g. from an llm.c checkpoint), NKV = NH, HD = C/NH, F = 4C (gpt2) or
 * round(8C/3) rounded up to a multiple of 64 (llama), eps 1e-5, rope_theta
 * 10000, init_std 0.02. */
int model_init(struct model *m, const struct model_config *cfg);
struct config;
/* The mixture-of-experts fields of mc (E, K, De, shared, router, aux_coef,
 * z_coef) from cfg's model.n_expert ... model.z_loss_coef. */
void model_moe_from(struct model_config *mc, const struct config *cfg);
/* Fill mc from the [model] section of cfg; V overrides model.vocab_size
 * when nonzero (the tokenizer's size). Then call model_init. */
int model_config_from(struct model_config *mc, const struct config *cfg, int V);
void model_free(struct model *m);
/* Initialise an arena of m->numel floats (host memory) deterministically
 * from seed: normal(0, init_std) for matrices and embeddings, residual
 * projections scaled by 1/sqrt(2L), norms' weights 1, biases 0. */
void model_init_weights(const struct model *m, float *params, uint64_t seed);
/* The same for only the tensors stage s of cut reads (its own, and wte for
 * a last stage's tied copy): each tensor gets exactly the values above, and
 * the rest of the arena is not touched (so, freshly allocated, it takes no
 * memory). For a process that runs one stage. */
void model_init_weights_stage(const struct model *m, float *params, uint64_t seed,
			      const struct stage_cut *cut, int s);
/* The share of a micro-batch's tokens that multiply with tensor p: K/E
 * for an expert's matrices (a token goes through K of the E experts), 1
 * for every other tensor (the router and the shared expert included). */
double model_param_share(const struct model *m, const struct param_info *p);
/* The expert e of a mixture-of-experts layer whose matrix p is
 * ("h.L.experts.e.fcw" or ".fcprojw"), or -1 (every other tensor: the
 * router and the shared expert included). */
int model_param_expert(const struct model *m, const struct param_info *p);
/* Parameters not counting the embedding lookup tables (for 6N FLOPs): all
 * of the arena minus wpe, and minus wte when the head is untied (a tied wte
 * is the head matrix and does count); each tensor weighted by
 * model_param_share, so an MoE model counts its active parameters. llm.c
 * counts every parameter (N = m->numel, i.e. wpe included: +786,432 for
 * GPT-2 124M, +0.6%). */
size_t model_flops_params(const struct model *m);
/* Training FLOPs per token: 6N + 6*L*C*T with N = model_flops_params(),
 * T = cfg.T (the context length). */
double model_flops_per_token(const struct model *m);
int model_find_param(const struct model *m, const char *name);

/* One stage: a contiguous slice of the model and the buffers it needs. */
struct stage_param {
	int global;       /* index into model.params */
	size_t offset;    /* in floats, within the stage arena (gradients) */
	size_t woffset;   /* in floats, within the stage's weight arena: offset,
			   * or after stage_hold_weights where the tensor lies
			   * there ((size_t)-1: not held) */
	int tied_copy;    /* this is the last stage's copy of wte */
};

struct stage {
	const struct model *m;
	const struct backend *be;
	int s, S;
	int layer_begin, layer_end;
	int has_embed, has_head;
	struct stage_param *params;
	int n_params;
	size_t numel;          /* floats in this stage's arena (its gradients) */
	size_t wnumel;         /* floats in its weight arena: numel, or less
				* after stage_hold_weights */
	int w_e0, w_e1;        /* the experts of each MoE layer whose weights
				* the weight arena holds: [0, E) or, after
				* stage_hold_weights, the owned ones */
	int B, T;              /* micro-batch shape */
	int n_slots;           /* activation slots (in-flight micro-batches) */
	void **slot_acts;      /* per slot: saved activations */
	void *scratch;         /* activation gradients, logits; shared by slots */
	int head_rows;         /* the head (logits, loss, their gradient) runs on
				* this many rows at a time: the logits of all
				* B*T rows are never held at once (stage_init
				* picks it; it may be lowered, never raised) */
	float *tied_head_grad; /* [Vp*C] when tied and S == 1, else NULL */
	/* accounting, for logs (bytes: activations in the backend's act_dtype) */
	size_t act_bytes_per_slot, scratch_bytes;
	/* Of act_bytes_per_slot, what the split backward keeps between its
	 * input and weight parts (stage_split_init; 0 before) */
	size_t split_bytes_per_slot;
	int split;             /* stage_split_init has run */
	int split_head;        /* ... with SPLIT_HEAD on a stage with the head */
	/* When set, stage_backward reports each range of the gradient arena as
	 * soon as it has made its last contribution to it: grads_done(ctx, lo,
	 * n) for the n floats at grads + lo. The ranges tile the arena, every
	 * backward in the same order: the head's and final norm's (finished by
	 * the forward; under SPLIT_HEAD by W, first), then each layer's from
	 * the last, then the embeddings' (after the lookup's backward). So the
	 * replicas' gradient sum of a step's last micro-batch can start while
	 * its backward goes on. With the split backward, W reports them. */
	void (*grads_done)(void *ctx, size_t lo, size_t n);
	void *grads_done_ctx;
	/* Expert parallelism (moe.h: struct moe_ep), set by the executor for
	 * a training segment's passes; NULL (every expert runs here) for
	 * everything else: schedule none, evaluation, sampling */
	const struct moe_ep *moe_ep;
	/* private to model.c: tensor offsets within the stage arena, the
	 * mean loss in backend memory (last stage), the runs of tensors whose
	 * gradients are done at one point of the backward */
	struct grad_run {
		size_t lo, n;
		int when;      /* GRADS_AT_START, a stage layer index, GRADS_AT_END */
	} *runs_;
	int n_runs_;
	size_t *off_;
	size_t *woff_;         /* off_'s table for the weight arena */
	int act_dtype_, fused_norm_; /* what the layout reads of the backend */
	float *loss_dev_;
	float *slot_dloss_;    /* per slot: the forward's dloss (aux gradients) */
	int32_t *moe_counts_;  /* MoE: per slot and layer the experts' row
				* counts on the host ([n_slots][nl][E+1]), the
				* forward's, read again by the backward */
	float *moe_aux_dev_;   /* MoE: [nl][2] backend memory, where
				* stage_moe_stats gathers the layers' aux losses */
};

/* The mixture-of-experts layer's dimensions (moe.h) as stage st runs them:
 * its B x T tokens, the model's experts, its backend's activation type. */
void stage_moe_dims(const struct stage *st, struct moe_dims *d);

/* Build stage s of cut (NULL: the whole model as one stage, s = 0) for
 * micro-batches of B x T with n_slots activation slots. Buffers come from
 * the stage's backend. */
int stage_init(struct stage *st, const struct model *m, const struct backend *be,
	       const struct stage_cut *cut, int s, int B, int T, int n_slots);
void stage_free(struct stage *st);
/* What stage_init would allocate for stage s of cut (NULL: the whole
 * model), sized without building it, by the same layout: for memory plans
 * (bench plan), which thereby cannot drift from a run. A backend enters
 * only by how it stores activations (act_dtype, enum act_dtype) and
 * whether it fuses the norms' backward with the residual add (fused_norm:
 * be->norm_backward_add != NULL; then the backward scratch holds no
 * separate norm input gradient). split: -1 for the fused backward, else
 * stage_split_init's flags (the split kinds), whose saved gradients are
 * then counted in act_bytes_per_slot. With params non-NULL, *params gets
 * the stage's tensor list (st.params, n_params of them; malloc'ed, the
 * caller frees it), for optim_size. -1 after error() on a bad shape. */
struct stage_size {
	size_t numel;                /* floats of one weight version (st.numel) */
	size_t act_bytes_per_slot;   /* one micro-batch's saved activations */
	size_t split_bytes_per_slot; /* of which the split backward's (0: none) */
	size_t scratch_bytes;        /* shared by the slots: backward scratch, head
				      * logits, the tied head's gradient (S = 1) */
	int n_params;                /* tensors (st.n_params) */
};
int stage_size(const struct model *m, const struct stage_cut *cut, int s, int B, int T,
	       int act_dtype, int fused_norm, int split, struct stage_size *out,
	       struct stage_param **params);
/* How many tensors stage s of cut holds (its st.n_params, the tied copy of
 * wte included), without building it. */
int stage_param_count(const struct model *m, const struct stage_cut *cut, int s);
/* Expert parallelism's weights (sched/comm/experts.h): from now on the
 * stage's weight arena (wnumel floats; what every pass's params is) holds
 * only the tensors k with mine[k] != 0, back to back in tensor order
 * (woffset); the gradient arena keeps every tensor (offset, numel). Only
 * experts' tensors may be left out, and in every MoE layer the same
 * contiguous range [w_e0, w_e1) of experts is kept, so moe.h's passes
 * find expert e's weights at (e - w_e0) matrices after the layer's first.
 * Sets the layout only (its caller then allocates arenas of wnumel
 * floats). 0, or -1 after error(). */
int stage_hold_weights(struct stage *st, const unsigned char *mine);
/* Copy this stage's weights out of / into a global (host) arena, from and
 * to a weight arena (woffset: the tensors it holds). The tied
 * copy of wte is filled by stage_gather but skipped by stage_scatter (stage 0
 * owns wte). */
void stage_gather(const struct stage *st, float *stage_arena, const float *global);
void stage_scatter(const struct stage *st, float *global, const float *stage_arena);
/* Offset (floats, in the stage arena) of this stage's wte: the embedding on
 * stage 0, the tied copy on a last stage with S > 1; -1 when the stage holds
 * none. With tied weights and S > 1 the pipeline must, once all
 * micro-batches are done, add the copy's gradient into stage 0's wte
 * gradient (g_wte[i] = g_wte[i] + g_copy[i], i.e. embedding part first,
 * then head part) and use that sum for both copies, so that both weight
 * copies receive the same update. */
long stage_wte_offset(const struct stage *st);
/* Offset of the head's matrix in the stage arena (the untied head, the tied
 * copy, or wte when S = 1 and tied); -1 when the stage has no head. */
long stage_head_offset(const struct stage *st);
/* After the last micro-batch of a step: with tied weights and S = 1, add
 * tied_head_grad into the wte gradient in grads (embedding part + head
 * part, the order the pipeline uses) and zero tied_head_grad. A no-op for
 * every other stage. Must run before the gradients are read. */
void stage_finish_grads(struct stage *st, float *grads);

/* Forward one micro-batch through the stage using parameters `params`
 * (a stage arena, i.e. one weight version), saving activations in `slot`.
 *  - stage 0 reads tokens[B*T]; other stages read x_in[B*T*C].
 *  - non-last stages write x_out[B*T*C].
 *  - the last stage computes the mean loss over B*T targets into *loss and,
 *    when grads != NULL, immediately back-propagates through the head:
 *    head/lnf gradients accumulate into grads and d(x) is kept in the slot
 *    for stage_backward. dloss is the caller's scale (1/M for M
 *    micro-batches); the loss gradient is dloss/(B*T) per token since the
 *    loss is a mean. With targets NULL no loss is computed.
 *  - x_in and x_out are activations: B*T*C elements of the backend's
 *    act_dtype (kernels/act.h), act_size(be) bytes each.
 *  - tokens, x_in, targets and x_out are backend memory. The mean loss goes
 *    to *loss (host memory; the call waits for the device) and/or to
 *    loss_dev[0] (backend memory, queued: no wait), whichever is non-NULL.
 *  - tokens (stage 0) are saved in the slot, so they need not outlive the
 *    call.
 */
void stage_forward(struct stage *st, int slot, const float *params, const int32_t *tokens,
		   const void *x_in, const int32_t *targets, void *x_out, float *loss,
		   float *loss_dev, float *grads, float dloss);
/* Backward of the micro-batch in `slot` with the same `params` it was
 * forwarded with. dx_out[B*T*C] is the gradient from the next stage (ignored
 * on the last stage). Parameter gradients accumulate into grads (a stage
 * arena); dx_in[B*T*C] (non-first stages) receives the input gradient. */
void stage_backward(struct stage *st, int slot, const float *params, float *grads,
		    const void *dx_out, void *dx_in);
/* The split backward of zero-bubble schedules: stage_backward in two
 * parts, B (the input gradient, on the critical path to the previous stage)
 * and W (the parameter gradients, which may wait for a bubble).
 * stage_split_init enables them once, before any forward: each activation
 * slot grows by what B keeps for W, the gradient at the output of every
 * product and norm with weights (per layer of width C, in act_dtype
 * elements: 4*N*C + N*fc_rows + N*QKV dense, or N*C (shared expert only) +
 * 3*N*C + N*QKV + N*K*(C + 2*De) + N*E (+ N*2*De shared) with experts, and
 * N*C more on stage 0; N = B*T), counted in act_bytes_per_slot and
 * split_bytes_per_slot. -1 after error() when the memory cannot be had
 * (the stage is then as before).
 *
 * The head's and final norm's gradients are made by stage_forward (with
 * grads), in the forward, as the fused backward has them, unless flags
 * has SPLIT_HEAD: then the forward of the last stage makes only the loss
 * and d(x), keeping the targets and the final norm's output gradient
 * (N int32 + N*C more per slot), and W makes the head's gradient by
 * running the head's row chunks again (their logits and loss gradient,
 * then the gradient: one more product of the head's size, the price of
 * not keeping B*T x Vp logits) and the final norm's from what was kept.
 * A stage with SPLIT_HEAD is run with B and W only.
 *
 * stage_backward_input(slot) does all stage_backward does but the
 * parameter gradients: dx_out, dx_in as there, grads untouched.
 * stage_backward_weight(slot) then makes them from what B kept, reading no
 * weight but the head's under SPLIT_HEAD (params: the weights the slot was
 * forwarded with; read only then), so other weights may change between
 * the two; the activations in the slot must not: the slot is free again
 * only after W. For any interleaving of forwards and B's, with each
 * micro-batch's W after its B and the W's in the order of the fused
 * backwards they replace, grads and the input gradients are the same bits
 * as with stage_backward, on every backend (backend.h: each part of a
 * split op is that part of the fused op). grads_done reports come from W,
 * in stage_backward's order. */
enum { SPLIT_HEAD = 1 };
int stage_split_init(struct stage *st, int flags);
void stage_backward_input(struct stage *st, int slot, const float *params, const void *dx_out,
			  void *dx_in);
void stage_backward_weight(struct stage *st, int slot, const float *params, float *grads);
/* Bytes per slot stage_split_init(flags) adds, without building the stage
 * (for memory plans): stage s of cut (NULL: the whole model) at micro-batch
 * BxT with act_size bytes per activation. */
size_t stage_split_bytes(const struct model *m, const struct stage_cut *cut, int s, int B,
			 int T, size_t act_size, int flags);
/* The auxiliary (router) losses of the micro-batch forwarded in `slot`:
 * the sum over the stage's MoE layers of aux_coef*balance + z_coef*zloss
 * (see moe.h). 0 for a dense model. stage_forward's loss is the
 * cross-entropy alone; the training objective, whose gradient the
 * backward computes, is that plus the aux losses of every stage. */
double stage_aux_loss(const struct stage *st, int slot);
/* What the router did with the micro-batch forwarded in `slot`, summed over
 * the stage's layers, into out[2 + E]: out[0] the load-balancing term
 * (balance of moe.h, before aux_coef), out[1] the z-loss (before z_coef),
 * out[2 + e] the (token, expert) slots routed to expert e. Returns E;
 * 0 (out untouched) for a dense model. */
int stage_moe_stats(const struct stage *st, int slot, double *out);
/* Logits at position pos of each sequence, for sampling: a forward without
 * targets over tokens[B*T] (positions after pos do not matter: attention is
 * causal); logits[B*Vp] are float (backend memory), whatever the
 * backend's act_dtype. Single-stage (S = 1) only. */
void model_logits_at(struct stage *st, const float *params, const int32_t *tokens,
		     int pos, float *logits);

#endif
