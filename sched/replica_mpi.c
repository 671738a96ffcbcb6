/* replica_mpi.c - the replicas' gradient sum between processes.
 *
 * Process rank = r * S + s runs stage s of replica r. The N processes of
 * stage s share a communicator of their own (MPI_Comm_split by stage, ranked
 * by replica). A call is a reduce-scatter and an all-gather written with
 * point-to-point messages, so that the order of the sum is ours, not the
 * MPI library's:
 *   1. replica r sends chunk q of its buffer to replica q (q != r) and
 *      receives chunk r of every other replica;
 *   2. it sums chunk r in replica order, ((g_0 + g_1) + g_2) + ..., one
 *      float addition at a time (the bits of the backend's add);
 *   3. it sends the summed chunk r to every other replica and receives
 *      their summed chunks into place.
 * Each replica sends and receives about 2 (N-1)/N of the buffer. Messages of
 * a stage's calls carry tag 1 (phase 1) or 2 (phase 3); MPI keeps messages
 * with the same source and tag in order and every replica makes the same
 * calls in the same order, so successive calls never mix.
 *
 * With a host backend (cpu) MPI reads and writes the gradient buffer itself;
 * otherwise it is staged through a host copy.
 */
#include "replica.h"

#include "../io/util.h"

#ifndef ASYNCPP_MPI

struct replicas *replicas_mpi(const struct backend *be, int N, int S, int rank)
{
	error("this asyncpp was built without MPI");
	return NULL;
}

#else

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"

enum { TAG_SCATTER = 1, TAG_GATHER = 2 };

struct mpi_replicas {
	struct replicas x;
	const struct backend *be;
	int r, s, host;
	MPI_Comm comm;            /* the N processes of stage s, rank = replica */
	float *stage_buf;         /* host copy of a device buffer */
	size_t stage_cap;
	float *tmp;               /* [N][chunk] received chunks */
	size_t tmp_cap;
	MPI_Request *req;         /* [2(N-1)] */
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

static void mpi_allreduce(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct mpi_replicas *m = (struct mpi_replicas *)xr;
	int N = xr->N;
	if (r != m->r || s != m->s)
		die("internal error: rank of replica %d stage %d reduces as replica %d stage %d", m->r,
		    m->s, r, s);
	float *h = g;
	if (!m->host) {
		m->stage_buf = grow(m->stage_buf, &m->stage_cap, n);
		h = m->stage_buf;
		m->be->to_host(h, g, n * sizeof(float));
	}
	size_t lo, len;
	chunk(n, N, r, &lo, &len);
	if (n / (size_t)N + 1 > INT_MAX)
		die("stage %d: a gradient of %zu floats is too large for %d replicas' messages", s, n,
		    N);
	m->tmp = grow(m->tmp, &m->tmp_cap, st_mult((size_t)N, len ? len : 1));
	double t0 = now_sec(), w = 0.0;
	/* 1. reduce-scatter: chunk q to replica q, chunk r from everyone */
	int k = 0;
	for (int q = 0; q < N; q++) {
		if (q == r)
			continue;
		size_t qlo, qlen;
		chunk(n, N, q, &qlo, &qlen);
		MPI_Irecv(m->tmp + (size_t)q * len, (int)len, MPI_FLOAT, q, TAG_SCATTER, m->comm,
			  &m->req[k++]);
		MPI_Isend(h + qlo, (int)qlen, MPI_FLOAT, q, TAG_SCATTER, m->comm, &m->req[k++]);
	}
	MPI_Waitall(k, m->req, MPI_STATUSES_IGNORE);
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
		MPI_Irecv(h + qlo, (int)qlen, MPI_FLOAT, q, TAG_GATHER, m->comm, &m->req[k++]);
		MPI_Isend(own, (int)len, MPI_FLOAT, q, TAG_GATHER, m->comm, &m->req[k++]);
	}
	MPI_Waitall(k, m->req, MPI_STATUSES_IGNORE);
	w += now_sec() - t0;
	if (!m->host)
		m->be->to_device(g, h, n * sizeof(float));
	if (waited)
		*waited = w;
}

static void mpi_destroy(struct replicas *xr)
{
	struct mpi_replicas *m = (struct mpi_replicas *)xr;
	MPI_Comm_free(&m->comm);
	free(m->stage_buf);
	free(m->tmp);
	free(m->req);
	free(m);
}

struct replicas *replicas_mpi(const struct backend *be, int N, int S, int rank)
{
	if (!dist_active()) {
		error("internal error: replicas over MPI need a running MPI (dist_init)");
		return NULL;
	}
	struct mpi_replicas *m = xcalloc(1, sizeof(*m));
	m->x = (struct replicas){.name = "mpi", .N = N, .S = S, .allreduce = mpi_allreduce,
				 .destroy = mpi_destroy};
	m->be = be;
	m->r = rank / S;
	m->s = rank % S;
	m->host = dist_backend_is_host(be);
	m->req = xcalloc((size_t)2 * (size_t)N, sizeof(MPI_Request));
	MPI_Comm_split(MPI_COMM_WORLD, m->s, m->r, &m->comm);
	int cr, cn;
	MPI_Comm_rank(m->comm, &cr);
	MPI_Comm_size(m->comm, &cn);
	if (cr != m->r || cn != N) {
		MPI_Comm_free(&m->comm);
		free(m->req);
		free(m);
		error("internal error: rank %d is replica %d of %d in its stage's communicator, "
		      "expected %d of %d", rank, cr, cn, rank / S, N);
		return NULL;
	}
	return &m->x;
}

#endif
