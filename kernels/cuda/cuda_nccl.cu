/* cuda_nccl.cu - NCCL through dlopen (see cuda_nccl.h). The header is used
 * only for types and decltype prototypes; nothing links -lnccl. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <mutex>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.h"
#include "cuda_nccl.h"

extern "C" {
#include "../../io/util.h"
}

static_assert(sizeof(ncclUniqueId) == CUDA_NCCL_ID_BYTES, "ncclUniqueId size");

#define NCCL_FUNCS(X)                                                             \
	X(ncclGetVersion)                                                         \
	X(ncclGetErrorString)                                                     \
	X(ncclGetUniqueId)                                                        \
	X(ncclCommInitRank)                                                       \
	X(ncclCommDestroy)                                                        \
	X(ncclGroupStart)                                                         \
	X(ncclGroupEnd)                                                           \
	X(ncclSend)                                                               \
	X(ncclRecv)                                                               \
	X(ncclAllReduce)                                                          \
	X(ncclCommGetAsyncError)

static struct {
#define DECLARE(f) decltype(&::f) f;
	NCCL_FUNCS(DECLARE)
#undef DECLARE
} nc;

static std::mutex nc_mutex;
static int nc_state; /* 0 not tried, 1 loaded, -1 failed */
static char nc_why[512];

struct cuda_nccl_comm {
	ncclComm_t comm;
};

extern "C" int cuda_nccl_load(char *why, size_t len)
{
	static const char *names[] = {"libnccl.so.2", "libnccl.so",
				      "/usr/local/cuda/lib64/libnccl.so.2"};
	std::lock_guard<std::mutex> lock(nc_mutex);
	if (!nc_state) {
		void *lib = NULL;
		const char *err = NULL;
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++)
			if (!(lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)))
				err = dlerror();
		nc_state = 1;
		if (!lib) {
			snprintf(nc_why, sizeof(nc_why), "cannot load NCCL (libnccl.so.2): %s",
				 err ? err : "not found");
			nc_state = -1;
		}
#define RESOLVE(f)                                                                \
	if (nc_state > 0 && !(nc.f = (decltype(nc.f))dlsym(lib, #f))) {           \
		snprintf(nc_why, sizeof(nc_why), "NCCL lacks %s", #f);            \
		nc_state = -1;                                                    \
	}
		NCCL_FUNCS(RESOLVE)
#undef RESOLVE
	}
	if (nc_state < 0) {
		if (why)
			snprintf(why, len, "%s", nc_why);
		return -1;
	}
	return 0;
}

static int nc_ready(void)
{
	char why[512];
	if (cuda_nccl_load(why, sizeof(why)) < 0)
		return error("%s", why);
	return 0;
}

#define NC_CALL(call)                                                             \
	do {                                                                      \
		if (nc_ready() < 0)                                               \
			return -1;                                                \
		ncclResult_t r_ = (call);                                         \
		if (r_ != ncclSuccess)                                            \
			return error("nccl: %s: %s", #call, nc.ncclGetErrorString(r_)); \
	} while (0)

extern "C" int cuda_nccl_version(void)
{
	int v = -1;
	if (nc_ready() < 0 || nc.ncclGetVersion(&v) != ncclSuccess)
		return -1;
	return v;
}

extern "C" int cuda_nccl_unique_id(unsigned char id[CUDA_NCCL_ID_BYTES])
{
	ncclUniqueId u;
	NC_CALL(nc.ncclGetUniqueId(&u));
	memcpy(id, &u, sizeof(u));
	return 0;
}

extern "C" int cuda_nccl_init(struct cuda_nccl_comm **comm, int nranks,
			      const unsigned char id[CUDA_NCCL_ID_BYTES], int rank)
{
	ncclUniqueId u;
	ncclComm_t c;
	memcpy(&u, id, sizeof(u));
	cuda_stream();
	NC_CALL(nc.ncclCommInitRank(&c, nranks, u, rank));
	*comm = (struct cuda_nccl_comm *)xmalloc(sizeof(**comm));
	(*comm)->comm = c;
	return 0;
}

extern "C" void cuda_nccl_destroy(struct cuda_nccl_comm *comm)
{
	if (!comm)
		return;
	if (nc_state > 0 && comm->comm)
		nc.ncclCommDestroy(comm->comm);
	free(comm);
}

extern "C" int cuda_nccl_group_start(void)
{
	NC_CALL(nc.ncclGroupStart());
	return 0;
}

extern "C" int cuda_nccl_group_end(void)
{
	NC_CALL(nc.ncclGroupEnd());
	return 0;
}

extern "C" int cuda_nccl_send(struct cuda_nccl_comm *comm, const float *buf, size_t count,
			      int peer)
{
	NC_CALL(nc.ncclSend(buf, count, ncclFloat32, peer, comm->comm, cuda_stream()));
	return 0;
}

extern "C" int cuda_nccl_recv(struct cuda_nccl_comm *comm, float *buf, size_t count, int peer)
{
	NC_CALL(nc.ncclRecv(buf, count, ncclFloat32, peer, comm->comm, cuda_stream()));
	return 0;
}

extern "C" int cuda_nccl_allreduce_sum(struct cuda_nccl_comm *comm, const float *send,
				       float *recv, size_t count)
{
	NC_CALL(nc.ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm->comm,
				 cuda_stream()));
	return 0;
}

/* ------------------------------------------------------------------ */
/* channels                                                             */

struct cuda_nccl_chan {
	struct cuda_nccl_comm *comm;
	cudaStream_t stream;
	unsigned char *touch; /* cuda_nccl_chan_connect's bytes; NULL before it */
};

struct cuda_nccl_event {
	cudaEvent_t ev;
};

/* CUDA errors here are returned (the transports name the rank and the
 * tensor), not fatal as in the kernels. */
#define CU_RET(call)                                                              \
	do {                                                                      \
		cudaError_t e_ = (call);                                          \
		if (e_ != cudaSuccess)                                            \
			return error("cuda: %s: %s", #call, cudaGetErrorString(e_)); \
	} while (0)

static struct cuda_nccl_event *event_new(cudaStream_t on)
{
	struct cuda_nccl_event *e = (struct cuda_nccl_event *)xmalloc(sizeof(*e));
	cudaError_t err = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
	if (err == cudaSuccess && (err = cudaEventRecord(e->ev, on)) != cudaSuccess)
		cudaEventDestroy(e->ev);
	if (err != cudaSuccess) {
		error("cuda: cannot record an event: %s", cudaGetErrorString(err));
		free(e);
		return NULL;
	}
	return e;
}

/* The channel's stream waits for everything queued on the compute stream. */
static int after_compute(struct cuda_nccl_chan *ch)
{
	struct cuda_nccl_event *e = event_new(cuda_stream());
	if (!e)
		return -1;
	cudaError_t err = cudaStreamWaitEvent(ch->stream, e->ev, 0);
	cuda_nccl_event_free(e);
	if (err != cudaSuccess)
		return error("cuda: a channel cannot wait for the compute stream: %s",
			     cudaGetErrorString(err));
	return 0;
}

extern "C" int cuda_nccl_chan_open(struct cuda_nccl_chan **ch, int nranks,
				   const unsigned char id[CUDA_NCCL_ID_BYTES], int rank)
{
	struct cuda_nccl_chan *c = (struct cuda_nccl_chan *)xcalloc(1, sizeof(*c));
	cuda_stream(); /* binds the device */
	cudaError_t err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (err != cudaSuccess) {
		free(c);
		return error("cuda: cannot create a stream for NCCL: %s", cudaGetErrorString(err));
	}
	if (cuda_nccl_init(&c->comm, nranks, id, rank) < 0) {
		cudaStreamDestroy(c->stream);
		free(c);
		return -1;
	}
	*ch = c;
	return 0;
}

extern "C" void cuda_nccl_chan_close(struct cuda_nccl_chan *ch)
{
	if (!ch)
		return;
	cudaStreamSynchronize(ch->stream);
	cuda_nccl_destroy(ch->comm);
	cudaStreamDestroy(ch->stream);
	if (ch->touch)
		cudaFree(ch->touch);
	free(ch);
}

extern "C" struct cuda_nccl_event *cuda_nccl_chan_connect(struct cuda_nccl_chan *ch, int rank,
							   int nranks, int one_way)
{
	/* [2][nranks] bytes, one sent to and one received from each peer
	 * (their values do not matter), kept until the channel closes: a free
	 * now would wait for the whole device */
	cudaError_t err = cudaMalloc((void **)&ch->touch, (size_t)2 * (size_t)nranks);
	if (err != cudaSuccess) {
		error("cuda: cannot allocate the bytes that connect a NCCL channel: %s",
		      cudaGetErrorString(err));
		return NULL;
	}
	if (cuda_nccl_group_start())
		return NULL;
	int rc = 0;
	for (int q = 0; q < nranks && !rc; q++) {
		int send = q != rank && (!one_way || (rank == 0 && q == 1));
		int recv = q != rank && (!one_way || (rank == 1 && q == 0));
		struct cuda_nccl_event *a = NULL, *b = NULL;
		if (send)
			rc |= !(a = cuda_nccl_chan_send(ch, ch->touch + q, 1, q));
		if (recv)
			rc |= !(b = cuda_nccl_chan_recv(ch, ch->touch + nranks + q, 1, q));
		cuda_nccl_event_free(a); /* the mark after the group stands for all */
		cuda_nccl_event_free(b);
	}
	rc |= cuda_nccl_group_end();
	return rc ? NULL : cuda_nccl_chan_mark(ch);
}

extern "C" struct cuda_nccl_event *cuda_nccl_chan_send(struct cuda_nccl_chan *ch,
							const void *buf, size_t bytes, int peer)
{
	if (nc_ready() < 0 || after_compute(ch) < 0)
		return NULL;
	ncclResult_t r = nc.ncclSend(buf, bytes, ncclUint8, peer, ch->comm->comm, ch->stream);
	if (r != ncclSuccess) {
		error("nccl: send of %zu bytes to rank %d: %s", bytes, peer, nc.ncclGetErrorString(r));
		return NULL;
	}
	return event_new(ch->stream);
}

extern "C" struct cuda_nccl_event *cuda_nccl_chan_recv(struct cuda_nccl_chan *ch, void *buf,
							size_t bytes, int peer)
{
	if (nc_ready() < 0 || after_compute(ch) < 0)
		return NULL;
	ncclResult_t r = nc.ncclRecv(buf, bytes, ncclUint8, peer, ch->comm->comm, ch->stream);
	if (r != ncclSuccess) {
		error("nccl: receive of %zu bytes from rank %d: %s", bytes, peer,
		      nc.ncclGetErrorString(r));
		return NULL;
	}
	return event_new(ch->stream);
}

extern "C" struct cuda_nccl_event *cuda_nccl_chan_mark(struct cuda_nccl_chan *ch)
{
	return event_new(ch->stream);
}

extern "C" int cuda_nccl_event_done(struct cuda_nccl_event *e, struct cuda_nccl_chan *ch)
{
	cudaError_t err = cudaEventQuery(e->ev);
	if (err == cudaSuccess)
		return 1;
	if (err != cudaErrorNotReady)
		return error("cuda: a transfer failed: %s", cudaGetErrorString(err));
	if (ch && nc_state > 0) {
		ncclResult_t async = ncclSuccess;
		/* no ncclCommAbort here: NCCL wants it called by every rank, and
		 * on this one alone it can block; the caller ends the job
		 * (dist_abort), which ends this process's kernels with it */
		if (nc.ncclCommGetAsyncError(ch->comm->comm, &async) == ncclSuccess &&
		    async != ncclSuccess && async != ncclInProgress)
			return error("nccl: %s (a peer failed or went away)",
				     nc.ncclGetErrorString(async));
	}
	return 0;
}

extern "C" void cuda_nccl_event_wait_compute(struct cuda_nccl_event *e)
{
	CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), e->ev, 0));
}

extern "C" void cuda_nccl_event_free(struct cuda_nccl_event *e)
{
	if (!e)
		return;
	cudaEventDestroy(e->ev);
	free(e);
}

extern "C" int cuda_nccl_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	return n;
}

extern "C" int cuda_nccl_device_uuid(unsigned char uuid[16])
{
	cuda_stream(); /* binds this thread to the backend's device */
	int dev = 0;
	CU_RET(cudaGetDevice(&dev));
	cudaDeviceProp prop;
	CU_RET(cudaGetDeviceProperties(&prop, dev));
	memcpy(uuid, prop.uuid.bytes, 16);
	return 0;
}
