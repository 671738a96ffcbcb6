/* transport_p2p.c - activations and gradients between processes, over the
 * point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * Messages address model pieces (pieces.h): piece q of replica r is
 * global piece r*P + q, held by rank r*S + stage[q]. A send is a
 * p2p_isend with tag (2*mb + kind)*V + the receiving piece's chunk
 * (wrapping below the channel's tag limit: the messages for one piece of
 * one kind come from one piece in ascending mb, and messages with the
 * same source and tag arrive in order); its buffer stays out of the pool
 * until the send completes, so a send never blocks. A handoff between two
 * pieces of the same stage (zb-v's turn, interleaved with one stage) never
 * leaves the process: the buffer itself waits in a local queue. A receive waits for its message by
 * (source, tag); the seconds it waits are the stage's waiting time. A
 * receive still waiting after the timeout (pipeline.timeout) names the
 * rank, the stage, the micro-batch and the tensor it waits for, and aborts
 * the job: a rank that is stuck (or stopped) shows up as a message, not as
 * a hang.
 *
 * With a host backend (cpu) the carrier reads and writes the backend
 * buffers themselves; otherwise messages are staged through host buffers
 * (no assumption that MPI or a socket understands device pointers).
 *
 * One thread per process calls the transport (the stage runs on the main
 * thread), so there is no locking here.
 */
#include "transport.h"

#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "dist.h"
#include "p2p.h"
#include "handoff.h"
#include "pieces.h"

struct pending {
	struct p2p_op *op;
	void *buf;
	int staged;               /* buf is a host staging buffer */
};

struct pool {
	void **free;
	int n_free, cap;
	void **all;
	int n_all;
};

struct p2p_tp {
	struct transport t;
	const struct backend *be;
	int G, rank, host;        /* G: global pieces, P per replica times N */
	int P, V, stages;         /* pieces and stages per pipeline, chunks per stage */
	int *piece_stage;         /* [P] pieces.h */
	int *piece_chunk;         /* [P] */
	size_t n;                 /* bytes per message */
	struct p2p *ch;
	int tag_mb;               /* micro-batches before the tags wrap */
	struct handoffs local;    /* between two pieces of this process (handoff.h) */
	double timeout;           /* seconds a receive may wait; 0 = forever */
	struct pool dev, stage;   /* backend buffers, host staging buffers */
	struct pending *pend;
	int n_pend, cap_pend;
};

static void *pool_get(struct p2p_tp *m, struct pool *p, int host_mem)
{
	if (p->n_free)
		return p->free[--p->n_free];
	size_t bytes = m->n;
	void *b = host_mem ? xmalloc(bytes) : m->be->alloc(bytes);
	if (!b) {
		error("rank %d: cannot allocate a %zu-byte message buffer on backend '%s'",
		      m->rank, bytes, m->be->name);
		return NULL;
	}
	p->all = xrealloc(p->all, sizeof(void *) * (size_t)(p->n_all + 1));
	p->all[p->n_all++] = b;
	return b;
}

static void pool_put(struct pool *p, void *b)
{
	if (p->n_free == p->cap) {
		p->cap = p->cap ? 2 * p->cap : 16;
		p->free = xrealloc(p->free, sizeof(void *) * (size_t)p->cap);
	}
	p->free[p->n_free++] = b;
}

static void pool_free(struct p2p_tp *m, struct pool *p, int host_mem)
{
	for (int i = 0; i < p->n_all; i++) {
		if (host_mem)
			free(p->all[i]);
		else
			m->be->free(p->all[i]);
	}
	free(p->all);
	free(p->free);
}

/* Return the buffers of completed sends to their pools. */
static void reap(struct p2p_tp *m)
{
	int j = 0;
	for (int i = 0; i < m->n_pend; i++) {
		if (p2p_test(m->ch, &m->pend[i].op, 1))
			pool_put(m->pend[i].staged ? &m->stage : &m->dev, m->pend[i].buf);
		else
			m->pend[j++] = m->pend[i];
	}
	m->n_pend = j;
}

/* The rank holding global piece g. */
static int rank_of(const struct p2p_tp *m, int g) { return g / m->P * m->stages + m->piece_stage[g % m->P]; }

static int tag_of(const struct p2p_tp *m, int to, int kind, int mb)
{
	return (2 * (mb % m->tag_mb) + kind) * m->V + m->piece_chunk[to % m->P];
}

static void *p2p_buffer(struct transport *t, int from, size_t n)
{
	struct p2p_tp *m = (struct p2p_tp *)t;
	if (n > m->n)
		bug("message of %zu bytes, transport sized for %zu", n, m->n);
	reap(m);
	return pool_get(m, &m->dev, 0);
}

static void p2p_send(struct transport *t, int from, int to, int kind, int mb, void *buf)
{
	struct p2p_tp *m = (struct p2p_tp *)t;
	if (from < 0 || from >= m->G || rank_of(m, from) != m->rank || to < 0 || to >= m->G)
		bug("rank %d sends as piece %d to piece %d", m->rank, from, to);
	if (rank_of(m, to) == m->rank) {
		handoff_put(&m->local, to, kind, mb, buf);
		return;
	}
	void *wire = buf;
	if (!m->host) {
		wire = pool_get(m, &m->stage, 1);
		m->be->to_host(wire, buf, m->n);
		pool_put(&m->dev, buf);
	}
	if (m->n_pend == m->cap_pend) {
		m->cap_pend = m->cap_pend ? 2 * m->cap_pend : 16;
		m->pend = xrealloc(m->pend, sizeof(*m->pend) * (size_t)m->cap_pend);
	}
	struct pending *p = &m->pend[m->n_pend++];
	p->buf = wire;
	p->staged = !m->host;
	p->op = p2p_isend(m->ch, wire, m->n, rank_of(m, to), tag_of(m, to, kind, mb));
}

static void *p2p_recv(struct transport *t, int to, int from, int kind, int mb, double *waited)
{
	struct p2p_tp *m = (struct p2p_tp *)t;
	if (to < 0 || to >= m->G || rank_of(m, to) != m->rank || from < 0 || from >= m->G)
		bug("rank %d receives as piece %d from piece %d", m->rank, to, from);
	if (rank_of(m, from) == m->rank) {
		/* sent earlier by this thread (the schedule orders the two) */
		void *buf = handoff_take(&m->local, to, kind, mb);
		if (waited)
			*waited = 0.0;
		if (buf)
			return buf;
		bug("rank %d: piece %d receives the %s of micro-batch %d from piece %d of the same "
		    "stage, which has not sent it", m->rank, to,
		    kind == MSG_ACT ? "activation" : "gradient", mb, from);
	}
	reap(m);
	void *dev = pool_get(m, &m->dev, 0);
	if (!dev)
		return NULL; /* the stage fails: the job ends (executor.c) */
	void *wire = m->host ? dev : pool_get(m, &m->stage, 1);
	double t0 = now_sec();
	int src = rank_of(m, from);
	struct p2p_op *op = p2p_irecv(m->ch, wire, m->n, src, tag_of(m, to, kind, mb));
	p2p_wait(m->ch, &op, 1, m->timeout, m->rank % m->stages,
		 "the %s of micro-batch %d from rank %d (stage %d)",
		 kind == MSG_ACT ? "activation" : "gradient", mb, src, src % m->stages);
	if (waited)
		*waited = now_sec() - t0;
	if (!m->host) {
		m->be->to_device(dev, wire, m->n);
		pool_put(&m->stage, wire);
	}
	return dev;
}

static void p2p_release(struct transport *t, int stage, void *buf)
{
	struct p2p_tp *m = (struct p2p_tp *)t;
	pool_put(&m->dev, buf);
}

static void p2p_destroy(struct transport *t)
{
	struct p2p_tp *m = (struct p2p_tp *)t;
	for (int i = 0; i < m->n_pend; i++)
		p2p_wait(m->ch, &m->pend[i].op, 1, m->timeout, m->rank % m->stages,
			 "the next stage to take the last activations");
	free(m->pend);
	for (int i = 0; i < m->local.n; i++) /* a segment called off before its receive */
		pool_put(&m->dev, m->local.v[i].buf);
	free(m->local.v);
	free(m->piece_stage);
	free(m->piece_chunk);
	pool_free(m, &m->dev, 0);
	pool_free(m, &m->stage, 1);
	p2p_close(m->ch);
	free(m);
}

struct transport *transport_p2p(const struct dist *d, const struct backend *be,
				const struct pieces *pc, int N, int rank, size_t msg_bytes,
				double timeout)
{
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_tp *m = xcalloc(1, sizeof(*m));
	m->t = (struct transport){p2p_name(ch), p2p_buffer, p2p_send, p2p_recv, p2p_release,
				  p2p_destroy, NULL}; /* a failed stage ends the job */
	m->be = be;
	m->G = pc->P * N;
	m->P = pc->P;
	m->V = pc->V;
	m->stages = pc->S;
	m->piece_stage = xmalloc((size_t)pc->P * sizeof(int));
	m->piece_chunk = xmalloc((size_t)pc->P * sizeof(int));
	memcpy(m->piece_stage, pc->stage, (size_t)pc->P * sizeof(int));
	memcpy(m->piece_chunk, pc->chunk, (size_t)pc->P * sizeof(int));
	m->rank = rank;
	m->host = dist_backend_is_host(be);
	m->n = msg_bytes;
	m->timeout = timeout;
	m->ch = ch;
	m->tag_mb = MAX(1, (p2p_tag_limit(ch) - 1) / (2 * pc->V));
	return &m->t;
}
