/* experts_plan.c - the experts' all-to-all, planned (experts_plan.h). */
#include "experts_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The header: counts [E+1], key [2], pass, piece, mb, step [2], version [2] */
size_t ep_head_ints(int E) { return (size_t)E + 10; }

static void put64(int32_t *p, long v)
{
	int64_t x = v;
	memcpy(p, &x, sizeof(x));
}

static long get64(const int32_t *p)
{
	int64_t x;
	memcpy(&x, p, sizeof(x));
	return (long)x;
}

void ep_head_pack(int32_t *h, int E, const int32_t *count, uint64_t key, int pass,
		  const struct ep_work *w)
{
	memcpy(h, count, (size_t)(E + 1) * sizeof(int32_t));
	memcpy(h + E + 1, &key, sizeof(key));
	h[E + 3] = pass;
	h[E + 4] = w->piece;
	h[E + 5] = w->mb;
	put64(h + E + 6, w->step);
	put64(h + E + 8, w->version);
}

uint64_t ep_head_key(const int32_t *h, int E)
{
	uint64_t key;
	memcpy(&key, h + E + 1, sizeof(key));
	return key;
}

static void say_work(char *buf, size_t n, int pass, const struct ep_work *w, int piece)
{
	const char *name = pass == MOE_PASS_FORWARD    ? "forward"
			   : pass == MOE_PASS_BACKWARD ? "backward"
			   : pass == MOE_PASS_WEIGHT   ? "weight part"
						       : "unknown pass";
	int at = snprintf(buf, n, "the %s of micro-batch %d of step %ld", name, w->mb, w->step);
	if (piece && at >= 0 && (size_t)at < n)
		at += snprintf(buf + at, n - (size_t)at, " of piece %d", w->piece);
	if (at >= 0 && (size_t)at < n)
		snprintf(buf + at, n - (size_t)at, " on weight version %ld", w->version);
}

int ep_work_agrees(int pass_a, const struct ep_work *a, int pass_b, const struct ep_work *b,
		   char *sa, char *sb, size_t n)
{
	if (pass_a == pass_b && a->step == b->step && a->version == b->version &&
	    a->piece == b->piece && a->mb == b->mb)
		return 1;
	say_work(sa, n, pass_a, a, a->piece != b->piece);
	say_work(sb, n, pass_b, b, a->piece != b->piece);
	return 0;
}

int ep_head_agrees(const int32_t *h, int E, int pass, const struct ep_work *w, char *mine,
		   char *theirs, size_t n)
{
	struct ep_work t = {.step = get64(h + E + 6), .version = get64(h + E + 8),
			    .piece = h[E + 4], .mb = h[E + 5]};
	return ep_work_agrees(pass, w, h[E + 3], &t, mine, theirs, n);
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

void ep_owner_mem(int P, int staged, const struct ep_piece_mem *pc, int n, struct ep_mem *m)
{
	struct ep_plan fwd = ep_plan_of(MOE_PASS_FORWARD);
	size_t in_b, out_b, own = 0, wire = 0, gwire = 0;
	*m = (struct ep_mem){0};
	if (P < 2)
		return;
	for (int i = 0; i < n; i++) {
		const struct moe_dims *d = &pc[i].d;
		size_t G = (size_t)(d->E / P), N = (size_t)d->N, K = (size_t)d->K;
		size_t rows = N * (K < G ? K : G), others = (size_t)P - 1;
		size_t expert = 3 * (size_t)d->De * (size_t)d->C; /* fcw + fcprojw floats */
		size_t blocks = others * (size_t)pc[i].layers * (size_t)pc[i].slots;
		if (!pc[i].layers)
			continue; /* no MoE layer: the exchange never runs for it */
		m->kept += blocks * ep_kept_bytes(d, rows);
		m->acc += (size_t)pc[i].arenas * pc[i].layers * P * G * expert * sizeof(float);
		/* one scratch block and host copy per other member, the largest
		 * reused by every piece; a member's own rows all travel (the
		 * forward's, as wide as the backward's) */
		m->scratch = MAX(m->scratch, others * ep_scratch_bytes(d, rows));
		size_t travel = MIN(N * K, others * rows);
		own = MAX(own, ep_block_bytes(&fwd, d, travel, &in_b, &out_b));
		wire = MAX(wire, others * ep_block_bytes(&fwd, d, rows, &in_b, &out_b));
		gwire = MAX(gwire, 2 * P * G * 2 * (size_t)d->De * (size_t)d->C * sizeof(float));
	}
	if (staged)
		m->staging = own + wire + gwire;
}
