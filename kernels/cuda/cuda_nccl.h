/* cuda_nccl.h - NCCL for the transports (sched/), loaded with dlopen at first
 * use (libnccl.so.2), so a CUDA build starts where NCCL is missing. C linkage;
 * defined only in CUDA builds (guard callers with #ifdef ASYNCPP_CUDA).
 *
 * Every call returns 0, or -1 after error() with NCCL's message. Transfers
 * are fp32 and queued on the backend's stream (cuda_stream()), so they are
 * ordered after the kernels that produced their buffers; synchronize() waits
 * for them. Several ranks in one process (a thread per GPU) must wrap their
 * init in cuda_nccl_group_start/end, as NCCL requires.
 */
#ifndef ASYNCPP_CUDA_NCCL_H
#define ASYNCPP_CUDA_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

struct cuda_nccl_comm;

/* 0 when libnccl.so.2 is loaded; else -1 and the reason in why (no error()). */
int cuda_nccl_load(char *why, size_t len);
/* NCCL's version as major*10000 + minor*100 + patch (e.g. 22804), or -1. */
int cuda_nccl_version(void);
/* The unique id rank 0 creates and shares (over MPI or a file). */
int cuda_nccl_unique_id(unsigned char id[CUDA_NCCL_ID_BYTES]);
/* One rank of a communicator of nranks, on the calling thread's device. */
int cuda_nccl_init(struct cuda_nccl_comm **comm, int nranks,
		   const unsigned char id[CUDA_NCCL_ID_BYTES], int rank);
void cuda_nccl_destroy(struct cuda_nccl_comm *comm);
int cuda_nccl_group_start(void);
int cuda_nccl_group_end(void);
int cuda_nccl_send(struct cuda_nccl_comm *comm, const float *buf, size_t count, int peer);
int cuda_nccl_recv(struct cuda_nccl_comm *comm, float *buf, size_t count, int peer);
/* recv[i] = sum over ranks of send[i] (recv may equal send). */
int cuda_nccl_allreduce_sum(struct cuda_nccl_comm *comm, const float *send, float *recv,
			    size_t count);

/* ---- channels: what sched/comm/transport_nccl.c and replica_nccl.c build on ----
 *
 * A channel is a communicator with a CUDA stream of its own. NCCL matches
 * sends and receives by their order on a communicator, and a send waits on
 * the device until its receive is posted, so pipeline stages need one
 * channel per direction of each neighbour pair: on one shared stream, 1F1B
 * deadlocks (stage s's send of activation a1 waits for s+1 to receive it,
 * while s+1's stream still waits in its send of gradient g0, queued first,
 * for s to receive that). Every transfer is queued after all the work
 * queued so far on the compute stream (cuda_stream()), so it reads what the
 * kernels wrote and never overwrites what they still read; it returns an
 * event that completes with it. Transfers are bytes: the payload's type is
 * the caller's. */
struct cuda_nccl_chan;
struct cuda_nccl_event;

/* Rank `rank` of a channel of nranks sharing id (collective: blocks until
 * every rank of the channel has called it). */
int cuda_nccl_chan_open(struct cuda_nccl_chan **ch, int nranks,
			const unsigned char id[CUDA_NCCL_ID_BYTES], int rank);
void cuda_nccl_chan_close(struct cuda_nccl_chan *ch);
/* Make NCCL connect ch now (it connects a pair of ranks at their first
 * transfer, and connecting mid-run may wait on the whole device while a
 * send of this rank is blocked on its peer): a grouped 1-byte send to and
 * receive from every other rank, or with one_way rank 0's send to rank 1
 * only (a pipeline channel, used in that direction alone). Collective
 * over ch; once per channel; returns the event after it (wait for it),
 * NULL after error(). */
struct cuda_nccl_event *cuda_nccl_chan_connect(struct cuda_nccl_chan *ch, int rank, int nranks,
					       int one_way);
/* Queue a send to / receive from peer (a rank of the channel). NULL after
 * error(). Several may be queued between cuda_nccl_group_start/end (a
 * grouped exchange, as an all-to-all needs). */
struct cuda_nccl_event *cuda_nccl_chan_send(struct cuda_nccl_chan *ch, const void *buf,
					    size_t bytes, int peer);
struct cuda_nccl_event *cuda_nccl_chan_recv(struct cuda_nccl_chan *ch, void *buf, size_t bytes,
					    int peer);
/* An event recorded after the channel's last queued transfer. */
struct cuda_nccl_event *cuda_nccl_chan_mark(struct cuda_nccl_chan *ch);
/* 1 when e has completed, 0 not yet; -1 after error() (a failed transfer,
 * or NCCL reporting an asynchronous error on ch when ch is non-NULL). The
 * communicator is not aborted (ncclCommAbort is for every rank to call,
 * and one rank's call alone can block): the caller ends the job. */
int cuda_nccl_event_done(struct cuda_nccl_event *e, struct cuda_nccl_chan *ch);
/* Queue a wait for e on the compute stream (the host goes on). */
void cuda_nccl_event_wait_compute(struct cuda_nccl_event *e);
void cuda_nccl_event_free(struct cuda_nccl_event *e);
/* The CUDA devices this process sees (0 without any). */
int cuda_nccl_device_count(void);
/* The 16-byte UUID of the GPU this process uses (its backend's device);
 * 0, or -1 after error(). */
int cuda_nccl_device_uuid(unsigned char uuid[16]);

#ifdef __cplusplus
}
#endif

#endif
