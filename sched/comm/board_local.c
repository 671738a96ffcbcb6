/* board_local.c - the step-finish board of stage threads in one process.
 *
 * One entry per step of the segment under one mutex: the sums of squares in
 * global order, how many stages posted and finished, and the two raw tied
 * parts (backend copies, returned to a small pool when every stage is done
 * with the step, so that a segment allocates them only for its first steps).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "board.h"

struct entry {
	int posted, consumed;
	double *sumsq;            /* [total] */
	float *part[2];           /* stage 0's embedding part, the last stage's head part */
};

/* tied parts kept for reuse: two steps in flight, two parts each */
#define TIED_POOL 4

struct local_board {
	struct board b;
	float *pool[TIED_POOL];   /* free tied parts, [tied_n] each */
	int npool;
	const struct backend *be;
	int *n_tensors;
	size_t *offset;           /* [S] first sum of stage s in sumsq */
	size_t tied_n;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct entry *e;
	long first_step;
	int n_steps;
};

static struct entry *entry(struct local_board *l, long step)
{
	long i = step - l->first_step - 1;
	if (i < 0 || i >= l->n_steps)
		die("internal error: step %ld outside the segment (%ld, %ld]", step, l->first_step,
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

/* A tied part from the pool, or a new one. */
static float *take_part(struct local_board *l)
{
	float *p = NULL;
	pthread_mutex_lock(&l->mu);
	if (l->npool)
		p = l->pool[--l->npool];
	pthread_mutex_unlock(&l->mu);
	return p ? p : l->be->alloc(l->tied_n * sizeof(float));
}

/* Back to the pool, or freed when it is full. Called with l->mu held. */
static void give_part(struct local_board *l, float *p)
{
	if (l->npool < TIED_POOL)
		l->pool[l->npool++] = p;
	else
		l->be->free(p);
}

static void lb_tied_post(struct board *b, int s, long step, const float *part)
{
	struct local_board *l = (struct local_board *)b;
	float *copy = take_part(l);
	l->be->copy(copy, part, l->tied_n * sizeof(float));
	pthread_mutex_lock(&l->mu);
	entry(l, step)->part[part_of(b, s)] = copy;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static const float *lb_tied_wait(struct board *b, int s, long step, double *waited)
{
	struct local_board *l = (struct local_board *)b;
	double t0 = now_sec();
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	int other = 1 - part_of(b, s);
	while (!e->part[other])
		pthread_cond_wait(&l->cv, &l->mu);
	const float *p = e->part[other];
	pthread_mutex_unlock(&l->mu);
	*waited = now_sec() - t0;
	return p;
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
	while (e->posted < b->S)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	*waited = now_sec() - t0;
	return e->sumsq;
}

static void lb_done(struct board *b, int s, long step)
{
	struct local_board *l = (struct local_board *)b;
	pthread_mutex_lock(&l->mu);
	struct entry *e = entry(l, step);
	if (++e->consumed == b->S) {
		for (int i = 0; i < 2; i++) {
			if (e->part[i])
				give_part(l, e->part[i]);
			e->part[i] = NULL;
		}
	}
	pthread_mutex_unlock(&l->mu);
}

static void lb_end(struct board *b)
{
	struct local_board *l = (struct local_board *)b;
	for (int i = 0; i < l->n_steps; i++) {
		for (int k = 0; k < 2; k++)
			if (l->e[i].part[k])
				l->be->free(l->e[i].part[k]);
		free(l->e[i].sumsq);
	}
	free(l->e);
	l->e = NULL;
	l->n_steps = 0;
}

static void lb_destroy(struct board *b)
{
	struct local_board *l = (struct local_board *)b;
	if (l->e)
		lb_end(b);
	for (int i = 0; i < l->npool; i++)
		l->be->free(l->pool[i]);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l->n_tensors);
	free(l->offset);
	free(l);
}

struct board *board_local(const struct backend *be, int S, const int *n_tensors,
			  size_t tied_n)
{
	struct local_board *l = xcalloc(1, sizeof(*l));
	l->be = be;
	l->tied_n = tied_n;
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
			      .done = lb_done, .poll = NULL, .end = lb_end, .destroy = lb_destroy};
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	return &l->b;
}
