/* moe.c - the mixture-of-experts feed-forward of moe.h: routing, dispatch,
 * experts, combine, auxiliary losses, and their backward, as calls of the
 * backend's ops (the routing and dispatch ones: backend.h, moe_*). */
#include "moe.h"
#include "../io/util.h"

/* ---- buffer layout ---- */

/* n elements of esz bytes, padded to 64 bytes, from *pos (bytes) */
static void *take(void *base, size_t *pos, size_t n, size_t esz)
{
	void *p = base ? (char *)base + *pos : NULL;
	*pos += (n * esz + 63) & ~(size_t)63;
	return p;
}

#define TAKE_ACT(n) take(base, &pos, n, act_dtype_size(d->act_dtype))
#define TAKE_F32(n) ((float *)take(base, &pos, n, sizeof(float)))
#define TAKE_I32(n) ((int32_t *)take(base, &pos, n, sizeof(int32_t)))

size_t moe_acts_view(const struct moe_dims *d, void *base, struct moe_acts *a)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, E = d->E, pos = 0;

	a->z = TAKE_ACT(N * E);
	a->score = TAKE_F32(N * E);
	a->sel = TAKE_I32(N * d->K);
	a->gate = TAKE_F32(N * d->K);
	a->pos = TAKE_I32(N * d->K);
	a->count = TAKE_I32(E + 1);
	a->xd = TAKE_ACT(NK * C);
	a->h = TAKE_ACT(NK * 2 * De);
	a->act = TAKE_ACT(NK * De);
	a->y = TAKE_ACT(NK * C);
	a->sh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	a->sh_act = d->shared ? TAKE_ACT(N * De) : NULL;
	a->aux = TAKE_F32(2);
	a->count_host = NULL; /* the stage's slots have one (model.c: layout_layer) */
	return pos;
}

size_t moe_scratch_view(const struct moe_dims *d, void *base, struct moe_scratch *s)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, pos = 0;

	/* dy doubles as an [N,C] temporary once the experts' backward is done */
	s->dy = TAKE_ACT(NK * C);
	s->dact = TAKE_ACT(NK * De);
	s->dh = TAKE_ACT(NK * 2 * De);
	s->dxd = TAKE_ACT(NK * C);
	s->dz = TAKE_ACT(N * d->E);
	s->dgate = TAKE_F32(N * d->K);
	s->dsh_act = d->shared ? TAKE_ACT(N * De) : NULL;
	s->dsh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	s->tmp = s->dy;
	return pos;
}

size_t moe_dsave_view(const struct moe_dims *d, void *base, struct moe_dsave *s)
{
	size_t N = (size_t)d->N, NK = N * d->K, C = d->C, De = d->De, pos = 0;

	s->dy = TAKE_ACT(NK * C);
	s->dh = TAKE_ACT(NK * 2 * De);
	s->dz = TAKE_ACT(N * d->E);
	s->dsh_h = d->shared ? TAKE_ACT(N * 2 * De) : NULL;
	return pos;
}

/* ---- the layer: the order of calls is the maths of moe.h ---- */

/* Expert e's rows in the dispatched buffers are [count[e], count[e+1]); the
 * experts' products need them as GEMM shapes on the host. The forward
 * copies them back (E+1 integers; on a GPU it waits for the routing to
 * finish: the backend's GEMMs take host shapes) into the slot's host copy
 * (moe_acts.count_host), which the backward and the weight part of the same
 * slot read again without a copy; a view without one copies every pass. */
static const int32_t *pass_counts(const struct backend *be, const struct moe_dims *d,
				  const struct moe_acts *a, int forward, int32_t *count)
{
	size_t bytes = sizeof(int32_t) * (size_t)(d->E + 1);
	if (!a->count_host) {
		be->to_host(count, a->count, bytes);
		return count;
	}
	if (forward)
		be->to_host(a->count_host, a->count, bytes);
	return a->count_host;
}

void moe_experts(const struct backend *be, int pass, const struct moe_rows *rows,
		 const float *fcw, const float *fcprojw, int e0, int e1)
{
	const struct moe_dims *d = rows->d;
	int E = e1 - e0, C = d->C, De = d->De;
	if (E <= 0)
		return;
	size_t A = act_dtype_size(d->act_dtype), r0 = (size_t)rows->count[e0];
	/* the range's rows from its first one: counts and buffers rebased, so
	 * the backend sees a whole layer of E experts */
	int32_t count[E + 1];
	for (int e = 0; e <= E; e++)
		count[e] = rows->count[e0 + e] - rows->count[e0];
	int n = count[E];
	void *xd = act_at(rows->xd, r0 * C, A), *h = act_at(rows->h, r0 * 2 * De, A);
	void *act = act_at(rows->act, r0 * De, A), *y = act_at(rows->y, r0 * C, A);
	const float *w1 = fcw, *w2 = fcprojw; /* expert e0's: moe.h */
	float *g1 = rows->gfcw ? rows->gfcw + (size_t)e0 * 2 * De * C : NULL;
	float *g2 = rows->gfcprojw ? rows->gfcprojw + (size_t)e0 * C * De : NULL;
	/* every expert's product in one call, SwiGLU over all the rows at once
	 * (row by row, so the bits of per-expert calls); each expert's rows and
	 * gradient slices are its own, so the order across experts changes no
	 * bit */
	if (pass == MOE_PASS_FORWARD) {
		be->moe_expert_forward(h, xd, w1, count, E, C, 2 * De);
		if (n)
			be->swiglu_forward(act, h, n, De);
		be->moe_expert_forward(y, act, w2, count, E, De, C);
	} else if (pass == MOE_PASS_BACKWARD) {
		void *dact = act_at(rows->dact, r0 * De, A), *dh = act_at(rows->dh, r0 * 2 * De, A);
		be->moe_expert_backward(dact, g2, act_at(rows->dy, r0 * C, A), act, w2, count, E, De,
					C);
		if (n)
			be->swiglu_backward(dh, dact, h, n, De);
		be->moe_expert_backward(act_at(rows->dxd, r0 * C, A), g1, dh, xd, w1, count, E, C,
					2 * De);
	} else { /* the weight part: no weight is read (dinp NULL) */
		be->moe_expert_backward(NULL, g2, act_at(rows->dy, r0 * C, A), act, NULL, count, E,
					De, C);
		be->moe_expert_backward(NULL, g1, act_at(rows->dh, r0 * 2 * De, A), xd, NULL, count,
					E, C, 2 * De);
	}
}

/* The experts whose weights a pass holds: moe_dims' [w_e0, w_e1), where
 * (0, 0) is every one */
static int held_end(const struct moe_dims *d)
{
	return d->w_e1 ? d->w_e1 : d->E;
}

const float *moe_expert_weights(const struct moe_dims *d, const float *w, int proj, int e)
{
	if (e < d->w_e0 || e > held_end(d))
		bug("expert %d's weights asked of a pass holding experts [%d, %d)", e, d->w_e0,
		    held_end(d));
	/* e == the end is an empty range's start (never read) */
	size_t per = (size_t)(proj ? 1 : 2) * d->De * d->C; /* [2De,C] or [C,De] */
	return w ? w + (size_t)(e - d->w_e0) * per : NULL;
}

/* Every expert's products of a pass: here, or by their owners (moe.h) */
static void run_experts(const struct backend *be, int pass, const struct moe_rows *rows,
			const struct moe_params *w)
{
	const float *fcw = w ? w->fcw : NULL, *fcprojw = w ? w->fcprojw : NULL;
	if (rows->d->ep)
		rows->d->ep->experts(rows->d->ep, pass, rows, fcw, fcprojw);
	else if (rows->d->w_e0 != 0 || held_end(rows->d) != rows->d->E)
		bug("a pass without expert parallelism's hook on weights of experts [%d, %d) of %d",
		    rows->d->w_e0, held_end(rows->d), rows->d->E);
	else
		moe_experts(be, pass, rows, fcw, fcprojw, 0, rows->d->E);
}

void moe_forward(const struct backend *be, const struct moe_dims *d, const struct moe_params *w,
		 const void *x, void *out, struct moe_acts *a)
{
	int N = d->N, C = d->C, E = d->E, K = d->K, De = d->De;
	size_t A = act_dtype_size(d->act_dtype);
	int32_t count[E + 1];

	be->matmul_forward(a->z, x, w->router, NULL, N, C, E);
	be->moe_route(a->score, a->sel, a->gate, a->z, N, E, K, d->router);
	/* dispatch: expert e's rows in ascending token order */
	be->moe_dispatch(a->count, a->pos, a->sel, N, K, E);
	be->moe_gather(a->xd, x, a->pos, N, K, C);
	struct moe_rows rows = {.d = d, .count = pass_counts(be, d, a, 1, count), .xd = a->xd,
				.h = a->h, .act = a->act, .y = a->y};
	run_experts(be, MOE_PASS_FORWARD, &rows, w);

	/* combine: out = shared(x) + sum_j gate_j y_j, j in order */
	if (d->shared) {
		be->matmul_forward(a->sh_h, x, w->sh_fcw, NULL, N, C, 2 * De);
		be->swiglu_forward(a->sh_act, a->sh_h, N, De);
		be->matmul_forward(out, a->sh_act, w->sh_fcprojw, NULL, N, De, C);
	} else {
		be->zero(out, A * (size_t)N * C);
	}
	be->moe_combine(out, a->y, a->gate, a->pos, N, K, C);
	be->moe_aux(a->aux, a->z, a->score, a->count, N, E, K, d->router);
}

/* ---- backward ---- */

void moe_backward(const struct backend *be, const struct moe_dims *d,
		  const struct moe_params *w, const struct moe_grads *g, const void *x,
		  const void *dout, void *dx, const struct moe_acts *a,
		  const struct moe_scratch *scr, const struct moe_dsave *keep, float dloss)
{
	int N = d->N, C = d->C, E = d->E, K = d->K, De = d->De;
	int32_t count[E + 1];
	/* the products' output gradients go where the weight part finds them */
	struct moe_scratch sk = *scr;
	const struct moe_scratch *s = &sk;
	static const struct moe_grads none;
	void *tmp = scr->tmp;

	if (keep) {
		sk.dy = keep->dy;
		sk.dh = keep->dh;
		sk.dz = keep->dz;
		sk.dsh_h = keep->dsh_h;
	}
	if (!g)
		g = &none;

	/* combine: d gate and d y per slot */
	be->moe_combine_backward(s->dy, s->dgate, dout, a->y, a->gate, a->pos, N, K, C);
	struct moe_rows rows = {.d = d, .count = pass_counts(be, d, a, 0, count), .xd = a->xd,
				.h = a->h, .act = a->act, .dy = s->dy, .dact = s->dact, .dh = s->dh, .dxd = s->dxd,
				.gfcw = g->fcw, .gfcprojw = g->fcprojw};
	run_experts(be, MOE_PASS_BACKWARD, &rows, w);

	/* router: gates, scores and the auxiliary losses back to the logits */
	be->moe_router_backward(s->dz, a->z, a->score, a->sel, a->gate, s->dgate, a->count, N, E,
				K, d->router, dloss, d->alpha, d->beta);
	be->matmul_backward(dx, g->router, NULL, s->dz, x, w->router, N, C, E);

	/* dx = router part + shared part + sum_j routed parts (j in order) */
	if (d->shared) {
		be->matmul_backward(s->dsh_act, g->sh_fcprojw, NULL, dout, a->sh_act, w->sh_fcprojw,
				    N, De, C);
		be->swiglu_backward(s->dsh_h, s->dsh_act, a->sh_h, N, De);
		be->matmul_backward(tmp, g->sh_fcw, NULL, s->dsh_h, x, w->sh_fcw, N, C, 2 * De);
		be->add_act(dx, dx, tmp, (size_t)N * C);
	}
	be->moe_combine(dx, s->dxd, NULL, a->pos, N, K, C);
}

void moe_backward_weight(const struct backend *be, const struct moe_dims *d,
			 const struct moe_grads *g, const void *x, const void *dout,
			 const struct moe_acts *a, const struct moe_dsave *keep)
{
	int N = d->N, C = d->C, E = d->E, De = d->De;
	int32_t count[E + 1];

	/* each tensor gets the one product moe_backward gives it (no weight is
	 * read: dinp is NULL) */
	struct moe_rows rows = {.d = d, .count = pass_counts(be, d, a, 0, count), .xd = a->xd,
				.act = a->act,
				.dy = keep->dy, .dh = keep->dh, .gfcw = g->fcw,
				.gfcprojw = g->fcprojw};
	run_experts(be, MOE_PASS_WEIGHT, &rows, NULL);
	be->matmul_backward(NULL, g->router, NULL, keep->dz, x, NULL, N, C, E);
	if (d->shared) {
		be->matmul_backward(NULL, g->sh_fcprojw, NULL, dout, a->sh_act, NULL, N, De, C);
		be->matmul_backward(NULL, g->sh_fcw, NULL, keep->dsh_h, x, NULL, N, C, 2 * De);
	}
}
