/* test_cuda_nccl.c - the NCCL paths on one GPU: a world of one rank.
 *
 * NCCL refuses two ranks of a communicator on one GPU, so one GPU can only
 * run channels of one rank: grouped sends and receives to itself (the
 * pattern of replica_nccl.c's exchanges), the ordering of transfers after
 * the compute stream's kernels, the completion events the transports poll,
 * and the replicas' sum over a channel of one (which must leave the
 * gradient as it is). Pipelines over NCCL need a GPU per stage: the
 * commands for a machine with several are in kernels/cuda/README.md.
 * Every test SKIPs without a CUDA device or without libnccl.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"
#include "../../kernels/backend.h"
#include "../test.h"

#ifdef ASYNCPP_CUDA
#include "../../kernels/cuda/cuda_nccl.h"
#include "../../sched/comm/nccl.h"
#include "../../sched/comm/replica.h"

static const struct backend *cu;

#define NEED_NCCL()                                                               \
	do {                                                                      \
		char why_[512];                                                   \
		cu = backend_cuda();                                              \
		if (!cu || !cuda_available(why_, sizeof(why_)))                   \
			SKIP(cu ? why_ : "this binary has no CUDA backend");      \
		if (cuda_nccl_load(why_, sizeof(why_)) < 0)                       \
			SKIP(why_);                                               \
	} while (0)

static struct cuda_nccl_chan *open_self(void)
{
	unsigned char id[CUDA_NCCL_ID_BYTES];
	struct cuda_nccl_chan *ch = NULL;
	if (cuda_nccl_unique_id(id) || cuda_nccl_chan_open(&ch, 1, id, 0))
		return NULL;
	return ch;
}

static void fill(float *h, size_t n, float base)
{
	for (size_t i = 0; i < n; i++)
		h[i] = base + (float)i * 0.25f - (float)(i % 7);
}

/* A grouped send and receive to itself moves the bytes, after the kernel
 * that wrote them (a scale queued on the compute stream just before). */
TEST(nccl_self_exchange_after_compute)
{
	NEED_NCCL();
	struct cuda_nccl_chan *ch = open_self();
	CHECK(ch != NULL);
	if (!ch)
		return;
	size_t n = (1 << 20) + 3; /* odd size: bytes, not float4s */
	float *h = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
	fill(h, n, 1.0f);
	float *src = cu->alloc(n * sizeof(float)), *dst = cu->alloc(n * sizeof(float));
	cu->to_device(src, h, n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		got[i] = NAN;
	cu->to_device(dst, got, n * sizeof(float));
	cu->scale(src, 2.0f, n); /* queued; the send must see its result */
	CHECK(cuda_nccl_group_start() == 0);
	struct cuda_nccl_event *a = cuda_nccl_chan_send(ch, src, n * sizeof(float), 0);
	struct cuda_nccl_event *b = cuda_nccl_chan_recv(ch, dst, n * sizeof(float), 0);
	CHECK(cuda_nccl_group_end() == 0);
	CHECK(a && b);
	double waited = nccl_wait(b, ch, 60, 0, 0, "the self-receive");
	CHECK(waited >= 0);
	CHECK(cuda_nccl_event_done(a, ch) == 1 || nccl_wait(a, ch, 60, 0, 0, "the self-send") >= 0);
	cu->to_host(got, dst, n * sizeof(float));
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += got[i] != 2.0f * h[i];
	CHECK_MSG(bad == 0, "%zu of %zu floats differ after the self-exchange", bad, n);
	cuda_nccl_event_free(a);
	cuda_nccl_event_free(b);
	cu->free(src);
	cu->free(dst);
	free(h);
	free(got);
	cuda_nccl_chan_close(ch);
}

/* The compute stream waits for a receive's event: a kernel queued after
 * cuda_nccl_event_wait_compute reads the received data. */
TEST(nccl_compute_waits_for_receive)
{
	NEED_NCCL();
	struct cuda_nccl_chan *ch = open_self();
	CHECK(ch != NULL);
	if (!ch)
		return;
	size_t n = 4099;
	float *h = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
	fill(h, n, -3.0f);
	float *src = cu->alloc(n * sizeof(float)), *dst = cu->alloc(n * sizeof(float));
	cu->to_device(src, h, n * sizeof(float));
	CHECK(cuda_nccl_group_start() == 0);
	struct cuda_nccl_event *a = cuda_nccl_chan_send(ch, src, n * sizeof(float), 0);
	struct cuda_nccl_event *b = cuda_nccl_chan_recv(ch, dst, n * sizeof(float), 0);
	CHECK(cuda_nccl_group_end() == 0);
	CHECK(a && b);
	cuda_nccl_event_wait_compute(b);
	cu->add(dst, dst, dst, n); /* on the compute stream, after the receive */
	cu->to_host(got, dst, n * sizeof(float));
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += got[i] != h[i] + h[i];
	CHECK_MSG(bad == 0, "%zu of %zu floats differ", bad, n);
	nccl_wait(a, ch, 60, 0, 0, "the self-send");
	cuda_nccl_event_free(a);
	cuda_nccl_event_free(b);
	cu->free(src);
	cu->free(dst);
	free(h);
	free(got);
	cuda_nccl_chan_close(ch);
}

/* The all-reduce wrapper over a communicator of one is the identity. */
TEST(nccl_allreduce_of_one)
{
	NEED_NCCL();
	unsigned char id[CUDA_NCCL_ID_BYTES];
	struct cuda_nccl_comm *comm = NULL;
	CHECK(cuda_nccl_unique_id(id) == 0);
	CHECK(cuda_nccl_init(&comm, 1, id, 0) == 0);
	if (!comm)
		return;
	size_t n = 1000;
	float h[1000], got[1000];
	fill(h, n, 0.5f);
	float *x = cu->alloc(sizeof(h));
	cu->to_device(x, h, sizeof(h));
	CHECK(cuda_nccl_allreduce_sum(comm, x, x, n) == 0);
	cu->to_host(got, x, sizeof(got));
	CHECK(memcmp(got, h, sizeof(h)) == 0);
	cu->free(x);
	cuda_nccl_destroy(comm);
}

/* replicas_nccl with one replica: the exchanges are empty and the sum of
 * one gradient is itself, bit for bit. */
TEST(nccl_replicas_of_one_keep_the_gradient)
{
	NEED_NCCL();
	struct nccl_world w;
	memset(&w, 0, sizeof(w));
	w.stages = 1;
	w.replicas = 1;
	CHECK((w.dp = open_self()) != NULL);
	if (!w.dp)
		return;
	struct replicas *rx = replicas_nccl(cu, &w, 60);
	CHECK(rx != NULL);
	size_t n = 777;
	float h[777], got[777];
	fill(h, n, 9.0f);
	float *g = cu->alloc(sizeof(h));
	cu->to_device(g, h, sizeof(h));
	double waited = -1;
	rx->allreduce(rx, 0, 0, g, n, &waited);
	cu->to_host(got, g, sizeof(got));
	CHECK(memcmp(got, h, sizeof(h)) == 0);
	CHECK(waited >= 0);
	/* in buckets (pipeline.bucket_mb), three of them, twice (the buckets'
	 * scratch is reused the second time), the last one empty */
	for (int round = 0; round < 2; round++) {
		CHECK(rx->bucket && rx->finish);
		rx->bucket(rx, 0, 0, g + 500, 277, NULL);
		rx->bucket(rx, 0, 0, g, 500, NULL);
		rx->bucket(rx, 0, 0, g, 0, NULL);
		waited = -1;
		rx->finish(rx, 0, 0, &waited);
		cu->to_host(got, g, sizeof(got));
		CHECK(memcmp(got, h, sizeof(h)) == 0);
		CHECK(waited >= 0);
	}
	rx->destroy(rx);
	cu->free(g);
	cuda_nccl_chan_close(w.dp);
}

#else

TEST(nccl_needs_cuda_on_cpu)
{
	SKIP("built without CUDA");
}

#endif
