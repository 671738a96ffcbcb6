/* cuda_device.cu - the CUDA backend's devices and memory: errors,
 * initialisation, the lanes (a stream each, backend.h), fences, scratch,
 * allocation and its accounting (memory_peak), copies, timing marks.
 *
 * Legend: see kernels/backend.h. */
#include <cuda_runtime.h>
#include <mutex>
#include <unordered_map>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.h"

extern "C" {
#include "../../io/util.h"
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* errors, initialisation, stream, scratch                              */

void cuda_fatal(const char *file, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "asyncpp: cuda: %s:%d: %s\n", file, line, msg);
	exit(1);
}

static std::once_flag init_once;
static std::mutex select_mutex;
static int device = -1;      /* chosen by cuda_select_device, -1 until then */
static bool device_in_use;   /* set once the streams exist */

/* The lanes (backend.h): a stream each, on its device. Without set_lanes
 * there is one, on the chosen device. */
#define MAX_LANES CUDA_MAX_LANES
static struct lane {
	int device;
	cudaStream_t stream;
} lanes[MAX_LANES];
static int n_lanes = 1;
static bool lanes_set;                 /* by cu_set_lanes, before init */
static thread_local int my_lane;       /* the calling thread's lane */
static thread_local int bound_device = -1;

/* The local rank a launcher gave this process, or -1. */
static int local_rank(void)
{
	const char *vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (v && *v && strspn(v, "0123456789") == strlen(v) && strlen(v) < 6)
			return atoi(v);
	}
	return -1;
}

extern "C" int cuda_select_device(int index, char *why, size_t len)
{
	int count = 0;
	cudaError_t err = cudaGetDeviceCount(&count);
	if (err != cudaSuccess || count == 0)
		return cuda_available(why, len); /* says why */
	int want = index;
	if (want < 0) {
		int r = local_rank();
		want = r < 0 ? 0 : r % count;
	}
	if (want >= count) {
		snprintf(why, len, "there is no CUDA device %d: %d visible (numbered from 0%s)", want,
			 count, getenv("CUDA_VISIBLE_DEVICES") ? ", after CUDA_VISIBLE_DEVICES" : "");
		return 0;
	}
	std::lock_guard<std::mutex> lock(select_mutex);
	if (device_in_use && want != device) {
		snprintf(why, len, "this process already uses CUDA device %d; it cannot switch to %d",
			 device, want);
		return 0;
	}
	if (lanes_set && want != lanes[0].device) {
		snprintf(why, len, "the lanes put lane 0 on CUDA device %d, not %d", lanes[0].device,
			 want);
		return 0;
	}
	device = want;
	return 1;
}

/* The chosen device (selecting the default on first use). */
static int chosen_device(void)
{
	if (device < 0) {
		char why[256];
		if (!cuda_select_device(-1, why, sizeof(why)))
			cuda_fatal(__FILE__, __LINE__, "%s", why);
	}
	return device;
}

static void staging_init(int lane);

/* One stream per lane; per device, the pool keeps freed scratch and each
 * device may read its peers' memory where the hardware allows (copies
 * between devices work either way). */
static void cuda_init(void)
{
	int count = 0, dev = chosen_device();
	cudaError_t err = cudaGetDeviceCount(&count);
	if (err != cudaSuccess)
		cuda_fatal(__FILE__, __LINE__, "no usable CUDA device: %s",
			   cudaGetErrorString(err));
	if (count == 0)
		cuda_fatal(__FILE__, __LINE__, "no CUDA device found");
	{
		std::lock_guard<std::mutex> lock(select_mutex);
		if (!lanes_set)
			lanes[0].device = dev;
		device_in_use = true;
	}
	for (int l = 0; l < n_lanes; l++) {
		int d = lanes[l].device;
		CUDA_CHECK(cudaSetDevice(d));
		CUDA_CHECK(cudaStreamCreateWithFlags(&lanes[l].stream, cudaStreamNonBlocking));
		staging_init(l);
		bool first = true; /* the first lane on d sets d up */
		for (int k = 0; k < l; k++)
			first = first && lanes[k].device != d;
		if (!first)
			continue;
		/* Keep freed scratch in the pool instead of returning it to the
		 * driver at every synchronisation. */
		cudaMemPool_t pool;
		CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
		uint64_t threshold = UINT64_MAX;
		CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
		for (int k = 0; k < l; k++) {
			int can = 0, e = lanes[k].device;
			if (e == d)
				continue;
			/* both ways; the flag is per (current device, peer) pair */
			CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, e));
			if (can && cudaDeviceEnablePeerAccess(e, 0) != cudaSuccess)
				cudaGetLastError(); /* already enabled: fine */
			CUDA_CHECK(cudaSetDevice(e));
			CUDA_CHECK(cudaDeviceCanAccessPeer(&can, e, d));
			if (can && cudaDeviceEnablePeerAccess(d, 0) != cudaSuccess)
				cudaGetLastError();
			CUDA_CHECK(cudaSetDevice(d));
		}
	}
	bound_device = -1; /* the calling thread's device is set again below */
}

cudaStream_t cuda_stream(void)
{
	std::call_once(init_once, cuda_init);
	/* The current device is per thread: a stage's worker thread would
	 * otherwise allocate on device 0 and launch into another device's
	 * stream. */
	const struct lane *l = &lanes[my_lane];
	if (bound_device != l->device) {
		CUDA_CHECK(cudaSetDevice(l->device));
		bound_device = l->device;
	}
	return l->stream;
}

int cuda_lane(void)
{
	return my_lane;
}

__global__ static void probe_kernel(int *x); /* cuda_available's */

static int cu_set_lanes(const int *devs, int n, char *why, size_t len)
{
	int count = 0;
	if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
		return cuda_available(why, len);
	if (n < 1 || n > MAX_LANES) {
		snprintf(why, len, "%d lanes: between 1 and %d can be used", n, MAX_LANES);
		return 0;
	}
	cudaDeviceProp first;
	for (int l = 0; l < n; l++) {
		if (devs[l] < 0 || devs[l] >= count) {
			snprintf(why, len, "there is no CUDA device %d: %d visible (numbered from 0%s)",
				 devs[l], count,
				 getenv("CUDA_VISIBLE_DEVICES") ? ", after CUDA_VISIBLE_DEVICES" : "");
			return 0;
		}
		/* what cuda_available checks of the first device, for each; and
		 * one model throughout: the products' algorithm is chosen once
		 * per shape for every lane (the same bits everywhere) */
		cudaDeviceProp prop;
		if (cudaGetDeviceProperties(&prop, devs[l]) != cudaSuccess) {
			cudaGetLastError();
			snprintf(why, len, "cannot query CUDA device %d", devs[l]);
			return 0;
		}
		if (prop.major < 8) {
			snprintf(why, len, "device %d (%s) has compute capability %d.%d; asyncpp needs "
				 "8.0 or newer", devs[l], prop.name, prop.major, prop.minor);
			return 0;
		}
		if (!l)
			first = prop;
		else if (prop.major != first.major || prop.minor != first.minor ||
			 prop.multiProcessorCount != first.multiProcessorCount) {
			snprintf(why, len, "device %d is a %s (sm_%d%d, %d SMs) and device %d a %s "
				 "(sm_%d%d, %d SMs): the stages' GPUs must be of one model",
				 devs[l], prop.name, prop.major, prop.minor, prop.multiProcessorCount,
				 devs[0], first.name, first.major, first.minor,
				 first.multiProcessorCount);
			return 0;
		}
	}
	/* this binary has code for them (one model: the first tells) */
	int cur = 0;
	cudaFuncAttributes attr;
	CUDA_CHECK(cudaGetDevice(&cur));
	CUDA_CHECK(cudaSetDevice(devs[0]));
	cudaError_t perr = cudaFuncGetAttributes(&attr, probe_kernel);
	CUDA_CHECK(cudaSetDevice(cur));
	if (perr != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, len, "this asyncpp has no code for device %d (%s, sm_%d%d): %s; rebuild "
			 "it with make NVCC_GENCODE=-gencode=arch=compute_%d%d,code=sm_%d%d",
			 devs[0], first.name, first.major, first.minor, cudaGetErrorString(perr),
			 first.major, first.minor, first.major, first.minor);
		return 0;
	}
	std::lock_guard<std::mutex> lock(select_mutex);
	if (device_in_use) {
		bool same = n == n_lanes;
		for (int l = 0; same && l < n; l++)
			same = lanes[l].device == devs[l];
		if (!same)
			snprintf(why, len, "this process already runs on its CUDA lanes; they are set "
				 "once, before the first operation");
		return same;
	}
	for (int l = 0; l < n; l++)
		lanes[l].device = devs[l];
	n_lanes = n;
	lanes_set = true;
	device = devs[0];
	return 1;
}

static int cu_lanes(void)
{
	return n_lanes;
}

static int cu_lane_device(int lane)
{
	return lane >= 0 && lane < n_lanes ? lanes[lane].device : -1;
}

static void cu_lane_bind(int lane)
{
	if (lane < 0 || lane >= n_lanes)
		cuda_fatal(__FILE__, __LINE__, "internal error: lane %d of %d", lane, n_lanes);
	my_lane = lane;
	cuda_stream(); /* its device current now: every runtime call that
			* follows (events, kernel attributes) acts on it */
}

/* fences: events without timing, recorded on the caller's stream */
static void *cu_fence_new(void)
{
	cudaStream_t st = cuda_stream();
	cudaEvent_t e;
	CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
	CUDA_CHECK(cudaEventRecord(e, st));
	return (void *)e;
}

static void cu_fence_wait(void *f)
{
	CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), (cudaEvent_t)f, 0));
}

static void cu_fence_free(void *f)
{
	/* legal while the event is pending: it is released once complete */
	CUDA_CHECK(cudaEventDestroy((cudaEvent_t)f));
}

void *cuda_scratch(size_t bytes)
{
	void *p = NULL;
	CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, cuda_stream()));
	return p;
}

void cuda_scratch_free(void *p)
{
	if (p)
		CUDA_CHECK(cudaFreeAsync(p, cuda_stream()));
}

/* A kernel used only to probe that this binary has code for the device. */
__global__ static void probe_kernel(int *x)
{
	if (x)
		*x = 1;
}

extern "C" int cuda_available(char *why, size_t len)
{
	int count = 0, dev = 0;
	cudaError_t err = cudaGetDeviceCount(&count);
	if (err == cudaErrorInsufficientDriver) {
		snprintf(why, len, "no CUDA driver found, or it is older than this CUDA %d.%d "
			 "runtime (%s)", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
			 cudaGetErrorString(err));
		cudaGetLastError();
		return 0;
	}
	if (err != cudaSuccess) {
		snprintf(why, len, "no usable CUDA device (%s)", cudaGetErrorString(err));
		cudaGetLastError(); /* clear it */
		return 0;
	}
	if (count == 0) {
		snprintf(why, len, "no CUDA device found");
		return 0;
	}
	cudaDeviceProp prop;
	dev = device >= 0 ? device : 0;
	if (dev >= count) {
		snprintf(why, len, "there is no CUDA device %d: %d visible", dev, count);
		return 0;
	}
	if ((err = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
		snprintf(why, len, "cannot query CUDA device (%s)", cudaGetErrorString(err));
		return 0;
	}
	if (prop.major < 8) {
		snprintf(why, len, "%s has compute capability %d.%d; asyncpp needs 8.0 or newer",
			 prop.name, prop.major, prop.minor);
		return 0;
	}
	cudaFuncAttributes attr;
	if ((err = cudaFuncGetAttributes(&attr, probe_kernel)) != cudaSuccess) {
		snprintf(why, len, "this asyncpp has no code for %s (sm_%d%d): %s; rebuild it with "
			 "make NVCC_GENCODE=-gencode=arch=compute_%d%d,code=sm_%d%d", prop.name,
			 prop.major, prop.minor, cudaGetErrorString(err), prop.major, prop.minor,
			 prop.major, prop.minor);
		cudaGetLastError();
		return 0;
	}
	if (cuda_blaslt_load(why, len) < 0)
		return 0;
	snprintf(why, len, "%s (device %d, sm_%d%d, %.1f GiB)", prop.name, dev, prop.major,
		 prop.minor, prop.totalGlobalMem / 1073741824.0);
	return 1;
}

/* ------------------------------------------------------------------ */
/* memory                                                               */

/* Bytes held through alloc, for memory_peak (scratch is the pool's). */
static std::mutex held_mutex;
static std::unordered_map<void *, size_t> held;
static size_t held_bytes, held_peak;

void cuda_count_held(void *p, size_t bytes)
{
	std::lock_guard<std::mutex> lock(held_mutex);
	held[p] = bytes;
	held_bytes += bytes;
	held_peak = held_bytes > held_peak ? held_bytes : held_peak;
}

static size_t cu_memory_peak(void)
{
	/* every lane's device once (the pools' highs add: an upper bound of
	 * the sum at any one moment) */
	uint64_t pools = 0;
	cuda_stream();
	for (int l = 0; l < n_lanes; l++) {
		bool first = true;
		for (int k = 0; k < l; k++)
			first = first && lanes[k].device != lanes[l].device;
		if (!first)
			continue;
		cudaMemPool_t pool;
		uint64_t high = 0;
		CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, lanes[l].device));
		CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high));
		pools += high;
	}
	std::lock_guard<std::mutex> lock(held_mutex);
	return held_peak + (size_t)pools;
}

static void *cu_alloc(size_t bytes)
{
	void *p = NULL;
	cuda_stream();
	/* cudaMalloc aligns to at least 256 bytes. Out of memory is not a
	 * sticky error: report it and let the caller decide. */
	cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
	if (err == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		error("cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(err));
		return NULL;
	}
	CUDA_CHECK(err);
	CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
	cuda_count_held(p, bytes);
	return p;
}

static void cu_synchronize(void);

/* free without the weight copies' bookkeeping (for their own buffers:
 * cuda_weights_bf16 calls it with its lock held) */
static void cu_free_raw(void *p)
{
	if (!p)
		return;
	/* with lanes, any of them may still use p (sched/ frees after a
	 * synchronize anyway; frees are rare) */
	if (n_lanes > 1)
		cu_synchronize();
	else
		CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
	CUDA_CHECK(cudaFree(p));
	std::lock_guard<std::mutex> lock(held_mutex);
	auto it = held.find(p);
	if (it != held.end()) {
		held_bytes -= it->second;
		held.erase(it);
	}
}

/* The table's free: the copies of weights in p are forgotten first, so no
 * allocation at those addresses (another thread's, even) is ever read
 * through them. */
static void cu_free(void *p)
{
	if (!p)
		return;
	size_t bytes = 0;
	{
		std::lock_guard<std::mutex> lock(held_mutex);
		auto it = held.find(p);
		if (it != held.end())
			bytes = it->second;
	}
	cuda_weights_forget(p, bytes);
	cu_free_raw(p);
}

void *cuda_alloc_tracked(size_t bytes)
{
	return cu_alloc(bytes);
}

void cuda_free_tracked(void *p)
{
	cu_free_raw(p);
}

/* Small uploads (a micro-batch's tokens) go through a ring of pinned
 * staging slots instead of waiting for the stream: the source is copied
 * into a slot at once (so the caller may reuse it, as backend.h allows), the
 * device copy is queued behind the work before it, and an event says when
 * the slot is free again. Waiting for the stream here would drain the whole
 * queue at every micro-batch (the first GPU run's host syncs). Large copies
 * (weights, checkpoints) keep the plain synchronous path. */
#define STAGING_SLOTS 32
#define STAGING_SLOT_BYTES (1u << 20)

static struct staging_slot {
	void *buf;          /* pinned, STAGING_SLOT_BYTES */
	cudaEvent_t done;   /* recorded after the copy out of buf */
	bool pending;
} staging[MAX_LANES][STAGING_SLOTS]; /* a ring per lane: an event belongs to
				      * its device, and one lane's slot wait
				      * must not stall another lane */
static int staging_next[MAX_LANES];
static std::mutex staging_mutex[MAX_LANES];

/* Lane l's slots, made with its stream (cuda_init, l's device current), not
 * at their first upload: a pinned allocation may wait for the whole device
 * (the CUDA guide's implicit synchronisation), and mid-segment, on a rank
 * whose NCCL send waits for its peer's receive, that wait never ends
 * (sched/comm/nccl.h). STAGING_SLOTS x 1 MiB of pinned memory per lane. */
static void staging_init(int l)
{
	for (int i = 0; i < STAGING_SLOTS; i++) {
		struct staging_slot *slot = &staging[l][i];
		CUDA_CHECK(cudaMallocHost(&slot->buf, STAGING_SLOT_BYTES));
		CUDA_CHECK(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
	}
}

static bool staged_upload(void *dst, const void *src, size_t bytes)
{
	if (bytes > STAGING_SLOT_BYTES)
		return false;
	cudaStream_t st = cuda_stream();
	int l = my_lane;
	std::lock_guard<std::mutex> lock(staging_mutex[l]);
	struct staging_slot *slot = &staging[l][staging_next[l]];
	staging_next[l] = (staging_next[l] + 1) % STAGING_SLOTS;
	if (slot->pending) /* its copy from STAGING_SLOTS uploads ago; long done */
		CUDA_CHECK(cudaEventSynchronize(slot->done));
	memcpy(slot->buf, src, bytes);
	CUDA_CHECK(cudaMemcpyAsync(dst, slot->buf, bytes, cudaMemcpyHostToDevice, st));
	CUDA_CHECK(cudaEventRecord(slot->done, st));
	slot->pending = true;
	return true;
}

static void cu_to_device(void *dst, const void *src, size_t bytes)
{
	if (staged_upload(dst, src, bytes))
		return;
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream()));
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_upload(void *dst, const void *src, size_t bytes)
{
	cu_to_device(dst, src, bytes);
}

static void cu_to_host(void *dst, const void *src, size_t bytes)
{
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

/* dst == src is a no-op (backend.h): no copy is queued, since
 * cudaMemcpyAsync does not promise memmove semantics for overlaps. */
void cuda_copy(void *dst, const void *src, size_t bytes)
{
	if (dst == src || !bytes)
		return;
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream()));
}

static void cu_zero(void *p, size_t bytes)
{
	CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream()));
}

static void cu_synchronize(void)
{
	cuda_stream(); /* the streams exist */
	for (int l = 0; l < n_lanes; l++)
		CUDA_CHECK(cudaStreamSynchronize(lanes[l].stream));
}

/* timing markers: CUDA events recorded on the stream */
static void *cu_mark_new(void)
{
	cudaStream_t st = cuda_stream(); /* first: the event is made on its device */
	cudaEvent_t e;
	CUDA_CHECK(cudaEventCreate(&e));
	CUDA_CHECK(cudaEventRecord(e, st));
	return (void *)e;
}

static double cu_mark_ms(void *a, void *b)
{
	float ms = 0.0f;
	CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)b));
	CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b));
	return ms;
}

static void cu_mark_free(void *m)
{
	CUDA_CHECK(cudaEventDestroy((cudaEvent_t)m));
}

static void cu_set_threads(int n)
{
	(void)n;
}

void cuda_device_slots(struct backend &t)
{
	t.alloc = cu_alloc;
	t.free = cu_free;
	t.to_device = cu_to_device;
	t.to_host = cu_to_host;
	t.copy = cuda_copy;
	t.zero = cu_zero;
	t.synchronize = cu_synchronize;
	t.mark_new = cu_mark_new;
	t.mark_ms = cu_mark_ms;
	t.mark_free = cu_mark_free;
	t.set_lanes = cu_set_lanes;
	t.lanes = cu_lanes;
	t.lane_device = cu_lane_device;
	t.lane_bind = cu_lane_bind;
	t.fence_new = cu_fence_new;
	t.fence_wait = cu_fence_wait;
	t.fence_free = cu_fence_free;
	t.set_threads = cu_set_threads;
	t.memory_peak = cu_memory_peak;
}
