/* experts_plan.c - the experts' all-to-all, planned (experts_plan.h). */
#include "experts_plan.h"

#include <stdlib.h>

#include "../../io/util.h"
#include "../../kernels/act.h"

struct ep_plan ep_plan_of(int pass)
{
	if (pass == MOE_PASS_FORWARD)
		return (struct ep_plan){{EP_XD}, 1, {EP_Y}, 1};
	if (pass == MOE_PASS_BACKWARD)
		return (struct ep_plan){{EP_DY}, 1, {EP_DXD}, 1};
	return (struct ep_plan){{0}, 0, {0}, 0};
}

int ep_releases(int pass, int with_grads)
{
	return pass == MOE_PASS_WEIGHT || (pass == MOE_PASS_BACKWARD && with_grads);
}

size_t ep_field_width(const struct moe_dims *d, int f)
{
	size_t C = (size_t)d->C, De = (size_t)d->De;
	size_t w[EP_NFIELD] = {C, 2 * De, De, C, C, De, 2 * De, C};
	return w[f] * act_dtype_size(d->act_dtype);
}

void **ep_field(struct moe_rows *r, int f)
{
	void **p[EP_NFIELD] = {&r->xd, &r->h,    &r->act, &r->y,
			       &r->dy, &r->dact, &r->dh,  &r->dxd};
	return p[f];
}

void ep_own_range(const int32_t *count, int G, int k, size_t *lo, size_t *rows)
{
	*lo = (size_t)count[k * G];
	*rows = (size_t)count[(k + 1) * G] - *lo;
}

size_t ep_block_counts(const int32_t *count_k, int e0, int G, int32_t *cnt)
{
	for (int e = 0; e <= G; e++)
		cnt[e] = count_k[e0 + e] - count_k[e0];
	return (size_t)cnt[G];
}

/* The kept buffers in order, then the scratch ones */
static const int kept_order[] = {EP_XD, EP_H, EP_ACT, EP_DY, EP_DH};
static const int scratch_order[] = {EP_Y, EP_DACT, EP_DXD};

int ep_is_kept(int f)
{
	for (size_t i = 0; i < sizeof(kept_order) / sizeof(int); i++)
		if (kept_order[i] == f)
			return 1;
	return 0;
}

static size_t order_bytes(const struct moe_dims *d, size_t rows, const int *order, size_t n,
			  int upto)
{
	size_t off = 0;
	for (size_t i = 0; i < n && order[i] != upto; i++)
		off += rows * ep_field_width(d, order[i]);
	return off;
}

size_t ep_offset(const struct moe_dims *d, size_t rows, int f)
{
	if (ep_is_kept(f))
		return order_bytes(d, rows, kept_order, sizeof(kept_order) / sizeof(int), f);
	return order_bytes(d, rows, scratch_order, sizeof(scratch_order) / sizeof(int), f);
}

size_t ep_kept_bytes(const struct moe_dims *d, size_t rows)
{
	return order_bytes(d, rows, kept_order, sizeof(kept_order) / sizeof(int), -1);
}

size_t ep_scratch_bytes(const struct moe_dims *d, size_t rows)
{
	return order_bytes(d, rows, scratch_order, sizeof(scratch_order) / sizeof(int), -1);
}

size_t ep_block_bytes(const struct ep_plan *pl, const struct moe_dims *d, size_t rows,
		      size_t *in, size_t *out)
{
	size_t i_b = 0, o_b = 0;
	for (int i = 0; i < pl->n_in; i++)
		i_b += rows * ep_field_width(d, pl->in[i]);
	for (int i = 0; i < pl->n_out; i++)
		o_b += rows * ep_field_width(d, pl->out[i]);
	*in = i_b;
	*out = o_b;
	return i_b + o_b;
}

struct ep_kept *ep_store_get(struct ep_store *st, const struct backend *be,
			     const struct moe_dims *d, int pass, int k, uint64_t key,
			     const int32_t *ck, int e0, int G)
{
	struct ep_kept *e = NULL;
	int free_i = -1;
	for (int i = 0; i < st->n && !e; i++) {
		if (st->e[i]->used && st->e[i]->k == k && st->e[i]->key == key)
			e = st->e[i];
		else if (!st->e[i]->used && free_i < 0)
			free_i = i;
	}
	if (pass != MOE_PASS_FORWARD)
		return e;
	if (!e && free_i >= 0)
		e = st->e[free_i];
	if (!e) {
		st->e = xrealloc(st->e, (size_t)(st->n + 1) * sizeof(*st->e));
		e = st->e[st->n++] = xcalloc(1, sizeof(*e));
		e->cnt = xmalloc((size_t)(G + 1) * sizeof(int32_t));
	}
	e->k = k;
	e->key = key;
	e->used = 1;
	e->rows = ep_block_counts(ck, e0, G, e->cnt);
	size_t need = ep_kept_bytes(d, e->rows);
	if (need > e->cap || !e->mem) {
		/* the old memory is kept, not freed, mid-segment (retired.h) */
		size_t cap = retired_grow(e->mem ? e->cap : 0, need);
		char *mem = be->alloc(cap ? cap : 1);
		if (!mem) {
			e->used = 0;
			return NULL;
		}
		retired_keep(&st->old, e->mem);
		e->mem = mem;
		e->cap = cap;
	}
	return e;
}

void ep_store_free(struct ep_store *st, const struct backend *be)
{
	for (int i = 0; i < st->n; i++) {
		free(st->e[i]->cnt);
		if (st->e[i]->mem)
			be->free(st->e[i]->mem);
		free(st->e[i]);
	}
	free(st->e);
	st->e = NULL;
	st->n = 0;
	retired_free(&st->old, be);
}
