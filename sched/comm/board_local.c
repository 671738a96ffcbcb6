/* board_local.c - the step-finish board of stage threads in one process.
 *
 * One entry per step of the segment under one mutex: the sums of squares in
 * global order, how many stages posted and finished, and the two raw tied
 * parts (backend copies, returned to a small pool when every stage is done
 * with the step, so that a segment allocates them only for its first steps).
 *
 * With lanes (backend.h; stage s on lane s) a part carries fences: the
 * poster's after its copy, which the other end waits on before reading,
 * and the reader's after its last read, which whoever takes the buffer
 * from the pool next waits on. A reader on another device reads a peer
 * copy of the part made on its own lane. Pools are per stage (per lane,
 * so a buffer never leaves its device). With V pieces per stage, "stage"
 * here is a piece and lane[] says its stage's lane.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "board.h"

/* a tied part in backend memory, and the stage (lane) that allocated it */
struct part {
	float *p;                 /* [tied_n], NULL when absent */
	int owner;
};

struct entry {
	int posted, consumed;
	double *sumsq;            /* [total] */
	struct part part[2];      /* stage 0's embedding part, the last stage's head part */
	void *posted_fence[2];    /* after the copy into part[k] (NULL: one lane) */
	struct part peer[2];      /* part[k] copied to the reader's device, if it differs */
	void *read_fence[2];      /* after the reader's last use of part[k], */
	void *peer_fence[2];      /* and of peer[k] */
};

/* free parts of one stage's device, each with the fence after its last
 * use; kept until the board is destroyed (a stage has at most two steps in
 * flight, an own part and a peer copy each, so a pool stays small) */
struct tied_pool {
	float **p;
	void **fence;
	int n, cap;
};

struct local_board {
	struct board b;
	struct tied_pool *pool;   /* [S] */
	int *lane;                /* [S] each stage's lane (a stage's pieces share one) */
	const struct backend *be;
	int *n_tensors;
	size_t *offset;           /* [S] first sum of stage s in sumsq */
	size_t tied_n;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct entry *e;
	long first_step;
	int n_steps;
	int aborted;              /* under mu: the segment was called off (board.h) */
};

static struct entry *entry(struct local_board *l, long step)
{
	long i = step - l->first_step - 1;
	if (i < 0 || i >= l->n_steps)
		bug("step %ld outside the segment (%ld, %ld]", step, l->first_step,
		    l->first_step + l->n_steps);
	return &l->e[i];
}

static void lb_begin(struct board *b, long first_step, int n_steps)
{
	struct local_board *l = (struct local_board *)b;
	l->first_step = first_step;
	l->n_steps = n_steps;
	l->e = xcalloc((size_t)n_steps, sizeof(*l->e));
	for (int i = 0; i < n_steps; i++)
		l->e[i].sumsq = xcalloc(b->total + 1, sizeof(double));
}

/* part index of stage s: 0 for stage 0, 1 for the last stage */
static int part_of(const struct board *b, int s) { return s == 0 ? 0 : 1; }

/* A tied part for stage s (on its lane), from its pool or new, ready to
 * be written; p NULL after error() when none can be allocated. */
static struct part take_part(struct local_board *l, int s)
{
	float *p = NULL;
	void *fence = NULL;
	pthread_mutex_lock(&l->mu);
	struct tied_pool *tp = &l->pool[s];
	if (tp->n) {
		tp->n--;
		p = tp->p[tp->n], fence = tp->fence[tp->n];
	}
	pthread_mutex_unlock(&l->mu);
	backend_fence_take(l->be, fence);
	if (!p && !(p = l->be->alloc(l->tied_n * sizeof(float))))
		error("cannot allocate the tied embedding's gradient part for stage %d on backend "
		      "'%s'", s, l->be->name);
	return (struct part){p, s};
}

/* Back to its owner's pool. Called with l->mu held, on any thread. */
static void give_part(struct local_board *l, struct part pt, void *fence)
{
	struct tied_pool *tp = &l->pool[pt.owner];
	if (tp->n == tp->cap) {
		tp->cap = tp->cap ? 2 * tp->cap : 4;
		tp->p = xrealloc(tp->p, sizeof(*tp->p) * (size_t)tp->cap);
		tp->fence = xrealloc(tp->fence, sizeof(*tp->fence) * (size_t)tp->cap);
	}
	tp->p[tp->n] = pt.p, tp->fence[tp->n] = fence;
	tp->n++;
}

static int lb_tied_post(struct board *b, int s, long step, const float *part)
{
	struct local_board *l = (struct local_board *)b;
	struct part copy = take_part(l, s);
	if (!copy.p)
		return -1;
	l->be->copy(copy.p, part, l->tied_n * sizeof(float));
	void *fence = backend_fence(l->be);
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	e->part[part_of(b, s)] = copy;
	e->posted_fence[part_of(b, s)] = fence;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	return 0;
}

static const float *lb_tied_wait(struct board *b, int s, long step, double *waited)
{
	struct local_board *l = (struct local_board *)b;
	double t0 = now_sec();
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	int other = 1 - part_of(b, s);
	while (!e->part[other].p && !l->aborted)
		pthread_cond_wait(&l->cv, &l->mu);
	if (l->aborted) {
		pthread_mutex_unlock(&l->mu);
		return NULL;
	}
	struct part p = e->part[other];
	void *fence = e->posted_fence[other];
	e->posted_fence[other] = NULL;
	pthread_mutex_unlock(&l->mu);
	backend_fence_take(l->be, fence);
	if (!backend_same_device(l->be, l->lane[p.owner], l->lane[s])) {
		struct part own = take_part(l, s);
		if (!own.p)
			return NULL; /* error() said why */
		l->be->copy(own.p, p.p, l->tied_n * sizeof(float));
		pthread_mutex_lock(&l->mu);
		e->peer[other] = own;
		pthread_mutex_unlock(&l->mu);
		p = own;
	}
	*waited = now_sec() - t0;
	return p.p;
}

static void lb_post(struct board *b, int s, long step, const double *sumsq)
{
	struct local_board *l = (struct local_board *)b;
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	memcpy(e->sumsq + l->offset[s], sumsq, (size_t)l->n_tensors[s] * sizeof(double));
	e->posted++;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static const double *lb_wait(struct board *b, int s, long step, double *waited)
{
	struct local_board *l = (struct local_board *)b;
	double t0 = now_sec();
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	while (e->posted < b->S && !l->aborted)
		pthread_cond_wait(&l->cv, &l->mu);
	int aborted = l->aborted;
	pthread_mutex_unlock(&l->mu);
	*waited = now_sec() - t0;
	return aborted ? NULL : e->sumsq;
}

static void lb_done(struct board *b, int s, long step)
{
	struct local_board *l = (struct local_board *)b;
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	/* stage s has queued its last read of the other end's part (or of
	 * its peer copy): fences after it for the next users of the buffers */
	if (s == 0 || s == b->S - 1) {
		int read = 1 - part_of(b, s);
		if (e->part[read].p)
			e->read_fence[read] = backend_fence(l->be);
		if (e->peer[read].p)
			e->peer_fence[read] = backend_fence(l->be);
	}
	if (++e->consumed == b->S) {
		for (int i = 0; i < 2; i++) {
			if (e->peer[i].p)
				give_part(l, e->peer[i], e->peer_fence[i]);
			if (e->part[i].p)
				give_part(l, e->part[i], e->read_fence[i]);
			if (e->posted_fence[i]) /* never waited on: nobody read it */
				l->be->fence_free(e->posted_fence[i]);
			e->part[i] = e->peer[i] = (struct part){NULL, 0};
			e->read_fence[i] = e->peer_fence[i] = e->posted_fence[i] = NULL;
		}
	}
	pthread_mutex_unlock(&l->mu);
}

static void lb_abort(struct board *b)
{
	struct local_board *l = (struct local_board *)b;
	pthread_mutex_lock(&l->mu);
	l->aborted = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static void lb_end(struct board *b)
{
	struct local_board *l = (struct local_board *)b;
	int before = backend_lane_current(l->be); /* bound again when done */
	for (int i = 0; i < l->n_steps; i++) {
		struct entry *e = &l->e[i];
		for (int k = 0; k < 2; k++) {
			void *fences[3] = {e->posted_fence[k], e->read_fence[k], e->peer_fence[k]};
			for (int f = 0; f < 3; f++)
				if (fences[f])
					l->be->fence_free(fences[f]);
			struct part parts[2] = {e->part[k], e->peer[k]};
			for (int q = 0; q < 2; q++)
				if (parts[q].p) {
					backend_lane_bind(l->be, l->lane[parts[q].owner]);
					l->be->free(parts[q].p);
				}
		}
		free(e->sumsq);
	}
	backend_lane_bind(l->be, before);
	free(l->e);
	l->e = NULL;
	l->n_steps = 0;
}

static void lb_destroy(struct board *b)
{
	struct local_board *l = (struct local_board *)b;
	int before = backend_lane_current(l->be); /* bound again when done */
	if (l->e)
		lb_end(b);
	for (int s = 0; s < b->S; s++) {
		backend_lane_bind(l->be, l->lane[s]);
		for (int i = 0; i < l->pool[s].n; i++) {
			if (l->pool[s].fence[i])
				l->be->fence_free(l->pool[s].fence[i]);
			l->be->free(l->pool[s].p[i]);
		}
		free(l->pool[s].p);
		free(l->pool[s].fence);
	}
	backend_lane_bind(l->be, before);
	free(l->pool);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l->n_tensors);
	free(l->offset);
	free(l->lane);
	free(l);
}

struct board *board_local(const struct backend *be, int S, const int *lane,
			  const int *n_tensors, size_t tied_n)
{
	struct local_board *l = xcalloc(1, sizeof(*l));
	l->be = be;
	l->lane = xmalloc((size_t)S * sizeof(int));
	for (int s = 0; s < S; s++)
		l->lane[s] = lane ? lane[s] : s;
	l->tied_n = tied_n;
	l->pool = xcalloc((size_t)S, sizeof(*l->pool));
	l->n_tensors = xcalloc((size_t)S, sizeof(int));
	l->offset = xcalloc((size_t)S, sizeof(size_t));
	size_t total = 0;
	for (int s = 0; s < S; s++) {
		l->n_tensors[s] = n_tensors[s];
		l->offset[s] = total;
		total += (size_t)n_tensors[s];
	}
	l->b = (struct board){.name = "local", .S = S, .n_tensors = l->n_tensors, .total = total,
			      .begin = lb_begin, .tied_post = lb_tied_post,
			      .tied_wait = lb_tied_wait, .post = lb_post, .wait = lb_wait,
			      .done = lb_done, .poll = NULL, .end = lb_end, .destroy = lb_destroy,
			      .abort = lb_abort};
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	return &l->b;
}
