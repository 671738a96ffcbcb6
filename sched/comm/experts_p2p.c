/* experts_p2p.c - expert parallelism between processes (experts.h), over
 * the point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * A pass of member q (its rows R, dispatched by expert; its weights):
 *   1. the members swap their E+1 row counts and the key of their rows
 *      (the address of R's xd: its activation slot's, the same in the
 *      forward, the backward and the weight part of one micro-batch);
 *      owner k's experts' rows are R's rows [count[e0_k], count[e1_k]);
 *      with them the pass and its work (experts.h: piece, step,
 *      micro-batch, weight version), which every member checks are its
 *      own before anything runs (experts_plan.h: ep_head_*);
 *   2. q sends each owner k its block of the pass's input (forward: xd;
 *      backward: dy; weight: nothing) and receives every member's block
 *      of its own experts, while it runs its experts on its own rows;
 *   3. it runs its experts on each member's block (member order), as a
 *      GEMM of the same rows with the same weights as that member would,
 *      and sends the output back (forward: y; backward: dxd), receiving
 *      its own blocks' outputs into R in place.
 * An owner keeps what else a member's later passes need (experts_plan.h:
 * xd, h and act from the forward; dy and dh from a backward without
 * weight gradients, for the weight part), found by the member's key, and
 * lets it go after the member's last pass of those rows, so each row
 * travels once each way per pass. Its bits are those the round trip
 * would bring back.
 * Weight gradients of member k's rows accumulate into an accumulator for
 * k (one per gradient tensor of the member's arena that a pass named,
 * found by this process's own tensor: every member makes the same calls,
 * so the members' accumulators are made in the same order) until deliver
 * sends them to k. Messages carry a tag per phase on a channel of their
 * own; between two ranks, messages of a tag arrive in the order sent and
 * every member makes the same calls in the same order, so calls never mix.
 *
 * With a host backend (cpu) the messages read and write the backend
 * buffers themselves. Otherwise (cuda) every message is staged through
 * host memory, as transport_p2p.c's are: a member copies the rows it
 * sends to host buffers (m->own) and the rows it gets back from them; an
 * owner receives a block's inputs into a host copy (wire), copies them to
 * the device, runs them and copies the outputs back to send; deliver
 * stages the accumulators the same way. The staging copies bytes, so the
 * bits are those of a host backend.
 */
#include "experts.h"

#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "dist.h"
#include "experts_plan.h"
#include "p2p.h"
#include "pieces.h"

enum { TAG_COUNT = 1, TAG_IN = 2, TAG_OUT = 3, TAG_GRAD = 4 };

/* What an owner accumulates for the other members of one gradient tensor
 * (a layer's fcw or fcprojw, all E experts' matrices back to back). */
struct acc {
	const float *key; /* this process's own tensor */
	size_t n;         /* floats of one expert's matrix */
	float *buf;       /* backend [P][E/P * n]: member k's at k (this member's unused) */
};

/* Member k's block during a pass: its kept part and the pass's scratch. */
struct block {
	struct ep_kept *e;
	size_t cap, wcap;  /* bytes of mem, of wire */
	char *mem;         /* backend memory, ep_scratch_bytes */
	char *wire;        /* device backends: host copy of the travelling rows, in then out */
};

struct p2p_experts {
	struct experts x;
	struct moe_ep ep;
	const struct backend *be;
	int host;             /* backend memory is host memory (dist_backend_is_host) */
	int r, s, S, q, g0;   /* replica, stage, stages; member q of the group of replica g0.. */
	int P_pieces;         /* model pieces per pipeline (pieces.h) */
	int *piece_stage;     /* [P_pieces] the stage of each: a rank runs its stage's pieces */
	int E, e0, e1;        /* this member's experts [e0, e1) */
	double timeout;
	double waited;        /* ep.waited: seconds in the exchange's waits */
	struct ep_work work;  /* what the next calls compute (x.work) */
	struct p2p *ch;
	int32_t *counts;      /* [P][ep_head_ints] the members' headers of the pass */
	struct block *blk;    /* [P] */
	struct ep_store kept; /* the other members' kept blocks */
	char *own;            /* device backends: host copies of this member's rows */
	size_t own_cap;       /* that travel, per owner: its inputs, then its outputs */
	float *gwire;         /* device backends: deliver's host copies, [2][P][E/P * n] */
	size_t gwire_cap;     /* floats */
	struct acc *acc;
	int n_acc;
	struct p2p_op **req;  /* [16 P] */
	int aborted;
};

/* The first n requests done; the seconds they took go to m->waited. */
static void ep_wait(struct p2p_experts *m, int n, const char *what)
{
	double t0 = now_sec();
	p2p_wait(m->ch, m->req, n, m->timeout, m->s, "%s", what);
	m->waited += now_sec() - t0;
}

static int peer_rank(const struct p2p_experts *m, int k) { return (m->g0 + k) * m->S + m->s; }

/* Out of device memory mid-pass: the peers wait in receives that nothing
 * wakes, so the job ends (dist_abort), naming what was wanted */
static void *need(const struct p2p_experts *m, void *p, const char *what)
{
	if (p)
		return p;
	error("rank %d: out of memory for %s; aborting the job", peer_rank(m, m->q), what);
	dist_abort();
}

/* Backend memory of at least n bytes in *p (its contents go) */
static void be_grow(const struct p2p_experts *m, char **p, size_t *cap, size_t n)
{
	if (n <= *cap && *p)
		return;
	if (*p)
		m->be->free(*p);
	*cap = n > *cap ? n : *cap;
	*p = need(m, m->be->alloc(*cap ? *cap : 1), "the other ranks' rows of its experts");
}

static void host_grow(char **p, size_t *cap, size_t n)
{
	if (n <= *cap && *p)
		return;
	free(*p);
	*cap = n > *cap ? n : *cap;
	*p = xmalloc(*cap ? *cap : 1);
}

/* Row `row` of buffer f of R (the member's own buffers, which it lends
 * the pass: read by the sends, written by the receives) */
static char *row_of(const struct moe_rows *R, int f, size_t row, size_t width)
{
	struct moe_rows r = *R;
	return (char *)*ep_field(&r, f) + row * width;
}

/* Buffer f of member k's block at this owner */
static char *block_field(const struct block *b, const struct moe_dims *d, int f)
{
	return (ep_is_kept(f) ? b->e->mem : b->mem) + ep_offset(d, b->e->rows, f);
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
	m->acc = xrealloc(m->acc, (size_t)(m->n_acc + 1) * sizeof(*m->acc));
	float *buf = need(m, m->be->alloc(st_mult(st_mult((size_t)P, per), sizeof(float))),
			  "the experts' gradient accumulators");
	m->acc[m->n_acc] = (struct acc){key, n, buf};
	return m->acc[m->n_acc++].buf + (size_t)k * per;
}

/* Where this member's rows for owner k travel from and to: R itself on a
 * host backend, else their host copies in m->own (at *off, advanced) */
static char *own_wire(struct p2p_experts *m, const struct moe_rows *R, int f, size_t lo,
		      size_t rows, size_t *off)
{
	size_t w = ep_field_width(R->d, f);
	if (m->host)
		return row_of(R, f, lo, w);
	char *p = m->own + *off;
	*off += rows * w;
	return p;
}

static void p2p_run(const struct moe_ep *ep, int pass, const struct moe_rows *R, const float *fcw,
		    const float *fcprojw)
{
	struct p2p_experts *m =
		(struct p2p_experts *)((char *)ep - offsetof(struct p2p_experts, ep));
	const struct moe_dims *d = R->d;
	const struct backend *be = m->be;
	int P = m->x.P, E = m->E, q = m->q, e0 = m->e0, G = E / P, k, nr;
	struct ep_plan pl = ep_plan_of(pass);
	size_t De = (size_t)d->De, C = (size_t)d->C, in_b, out_b, off;
	size_t cs = ep_head_ints(E); /* counts, key, pass, work */
	uint64_t key = (uint64_t)(uintptr_t)R->xd;
	if (d->E != E)
		bug("an expert pass over %d experts in a group made for %d", d->E, E);
	if (m->aborted)
		return;

	/* 1. the counts, with the key of this member's rows and its work */
	int32_t *mine = m->counts + (size_t)q * cs;
	ep_head_pack(mine, E, R->count, key, pass, &m->work);
	nr = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		size_t cb = cs * sizeof(int32_t);
		m->req[nr++] = p2p_irecv(m->ch, m->counts + (size_t)k * cs, cb, peer_rank(m, k),
					 TAG_COUNT);
		m->req[nr++] = p2p_isend(m->ch, mine, cb, peer_rank(m, k), TAG_COUNT);
	}
	ep_wait(m, nr, "the other experts' owners' row counts");
	for (k = 0; k < P; k++) {
		char me[160], them[160];
		if (k != q && !ep_head_agrees(m->counts + (size_t)k * cs, E, pass, &m->work, me,
					      them, sizeof(me))) {
			/* the peers wait in this exchange: the job ends */
			error("rank %d (piece %d): its expert-parallel group disagrees on the work: "
			      "this rank (replica %d) runs %s, rank %d (replica %d) %s; a "
			      "schedule bug, please report it; aborting the job",
			      peer_rank(m, q), m->work.piece, m->r, me, peer_rank(m, k), m->g0 + k,
			      them);
			dist_abort();
		}
	}

	/* the host copies of this member's travelling rows (device backends) */
	if (!m->host) {
		size_t bytes = 0;
		for (k = 0; k < P; k++) {
			size_t lo, rows;
			ep_own_range(R->count, G, k, &lo, &rows);
			if (k != q)
				bytes += ep_block_bytes(&pl, d, rows, &in_b, &out_b);
		}
		host_grow(&m->own, &m->own_cap, bytes);
	}

	/* 2. blocks out and in; this member's own rows meanwhile */
	nr = 0;
	off = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		struct block *b = &m->blk[k];
		const int32_t *ck = m->counts + (size_t)k * cs;
		b->e = ep_store_get(&m->kept, be, d, pass, k, ep_head_key(ck, E), ck, e0, G);
		if (!b->e && pass != MOE_PASS_FORWARD)
			bug("replica %d's rows of a backward were never forwarded to replica %d",
			    m->g0 + k, m->r);
		need(m, b->e, "the other ranks' rows it keeps for its experts");
		size_t brows = b->e->rows;
		if (pass != MOE_PASS_FORWARD && brows != (size_t)(ck[m->e1] - ck[e0]))
			bug("replica %d's rows changed from its forward to its backward",
			    m->g0 + k);
		be_grow(m, &b->mem, &b->cap, ep_scratch_bytes(d, brows));
		if (!m->host)
			host_grow(&b->wire, &b->wcap, ep_block_bytes(&pl, d, brows, &in_b, &out_b));
		/* owner k's experts' rows of R, one message per input */
		size_t lo, rows, boff = 0;
		ep_own_range(R->count, G, k, &lo, &rows);
		for (int i = 0; i < pl.n_in; i++) {
			size_t w = ep_field_width(d, pl.in[i]);
			char *src = own_wire(m, R, pl.in[i], lo, rows, &off);
			char *dst = m->host ? block_field(b, d, pl.in[i]) : b->wire + boff;
			if (brows)
				m->req[nr++] = p2p_irecv(m->ch, dst, brows * w, peer_rank(m, k),
							 TAG_IN);
			if (rows) {
				if (!m->host)
					be->to_host(src, row_of(R, pl.in[i], lo, w), rows * w);
				m->req[nr++] = p2p_isend(m->ch, src, rows * w, peer_rank(m, k),
							 TAG_IN);
			}
			boff += brows * w;
		}
		for (int i = 0; i < pl.n_out; i++) /* the outputs' copies come after */
			own_wire(m, R, pl.out[i], lo, rows, &off);
	}
	moe_experts(be, pass, R, moe_expert_weights(d, fcw, 0, e0),
		    moe_expert_weights(d, fcprojw, 1, e0), e0, m->e1);
	ep_wait(m, nr, "the rows of this rank's experts");

	/* 3. every other member's block, and the outputs back */
	nr = 0;
	off = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		struct block *b = &m->blk[k];
		size_t brows = b->e->rows, boff = 0;
		struct moe_rows br = {.d = d, .count = b->e->cnt};
		for (int f = 0; f < EP_NFIELD; f++)
			*ep_field(&br, f) = block_field(b, d, f);
		ep_block_bytes(&pl, d, brows, &in_b, &out_b);
		for (int i = 0; i < pl.n_in && !m->host; i++) {
			size_t bytes = brows * ep_field_width(d, pl.in[i]);
			if (bytes)
				be->to_device(block_field(b, d, pl.in[i]), b->wire + boff, bytes);
			boff += bytes;
		}
		if (R->gfcw)
			br.gfcw = acc_of(m, R->gfcw, 2 * De * C, k);
		if (R->gfcprojw)
			br.gfcprojw = acc_of(m, R->gfcprojw, C * De, k);
		if (brows)
			moe_experts(be, pass, &br, moe_expert_weights(d, fcw, 0, e0),
				    moe_expert_weights(d, fcprojw, 1, e0), 0, G);
		size_t lo, rows, woff = in_b;
		ep_own_range(R->count, G, k, &lo, &rows);
		for (int i = 0; i < pl.n_in; i++) /* the inputs' copies came first */
			own_wire(m, R, pl.in[i], lo, rows, &off);
		for (int i = 0; i < pl.n_out; i++) {
			size_t w = ep_field_width(d, pl.out[i]);
			char *dst = own_wire(m, R, pl.out[i], lo, rows, &off);
			char *src = m->host ? block_field(b, d, pl.out[i]) : b->wire + woff;
			if (!m->host && brows)
				be->to_host(src, block_field(b, d, pl.out[i]), brows * w);
			if (rows)
				m->req[nr++] = p2p_irecv(m->ch, dst, rows * w, peer_rank(m, k),
							 TAG_OUT);
			if (brows)
				m->req[nr++] = p2p_isend(m->ch, src, brows * w, peer_rank(m, k),
							 TAG_OUT);
			woff += brows * w;
		}
		if (ep_releases(pass, R->gfcw != NULL))
			b->e->used = 0; /* its memory stays for the next forward */
	}
	ep_wait(m, nr, "the outputs of the other ranks' experts");
	if (m->host)
		return;
	/* the outputs of this member's rows into place */
	off = 0;
	for (k = 0; k < P; k++) {
		if (k == q)
			continue;
		size_t lo, rows;
		ep_own_range(R->count, G, k, &lo, &rows);
		for (int i = 0; i < pl.n_in; i++)
			own_wire(m, R, pl.in[i], lo, rows, &off);
		for (int i = 0; i < pl.n_out; i++) {
			size_t w = ep_field_width(d, pl.out[i]);
			char *src = own_wire(m, R, pl.out[i], lo, rows, &off);
			if (rows)
				be->to_device(row_of(R, pl.out[i], lo, w), src, rows * w);
		}
	}
}

/* Member k's slice of every accumulator of g's arena goes to k, and the
 * owners' slices of this member's into g; one tensor at a time (the same
 * order on every member: the accumulators were made in the same order). */
static void p2p_deliver(struct experts *x, int r, int s, float *g, size_t n)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	const struct backend *be = m->be;
	int P = x->P, G = m->E / P;
	if (r != m->r || s < 0 || s >= m->P_pieces || m->piece_stage[s] != m->s)
		bug("rank of replica %d stage %d delivers as replica %d piece %d", m->r, m->s, r,
		    s);
	for (int i = 0; i < m->n_acc; i++) {
		struct acc *a = &m->acc[i];
		if (a->key < g || a->key >= g + n)
			continue; /* the other step's arena */
		size_t per = (size_t)G * a->n, at = (size_t)(a->key - g), all = (size_t)P * per;
		float *out = a->buf, *in = g + at;
		if (!m->host) {
			if (2 * all > m->gwire_cap) {
				free(m->gwire);
				m->gwire = xmalloc(st_mult(2 * all, sizeof(float)));
				m->gwire_cap = 2 * all;
			}
			out = m->gwire;
			in = m->gwire + all;
			be->to_host(out, a->buf, all * sizeof(float));
		}
		int nr = 0;
		for (int k = 0; k < P; k++) {
			if (k == m->q)
				continue;
			m->req[nr++] = p2p_irecv(m->ch, in + (size_t)k * per, per * sizeof(float),
						 peer_rank(m, k), TAG_GRAD);
			m->req[nr++] = p2p_isend(m->ch, out + (size_t)k * per, per * sizeof(float),
						 peer_rank(m, k), TAG_GRAD);
		}
		ep_wait(m, nr, "the weight gradients of this rank's rows");
		if (!m->host)
			for (int k = 0; k < P; k++)
				if (k != m->q)
					be->to_device(g + at + (size_t)k * per,
						      in + (size_t)k * per, per * sizeof(float));
		be->zero(a->buf, all * sizeof(float));
	}
}

static const struct moe_ep *p2p_member(struct experts *x, int r, int s)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	if (r != m->r || s < 0 || s >= m->P_pieces || m->piece_stage[s] != m->s)
		bug("rank of replica %d stage %d asked for replica %d piece %d", m->r, m->s, r, s);
	return &m->ep;
}

static void p2p_work(struct experts *x, int r, int s, const struct ep_work *w)
{
	p2p_member(x, r, s); /* checks r and s */
	((struct p2p_experts *)x)->work = *w;
}

static void p2p_abort(struct experts *x) { ((struct p2p_experts *)x)->aborted = 1; }

static void p2p_destroy(struct experts *x)
{
	struct p2p_experts *m = (struct p2p_experts *)x;
	if (!m)
		return;
	p2p_close(m->ch);
	for (int i = 0; i < m->n_acc; i++)
		m->be->free(m->acc[i].buf);
	free(m->acc);
	for (int k = 0; k < x->P; k++) {
		free(m->blk[k].wire);
		if (m->blk[k].mem)
			m->be->free(m->blk[k].mem);
	}
	free(m->blk);
	ep_store_free(&m->kept, m->be);
	free(m->own);
	free(m->gwire);
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
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_experts *m = xcalloc(1, sizeof(*m));
	int S = pc->S;
	m->x = (struct experts){.name = p2p_name(ch), .N = N, .P = P, .S = pc->P,
				.member = p2p_member, .work = p2p_work,
				.abort = p2p_abort, .deliver = p2p_deliver,
				.destroy = p2p_destroy};
	m->ep.experts = p2p_run;
	m->ep.waited = &m->waited;
	m->be = be;
	m->host = dist_backend_is_host(be);
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
	m->counts = xcalloc(st_mult((size_t)P, ep_head_ints(E)), sizeof(int32_t));
	m->blk = xcalloc((size_t)P, sizeof(*m->blk));
	m->req = xcalloc((size_t)16 * P, sizeof(*m->req));
	return &m->x;
}
