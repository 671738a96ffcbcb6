/* board_p2p.c - the step-finish board between processes, one stage each,
 * over the point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * Per step every rank sends its per-tensor sums of squares to every other
 * rank (p2p_isend, a few hundred bytes) and receives theirs into one array
 * in global order; stage 0 and the last stage also swap their raw tied
 * embedding parts. Everything is nonblocking: post and tied_post only start
 * the messages, and the executor waits for them when it completes the step,
 * lazily, as it does with threads. The messages of step i of the segment
 * carry tag 2i (sums) or 2i+1 (tied part) on a channel of the board's own;
 * messages with the same source and tag arrive in order, and every
 * rank posts its steps in order, so tags may wrap.
 *
 * Stage q of the board's pipeline is rank base + q: data-parallel replicas
 * (replica.h) run one pipeline each on their own ranks, each with a board of
 * its own; their messages never meet (different rank pairs).
 *
 * Messages are small and rank count moderate (S-1 sums messages per rank
 * and step); a very deep pipeline would rather pass one running sum along
 * the stages, which gives the same bits, at the price of S hops.
 */
#include "board.h"

#include "../../io/util.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "p2p.h"

struct entry {
	double *sumsq;            /* [total], global order */
	struct p2p_op **req;      /* [2(S-1) + 2]: receives, sends, tied send, tied recv */
	int posted, done;
	void *tied_out, *tied_in; /* host (or backend when it is host memory) */
	float *tied_dev;          /* backend copy of tied_in when staging */
};

struct p2p_board {
	struct board b;
	const struct backend *be;
	int rank, host;           /* rank: this process's stage */
	int base;                 /* world rank of stage 0 */
	double timeout;           /* seconds a wait may take (pipeline.timeout) */
	int *n_tensors;
	size_t *offset;
	size_t tied_n;
	struct p2p *ch;
	long tag_steps;           /* steps before the tags wrap */
	/* tied buffers of finished steps, reused (two steps in flight, two host
	 * buffers and one backend copy each): no allocation per step */
	void *pool[4];
	float *dev_pool[2];
	int npool, ndev_pool;
	struct entry *e;
	long first_step;
	int n_steps;
	int lo, hi;               /* entries [lo, hi) posted and not done */
};

static int nreq(const struct p2p_board *m) { return 2 * (m->b.S - 1) + 2; }

static struct entry *entry(struct p2p_board *m, long step, int *index)
{
	long i = step - m->first_step - 1;
	if (i < 0 || i >= m->n_steps)
		bug("step %ld outside the segment (%ld, %ld]", step, m->first_step,
		    m->first_step + m->n_steps);
	*index = (int)i;
	return &m->e[i];
}

static int tag(const struct p2p_board *m, int index, int tied)
{
	return (int)(2 * (index % m->tag_steps) + tied);
}

static int tied_peer(const struct p2p_board *m)
{
	return m->base + (m->rank == 0 ? m->b.S - 1 : 0);
}

static void mb_begin(struct board *b, long first_step, int n_steps)
{
	struct p2p_board *m = (struct p2p_board *)b;
	m->first_step = first_step;
	m->n_steps = n_steps;
	m->lo = m->hi = 0;
	m->e = xcalloc((size_t)n_steps, sizeof(*m->e));
	for (int i = 0; i < n_steps; i++) {
		m->e[i].sumsq = xcalloc(b->total + 1, sizeof(double));
		m->e[i].req = xcalloc((size_t)nreq(m), sizeof(struct p2p_op *));
	}
}

static void *tied_buffer(struct p2p_board *m)
{
	if (m->npool)
		return m->pool[--m->npool];
	size_t bytes = m->tied_n * sizeof(float);
	return m->host ? m->be->alloc(bytes) : xmalloc(bytes);
}

static void tied_free(struct p2p_board *m, void *p)
{
	if (!p)
		return;
	if (m->npool < (int)ARRAY_SIZE(m->pool))
		m->pool[m->npool++] = p;
	else if (m->host)
		m->be->free(p);
	else
		free(p);
}

static float *tied_dev_buffer(struct p2p_board *m)
{
	if (m->ndev_pool)
		return m->dev_pool[--m->ndev_pool];
	return m->be->alloc(m->tied_n * sizeof(float));
}

static void tied_dev_free(struct p2p_board *m, float *p)
{
	if (!p)
		return;
	if (m->ndev_pool < (int)ARRAY_SIZE(m->dev_pool))
		m->dev_pool[m->ndev_pool++] = p;
	else
		m->be->free(p);
}

static int mb_tied_post(struct board *b, int s, long step, const float *part)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	int n = nreq(m), peer = tied_peer(m);
	e->tied_out = tied_buffer(m);
	e->tied_in = e->tied_out ? tied_buffer(m) : NULL;
	if (!e->tied_in)
		return error("rank %d (stage %d): cannot allocate the tied embedding's gradient part "
			     "of %zu floats", m->base + m->rank, s, m->tied_n);
	if (m->host)
		m->be->copy(e->tied_out, part, m->tied_n * sizeof(float));
	else
		m->be->to_host(e->tied_out, part, m->tied_n * sizeof(float));
	size_t bytes = m->tied_n * sizeof(float);
	e->req[n - 1] = p2p_irecv(m->ch, e->tied_in, bytes, peer, tag(m, i, 1));
	e->req[n - 2] = p2p_isend(m->ch, e->tied_out, bytes, peer, tag(m, i, 1));
	return 0;
}

static const float *mb_tied_wait(struct board *b, int s, long step, double *waited)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	if (!e->tied_in)
		bug("stage %d waits for a tied part of step %ld it did not post", s,
		    step);
	double t0 = now_sec();
	p2p_wait(m->ch, &e->req[nreq(m) - 1], 1, m->timeout, s,
		 "the tied embedding's gradient of step %ld from rank %d", step, tied_peer(m));
	*waited = now_sec() - t0;
	if (m->host)
		return e->tied_in;
	if (!e->tied_dev) {
		if (!(e->tied_dev = tied_dev_buffer(m))) {
			error("rank %d (stage %d): cannot allocate the tied embedding's gradient "
			      "part of %zu floats on backend '%s'", m->base + m->rank, s, m->tied_n,
			      m->be->name);
			return NULL;
		}
		m->be->to_device(e->tied_dev, e->tied_in, m->tied_n * sizeof(float));
	}
	return e->tied_dev;
}

static void mb_post(struct board *b, int s, long step, const double *sumsq)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	int S = b->S, k = 0;
	memcpy(e->sumsq + m->offset[s], sumsq, (size_t)m->n_tensors[s] * sizeof(double));
	for (int r = 0; r < S; r++) {
		if (r == m->rank)
			continue;
		e->req[k] = p2p_irecv(m->ch, e->sumsq + m->offset[r],
				      (size_t)m->n_tensors[r] * sizeof(double), m->base + r,
				      tag(m, i, 0));
		e->req[S - 1 + k] = p2p_isend(m->ch, e->sumsq + m->offset[s],
					      (size_t)m->n_tensors[s] * sizeof(double),
					      m->base + r, tag(m, i, 0));
		k++;
	}
	e->posted = 1;
	m->hi = i + 1;
}

static const double *mb_wait(struct board *b, int s, long step, double *waited)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	if (!e->posted)
		bug("stage %d waits for step %ld before posting it", s, step);
	double t0 = now_sec();
	p2p_wait(m->ch, e->req, b->S - 1, m->timeout, s,
		 "the gradient norms of step %ld from the other stages (ranks %d to %d)", step,
		 m->base, m->base + b->S - 1);
	*waited = now_sec() - t0;
	return e->sumsq;
}

static void mb_done(struct board *b, int s, long step)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	/* the receivers have posted their receives by now, so these finish,
	 * unless a peer is stopped or gone: then the timeout names it */
	p2p_wait(m->ch, e->req, nreq(m), m->timeout, s,
		 "the other stages to take the gradient norms of step %ld (ranks %d to %d)", step,
		 m->base, m->base + b->S - 1);
	tied_free(m, e->tied_out);
	tied_free(m, e->tied_in);
	tied_dev_free(m, e->tied_dev);
	e->tied_out = e->tied_in = NULL;
	e->tied_dev = NULL;
	e->done = 1;
	while (m->lo < m->hi && m->e[m->lo].done)
		m->lo++;
}

static void mb_poll(struct board *b)
{
	struct p2p_board *m = (struct p2p_board *)b;
	for (int i = m->lo; i < m->hi; i++)
		p2p_test(m->ch, m->e[i].req, nreq(m));
}

static void mb_end(struct board *b)
{
	struct p2p_board *m = (struct p2p_board *)b;
	for (int i = 0; i < m->n_steps; i++) {
		struct entry *e = &m->e[i];
		p2p_wait(m->ch, e->req, nreq(m), m->timeout, m->rank,
			 "the other stages to take the last gradient norms (ranks %d to %d)", m->base,
			 m->base + b->S - 1);
		tied_free(m, e->tied_out);
		tied_free(m, e->tied_in);
		tied_dev_free(m, e->tied_dev);
		free(e->sumsq);
		free(e->req);
	}
	free(m->e);
	m->e = NULL;
	m->n_steps = 0;
}

static void mb_destroy(struct board *b)
{
	struct p2p_board *m = (struct p2p_board *)b;
	if (m->e)
		mb_end(b);
	for (int i = 0; i < m->npool; i++) {
		if (m->host)
			m->be->free(m->pool[i]);
		else
			free(m->pool[i]);
	}
	for (int i = 0; i < m->ndev_pool; i++)
		m->be->free(m->dev_pool[i]);
	p2p_close(m->ch);
	free(m->n_tensors);
	free(m->offset);
	free(m);
}

struct board *board_p2p(const struct dist *d, const struct backend *be, int S, int s, int base,
			const int *n_tensors, size_t tied_n, double timeout)
{
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_board *m = xcalloc(1, sizeof(*m));
	m->be = be;
	m->rank = s;
	m->base = base;
	m->timeout = timeout;
	m->host = dist_backend_is_host(be);
	m->tied_n = tied_n;
	m->n_tensors = xcalloc((size_t)S, sizeof(int));
	m->offset = xcalloc((size_t)S, sizeof(size_t));
	size_t total = 0;
	for (int s = 0; s < S; s++) {
		m->n_tensors[s] = n_tensors[s];
		m->offset[s] = total;
		total += (size_t)n_tensors[s];
	}
	m->ch = ch;
	m->tag_steps = MAX(1, (p2p_tag_limit(ch) - 1) / 2);
	m->b = (struct board){.name = p2p_name(ch), .S = S, .n_tensors = m->n_tensors, .total = total,
			      .begin = mb_begin, .tied_post = mb_tied_post,
			      .tied_wait = mb_tied_wait, .post = mb_post, .wait = mb_wait,
			      .done = mb_done, .poll = mb_poll, .end = mb_end,
			      .destroy = mb_destroy};
	return &m->b;
}
