/* replica_nccl.c - the replicas' gradient sum between GPU processes over
 * NCCL (nccl.h), in replica order.
 *
 * The same three phases as replica_p2p.c, on the stage's dp channel, so the
 * bits are the threaded run's (ncclAllReduce would be faster to write but
 * sums in an order of NCCL's choosing, which depends on the topology):
 *   1. grouped sends and receives: chunk q of g to replica q, chunk r of
 *      every other replica into tmp[q];
 *   2. chunk r = ((g_0 + g_1) + g_2) + ..., the backend's add, in order;
 *   3. grouped: the summed chunk r to every other replica, theirs into
 *      place in g.
 * Each phase's receives are waited for on the host under pipeline.timeout
 * (a replica that never comes is named); the adds and what follows queue
 * on the compute stream after them.
 *
 * Buckets (replica.h, pipeline.bucket_mb): phase 1 of each bucket is queued
 * as soon as the step's last backward has finished its layers, so those
 * transfers run during the rest of the backward; the step's end waits for
 * them, sums and runs phase 3, bucket by bucket. Each element's sum is the
 * same, so the bits do not depend on the buckets.
 */
#include "nccl.h"
#include "replica.h"

#ifndef ASYNCPP_CUDA

struct replicas *replicas_nccl(const struct backend *be, struct nccl_world *w, double timeout)
{
	error("pipeline.transport = nccl needs a CUDA build of asyncpp");
	return NULL;
}

#else

#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_nccl.h"
#include "retired.h"

/* A bucket in flight (replica.h): its phase 1 queued at bucket(), its sum
 * and phase 3 made at finish(). Kept from step to step (the same buckets
 * come every step), with their scratch. */
struct nbucket {
	float *g;                  /* the bucket's n floats */
	size_t n;
	float *tmp;                /* [N][chunk] received chunks, backend memory */
	size_t tmp_cap;
	struct cuda_nccl_event *ev; /* after its phase 1; NULL when done */
};

struct nccl_replicas {
	struct replicas x;
	const struct backend *be;
	struct nccl_world *w;
	double timeout;
	struct nbucket *b;         /* buckets started since the last finish: [0, nb) */
	int nb, cap;
	struct retired old;        /* scratch a bucket outgrew (retired.h) */
};

static void chunk(size_t n, int N, int q, size_t *lo, size_t *len)
{
	*lo = n * (size_t)q / (size_t)N;
	*len = n * (size_t)(q + 1) / (size_t)N - *lo;
}

/* Queue one grouped exchange on the dp channel with every other replica q
 * (phase 1: g's chunk q out, q's chunk r into tmp[q]; phase 3: own out,
 * q's summed chunk into g); returns the event after it. */
static struct cuda_nccl_event *queue_exchange(struct nccl_replicas *m, int phase, float *g,
					      size_t n, size_t len, float *own, float *tmp)
{
	struct nccl_world *w = m->w;
	int N = m->x.N, r = w->replica;
	struct cuda_nccl_event *ev = NULL;
	if (cuda_nccl_group_start())
		nccl_fail("rank %d: cannot start an NCCL group", w->rank);
	for (int q = 0; q < N; q++) {
		if (q == r)
			continue;
		size_t qlo, qlen;
		chunk(n, N, q, &qlo, &qlen);
		struct cuda_nccl_event *a, *b;
		if (phase == 1) {
			a = cuda_nccl_chan_recv(w->dp, tmp + (size_t)q * len, len * sizeof(float), q);
			b = cuda_nccl_chan_send(w->dp, g + qlo, qlen * sizeof(float), q);
		} else {
			a = cuda_nccl_chan_recv(w->dp, g + qlo, qlen * sizeof(float), q);
			b = cuda_nccl_chan_send(w->dp, own, len * sizeof(float), q);
		}
		if (!a || !b)
			nccl_fail("rank %d (stage %d): cannot queue the gradient exchange with replica %d",
				  w->rank, w->stage, q);
		cuda_nccl_event_free(a); /* the mark after the group stands for all */
		cuda_nccl_event_free(b);
	}
	if (cuda_nccl_group_end())
		nccl_fail("rank %d: cannot end an NCCL group", w->rank);
	if (!(ev = cuda_nccl_chan_mark(w->dp)))
		nccl_fail("rank %d: cannot mark the gradient exchange", w->rank);
	return ev;
}

/* Wait for an exchange on the host, under pipeline.timeout; frees ev. */
static double wait_exchange(struct nccl_replicas *m, struct cuda_nccl_event *ev, int phase)
{
	struct nccl_world *w = m->w;
	double waited = nccl_wait(ev, w->dp, m->timeout, w->rank, w->stage,
				  "the other replicas' stage-%d gradients (phase %d of the sum)",
				  w->stage, phase);
	cuda_nccl_event_free(ev);
	return waited;
}

static void check_caller(const struct nccl_replicas *m, int r, int s)
{
	/* s: a piece of this rank's stage (pieces.h; piece s is stage s when
	 * every stage holds one) */
	int stage = m->w->piece_stage && s >= 0 && s < m->w->P ? m->w->piece_stage[s] : s;
	if (r != m->w->replica || stage != m->w->stage)
		bug("rank of replica %d stage %d reduces as replica %d piece %d",
		    m->w->replica, m->w->stage, r, s);
}

/* Phase 1 of the sum of g[n], queued behind the compute stream's work so
 * far: the exchange runs while the backward goes on. */
static void nccl_bucket(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	check_caller(m, r, s);
	if (m->nb == m->cap) {
		m->cap = m->cap ? 2 * m->cap : 16;
		m->b = xrealloc(m->b, sizeof(*m->b) * (size_t)m->cap);
		memset(m->b + m->nb, 0, sizeof(*m->b) * (size_t)(m->cap - m->nb));
	}
	struct nbucket *b = &m->b[m->nb++];
	size_t lo, len;
	chunk(n, xr->N, r, &lo, &len);
	size_t need = st_mult((size_t)xr->N, len ? len : 1);
	if (need > b->tmp_cap) {
		/* kept, not freed, mid-segment (retired.h) */
		size_t cap = retired_grow(b->tmp_cap, need);
		retired_keep(&m->old, b->tmp);
		b->tmp = m->be->alloc(st_mult(cap, sizeof(float)));
		if (!b->tmp)
			nccl_fail("rank %d: cannot allocate %zu floats for the gradient sum", m->w->rank,
				  cap);
		b->tmp_cap = cap;
	}
	b->g = g, b->n = n;
	b->ev = queue_exchange(m, 1, g, n, len, g + lo, b->tmp);
	if (waited)
		*waited = 0.0;
}

/* Every bucket in order: wait for its phase 1, sum chunk r in replica
 * order (tmp[r] = own; own = tmp[0]; own += tmp[q]) on the compute stream,
 * then phase 3 hands the sum to the others. */
static void nccl_finish(struct replicas *xr, int r, int s, double *waited)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	check_caller(m, r, s);
	int N = xr->N;
	double wt = 0.0;
	for (int i = 0; i < m->nb; i++) {
		struct nbucket *b = &m->b[i];
		size_t lo, len;
		chunk(b->n, N, r, &lo, &len);
		float *own = b->g + lo;
		wt += wait_exchange(m, b->ev, 1);
		b->ev = NULL;
		m->be->copy(b->tmp + (size_t)r * len, own, len * sizeof(float));
		m->be->copy(own, b->tmp, len * sizeof(float));
		for (int q = 1; q < N; q++)
			m->be->add(own, own, b->tmp + (size_t)q * len, len);
		wt += wait_exchange(m, queue_exchange(m, 3, b->g, b->n, len, own, NULL), 3);
	}
	m->nb = 0;
	if (waited)
		*waited = wt;
}

/* One bucket, finished at once. */
static void nccl_allreduce(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	if (m->nb)
		bug("stage %d sums a whole buffer with %d buckets in flight", s,
		    m->nb);
	nccl_bucket(xr, r, s, g, n, NULL);
	nccl_finish(xr, r, s, waited);
}

static void nccl_destroy(struct replicas *xr)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	for (int i = 0; i < m->cap; i++) {
		if (m->b[i].ev)
			cuda_nccl_event_free(m->b[i].ev);
		if (m->b[i].tmp)
			m->be->free(m->b[i].tmp);
	}
	free(m->b);
	retired_free(&m->old, m->be);
	free(m);
}

struct replicas *replicas_nccl(const struct backend *be, struct nccl_world *w, double timeout)
{
	if (!w->dp) {
		error("internal error: replicas over NCCL without a dp channel");
		return NULL;
	}
	struct nccl_replicas *m = xcalloc(1, sizeof(*m));
	m->x = (struct replicas){.name = "nccl", .N = w->replicas,
				 .S = w->piece_stage ? w->P : w->stages,
				 .allreduce = nccl_allreduce, .bucket = nccl_bucket,
				 .finish = nccl_finish, .destroy = nccl_destroy};
	m->be = be;
	m->w = w;
	m->timeout = timeout;
	return &m->x;
}

#endif
