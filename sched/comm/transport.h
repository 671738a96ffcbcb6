/* transport.h - how stage workers exchange activations and gradients.
 *
 * A message is one micro-batch's activation (stage s -> s+1) or input
 * gradient (s -> s-1): B*T*C activations in the backend's act_dtype
 * (B*T*C*act_size(be) bytes: half the bytes of f32 in bf16), matched by
 * (kind, mb); the transport sizes messages in bytes and never looks inside. Sends never
 * block (schedule.h explains why they must not); a receive blocks until its
 * message arrives. Buffers are owned by the transport: a sender fills
 * tp_buffer() and hands it over with send; a receiver gets a buffer from
 * recv and returns it with release. The local transport passes the pointer
 * itself (zero copy); the MPI transport copies over the wire.
 */
#ifndef ASYNCPP_TRANSPORT_H
#define ASYNCPP_TRANSPORT_H

#include <stddef.h>

#include "../../kernels/backend.h"

enum msg_kind { MSG_ACT = 0, MSG_GRAD = 1 };

struct transport {
	const char *name;
	/* A buffer of `bytes` for a message from stage `from`; NULL after
	 * error() when none can be allocated. */
	void *(*buffer)(struct transport *t, int from, size_t bytes);
	/* Hand buf (from buffer) to stage `to`. Never blocks. */
	void (*send)(struct transport *t, int from, int to, int kind, int mb, void *buf);
	/* The message (kind, mb) for stage `to` from `from`; blocks. *waited
	 * gets the seconds spent waiting. NULL once the transport was aborted
	 * (or after error(), when a copy for this stage cannot be allocated). */
	void *(*recv)(struct transport *t, int to, int from, int kind, int mb, double *waited);
	/* Give a received buffer back. */
	void (*release)(struct transport *t, int stage, void *buf);
	void (*destroy)(struct transport *t);
	/* A stage failed and the segment is called off: every receive blocked
	 * in t returns NULL, and so does every later one. NULL where a failed
	 * stage ends the job instead (between processes: p2p.h, nccl.h). */
	void (*abort)(struct transport *t);
};

/* In-process queues between S stage threads (or S pieces of fewer
 * threads); buffers of msg_bytes from backend be. With lanes (backend.h),
 * stage s runs on lane lane[s] (NULL: lane s) and its thread is bound to
 * it; hand-offs are fenced and cross devices by peer copies. */
struct transport *transport_local(const struct backend *be, int S, const int *lane,
				  size_t msg_bytes);

#endif
