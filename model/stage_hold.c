/* stage_hold.c - a stage's weight arena without the experts another
 * replica owns (model.h: stage_hold_weights; sched/comm/experts.h says
 * why the gradient arena keeps them).
 *
 * The weight arena keeps the held tensors in tensor order, back to back,
 * as the full arena has every tensor (model.c's stages tile their arena).
 * A layer's experts are consecutive tensors (experts.0.fcw ... then
 * experts.0.fcprojw ...), so holding the range [e0, e1) of every layer
 * keeps each layer's fcw and fcprojw blocks contiguous: PW(K_EXPFCW)
 * then points at expert e0's matrix. */
#include <string.h>

#include "../io/util.h"
#include "stage_layout.h"

/* The held expert range of st under mine: the first layer's decides, every
 * expert tensor must agree. 0, or -1 after error(). */
static int held_range(const struct stage *st, const unsigned char *mine, int *e0, int *e1)
{
	const struct model *m = st->m;
	int E = m->cfg.E, lo = E, hi = 0, experts = 0;
	for (int k = 0; k < st->n_params; k++) {
		int e = model_param_expert(m, &m->params[st->params[k].global]);
		experts += e >= 0;
		if (e < 0 && !mine[k])
			return error("stage %d: tensor '%s' is not an expert's; only experts' "
				     "weights may be left to another replica", st->s,
				     m->params[st->params[k].global].name);
		if (e >= 0 && mine[k]) {
			lo = MIN(lo, e);
			hi = MAX(hi, e + 1);
		}
	}
	if (lo >= hi && experts) /* (0, 0) would read as every expert (moe.h) */
		return error("stage %d: the mask holds none of its MoE layers' experts", st->s);
	if (lo >= hi) { /* a stage without MoE layers holds none */
		lo = 0;
		hi = 0;
	}
	for (int k = 0; k < st->n_params; k++) {
		int e = model_param_expert(m, &m->params[st->params[k].global]);
		if (e >= 0 && !mine[k] != (e < lo || e >= hi))
			return error("stage %d: the experts held are not the range [%d, %d) in "
				     "every layer (tensor '%s')", st->s, lo, hi,
				     m->params[st->params[k].global].name);
	}
	*e0 = lo;
	*e1 = hi;
	return 0;
}

/* The tensor whose gradient offset is o (the stage's tensors are sorted
 * by offset) */
static int tensor_at(const struct stage *st, size_t o)
{
	int a = 0, b = st->n_params - 1;
	while (a < b) {
		int c = (a + b + 1) / 2;
		if (st->params[c].offset <= o)
			a = c;
		else
			b = c - 1;
	}
	if (st->params[a].offset != o)
		bug("stage %d: no tensor at offset %zu", st->s, o);
	return a;
}

int stage_hold_weights(struct stage *st, const unsigned char *mine)
{
	const struct model *m = st->m;
	int e0 = 0, e1 = m->cfg.E;
	if (m->cfg.E && held_range(st, mine, &e0, &e1))
		return -1;
	size_t at = 0;
	for (int k = 0; k < st->n_params; k++) {
		size_t n = m->params[st->params[k].global].numel;
		st->params[k].woffset = mine[k] ? at : NONE;
		at += mine[k] ? n : 0;
	}
	st->wnumel = at;
	st->w_e0 = e0;
	st->w_e1 = e1;
	/* the tables: what off_ names by its gradient offset, at its weight
	 * offset; a layer's expert blocks from its first held expert */
	size_t n_off = (size_t)(st->layer_end - st->layer_begin) * NKIND + NGLOBAL;
	for (size_t i = 0; i < n_off; i++) {
		size_t o = st->off_[i];
		st->woff_[i] = NONE;
		if (o == NONE)
			continue;
		int k = tensor_at(st, o);
		if (i < n_off - NGLOBAL && (i % NKIND == K_EXPFCW || i % NKIND == K_EXPPROJW)) {
			if (e0 == e1)
				continue; /* no expert of the layer here */
			k += e0; /* expert 0's tensor + e0: expert e0's (consecutive) */
			if (k >= st->n_params ||
			    model_param_expert(m, &m->params[st->params[k].global]) != e0)
				bug("stage %d: expert %d's tensor is not %d after expert 0's",
				    st->s, e0, e0);
		}
		st->woff_[i] = st->params[k].woffset;
	}
	return 0;
}
