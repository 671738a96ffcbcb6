/* pass.c - the forward and backward of a stage: each block (norms,
 * attention, feed-forward or mixture of experts, residual adds), the head
 * in row chunks with its loss, and the logits at one position for
 * sampling, written against the backend table in kernels/backend.h over
 * the layout of stage_layout.h (the block's equations: model.c).
 *
 * Nothing here is global or static-mutable: stages run in separate threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "moe.h"
#include "stage_layout.h"
#include "../io/util.h"

/* ---- forward and backward of one block ---- */

static void norm_forward(const struct stage *st, void *out, float *mean, float *rstd,
			 const void *inp, const float *w, const float *b)
{
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T;

	if (c->arch == ARCH_GPT2)
		st->be->layernorm_forward(out, mean, rstd, inp, w, b, N, c->C, c->eps);
	else
		st->be->rmsnorm_forward(out, rstd, inp, w, N, c->C, c->eps);
}

/* dinp (overwritten), dw/db accumulated */
static void norm_backward(const struct stage *st, void *dinp, float *dw, float *db,
			  const void *dout, const void *inp, const float *w, const float *mean,
			  const float *rstd)
{
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T;

	if (c->arch == ARCH_GPT2)
		st->be->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, c->C);
	else
		st->be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, c->C);
}

/* res = a + b, then out = norm(res): one op where the backend fuses them
 * (the same bits), else the two. */
static void add_norm_forward(const struct stage *st, void *res, void *out, float *mean,
			     float *rstd, const void *a, const void *b, const float *w,
			     const float *bias)
{
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T;

	if (st->be->add_norm_forward) {
		st->be->add_norm_forward(res, out, mean, rstd, a, b, w, bias, N, c->C, c->eps,
					 c->arch == ARCH_GPT2);
		return;
	}
	st->be->add_act(res, a, b, (size_t)N * c->C);
	norm_forward(st, out, mean, rstd, res, w, bias);
}

/* dacc += the norm's dinp (through scratch[N,C] where the backend does not
 * fuse the two), dw/db accumulated. */
static void norm_backward_add(const struct stage *st, void *dacc, void *scratch, float *dw,
			      float *db, const void *dout, const void *inp, const float *w,
			      const float *mean, const float *rstd)
{
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T;

	if (st->be->norm_backward_add) {
		st->be->norm_backward_add(dacc, dw, db, dout, inp, w, mean, rstd, N, c->C,
					  c->arch == ARCH_GPT2);
		return;
	}
	norm_backward(st, scratch, dw, db, dout, inp, w, mean, rstd);
	st->be->add_act(dacc, dacc, scratch, (size_t)N * c->C);
}

static struct moe_params moe_params_of(const struct stage *st, const float *params, int li)
{
	return (struct moe_params){
		PW(st, params, li, K_ROUTER), PW(st, params, li, K_EXPFCW),
		PW(st, params, li, K_EXPPROJW), PW(st, params, li, K_SHFCW),
		PW(st, params, li, K_SHPROJW),
	};
}

/* The feed-forward of layer li: out[N,C] (overwritten) from a->ln2[N,C],
 * dense (fch, fca saved in a) or the mixture of experts (a->moe). */
static void ffn_forward(const struct stage *st, const float *params, int li,
			struct layer_acts *a, void *out)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T, C = c->C;

	if (c->E) {
		struct moe_dims d;
		struct moe_params w = moe_params_of(st, params, li);
		layout_moe_dims(st, &d);
		moe_forward(be, &d, &w, a->ln2, out, &a->moe);
		return;
	}
	if (c->arch == ARCH_GPT2 && be->matmul_gelu_forward) {
		be->matmul_gelu_forward(a->fca, a->fch, a->ln2, PW(st, params, li, K_FCW),
					PW(st, params, li, K_FCB), N, C, c->F);
	} else {
		be->matmul_forward(a->fch, a->ln2, PW(st, params, li, K_FCW),
				   PW(st, params, li, K_FCB), N, C, fc_rows(c));
		if (c->arch == ARCH_GPT2)
			be->gelu_forward(a->fca, a->fch, (size_t)N * c->F);
		else
			be->swiglu_forward(a->fca, a->fch, N, c->F);
	}
	be->matmul_forward(out, a->fca, PW(st, params, li, K_FCPROJW),
			   PW(st, params, li, K_FCPROJB), N, c->F, C);
}

static struct moe_grads moe_grads_of(const struct stage *st, float *grads, int li)
{
	return (struct moe_grads){
		GW(st, grads, li, K_ROUTER), GW(st, grads, li, K_EXPFCW),
		GW(st, grads, li, K_EXPPROJW), GW(st, grads, li, K_SHFCW),
		GW(st, grads, li, K_SHPROJW),
	};
}

/* Its backward: dln[N,C] (overwritten) = d(ln2) from dout[N,C] = d(out);
 * parameter gradients accumulate into grads; dloss scales the router's
 * auxiliary losses (the micro-batch's, from its forward). With grads NULL
 * (the split backward's input part) ds receives what the weight part
 * needs (d(fch), the experts'); NULL otherwise. */
static void ffn_backward(const struct stage *st, const float *params, float *grads, int li,
			 const struct layer_acts *a, const struct scratch_view *sv,
			 const struct layer_dsave *ds, const void *dout, void *dln, float dloss)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T, C = c->C;
	void *dfch = ds ? ds->dfch : sv->dfch;

	if (c->E) {
		struct moe_dims d;
		struct moe_params w = moe_params_of(st, params, li);
		struct moe_grads g = moe_grads_of(st, grads, li);
		layout_moe_dims(st, &d);
		moe_backward(be, &d, &w, grads ? &g : NULL, a->ln2, dout, dln, &a->moe, &sv->moe,
			     ds ? &ds->moe : NULL, dloss);
		return;
	}
	if (c->arch == ARCH_GPT2 && be->matmul_backward_dgelu) {
		be->matmul_backward_dgelu(dfch, GW(st, grads, li, K_FCPROJW),
					  GW(st, grads, li, K_FCPROJB), dout, a->fca,
					  PW(st, params, li, K_FCPROJW), a->fch, N, c->F, C);
	} else {
		be->matmul_backward(sv->dfca, GW(st, grads, li, K_FCPROJW),
				    GW(st, grads, li, K_FCPROJB), dout, a->fca,
				    PW(st, params, li, K_FCPROJW), N, c->F, C);
		if (c->arch == ARCH_GPT2)
			be->gelu_backward(dfch, a->fch, sv->dfca, (size_t)N * c->F);
		else
			be->swiglu_backward(dfch, sv->dfca, a->fch, N, c->F);
	}
	be->matmul_backward(dln, GW(st, grads, li, K_FCW), GW(st, grads, li, K_FCB), dfch, a->ln2,
			    PW(st, params, li, K_FCW), N, C, fc_rows(c));
}

/* x[N,C] -> a->res3[N,C], saving everything in a. With a backend that
 * fuses the residual add into the norm (add_norm_forward) a layer may
 * leave its last add to the next one: defer leaves res3 holding only the
 * feed-forward's output, and the next layer, given that layer's res2 as
 * x_res2, makes x = x_res2 + x in place as its first norm reads it (the
 * same bits as the add apart). */
static void block_forward(const struct stage *st, const float *params, int li, const void *x,
			  const void *x_res2, int defer, struct layer_acts *a)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int B = st->B, T = st->T, N = B * T, C = c->C, QKV = qkv_width(c);
	size_t NC = (size_t)N * C;
	void *tmp = a->res3; /* projection outputs land here before the residual add */

	if (x_res2)
		add_norm_forward(st, (void *)x, a->ln1, a->ln1_mean, a->ln1_rstd, x_res2, x,
				 PW(st, params, li, K_LN1W), PW(st, params, li, K_LN1B));
	else
		norm_forward(st, a->ln1, a->ln1_mean, a->ln1_rstd, x, PW(st, params, li, K_LN1W),
			     PW(st, params, li, K_LN1B));
	be->matmul_forward(a->qkv, a->ln1, PW(st, params, li, K_QKVW), PW(st, params, li, K_QKVB),
			   N, C, QKV);
	if (c->arch == ARCH_LLAMA)
		be->rope_forward(a->qkv, B, T, c->NH, c->NKV, c->HD, c->rope_theta);
	be->attention_forward(a->atty, a->lse, a->qkv, B, T, c->NH, c->NKV, c->HD);
	be->matmul_forward(tmp, a->atty, PW(st, params, li, K_ATTPROJW),
			   PW(st, params, li, K_ATTPROJB), N, C, C);
	add_norm_forward(st, a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, x, tmp,
			 PW(st, params, li, K_LN2W), PW(st, params, li, K_LN2B));
	ffn_forward(st, params, li, a, tmp);
	if (!defer)
		be->add_act(a->res3, a->res2, tmp, NC);
}

/* dres[N,C]: on entry d(res3), on return d(x). Parameter gradients
 * accumulate into grads. With grads NULL and ds (the split backward's
 * input part) no parameter gradient is made: the gradient at the output
 * of each product and norm with weights goes to ds instead of the scratch
 * (the same ops, the same bits), for block_weight. */
static void block_backward(const struct stage *st, const float *params, float *grads, int li,
			   const void *x, const struct layer_acts *a, const struct scratch_view *sv,
			   const struct layer_dsave *ds, float dloss)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int B = st->B, T = st->T, N = B * T, C = c->C, QKV = qkv_width(c);
	size_t NCb = (size_t)N * C * act_size(be);
	void *dres = sv->dres;
	void *dln2 = ds ? ds->dln2 : sv->dln, *dln1 = ds ? ds->dln1 : sv->dln;
	void *dqkv = ds ? ds->dqkv : sv->dqkv;

	/* res3 = res2 + ffn(ln2) */
	if (ds && ds->dres3)
		be->copy(ds->dres3, dres, NCb);
	ffn_backward(st, params, grads, li, a, sv, ds, dres, dln2, dloss);
	norm_backward_add(st, dres, sv->dbuf, GW(st, grads, li, K_LN2W), GW(st, grads, li, K_LN2B),
			  dln2, a->res2, PW(st, params, li, K_LN2W), a->ln2_mean,
			  a->ln2_rstd); /* now d(res2) */

	/* res2 = x + atty @ attprojw^T + attprojb */
	if (ds)
		be->copy(ds->dres2, dres, NCb);
	be->matmul_backward(sv->datty, GW(st, grads, li, K_ATTPROJW),
			    GW(st, grads, li, K_ATTPROJB), dres, a->atty,
			    PW(st, params, li, K_ATTPROJW), N, C, C);
	be->attention_backward(dqkv, sv->datty, a->qkv, a->atty, a->lse, B, T, c->NH, c->NKV,
			       c->HD);
	if (c->arch == ARCH_LLAMA)
		be->rope_backward(dqkv, B, T, c->NH, c->NKV, c->HD, c->rope_theta);
	be->matmul_backward(dln1, GW(st, grads, li, K_QKVW), GW(st, grads, li, K_QKVB), dqkv,
			    a->ln1, PW(st, params, li, K_QKVW), N, C, QKV);
	norm_backward_add(st, dres, sv->dbuf, GW(st, grads, li, K_LN1W), GW(st, grads, li, K_LN1B),
			  dln1, x, PW(st, params, li, K_LN1W), a->ln1_mean,
			  a->ln1_rstd); /* now d(x) */
}

/* A norm's dw/db alone (no dinp, so no weight read), accumulated as
 * norm_backward and norm_backward_add accumulate them. */
static void norm_weight(const struct stage *st, float *dw, float *db, const void *dout,
			const void *inp, const float *mean, const float *rstd)
{
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T;

	if (c->arch == ARCH_GPT2)
		st->be->layernorm_backward(NULL, dw, db, dout, inp, NULL, mean, rstd, N, c->C);
	else
		st->be->rmsnorm_backward(NULL, dw, dout, inp, NULL, rstd, N, c->C);
}

/* The split backward's weight part of layer li: each tensor gets the one
 * contribution block_backward gives it, from the gradients ds kept. */
static void block_weight(const struct stage *st, float *grads, int li, const void *x,
			 const struct layer_acts *a, const struct layer_dsave *ds)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T, C = c->C;

	if (c->E) {
		struct moe_dims d;
		struct moe_grads g = moe_grads_of(st, grads, li);
		layout_moe_dims(st, &d);
		moe_backward_weight(be, &d, &g, a->ln2, ds->dres3, &a->moe, &ds->moe);
	} else {
		be->matmul_backward(NULL, GW(st, grads, li, K_FCPROJW),
				    GW(st, grads, li, K_FCPROJB), ds->dres3, a->fca, NULL, N, c->F,
				    C);
		be->matmul_backward(NULL, GW(st, grads, li, K_FCW), GW(st, grads, li, K_FCB),
				    ds->dfch, a->ln2, NULL, N, C, fc_rows(c));
	}
	norm_weight(st, GW(st, grads, li, K_LN2W), GW(st, grads, li, K_LN2B), ds->dln2, a->res2,
		    a->ln2_mean, a->ln2_rstd);
	be->matmul_backward(NULL, GW(st, grads, li, K_ATTPROJW), GW(st, grads, li, K_ATTPROJB),
			    ds->dres2, a->atty, NULL, N, C, C);
	be->matmul_backward(NULL, GW(st, grads, li, K_QKVW), GW(st, grads, li, K_QKVB), ds->dqkv,
			    a->ln1, NULL, N, C, qkv_width(c));
	norm_weight(st, GW(st, grads, li, K_LN1W), GW(st, grads, li, K_LN1B), ds->dln1, x,
		    a->ln1_mean, a->ln1_rstd);
}

/* Forward through the embeddings (stage 0) and the stage's layers; returns
 * the last layer's output (inside the slot). */
static const void *body_forward(struct stage *st, const struct slot_view *v,
				const float *params, const int32_t *tokens, const void *x_in)
{
	const struct model_config *c = &st->m->cfg;
	size_t N = (size_t)st->B * st->T;
	int nl = st->layer_end - st->layer_begin;
	const void *x;

	if (st->has_embed) {
		st->be->copy(v->tokens, tokens, N * sizeof(int32_t));
		st->be->embed_forward(v->x0, tokens, PG(st, params, G_WTE), PG(st, params, G_WPE),
				      st->B, st->T, c->C);
	} else {
		st->be->copy(v->x0, x_in, N * c->C * act_size(st->be));
	}
	x = v->x0;
	const void *x_res2 = NULL; /* the last layer's res2, when it left its add */
	for (int li = 0; li < nl; li++) {
		struct layer_acts a;
		layout_layer(st, v, li, &a);
		/* every layer but the stage's last leaves its add to the next */
		int defer = st->be->add_norm_forward && li + 1 < nl;
		block_forward(st, params, li, x, x_res2, defer, &a);
		x = a.res3;
		x_res2 = defer ? a.res2 : NULL;
	}
	return x;
}

int stage_moe_stats(const struct stage *st, int slot, double *out)
{
	const struct model_config *c = &st->m->cfg;
	int nl = st->layer_end - st->layer_begin;
	struct slot_view v;

	if (!c->E)
		return 0;
	for (int i = 0; i < 2 + c->E; i++)
		out[i] = 0.0;
	int32_t count[c->E + 1];
	float aux[2 * (nl ? nl : 1)];

	/* activation memory is the backend's (a GPU's): the layers' aux pairs
	 * gathered on the device and read in one copy (each copy waits for
	 * the stream); the counts from the slot's host copy of the forward */
	layout_slot(st, st->slot_acts[slot], &v);
	for (int li = 0; li < nl; li++) {
		struct layer_acts a;
		layout_layer(st, &v, li, &a);
		st->be->copy(st->moe_aux_dev_ + 2 * li, a.moe.aux, 2 * sizeof(float));
	}
	if (nl)
		st->be->to_host(aux, st->moe_aux_dev_, sizeof(float) * 2 * (size_t)nl);
	for (int li = 0; li < nl; li++) {
		struct layer_acts a;
		layout_layer(st, &v, li, &a);
		if (a.moe.count_host)
			memcpy(count, a.moe.count_host, sizeof(count));
		else
			st->be->to_host(count, a.moe.count, sizeof(count));
		out[0] += aux[2 * li];
		out[1] += aux[2 * li + 1];
		for (int e = 0; e < c->E; e++)
			out[2 + e] += count[e + 1] - count[e];
	}
	return c->E;
}

double stage_aux_loss(const struct stage *st, int slot)
{
	const struct model_config *c = &st->m->cfg;
	int nl = st->layer_end - st->layer_begin;
	struct slot_view v;
	double sum = 0;

	if (!c->E)
		return 0.0;
	layout_slot(st, st->slot_acts[slot], &v);
	for (int li = 0; li < nl; li++) {
		struct layer_acts a;
		float aux[2];
		layout_layer(st, &v, li, &a);
		st->be->to_host(aux, a.moe.aux, sizeof(aux)); /* the backend's memory */
		sum += (double)c->aux_coef * aux[0] + (double)c->z_coef * aux[1];
	}
	return sum;
}

/* Before every pass over the weights: the backend's operand copy of them
 * (backend.h, weights_bf16), made from params as they are now. Each pass
 * asks again, so no product ever reads a copy older than its weights,
 * whatever the schedule did to them between passes. */
static void weights_prepare(const struct stage *st, const float *params)
{
	if (st->be->weights_bf16)
		st->be->weights_bf16(params, st->wnumel);
}

/* The input of layer li of the slot v: the layer before's output, or x0. */
static const void *layer_input(const struct stage *st, const struct slot_view *v, int li)
{
	struct layer_acts prev;
	if (li == 0)
		return v->x0;
	layout_layer(st, v, li - 1, &prev);
	return prev.res3;
}

/* The slot's split region: after its activations (stage_split_init). */
static void split_of(const struct stage *st, int slot, struct split_view *w)
{
	if (!st->split)
		bug("stage %d's split backward before stage_split_init", st->s);
	layout_split(st, (char *)st->slot_acts[slot] +
				 (st->act_bytes_per_slot - st->split_bytes_per_slot), w);
}

/* The head over the rows of v.lnf in chunks of head_rows rows: logits,
 * losses[N] and, when dlnf or dhead is wanted, the logits' gradient (in
 * place), then dlnf's rows (act [N,C], overwritten) and the head's
 * gradient (dhead [Vp,C], accumulated chunk after chunk, in row order),
 * each skipped when NULL. So the chunk's logits can be reused, and the
 * split backward's W can run the chunks again for dhead alone with the
 * forward's bits. */
static void head_chunks(const struct stage *st, const struct slot_view *v,
			const struct scratch_view *sv, const float *params, const int32_t *targets,
			float dloss, void *dlnf, float *dhead)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T, C = c->C;
	size_t A = act_size(be);

	for (int r0 = 0; r0 < N; r0 += st->head_rows) {
		int K = MIN(st->head_rows, N - r0);
		const void *lnf = act_at(v->lnf, (size_t)r0 * C, A);
		be->matmul_forward(sv->logits, lnf, PG(st, params, G_HEAD), NULL, K, C, c->Vp);
		be->softmax_xent(sv->losses + r0, dlnf || dhead ? sv->logits : NULL, sv->logits,
				 targets + r0, K, c->V, c->Vp, dloss / (float)N);
		if (dlnf || dhead)
			be->matmul_backward(dlnf ? act_at(dlnf, (size_t)r0 * C, A) : NULL, dhead,
					    NULL, sv->logits, lnf, PG(st, params, G_HEAD), K, C,
					    c->Vp);
	}
}

/* Where the head's gradient accumulates: the tied head's own buffer
 * (S = 1), else the head (or tied copy) in grads. */
static float *head_grad(const struct stage *st, float *grads)
{
	return st->tied_head_grad ? st->tied_head_grad : GG(st, grads, G_HEAD);
}

void stage_forward(struct stage *st, int slot, const float *params, const int32_t *tokens,
		   const void *x_in, const int32_t *targets, void *x_out, float *loss,
		   float *loss_dev, float *grads, float dloss)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int N = st->B * st->T, C = c->C;
	struct slot_view v;
	struct scratch_view sv;
	const void *x;

	weights_prepare(st, params);
	layout_slot(st, st->slot_acts[slot], &v);
	layout_scratch(st, st->scratch, &sv);
	x = body_forward(st, &v, params, tokens, x_in);
	st->slot_dloss_[slot] = dloss;
	if (!st->has_head) {
		be->copy(x_out, x, (size_t)N * C * act_size(be));
		return;
	}
	norm_forward(st, v.lnf, v.lnf_mean, v.lnf_rstd, x, PG(st, params, G_LNFW),
		     PG(st, params, G_LNFB));
	if (!targets) /* nothing reads logits without targets (model_logits_at has its own) */
		return;
	/* with the head's gradient left to the split backward's W (SPLIT_HEAD),
	 * d(lnf) and the targets stay in the slot for it */
	struct split_view w;
	int defer = grads && st->split_head;
	if (defer) {
		split_of(st, slot, &w);
		be->copy(w.targets, targets, (size_t)N * sizeof(int32_t));
	}
	void *dlnf = !grads ? NULL : defer ? w.dlnf : sv.dlnf;
	head_chunks(st, &v, &sv, params, targets, dloss, dlnf,
		    grads && !defer ? head_grad(st, grads) : NULL);
	/* one reduction for both, so a loss read at once and one read later
	 * have the same bits on every backend */
	if (loss_dev)
		be->loss_mean(loss_dev, sv.losses, N);
	if (loss) {
		if (loss_dev)
			be->copy(st->loss_dev_, loss_dev, sizeof(float));
		else
			be->loss_mean(st->loss_dev_, sv.losses, N);
		be->to_host(loss, st->loss_dev_, sizeof(float));
	}
	if (!grads)
		return;
	/* Back through the final norm; d(x) stays in the slot. */
	norm_backward(st, v.dx, defer ? NULL : GG(st, grads, G_LNFW),
		      defer ? NULL : GG(st, grads, G_LNFB), dlnf, x, PG(st, params, G_LNFW),
		      v.lnf_mean, v.lnf_rstd);
}

void stage_backward(struct stage *st, int slot, const float *params, float *grads,
		    const void *dx_out, void *dx_in)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	size_t NCb = (size_t)st->B * st->T * c->C * act_size(be);
	int nl = st->layer_end - st->layer_begin;
	struct slot_view v;
	struct scratch_view sv;

	weights_prepare(st, params);
	layout_slot(st, st->slot_acts[slot], &v);
	layout_scratch(st, st->scratch, &sv);
	be->copy(sv.dres, st->has_head ? v.dx : dx_out, NCb);
	layout_grads_done(st, GRADS_AT_START);
	for (int li = nl - 1; li >= 0; li--) {
		struct layer_acts a;
		layout_layer(st, &v, li, &a);
		block_backward(st, params, grads, li, layer_input(st, &v, li), &a, &sv, NULL,
			       st->slot_dloss_[slot]);
		layout_grads_done(st, li);
	}
	if (st->has_embed)
		be->embed_backward(GG(st, grads, G_WTE), GG(st, grads, G_WPE), sv.dres, v.tokens,
				   st->B, st->T, c->C);
	else if (dx_in)
		be->copy(dx_in, sv.dres, NCb);
	layout_grads_done(st, GRADS_AT_END);
}

void stage_backward_input(struct stage *st, int slot, const float *params, const void *dx_out,
			  void *dx_in)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	size_t NCb = (size_t)st->B * st->T * c->C * act_size(be);
	int nl = st->layer_end - st->layer_begin;
	struct slot_view v;
	struct scratch_view sv;
	struct split_view w;

	weights_prepare(st, params);
	layout_slot(st, st->slot_acts[slot], &v);
	layout_scratch(st, st->scratch, &sv);
	split_of(st, slot, &w);
	be->copy(sv.dres, st->has_head ? v.dx : dx_out, NCb);
	for (int li = nl - 1; li >= 0; li--) {
		struct layer_acts a;
		struct layer_dsave ds;
		layout_layer(st, &v, li, &a);
		layout_layer_dsave(st, &w, li, &ds);
		block_backward(st, params, NULL, li, layer_input(st, &v, li), &a, &sv, &ds,
			       st->slot_dloss_[slot]);
	}
	if (st->has_embed)
		be->copy(w.dx0, sv.dres, NCb);
	else if (dx_in)
		be->copy(dx_in, sv.dres, NCb);
}

void stage_backward_weight(struct stage *st, int slot, const float *params, float *grads)
{
	const struct backend *be = st->be;
	const struct model_config *c = &st->m->cfg;
	int nl = st->layer_end - st->layer_begin;
	struct slot_view v;
	struct split_view w;

	layout_slot(st, st->slot_acts[slot], &v);
	split_of(st, slot, &w);
	if (st->split_head) {
		/* the forward's head chunks again, for the head's gradient alone;
		 * then the final norm's from d(lnf) kept (the forward's order) */
		struct scratch_view sv;
		weights_prepare(st, params);
		layout_scratch(st, st->scratch, &sv);
		head_chunks(st, &v, &sv, params, w.targets, st->slot_dloss_[slot], NULL,
			    head_grad(st, grads));
		norm_weight(st, GG(st, grads, G_LNFW), GG(st, grads, G_LNFB), w.dlnf,
			    layer_input(st, &v, nl), v.lnf_mean, v.lnf_rstd);
	}
	layout_grads_done(st, GRADS_AT_START);
	for (int li = nl - 1; li >= 0; li--) {
		struct layer_acts a;
		struct layer_dsave ds;
		layout_layer(st, &v, li, &a);
		layout_layer_dsave(st, &w, li, &ds);
		block_weight(st, grads, li, layer_input(st, &v, li), &a, &ds);
		layout_grads_done(st, li);
	}
	if (st->has_embed)
		be->embed_backward(GG(st, grads, G_WTE), GG(st, grads, G_WPE), w.dx0, v.tokens,
				   st->B, st->T, c->C);
	layout_grads_done(st, GRADS_AT_END);
}

void model_logits_at(struct stage *st, const float *params, const int32_t *tokens, int pos,
		     float *logits)
{
	const struct model_config *c = &st->m->cfg;
	size_t A = act_size(st->be);
	struct slot_view v;
	struct scratch_view sv;
	const void *x;

	weights_prepare(st, params);
	layout_slot(st, st->slot_acts[0], &v);
	layout_scratch(st, st->scratch, &sv);
	x = body_forward(st, &v, params, tokens, NULL);
	norm_forward(st, v.lnf, v.lnf_mean, v.lnf_rstd, x, PG(st, params, G_LNFW),
		     PG(st, params, G_LNFB));
	for (int b = 0; b < st->B; b++)
		st->be->matmul_forward(act_at(sv.logits, (size_t)b * c->Vp, A),
				       act_at(v.lnf, ((size_t)b * st->T + pos) * c->C, A),
				       PG(st, params, G_HEAD), NULL, 1, c->C, c->Vp);
	st->be->act_to_f32(logits, sv.logits, (size_t)st->B * c->Vp);
}
