/* stage_layout.h - inside model/: how a stage lays out its parameters
 * (offsets of each layer's tensors and the whole-model ones) and its
 * activation slots and scratch, shared by model.c (which sizes and builds
 * stages) and pass.c (the forward and backward over them). Not a public
 * header: the rest of asyncpp sees struct stage through model.h. */
#ifndef ASYNCPP_MODEL_STAGE_LAYOUT_H
#define ASYNCPP_MODEL_STAGE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "moe.h"

/* Per-layer tensor kinds, in table order. */
enum {
	K_LN1W, K_LN1B, K_QKVW, K_QKVB, K_ATTPROJW, K_ATTPROJB,
	K_LN2W, K_LN2B, K_FCW, K_FCB, K_FCPROJW, K_FCPROJB,
	/* mixture of experts: K_EXPFCW/K_EXPPROJW are expert 0's tensors, the
	 * others follow them in the arena */
	K_ROUTER, K_EXPFCW, K_EXPPROJW, K_SHFCW, K_SHPROJW, NKIND
};
/* Whole-model tensors, stored after the layers in stage->off_. */
enum { G_WTE, G_WPE, G_LNFW, G_LNFB, G_HEAD, NGLOBAL };

#define NONE ((size_t)-1)

static inline int qkv_width(const struct model_config *c)
{
	return (c->NH + 2 * c->NKV) * c->HD;
}

static inline int fc_rows(const struct model_config *c)
{
	return c->arch == ARCH_GPT2 ? c->F : 2 * c->F;
}

/* stage->off_ layout: [nl * NKIND layer offsets][NGLOBAL] */
static inline size_t *goff(const struct stage *st)
{
	return st->off_ + (size_t)(st->layer_end - st->layer_begin) * NKIND;
}

/* Weights through woff_ (stage_hold_weights' arena), gradients through off_ */
static inline const float *PW(const struct stage *st, const float *params, int li, int k)
{
	size_t o = st->woff_[(size_t)li * NKIND + k];
	return o == NONE ? NULL : params + o;
}

/* NULL grads (the split backward's input part) gives NULL: no gradient */
static inline float *GW(const struct stage *st, float *grads, int li, int k)
{
	size_t o = st->off_[(size_t)li * NKIND + k];
	return o == NONE || !grads ? NULL : grads + o;
}

static inline const float *PG(const struct stage *st, const float *params, int g)
{
	size_t o = st->woff_[(size_t)(st->layer_end - st->layer_begin) * NKIND + g];
	return o == NONE ? NULL : params + o;
}

static inline float *GG(const struct stage *st, float *grads, int g)
{
	size_t o = goff(st)[g];
	return o == NONE || !grads ? NULL : grads + o;
}

/* Views into one slot; each piece padded to 64 bytes. Activations (void *)
 * have the backend's act_dtype, statistics are float. */
struct layer_acts {
	void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fca, *res3;
	float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
	struct moe_acts moe; /* mixture of experts (fch, fca unused) */
};
struct slot_view {
	int32_t *tokens;
	void *x0;
	void *layers;           /* start of layer 0 */
	size_t layer_stride;    /* bytes per layer */
	void *lnf, *dx;
	float *lnf_mean, *lnf_rstd;
	int32_t *moe_counts;    /* host: the slot's per-layer expert counts
				 * ([nl][E+1], stage.moe_counts_), or NULL */
	size_t total;           /* bytes */
};

/* Scratch: activation gradients, logits of head_rows rows (act_dtype);
 * losses (float). Shared by every slot. */
struct scratch_view {
	void *dres, *dbuf, *dln, *dqkv, *datty, *dfch, *dfca;
	void *logits, *dlnf;
	float *losses;
	struct moe_scratch moe;
	size_t total;           /* bytes */
};

/* What the split backward's input part (B) keeps in a slot for its weight
 * part (W), after the slot's activations: per layer the gradient at the
 * output of each product and norm whose weights it updates (the activation
 * the product read is in the slot already), and on stage 0 d(x0) for the
 * embeddings. All act_dtype. */
struct layer_dsave {
	void *dres3;  /* [N,C] d(res3): fcprojw's dout (MoE: the shared expert's; NULL without) */
	void *dfch;   /* [N,fc_rows] fcw's dout (NULL for MoE) */
	void *dln2;   /* [N,C] ln2's dout */
	void *dres2;  /* [N,C] d(res2): attprojw's dout */
	void *dqkv;   /* [N,QKV] qkvw's dout (after the rotary backward) */
	void *dln1;   /* [N,C] ln1's dout */
	struct moe_dsave moe; /* mixture of experts */
};
struct split_view {
	void *layers;           /* layer 0's, then each layer's */
	size_t layer_stride;    /* bytes per layer */
	void *dx0;              /* [N,C] stage 0: the embeddings' dout */
	int32_t *targets;       /* [N] SPLIT_HEAD: the forward's targets */
	void *dlnf;             /* [N,C] SPLIT_HEAD: the final norm's dout */
	size_t total;           /* bytes */
};
/* Split views over base (NULL: sizing only). */
void layout_split(const struct stage *st, void *base, struct split_view *v);
void layout_layer_dsave(const struct stage *st, const struct split_view *v, int li,
			struct layer_dsave *d);

/* When stage_backward has finished a gradient run (model.c, grad_runs):
 * at its start, at its end, or after layer li (>= 0) of the stage. */
enum { GRADS_AT_START = -2, GRADS_AT_END = -1 };

/* The moe.h dimensions of the stage's micro-batch. */
void layout_moe_dims(const struct stage *st, struct moe_dims *d);
/* Slot views over base (NULL: sizing only, v->total set). */
void layout_slot(const struct stage *st, void *base, struct slot_view *v);
/* Layer li's saved activations in the slot v. */
void layout_layer(const struct stage *st, const struct slot_view *v, int li,
		  struct layer_acts *a);
/* Scratch views over base (NULL: sizing only). */
void layout_scratch(const struct stage *st, void *base, struct scratch_view *v);
/* Rows of logits the head holds at a time. */
int layout_head_rows(const struct stage *st);
/* Report the gradient runs done at `when` (GRADS_AT_*, or a layer). */
void layout_grads_done(const struct stage *st, int when);

#endif
