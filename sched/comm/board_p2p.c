/* board_p2p.c - the step-finish board between processes, one stage each,
 * over the point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * Per step every rank sends its per-tensor sums of squares to every other
 * rank (p2p_isend, a few hundred bytes) and receives theirs into one array
 * in global order; stage 0 and the last stage also swap their raw tied
 * embedding parts. Everything is nonblocking: post and tied_post only start
 * the messages, and the executor waits for them when it completes the step,
 * lazily, as it does with threads. The messages of step i of the segment
 * carry tag (i mod the wrap) * 2V + 2 * chunk + (0: sums, 1: tied part) on
 * a channel of the board's own; messages with the same source and tag
 * arrive in order, and every rank posts its steps in order, so tags may
 * wrap.
 *
 * The board's pipeline has P model pieces on S stages (pieces.h; P = S
 * unless stages hold several chunks): piece q is posted by stage
 * stage[q], which is rank base + stage[q], and its sums go to the other
 * S-1 ranks with the piece's chunk in the tag (two pieces of one rank
 * never share a tag). A process waits for the pieces of the other ranks
 * only; its own pieces' sums are copied in place. The tied parts go
 * between the ranks of piece 0 and piece P-1, or stay in the process when
 * one stage holds both (zb-v). Data-parallel replicas (replica.h) run one
 * pipeline each on their own ranks, each with a board of its own; their
 * messages never meet (different rank pairs).
 *
 * Messages are small and rank count moderate (V(S-1) sums messages per rank
 * and step); a very deep pipeline would rather pass one running sum along
 * the stages, which gives the same bits, at the price of S hops.
 */
#include "board.h"

#include "../../io/util.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "p2p.h"
#include "pieces.h"

struct entry {
	double *sumsq;            /* [total], global order */
	struct p2p_op **req;      /* [nreq]: receives of the other ranks' pieces, sends
				   * of this rank's (S-1 each), tied send, tied recv */
	int posted, done;         /* this rank's pieces that posted, that are done */
	void *tied_out, *tied_in; /* host (or backend when it is host memory) */
	float *tied_dev;          /* backend copy of tied_in when staging */
	float *tied_local[2];     /* backend copies of piece 0's and piece P-1's parts
				   * when one rank holds both */
};

struct p2p_board {
	struct board b;
	const struct backend *be;
	int rank, host;           /* rank: this process's stage */
	int base;                 /* world rank of stage 0 */
	int P, V, S;              /* pieces, chunks per stage, stages (pieces.h) */
	int *stage, *chunk;       /* [P] */
	int n_mine, n_other;      /* pieces this rank holds, pieces the others do */
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

static int nreq(const struct p2p_board *m) { return m->n_other + m->n_mine * (m->S - 1) + 2; }

static struct entry *entry(struct p2p_board *m, long step, int *index)
{
	long i = step - m->first_step - 1;
	if (i < 0 || i >= m->n_steps)
		bug("step %ld outside the segment (%ld, %ld]", step, m->first_step,
		    m->first_step + m->n_steps);
	*index = (int)i;
	return &m->e[i];
}

static int tag(const struct p2p_board *m, int index, int chunk, int tied)
{
	return (int)((index % m->tag_steps) * 2 * m->V + 2 * chunk + tied);
}

/* The piece at the other end of piece q's tied part: P-1 for 0, 0 for P-1. */
static int tied_piece(const struct p2p_board *m, int q) { return q == 0 ? m->P - 1 : 0; }

static int tied_local(const struct p2p_board *m, int q)
{
	return m->stage[tied_piece(m, q)] == m->rank;
}

static void check_piece(const struct p2p_board *m, int q, const char *what)
{
	if (q < 0 || q >= m->P || m->stage[q] != m->rank)
		bug("rank %d (stage %d) %s as piece %d, which it does not hold", m->base + m->rank,
		    m->rank, what, q);
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
	check_piece(m, s, "posts a tied part");
	if (tied_local(m, s)) {
		/* the other end is this process's: a copy it takes in tied_wait */
		float **slot = &e->tied_local[s == 0 ? 0 : 1];
		if (!*slot && !(*slot = tied_dev_buffer(m)))
			return error("rank %d (stage %d): cannot allocate the tied embedding's "
				     "gradient part of %zu floats", m->base + m->rank, m->rank,
				     m->tied_n);
		m->be->copy(*slot, part, m->tied_n * sizeof(float));
		return 0;
	}
	int n = nreq(m), peer = m->base + m->stage[tied_piece(m, s)];
	e->tied_out = tied_buffer(m);
	e->tied_in = e->tied_out ? tied_buffer(m) : NULL;
	if (!e->tied_in)
		return error("rank %d (stage %d): cannot allocate the tied embedding's gradient part "
			     "of %zu floats", m->base + m->rank, m->rank, m->tied_n);
	if (m->host)
		m->be->copy(e->tied_out, part, m->tied_n * sizeof(float));
	else
		m->be->to_host(e->tied_out, part, m->tied_n * sizeof(float));
	size_t bytes = m->tied_n * sizeof(float);
	e->req[n - 1] = p2p_irecv(m->ch, e->tied_in, bytes, peer, tag(m, i, 0, 1));
	e->req[n - 2] = p2p_isend(m->ch, e->tied_out, bytes, peer, tag(m, i, 0, 1));
	return 0;
}

static const float *mb_tied_wait(struct board *b, int s, long step, double *waited)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	check_piece(m, s, "waits for a tied part");
	if (tied_local(m, s)) {
		const float *other = e->tied_local[s == 0 ? 1 : 0];
		if (!other)
			bug("piece %d waits for the tied part of step %ld that piece %d of the same "
			    "stage has not posted", s, step, tied_piece(m, s));
		*waited = 0.0;
		return other;
	}
	int peer = m->base + m->stage[tied_piece(m, s)];
	if (!e->tied_in)
		bug("stage %d waits for a tied part of step %ld it did not post", m->rank, step);
	double t0 = now_sec();
	p2p_wait(m->ch, &e->req[nreq(m) - 1], 1, m->timeout, m->rank,
		 "the tied embedding's gradient of step %ld from rank %d", step, peer);
	*waited = now_sec() - t0;
	if (m->host)
		return e->tied_in;
	if (!e->tied_dev) {
		if (!(e->tied_dev = tied_dev_buffer(m))) {
			error("rank %d (stage %d): cannot allocate the tied embedding's gradient "
			      "part of %zu floats on backend '%s'", m->base + m->rank, m->rank,
			      m->tied_n, m->be->name);
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
	check_piece(m, s, "posts sums");
	memcpy(e->sumsq + m->offset[s], sumsq, (size_t)m->n_tensors[s] * sizeof(double));
	if (!e->posted) {
		/* the first of this rank's pieces: receive the other ranks' */
		for (int q = 0, k = 0; q < m->P; q++)
			if (m->stage[q] != m->rank)
				e->req[k++] = p2p_irecv(m->ch, e->sumsq + m->offset[q],
							(size_t)m->n_tensors[q] * sizeof(double),
							m->base + m->stage[q], tag(m, i, m->chunk[q], 0));
	}
	int k = m->n_other + e->posted * (m->S - 1);
	for (int r = 0; r < m->S; r++)
		if (r != m->rank)
			e->req[k++] = p2p_isend(m->ch, e->sumsq + m->offset[s],
						(size_t)m->n_tensors[s] * sizeof(double), m->base + r,
						tag(m, i, m->chunk[s], 0));
	e->posted++;
	m->hi = i + 1;
}

static const double *mb_wait(struct board *b, int s, long step, double *waited)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	check_piece(m, s, "waits for sums");
	if (e->posted < m->n_mine)
		bug("piece %d waits for step %ld before this stage's %d pieces posted it", s, step,
		    m->n_mine);
	double t0 = now_sec();
	p2p_wait(m->ch, e->req, m->n_other, m->timeout, m->rank,
		 "the gradient norms of step %ld from the other stages (ranks %d to %d)", step,
		 m->base, m->base + m->S - 1);
	*waited = now_sec() - t0;
	return e->sumsq;
}

static void free_tied(struct p2p_board *m, struct entry *e)
{
	tied_free(m, e->tied_out);
	tied_free(m, e->tied_in);
	tied_dev_free(m, e->tied_dev);
	tied_dev_free(m, e->tied_local[0]);
	tied_dev_free(m, e->tied_local[1]);
	e->tied_out = e->tied_in = NULL;
	e->tied_dev = e->tied_local[0] = e->tied_local[1] = NULL;
}

static void mb_done(struct board *b, int s, long step)
{
	struct p2p_board *m = (struct p2p_board *)b;
	int i;
	struct entry *e = entry(m, step, &i);
	check_piece(m, s, "is done");
	if (++e->done < m->n_mine)
		return; /* the step's data stays until every piece of the rank applied it */
	/* the receivers have posted their receives by now, so these finish,
	 * unless a peer is stopped or gone: then the timeout names it */
	p2p_wait(m->ch, e->req, nreq(m), m->timeout, m->rank,
		 "the other stages to take the gradient norms of step %ld (ranks %d to %d)", step,
		 m->base, m->base + m->S - 1);
	free_tied(m, e);
	while (m->lo < m->hi && m->e[m->lo].done >= m->n_mine)
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
			 m->base + m->S - 1);
		free_tied(m, e);
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
	free(m->stage);
	free(m->chunk);
	free(m);
}

struct board *board_p2p(const struct dist *d, const struct backend *be, const struct pieces *pc,
			int s, int base, const int *n_tensors, size_t tied_n, double timeout)
{
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_board *m = xcalloc(1, sizeof(*m));
	int P = pc->P;
	m->be = be;
	m->rank = s;
	m->base = base;
	m->P = P;
	m->V = pc->V;
	m->S = pc->S;
	m->stage = xmalloc((size_t)P * sizeof(int));
	m->chunk = xmalloc((size_t)P * sizeof(int));
	memcpy(m->stage, pc->stage, (size_t)P * sizeof(int));
	memcpy(m->chunk, pc->chunk, (size_t)P * sizeof(int));
	m->n_mine = pieces_on(pc, s);
	m->n_other = P - m->n_mine;
	m->timeout = timeout;
	m->host = dist_backend_is_host(be);
	m->tied_n = tied_n;
	m->n_tensors = xcalloc((size_t)P, sizeof(int));
	m->offset = xcalloc((size_t)P, sizeof(size_t));
	size_t total = 0;
	for (int q = 0; q < P; q++) {
		m->n_tensors[q] = n_tensors[q];
		m->offset[q] = total;
		total += (size_t)n_tensors[q];
	}
	m->ch = ch;
	m->tag_steps = MAX(1, (p2p_tag_limit(ch) - 1) / (2 * pc->V));
	m->b = (struct board){.name = p2p_name(ch), .S = P, .n_tensors = m->n_tensors, .total = total,
			      .begin = mb_begin, .tied_post = mb_tied_post,
			      .tied_wait = mb_tied_wait, .post = mb_post, .wait = mb_wait,
			      .done = mb_done, .poll = mb_poll, .end = mb_end,
			      .destroy = mb_destroy};
	return &m->b;
}
