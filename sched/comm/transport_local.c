/* transport_local.c - in-process message queues between stage threads.
 *
 * One mailbox per receiving stage holds a linked list of messages; a
 * receive scans it for its (from, kind, mb). Buffers are recycled through a
 * free list, so after warm-up no memory is allocated and no activation is
 * copied: the receiver computes straight from the sender's buffer.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "transport.h"

struct msg {
	int from, kind, mb;
	void *buf;
	struct msg *next;
};

struct mailbox {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct msg *head;
};

struct local {
	struct transport t;
	const struct backend *be;
	int S;
	size_t n;             /* bytes per message */
	struct mailbox *box; /* [S] */
	pthread_mutex_t pool_mu;
	void **pool;
	int n_pool, cap_pool;
	int n_allocated;
	void **all;
};

static void *local_buffer(struct transport *t, int from, size_t n)
{
	struct local *l = (struct local *)t;
	if (n > l->n)
		die("internal error: message of %zu bytes, transport sized for %zu", n, l->n);
	pthread_mutex_lock(&l->pool_mu);
	void *b;
	if (l->n_pool) {
		b = l->pool[--l->n_pool];
	} else {
		b = l->be->alloc(l->n);
		l->all = xrealloc(l->all, sizeof(void *) * (size_t)(l->n_allocated + 1));
		l->all[l->n_allocated++] = b;
	}
	pthread_mutex_unlock(&l->pool_mu);
	return b;
}

static void local_send(struct transport *t, int from, int to, int kind, int mb, void *buf)
{
	struct local *l = (struct local *)t;
	struct msg *m = xmalloc(sizeof(*m));
	*m = (struct msg){from, kind, mb, buf, NULL};
	struct mailbox *box = &l->box[to];
	pthread_mutex_lock(&box->mu);
	struct msg **p = &box->head;
	while (*p)
		p = &(*p)->next;
	*p = m;
	pthread_cond_broadcast(&box->cv);
	pthread_mutex_unlock(&box->mu);
}

static void *local_recv(struct transport *t, int to, int from, int kind, int mb, double *waited)
{
	struct local *l = (struct local *)t;
	struct mailbox *box = &l->box[to];
	double t0 = now_sec();
	pthread_mutex_lock(&box->mu);
	for (;;) {
		for (struct msg **p = &box->head; *p; p = &(*p)->next) {
			struct msg *m = *p;
			if (m->from == from && m->kind == kind && m->mb == mb) {
				*p = m->next;
				pthread_mutex_unlock(&box->mu);
				void *buf = m->buf;
				free(m);
				if (waited)
					*waited = now_sec() - t0;
				return buf;
			}
		}
		pthread_cond_wait(&box->cv, &box->mu);
	}
}

static void local_release(struct transport *t, int stage, void *buf)
{
	struct local *l = (struct local *)t;
	pthread_mutex_lock(&l->pool_mu);
	if (l->n_pool == l->cap_pool) {
		l->cap_pool = l->cap_pool ? 2 * l->cap_pool : 16;
		l->pool = xrealloc(l->pool, sizeof(void *) * (size_t)l->cap_pool);
	}
	l->pool[l->n_pool++] = buf;
	pthread_mutex_unlock(&l->pool_mu);
}

static void local_destroy(struct transport *t)
{
	struct local *l = (struct local *)t;
	for (int s = 0; s < l->S; s++) {
		struct msg *m = l->box[s].head;
		while (m) {
			struct msg *next = m->next;
			free(m);
			m = next;
		}
		pthread_mutex_destroy(&l->box[s].mu);
		pthread_cond_destroy(&l->box[s].cv);
	}
	for (int i = 0; i < l->n_allocated; i++)
		l->be->free(l->all[i]);
	free(l->all);
	free(l->pool);
	free(l->box);
	pthread_mutex_destroy(&l->pool_mu);
	free(l);
}

struct transport *transport_local(const struct backend *be, int S, size_t msg_bytes)
{
	struct local *l = xcalloc(1, sizeof(*l));
	l->t = (struct transport){"local", local_buffer, local_send, local_recv, local_release,
				  local_destroy};
	l->be = be;
	l->S = S;
	l->n = msg_bytes;
	l->box = xcalloc((size_t)S, sizeof(*l->box));
	for (int s = 0; s < S; s++) {
		pthread_mutex_init(&l->box[s].mu, NULL);
		pthread_cond_init(&l->box[s].cv, NULL);
	}
	pthread_mutex_init(&l->pool_mu, NULL);
	return &l->t;
}
