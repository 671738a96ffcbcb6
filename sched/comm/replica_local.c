/* replica_local.c - the replicas' gradient sum between threads of one
 * process, the serial form, and the replica-shifted transport.
 *
 * Per stage, a reusable barrier: every replica publishes its buffer and
 * waits for the others; replica q then sums chunk q of all N buffers into
 * replica 0's buffer in replica order and copies the sum into the other
 * replicas' chunk q (the chunks are disjoint, so the replicas never touch
 * the same floats); a second barrier ends the call, after which every
 * buffer holds the sum and may be reused.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "../../io/util.h"
#include "barrier.h"
#include "replica.h"
#include "transport.h"

struct stage_group {
	struct barrier in, out;
	float **buf;  /* [N] the buffers of the call in progress */
	size_t *n;    /* [N] their lengths (must agree) */
};

struct local_replicas {
	struct replicas x;
	const struct backend *be;
	struct stage_group *g; /* [S] */
	atomic_int aborted;
};

/* Chunk q of n floats split N ways: [*lo, *lo + *len). */
static void chunk(size_t n, int N, int q, size_t *lo, size_t *len)
{
	*lo = n * (size_t)q / (size_t)N;
	*len = n * (size_t)(q + 1) / (size_t)N - *lo;
}

static void local_allreduce(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	struct local_replicas *l = (struct local_replicas *)xr;
	struct stage_group *sg = &l->g[s];
	int N = xr->N;
	sg->buf[r] = g;
	sg->n[r] = n;
	double w = barrier_wait(&sg->in);
	if (atomic_load(&l->aborted))
		return; /* the others may never come */
	for (int q = 0; q < N; q++)
		if (sg->n[q] != n)
			bug("stage %d replica %d reduces %zu floats, replica %d %zu", s,
			    r, n, q, sg->n[q]);
	size_t lo, len;
	chunk(n, N, r, &lo, &len);
	if (len) {
		float *acc = sg->buf[0] + lo;
		for (int q = 1; q < N; q++)
			l->be->add(acc, acc, sg->buf[q] + lo, len);
		for (int q = 1; q < N; q++)
			l->be->copy(sg->buf[q] + lo, acc, len * sizeof(float));
	}
	w += barrier_wait(&sg->out);
	if (waited)
		*waited = w;
}

/* Threads: a bucket is summed at once (the replicas' threads meet at each
 * bucket); nothing is left for finish. The buckets make no time here, but
 * they run the executor's bucketing on every schedule in the CPU tests. */
static void local_bucket(struct replicas *xr, int r, int s, float *g, size_t n, double *waited)
{
	local_allreduce(xr, r, s, g, n, waited);
}

static void local_finish(struct replicas *xr, int r, int s, double *waited)
{
	if (waited)
		*waited = 0.0;
}

static void local_abort(struct replicas *xr)
{
	struct local_replicas *l = (struct local_replicas *)xr;
	atomic_store(&l->aborted, 1);
	for (int s = 0; s < xr->S; s++) {
		barrier_wake(&l->g[s].in);
		barrier_wake(&l->g[s].out);
	}
}

static void local_destroy(struct replicas *xr)
{
	struct local_replicas *l = (struct local_replicas *)xr;
	for (int s = 0; s < xr->S; s++) {
		barrier_destroy(&l->g[s].in);
		barrier_destroy(&l->g[s].out);
		free(l->g[s].buf);
		free(l->g[s].n);
	}
	free(l->g);
	free(l);
}

struct replicas *replicas_local(const struct backend *be, int N, int S)
{
	struct local_replicas *l = xcalloc(1, sizeof(*l));
	l->x = (struct replicas){.name = "local", .N = N, .S = S, .allreduce = local_allreduce,
				 .bucket = local_bucket, .finish = local_finish,
				 .destroy = local_destroy, .abort = local_abort};
	l->be = be;
	l->g = xcalloc((size_t)S, sizeof(*l->g));
	for (int s = 0; s < S; s++) {
		barrier_init(&l->g[s].in, N, &l->aborted);
		barrier_init(&l->g[s].out, N, &l->aborted);
		l->g[s].buf = xcalloc((size_t)N, sizeof(float *));
		l->g[s].n = xcalloc((size_t)N, sizeof(size_t));
	}
	return &l->x;
}

void replicas_sum_serial(const struct backend *be, float *const *g, int N, size_t n)
{
	for (int q = 1; q < N; q++)
		be->add(g[0], g[0], g[q], n);
	for (int q = 1; q < N; q++)
		be->copy(g[q], g[0], n * sizeof(float));
}

/* ---- a replica's view of a transport over every process ---- */

struct shifted {
	struct transport t;
	struct transport *in;
	int base;
};

static void *sh_buffer(struct transport *t, int from, size_t n)
{
	struct shifted *x = (struct shifted *)t;
	return x->in->buffer(x->in, x->base + from, n);
}

static void sh_send(struct transport *t, int from, int to, int kind, int mb, void *buf)
{
	struct shifted *x = (struct shifted *)t;
	x->in->send(x->in, x->base + from, x->base + to, kind, mb, buf);
}

static void *sh_recv(struct transport *t, int to, int from, int kind, int mb, double *waited)
{
	struct shifted *x = (struct shifted *)t;
	return x->in->recv(x->in, x->base + to, x->base + from, kind, mb, waited);
}

static void sh_release(struct transport *t, int stage, void *buf)
{
	struct shifted *x = (struct shifted *)t;
	x->in->release(x->in, x->base + stage, buf);
}

static void sh_destroy(struct transport *t)
{
	struct shifted *x = (struct shifted *)t;
	x->in->destroy(x->in);
	free(x);
}

struct transport *transport_shift(struct transport *inner, int base)
{
	if (!inner)
		return NULL;
	if (!base)
		return inner;
	struct shifted *x = xcalloc(1, sizeof(*x));
	/* over every process (p2p, nccl): a failed stage ends the job, no abort */
	x->t = (struct transport){inner->name, sh_buffer, sh_send, sh_recv, sh_release, sh_destroy,
				  NULL};
	x->in = inner;
	x->base = base;
	return &x->t;
}
