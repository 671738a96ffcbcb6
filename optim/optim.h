/* optim.h - optimizers over one pipeline stage's tensors, the learning-rate
 * schedule, the error-feedback delay correction and gradient-norm helpers.
 *
 * One struct optimizer per stage (stages run in separate threads; nothing
 * here has global mutable state). It sees the stage's tensors as a list of
 * (param_info, offset in the stage arena) and composes the backend's
 * optimizer pieces (kernels/backend.h) per tensor. Every pointer handed to
 * optim_step (weights, grads) and every state buffer is backend memory.
 *
 * One step, per tensor k with n = numel floats at offset off:
 *
 *   u  = direction from the tensor's optimizer, already times -lr
 *        (weight decay is NOT part of u)
 *   w  = w * (1 - lr*wd*decay_k) + u + lambda * (u - u_prev)
 *   u_prev = u                              (only when the correction is on)
 *
 * where decay_k = param_info.decay and the correction term is present only
 * when optim.correction = ef, the tensor's group is selected by
 * optim.ef_groups (all; muon = GROUP_MATRIX tensors; adamw = the others) and
 * lambda = optim.ef_lambda != 0. DESIGN.md's w[t+1] = w[t] + u[t] +
 * lambda*(u[t] - u[t-1]) needs u[-1]: we define u[-1] = u[0], i.e. the first
 * optimizer step (step == 1) applies no correction. With lambda == 0 the term
 * is left out entirely (u_prev is still recorded), so ef with lambda 0 is
 * bit-identical to correction = none.
 *
 * Optimizers (optim.name); formulas, defaults and references are in
 * man/asyncpp-train.1 (Optimizers). bc_i = 1 - beta_i^step throughout.
 *   adamw     every tensor: m, v; u = -lr * (m/bc1) / (sqrt(v/bc2) + eps).
 *   lion      u = -lr * sign(beta1*m + (1-beta1)*g); m = beta2*m + (1-beta2)*g.
 *   sgd       m = mu*m + g; out = nesterov ? g + mu*m : m; u = -lr * out.
 *   adan      every tensor (Xie et al. 2022, the reference implementation's
 *             form): d = g - g_prev (0 on step 1), m = b1 m + (1-b1) g,
 *             v = b2 v + (1-b2) d, n = b3 n + (1-b3) (g + b2 d)^2,
 *             u = -lr (m/bc1 + b2 v/bc2) / (sqrt(n/bc3) + eps);
 *             g_prev is state: under a delay it is the previous delayed
 *             gradient, the one this optimizer last saw.
 *   ademamix  every tensor (Pagliardini et al. 2024): m1 = b1 m1 + (1-b1) g,
 *             m2 = b3(t) m2 + (1-b3(t)) g, nu = b2 nu + (1-b2) g^2,
 *             u = -lr (m1/bc1 + alpha(t) m2) / (sqrt(nu)/sqrt(bc2) + eps),
 *             alpha and b3 warmed up over optim.ademamix_warmup steps.
 *   The matrix optimizers below act on GROUP_MATRIX tensors (2-D hidden
 *   matrices [rows, cols]); every other tensor (embeddings, head, norms,
 *   biases) takes AdamW with the same lr, betas and eps (the paper's hybrid).
 *   muon      the SGD momentum output (optim.momentum, optim.nesterov),
 *             orthogonalised by newton_schulz (optim.ns_steps), times -lr * s
 *             with s = sqrt(max(1, rows/cols)) (muon_scale = shape) or
 *             0.2*sqrt(max(rows, cols)) (muon_scale = rms, whose update has an
 *             RMS of about 0.2*lr whatever the shape, like AdamW's).
 *   normuon   Muon's orthogonalised O, then per row (output neuron)
 *             v = b2 v + (1-b2) mean(O_row^2), O_row /= sqrt(v) + 1e-10
 *             (Li et al. 2025); then O times |O_before|_F / |O|_F *
 *             sqrt(max(1, rows/cols)) (shape: the reference's) or
 *             0.2*sqrt(rows*cols) / |O|_F (rms), times -lr.
 *   mars      MARS-AdamW, approximate form (Yuan et al. 2024):
 *             c = g + gamma*b1/(1-b1) * (g - g_prev) (g_prev = 0 before the
 *             first step, as the reference), c /= |c|_F when |c|_F > 1, then
 *             AdamW's m, v on c.
 *   soap      (Vyas et al. 2024; optim/soap.c) Adam in the eigenbasis of
 *             Shampoo's factors L = b2 L + (1-b2) G G^T, R = b2 R + (1-b2) G^T G,
 *             refreshed every optim.soap_every steps; step 1 only builds
 *             L, R and their eigenbases (no update, no weight decay).
 *   Experts (model.h): a mixture-of-experts layer's E experts' matrices are
 *   E tensors of the table, GROUP_MATRIX each, so a [E, rows, cols] block of
 *   the arena is E matrices for the matrix optimizers: Muon orthogonalises
 *   and scales each on its own (never one tall [E*rows, cols] matrix),
 *   NorMuon normalises each one's rows, SOAP keeps factors per expert; the
 *   shared expert's likewise; the router [E, C] is GROUP_OTHER (AdamW).
 *
 * State: each optimizer keeps named buffers (the names of struct
 * optim_rule_def); a buffer holds one part per tensor that uses it,
 * concatenated in tensor order. Most parts are the tensor's numel floats;
 * NorMuon's v is [rows], SOAP's factors and bases [rows, rows] and
 * [cols, cols]. optim_state_tensor says where each part lies.
 *
 * Step count: the caller owns it. `step` is the 1-based count of optimizer
 * steps applied so far including this one; bias correction and the first-step
 * rule above depend on it alone, so a resumed run only has to pass the right
 * step (and restore the state buffers).
 */
#ifndef ASYNCPP_OPTIM_H
#define ASYNCPP_OPTIM_H

#include <stddef.h>

#include "../io/config/config.h"
#include "../kernels/backend.h"
#include "../model/model.h"

enum optim_kind {
	OPTIM_ADAMW = 0, OPTIM_MUON, OPTIM_LION, OPTIM_SGD, OPTIM_ADAN, OPTIM_MARS,
	OPTIM_ADEMAMIX, OPTIM_SOAP, OPTIM_NORMUON
};
/* The update rule one tensor follows (the matrix optimizers split tensors
 * between their rule and AdamW). */
enum optim_rule {
	RULE_ADAMW = 0, RULE_MUON, RULE_LION, RULE_SGD, RULE_ADAN, RULE_MARS, RULE_ADEMAMIX,
	RULE_SOAP, RULE_NORMUON, RULE_COUNT
};

#define OPTIM_MAX_PARTS 7 /* state parts of one tensor: SOAP's six, ef */
#define OPTIM_MAX_STATE 12 /* named buffers of one optimizer */

/* One tensor's part of a state buffer: numel floats at off, shaped
 * [rows, cols] (cols 0: a vector of rows). */
struct optim_part {
	int buf;     /* index in optimizer.state */
	size_t off;  /* floats into the buffer */
	size_t numel;
	int rows, cols;
	float *data; /* = state[buf].data + off, once allocated */
};

struct optim_tensor {
	struct param_info info; /* copy of the model's row (name, shape, ...) */
	size_t offset;          /* in floats, within the stage arena (gradients) */
	size_t woffset;         /* in floats, within the weight arena: offset,
				 * or as optim_weights_at set it */
	int tied_copy;          /* last stage's copy of the tied wte */
	int rule;               /* enum optim_rule */
	int ef;                 /* the correction acts on this tensor */
	int ns_batch;           /* orthogonalised with the others of its shape
				 * (backend newton_schulz_many) */
	int skip;               /* not this optimizer's (optim_init_owned): no
				 * state, no update; its gradient still counts
				 * in optim_grad_sumsq */
	int n_part;
	/* the rule's parts in the order of its optim_rule_def (SOAP's sides
	 * past SOAP_MAX_DIM have data NULL: not preconditioned), then the
	 * ef part (ef_prev_update) when ef */
	struct optim_part part[OPTIM_MAX_PARTS];
};

/* One named state buffer, for checkpoints and inspect. data is backend
 * memory of numel floats. */
struct optim_state_buf {
	const char *name;
	float *data;
	size_t numel;
};

struct optimizer {
	const struct backend *be;
	int kind;                      /* enum optim_kind */
	float beta1, beta2, beta3, eps, wd, momentum, ef_lambda;
	float mars_gamma, ademamix_alpha;
	long ademamix_warmup, soap_every;
	int nesterov, ns_steps, muon_scale_rms, correction;
	struct optim_tensor *t;
	int n;
	size_t numel;                  /* floats in the stage arena */
	struct optim_state_buf state[OPTIM_MAX_STATE]; /* zeroed at init */
	int n_state;
	/* scratch, allocated once: u (largest tensor) and work (the largest
	 * need of a rule: momentum output and Newton-Schulz scratch, MARS's
	 * corrected gradient, SOAP's rotated copies) */
	float *u, *work;
	size_t u_floats, work_floats;  /* their sizes */
	/* Newton-Schulz in batches of one shape (backend newton_schulz_many):
	 * a batch's momenta, directions and scratch; NULL when the backend has
	 * no batched form or no two matrices share a shape */
	float *ns;
	size_t ns_floats;
	size_t ns_limit;               /* optim_ns_batch_limit when set up */
	long last_step;                /* step of the last optim_step, 0 = none */
};

/* Set up o over the stage's tensors params[0..n_params) (param_info taken
 * from m->params[params[k].global]) in a stage arena of numel floats, with
 * the optimizer and correction chosen by cfg ([optim] keys). State buffers
 * start at zero. Returns 0, or -1 with error() on a bad configuration or a
 * backend that lacks a needed operation. */
int optim_init(struct optimizer *o, const struct backend *be, const struct config *cfg,
	       const struct model *m, const struct stage_param *params, int n_params,
	       size_t numel);
/* optim_init where only the tensors k with mine[k] != 0 are this
 * optimizer's (mine NULL: every one). The others (expert parallelism's
 * experts owned by another replica) get no state part and no update: their
 * weights stay as they are. Their buffers' names are still registered, in
 * the same order, so optimizers of one stage differing only in mine list
 * the same buffers (optim_state), some of them perhaps of no floats. Every
 * tensor of mine gets exactly the state and the update bits it gets from
 * optim_init (Newton-Schulz batches give each matrix the bits it has
 * alone; the elementwise batches act per tensor). */
int optim_init_owned(struct optimizer *o, const struct backend *be, const struct config *cfg,
		     const struct model *m, const struct stage_param *params, int n_params,
		     size_t numel, const unsigned char *mine);
/* The weights of tensor k lie at params[k].woffset of the arena
 * optim_step is given, not at its gradient's offset (model.h:
 * stage_hold_weights; only this optimizer's tensors need be held). */
void optim_weights_at(struct optimizer *o, const struct stage_param *params);
/* One optimizer step: weights (the stage's weight arena, updated in place)
 * from grads[numel] (already clipped), learning rate lr (from lr_at), and
 * step, the 1-based optimizer step count. */
void optim_step(struct optimizer *o, float *weights, const float *grads, float lr, long step);
void optim_free(struct optimizer *o);
/* The most floats of momenta one Newton-Schulz batch holds (default 2^24,
 * 64 MB; as many again for the directions, and newton_schulz_many's scratch,
 * about 2.5 times that for wide matrices). For tests; returns the previous
 * limit. Optimizers keep the limit in force when they were set up. */
size_t optim_ns_batch_limit(size_t floats);
/* "adamw", "muon", ..., for logs and inspect. */
const char *optim_rule_name(int rule);

/* Checkpointable state: optim_state(o, i) for i < optim_state_count(o).
 * Names are stable and unique within an optimizer (the rules' part names,
 * then "ef_prev_update"; see optim.c). Buffers of no
 * floats are not listed, except under optim_init_owned (see there; their
 * data is NULL). There is no scalar state: the step count belongs to
 * the caller (see above). */
int optim_state_count(const struct optimizer *o);
struct optim_state_buf optim_state(const struct optimizer *o, int i);
/* Whether state buffer i holds a part of tensor k; if so *part (may be
 * NULL) gets where it lies and its shape. Lets a checkpoint writer or
 * inspect lay state out per tensor. */
int optim_state_tensor(const struct optimizer *o, int i, int k, struct optim_part *part);
/* The most floats any state part of any optimizer can hold for a tensor of
 * model m: the largest of a tensor's numel, rows^2 and cols^2 (SOAP's
 * factors). A bound for readers of state sent by another process. */
size_t optim_part_bound(const struct model *m);
/* Bytes o holds on its backend: every state buffer and the scratch. */
size_t optim_bytes(const struct optimizer *o);
/* The optim_bytes of what optim_init_owned(cfg, m, params, n_params,
 * numel, mine) would set up, into *bytes, without allocating anything on a
 * backend (for memory plans: bench plan). ns_many: whether the backend
 * batches Newton-Schulz (be->newton_schulz_many; its batch scratch counts).
 * -1 after error() on a bad configuration. */
int optim_size(const struct config *cfg, const struct model *m, const struct stage_param *params,
	       int n_params, size_t numel, const unsigned char *mine, int ns_many, size_t *bytes);

/* Learning rate at 1-based step `step` (optim.lr, warmup, decay,
 * min_lr_ratio, wsd_decay_frac; train.steps):
 *   warmup W > 0 and step <= W:  lr * step / W   (step W reaches lr)
 *   then p = (step - W) / (steps - W), clamped to [0, 1] (1 when steps <= W),
 *   lo = min_lr_ratio * lr:
 *     cosine    lo + (lr - lo) * (1 + cos(pi * p)) / 2
 *     linear    lr - (lr - lo) * p
 *     constant  lr
 *     wsd       lr until step D = steps - round(wsd_decay_frac * steps)
 *               (at least W), then lr - (lr - lo) * (step - D) / (steps - D)
 *   so cosine, linear and wsd reach lo at step = train.steps and stay there
 *   after it (wsd with wsd_decay_frac = 0 never decays). */
double lr_at(const struct config *cfg, long step);

/* Gradient norm helper: per_tensor[k] = sum of squares of tensor k's
 * gradient (fixed order, in double), for k < o->n, so the caller can add
 * stages' sums tensor by tensor in stage order. A tied copy (the last
 * stage's wte when S > 1) holds the same summed gradient as stage 0's wte,
 * so it is not counted: its entry is 0.0 (adding it changes nothing). */
void optim_grad_sumsq(const struct optimizer *o, const float *grads, double *per_tensor);
/* The factor that clips a gradient whose squared global norm is sumsq to
 * norm max_norm (train.grad_clip): max_norm / sqrt(sumsq) when the norm
 * exceeds max_norm > 0, else 1 (also for max_norm <= 0: clipping off). The
 * caller scales every stage's gradients by it (be->scale) before optim_step. */
float optim_clip_scale(double sumsq, double max_norm);

#endif
