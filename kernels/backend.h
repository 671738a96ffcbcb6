/* backend.h - the operations a model needs, as a table a backend fills in.
 *
 * Legend: B batch (sequences per micro-batch), T sequence length, N = B*T
 * rows, C model width, NH query heads, NKV key/value heads, HD head width
 * (C = NH*HD), QKV = (NH + 2*NKV)*HD, F feed-forward width, V vocabulary,
 * Vp padded vocabulary (rows of the embedding/head; columns >= V are never a
 * target and get probability 0).
 *
 * Conventions every backend follows:
 *  - All pointers are backend memory (host memory for the CPU backend).
 *  - Activation gradients (d<input>) are OVERWRITTEN; parameter gradients
 *    (dw, db, dwte, ...) are ACCUMULATED (+=) so micro-batches add up.
 *  - Results must not depend on the number of threads: reductions use a fixed
 *    order (e.g. fixed-size chunks combined in index order). This is what
 *    makes pipeline and single-device runs agree bit for bit.
 *  - qkv rows hold [q heads (NH*HD) | k heads (NKV*HD) | v heads (NKV*HD)];
 *    query head h uses key/value head h / (NH/NKV).
 *  - A NULL slot means "unsupported by this backend"; tests skip it.
 *  - Activations and activation gradients (every void * below: a layer's
 *    inputs and outputs, their gradients, logits) are stored in the
 *    backend's act_dtype (kernels/act.h); weights, their gradients, norm
 *    statistics (mean, rstd), lse, losses and optimizer state are float. An
 *    op on a bf16 backend computes in float and rounds each stored element
 *    to nearest even; the CPU's bf16 ops give exactly the float op on the
 *    (exactly widened) bf16 inputs, rounded once per output.
 */
#ifndef ASYNCPP_BACKEND_H
#define ASYNCPP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "act.h"

/* One tensor of an elementwise optimizer step (elementwise_step below). */
struct optim_elem_tensor {
	float *w;            /* [n] weights, updated */
	const float *g;      /* [n] gradient */
	float *s0, *s1;      /* [n] state: AdamW m and v; Lion m (s1 unused) */
	float *u_prev;       /* [n] the last update (error feedback) or NULL */
	size_t n;
	float decay;         /* the decay apply_update gets */
	int correct;         /* with u_prev: 1 adds lambda (u - u_prev), 0 only
			      * records u (the first step, or lambda 0) */
};

enum optim_elem_rule { OPTIM_ELEM_ADAMW = 0, OPTIM_ELEM_LION = 1 };

struct backend {
	const char *name;
	int act_dtype;  /* enum act_dtype: how activations are stored */

	/* ---- memory and streams ---- */
	void *(*alloc)(size_t bytes);                 /* zeroed, 64-byte aligned */
	void (*free)(void *p);
	/* to_device returns once src may be reused; the data is there for
	 * every op queued after it (a GPU may still be copying). to_host
	 * returns with the data in dst. */
	void (*to_device)(void *dst, const void *src, size_t bytes);
	void (*to_host)(void *dst, const void *src, size_t bytes);
	/* Within the backend. dst == src is a no-op on every backend (no call
	 * is made: memcpy onto itself is undefined in C, and cudaMemcpy does
	 * not promise memmove semantics); other overlaps are not allowed. */
	void (*copy)(void *dst, const void *src, size_t bytes);
	void (*zero)(void *p, size_t bytes);
	void (*synchronize)(void); /* waits for every op queued so far, every lane */
	void (*set_threads)(int n); /* 0 = all cores */
	/* Most bytes of device memory held at once so far (allocations plus the
	 * backend's scratch pool); NULL where memory is the host's. */
	size_t (*memory_peak)(void);

	/* ---- activation storage ---- */
	/* out[n] (act) = in[n] (float), rounded; in[n] (float) = out[n] (act),
	 * exact. Both backend memory; copies on an f32 backend. */
	void (*act_from_f32)(void *out, const float *in, size_t n);
	void (*act_to_f32)(float *out, const void *in, size_t n);

	/* ---- embeddings ---- */
	/* out[N,C] = wte[tokens[n],:] + (wpe ? wpe[n % T,:] : 0) */
	void (*embed_forward)(void *out, const int32_t *tokens, const float *wte,
			      const float *wpe, int B, int T, int C);
	/* dwte[Vp,C] += scatter of dout[N,C]; dwpe[T,C] += (if non-NULL) */
	void (*embed_backward)(float *dwte, float *dwpe, const void *dout,
			       const int32_t *tokens, int B, int T, int C);

	/* ---- normalisation (over the last dimension C of inp[N,C]) ---- */
	/* out[N,C], mean[N], rstd[N]; w[C], b[C]. A NULL w means weight 1, a
	 * NULL b bias 0. The backward reads w the same way and skips dw or db
	 * when that pointer is NULL (the other is still accumulated).
	 * Split backward (zero-bubble schedules, model.h stage_backward_input):
	 * both backwards skip dinp when it is NULL (w is then not read), and
	 * rmsnorm_backward skips a NULL dw; dinp alone (dw, db NULL) and dw, db
	 * alone (dinp NULL) are each the same bits as that part of one call
	 * with all three, and so are norm_backward_add with dw = db = NULL
	 * and matmul_backward_dgelu with dw = dbias = NULL. */
	void (*layernorm_forward)(void *out, float *mean, float *rstd, const void *inp,
				  const float *w, const float *b, int N, int C, float eps);
	void (*layernorm_backward)(void *dinp, float *dw, float *db, const void *dout,
				   const void *inp, const float *w, const float *mean,
				   const float *rstd, int N, int C);
	/* Optional fused forms (NULL: the model runs the ops apart; CUDA: one
	 * kernel each, saving the residual add's pass over memory), the same
	 * bits as the ops apart. add_norm_forward: res[N,C] = a + b as add_act
	 * computes it, then out, mean, rstd from res as layernorm_forward
	 * (is_ln) or rmsnorm_forward (mean and bias unused) compute them.
	 * norm_backward_add: dacc[N,C] = dacc + dinp as add_act adds, dinp
	 * being what layernorm_backward (is_ln) or rmsnorm_backward (mean, db
	 * unused) would store; dw (db) accumulated as there. */
	void (*add_norm_forward)(void *res, void *out, float *mean, float *rstd, const void *a,
				 const void *b, const float *w, const float *bias, int N, int C,
				 float eps, int is_ln);
	void (*norm_backward_add)(void *dacc, float *dw, float *db, const void *dout,
				  const void *inp, const float *w, const float *mean,
				  const float *rstd, int N, int C, int is_ln);
	/* out[N,C] = inp * rstd * w, rstd[N] = 1/sqrt(mean(inp^2) + eps) */
	void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const float *w,
				int N, int C, float eps);
	void (*rmsnorm_backward)(void *dinp, float *dw, const void *dout,
				 const void *inp, const float *w, const float *rstd,
				 int N, int C);

	/* ---- matrix products ---- */
	/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (bias may be NULL) */
	void (*matmul_forward)(void *out, const void *inp, const float *w,
			       const float *bias, int N, int C, int OC);
	/* dinp[N,C] = dout @ w (skipped if dinp NULL; w is read for it only);
	 * dw[OC,C] += dout^T @ inp (skipped if dw NULL); dbias[OC] += column
	 * sums of dout (if non-NULL). Each part called alone (the split
	 * backward: dinp with dw = dbias = NULL, then dw, dbias with dinp =
	 * NULL) gives the bits of the call with all three. */
	void (*matmul_backward)(void *dinp, float *dw, float *dbias, const void *dout,
				const void *inp, const float *w, int N, int C, int OC);
	/* Optional fused forms (NULL: the model runs the ops apart; CUDA: one
	 * GEMM with a GELU epilogue, whose GELU may round apart from
	 * gelu_forward's by a few ulp, else the ops apart).
	 * pre[N,OC] = inp @ w^T + bias; out[N,OC] = gelu(pre). */
	void (*matmul_gelu_forward)(void *out, void *pre, const void *inp, const float *w,
				    const float *bias, int N, int C, int OC);
	/* dpre[N,C] = gelu_backward through pre[N,C] of dout @ w (matmul_backward's
	 * dinp); dw[OC,C] += dout^T @ inp; dbias[OC] += column sums of dout. */
	void (*matmul_backward_dgelu)(void *dpre, float *dw, float *dbias, const void *dout,
				      const void *inp, const float *w, const void *pre, int N,
				      int C, int OC);
	/* Optional (NULL on the cpu backend): the products that follow may read
	 * any weight inside w[0..n) from a copy made now in the backend's
	 * operand type (CUDA: bf16, rounded as each product would round it, so
	 * results are the same bits), instead of converting it per product.
	 * The copy is not kept in step with w: call again before the products
	 * whenever w may have changed (model/ does before every pass). Memory
	 * given back through free loses the copies inside it. */
	void (*weights_bf16)(const float *w, size_t n);

	/* ---- attention ---- */
	/* Rotary embedding on the q and k heads of qkv[N,QKV], in place; position
	 * of row n is n % T; pairs are (i, i + HD/2) within a head (the
	 * "rotate_half" convention of Llama in Hugging Face). */
	void (*rope_forward)(void *qkv, int B, int T, int NH, int NKV, int HD,
			     float theta);
	/* The transpose (inverse rotation), applied to dqkv in place. */
	void (*rope_backward)(void *dqkv, int B, int T, int NH, int NKV, int HD,
			      float theta);
	/* Causal attention, scale 1/sqrt(HD). out[N,NH*HD]; lse[B,NH,T] (float)
	 * is the log-sum-exp of each query's scaled scores, kept for the
	 * backward so no T x T matrix needs to be stored. */
	void (*attention_forward)(void *out, float *lse, const void *qkv, int B, int T,
				  int NH, int NKV, int HD);
	/* dqkv[N,QKV] (overwritten) from dout[N,NH*HD] and the forward's out, lse. */
	void (*attention_backward)(void *dqkv, const void *dout, const void *qkv,
				   const void *out, const float *lse, int B, int T, int NH,
				   int NKV, int HD);

	/* ---- activations and residuals ---- */
	/* tanh-approximated GELU as in GPT-2. out[n], inp[n] */
	void (*gelu_forward)(void *out, const void *inp, size_t n);
	void (*gelu_backward)(void *dinp, const void *inp, const void *dout, size_t n);
	/* inp[N,2F] = [gate | up] per row; out[N,F] = silu(gate) * up */
	void (*swiglu_forward)(void *out, const void *inp, int N, int F);
	void (*swiglu_backward)(void *dinp, const void *dout, const void *inp, int N, int F);
	/* out[n] = a[n] + b[n] on activations (out may alias a or b) */
	void (*add_act)(void *out, const void *a, const void *b, size_t n);
	/* The same on floats (gradients: the tied embedding, replicas). */
	void (*add)(float *out, const float *a, const float *b, size_t n);

	/* ---- mixture of experts (model/moe.h has the maths; Legend there: N
	 * tokens, C width, E experts, K experts per token, NK = N*K slots).
	 * z, x, xd, y, out, dz, dy, dout are activations (act_dtype); score,
	 * gate, dgate, aux float; sel, pos, count int32. Every sum runs in a
	 * fixed order (per token over e or j in index order; over tokens in
	 * index order), so no result depends on threads. ---- */
	/* score[N,E] = softmax(z) (router 0) or sigmoid(z) (router 1) of
	 * z[N,E]; sel[N,K] the K best, best first, ties to the lower index;
	 * gate[N,K] = score[sel] / sum_j score[sel_j] when K > 1, else score. */
	void (*moe_route)(float *score, int32_t *sel, float *gate, const void *z, int N, int E,
			  int K, int router);
	/* count[E+1]: expert e's slots are rows [count[e], count[e+1]) of the
	 * dispatched buffers; pos[N,K]: the row of slot (n, j), slots of one
	 * expert in ascending n (stable: by expert, then token, then j). */
	void (*moe_dispatch)(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K,
			     int E);
	/* xd[NK,C]: row pos[n,j] = x[N,C] row n. */
	void (*moe_gather)(void *xd, const void *x, const int32_t *pos, int N, int K, int C);
	/* out[N,C] += sum_j gate[n,j] * y[pos[n,j],:] (j in order, summed in
	 * float from out's value, stored once); gate NULL adds y unscaled (the
	 * gather's backward: dx += dxd). */
	void (*moe_combine)(void *out, const void *y, const float *gate, const int32_t *pos,
			    int N, int K, int C);
	/* The combine's backward: dy[NK,C] row pos[n,j] = gate[n,j] *
	 * dout[n]; dgate[N,K] = dout[n] . y[pos[n,j]] (double sum over c). */
	void (*moe_combine_backward)(void *dy, float *dgate, const void *dout, const void *y,
				     const float *gate, const int32_t *pos, int N, int K, int C);
	/* The experts' products, every expert of a layer in one call (CUDA: one
	 * grouped GEMM; ASYNCPP_MOE_GEMM=loop runs them one by one). count is
	 * HOST memory [E+1] (moe_dispatch's, copied back): expert e's rows are
	 * [count[e], count[e+1]) of inp and out; w holds E [OC,C] matrices back
	 * to back. out[rows of e, OC] = inp[rows of e, C] @ w_e^T (no bias), an
	 * expert with no row writes nothing. Each expert's rows get the bits of
	 * matmul_forward(out + r0*OC, inp + r0*C, w_e, NULL, rows, C, OC) on
	 * the CPU (which runs exactly that). */
	void (*moe_expert_forward)(void *out, const void *inp, const float *w,
				   const int32_t *count, int E, int C, int OC);
	/* Its backward, per expert as matmul_backward with dbias NULL: dinp's
	 * rows of e = dout's @ w_e (skipped if dinp NULL; w read for it only),
	 * dw_e[OC,C] += dout's^T @ inp's (skipped if dw NULL; an expert with no
	 * row adds nothing). Each part alone gives the bits of the call with
	 * both (the split backward). */
	void (*moe_expert_backward)(void *dinp, float *dw, const void *dout, const void *inp,
				    const float *w, const int32_t *count, int E, int C, int OC);
	/* aux[2] = the balance and z losses of moe.h from z[N,E], score[N,E]
	 * and count[E+1]. */
	void (*moe_aux)(float *aux, const void *z, const float *score, const int32_t *count,
			int N, int E, int K, int router);
	/* dz[N,E] (overwritten): the gates' gradient dgate[N,K] through gates
	 * and scores, plus dloss*alpha times the balance loss's and dloss*beta
	 * times the z loss's gradient. */
	void (*moe_router_backward)(void *dz, const void *z, const float *score,
				    const int32_t *sel, const float *gate, const float *dgate,
				    const int32_t *count, int N, int E, int K, int router,
				    float dloss, float alpha, float beta);

	/* ---- loss ---- */
	/* losses[N] (float) = -log softmax(logits[n,:V])[targets[n]]. If dlogits
	 * is non-NULL it receives (softmax - onehot) * dloss over the first V
	 * columns and 0 over the padding; dlogits may alias logits.
	 * A target outside [0, V) reads no logit: target < 0 means "ignore",
	 * loss 0 and a zero gradient row; target >= V is a bad input, loss NaN
	 * (so it shows in the mean) and a zero gradient row. dloss is per row:
	 * stage_forward passes dloss/N and reports the mean over all N = B*T
	 * rows, ignored rows counted as 0 (not a mean over the kept ones, as
	 * PyTorch's ignore_index would give); nothing produces a negative
	 * target today. */
	void (*softmax_xent)(float *losses, void *dlogits, const void *logits,
			     const int32_t *targets, int N, int V, int Vp, float dloss);
	/* out[0] = (float)(sum of losses[N] in double / N), on the device, with
	 * no wait: the CPU sums in index order (stage_forward's host sum, bit
	 * for bit); CUDA in a fixed tree (the bits depend on N only). */
	void (*loss_mean)(float *out, const float *losses, int N);

	/* ---- optimizer pieces (optim/ composes them) ---- */
	/* Each *_dir writes the update direction u (already multiplied by -lr)
	 * and advances its state; weight decay is not part of u. */
	/* AdamW: m,v updated; u = -lr * (m/bc1) / (sqrt(v/bc2) + eps) */
	void (*adamw_dir)(float *u, const float *g, float *m, float *v, size_t n, float lr,
			  float beta1, float beta2, float eps, float bc1, float bc2);
	/* Adan (Xie et al. 2022): with d = g - gprev (0 when first), m = b1 m +
	 * (1-b1) g, v = b2 v + (1-b2) d, nacc = b3 nacc + (1-b3) (g + b2 d)^2,
	 * u = -lr (m/bc1 + b2 v/bc2) / (sqrt(nacc)/sqrt(bc3) + eps); gprev = g.
	 * Elementwise (no reduction), so any order gives the same bits. */
	void (*adan_dir)(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
			 size_t n, float lr, float beta1, float beta2, float beta3, float eps,
			 float bc1, float bc2, float bc3, int first);
	/* AdEMAMix (Pagliardini et al. 2024): m1 = b1 m1 + (1-b1) g, m2 = b3 m2 +
	 * (1-b3) g, nu = b2 nu + (1-b2) g^2, u = -lr (m1/bc1 + alpha m2) /
	 * (sqrt(nu)/sqrt(bc2) + eps). Elementwise. */
	void (*ademamix_dir)(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
			     float lr, float beta1, float beta2, float beta3, float alpha,
			     float eps, float bc1, float bc2);
	/* MARS's corrected gradient: c = g + coef (g - gprev); gprev = g. */
	void (*mars_correct)(float *c, const float *g, float *gprev, size_t n, float coef);
	/* x = beta x + (1-beta) g (SOAP's first moment) */
	void (*ema)(float *x, const float *g, size_t n, float beta);
	/* SOAP's Adam in the rotated basis: v = b2 v + (1-b2) gr^2, out = mr /
	 * (sqrt(v) + eps); out may alias mr. Elementwise. */
	void (*soap_adam)(float *out, const float *mr, const float *gr, float *v, size_t n,
			  float beta2, float eps);
	/* NorMuon, per row r of o[rows, cols]: v[r] = b2 v[r] + (1-b2) mean_c
	 * o[r,c]^2 (summed in double, in order), o[r,:] /= sqrt(v[r]) + eps. */
	void (*row_normalize)(float *o, float *v, int rows, int cols, float beta2, float eps);
	/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, row-major, op = the
	 * transpose when ta/tb; the same bits for any thread count (SOAP) */
	void (*gemm)(float *c, const float *a, const float *b, int M, int N, int K, int ta,
		     int tb, float alpha, float beta);
	/* Lion: u = -lr * sign(b1*m + (1-b1)*g); m = b2*m + (1-b2)*g */
	void (*lion_dir)(float *u, const float *g, float *m, size_t n, float lr,
			 float beta1, float beta2);
	/* Momentum: m = mu*m + g; out = nesterov ? g + mu*m : m (SGD takes
	 * u = -lr*out; Muon orthogonalises out) */
	void (*momentum)(float *out, const float *g, float *m, size_t n, float mu,
			 int nesterov);
	/* Newton-Schulz orthogonalisation of in[rows,cols] into out[rows,cols],
	 * quintic (3.4445, -4.7750, 2.0315), input normalised by its Frobenius
	 * norm + 1e-7, transposed internally when rows > cols. scratch holds
	 * newton_schulz_scratch(rows, cols) floats. */
	void (*newton_schulz)(float *out, const float *in, int rows, int cols, int steps,
			      float *scratch);
	/* newton_schulz of count matrices of one shape, in[k] into out[k], each
	 * the same bits as newton_schulz(out[k], in[k], ...) alone; batched
	 * where the backend can (CUDA: one strided-batched GEMM per product,
	 * which keeps the GPU busy where one small matrix cannot; NULL on the
	 * cpu, whose products are as wide as its cores already). scratch holds
	 * newton_schulz_many_scratch(count, rows, cols) floats. */
	void (*newton_schulz_many)(float *const *out, const float *const *in, int count,
				   int rows, int cols, int steps, float *scratch);
	/* w = w*(1 - decay) + u + lambda*(u - u_prev); then u_prev = u.
	 * u_prev NULL means lambda is ignored (no correction). */
	void (*apply_update)(float *w, const float *u, float *u_prev, size_t n,
			     float decay, float lambda);
	/* An AdamW or Lion step over count tensors, one pass over memory and
	 * (CUDA) one launch per group of tensors: per tensor, exactly
	 * adamw_dir / lion_dir into u followed by apply_update(w, u, correct ?
	 * u_prev : NULL, decay, lambda) and, with u_prev but !correct, u_prev =
	 * u. The same bits as those calls (no scratch u). */
	void (*elementwise_step)(int rule, const struct optim_elem_tensor *t, int count, float lr,
				 float beta1, float beta2, float eps, float bc1, float bc2,
				 float lambda);
	/* Sum of squares, accumulated in double in a fixed order. */
	double (*sumsq)(const float *x, size_t n);
	/* out[k] = sumsq(x[k], n[k]) for k < count, the same bits as count
	 * calls of sumsq, with one wait for the device in all (the gradient
	 * norm of a step needs every tensor's sum; out is host memory). */
	void (*sumsq_many)(double *out, const float *const *x, const size_t *n, int count);
	/* x *= s */
	void (*scale)(float *x, float s, size_t n);

	/* ---- lanes (optional; NULL on the cpu, whose ops have finished when
	 * they return, so there is one lane and nothing to order) ----
	 * A lane is one ordered queue of operations on one device (CUDA: a
	 * stream on a GPU). set_lanes declares them before the first op; by
	 * default there is one, lane 0, on the backend's device. A thread's ops
	 * go to the lane it bound last (lane 0 before it binds one). Ops on one
	 * lane run in the order they were issued, whichever thread issued them;
	 * ops on two lanes run in any order unless a fence orders them, or a
	 * synchronize (which waits for every lane). Memory belongs to the
	 * device of the lane that allocated it, and an op may touch only memory
	 * of its lane's device; copy alone may read another device's memory
	 * (once a fence orders it). sched/ places stage s on lane s (pipeline.devices). */
	int (*set_lanes)(const int *device, int n, char *why, size_t why_len); /* 1, or 0 + why */
	int (*lanes)(void);                   /* how many */
	int (*lane_device)(int lane);         /* the device index lane runs on */
	void (*lane_bind)(int lane);          /* the calling thread's ops go to lane */
	/* A fence after the ops the caller's lane was given so far; waiting on
	 * it from any lane orders that lane's later ops after them. Freed once
	 * waited on (fence_wait may be called for it more than once before). */
	void *(*fence_new)(void);
	void (*fence_wait)(void *fence);
	void (*fence_free)(void *fence);

	/* ---- timing (optional; NULL where every op has finished when it
	 * returns, so the host clock times them: the cpu) ---- */
	/* A marker of the moment the ops queued so far have run. */
	void *(*mark_new)(void);
	/* Milliseconds from marker a to b (waits for b). */
	double (*mark_ms)(void *a, void *b);
	void (*mark_free)(void *mark);
};

/* Scratch floats newton_schulz needs for a rows x cols matrix. */
size_t newton_schulz_scratch(int rows, int cols);
/* Scratch floats newton_schulz_many needs for count such matrices. */
size_t newton_schulz_many_scratch(int count, int rows, int cols);
/* n floats rounded up to a multiple of 64 (256 bytes): a slice of a scratch
 * buffer that starts at such an offset keeps the buffer's alignment, which
 * the CUDA GEMMs and Newton-Schulz need to run without staging copies. */
size_t scratch_floats_aligned(size_t n);

/* Lanes (the table's set_lanes ... fence_free) for code that runs on any
 * backend: with one lane they do nothing. */
int backend_lane_count(const struct backend *be);
/* The calling thread's ops go to lane (a no-op with one lane). Code that
 * binds lanes does it through these, never the table's lane_bind. */
void backend_lane_bind(const struct backend *be, int lane);
/* backend_lane_bind(be, lane), returning the lane bound before, for
 * binding it again when done: the main thread touching stage s's memory
 * (checkpoints, evaluation) works on lane s and then goes back. */
int backend_lane_enter(const struct backend *be, int lane);
/* The lane the calling thread bound last (0 before it bound one). */
int backend_lane_current(const struct backend *be);
/* Whether lanes a and b sit on one device (memory of one is the other's). */
int backend_same_device(const struct backend *be, int a, int b);
/* A fence after the caller's lane's ops so far, NULL with one lane. */
void *backend_fence(const struct backend *be);
/* The caller's lane waits for fence, which is then freed; NULL is nothing. */
void backend_fence_take(const struct backend *be, void *fence);

/* Bytes per activation element of be. */
static inline size_t act_size(const struct backend *be)
{
	return act_dtype_size(be->act_dtype);
}

/* Whether be has every op of the mixture-of-experts layer (the moe_*
 * slots): the cpu and cuda backends do. */
static inline int backend_has_moe(const struct backend *be)
{
	return be->moe_route && be->moe_dispatch && be->moe_gather && be->moe_combine &&
	       be->moe_combine_backward && be->moe_aux && be->moe_router_backward &&
	       be->moe_expert_forward && be->moe_expert_backward;
}

/* The CPU reference backend; always present. backend_cpu stores
 * activations in float, backend_cpu_bf16 in bf16 (the same kernels, with
 * their inputs widened and their outputs rounded: train.act_dtype = bf16). */
extern const struct backend backend_cpu;
extern const struct backend backend_cpu_bf16;
/* be, or its variant that stores activations as dtype (enum act_dtype);
 * NULL with error() when the backend has none. */
const struct backend *backend_with_act_dtype(const struct backend *be, int dtype);
/* The CUDA backend, or NULL when the binary was built without CUDA.
 * cuda_available() says whether a device can be used right now, and if not,
 * writes the reason to why (e.g. "no CUDA driver found"). */
const struct backend *backend_cuda(void);
/* Its twin that stores activations as bf16 (train.act_dtype = bf16; the same
 * kernels with widening loads and rounding stores, kernels/cuda/cuda_act.h),
 * NULL without CUDA. backend_with_act_dtype goes from one to the other. */
const struct backend *backend_cuda_bf16(void);
int cuda_available(char *why, size_t why_len);
/* Which GPU the CUDA backend uses, chosen once per process before its first
 * operation: index >= 0 is that device (an error naming the count when there
 * is none), -1 the process's local rank (LOCAL_RANK, then
 * OMPI_COMM_WORLD_LOCAL_RANK, then SLURM_LOCALID) modulo the device count, 0
 * without one. Every thread that calls the backend is bound to it. Returns 1,
 * or 0 with the reason in why (also when a different device is already in
 * use). */
int cuda_select_device(int index, char *why, size_t why_len);
/* "cuda" -> -1, "cuda:N" -> N, anything else -> -2. */
int device_index_from_name(const char *name);
/* "cpu", "cuda" or "cuda:N" -> backend; NULL with error() when it cannot be
 * served. */
const struct backend *backend_by_name(const char *name);

#endif
