/* barrier.h - a reusable barrier for the threads of one process that a
 * failed segment can call off: the replicas' gradient sum (replica_local.c)
 * and the experts' exchange (experts_local.c) meet at one. */
#ifndef ASYNCPP_BARRIER_H
#define ASYNCPP_BARRIER_H

#include <pthread.h>
#include <stdatomic.h>

struct barrier {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n, count;
	unsigned long gen;
	const atomic_int *aborted; /* the owner's flag: when set, no one waits */
};

void barrier_init(struct barrier *b, int n, const atomic_int *aborted);
void barrier_destroy(struct barrier *b);
/* Wait until n threads are here (or *aborted); returns the seconds blocked. */
double barrier_wait(struct barrier *b);
/* Wake every waiter, once *aborted is set. */
void barrier_wake(struct barrier *b);

#endif
