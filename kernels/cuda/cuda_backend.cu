/* cuda_backend.cu - the CUDA backend's table, memory, and the elementwise,
 * normalisation, embedding, loss and optimizer kernels.
 *
 * Legend: see kernels/backend.h (B, T, N = B*T, C, NH, NKV, HD, F, V, Vp).
 * Matrix products live in cuda_matmul.cu, attention in cuda_attention.cu.
 *
 * Every reduction runs in a fixed order that depends only on the shape
 * (fixed chunk sizes, fixed block counts, tree reductions in index order),
 * never on atomics or on the device's SM count, so results repeat bit for
 * bit from run to run on the same GPU.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <atomic>
#include <math.h>
#include <mutex>
#include <unordered_map>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_act.h"
#include "cuda_common.h"
#include "cuda_flash.h" /* cuda_xent_impl */

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
			 "with its -gencode in NVCC_FLAGS", devs[0], first.name, first.major,
			 first.minor, cudaGetErrorString(perr));
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
		snprintf(why, len, "this asyncpp has no code for %s (sm_%d%d): %s; rebuild with "
			 "its -gencode in NVCC_FLAGS", prop.name, prop.major, prop.minor,
			 cudaGetErrorString(err));
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
	std::lock_guard<std::mutex> lock(held_mutex);
	held[p] = bytes;
	held_bytes += bytes;
	held_peak = held_bytes > held_peak ? held_bytes : held_peak;
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

static bool staged_upload(void *dst, const void *src, size_t bytes)
{
	if (bytes > STAGING_SLOT_BYTES)
		return false;
	cudaStream_t st = cuda_stream();
	int l = my_lane;
	std::lock_guard<std::mutex> lock(staging_mutex[l]);
	struct staging_slot *slot = &staging[l][staging_next[l]];
	staging_next[l] = (staging_next[l] + 1) % STAGING_SLOTS;
	if (!slot->buf) {
		CUDA_CHECK(cudaMallocHost(&slot->buf, STAGING_SLOT_BYTES));
		CUDA_CHECK(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
	}
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

static void cu_to_host(void *dst, const void *src, size_t bytes)
{
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

/* dst == src is a no-op (backend.h): no copy is queued, since
 * cudaMemcpyAsync does not promise memmove semantics for overlaps. */
static void cu_copy(void *dst, const void *src, size_t bytes)
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

/* ------------------------------------------------------------------ */
/* reductions                                                           */

__device__ static inline float warp_sum(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, o);
	return x;
}

/* Sum of squares: SUMSQ_BLOCKS fixed partial sums (by shape only), then one
 * block adds them in a fixed tree. Double accumulation throughout. */
#define SUMSQ_THREADS 256
#define SUMSQ_MAX_BLOCKS 1024

/* Partial sums for n elements: a function of n only. */
static int sumsq_blocks(size_t n)
{
	size_t want = (n + SUMSQ_THREADS * 8 - 1) / (SUMSQ_THREADS * 8);
	return (int)(want < 1 ? 1 : want > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : want);
}


/* Block lb of nb over x[n]: its grid-stride share of the squares, then a
 * fixed tree; thread 0 stores the block's partial at *part. The one body of
 * both partial kernels, so cu_sumsq and cu_sumsq_many give the same bits. */
__device__ static void sumsq_partial_body(double *part, const float *x, size_t n, int lb, int nb)
{
	__shared__ double sh[SUMSQ_THREADS];
	double s = 0;
	size_t stride = (size_t)nb * SUMSQ_THREADS;
	for (size_t i = (size_t)lb * SUMSQ_THREADS + threadIdx.x; i < n; i += stride) {
		double v = x[i];
		s += v * v;
	}
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
		if (threadIdx.x < w)
			sh[threadIdx.x] += sh[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		*part = sh[0];
}

__global__ static void sumsq_partial_kernel(double *part, const float *x, size_t n)
{
	sumsq_partial_body(part + blockIdx.x, x, n, blockIdx.x, gridDim.x);
}

/* One block of SUMSQ_MAX_BLOCKS threads adds nparts partials in a fixed tree. */
__device__ static void sumsq_final_kernel_body(double *out, const double *part, int nparts)
{
	__shared__ double sh[SUMSQ_MAX_BLOCKS];
	int t = threadIdx.x;
	sh[t] = t < nparts ? part[t] : 0.0;
	__syncthreads();
	for (int w = SUMSQ_MAX_BLOCKS / 2; w > 0; w >>= 1) {
		if (t < w)
			sh[t] += sh[t + w];
		__syncthreads();
	}
	if (t == 0)
		*out = sh[0];
}

__global__ static void sumsq_final_kernel(double *out, const double *part, int nparts)
{
	sumsq_final_kernel_body(out, part, nparts);
}

void cuda_sumsq_device(double *out, const float *x, size_t n)
{
	int nb = sumsq_blocks(n);
	double *part = (double *)cuda_scratch(nb * sizeof(double));
	sumsq_partial_kernel<<<nb, SUMSQ_THREADS, 0, cuda_stream()>>>(part, x, n);
	CUDA_LAUNCHED();
	sumsq_final_kernel<<<1, SUMSQ_MAX_BLOCKS, 0, cuda_stream()>>>(out, part, nb);
	CUDA_LAUNCHED();
	cuda_scratch_free(part);
}

static double cu_sumsq(const float *x, size_t n)
{
	double *d = (double *)cuda_scratch(sizeof(double)), h = 0;
	cuda_sumsq_device(d, x, n);
	CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(double), cudaMemcpyDeviceToHost, cuda_stream()));
	cuda_scratch_free(d);
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
	return h;
}

/* Many sums of squares in two launches per group of SUMSQ_GROUP tensors and
 * one wait: block b of a tensor computes what block b of its own
 * sumsq_partial_kernel launch would (the same number of blocks for its n,
 * the same loop and tree), and one block per tensor adds its partials with
 * sumsq_final_kernel's tree, so the bits are those of cu_sumsq per tensor.
 * The tensor table travels as a kernel argument (no upload to wait for). */
#define SUMSQ_GROUP 96

struct sumsq_group {
	const float *x[SUMSQ_GROUP];
	unsigned long long n[SUMSQ_GROUP];
	int first[SUMSQ_GROUP + 1]; /* tensor k's partials: [first[k], first[k+1]) */
	int count;
};

__global__ static void sumsq_many_partial_kernel(double *part, const struct sumsq_group g)
{
	int b = blockIdx.x, k = 0;
	while (k + 1 < g.count && g.first[k + 1] <= b)
		k++;
	sumsq_partial_body(part + b, g.x[k], g.n[k], b - g.first[k], g.first[k + 1] - g.first[k]);
}

__global__ static void sumsq_many_final_kernel(double *out, const double *part,
					       const struct sumsq_group g)
{
	int k = blockIdx.x;
	sumsq_final_kernel_body(out + k, part + g.first[k], g.first[k + 1] - g.first[k]);
}

static void cu_sumsq_many(double *out, const float *const *x, const size_t *n, int count)
{
	if (count <= 0)
		return;
	double *d = (double *)cuda_scratch((size_t)count * sizeof(double));
	for (int k0 = 0; k0 < count; k0 += SUMSQ_GROUP) {
		struct sumsq_group g;
		memset(&g, 0, sizeof(g));
		g.count = count - k0 < SUMSQ_GROUP ? count - k0 : SUMSQ_GROUP;
		for (int k = 0; k < g.count; k++) {
			g.x[k] = x[k0 + k];
			g.n[k] = n[k0 + k];
			g.first[k + 1] = g.first[k] + sumsq_blocks(n[k0 + k]);
		}
		int blocks = g.first[g.count];
		double *part = (double *)cuda_scratch((size_t)blocks * sizeof(double));
		sumsq_many_partial_kernel<<<blocks, SUMSQ_THREADS, 0, cuda_stream()>>>(part, g);
		CUDA_LAUNCHED();
		sumsq_many_final_kernel<<<g.count, SUMSQ_MAX_BLOCKS, 0, cuda_stream()>>>(d + k0, part, g);
		CUDA_LAUNCHED();
		cuda_scratch_free(part);
	}
	CUDA_CHECK(cudaMemcpyAsync(out, d, (size_t)count * sizeof(double), cudaMemcpyDeviceToHost,
				   cuda_stream()));
	cuda_scratch_free(d);
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

/* Column sums for weight/bias gradients, in a fixed order (A: the storage
 * type of dout and inp, cuda_act.h; the sums are float):
 * rows are cut into chunks of COLSUM_ROWS; block (x: 32 x V columns, y:
 * chunk) sums its chunk with 8 row-strided threads per column, combined in
 * order; a second kernel adds the chunk partials in chunk order.
 *   pw[chunk,C] = sum dout * xhat, xhat = (inp - mean) * rstd (pw non-NULL;
 *                 mean NULL means 0, as for RMSNorm)
 *   pb[chunk,C] = sum dout (pb non-NULL)
 * A thread sums V neighbouring columns (V = 8 bytes of A: one load per row
 * instead of V) when the rows allow it, else one; each column's sum is the
 * same sequence of additions either way, so the bits never depend on
 * where a buffer sits. */
#define COLSUM_ROWS 256

/* V elements of A at p (8-byte aligned) as floats */
template <typename A, int V> __device__ static __forceinline__ void ld8(float *out, const A *p)
{
	static_assert(sizeof(A) * V == 8, "8 bytes");
	uint2 u = *reinterpret_cast<const uint2 *>(p);
	const A *e = reinterpret_cast<const A *>(&u);
#pragma unroll
	for (int v = 0; v < V; v++)
		out[v] = act_ld(e, v);
}

template <typename A, int V>
__global__ static void colsum_partial_kernel(float *pw, float *pb, const A *dout, const A *inp,
					     const float *mean, const float *rstd, int N, int C)
{
	/* [ty][v * 32 + tx]: a warp's 32 lanes on 32 banks */
	__shared__ float shw[8][32 * V], shb[8][32 * V];
	int tx = threadIdx.x, ty = threadIdx.y;
	int c = (blockIdx.x * 32 + tx) * V; /* the first of this thread's V columns */
	int r0 = blockIdx.y * COLSUM_ROWS, r1 = min(r0 + COLSUM_ROWS, N);
	float sw[V], sb[V];
#pragma unroll
	for (int v = 0; v < V; v++)
		sw[v] = sb[v] = 0;
	if (c < C) { /* V > 1 only when C % V == 0: all V columns exist */
		for (int r = r0 + ty; r < r1; r += 8) {
			float d[V], x[V];
			if constexpr (V == 1)
				d[0] = act_ld(dout, (size_t)r * C + c);
			else
				ld8<A, V>(d, dout + (size_t)r * C + c);
			if (pw) {
				if constexpr (V == 1)
					x[0] = act_ld(inp, (size_t)r * C + c);
				else
					ld8<A, V>(x, inp + (size_t)r * C + c);
			}
#pragma unroll
			for (int v = 0; v < V; v++) {
				if (pw) {
					float m = mean ? mean[r] : 0.0f;
					sw[v] += d[v] * ((x[v] - m) * rstd[r]);
				}
				sb[v] += d[v];
			}
		}
	}
#pragma unroll
	for (int v = 0; v < V; v++) {
		shw[ty][v * 32 + tx] = sw[v];
		shb[ty][v * 32 + tx] = sb[v];
	}
	__syncthreads();
	if (ty == 0 && c < C) {
#pragma unroll
		for (int v = 0; v < V; v++) {
			float aw = 0, ab = 0;
			for (int k = 0; k < 8; k++) {
				aw += shw[k][v * 32 + tx];
				ab += shb[k][v * 32 + tx];
			}
			if (pw)
				pw[(size_t)blockIdx.y * C + c + v] = aw;
			if (pb)
				pb[(size_t)blockIdx.y * C + c + v] = ab;
		}
	}
}

__global__ static void colsum_final_kernel(float *dw, float *db, const float *pw,
					   const float *pb, int nchunks, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= C)
		return;
	float aw = 0, ab = 0;
	for (int k = 0; k < nchunks; k++) {
		if (pw)
			aw += pw[(size_t)k * C + c];
		if (pb)
			ab += pb[(size_t)k * C + c];
	}
	if (dw)
		dw[c] += aw;
	if (db)
		db[c] += ab;
}

/* Whether colsums may read 8 bytes at a time: every row starts 8-byte
 * aligned. ASYNCPP_COLSUM=scalar (read at each call) forces one column per
 * thread, for timing the two; test_cuda_ops cuda_colsum_offsets proves the
 * same bits with buffers one element off. */
template <typename A> static bool colsum_vec(const A *dout, const A *inp, int C)
{
	const char *env = getenv("ASYNCPP_COLSUM");
	if (env && !strcmp(env, "scalar"))
		return false;
	const int V = 8 / (int)sizeof(A);
	return C % V == 0 && (uintptr_t)dout % 8 == 0 && (uintptr_t)inp % 8 == 0;
}

/* dw[C] += sum dout*xhat (if dw), db[C] += sum dout (if db); dout[N,C],
 * inp[N,C] (A), mean[N], rstd[N]. */
template <typename A>
static void colsums(float *dw, float *db, const A *dout, const A *inp, const float *mean,
		    const float *rstd, int N, int C)
{
	if (N <= 0 || C <= 0 || (!dw && !db))
		return;
	int nchunks = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
	size_t sz = (size_t)nchunks * C * sizeof(float);
	float *pw = dw ? (float *)cuda_scratch(sz) : NULL;
	float *pb = db ? (float *)cuda_scratch(sz) : NULL;
	constexpr int V = 8 / (int)sizeof(A);
	dim3 block(32, 8);
	if (colsum_vec(dout, dw ? inp : dout, C)) {
		dim3 grid((C / V + 31) / 32, nchunks);
		colsum_partial_kernel<A, V><<<grid, block, 0, cuda_stream()>>>(pw, pb, dout, inp,
									       mean, rstd, N, C);
	} else {
		dim3 grid((C + 31) / 32, nchunks);
		colsum_partial_kernel<A, 1><<<grid, block, 0, cuda_stream()>>>(pw, pb, dout, inp,
									       mean, rstd, N, C);
	}
	CUDA_LAUNCHED();
	colsum_final_kernel<<<(C + 255) / 256, 256, 0, cuda_stream()>>>(dw, db, pw, pb, nchunks, C);
	CUDA_LAUNCHED();
	cuda_scratch_free(pw);
	cuda_scratch_free(pb);
}

void cuda_colsum_acc(float *dst, const float *x, int N, int C)
{
	colsums<float>(NULL, dst, x, NULL, NULL, NULL, N, C);
}

void cuda_colsum_acc(float *dst, const __nv_bfloat16 *x, int N, int C)
{
	colsums<__nv_bfloat16>(NULL, dst, x, NULL, NULL, NULL, N, C);
}

/* ------------------------------------------------------------------ */
/* embeddings                                                           */

/* out[N,C] (A) = wte[tokens[n],:] + wpe[n % T,:] (wpe NULL: 0), summed in
 * float and stored once */
template <typename A>
__global__ static void embed_forward_kernel(A *out, const int32_t *tokens, const float *wte,
					    const float *wpe, int N, int T, int C)
{
	size_t total = (size_t)N * C;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t n = i / C, c = i % C;
		float v = wte[(size_t)tokens[n] * C + c];
		if (wpe)
			v += wpe[(n % T) * C + c];
		act_st(out, i, v);
	}
}

template <typename A>
static void cu_embed_forward(A *out, const int32_t *tokens, const float *wte, const float *wpe,
			     int B, int T, int C)
{
	size_t total = (size_t)B * T * C;
	embed_forward_kernel<A><<<cuda_blocks(total, 256), 256, 0, cuda_stream()>>>(
		out, tokens, wte, wpe, B * T, T, C);
	CUDA_LAUNCHED();
}

/* dwte[tok] += the rows of dout at the positions holding tok, summed from 0
 * in ascending position. keys[N] are the tokens sorted (stably), pos[N] the
 * positions in that order, so each token's run lists its positions in
 * ascending order; the block at the head of a run sums it, the others
 * return at once. The bits depend on the tokens only. */
template <typename A>
__global__ static void embed_backward_wte_kernel(float *dwte, const A *dout, const int32_t *keys,
						 const int32_t *pos, int N, int C)
{
	int i = blockIdx.x;
	int c = blockIdx.y * blockDim.x + threadIdx.x;
	if (c >= C || (i > 0 && keys[i] == keys[i - 1]))
		return;
	int tok = keys[i];
	float s = 0;
	for (int j = i; j < N && keys[j] == tok; j++)
		s += act_ld(dout, (size_t)pos[j] * C + c);
	dwte[(size_t)tok * C + c] += s;
}

__global__ static void iota_kernel(int32_t *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = i;
}

template <typename A>
__global__ static void embed_backward_wpe_kernel(float *dwpe, const A *dout, int B, int T, int C)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (size_t)T * C)
		return;
	float s = 0;
	for (int b = 0; b < B; b++)
		s += act_ld(dout, (size_t)b * T * C + i);
	dwpe[i] += s;
}

template <typename A>
static void cu_embed_backward(float *dwte, float *dwpe, const A *dout, const int32_t *tokens,
			      int B, int T, int C)
{
	int N = B * T;
	if (N <= 0)
		return;
	cudaStream_t stream = cuda_stream();
	if (dwpe) {
		size_t tc = (size_t)T * C;
		embed_backward_wpe_kernel<A><<<cuda_blocks(tc, 256), 256, 0, stream>>>(
			dwpe, dout, B, T, C);
		CUDA_LAUNCHED();
	}
	if (!dwte)
		return;
	/* sort (token, position) pairs on the device: a radix sort is stable,
	 * so positions stay ascending within a token, the order the host sort
	 * of the first version gave, with no wait for the host */
	int32_t *d = (int32_t *)cuda_scratch(3 * (size_t)N * sizeof(int32_t));
	int32_t *pos_in = d, *keys = d + N, *pos = d + 2 * (size_t)N;
	iota_kernel<<<cuda_blocks(N, 256), 256, 0, stream>>>(pos_in, N);
	CUDA_LAUNCHED();
	size_t temp_bytes = 0;
	CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, keys, pos_in, pos,
						   N, 0, 32, stream));
	void *temp = cuda_scratch(temp_bytes);
	CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, keys, pos_in, pos, N,
						   0, 32, stream));
	dim3 grid(N, (C + 127) / 128);
	embed_backward_wte_kernel<A><<<grid, 128, 0, stream>>>(dwte, dout, keys, pos, N, C);
	CUDA_LAUNCHED();
	cuda_scratch_free(temp);
	cuda_scratch_free(d);
}

/* out[0] = mean of losses[N]: each of 256 threads sums its stride in
 * double in order, then a fixed tree; one block, queued, no host wait. */
__global__ static void loss_mean_kernel(float *out, const float *losses, int N)
{
	__shared__ double sh[256];
	double s = 0;
	for (int i = threadIdx.x; i < N; i += 256)
		s += losses[i];
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int w = 128; w > 0; w >>= 1) {
		if ((int)threadIdx.x < w)
			sh[threadIdx.x] += sh[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		out[0] = (float)(sh[0] / N);
}

static void cu_loss_mean(float *out, const float *losses, int N)
{
	loss_mean_kernel<<<1, 256, 0, cuda_stream()>>>(out, losses, N);
	CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------ */
/* normalisation: one warp per row                                      */

/* LayerNorm when is_ln is set (mean subtracted), RMSNorm otherwise (mean
 * NULL). w NULL means weight 1, b NULL bias 0 (backend.h). RES: inp is
 * first made as ra + rb (add_op's arithmetic, stored into inp), the
 * fused add_norm_forward; each lane then reads back only elements it wrote
 * itself, so no barrier is needed, and the rest is the same code, so the
 * same bits as the two kernels. */
template <typename A, bool RES>
__global__ static void norm_forward_kernel(A *out, float *mean, float *rstd, A *inp,
					   const A *ra, const A *rb, const float *w,
					   const float *b, int N, int C, float eps, int is_ln)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	if (row >= N)
		return;
	if (RES) {
		A *r = inp + (size_t)row * C;
		const A *xa = ra + (size_t)row * C, *xb = rb + (size_t)row * C;
		for (int c = lane; c < C; c += 32)
			act_st(r, c, act_ld(xa, c) + act_ld(xb, c));
	}
	const A *x = inp + (size_t)row * C;
	float m = 0;
	if (is_ln) {
		float s = 0;
		for (int c = lane; c < C; c += 32)
			s += act_ld(x, c);
		m = warp_sum(s) / C;
	}
	float v = 0;
	for (int c = lane; c < C; c += 32) {
		float d = act_ld(x, c) - m;
		v += d * d;
	}
	float rs = rsqrtf(warp_sum(v) / C + eps);
	A *o = out + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float y = (act_ld(x, c) - m) * rs * (w ? w[c] : 1.0f);
		if (b)
			y += b[c];
		act_st(o, c, y);
	}
	if (lane == 0) {
		if (mean)
			mean[row] = m;
		if (rstd)
			rstd[row] = rs;
	}
}

/* dinp = rstd * (dnorm - [mean(dnorm)] - xhat * mean(dnorm * xhat)),
 * dnorm = dout * w (w NULL: 1); the bracketed term only for LayerNorm (mean
 * non-NULL). ACC: dinp += that, as stored and then added by add_op
 * (norm_backward_add). */
template <typename A, bool ACC>
__global__ static void norm_backward_dx_kernel(A *dinp, const A *dout, const A *inp,
					       const float *w, const float *mean,
					       const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	if (row >= N)
		return;
	const A *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
	float m = mean ? mean[row] : 0.0f, rs = rstd[row];
	float s1 = 0, s2 = 0;
	for (int c = lane; c < C; c += 32) {
		float dn = act_ld(dy, c) * (w ? w[c] : 1.0f);
		s1 += dn;
		s2 += dn * ((act_ld(x, c) - m) * rs);
	}
	s1 = mean ? warp_sum(s1) / C : 0.0f;
	s2 = warp_sum(s2) / C;
	A *dx = dinp + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float dn = act_ld(dy, c) * (w ? w[c] : 1.0f);
		float xh = (act_ld(x, c) - m) * rs;
		float d = (dn - s1 - xh * s2) * rs;
		if (ACC) /* __fadd_rn: never contracted with d's multiply into an
			  * fma, which would round once where the ops apart round
			  * twice (f32) */
			act_st(dx, c, __fadd_rn(act_ld(dx, c), act_rt(dx, d)));
		else
			act_st(dx, c, d);
	}
}

#define NORM_ROWS_PER_BLOCK 8

/* The forward of either norm, res = a + b first when RES (a, b non-NULL). */
template <typename A>
static void norm_forward(A *out, float *mean, float *rstd, A *inp, const A *a, const A *b,
			 const float *w, const float *bias, int N, int C, float eps, int is_ln)
{
	int nb = (N + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK;
	if (a)
		norm_forward_kernel<A, true><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			out, mean, rstd, inp, a, b, w, bias, N, C, eps, is_ln);
	else
		norm_forward_kernel<A, false><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			out, mean, rstd, inp, NULL, NULL, w, bias, N, C, eps, is_ln);
	CUDA_LAUNCHED();
}

/* The backward of either norm (mean NULL: RMSNorm): dw, db, then dinp
 * stored, or added into it (acc). */
template <typename A>
static void norm_backward(A *dinp, float *dw, float *db, const A *dout, const A *inp,
			  const float *w, const float *mean, const float *rstd, int N, int C,
			  bool acc)
{
	/* weight/bias gradients first: dinp may alias dout */
	colsums(dw, db, dout, inp, mean, rstd, N, C);
	int nb = (N + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK;
	if (!dinp)
		return;
	if (acc)
		norm_backward_dx_kernel<A, true><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			dinp, dout, inp, w, mean, rstd, N, C);
	else
		norm_backward_dx_kernel<A, false><<<nb, 32 * NORM_ROWS_PER_BLOCK, 0, cuda_stream()>>>(
			dinp, dout, inp, w, mean, rstd, N, C);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_layernorm_forward(A *out, float *mean, float *rstd, const A *inp, const float *w,
				 const float *b, int N, int C, float eps)
{
	norm_forward<A>(out, mean, rstd, (A *)inp, NULL, NULL, w, b, N, C, eps, 1);
}

template <typename A>
static void cu_layernorm_backward(A *dinp, float *dw, float *db, const A *dout, const A *inp,
				  const float *w, const float *mean, const float *rstd, int N,
				  int C)
{
	norm_backward<A>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, false);
}

template <typename A>
static void cu_rmsnorm_forward(A *out, float *rstd, const A *inp, const float *w, int N, int C,
			       float eps)
{
	norm_forward<A>(out, NULL, rstd, (A *)inp, NULL, NULL, w, NULL, N, C, eps, 0);
}

template <typename A>
static void cu_rmsnorm_backward(A *dinp, float *dw, const A *dout, const A *inp, const float *w,
				const float *rstd, int N, int C)
{
	norm_backward<A>(dinp, dw, NULL, dout, inp, w, NULL, rstd, N, C, false);
}

/* the fused forms (backend.h): the same kernels with RES / ACC */
template <typename A>
static void cu_add_norm_forward(A *res, A *out, float *mean, float *rstd, const A *a, const A *b,
				const float *w, const float *bias, int N, int C, float eps,
				int is_ln)
{
	norm_forward<A>(out, is_ln ? mean : NULL, rstd, res, a, b, w, is_ln ? bias : NULL, N, C,
			eps, is_ln);
}

template <typename A>
static void cu_norm_backward_add(A *dacc, float *dw, float *db, const A *dout, const A *inp,
				 const float *w, const float *mean, const float *rstd, int N,
				 int C, int is_ln)
{
	norm_backward<A>(dacc, dw, is_ln ? db : NULL, dout, inp, w, is_ln ? mean : NULL, rstd, N,
			 C, true);
}

/* ------------------------------------------------------------------ */
/* RoPE                                                                 */

/* One thread per (row, head of q or k, pair i < HD/2). The angle is
 * pos * theta^(-2i/HD), computed in double so long contexts keep fp32
 * accuracy; dir = +1 rotates, -1 applies the inverse (the backward). The
 * cos and sin of each (pos, i) come from a table made once per shape and
 * lane (rope_table), by the same double arithmetic rounded to float, so
 * the bits are those of computing them in place (where no table could be
 * had, cs is NULL and they are). */
__device__ static __forceinline__ void rope_cs(int pos, int p, int HD, float theta, float *c,
					       float *s)
{
	double freq = pow((double)theta, -2.0 * p / HD);
	double sd, cd;
	sincos(pos * freq, &sd, &cd);
	*c = (float)cd;
	*s = (float)sd;
}

/* cs[0][T][half] = cos, cs[1][T][half] = sin */
__global__ static void rope_table_kernel(float *cs, int T, int HD, float theta)
{
	int half = HD / 2;
	size_t total = (size_t)T * half;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x)
		rope_cs((int)(i / half), (int)(i % half), HD, theta, &cs[i], &cs[total + i]);
}

template <typename A>
__global__ static void rope_kernel(A *qkv, const float *cs, int Tt, int N, int T, int NH,
				   int NKV, int HD, float theta, float dir)
{
	int half = HD / 2, heads = NH + NKV;
	int QKV = (NH + 2 * NKV) * HD;
	size_t total = (size_t)N * heads * half;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		int p = (int)(i % half);
		size_t rh = i / half;
		int h = (int)(rh % heads);
		size_t n = rh / heads;
		int pos = (int)(n % T);
		float c, s;
		if (cs) {
			c = cs[(size_t)pos * half + p]; /* the table holds Tt >= T positions */
			s = cs[(size_t)Tt * half + (size_t)pos * half + p];
		} else {
			rope_cs(pos, p, HD, theta, &c, &s);
		}
		float sf = s * dir, cf = c;
		/* q heads then k heads are contiguous at the start of the row */
		A *x = qkv + n * QKV + (size_t)h * HD;
		float x1 = act_ld(x, p), x2 = act_ld(x, p + half);
		act_st(x, p, x1 * cf - x2 * sf);
		act_st(x, p + half, x2 * cf + x1 * sf);
	}
}

/* The calling lane's table for (HD, theta) of at least T positions (its
 * stride *Tt), made on first use; a few per lane are kept for the
 * process's life (a model has one), none ever rewritten, so no queued
 * kernel reads a table that changes (a longer T makes a new one). NULL
 * when the lane has no room left, theta is NaN or memory is short: the
 * kernel then computes in place (the same bits). */
#define ROPE_TABLES 8
static struct rope_table {
	int T, HD;
	uint32_t theta;  /* its bits */
	float *cs;
} rope_tables[MAX_LANES][ROPE_TABLES];
static bool rope_no_memory[MAX_LANES];
static int rope_made;    /* tables made, for the test */
static std::mutex rope_mutex[MAX_LANES];

extern "C" int cuda_rope_tables_made(void)
{
	return __atomic_load_n(&rope_made, __ATOMIC_RELAXED);
}

static const float *rope_table(int T, int HD, float theta, int *Tt)
{
	cuda_stream(); /* the lane's device is current */
	if (!(theta == theta))
		return NULL;
	uint32_t tb;
	memcpy(&tb, &theta, sizeof(tb));
	int l = my_lane;
	std::lock_guard<std::mutex> lock(rope_mutex[l]);
	struct rope_table *t = rope_tables[l];
	int i = 0;
	for (; i < ROPE_TABLES && t[i].cs; i++)
		if (t[i].HD == HD && t[i].theta == tb && t[i].T >= T) {
			*Tt = t[i].T;
			return t[i].cs;
		}
	if (i == ROPE_TABLES || rope_no_memory[l])
		return NULL;
	size_t n = (size_t)T * (HD / 2);
	/* counted with the allocations; short of memory, no table */
	float *cs = NULL;
	cudaError_t err = cudaMalloc(&cs, 2 * n * sizeof(float));
	if (err == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		rope_no_memory[l] = true;
		return NULL;
	}
	CUDA_CHECK(err);
	{
		std::lock_guard<std::mutex> hl(held_mutex);
		held[cs] = 2 * n * sizeof(float);
		held_bytes += 2 * n * sizeof(float);
		held_peak = held_bytes > held_peak ? held_bytes : held_peak;
	}
	rope_table_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(cs, T, HD, theta);
	CUDA_LAUNCHED();
	t[i].T = T;
	t[i].HD = HD;
	t[i].theta = tb;
	t[i].cs = cs;
	__atomic_add_fetch(&rope_made, 1, __ATOMIC_RELAXED);
	*Tt = T;
	return cs;
}

template <typename A>
static void rope(A *qkv, int B, int T, int NH, int NKV, int HD, float theta, float dir)
{
	size_t total = (size_t)B * T * (NH + NKV) * (HD / 2);
	if (!total)
		return;
	/* ASYNCPP_ROPE_TABLE=0: cos and sin in place (the test of equal bits) */
	const char *env = getenv("ASYNCPP_ROPE_TABLE");
	int Tt = T;
	const float *cs = env && !strcmp(env, "0") ? NULL : rope_table(T, HD, theta, &Tt);
	rope_kernel<A><<<cuda_blocks(total, 256), 256, 0, cuda_stream()>>>(qkv, cs, Tt, B * T, T,
									    NH, NKV, HD, theta, dir);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_rope_forward(A *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope(qkv, B, T, NH, NKV, HD, theta, 1.0f);
}

template <typename A>
static void cu_rope_backward(A *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope(dqkv, B, T, NH, NKV, HD, theta, -1.0f);
}

/* ------------------------------------------------------------------ */
/* activations, residuals                                               */

#define GRID_STRIDE(i, n)                                                         \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
	     i += (size_t)gridDim.x * blockDim.x)

/* Elementwise kernels move 4 elements per thread and step (8 bytes of
 * bf16, 16 of float) wherever every pointer is aligned to that and n is a
 * multiple of 4 (vec4_ok), else one; the arithmetic of each element is
 * one __device__ function either way, so the bits are the same. */
template <typename A> struct vec4_of;
template <> struct vec4_of<float> { typedef float4 T; };
template <> struct vec4_of<__nv_bfloat16> { typedef uint2 T; };

template <typename A> __device__ static __forceinline__ void ld4(float *o, const A *p)
{
	typename vec4_of<A>::T u = *reinterpret_cast<const typename vec4_of<A>::T *>(p);
	const A *e = reinterpret_cast<const A *>(&u);
#pragma unroll
	for (int v = 0; v < 4; v++)
		o[v] = act_ld(e, v);
}

template <typename A> __device__ static __forceinline__ void st4(A *p, const float *x)
{
	typename vec4_of<A>::T u;
	A *e = reinterpret_cast<A *>(&u);
#pragma unroll
	for (int v = 0; v < 4; v++)
		act_st(e, v, x[v]);
	*reinterpret_cast<typename vec4_of<A>::T *>(p) = u;
}

/* Whether n elements at every pointer given (NULL skipped) go 4 at a time.
 * ASYNCPP_VEC4=0 (read at each launch) keeps every elementwise kernel to
 * one element per thread: the same bits, for timing, or a way around a
 * fault in the 4-wide path without a rebuild. */
template <typename A>
static bool vec4_ok(size_t n, const void *a, const void *b = NULL, const void *c = NULL)
{
	const char *env = getenv("ASYNCPP_VEC4");
	if (env && !strcmp(env, "0"))
		return false;
	uintptr_t m = 4 * sizeof(A) - 1;
	return n % 4 == 0 && !((uintptr_t)a & m) && !((uintptr_t)b & m) && !((uintptr_t)c & m);
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__device__ static __forceinline__ float gelu_f(float x)
{
	float u = GELU_K * (x + 0.044715f * x * x * x);
	return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu(x) / dx times dy */
__device__ static __forceinline__ float gelu_grad_f(float x, float dy)
{
	float u = GELU_K * (x + 0.044715f * x * x * x);
	float th = tanhf(u);
	float sech2 = 1.0f - th * th;
	float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
	return g * dy;
}

/* out[i] = op(a[i]): 4 per thread and step with V4 (map1 chooses) */
template <typename O, typename I, bool V4, typename Op>
__global__ static void map1_kernel(O *out, const I *a, size_t n, Op op)
{
	if (V4) {
		GRID_STRIDE(j, n / 4) {
			float x[4];
			ld4(x, a + 4 * j);
#pragma unroll
			for (int v = 0; v < 4; v++)
				x[v] = op(x[v]);
			st4(out + 4 * j, x);
		}
	} else {
		GRID_STRIDE(i, n)
			act_st(out, i, op(act_ld(a, i)));
	}
}

/* out[i] = op(a[i], b[i]) */
template <typename A, bool V4, typename Op>
__global__ static void map2_kernel(A *out, const A *a, const A *b, size_t n, Op op)
{
	if (V4) {
		GRID_STRIDE(j, n / 4) {
			float x[4], y[4];
			ld4(x, a + 4 * j);
			ld4(y, b + 4 * j);
#pragma unroll
			for (int v = 0; v < 4; v++)
				x[v] = op(x[v], y[v]);
			st4(out + 4 * j, x);
		}
	} else {
		GRID_STRIDE(i, n)
			act_st(out, i, op(act_ld(a, i), act_ld(b, i)));
	}
}

template <typename O, typename I, typename Op>
static void map1(O *out, const I *a, size_t n, Op op)
{
	if (!n)
		return;
	if (vec4_ok<O>(n, out) && vec4_ok<I>(n, a))
		map1_kernel<O, I, true, Op><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			out, a, n, op);
	else
		map1_kernel<O, I, false, Op><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, a, n,
											    op);
	CUDA_LAUNCHED();
}

template <typename A, typename Op>
static void map2(A *out, const A *a, const A *b, size_t n, Op op)
{
	if (!n)
		return;
	if (vec4_ok<A>(n, out, a, b))
		map2_kernel<A, true, Op><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(out, a, b,
											     n, op);
	else
		map2_kernel<A, false, Op><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, a, b, n,
											      op);
	CUDA_LAUNCHED();
}

struct gelu_op {
	__device__ float operator()(float x) const { return gelu_f(x); }
};
struct gelu_grad_op { /* (x, dy) */
	__device__ float operator()(float x, float dy) const { return gelu_grad_f(x, dy); }
};
struct add_op {
	__device__ float operator()(float a, float b) const { return a + b; }
};
struct copy_op { /* a conversion between storage types */
	__device__ float operator()(float x) const { return x; }
};

template <typename A> static void cu_gelu_forward(A *out, const A *inp, size_t n)
{
	map1(out, inp, n, gelu_op());
}

template <typename A>
static void cu_gelu_backward(A *dinp, const A *inp, const A *dout, size_t n)
{
	map2(dinp, inp, dout, n, gelu_grad_op());
}

__device__ static __forceinline__ float swiglu_f(float g, float u)
{
	return g / (1.0f + expf(-g)) * u;
}

/* the gradients of silu(g) * u: *dg, *du from d */
__device__ static __forceinline__ void swiglu_grad_f(float g, float u, float d, float *dg,
						     float *du)
{
	float sg = 1.0f / (1.0f + expf(-g));
	*dg = d * u * sg * (1.0f + g * (1.0f - sg));
	*du = d * g * sg;
}

/* V4: 4 neighbouring f of one row per thread and step (F % 4 == 0, every
 * pointer aligned to 4 elements: swiglu_vec4) */
template <typename A, bool V4>
__global__ static void swiglu_forward_kernel(A *out, const A *inp, int N, int F)
{
	if (V4) {
		GRID_STRIDE(j, (size_t)N * F / 4) {
			size_t i = 4 * j, n = i / F, f = i % F;
			float g[4], u[4];
			ld4(g, inp + n * 2 * F + f);
			ld4(u, inp + n * 2 * F + F + f);
#pragma unroll
			for (int v = 0; v < 4; v++)
				g[v] = swiglu_f(g[v], u[v]);
			st4(out + i, g);
		}
	} else {
		GRID_STRIDE(i, (size_t)N * F) {
			size_t n = i / F, f = i % F;
			act_st(out, i, swiglu_f(act_ld(inp, n * 2 * F + f), act_ld(inp, n * 2 * F + F + f)));
		}
	}
}

template <typename A, bool V4>
__global__ static void swiglu_backward_kernel(A *dinp, const A *dout, const A *inp, int N, int F)
{
	if (V4) {
		GRID_STRIDE(j, (size_t)N * F / 4) {
			size_t i = 4 * j, n = i / F, f = i % F;
			float g[4], u[4], d[4], dg[4], du[4];
			ld4(g, inp + n * 2 * F + f);
			ld4(u, inp + n * 2 * F + F + f);
			ld4(d, dout + i);
#pragma unroll
			for (int v = 0; v < 4; v++)
				swiglu_grad_f(g[v], u[v], d[v], &dg[v], &du[v]);
			st4(dinp + n * 2 * F + f, dg);
			st4(dinp + n * 2 * F + F + f, du);
		}
	} else {
		GRID_STRIDE(i, (size_t)N * F) {
			size_t n = i / F, f = i % F;
			float dg, du;
			swiglu_grad_f(act_ld(inp, n * 2 * F + f), act_ld(inp, n * 2 * F + F + f),
				      act_ld(dout, i), &dg, &du);
			act_st(dinp, n * 2 * F + f, dg);
			act_st(dinp, n * 2 * F + F + f, du);
		}
	}
}

template <typename A>
static bool swiglu_vec4(int F, const void *a, const void *b, const void *c = NULL)
{
	return F % 4 == 0 && vec4_ok<A>(4, a, b, c);
}

template <typename A> static void cu_swiglu_forward(A *out, const A *inp, int N, int F)
{
	size_t n = (size_t)N * F;
	if (swiglu_vec4<A>(F, out, inp))
		swiglu_forward_kernel<A, true><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			out, inp, N, F);
	else
		swiglu_forward_kernel<A, false><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
			out, inp, N, F);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_swiglu_backward(A *dinp, const A *dout, const A *inp, int N, int F)
{
	size_t n = (size_t)N * F;
	if (swiglu_vec4<A>(F, dinp, dout, inp))
		swiglu_backward_kernel<A, true><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			dinp, dout, inp, N, F);
	else
		swiglu_backward_kernel<A, false><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
			dinp, dout, inp, N, F);
	CUDA_LAUNCHED();
}

/* out[n] = a[n] + b[n]: activations (add_act) or floats (add) */
template <typename A> static void cu_add(A *out, const A *a, const A *b, size_t n)
{
	map2(out, a, b, n, add_op());
}

/* ------------------------------------------------------------------ */
/* fused softmax + cross-entropy: one block per row                     */

#define XENT_THREADS 512

/* Combine two (max, sum of exp(x - max)) pairs. */
__device__ static inline void lse_merge(float &m, float &s, float m2, float s2)
{
	float mm = fmaxf(m, m2);
	if (mm == -INFINITY)
		return;
	s = s * expf(m - mm) + s2 * expf(m2 - mm);
	m = mm;
}

/* The end of a row's first pass, for both kernels below: every thread's
 * (max, sum of exp) merged across the block, thread 0 writes the row's
 * loss from xt (the target's logit, read before any write), every thread
 * gets the row's lse. */
__device__ static float xent_row_lse(float m, float s, int t, int V, float xt, float *loss)
{
	__shared__ float shm[XENT_THREADS / 32], shs[XENT_THREADS / 32], sh_lse;
	int tid = threadIdx.x, lane = tid & 31, wid = tid / 32;
	for (int o = 16; o > 0; o >>= 1) {
		float m2 = __shfl_xor_sync(0xffffffffu, m, o);
		float s2 = __shfl_xor_sync(0xffffffffu, s, o);
		lse_merge(m, s, m2, s2);
	}
	if (lane == 0) {
		shm[wid] = m;
		shs[wid] = s;
	}
	__syncthreads();
	if (tid == 0) {
		float mm = shm[0], ss = shs[0];
		for (int w = 1; w < XENT_THREADS / 32; w++)
			lse_merge(mm, ss, shm[w], shs[w]);
		float lse = mm + logf(ss);
		sh_lse = lse;
		/* a target outside [0, V) (backend.h): t < 0 is ignored (0),
		 * t >= V a bad input (NaN); its gradient row is 0 */
		float bad = t < 0 ? 0.0f : __int_as_float(0x7fc00000);
		*loss = (t >= 0 && t < V) ? lse - xt : bad;
	}
	__syncthreads();
	return sh_lse;
}

/* logits[N,Vp], dlogits[N,Vp] (A; may alias logits: a thread reads an
 * element before it writes it, and only it touches that element) */
template <typename A>
__global__ static void softmax_xent_kernel(float *losses, A *dlogits, const A *logits,
					   const int32_t *targets, int V, int Vp, float dloss)
{
	int n = blockIdx.x, tid = threadIdx.x;
	const A *x = logits + (size_t)n * Vp;
	int t = targets[n];
	float xt = 0.0f; /* thread 0's read, before any write */
	if (tid == 0)
		xt = (t >= 0 && t < V) ? act_ld(x, t) : 0.0f;
	float m = -INFINITY, s = 0;
	for (int j = tid; j < V; j += XENT_THREADS) {
		float v = act_ld(x, j);
		if (v > m) {
			s = s * expf(m - v) + 1.0f;
			m = v;
		} else {
			s += expf(v - m);
		}
	}
	float lse = xent_row_lse(m, s, t, V, xt, &losses[n]);
	if (!dlogits)
		return;
	A *d = dlogits + (size_t)n * Vp;
	int valid = t >= 0 && t < V;
	for (int j = tid; j < Vp; j += XENT_THREADS) {
		float g = 0;
		if (j < V && valid)
			g = (expf(act_ld(x, j) - lse) - (j == t ? 1.0f : 0.0f)) * dloss;
		act_st(d, j, g);
	}
}

/* The same with 16-byte loads and stores (4 floats or 8 bf16 a thread at a
 * time) and one online-softmax update per vector instead of per element;
 * rows must start 16-byte aligned (Vp * sizeof(A) a multiple of 16 and an
 * aligned base). The result differs from softmax_xent_kernel's only by the
 * order of the fp32 sums. Not the default until a GPU run has compared them
 * (cuda_xent_set_impl; NOTES.md). */
template <typename A> struct xent_vec {
	static const int n = 16 / sizeof(A); /* elements per 16 bytes */
};

/* the n elements of one 16-byte vector at p, as floats */
template <typename A> __device__ static __forceinline__ void xent_load(float *v, const A *p)
{
	uint4 u = *(const uint4 *)p;
	const A *e = (const A *)&u;
#pragma unroll
	for (int i = 0; i < xent_vec<A>::n; i++)
		v[i] = act_ld(e, i);
}

template <typename A> __device__ static __forceinline__ void xent_store(A *p, const float *v)
{
	uint4 u;
	A *e = (A *)&u;
#pragma unroll
	for (int i = 0; i < xent_vec<A>::n; i++)
		act_st(e, i, v[i]);
	*(uint4 *)p = u;
}

template <typename A>
__global__ static void softmax_xent_vec_kernel(float *losses, A *dlogits, const A *logits,
					       const int32_t *targets, int V, int Vp, float dloss)
{
	const int NV = xent_vec<A>::n;
	int n = blockIdx.x, tid = threadIdx.x;
	const A *x = logits + (size_t)n * Vp;
	int t = targets[n], nvec = (V + NV - 1) / NV;
	float xt = 0.0f; /* thread 0's read, before any write */
	if (tid == 0)
		xt = (t >= 0 && t < V) ? act_ld(x, t) : 0.0f;
	float m = -INFINITY, s = 0;
	for (int k = tid; k < nvec; k += XENT_THREADS) {
		float v[NV], vm = -INFINITY;
		xent_load(v, x + (size_t)k * NV);
#pragma unroll
		for (int i = 0; i < NV; i++)
			if (k * NV + i < V)
				vm = fmaxf(vm, v[i]);
		float mm = fmaxf(m, vm), add = 0;
#pragma unroll
		for (int i = 0; i < NV; i++)
			if (k * NV + i < V)
				add += expf(v[i] - mm);
		s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + add;
		m = mm;
	}
	float lse = xent_row_lse(m, s, t, V, xt, &losses[n]);
	if (!dlogits)
		return;
	A *d = dlogits + (size_t)n * Vp;
	int valid = t >= 0 && t < V;
	for (int k = tid; k < Vp / NV; k += XENT_THREADS) {
		float v[NV];
		xent_load(v, x + (size_t)k * NV);
#pragma unroll
		for (int i = 0; i < NV; i++) {
			int j = k * NV + i;
			v[i] = (j < V && valid) ? (expf(v[i] - lse) - (j == t ? 1.0f : 0.0f)) * dloss
						: 0.0f;
		}
		xent_store(d + (size_t)k * NV, v);
	}
}

/* CUDA_XENT_PLAIN or CUDA_XENT_VEC (cuda_flash.h); from ASYNCPP_XENT=vec|plain
 * once, plain by default */
static std::atomic<int> xent_impl(-1);

extern "C" int cuda_xent_impl(void)
{
	int v = xent_impl.load();
	if (v < 0) {
		const char *e = getenv("ASYNCPP_XENT");
		int want = CUDA_XENT_PLAIN, expect = -1;
		if (e && !strcmp(e, "vec"))
			want = CUDA_XENT_VEC;
		else if (e && *e && strcmp(e, "plain"))
			cuda_fatal(__FILE__, __LINE__, "ASYNCPP_XENT='%s': expected 'plain' or 'vec'", e);
		xent_impl.compare_exchange_strong(expect, want);
		v = xent_impl.load();
	}
	return v;
}

extern "C" int cuda_xent_set_impl(int impl)
{
	int prev = cuda_xent_impl();
	if (impl == CUDA_XENT_PLAIN || impl == CUDA_XENT_VEC)
		xent_impl.store(impl);
	return prev;
}

template <typename A>
static void cu_softmax_xent(float *losses, A *dlogits, const A *logits, const int32_t *targets,
			    int N, int V, int Vp, float dloss)
{
	if (N <= 0)
		return;
	int vec = cuda_xent_impl() == CUDA_XENT_VEC && (Vp * sizeof(A)) % 16 == 0 &&
		  (uintptr_t)logits % 16 == 0 && (!dlogits || (uintptr_t)dlogits % 16 == 0);
	if (vec)
		softmax_xent_vec_kernel<A><<<N, XENT_THREADS, 0, cuda_stream()>>>(
			losses, dlogits, logits, targets, V, Vp, dloss);
	else
		softmax_xent_kernel<A><<<N, XENT_THREADS, 0, cuda_stream()>>>(losses, dlogits, logits,
									    targets, V, Vp, dloss);
	CUDA_LAUNCHED();
}

/* ------------------------------------------------------------------ */
/* optimizer pieces: one element per call of a __device__ function, so a
 * multi-tensor kernel (a table of {pointer, n} chunks) can reuse them.    */

__device__ static inline void adamw_elem(float *u, const float *g, float *m, float *v, size_t i,
					 float lr, float b1, float b2, float eps, float bc1,
					 float bc2)
{
	float gi = g[i];
	float mi = b1 * m[i] + (1.0f - b1) * gi;
	float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
	m[i] = mi;
	v[i] = vi;
	u[i] = -lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

__global__ static void adamw_kernel(float *u, const float *g, float *m, float *v, size_t n,
				    float lr, float b1, float b2, float eps, float bc1, float bc2)
{
	GRID_STRIDE(i, n)
		adamw_elem(u, g, m, v, i, lr, b1, b2, eps, bc1, bc2);
}

static void cu_adamw_dir(float *u, const float *g, float *m, float *v, size_t n, float lr,
			 float beta1, float beta2, float eps, float bc1, float bc2)
{
	adamw_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(u, g, m, v, n, lr, beta1,
								      beta2, eps, bc1, bc2);
	CUDA_LAUNCHED();
}

/* Adan, the CPU's formula element by element (backend.h) */
__global__ static void adan_kernel(float *u, const float *g, float *m, float *v, float *nacc,
				   float *gprev, size_t n, float lr, float b1, float b2, float b3,
				   float eps, float ib1, float ib2, float isb3, int first)
{
	GRID_STRIDE(i, n)
	{
		float gi = g[i], d = first ? 0.0f : gi - gprev[i], z = gi + b2 * d;
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * d;
		float ni = b3 * nacc[i] + (1.0f - b3) * z * z;
		m[i] = mi;
		v[i] = vi;
		nacc[i] = ni;
		gprev[i] = gi;
		u[i] = -lr * (mi * ib1 + b2 * vi * ib2) / (sqrtf(ni) * isb3 + eps);
	}
}

static void cu_adan_dir(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
			size_t n, float lr, float beta1, float beta2, float beta3, float eps,
			float bc1, float bc2, float bc3, int first)
{
	adan_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
		u, g, m, v, nacc, gprev, n, lr, beta1, beta2, beta3, eps, 1.0f / bc1, 1.0f / bc2,
		1.0f / sqrtf(bc3), first);
	CUDA_LAUNCHED();
}

__device__ static inline void lion_elem(float *u, const float *g, float *m, size_t i, float lr,
					float b1, float b2)
{
	float gi = g[i], mi = m[i];
	float c = b1 * mi + (1.0f - b1) * gi;
	u[i] = c > 0.0f ? -lr : c < 0.0f ? lr : 0.0f;
	m[i] = b2 * mi + (1.0f - b2) * gi;
}

__global__ static void lion_kernel(float *u, const float *g, float *m, size_t n, float lr,
				   float b1, float b2)
{
	GRID_STRIDE(i, n)
		lion_elem(u, g, m, i, lr, b1, b2);
}

static void cu_lion_dir(float *u, const float *g, float *m, size_t n, float lr, float beta1,
			float beta2)
{
	lion_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(u, g, m, n, lr, beta1, beta2);
	CUDA_LAUNCHED();
}

__global__ static void momentum_kernel(float *out, const float *g, float *m, size_t n, float mu,
				       int nesterov)
{
	GRID_STRIDE(i, n) {
		float gi = g[i];
		float mi = mu * m[i] + gi;
		m[i] = mi;
		out[i] = nesterov ? gi + mu * mi : mi;
	}
}

static void cu_momentum(float *out, const float *g, float *m, size_t n, float mu, int nesterov)
{
	momentum_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, g, m, n, mu,
									 nesterov);
	CUDA_LAUNCHED();
}

__global__ static void apply_update_kernel(float *w, const float *u, float *u_prev, size_t n,
					   float decay, float lambda)
{
	GRID_STRIDE(i, n) {
		float ui = u[i];
		float wi = w[i] * (1.0f - decay) + ui;
		if (u_prev) {
			wi += lambda * (ui - u_prev[i]);
			u_prev[i] = ui;
		}
		w[i] = wi;
	}
}

static void cu_apply_update(float *w, const float *u, float *u_prev, size_t n, float decay,
			    float lambda)
{
	apply_update_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(w, u, u_prev, n,
									     decay, lambda);
	CUDA_LAUNCHED();
}

/* AdamW or Lion then apply_update over a group of tensors in one launch
 * (backend.h, elementwise_step). A block belongs to one tensor (the group
 * table, passed by value, gives each tensor a run of blocks) and strides
 * over it. The direction is adamw_elem's / lion_elem's expression, kept in a
 * register instead of u[]; the update is apply_update_kernel's statements.
 * AdamW's direction ends in a division and Lion's is a selection, so no
 * multiply-add can be contracted across the seam: the bits are the
 * per-tensor kernels' (test_cuda_ops, cuda_elementwise_step). */
#define ELEM_GROUP 48
#define ELEM_PER_BLOCK (256 * 8)

struct elem_group {
	float *w[ELEM_GROUP];
	const float *g[ELEM_GROUP];
	float *s0[ELEM_GROUP], *s1[ELEM_GROUP], *up[ELEM_GROUP];
	unsigned long long n[ELEM_GROUP];
	float decay[ELEM_GROUP];
	int correct[ELEM_GROUP];
	int first[ELEM_GROUP + 1]; /* tensor k's blocks: [first[k], first[k+1]) */
	int count;
};

__global__ static void elementwise_step_kernel(const struct elem_group G, int rule, float lr,
					       float b1, float b2, float eps, float bc1, float bc2,
					       float lambda)
{
	int b = blockIdx.x, k = 0;
	while (k + 1 < G.count && G.first[k + 1] <= b)
		k++;
	size_t n = G.n[k], nb = (size_t)(G.first[k + 1] - G.first[k]);
	float *w = G.w[k], *m = G.s0[k], *v = G.s1[k], *up = G.up[k];
	const float *g = G.g[k];
	float keep = 1.0f - G.decay[k];
	int correct = up && G.correct[k];
	for (size_t i = (size_t)(b - G.first[k]) * blockDim.x + threadIdx.x; i < n;
	     i += nb * blockDim.x) {
		float gi = g[i], ui;
		if (rule == 0) {
			float mi = b1 * m[i] + (1.0f - b1) * gi;
			float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
			m[i] = mi;
			v[i] = vi;
			ui = -lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
		} else {
			float mi = m[i];
			float c = b1 * mi + (1.0f - b1) * gi;
			ui = c > 0.0f ? -lr : c < 0.0f ? lr : 0.0f;
			m[i] = b2 * mi + (1.0f - b2) * gi;
		}
		float wi = w[i] * keep + ui;
		if (correct)
			wi += lambda * (ui - up[i]);
		if (up)
			up[i] = ui;
		w[i] = wi;
	}
}

static void cu_elementwise_step(int rule, const struct optim_elem_tensor *t, int count, float lr,
				float beta1, float beta2, float eps, float bc1, float bc2,
				float lambda)
{
	for (int k0 = 0; k0 < count; k0 += ELEM_GROUP) {
		struct elem_group G;
		memset(&G, 0, sizeof(G));
		G.count = count - k0 < ELEM_GROUP ? count - k0 : ELEM_GROUP;
		for (int k = 0; k < G.count; k++) {
			const struct optim_elem_tensor *e = &t[k0 + k];
			G.w[k] = e->w;
			G.g[k] = e->g;
			G.s0[k] = e->s0;
			G.s1[k] = e->s1;
			G.up[k] = e->u_prev;
			G.n[k] = e->n;
			G.decay[k] = e->decay;
			G.correct[k] = e->correct;
			size_t nb = (e->n + ELEM_PER_BLOCK - 1) / ELEM_PER_BLOCK;
			G.first[k + 1] = G.first[k] + (int)(nb < 1 ? 1 : nb > 65536 ? 65536 : nb);
		}
		elementwise_step_kernel<<<G.first[G.count], 256, 0, cuda_stream()>>>(
			G, rule, lr, beta1, beta2, eps, bc1, bc2, lambda);
		CUDA_LAUNCHED();
	}
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
	GRID_STRIDE(i, n)
		x[i] *= s;
}

static void cu_scale(float *x, float s, size_t n)
{
	scale_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(x, s, n);
	CUDA_LAUNCHED();
}

/* dst[n] = src[n] from one storage type into another (cuda_act.h: widening
 * is exact, narrowing rounds to nearest even) */
template <typename O, typename I> static void convert(O *dst, const I *src, size_t n)
{
	map1(dst, src, n, copy_op());
}

void cuda_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
	convert(dst, src, n);
}

/* ------------------------------------------------------------------ */
/* activation slots: the interface passes activations as void * in the  */
/* backend's act_dtype; each slot restores the type A of its table       */
/* (float for "cuda", __nv_bfloat16 for its ACT_BF16 twin) and calls the */
/* kernels above, instantiated for A.                                    */

/* f32: copies (in place: nothing) */
static void f32_from_f32(void *out, const float *in, size_t n)
{
	if (out != (const void *)in)
		cu_copy(out, in, n * sizeof(float));
}
static void f32_to_f32(float *out, const void *in, size_t n)
{
	if ((const void *)out != in)
		cu_copy(out, in, n * sizeof(float));
}
/* bf16: out[n] rounded from in[n]; out[n] widened from in[n] */
static void bf16_from_f32(void *out, const float *in, size_t n)
{
	convert((__nv_bfloat16 *)out, in, n);
}
static void bf16_to_f32(float *out, const void *in, size_t n)
{
	convert(out, (const __nv_bfloat16 *)in, n);
}

template <typename A>
static void act_embed_forward(void *out, const int32_t *tokens, const float *wte,
			      const float *wpe, int B, int T, int C)
{
	cu_embed_forward((A *)out, tokens, wte, wpe, B, T, C);
}
template <typename A>
static void act_embed_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tokens,
			       int B, int T, int C)
{
	cu_embed_backward(dwte, dwpe, (const A *)dout, tokens, B, T, C);
}
template <typename A>
static void act_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
				  const float *w, const float *b, int N, int C, float eps)
{
	cu_layernorm_forward((A *)out, mean, rstd, (const A *)inp, w, b, N, C, eps);
}
template <typename A>
static void act_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
				   const void *inp, const float *w, const float *mean,
				   const float *rstd, int N, int C)
{
	cu_layernorm_backward((A *)dinp, dw, db, (const A *)dout, (const A *)inp, w, mean, rstd, N,
			      C);
}
template <typename A>
static void act_add_norm_forward(void *res, void *out, float *mean, float *rstd, const void *a,
				 const void *b, const float *w, const float *bias, int N, int C,
				 float eps, int is_ln)
{
	cu_add_norm_forward((A *)res, (A *)out, mean, rstd, (const A *)a, (const A *)b, w, bias, N,
			    C, eps, is_ln);
}
template <typename A>
static void act_norm_backward_add(void *dacc, float *dw, float *db, const void *dout,
				  const void *inp, const float *w, const float *mean,
				  const float *rstd, int N, int C, int is_ln)
{
	cu_norm_backward_add((A *)dacc, dw, db, (const A *)dout, (const A *)inp, w, mean, rstd, N,
			     C, is_ln);
}
template <typename A>
static void act_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, int N,
				int C, float eps)
{
	cu_rmsnorm_forward((A *)out, rstd, (const A *)inp, w, N, C, eps);
}
template <typename A>
static void act_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
				 const float *w, const float *rstd, int N, int C)
{
	cu_rmsnorm_backward((A *)dinp, dw, (const A *)dout, (const A *)inp, w, rstd, N, C);
}
template <typename A>
static void act_matmul_forward(void *out, const void *inp, const float *w, const float *bias,
			       int N, int C, int OC)
{
	cuda_matmul_forward((A *)out, (const A *)inp, w, bias, N, C, OC);
}
template <typename A>
static void act_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
				const void *inp, const float *w, int N, int C, int OC)
{
	cuda_matmul_backward((A *)dinp, dw, dbias, (const A *)dout, (const A *)inp, w, N, C, OC);
}
template <typename A>
static void act_rope_forward(void *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cu_rope_forward((A *)qkv, B, T, NH, NKV, HD, theta);
}
template <typename A>
static void act_rope_backward(void *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cu_rope_backward((A *)dqkv, B, T, NH, NKV, HD, theta);
}
template <typename A>
static void act_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int NH,
				  int NKV, int HD)
{
	cuda_attention_forward((A *)out, lse, (const A *)qkv, B, T, NH, NKV, HD);
}
template <typename A>
static void act_attention_backward(void *dqkv, const void *dout, const void *qkv,
				   const void *out, const float *lse, int B, int T, int NH,
				   int NKV, int HD)
{
	cuda_attention_backward((A *)dqkv, (const A *)dout, (const A *)qkv, (const A *)out, lse, B,
				T, NH, NKV, HD);
}
template <typename A> static void act_gelu_forward(void *out, const void *inp, size_t n)
{
	cu_gelu_forward((A *)out, (const A *)inp, n);
}
template <typename A>
static void act_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
	cu_gelu_backward((A *)dinp, (const A *)inp, (const A *)dout, n);
}
/* the fused forms: one GEMM with a GELU epilogue where cuBLASLt takes it,
 * else the two ops (gelu_backward in place on the product's dinp) */
template <typename A>
static void act_matmul_gelu_forward(void *out, void *pre, const void *inp, const float *w,
				    const float *bias, int N, int C, int OC)
{
	if (!cuda_matmul_gelu_forward((A *)out, (A *)pre, (const A *)inp, w, bias, N, C, OC))
		return;
	cuda_matmul_forward((A *)pre, (const A *)inp, w, bias, N, C, OC);
	cu_gelu_forward((A *)out, (const A *)pre, (size_t)N * OC);
}
template <typename A>
static void act_matmul_backward_dgelu(void *dpre, float *dw, float *dbias, const void *dout,
				      const void *inp, const float *w, const void *pre, int N,
				      int C, int OC)
{
	if (!cuda_matmul_backward_dgelu((A *)dpre, dw, dbias, (const A *)dout, (const A *)inp, w,
					(const A *)pre, N, C, OC))
		return;
	cuda_matmul_backward((A *)dpre, dw, dbias, (const A *)dout, (const A *)inp, w, N, C, OC);
	cu_gelu_backward((A *)dpre, (const A *)pre, (const A *)dpre, (size_t)N * C);
}
template <typename A> static void act_swiglu_forward(void *out, const void *inp, int N, int F)
{
	cu_swiglu_forward((A *)out, (const A *)inp, N, F);
}
template <typename A>
static void act_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F)
{
	cu_swiglu_backward((A *)dinp, (const A *)dout, (const A *)inp, N, F);
}
template <typename A> static void act_add(void *out, const void *a, const void *b, size_t n)
{
	cu_add((A *)out, (const A *)a, (const A *)b, n);
}
template <typename A>
static void act_softmax_xent(float *losses, void *dlogits, const void *logits,
			     const int32_t *targets, int N, int V, int Vp, float dloss)
{
	cu_softmax_xent(losses, (A *)dlogits, (const A *)logits, targets, N, V, Vp, dloss);
}

/* ------------------------------------------------------------------ */
/* the tables                                                           */

static struct backend cuda_table, cuda_bf16_table;

/* The activation slots for storage type A. */
template <typename A> static void fill_act_slots(struct backend &t)
{
	t.embed_forward = act_embed_forward<A>;
	t.embed_backward = act_embed_backward<A>;
	t.matmul_forward = act_matmul_forward<A>;
	t.matmul_backward = act_matmul_backward<A>;
	t.matmul_gelu_forward = act_matmul_gelu_forward<A>;
	t.matmul_backward_dgelu = act_matmul_backward_dgelu<A>;
	t.layernorm_forward = act_layernorm_forward<A>;
	t.layernorm_backward = act_layernorm_backward<A>;
	t.rmsnorm_forward = act_rmsnorm_forward<A>;
	t.rmsnorm_backward = act_rmsnorm_backward<A>;
	/* ASYNCPP_FUSED_NORM=0 runs the residual adds apart (gpu-check times both) */
	const char *fused = getenv("ASYNCPP_FUSED_NORM");
	bool fuse = !(fused && !strcmp(fused, "0"));
	t.add_norm_forward = fuse ? act_add_norm_forward<A> : NULL;
	t.norm_backward_add = fuse ? act_norm_backward_add<A> : NULL;
	t.attention_forward = act_attention_forward<A>;
	t.attention_backward = act_attention_backward<A>;
	t.rope_forward = act_rope_forward<A>;
	t.rope_backward = act_rope_backward<A>;
	t.gelu_forward = act_gelu_forward<A>;
	t.gelu_backward = act_gelu_backward<A>;
	t.swiglu_forward = act_swiglu_forward<A>;
	t.swiglu_backward = act_swiglu_backward<A>;
	t.add_act = act_add<A>;
	t.softmax_xent = act_softmax_xent<A>;
}

/* Every slot that does not touch activations: the same in both tables. */
static void fill_common_slots(struct backend &t)
{
	t.name = "cuda";
	t.alloc = cu_alloc;
	t.free = cu_free;
	t.to_device = cu_to_device;
	t.to_host = cu_to_host;
	t.copy = cu_copy;
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
	t.weights_bf16 = cuda_weights_bf16;
	t.newton_schulz_many = cuda_newton_schulz_many;
	t.add = cu_add<float>;
	t.adamw_dir = cu_adamw_dir;
	t.adan_dir = cu_adan_dir;
	t.ademamix_dir = cuda_ademamix_dir;
	t.mars_correct = cuda_mars_correct;
	t.ema = cuda_ema;
	t.soap_adam = cuda_soap_adam;
	t.row_normalize = cuda_row_normalize;
	t.gemm = cuda_gemm_f32;
	t.lion_dir = cu_lion_dir;
	t.momentum = cu_momentum;
	t.newton_schulz = cuda_newton_schulz;
	t.apply_update = cu_apply_update;
	t.sumsq = cu_sumsq;
	t.sumsq_many = cu_sumsq_many;
	t.loss_mean = cu_loss_mean;
	t.elementwise_step = cu_elementwise_step;
	t.scale = cu_scale;
}

/* Filled by assignment (not positional initialisers) so that a reordered or
 * extended backend.h cannot silently shift the slots. backend_with_act_dtype
 * goes from one table to the other (train.act_dtype). */
static void fill_tables(void)
{
	struct backend &f = cuda_table, &h = cuda_bf16_table;
	fill_common_slots(f);
	f.act_dtype = ACT_F32;
	f.act_from_f32 = f32_from_f32;
	f.act_to_f32 = f32_to_f32;
	fill_act_slots<float>(f);

	fill_common_slots(h);
	h.act_dtype = ACT_BF16;
	h.act_from_f32 = bf16_from_f32;
	h.act_to_f32 = bf16_to_f32;
	fill_act_slots<__nv_bfloat16>(h);
}

static std::once_flag table_once;

extern "C" const struct backend *backend_cuda(void)
{
	std::call_once(table_once, fill_tables);
	return &cuda_table;
}

extern "C" const struct backend *backend_cuda_bf16(void)
{
	std::call_once(table_once, fill_tables);
	return &cuda_bf16_table;
}
