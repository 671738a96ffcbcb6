/* barrier.c - the reusable barrier of barrier.h */
#include "barrier.h"

#include "../../io/util.h"

void barrier_init(struct barrier *b, int n, const atomic_int *aborted)
{
	b->aborted = aborted;
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	b->n = n;
	b->count = 0;
	b->gen = 0;
}

void barrier_destroy(struct barrier *b)
{
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
}

double barrier_wait(struct barrier *b)
{
	double t0 = now_sec();
	pthread_mutex_lock(&b->mu);
	unsigned long gen = b->gen;
	if (++b->count == b->n) {
		b->count = 0;
		b->gen++;
		pthread_cond_broadcast(&b->cv);
	} else {
		while (gen == b->gen && !atomic_load(b->aborted))
			pthread_cond_wait(&b->cv, &b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	return now_sec() - t0;
}

void barrier_wake(struct barrier *b)
{
	pthread_mutex_lock(&b->mu);
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
}
