/* nccl_world.c - the NCCL channels of one rank, and waits with a deadline.
 * See nccl.h. */
#include "nccl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dist.h"

void nccl_fail(const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error("%s; aborting the job", msg);
	dist_abort();
}

#ifndef ASYNCPP_CUDA

int nccl_world_open(struct nccl_world *w, const struct dist *d, int stages, int replicas,
		    int rank)
{
	memset(w, 0, sizeof(*w));
	return error("pipeline.transport = nccl needs a CUDA build of asyncpp (this one has "
		     "none); use pipeline.transport = mpi");
}

void nccl_world_close(struct nccl_world *w)
{
	memset(w, 0, sizeof(*w));
}

double nccl_wait(struct cuda_nccl_event *e, struct cuda_nccl_chan *ch, double timeout,
		 int rank, int stage, const char *fmt, ...)
{
	bug("nccl_wait without CUDA");
}

#else

#include <stdlib.h>
#include <unistd.h>

#include "../../kernels/cuda/cuda_nccl.h"

/* The ids a rank creates: [0] its act channel to stage + 1, [1] its grad
 * channel from stage + 1, [2] (replica 0 only) its stage's dp channel. */
enum { ID_ACT, ID_GRAD, ID_DP, IDS_PER_RANK };

static int open_chan(struct cuda_nccl_chan **ch, int nranks, const unsigned char *id, int rank,
		     const char *what)
{
	if (cuda_nccl_chan_open(ch, nranks, id, rank) == 0)
		return 0;
	return error("cannot open the NCCL channel for %s", what);
}

/* The pair (stage, stage + 1) of this rank's replica, from its lower end
 * (lower = 1) or its upper end. */
static int open_pair(struct nccl_world *w, const unsigned char (*ids)[IDS_PER_RANK][CUDA_NCCL_ID_BYTES],
		     int lower)
{
	int a = lower ? w->rank : w->rank - 1; /* the pair's lower rank */
	int me = lower ? 0 : 1;
	char what[96];
	snprintf(what, sizeof(what), "stages %d and %d of replica %d", a % w->stages,
		 a % w->stages + 1, w->replica);
	if (lower)
		return open_chan(&w->act_out, 2, ids[a][ID_ACT], me, what) ||
		       open_chan(&w->grad_in, 2, ids[a][ID_GRAD], me, what);
	return open_chan(&w->act_in, 2, ids[a][ID_ACT], me, what) ||
	       open_chan(&w->grad_out, 2, ids[a][ID_GRAD], me, what);
}

/* Every rank learns every rank's (host, GPU); two ranks on one GPU of one
 * host stop every rank (NCCL would fail later, less clearly). */
static int one_gpu_each(const struct dist *d, int rank, int world)
{
	struct place {
		char host[64];
		unsigned char uuid[16];
	} *all = xcalloc((size_t)world, sizeof(*all));
	int rc = 0;
	if (gethostname(all[rank].host, sizeof(all[rank].host) - 1) ||
	    cuda_nccl_device_uuid(all[rank].uuid))
		rc = error("rank %d: cannot tell its host or GPU", rank);
	for (int q = 0; q < world; q++)
		if (dist_bcast(d, &all[q], sizeof(all[q]), q))
			rc = -1;
	/* every rank sees the whole table, so all of them stop; rank 0 says why */
	for (int a = 0; a < world && !rc; a++)
		for (int b = a + 1; b < world && !rc; b++)
			if (!strcmp(all[a].host, all[b].host) &&
			    !memcmp(all[a].uuid, all[b].uuid, sizeof(all[a].uuid)))
				rc = rank ? -1 : error("ranks %d and %d both use the same GPU of host "
						       "%s: pipeline.transport = nccl needs a GPU "
						       "per process (start at most as many "
						       "processes per node as it has GPUs)", a, b,
						       all[a].host);
	free(all);
	return rc;
}

int nccl_world_open(struct nccl_world *w, const struct dist *d, int stages, int replicas,
		    int rank)
{
	memset(w, 0, sizeof(*w));
	w->rank = rank;
	w->stages = stages;
	w->replicas = replicas;
	w->stage = rank % stages;
	w->replica = rank / stages;
	char why[512];
	int no_nccl = cuda_nccl_load(why, sizeof(why)) < 0;
	/* agreed before the first collective below, so that a rank without
	 * NCCL (one node missing libnccl2) does not leave the others waiting in
	 * it until pipeline.timeout */
	if (dist_max_int(d, no_nccl)) {
		if (no_nccl)
			return error("pipeline.transport = nccl: %s; install NCCL 2 (libnccl2) or "
				     "use pipeline.transport = mpi", why);
		return error("rank %d: another rank could not load NCCL (its message says why)",
			     rank);
	}
	int world = stages * replicas;
	if (one_gpu_each(d, rank, world))
		return -1;
	unsigned char(*ids)[IDS_PER_RANK][CUDA_NCCL_ID_BYTES] =
		xcalloc((size_t)world, sizeof(*ids));
	int rc = 0;
	if (w->stage + 1 < stages)
		rc |= cuda_nccl_unique_id(ids[rank][ID_ACT]) || cuda_nccl_unique_id(ids[rank][ID_GRAD]);
	if (replicas > 1 && w->replica == 0)
		rc |= cuda_nccl_unique_id(ids[rank][ID_DP]);
	/* every rank learns every id: a broadcast from each rank in turn (ids
	 * are small; an error here leaves the others waiting until the
	 * broadcast's timeout names this rank, so go on to the broadcasts) */
	for (int q = 0; q < world; q++)
		if (dist_bcast(d, ids[q], sizeof(ids[q]), q))
			rc = -1;
	if (rc) {
		free(ids);
		return error("rank %d: cannot create or share the NCCL ids", rank);
	}
	/* round 1: pairs that start at an even stage; round 2: at an odd one */
	for (int round = 0; round < 2 && !rc; round++) {
		int s = w->stage;
		if (s + 1 < stages && s % 2 == round)
			rc = open_pair(w, (const void *)ids, 1);
		else if (s > 0 && (s - 1) % 2 == round)
			rc = open_pair(w, (const void *)ids, 0);
	}
	if (!rc && replicas > 1) {
		char what[64];
		snprintf(what, sizeof(what), "the %d replicas of stage %d", replicas, w->stage);
		rc = open_chan(&w->dp, replicas, ids[w->stage][ID_DP], w->replica, what);
	}
	free(ids);
	if (rc)
		nccl_world_close(w);
	return rc ? -1 : 0;
}

void nccl_world_close(struct nccl_world *w)
{
	cuda_nccl_chan_close(w->act_in);
	cuda_nccl_chan_close(w->grad_out);
	cuda_nccl_chan_close(w->act_out);
	cuda_nccl_chan_close(w->grad_in);
	cuda_nccl_chan_close(w->dp);
	memset(w, 0, sizeof(*w));
}

double nccl_wait(struct cuda_nccl_event *e, struct cuda_nccl_chan *ch, double timeout,
		 int rank, int stage, const char *fmt, ...)
{
	double t0 = now_sec();
	for (long polls = 0;; polls++) {
		int done = cuda_nccl_event_done(e, ch);
		if (done > 0)
			return now_sec() - t0;
		double waited = now_sec() - t0;
		if (done < 0 || (timeout > 0 && waited > timeout)) {
			char what[300];
			va_list ap;
			va_start(ap, fmt);
			vsnprintf(what, sizeof(what), fmt, ap);
			va_end(ap);
			if (done < 0)
				error("rank %d (stage %d): the transfer of %s failed; aborting the job",
				      rank, stage, what);
			else
				error("rank %d (stage %d) waited %.0f s for %s, which never came: that "
				      "rank is stuck, stopped or gone (pipeline.timeout = %g s; 0 waits "
				      "forever); aborting the job", rank, stage, waited, what, timeout);
			dist_abort();
		}
		if (polls > 2000) { /* a short spin first: transfers usually end soon */
			struct timespec pause = {0, 50000};
			nanosleep(&pause, NULL);
		}
	}
}

#endif
