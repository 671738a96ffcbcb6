/* experts_nccl.c - expert parallelism between GPU processes over NCCL
 * (pipeline.transport = nccl; experts.h, nccl.h).
 *
 * The exchange of experts_p2p.c, planned by the same experts_plan.c and
 * made in the same order, on the stage's dp channel (its ranks are the N
 * replicas; member k of replica r's group is channel rank r - r % P + k),
 * with grouped sends and receives straight from and into device memory:
 *   1. the counts: this member's E+1, its rows' key and its work
 *      (experts_p2p.c's header; every member checks the others' work)
 *      to the device, swapped with every other member's, back to the host
 *      (the GEMMs' shapes, the kept blocks);
 *   2. one group: each owner k gets this member's block of the pass's
 *      input (forward xd, backward dy, weight nothing), each member's
 *      block of this member's experts arrives into the block the owner
 *      keeps for it (experts_plan.h: ep_store); meanwhile this member's
 *      experts run on its own rows;
 *   3. this member's experts run on each member's block (member order),
 *      then one group sends the outputs back (forward y, backward dxd) and
 *      receives this member's.
 * Each group ends with a mark on the channel that the host waits for
 * under pipeline.timeout (a member that never comes is named and the job
 * aborts, nccl.h); every transfer is queued after the compute stream's
 * work so far (cuda_nccl.h), so it reads what the kernels wrote. Between
 * two ranks NCCL matches transfers in the order queued, and every member
 * queues them in experts_p2p.c's order (per peer: the fields in plan
 * order), so the same rows land in the same places and the bits are those
 * of P = 1. The weight gradients of member k's rows accumulate in device
 * accumulators until deliver sends them to k, one tensor per group, in
 * the order the accumulators were made (the same on every member). The
 * replicas' sum on the same channel runs after deliver (no buckets with
 * expert parallelism: executor.c), so the two never interleave.
 *
 * Written without a GPU to run it on: it has not run (asyncpp-distributed(7)).
 */
#include "experts.h"
#include "nccl.h"

#ifndef ASYNCPP_CUDA

struct experts *experts_nccl(const struct backend *be, struct nccl_world *w, int P,
			     const struct pieces *pc, int E, double timeout)
{
	error("pipeline.transport = nccl needs a CUDA build of asyncpp");
	return NULL;
}

#else

#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_nccl.h"
#include "experts_plan.h"
#include "pieces.h"

struct acc {
	const float *key; /* this process's own tensor */
	size_t n;         /* floats of one expert's matrix */
	float *buf;       /* device [P][E/P * n]: member k's at k (this member's unused) */
};

/* Member k's block during a pass: its kept part and the pass's scratch. */
struct block {
	struct ep_kept *e;
	size_t cap;        /* bytes of mem */
	char *mem;         /* device, ep_scratch_bytes */
};

struct nccl_experts {
	struct experts x;
	struct moe_ep ep;
	const struct backend *be;
	struct nccl_world *w;
	int q, g0;            /* member q of the group of replicas g0 .. g0 + P - 1 */
	int E, e0, e1;        /* this member's experts [e0, e1) */
	double timeout;
	double waited;        /* ep.waited: seconds in the exchange's waits */
	struct ep_work work;  /* what the next calls compute (x.work) */
	int32_t *counts;      /* host [P][ep_head_ints] the members' headers of the pass */
	int32_t *dcounts;     /* device, the same */
	struct block *blk;    /* [P] */
	struct ep_store kept; /* the other members' kept blocks */
	struct retired old;   /* scratch a block outgrew (retired.h) */
	struct acc *acc;
	int n_acc;
	int aborted;
};

/* Queue a send (or receive) of bytes to (from) member k; the group's mark
 * stands for its completion. */
static void queue(struct nccl_experts *m, int send, void *buf, size_t bytes, int k)
{
	struct nccl_world *w = m->w;
	struct cuda_nccl_event *e = send ? cuda_nccl_chan_send(w->dp, buf, bytes, m->g0 + k)
					 : cuda_nccl_chan_recv(w->dp, buf, bytes, m->g0 + k);
	if (!e)
		nccl_fail("rank %d (stage %d): cannot queue the experts' exchange with replica %d",
			  w->rank, w->stage, m->g0 + k);
	cuda_nccl_event_free(e);
}

static void group_start(struct nccl_experts *m)
{
	if (cuda_nccl_group_start())
		nccl_fail("rank %d: cannot start an NCCL group", m->w->rank);
}

/* End the group; the mark after it, to wait for (wait_mark) */
static struct cuda_nccl_event *group_end(struct nccl_experts *m)
{
	struct cuda_nccl_event *ev;
	if (cuda_nccl_group_end())
		nccl_fail("rank %d: cannot end an NCCL group", m->w->rank);
	if (!(ev = cuda_nccl_chan_mark(m->w->dp)))
		nccl_fail("rank %d: cannot mark the experts' exchange", m->w->rank);
	return ev;
}

static void wait_mark(struct nccl_experts *m, struct cuda_nccl_event *ev, const char *what)
{
	m->waited += nccl_wait(ev, m->w->dp, m->timeout, m->w->rank, m->w->stage, "%s", what);
	cuda_nccl_event_free(ev);
}

static char *row_of(const struct moe_rows *R, int f, size_t row, size_t width)
{
	struct moe_rows r = *R;
	return (char *)*ep_field(&r, f) + row * width;
}

static float *acc_of(struct nccl_experts *m, const float *key, size_t n, int k)
{
	size_t per = (size_t)(m->e1 - m->e0) * n;
	for (int i = 0; i < m->n_acc; i++)
		if (m->acc[i].key == key)
			return m->acc[i].buf + (size_t)k * per;
	m->acc = xrealloc(m->acc, (size_t)(m->n_acc + 1) * sizeof(*m->acc));
	float *buf = m->be->alloc(st_mult(st_mult((size_t)m->x.P, per), sizeof(float)));
	if (!buf)
		nccl_fail("rank %d: cannot allocate the experts' gradient accumulators",
			  m->w->rank);
	m->acc[m->n_acc] = (struct acc){key, n, buf};
	return m->acc[m->n_acc++].buf + (size_t)k * per;
}

/* Buffer f of member k's block at this owner */
static char *block_field(const struct block *b, const struct moe_dims *d, int f)
{
	return (ep_is_kept(f) ? b->e->mem : b->mem) + ep_offset(d, b->e->rows, f);
}

/* One grouped exchange of fields[n] with every other member k of the group
 * (this one is q; G experts each): to_owners, this member's rows of k's
 * experts go to k and k's block of them comes in; else the way back. The
 * mark stands for its completion. */
static struct cuda_nccl_event *swap_rows(struct nccl_experts *m, const struct moe_rows *R,
					 int G, int q, const int *fields, int n, int to_owners)
{
	const struct moe_dims *d = R->d;
	group_start(m);
	for (int k = 0; k < m->x.P; k++) {
		struct block *b = &m->blk[k];
		size_t lo, rows;
		if (k == q)
			continue;
		ep_own_range(R->count, G, k, &lo, &rows);
		for (int i = 0; i < n; i++) {
			size_t w = ep_field_width(d, fields[i]);
			if (b->e->rows)
				queue(m, !to_owners, block_field(b, d, fields[i]), b->e->rows * w,
				      k);
			if (rows)
				queue(m, to_owners, row_of(R, fields[i], lo, w), rows * w, k);
		}
	}
	return group_end(m);
}

static void nccl_run(const struct moe_ep *ep, int pass, const struct moe_rows *R,
		     const float *fcw, const float *fcprojw)
{
	struct nccl_experts *m =
		(struct nccl_experts *)((char *)ep - offsetof(struct nccl_experts, ep));
	const struct moe_dims *d = R->d;
	const struct backend *be = m->be;
	int P = m->x.P, E = m->E, q = m->q, e0 = m->e0, G = E / P, k;
	struct ep_plan pl = ep_plan_of(pass);
	size_t De = (size_t)d->De, C = (size_t)d->C, cs = ep_head_ints(E), cb;
	uint64_t key = (uint64_t)(uintptr_t)R->xd;
	int32_t mine[cs];
	if (d->E != E)
		bug("an expert pass over %d experts in a group made for %d", d->E, E);
	if (m->aborted)
		return;

	/* 1. the counts, with the key of this member's rows */
	cb = cs * sizeof(int32_t);
	ep_head_pack(mine, E, R->count, key, pass, &m->work);
	be->to_device(m->dcounts + (size_t)q * cs, mine, cb);
	group_start(m);
	for (k = 0; k < P; k++)
		if (k != q) {
			queue(m, 0, m->dcounts + (size_t)k * cs, cb, k);
			queue(m, 1, m->dcounts + (size_t)q * cs, cb, k);
		}
	wait_mark(m, group_end(m), "the other experts' owners' row counts");
	be->to_host(m->counts, m->dcounts, (size_t)P * cb);
	for (k = 0; k < P; k++) {
		char me[160], them[160];
		if (k != q && !ep_head_agrees(m->counts + (size_t)k * cs, E, pass, &m->work, me,
					      them, sizeof(me)))
			nccl_fail("rank %d (piece %d): its expert-parallel group disagrees on the "
				  "work: this rank (replica %d) runs %s, replica %d %s; a schedule "
				  "bug, please report it", m->w->rank, m->work.piece, m->w->replica,
				  me, m->g0 + k, them);
	}

	/* 2. blocks out and in; this member's own rows meanwhile */
	for (k = 0; k < P; k++) {
		struct block *b = &m->blk[k];
		const int32_t *ck = m->counts + (size_t)k * cs;
		if (k == q)
			continue;
		b->e = ep_store_get(&m->kept, be, d, pass, k, ep_head_key(ck, E), ck, e0, G);
		if (!b->e && pass != MOE_PASS_FORWARD)
			bug("replica %d's rows of a backward were never forwarded to replica %d",
			    m->g0 + k, m->w->replica);
		if (!b->e)
			nccl_fail("rank %d: cannot allocate replica %d's rows of its experts",
				  m->w->rank, m->g0 + k);
		if (pass != MOE_PASS_FORWARD && b->e->rows != (size_t)(ck[m->e1] - ck[e0]))
			bug("replica %d's rows changed from its forward to its backward",
			    m->g0 + k);
		size_t bytes = ep_scratch_bytes(d, b->e->rows);
		if (bytes > b->cap || !b->mem) {
			/* kept, not freed, mid-segment (retired.h) */
			retired_keep(&m->old, b->mem);
			b->cap = retired_grow(b->mem ? b->cap : 0, bytes);
			if (!(b->mem = be->alloc(b->cap ? b->cap : 1)))
				nccl_fail("rank %d: cannot allocate %zu bytes for the experts' "
					  "rows", m->w->rank, b->cap);
		}
	}
	struct cuda_nccl_event *ev = swap_rows(m, R, G, q, pl.in, pl.n_in, 1);
	moe_experts(be, pass, R, moe_expert_weights(d, fcw, 0, e0),
		    moe_expert_weights(d, fcprojw, 1, e0), e0, m->e1);
	wait_mark(m, ev, "the rows of this rank's experts");

	/* 3. every other member's block, then the outputs back */
	for (k = 0; k < P; k++) {
		struct block *b = &m->blk[k];
		struct moe_rows br = {.d = d};
		if (k == q)
			continue;
		br.count = b->e->cnt;
		for (int f = 0; f < EP_NFIELD; f++)
			*ep_field(&br, f) = block_field(b, d, f);
		if (R->gfcw)
			br.gfcw = acc_of(m, R->gfcw, 2 * De * C, k);
		if (R->gfcprojw)
			br.gfcprojw = acc_of(m, R->gfcprojw, C * De, k);
		if (b->e->rows)
			moe_experts(be, pass, &br, moe_expert_weights(d, fcw, 0, e0),
				    moe_expert_weights(d, fcprojw, 1, e0), 0, G);
	}
	if (pl.n_out) {
		wait_mark(m, swap_rows(m, R, G, q, pl.out, pl.n_out, 0),
			  "the outputs of the other ranks' experts");
	}
	/* the kept blocks the members need no more; their memory stays for the
	 * next forward, which the transfers above precede on every stream */
	if (ep_releases(pass, R->gfcw != NULL))
		for (k = 0; k < P; k++)
			if (k != q)
				m->blk[k].e->used = 0;
}

static int holds(const struct nccl_experts *m, int r, int s)
{
	const struct nccl_world *w = m->w;
	int stage = w->piece_stage && s >= 0 && s < w->P ? w->piece_stage[s] : s;
	return r == w->replica && stage == w->stage;
}

static void nccl_deliver(struct experts *x, int r, int s, float *g, size_t n)
{
	struct nccl_experts *m = (struct nccl_experts *)x;
	int P = x->P, G = m->E / P;
	if (!holds(m, r, s))
		bug("rank of replica %d stage %d delivers as replica %d piece %d", m->w->replica,
		    m->w->stage, r, s);
	for (int i = 0; i < m->n_acc; i++) {
		struct acc *a = &m->acc[i];
		if (a->key < g || a->key >= g + n)
			continue; /* the other step's arena */
		size_t per = (size_t)G * a->n, at = (size_t)(a->key - g);
		group_start(m);
		for (int k = 0; k < P; k++)
			if (k != m->q) {
				queue(m, 0, g + at + (size_t)k * per, per * sizeof(float), k);
				queue(m, 1, a->buf + (size_t)k * per, per * sizeof(float), k);
			}
		wait_mark(m, group_end(m), "the weight gradients of this rank's rows");
		m->be->zero(a->buf, (size_t)P * per * sizeof(float));
	}
}

static const struct moe_ep *nccl_member(struct experts *x, int r, int s)
{
	struct nccl_experts *m = (struct nccl_experts *)x;
	if (!holds(m, r, s))
		bug("rank of replica %d stage %d asked for replica %d piece %d", m->w->replica,
		    m->w->stage, r, s);
	return &m->ep;
}

static void nccl_work(struct experts *x, int r, int s, const struct ep_work *w)
{
	nccl_member(x, r, s); /* checks r and s */
	((struct nccl_experts *)x)->work = *w;
}

static void nccl_abort(struct experts *x) { ((struct nccl_experts *)x)->aborted = 1; }

static void nccl_destroy(struct experts *x)
{
	struct nccl_experts *m = (struct nccl_experts *)x;
	if (!m)
		return;
	for (int i = 0; i < m->n_acc; i++)
		m->be->free(m->acc[i].buf);
	free(m->acc);
	for (int k = 0; k < x->P; k++)
		if (m->blk[k].mem)
			m->be->free(m->blk[k].mem);
	free(m->blk);
	ep_store_free(&m->kept, m->be);
	retired_free(&m->old, m->be);
	free(m->counts);
	if (m->dcounts)
		m->be->free(m->dcounts);
	free(m);
}

struct experts *experts_nccl(const struct backend *be, struct nccl_world *w, int P,
			     const struct pieces *pc, int E, double timeout)
{
	int N = w->replicas;
	if (P < 1 || N % P || E % P)
		bug("expert parallelism over %d of %d replicas with %d experts", P, N, E);
	if (!w->dp)
		return error("internal error: expert parallelism over NCCL without a dp channel"),
		       NULL;
	struct nccl_experts *m = xcalloc(1, sizeof(*m));
	m->x = (struct experts){.name = "nccl", .N = N, .P = P, .S = pc->P,
				.member = nccl_member, .work = nccl_work, .abort = nccl_abort,
				.deliver = nccl_deliver, .destroy = nccl_destroy};
	m->ep.experts = nccl_run;
	m->ep.waited = &m->waited;
	m->be = be;
	m->w = w;
	m->q = w->replica % P;
	m->g0 = w->replica - m->q;
	m->E = E;
	m->e0 = m->q * (E / P);
	m->e1 = m->e0 + E / P;
	m->timeout = timeout;
	m->counts = xcalloc(st_mult((size_t)P, ep_head_ints(E)), sizeof(int32_t));
	m->blk = xcalloc((size_t)P, sizeof(*m->blk));
	if (!(m->dcounts = be->alloc(st_mult((size_t)P, ep_head_ints(E)) * sizeof(int32_t)))) {
		nccl_destroy(&m->x);
		error("rank %d: cannot allocate the experts' row counts on backend '%s'", w->rank,
		      be->name);
		return NULL;
	}
	return &m->x;
}

#endif
