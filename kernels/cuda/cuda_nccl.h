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

#ifdef __cplusplus
}
#endif

#endif
