/* replica_p2p.c - the replicas' gradient sum between processes, over the
 * point-to-point messages of p2p.h (MPI, or TCP without MPI).
 *
 * Process rank = r * S + s runs stage s of replica r, and the pieces that
 * stage holds (pieces.h); replica q of the same stage is rank q * S + s. A call is a reduce-scatter and an
 * all-gather written with point-to-point messages, so that the order of
 * the sum is ours, not a library's:
 *   1. replica r sends chunk q of its buffer to replica q (q != r) and
 *      receives chunk r of every other replica;
 *   2. it sums chunk r in replica order, ((g_0 + g_1) + g_2) + ..., one
 *      float addition at a time (the bits of the backend's add);
 *   3. it sends the summed chunk r to every other replica and receives
 *      their summed chunks into place.
 * Each replica sends and receives about 2 (N-1)/N of the buffer. Messages of
 * a stage's calls carry tag 1 (phase 1) or 2 (phase 3) on a channel of
 * their own; messages with the same source and tag arrive in order and
 * every replica makes the same calls in the same order, so successive calls
 * never mix.
 *
 * With a host backend (cpu) the carrier reads and writes the gradient
 * buffer itself; otherwise it is staged through a host copy.
 */
#include "replica.h"

#include "../../io/util.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "p2p.h"
#include "pieces.h"

enum { TAG_SCATTER = 1, TAG_GATHER = 2 };

struct p2p_replicas {
	struct replicas x;
	const struct backend *be;
	int r, s, S, host;        /* replica, stage, stages */
	int *stage;               /* [x.S] the stage of each piece */
	double timeout;           /* seconds a wait may take (pipeline.timeout) */
	struct p2p *ch;
	float *stage_buf;         /* host copy of a device buffer */
	size_t stage_cap;
	float *tmp;               /* [N][chunk] received chunks */
	size_t tmp_cap;
	struct p2p_op **req;      /* [2(N-1)] */
};

static void chunk(size_t n, int N, int q, size_t *lo, size_t *len)
{
	*lo = n * (size_t)q / (size_t)N;
	*len = n * (size_t)(q + 1) / (size_t)N - *lo;
}

static float *grow(float *p, size_t *cap, size_t n)
{
	if (n <= *cap)
		return p;
	free(p);
	*cap = n;
	return xmalloc(st_mult(n, sizeof(float)));
}

static void p2p_allreduce(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct p2p_replicas *m = (struct p2p_replicas *)xr;
	int N = xr->N;
	if (r != m->r || s < 0 || s >= xr->S || m->stage[s] != m->s)
		bug("rank of replica %d stage %d reduces as replica %d piece %d", m->r,
		    m->s, r, s);
	float *h = g;
	if (!m->host) {
		m->stage_buf = grow(m->stage_buf, &m->stage_cap, n);
		h = m->stage_buf;
		m->be->to_host(h, g, n * sizeof(float));
	}
	size_t lo, len;
	chunk(n, N, r, &lo, &len);
	m->tmp = grow(m->tmp, &m->tmp_cap, st_mult((size_t)N, len ? len : 1));
	double t0 = now_sec(), w = 0.0;
	/* 1. reduce-scatter: chunk q to replica q, chunk r from everyone */
	int k = 0;
	for (int q = 0; q < N; q++) {
		if (q == r)
			continue;
		size_t qlo, qlen;
		chunk(n, N, q, &qlo, &qlen);
		int peer = q * m->S + m->s;
		m->req[k++] = p2p_irecv(m->ch, m->tmp + (size_t)q * len, len * sizeof(float), peer,
					TAG_SCATTER);
		m->req[k++] = p2p_isend(m->ch, h + qlo, qlen * sizeof(float), peer, TAG_SCATTER);
	}
	p2p_wait(m->ch, m->req, k, m->timeout, m->s, "the other replicas' gradients of stage %d", m->s);
	w += now_sec() - t0;
	/* 2. chunk r in replica order */
	float *own = h + lo;
	memcpy(m->tmp + (size_t)r * len, own, len * sizeof(float));
	memcpy(own, m->tmp, len * sizeof(float));
	for (int q = 1; q < N; q++) {
		const float *src = m->tmp + (size_t)q * len;
		for (size_t i = 0; i < len; i++)
			own[i] = own[i] + src[i];
	}
	/* 3. all-gather: the summed chunk r to everyone, theirs into place
	 * (the sends of phase 1 are complete, so their chunks may be written) */
	t0 = now_sec();
	k = 0;
	for (int q = 0; q < N; q++) {
		if (q == r)
			continue;
		size_t qlo, qlen;
		chunk(n, N, q, &qlo, &qlen);
		int peer = q * m->S + m->s;
		m->req[k++] = p2p_irecv(m->ch, h + qlo, qlen * sizeof(float), peer, TAG_GATHER);
		m->req[k++] = p2p_isend(m->ch, own, len * sizeof(float), peer, TAG_GATHER);
	}
	p2p_wait(m->ch, m->req, k, m->timeout, m->s,
		 "the other replicas' summed gradients of stage %d", m->s);
	w += now_sec() - t0;
	if (!m->host)
		m->be->to_device(g, h, n * sizeof(float));
	if (waited)
		*waited = w;
}

static void p2p_destroy(struct replicas *xr)
{
	struct p2p_replicas *m = (struct p2p_replicas *)xr;
	p2p_close(m->ch);
	free(m->stage_buf);
	free(m->tmp);
	free(m->req);
	free(m->stage);
	free(m);
}

struct replicas *replicas_p2p(const struct dist *d, const struct backend *be, int N,
			      const struct pieces *pc, int rank, double timeout)
{
	struct p2p *ch = p2p_open(dist_carrier(d));
	if (!ch)
		return NULL;
	struct p2p_replicas *m = xcalloc(1, sizeof(*m));
	int S = pc->S;
	m->x = (struct replicas){.name = p2p_name(ch), .N = N, .S = pc->P,
				 .allreduce = p2p_allreduce, .destroy = p2p_destroy};
	m->be = be;
	m->r = rank / S;
	m->s = rank % S;
	m->S = S;
	m->stage = xmalloc((size_t)pc->P * sizeof(int));
	memcpy(m->stage, pc->stage, (size_t)pc->P * sizeof(int));
	m->timeout = timeout;
	m->host = dist_backend_is_host(be);
	m->ch = ch;
	m->req = xcalloc((size_t)2 * (size_t)N, sizeof(*m->req));
	return &m->x;
}
