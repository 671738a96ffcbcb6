/* nccl_world.c - the NCCL channels of one rank, and waits with a deadline.
 * See nccl.h. */
#include "nccl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "pieces.h"

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

void nccl_env_prepare(void)
{
	setenv("CUDA_MODULE_LOADING", "EAGER", 0); /* 0: a user's value stays */
}

struct nccl_deadline {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;   /* on CLOCK_MONOTONIC */
	int stopped;
	double timeout;
	int rank, stage;
	char what[300];
};

static void never_came(const struct nccl_deadline *dl, double waited, ...)
{
	va_list ap;
	va_start(ap, waited);
	dist_never_came(dl->rank, dl->stage, waited, dl->timeout, "%s", ap);
}

static void *deadline_watch(void *arg)
{
	struct nccl_deadline *dl = arg;
	struct timespec t0, at;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	double end = (double)t0.tv_sec + t0.tv_nsec * 1e-9 + dl->timeout;
	at.tv_sec = (time_t)end;
	at.tv_nsec = (long)((end - (double)at.tv_sec) * 1e9);
	pthread_mutex_lock(&dl->mu);
	int rc = 0;
	while (!dl->stopped && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&dl->cv, &dl->mu, &at);
	int late = !dl->stopped;
	pthread_mutex_unlock(&dl->mu);
	if (late) /* the other thread is inside NCCL: only the job's end frees it */
		never_came(dl, dl->timeout, dl->what);
	return NULL;
}

struct nccl_deadline *nccl_deadline_start(double timeout, int rank, int stage, const char *fmt,
					  ...)
{
	if (!(timeout > 0))
		return NULL;
	struct nccl_deadline *dl = xcalloc(1, sizeof(*dl));
	dl->timeout = timeout;
	dl->rank = rank;
	dl->stage = stage;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(dl->what, sizeof(dl->what), fmt, ap);
	va_end(ap);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&dl->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&dl->mu, NULL);
	if (pthread_create(&dl->thread, NULL, deadline_watch, dl))
		bug("cannot start a thread for a deadline");
	return dl;
}

void nccl_deadline_stop(struct nccl_deadline *dl)
{
	if (!dl)
		return;
	pthread_mutex_lock(&dl->mu);
	dl->stopped = 1;
	pthread_cond_signal(&dl->cv);
	pthread_mutex_unlock(&dl->mu);
	pthread_join(dl->thread, NULL);
	pthread_cond_destroy(&dl->cv);
	pthread_mutex_destroy(&dl->mu);
	free(dl);
}

/* Does pc hand something from stage a to stage b (a != b)? */
static int hands(const struct pieces *pc, int a, int b)
{
	for (int q = 0; q + 1 < pc->P; q++)
		if (pc->stage[q] == a && pc->stage[q + 1] == b)
			return 1;
	return 0;
}

void nccl_plan_make(struct nccl_plan *plan, const struct pieces *pc)
{
	int S = pc->S;
	memset(plan, 0, sizeof(*plan));
	/* at most 4 channels per pair of stages (both kinds, both ways) */
	size_t cap = st_mult(st_mult((size_t)S, (size_t)S), 2);
	plan->kind = xcalloc(cap + 1, sizeof(int));
	plan->from = xcalloc(cap + 1, sizeof(int));
	plan->to = xcalloc(cap + 1, sizeof(int));
	plan->slot = xcalloc(cap + 1, sizeof(int));
	plan->round = xcalloc(cap + 1, sizeof(int));
	int *sent = xcalloc((size_t)S, sizeof(int)); /* ids each stage makes so far */
	/* rounds: a greedy colouring of the pairs in order, each pair the
	 * lowest round neither end has used */
	unsigned char *busy = xcalloc(st_mult((size_t)S, (size_t)S + 1), 1); /* [stage][round] */
	for (int a = 0; a < S; a++)
		for (int b = a + 1; b < S; b++) {
			int ab = hands(pc, a, b), ba = hands(pc, b, a);
			if (!ab && !ba)
				continue;
			int r = 0;
			while (busy[(size_t)a * (S + 1) + r] || busy[(size_t)b * (S + 1) + r])
				if (++r > S) /* a stage has at most S - 1 peers */
					bug("stages %d and %d find no common round", a, b);
			busy[(size_t)a * (S + 1) + r] = busy[(size_t)b * (S + 1) + r] = 1;
			plan->rounds = MAX(plan->rounds, r + 1);
			/* activations a -> b and their gradients b -> a, then the
			 * other way round: both ends open them in this order */
			int want[4][3] = {{ab, a, b}, {ab, b, a}, {ba, b, a}, {ba, a, b}};
			for (int k = 0; k < 4; k++) {
				if (!want[k][0])
					continue;
				int i = plan->n++, from = want[k][1];
				plan->kind[i] = k % 2; /* 0: activations, 1: gradients */
				plan->from[i] = from;
				plan->to[i] = want[k][2];
				plan->slot[i] = sent[from]++;
				plan->round[i] = r;
				plan->ids = MAX(plan->ids, sent[from]);
			}
		}
	free(busy);
	free(sent);
}

int nccl_plan_sequence(const struct nccl_plan *plan, int stage, int *seq)
{
	int n = 0;
	for (int round = 0; round < plan->rounds; round++)
		for (int i = 0; i < plan->n; i++)
			if (plan->round[i] == round &&
			    (plan->from[i] == stage || plan->to[i] == stage))
				seq[n++] = i;
	return n;
}

void nccl_plan_free(struct nccl_plan *plan)
{
	free(plan->kind);
	free(plan->from);
	free(plan->to);
	free(plan->slot);
	free(plan->round);
	memset(plan, 0, sizeof(*plan));
}

#ifndef ASYNCPP_CUDA

int nccl_world_open(struct nccl_world *w, const struct dist *d, const struct pieces *pc,
		    int replicas, int rank)
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

#include <unistd.h>

#include "../../kernels/cuda/cuda_nccl.h"

/* Id k of rank q in the table of every rank's ids (per each). */
static unsigned char *id_of(unsigned char *ids, size_t per, int q, int k)
{
	return ids + ((size_t)q * per + (size_t)k) * CUDA_NCCL_ID_BYTES;
}

/* Open a channel of w (rank `rank` of nranks) and connect it (cuda_nccl.h:
 * NCCL would connect its ranks at their first transfer, mid-segment,
 * where connecting may wait on a device whose send waits on the peer);
 * w->open records it, for nccl_world_close's order. A pipeline channel
 * (2 ranks) is used one way, from its rank 0; dp every way. */
static int open_chan(struct nccl_world *w, struct cuda_nccl_chan **ch, int nranks,
		     const unsigned char *id, int rank, double timeout, const char *who,
		     const char *what)
{
	/* NCCL waits for every rank of the channel without a deadline */
	struct nccl_deadline *dl = nccl_deadline_start(timeout, w->rank, w->stage,
						       "%s to open the NCCL channel for %s", who,
						       what);
	int rc = cuda_nccl_chan_open(ch, nranks, id, rank);
	nccl_deadline_stop(dl);
	if (rc)
		return error("cannot open the NCCL channel for %s", what);
	w->open[w->n_open++] = *ch;
	struct cuda_nccl_event *e = cuda_nccl_chan_connect(*ch, rank, nranks, ch != &w->dp);
	if (!e)
		return error("cannot connect the NCCL channel for %s", what);
	nccl_wait(e, *ch, timeout, w->rank, w->stage, "the byte that connects the channel for %s",
		  what);
	cuda_nccl_event_free(e);
	return 0;
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

int nccl_world_open(struct nccl_world *w, const struct dist *d, const struct pieces *pc,
		    int replicas, int rank)
{
	int stages = pc->S;
	memset(w, 0, sizeof(*w));
	w->rank = rank;
	w->stages = stages;
	w->replicas = replicas;
	w->stage = rank % stages;
	w->replica = rank / stages;
	w->P = pc->P;
	w->piece_stage = xmalloc((size_t)pc->P * sizeof(int));
	memcpy(w->piece_stage, pc->stage, (size_t)pc->P * sizeof(int));
	w->send = xcalloc((size_t)2 * (size_t)stages, sizeof(*w->send));
	w->recv = xcalloc((size_t)2 * (size_t)stages, sizeof(*w->recv));
	char why[512];
	int no_nccl = cuda_nccl_load(why, sizeof(why)) < 0;
	/* agreed before the first collective below, so that a rank without
	 * NCCL (one node missing libnccl2) does not leave the others waiting in
	 * it until pipeline.timeout */
	if (dist_max_int(d, no_nccl)) {
		nccl_world_close(w);
		if (no_nccl)
			return error("pipeline.transport = nccl: %s; install NCCL 2 (libnccl2) or "
				     "use pipeline.transport = mpi", why);
		return error("rank %d: another rank could not load NCCL (its message says why)",
			     rank);
	}
	int world = stages * replicas;
	int no_gpu = one_gpu_each(d, rank, world) != 0;
	if (dist_max_int(d, no_gpu)) { /* agreed before the ids' broadcasts, as above */
		nccl_world_close(w);
		return no_gpu ? -1 : error("rank %d: another rank could not tell its GPU apart (its "
					   "message says why)", rank);
	}
	struct nccl_plan plan;
	nccl_plan_make(&plan, pc);
	/* this rank's ids: one per channel it sends on (plan.slot), then
	 * (replica 0 only) its stage's dp channel */
	size_t per = (size_t)plan.ids + 1;
	unsigned char *ids = xcalloc(st_mult((size_t)world, per), CUDA_NCCL_ID_BYTES);
	int rc = 0;
	for (int i = 0; i < plan.n; i++)
		if (plan.from[i] == w->stage)
			rc |= cuda_nccl_unique_id(id_of(ids, per, rank, plan.slot[i]));
	if (replicas > 1 && w->replica == 0)
		rc |= cuda_nccl_unique_id(id_of(ids, per, rank, plan.ids));
	/* every rank learns every id: a broadcast from each rank in turn (ids
	 * are small; an error here leaves the others waiting until the
	 * broadcast's timeout names this rank, so go on to the broadcasts) */
	for (int q = 0; q < world; q++)
		if (dist_bcast(d, id_of(ids, per, q, 0), per * CUDA_NCCL_ID_BYTES, q))
			rc = -1;
	/* agreed: a peer opening a channel with a rank that gave up would
	 * wait inside NCCL, which has no deadline */
	if (dist_max_int(d, rc != 0)) {
		free(ids);
		nccl_plan_free(&plan);
		nccl_world_close(w);
		if (rc)
			return error("rank %d: cannot create or share the NCCL ids", rank);
		return error("rank %d: another rank could not create or share the NCCL ids (its "
			     "message says why)", rank);
	}
	/* the rounds in order; within one, this stage's channels with its one
	 * peer of the round, in the plan's order on both ends; each connected
	 * as soon as it opens */
	int base = w->replica * stages;
	double timeout = dist_timeout(d);
	int *seq = xmalloc(sizeof(int) * (size_t)(plan.n + 1));
	int n_seq = nccl_plan_sequence(&plan, w->stage, seq);
	w->open = xcalloc((size_t)n_seq + 1, sizeof(*w->open));
	for (int k = 0; k < n_seq && !rc; k++) {
		int i = seq[k];
		int sending = plan.from[i] == w->stage;
		int peer = sending ? plan.to[i] : plan.from[i];
		char what[128], who[64];
		snprintf(what, sizeof(what), "the %s from stage %d to stage %d of replica %d",
			 plan.kind[i] ? "gradients" : "activations", plan.from[i], plan.to[i],
			 w->replica);
		snprintf(who, sizeof(who), "rank %d (stage %d)", base + peer, peer);
		struct cuda_nccl_chan **ch = sending ? &w->send[plan.kind[i] * stages + peer]
						     : &w->recv[plan.kind[i] * stages + peer];
		rc = open_chan(w, ch, 2, id_of(ids, per, base + plan.from[i], plan.slot[i]),
			       sending ? 0 : 1, timeout, who, what);
	}
	if (!rc && replicas > 1) {
		char what[64], who[64];
		snprintf(what, sizeof(what), "the %d replicas of stage %d", replicas, w->stage);
		snprintf(who, sizeof(who), "the ranks of stage %d's other replicas", w->stage);
		rc = open_chan(w, &w->dp, replicas, id_of(ids, per, w->stage, plan.ids), w->replica,
			       timeout, who, what);
	}
	free(seq);
	free(ids);
	nccl_plan_free(&plan);
	if (rc)
		nccl_world_close(w);
	return rc ? -1 : 0;
}

void nccl_world_close(struct nccl_world *w)
{
	/* in the order they opened, as the peers close theirs (ncclCommDestroy
	 * is collective: nccl_plan_sequence) */
	for (int i = 0; i < w->n_open; i++)
		cuda_nccl_chan_close(w->open[i]);
	free(w->open);
	free(w->send);
	free(w->recv);
	free(w->piece_stage);
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
