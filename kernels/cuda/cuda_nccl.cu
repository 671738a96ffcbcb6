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
	X(ncclAllReduce)

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
	if (nc_state > 0)
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
