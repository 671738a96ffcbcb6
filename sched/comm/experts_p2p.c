/* experts_p2p.c - expert parallelism between processes (experts.h), over
 * the point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * A pass of member q (its rows R, dispatched by expert; its weights):
 *   1. the members swap their E+1 row counts (the rows of owner k's
 *      experts are R's rows [count[e0_k], count[e1_k]), one block);
 *   2. q sends each owner k its block of every input the pass reads
 *      (forward: xd; backward: dy, act, h, xd; weight: dy, act, dh, xd)
 *      and receives every member's block of its own experts, while it
 *      runs its experts on its own rows in place;
 *   3. it runs its experts on each member's block (member order), as a
 *      GEMM of the same rows with the same weights as that member would,
 *      and sends the outputs back (forward: y, h, act; backward: dxd, dh),
 *      receiving its own blocks' outputs into R in place.
 * Weight gradients of member k's rows accumulate into an accumulator for
 * k (one per gradient tensor of the member's arena that a pass named,
 * found by this process's own tensor: every member makes the same calls,
 * so the members' accumulators are made in the same order) until deliver
 * sends them to k. Messages carry a tag per phase on a channel of their
 * own; between two ranks, messages of a tag arrive in the order sent and
 * every member makes the same calls in the same order, so calls never mix.
 */
#include "experts.h"

#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "dist.h"
#include "p2p.h"
#include "pieces.h"

enum { TAG_COUNT = 1, TAG_IN = 2, TAG_OUT = 3, TAG_GRAD = 4 };

/* What an owner accumulates for the other members of one gradient tensor
 * (a layer's fcw or fcprojw, all E experts' matrices back to back). */
struct acc {
	const float *key; /* this process's own tensor */
	size_t n;         /* floats of one expert's matrix */
	float *buf;       /* [P][E/P * n]: member k's at k (this member's unused) */
};

/* A member's block while the owner runs it: inputs received, outputs made. */
struct block {
	int32_t cnt[4097]; /* counts of the owner's experts, from 0 (E/P + 1) */
	size_t rows, cap;  /* rows of the block; bytes of mem */
	char *mem;         /* the pass's buffers, each rows wide, in order */
};

struct p2p_experts {
	struct experts x;
	struct moe_ep ep;
	const struct backend *be;
	int r, s, S, q, g0;   /* replica, stage, stages; member q of the group of replica g0.. */
	int P_pieces;         /* model pieces per pipeline (pieces.h) */
	int *piece_stage;     /* [P_pieces] the stage of each: a rank runs its stage's pieces */
	int E, e0, e1;        /* this member's experts [e0, e1) */
	double timeout;
	struct p2p *ch;
	int32_t *counts;      /* [P][E+1] the members' counts of the pass */
	struct block *blk;    /* [P] */
	struct acc *acc;
	int n_acc;
	struct p2p_op **req;  /* [16 P] */
	int aborted;
};

static int peer_rank(const struct p2p_experts *m, int k) { return (m->g0 + k) * m->S + m->s; }

static char *grow(char *p, size_t *cap, size_t n)
{
	if (n <= *cap)
		return p;
	free(p);
	*cap = n;
	return xmalloc(n);
}

/* Bytes per row of each buffer a pass moves: in[] to the owner, out[]
 * back; the moe_rows fields they are (f: which of xd h act y dy dact dh
 * dxd). */
enum { F_XD, F_H, F_ACT, F_Y, F_DY, F_DACT, F_DH, F_DXD, F_N };

static void **field(struct moe_rows *r, int f)
{
	void **p[F_N] = {&r->xd, &r->h, &r->act, &r->y, &r->dy, &r->dact, &r->dh, &r->dxd};
	return p[f];
}

/* Row `row` of buffer f of R (the member's own buffers, which it lends
 * the pass: read by the sends, written by the receives) */
static char *row_of(const struct moe_rows *R, int f, size_t row, size_t width)
{
	struct moe_rows r = *R;
	return (char *)*field(&r, f) + row * width;
}

static size_t field_width(const struct moe_dims *d, int f)
{
	size_t C = (size_t)d->C, De = (size_t)d->De;
	size_t w[F_N] = {C, 2 * De, De, C, C, De, 2 * De, C};
	return w[f] * act_dtype_size(d->act_dtype);
}

struct plan {
	int in[4], n_in;     /* sent to the owner */
	int out[3], n_out;   /* sent back */
	int tmp[2], n_tmp;   /* made and used by the owner only */
};

static struct plan plan_of(int pass)
{
	if (pass == MOE_PASS_FORWARD)
		return (struct plan){{F_XD}, 1, {F_Y, F_H, F_ACT}, 3, {0}, 0};
	if (pass == MOE_PASS_BACKWARD)
		return (struct plan){{F_DY, F_ACT, F_H, F_XD}, 4, {F_DXD, F_DH}, 2, {F_DACT}, 1};
	return (struct plan){{F_DY, F_ACT, F_DH, F_XD}, 4, {0}, 0, {0}, 0};
}

/* The accumulator of this process's tensor key (made, zeroed, at its first
 * use: the same call on every member) */
static float *acc_of(struct p2p_experts *m, const float *key, size_t n, int k)
{
	int P = m->x.P;
	size_t per = (size_t)(m->e1 - m->e0) * n;
	for (int i = 0; i < m->n_acc; i++)
		if (m->acc[i].key == key)
			return m->acc[i].buf + (size_t)k * per;
	m->acc = realloc(m->acc, (size_t)(m->n_acc + 1) * sizeof(*m->acc));
	if (!m->acc)
		die("out of memory for the experts' gradient accumulators");
	m->acc[m->n_acc] = (struct acc){key, n, xcalloc(st_mult((size_t)P, per), sizeof(float))};
	return m->acc[m->n_acc++].buf + (size_t)k * per;
}

static void p2p_run(const struct moe_ep *ep, int pass, const struct moe_rows *R, const float *fcw,
		    const float *fcprojw)
{
	struct p2p_experts *m =
		(struct p2p_experts *)((char *)ep - offsetof(struct p2p_experts, ep));
	const struct moe_dims *d = R->d;
	int P = m->x.P, E = m->E, q = m->q, e0 = m->e0, e1 = m->e1, G = E / P, k, nr;
	struct plan pl = plan_of(pass);
	size_t De = (size_t)d->De, C = (size_t)d->C;
	if (d->E != E)
		bug("an expert pass over %d experts in a group made for %d", d->E, E);
	if (m->aborted)
		return;

	/* 1. the counts */
	memcpy(m->counts + (size_t)q * (E + 1), R->count, (size_t)(E + 1) * sizeof(int32_t));
	nr = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		size_t cb = (size_t)(E + 1) * sizeof(int32_t);
		m->req[nr++] = p2p_irecv(m->ch, m->counts + (size_t)k * (E + 1), cb,
					 peer_rank(m, k), TAG_COUNT);
		m->req[nr++] = p2p_isend(m->ch, R->count, cb, peer_rank(m, k), TAG_COUNT);
	}
	p2p_wait(m->ch, m->req, nr, m->timeout, m->s, "the other experts' owners' row counts");

	/* 2. blocks out and in; this member's own rows meanwhile */
	nr = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		const int32_t *ck = m->counts + (size_t)k * (E + 1);
		struct block *b = &m->blk[k];
		b->rows = (size_t)(ck[e1] - ck[e0]);
		for (int e = 0; e <= G; e++)
			b->cnt[e] = ck[e0 + e] - ck[e0];
		size_t bytes = 0;
		for (int i = 0; i < pl.n_in; i++)
			bytes += b->rows * field_width(d, pl.in[i]);
		for (int i = 0; i < pl.n_out; i++)
			bytes += b->rows * field_width(d, pl.out[i]);
		for (int i = 0; i < pl.n_tmp; i++)
			bytes += b->rows * field_width(d, pl.tmp[i]);
		b->mem = grow(b->mem, &b->cap, bytes ? bytes : 1);
		/* owner k's experts' rows of R, one block per input */
		size_t lo = (size_t)R->count[k * G], rows = (size_t)R->count[(k + 1) * G] - lo;
		size_t off = 0;
		for (int i = 0; i < pl.n_in; i++) {
			size_t w = field_width(d, pl.in[i]);
			if (b->rows)
				m->req[nr++] = p2p_irecv(m->ch, b->mem + off, b->rows * w,
							 peer_rank(m, k), TAG_IN);
			if (rows)
				m->req[nr++] = p2p_isend(m->ch, row_of(R, pl.in[i], lo, w),
							 rows * w, peer_rank(m, k), TAG_IN);
			off += b->rows * w;
		}
	}
	moe_experts(m->be, pass, R, fcw, fcprojw, e0, e1);
	p2p_wait(m->ch, m->req, nr, m->timeout, m->s, "the rows of this rank's experts");

	/* 3. every other member's block, and the outputs back */
	nr = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		struct block *b = &m->blk[k];
		struct moe_rows br = {.d = d, .count = b->cnt};
		size_t off = 0;
		int f[9], nf = 0;
		for (int i = 0; i < pl.n_in; i++)
			f[nf++] = pl.in[i];
		for (int i = 0; i < pl.n_out; i++)
			f[nf++] = pl.out[i];
		for (int i = 0; i < pl.n_tmp; i++)
			f[nf++] = pl.tmp[i];
		for (int i = 0; i < nf; i++) {
			/* an output that is also an input (none today) keeps its input */
			if (!*field(&br, f[i]))
				*field(&br, f[i]) = b->mem + off;
			off += b->rows * field_width(d, f[i]);
		}
		if (R->gfcw)
			br.gfcw = acc_of(m, R->gfcw, 2 * De * C, k);
		if (R->gfcprojw)
			br.gfcprojw = acc_of(m, R->gfcprojw, C * De, k);
		if (b->rows)
			moe_experts(m->be, pass, &br, fcw ? fcw + (size_t)e0 * 2 * De * C : NULL,
				    fcprojw ? fcprojw + (size_t)e0 * C * De : NULL, 0, G);
		size_t lo = (size_t)R->count[k * G], rows = (size_t)R->count[(k + 1) * G] - lo;
		for (int i = 0; i < pl.n_out; i++) {
			size_t w = field_width(d, pl.out[i]);
			if (rows)
				m->req[nr++] = p2p_irecv(m->ch, row_of(R, pl.out[i], lo, w),
							 rows * w, peer_rank(m, k), TAG_OUT);
			if (b->rows)
				m->req[nr++] = p2p_isend(m->ch, *field(&br, pl.out[i]), b->rows * w,
							 peer_rank(m, k), TAG_OUT);
		}
	}
	p2p_wait(m->ch, m->req, nr, m->timeout, m->s, "the outputs of the other ranks' experts");
}

static void p2p_deliver(struct experts *x, int r, int s, float *g, size_t n)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	int P = x->P, G = m->E / P;
	if (r != m->r || s < 0 || s >= m->P_pieces || m->piece_stage[s] != m->s)
		bug("rank of replica %d stage %d delivers as replica %d piece %d", m->r, m->s, r,
		    s);
	int nr = 0, n_req = 16 * P;
	for (int i = 0; i < m->n_acc; i++) {
		struct acc *a = &m->acc[i];
		if (a->key < g || a->key >= g + n)
			continue; /* the other step's arena */
		size_t per = (size_t)G * a->n, at = (size_t)(a->key - g);
		for (int k = 0; k < P; k++) {
			if (k == m->q)
				continue;
			if (nr + 2 > n_req) {
				p2p_wait(m->ch, m->req, nr, m->timeout, m->s,
					 "the weight gradients of this rank's rows");
				nr = 0;
			}
			m->req[nr++] = p2p_irecv(m->ch, g + at + (size_t)k * per,
						 per * sizeof(float), peer_rank(m, k), TAG_GRAD);
			m->req[nr++] = p2p_isend(m->ch, a->buf + (size_t)k * per,
						 per * sizeof(float), peer_rank(m, k), TAG_GRAD);
		}
	}
	p2p_wait(m->ch, m->req, nr, m->timeout, m->s, "the weight gradients of this rank's rows");
	for (int i = 0; i < m->n_acc; i++)
		if (m->acc[i].key >= g && m->acc[i].key < g + n)
			memset(m->acc[i].buf, 0,
			       st_mult((size_t)P * (size_t)G, m->acc[i].n) * sizeof(float));
}

static const struct moe_ep *p2p_member(struct experts *x, int r, int s)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	if (r != m->r || s < 0 || s >= m->P_pieces || m->piece_stage[s] != m->s)
		bug("rank of replica %d stage %d asked for replica %d piece %d", m->r, m->s, r, s);
	return &m->ep;
}

static void p2p_abort(struct experts *x) { ((struct p2p_experts *)x)->aborted = 1; }

static void p2p_destroy(struct experts *x)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	if (!m)
		return;
	p2p_close(m->ch);
	for (int i = 0; i < m->n_acc; i++)
		free(m->acc[i].buf);
	free(m->acc);
	for (int k = 0; k < x->P; k++)
		free(m->blk[k].mem);
	free(m->blk);
	free(m->counts);
	free(m->req);
	free(m->piece_stage);
	free(m);
}

struct experts *experts_p2p(const struct dist *d, const struct backend *be, int N, int P,
			    const struct pieces *pc, int E, int rank, double timeout)
{
	if (P < 1 || N % P || E % P)
		bug("expert parallelism over %d of %d replicas with %d experts", P, N, E);
	if (E / P + 1 > (int)(sizeof(((struct block *)0)->cnt) / sizeof(int32_t)))
		return error("model.n_expert = %d over model.expert_parallel = %d: at most 4096 "
			     "experts per rank", E, P), NULL;
	if (!dist_backend_is_host(be))
		return error("model.expert_parallel = %d between processes runs on the cpu backend "
			     "only for now (the rows travel from host memory); the backend is '%s'",
			     P, be->name), NULL;
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_experts *m = xcalloc(1, sizeof(*m));
	int S = pc->S;
	m->x = (struct experts){.name = p2p_name(ch), .N = N, .P = P, .S = pc->P,
				.member = p2p_member,
				.abort = p2p_abort, .deliver = p2p_deliver,
				.destroy = p2p_destroy};
	m->ep.experts = p2p_run;
	m->be = be;
	m->r = rank / S;
	m->s = rank % S;
	m->S = S;
	m->P_pieces = pc->P;
	m->piece_stage = xmalloc((size_t)pc->P * sizeof(int));
	memcpy(m->piece_stage, pc->stage, (size_t)pc->P * sizeof(int));
	m->q = m->r % P;
	m->g0 = m->r - m->q;
	m->E = E;
	m->e0 = m->q * (E / P);
	m->e1 = m->e0 + E / P;
	m->timeout = timeout;
	m->ch = ch;
	m->counts = xcalloc(st_mult((size_t)P, (size_t)E + 1), sizeof(int32_t));
	m->blk = xcalloc((size_t)P, sizeof(*m->blk));
	m->req = xcalloc((size_t)16 * P, sizeof(*m->req));
	return &m->x;
}
