/* transport_nccl.c - activations and gradients between GPU processes over
 * NCCL channels (nccl.h).
 *
 * A send queues ncclSend on the channel of its direction, after the
 * kernels that filled the buffer (cuda_nccl.h orders every transfer after
 * the compute stream's queued work); the buffer stays out of the pool until
 * the transfer's event completes, so a send never blocks the host. A
 * receive queues ncclRecv into a pool buffer and waits on the host for its
 * event, under pipeline.timeout: a peer that never sends is named, not a
 * hang. Waiting on the host costs the launch latency of the next kernel;
 * what it buys is the diagnosable timeout and a buffer that is complete
 * when recv returns, as the other transports promise.
 *
 * Messages are matched by order per channel, not by (kind, mb): the
 * schedule's order, proven equal on both ends by sched_check_channel_order
 * before the run starts (trainer.c). The (kind, mb) arguments name the
 * tensor in timeout messages.
 *
 * Stages are addressed as model pieces (pieces.h), global piece r*P + q
 * being held by rank r*stages + stage(q): a message goes on the channel
 * of its kind to the peer stage, whichever of that stage's pieces it is
 * for, and a handoff between two pieces of this rank (zb-v's turn) waits
 * in a local queue, the buffer itself, never leaving the process.
 */
#include "nccl.h"
#include "transport.h"

#ifndef ASYNCPP_CUDA

struct transport *transport_nccl(const struct backend *be, struct nccl_world *w,
				 size_t msg_bytes, double timeout)
{
	error("pipeline.transport = nccl needs a CUDA build of asyncpp");
	return NULL;
}

#else

#include <stdlib.h>

#include "../../kernels/cuda/cuda_nccl.h"
#include "handoff.h"

struct pending {
	struct cuda_nccl_event *ev;
	void *buf;
};

struct nccl_tp {
	struct transport t;
	const struct backend *be;
	struct nccl_world *w;
	size_t bytes;             /* every message's size */
	double timeout;
	void **free, **all;      /* the buffer pool */
	int n_free, n_all;
	struct pending *pend;
	int n_pend, cap_pend;
	struct handoffs local;    /* between two pieces of this rank (handoff.h) */
};

/* The rank holding global piece g (pieces.h). */
static int rank_of(const struct nccl_tp *x, int g)
{
	const struct nccl_world *w = x->w;
	if (!w->piece_stage)
		return g; /* one piece per stage */
	return g / w->P * w->stages + w->piece_stage[g % w->P];
}

static void *pool_get(struct nccl_tp *x)
{
	if (x->n_free)
		return x->free[--x->n_free];
	void *b = x->be->alloc(x->bytes);
	if (!b)
		nccl_fail("rank %d: cannot allocate a %zu-byte message buffer on the GPU", x->w->rank,
			  x->bytes);
	x->all = xrealloc(x->all, sizeof(void *) * (size_t)(x->n_all + 1));
	x->free = xrealloc(x->free, sizeof(void *) * (size_t)(x->n_all + 1));
	x->all[x->n_all++] = b;
	return b;
}

static void pool_put(struct nccl_tp *x, void *b)
{
	x->free[x->n_free++] = b; /* room for every buffer ever allocated */
}

/* Buffers of completed sends back to the pool. */
static void reap(struct nccl_tp *x)
{
	int j = 0;
	for (int i = 0; i < x->n_pend; i++) {
		struct pending *p = &x->pend[i];
		int done = cuda_nccl_event_done(p->ev, NULL);
		if (done < 0)
			nccl_fail("rank %d (stage %d): a send failed", x->w->rank, x->w->stage);
		if (done) {
			cuda_nccl_event_free(p->ev);
			pool_put(x, p->buf);
		} else {
			x->pend[j++] = *p;
		}
	}
	x->n_pend = j;
}

static const char *tensor_name(int kind) { return kind == MSG_ACT ? "activation" : "gradient"; }

static void *nccl_buffer(struct transport *t, int from, size_t n)
{
	struct nccl_tp *x = (struct nccl_tp *)t;
	if (n > x->bytes)
		bug("message of %zu bytes, transport sized for %zu bytes", n,
		    x->bytes);
	reap(x);
	return pool_get(x);
}

/* The channel of a message between this rank and `peer` (global ranks), and
 * the peer's rank in it. */
/* The channel of a message of this kind sent to (received from) rank
 * peer, and the peer's rank on it: the sender is rank 0. */
static struct cuda_nccl_chan *channel(struct nccl_tp *x, int sending, int peer, int kind,
				      int *chan_peer)
{
	struct nccl_world *w = x->w;
	int ps = peer % w->stages, same_replica = peer / w->stages == w->replica;
	struct cuda_nccl_chan *ch = NULL;
	if (same_replica && ps != w->stage)
		ch = sending ? w->send[kind * w->stages + ps] : w->recv[kind * w->stages + ps];
	*chan_peer = sending ? 1 : 0;
	if (!ch)
		bug("rank %d (stage %d) %s a %s %s rank %d, which it has no channel %s",
		    w->rank, w->stage, sending ? "sends" : "receives", tensor_name(kind),
		    sending ? "to" : "from", peer, sending ? "to" : "from");
	return ch;
}

static void nccl_send(struct transport *t, int from, int to, int kind, int mb, void *buf)
{
	struct nccl_tp *x = (struct nccl_tp *)t;
	if (rank_of(x, from) != x->w->rank)
		bug("rank %d sends as piece %d of rank %d", x->w->rank, from, rank_of(x, from));
	int dest = rank_of(x, to);
	if (dest == x->w->rank) {
		handoff_put(&x->local, to, kind, mb, buf);
		return;
	}
	int peer;
	struct cuda_nccl_chan *ch = channel(x, 1, dest, kind, &peer);
	struct cuda_nccl_event *ev = cuda_nccl_chan_send(ch, buf, x->bytes, peer);
	if (!ev)
		nccl_fail("rank %d (stage %d): cannot send the %s of micro-batch %d to rank %d",
			  x->w->rank, x->w->stage, tensor_name(kind), mb, dest);
	if (x->n_pend == x->cap_pend) {
		x->cap_pend = x->cap_pend ? 2 * x->cap_pend : 16;
		x->pend = xrealloc(x->pend, sizeof(*x->pend) * (size_t)x->cap_pend);
	}
	x->pend[x->n_pend++] = (struct pending){ev, buf};
}

static void *nccl_recv(struct transport *t, int to, int from, int kind, int mb, double *waited)
{
	struct nccl_tp *x = (struct nccl_tp *)t;
	if (rank_of(x, to) != x->w->rank)
		bug("rank %d receives as piece %d of rank %d", x->w->rank, to, rank_of(x, to));
	int src = rank_of(x, from);
	if (src == x->w->rank) {
		/* sent earlier by this thread: the schedule orders the two */
		void *buf = handoff_take(&x->local, to, kind, mb);
		if (waited)
			*waited = 0.0;
		if (buf)
			return buf;
		bug("rank %d: piece %d receives the %s of micro-batch %d from piece %d of the same "
		    "stage, which has not sent it", x->w->rank, to, tensor_name(kind), mb, from);
	}
	reap(x);
	int peer;
	struct cuda_nccl_chan *ch = channel(x, 0, src, kind, &peer);
	void *buf = pool_get(x);
	struct cuda_nccl_event *ev = cuda_nccl_chan_recv(ch, buf, x->bytes, peer);
	if (!ev)
		nccl_fail("rank %d (stage %d): cannot receive the %s of micro-batch %d from rank %d",
			  x->w->rank, x->w->stage, tensor_name(kind), mb, src);
	double w = nccl_wait(ev, ch, x->timeout, x->w->rank, x->w->stage,
			     "the %s of micro-batch %d from rank %d (stage %d)", tensor_name(kind),
			     mb, src, src % x->w->stages);
	cuda_nccl_event_free(ev);
	if (waited)
		*waited = w;
	return buf;
}

static void nccl_release(struct transport *t, int stage, void *buf)
{
	/* kernels queued on the compute stream may still read buf: the next
	 * transfer into it is queued after them (cuda_nccl.h) */
	pool_put((struct nccl_tp *)t, buf);
}

static void nccl_destroy(struct transport *t)
{
	struct nccl_tp *x = (struct nccl_tp *)t;
	for (int i = 0; i < x->n_pend; i++) {
		nccl_wait(x->pend[i].ev, NULL, x->timeout, x->w->rank, x->w->stage,
			  "the next stage to take the last %s", "messages");
		cuda_nccl_event_free(x->pend[i].ev);
	}
	for (int i = 0; i < x->n_all; i++)
		x->be->free(x->all[i]); /* the local queue's buffers are the pool's too */
	free(x->local.v);
	free(x->all);
	free(x->free);
	free(x->pend);
	free(x);
}

struct transport *transport_nccl(const struct backend *be, struct nccl_world *w,
				 size_t msg_bytes, double timeout)
{
	struct nccl_tp *x = xcalloc(1, sizeof(*x));
	x->t = (struct transport){"nccl", nccl_buffer, nccl_send, nccl_recv, nccl_release,
				  nccl_destroy, NULL}; /* a failed stage ends the job */
	x->be = be;
	x->w = w;
	x->bytes = msg_bytes;
	x->timeout = timeout;
	return &x->t;
}

#endif
