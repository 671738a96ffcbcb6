/* handoff.h - messages between two model pieces of one process.
 *
 * A stage that holds several pieces (pieces.h: interleaved with one stage,
 * zb-v's turn at the last stage) hands a piece's output to its own next
 * piece without a wire: the carriers between processes (transport_p2p,
 * transport_nccl) keep the buffer itself here until the receiving piece
 * asks for it. One thread per process uses a transport, and the schedule
 * puts the send before the receive, so a list and no locking suffice.
 */
#ifndef ASYNCPP_HANDOFF_H
#define ASYNCPP_HANDOFF_H

#include <stddef.h>

#include "../../io/util.h"

struct handoff {
	int to, kind, mb;
	void *buf;
};

struct handoffs {
	struct handoff *v;
	int n, cap;
};

static inline void handoff_put(struct handoffs *h, int to, int kind, int mb, void *buf)
{
	if (h->n == h->cap) {
		h->cap = h->cap ? 2 * h->cap : 8;
		h->v = xrealloc(h->v, sizeof(*h->v) * (size_t)h->cap);
	}
	h->v[h->n++] = (struct handoff){to, kind, mb, buf};
}

/* The buffer handed to piece `to` as (kind, mb), taken out; NULL when none
 * was (a broken schedule: the caller says so). */
static inline void *handoff_take(struct handoffs *h, int to, int kind, int mb)
{
	for (int i = 0; i < h->n; i++) {
		struct handoff x = h->v[i];
		if (x.to == to && x.kind == kind && x.mb == mb) {
			h->v[i] = h->v[--h->n];
			return x.buf;
		}
	}
	return NULL;
}

#endif
