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

#include "../../kernels/cuda/cuda_nccl.h"

struct nccl_replicas {
	struct replicas x;
	const struct backend *be;
	struct nccl_world *w;
	double timeout;
	float *tmp;               /* [N][chunk] received chunks, backend memory */
	size_t tmp_cap;
};

static void chunk(size_t n, int N, int q, size_t *lo, size_t *len)
{
	*lo = n * (size_t)q / (size_t)N;
	*len = n * (size_t)(q + 1) / (size_t)N - *lo;
}

/* One grouped exchange on the dp channel with every other replica q (phase
 * 1: g's chunk q out, q's chunk r into tmp[q]; phase 3: own out, q's summed
 * chunk into g), then a wait for all of it. */
static double exchange(struct nccl_replicas *m, int phase, float *g, size_t n, size_t len,
		       float *own)
{
	struct nccl_world *w = m->w;
	int N = m->x.N, r = w->replica;
	struct cuda_nccl_event *ev = NULL;
	if (cuda_nccl_group_start())
		die("rank %d: cannot start an NCCL group", w->rank);
	for (int q = 0; q < N; q++) {
		if (q == r)
			continue;
		size_t qlo, qlen;
		chunk(n, N, q, &qlo, &qlen);
		struct cuda_nccl_event *a, *b;
		if (phase == 1) {
			a = cuda_nccl_chan_recv(w->dp, m->tmp + (size_t)q * len, len * sizeof(float), q);
			b = cuda_nccl_chan_send(w->dp, g + qlo, qlen * sizeof(float), q);
		} else {
			a = cuda_nccl_chan_recv(w->dp, g + qlo, qlen * sizeof(float), q);
			b = cuda_nccl_chan_send(w->dp, own, len * sizeof(float), q);
		}
		if (!a || !b)
			die("rank %d (stage %d): cannot queue the gradient exchange with replica %d",
			    w->rank, w->stage, q);
		cuda_nccl_event_free(a); /* the mark after the group stands for all */
		cuda_nccl_event_free(b);
	}
	if (cuda_nccl_group_end())
		die("rank %d: cannot end an NCCL group", w->rank);
	if (!(ev = cuda_nccl_chan_mark(w->dp)))
		die("rank %d: cannot mark the gradient exchange", w->rank);
	double waited = nccl_wait(ev, w->dp, m->timeout, w->rank, w->stage,
				  "the other replicas' stage-%d gradients (phase %d of the sum)",
				  w->stage, phase);
	cuda_nccl_event_free(ev);
	return waited;
}

static void nccl_allreduce(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	struct nccl_world *w = m->w;
	int N = xr->N;
	if (r != w->replica || s != w->stage)
		die("internal error: rank of replica %d stage %d reduces as replica %d stage %d",
		    w->replica, w->stage, r, s);
	size_t lo, len;
	chunk(n, N, r, &lo, &len);
	size_t need = st_mult((size_t)N, len ? len : 1);
	if (need > m->tmp_cap) {
		if (m->tmp)
			m->be->free(m->tmp);
		m->tmp = m->be->alloc(st_mult(need, sizeof(float)));
		if (!m->tmp)
			die("rank %d: cannot allocate %zu floats for the gradient sum", w->rank, need);
		m->tmp_cap = need;
	}
	float *own = g + lo;
	double wt = exchange(m, 1, g, n, len, own);
	/* chunk r in replica order: tmp[r] = own; own = tmp[0]; own += tmp[q] */
	m->be->copy(m->tmp + (size_t)r * len, own, len * sizeof(float));
	m->be->copy(own, m->tmp, len * sizeof(float));
	for (int q = 1; q < N; q++)
		m->be->add(own, own, m->tmp + (size_t)q * len, len);
	wt += exchange(m, 3, g, n, len, own);
	if (waited)
		*waited = wt;
}

static void nccl_destroy(struct replicas *xr)
{
	struct nccl_replicas *m = (struct nccl_replicas *)xr;
	if (m->tmp)
		m->be->free(m->tmp);
	free(m);
}

struct replicas *replicas_nccl(const struct backend *be, struct nccl_world *w, double timeout)
{
	if (!w->dp) {
		error("internal error: replicas over NCCL without a dp channel");
		return NULL;
	}
	struct nccl_replicas *m = xcalloc(1, sizeof(*m));
	m->x = (struct replicas){.name = "nccl", .N = w->replicas, .S = w->stages,
				 .allreduce = nccl_allreduce, .destroy = nccl_destroy};
	m->be = be;
	m->w = w;
	m->timeout = timeout;
	return &m->x;
}

#endif
