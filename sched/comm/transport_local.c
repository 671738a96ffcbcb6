/* transport_local.c - in-process message queues between stage threads.
 *
 * One mailbox per receiving stage holds a linked list of messages; a
 * receive scans it for its (from, kind, mb). Buffers are recycled through
 * free lists, so after warm-up no memory is allocated, and between stages
 * on one device no activation is copied: the receiver computes straight
 * from the sender's buffer.
 *
 * With lanes (backend.h: pipeline.devices; stage s runs on lane s) every
 * hand-off carries a fence. A message's fence orders the receiver after
 * the ops that filled it; a freed buffer's fence orders its next writer
 * after the last ops that read it. Between two devices the receiver copies
 * the message into a buffer of its own device (a peer copy on its lane)
 * and gives the sender's buffer back at once. With one lane every fence is
 * NULL and this is the plain zero-copy queue.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <stdatomic.h>

#include "../../io/util.h"
#include "transport.h"

struct msg {
	int from, kind, mb;
	void *buf;
	void *fence;          /* after the ops that filled buf (NULL: one lane) */
	struct msg *next;
};

struct mailbox {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct msg *head;
};

/* a free buffer, and the fence after the last ops that used it */
struct spare {
	void *buf;
	void *fence;
};

/* free buffers of one stage's lane (its device's memory) */
struct pool {
	struct spare *v;
	int n, cap;
};

struct local {
	struct transport t;
	const struct backend *be;
	int S;
	int *lane;            /* [S] each stage's lane (pieces of one stage share it) */
	size_t n;             /* bytes per message */
	struct mailbox *box;  /* [S] */
	pthread_mutex_t pool_mu;
	struct pool *pool;    /* [S] by the stage (lane) whose device holds them */
	int n_allocated;
	void **all;           /* every buffer, */
	int *all_stage;       /* and the stage that allocated it */
	atomic_int aborted;   /* the segment was called off (transport.h) */
};

/* Stage s's lane's device is stage t's. */
static int same_device(const struct local *l, int s, int t)
{
	return backend_same_device(l->be, l->lane[s], l->lane[t]);
}

/* A free buffer for stage s (called on its lane), ready to be written. */
static void *take(struct local *l, int s)
{
	pthread_mutex_lock(&l->pool_mu);
	struct pool *p = &l->pool[s];
	struct spare sp = {NULL, NULL};
	if (p->n)
		sp = p->v[--p->n];
	pthread_mutex_unlock(&l->pool_mu);
	if (sp.buf) {
		backend_fence_take(l->be, sp.fence);
		return sp.buf;
	}
	void *b = l->be->alloc(l->n);
	if (!b) {
		error("cannot allocate a %zu-byte message buffer for stage %d on backend '%s'", l->n,
		      s, l->be->name);
		return NULL;
	}
	pthread_mutex_lock(&l->pool_mu);
	l->all = xrealloc(l->all, sizeof(void *) * (size_t)(l->n_allocated + 1));
	l->all_stage = xrealloc(l->all_stage, sizeof(int) * (size_t)(l->n_allocated + 1));
	l->all[l->n_allocated] = b;
	l->all_stage[l->n_allocated++] = s;
	pthread_mutex_unlock(&l->pool_mu);
	return b;
}

/* Back to stage s's free list; fence (or NULL) follows its last use. */
static void give(struct local *l, int s, void *buf, void *fence)
{
	pthread_mutex_lock(&l->pool_mu);
	struct pool *p = &l->pool[s];
	if (p->n == p->cap) {
		p->cap = p->cap ? 2 * p->cap : 16;
		p->v = xrealloc(p->v, sizeof(*p->v) * (size_t)p->cap);
	}
	p->v[p->n++] = (struct spare){buf, fence};
	pthread_mutex_unlock(&l->pool_mu);
}

static void *local_buffer(struct transport *t, int from, size_t n)
{
	struct local *l = (struct local *)t;
	if (n > l->n)
		bug("message of %zu bytes, transport sized for %zu", n, l->n);
	return take(l, from);
}

static void local_send(struct transport *t, int from, int to, int kind, int mb, void *buf)
{
	struct local *l = (struct local *)t;
	struct msg *m = xmalloc(sizeof(*m));
	*m = (struct msg){from, kind, mb, buf, backend_fence(l->be), NULL};
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
	struct msg *m = NULL;
	pthread_mutex_lock(&box->mu);
	while (!m && !atomic_load(&l->aborted)) {
		for (struct msg **p = &box->head; *p; p = &(*p)->next)
			if ((*p)->from == from && (*p)->kind == kind && (*p)->mb == mb) {
				m = *p;
				*p = m->next;
				break;
			}
		if (!m)
			pthread_cond_wait(&box->cv, &box->mu);
	}
	pthread_mutex_unlock(&box->mu);
	if (!m)
		return NULL; /* aborted */
	if (waited)
		*waited = now_sec() - t0;
	void *buf = m->buf;
	backend_fence_take(l->be, m->fence); /* after the sender's ops */
	if (!same_device(l, from, to)) {
		/* a peer copy onto this stage's device; the sender's buffer goes
		 * back once the copy has read it */
		void *own = take(l, to);
		if (!own) { /* error() said why: the stage fails */
			give(l, from, buf, NULL);
			free(m);
			return NULL;
		}
		l->be->copy(own, buf, l->n);
		give(l, from, buf, backend_fence(l->be));
		buf = own;
	}
	free(m);
	return buf;
}

static void local_release(struct transport *t, int stage, void *buf)
{
	struct local *l = (struct local *)t;
	give(l, stage, buf, backend_fence(l->be));
}

static void local_abort(struct transport *t)
{
	struct local *l = (struct local *)t;
	atomic_store(&l->aborted, 1);
	for (int s = 0; s < l->S; s++) {
		pthread_mutex_lock(&l->box[s].mu);
		pthread_cond_broadcast(&l->box[s].cv);
		pthread_mutex_unlock(&l->box[s].mu);
	}
}

/* After a synchronize (pipeline_run's), so no fence is still needed. */
static void local_destroy(struct transport *t)
{
	struct local *l = (struct local *)t;
	int before = backend_lane_current(l->be); /* bound again when done */
	for (int s = 0; s < l->S; s++) {
		struct msg *m = l->box[s].head;
		while (m) {
			struct msg *next = m->next;
			if (m->fence)
				l->be->fence_free(m->fence);
			free(m);
			m = next;
		}
		pthread_mutex_destroy(&l->box[s].mu);
		pthread_cond_destroy(&l->box[s].cv);
		for (int i = 0; i < l->pool[s].n; i++)
			if (l->pool[s].v[i].fence)
				l->be->fence_free(l->pool[s].v[i].fence);
		free(l->pool[s].v);
	}
	/* each buffer freed on a lane of its device */
	for (int i = 0; i < l->n_allocated; i++) {
		backend_lane_bind(l->be, l->lane[l->all_stage[i]]);
		l->be->free(l->all[i]);
	}
	backend_lane_bind(l->be, before);
	free(l->all);
	free(l->all_stage);
	free(l->lane);
	free(l->pool);
	free(l->box);
	pthread_mutex_destroy(&l->pool_mu);
	free(l);
}

struct transport *transport_local(const struct backend *be, int S, const int *lane,
				  size_t msg_bytes)
{
	struct local *l = xcalloc(1, sizeof(*l));
	l->lane = xmalloc((size_t)S * sizeof(int));
	for (int s = 0; s < S; s++)
		l->lane[s] = lane ? lane[s] : s;
	l->t = (struct transport){"local", local_buffer, local_send, local_recv, local_release,
				  local_destroy, local_abort};
	l->be = be;
	l->S = S;
	l->n = msg_bytes;
	l->box = xcalloc((size_t)S, sizeof(*l->box));
	l->pool = xcalloc((size_t)S, sizeof(*l->pool));
	for (int s = 0; s < S; s++) {
		pthread_mutex_init(&l->box[s].mu, NULL);
		pthread_cond_init(&l->box[s].cv, NULL);
	}
	pthread_mutex_init(&l->pool_mu, NULL);
	return &l->t;
}
