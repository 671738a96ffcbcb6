/* cuda_cudnn_attention.cu - the attention slots on cuDNN's fused attention
 * (cuda_cudnn.h): the device side of cudnn_sdpa.c, which builds and caches
 * the graphs and plans. Here: the handle of the lane's device, its stream,
 * the workspace from the stream-ordered scratch pool, and 16-byte aligned
 * staging of any misaligned buffer (the plans promise cuDNN 16-byte
 * alignment, and a buffer's offset must never change which kernel runs, so
 * the bits stay the same wherever a pipeline stage's buffers sit).
 *
 * One mutex covers the context and each call's "set the handle's stream,
 * enqueue": handles belong to a device and lanes share them.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include "cuda_common.h"
#include "cuda_cudnn.h"
#include "cuda_flash.h"
#include "cudnn_sdpa.h"

static std::mutex cd_mutex;
static struct sdpa_ctx *cd_ctx;
static std::atomic<long> cd_calls; /* calls cuDNN ran */

/* One buffer of a call: the caller's pointer and, when it is not 16-byte
 * aligned, an aligned copy in scratch (copied in for inputs, back for
 * outputs). */
struct cd_buf {
	void *user, *dev;
	size_t bytes;
	bool in, out;
};

static void cd_stage_in(struct cd_buf *b, cudaStream_t s)
{
	b->dev = b->user;
	if (!((uintptr_t)b->user & 15))
		return;
	b->dev = cuda_scratch(b->bytes);
	if (b->in)
		CUDA_CHECK(cudaMemcpyAsync(b->dev, b->user, b->bytes, cudaMemcpyDeviceToDevice, s));
}

static void cd_stage_out(struct cd_buf *b, cudaStream_t s)
{
	if (b->dev == b->user)
		return;
	if (b->out)
		CUDA_CHECK(cudaMemcpyAsync(b->user, b->dev, b->bytes, cudaMemcpyDeviceToDevice, s));
	cuda_scratch_free(b->dev);
}

/* Run key's plan on bufs (in the order of enum below); 0, or -1 with
 * nothing enqueued but possibly the staging copies (harmless). */
enum { CD_QKV, CD_OUT, CD_LSE, CD_DOUT, CD_DQKV, CD_NBUF };

static int cd_run(struct sdpa_key *k, struct cd_buf *bufs)
{
	std::lock_guard<std::mutex> lock(cd_mutex);
	if (!cd_ctx)
		cd_ctx = sdpa_ctx_new(NULL);
	cudaStream_t s = cuda_stream(); /* makes the lane's device current */
	CUDA_CHECK(cudaGetDevice(&k->device));
	void *h = sdpa_ctx_handle(cd_ctx, k->device);
	const struct sdpa_plan *p = h ? sdpa_plan_get(cd_ctx, h, k) : NULL;
	if (!p || sdpa_ctx_set_stream(cd_ctx, h, (void *)s) < 0)
		return -1;
	for (int i = 0; i < CD_NBUF; i++)
		if (bufs[i].user)
			cd_stage_in(&bufs[i], s);
	size_t wsb = sdpa_plan_workspace(p);
	void *ws = wsb ? cuda_scratch(wsb) : NULL;
	struct sdpa_ptrs x = {};
	x.qkv = bufs[CD_QKV].dev;
	if (k->backward) {
		x.out_in = bufs[CD_OUT].dev;
		x.lse_in = (const float *)bufs[CD_LSE].dev;
		x.dout = bufs[CD_DOUT].dev;
		x.dqkv = bufs[CD_DQKV].dev;
	} else {
		x.out = bufs[CD_OUT].dev;
		x.lse = (float *)bufs[CD_LSE].dev;
	}
	int rc = sdpa_plan_run(cd_ctx, h, p, &x, ws);
	if (rc == 0)
		cd_calls++;
	if (ws)
		cuda_scratch_free(ws);
	for (int i = 0; i < CD_NBUF; i++)
		if (bufs[i].user) {
			if (rc < 0)
				bufs[i].out = false; /* the caller's kernels write them */
			cd_stage_out(&bufs[i], s);
		}
	return rc;
}

static struct sdpa_key cd_key(int B, int T, int NH, int NKV, int HD, int backward)
{
	struct sdpa_key k;
	memset(&k, 0, sizeof(k)); /* the cache compares keys with memcmp */
	k.B = B, k.T = T, k.NH = NH, k.NKV = NKV, k.HD = HD;
	k.bf16 = 1, k.causal = 1, k.backward = backward;
	return k;
}

int cuda_cudnn_attention_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B,
				 int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0 || NKV <= 0 || NH % NKV || (HD != 64 && HD != 128))
		return -1;
	size_t rows = (size_t)B * T, bf = sizeof(__nv_bfloat16);
	struct cd_buf b[CD_NBUF] = {};
	b[CD_QKV] = {(void *)qkv, NULL, rows * (NH + 2 * NKV) * HD * bf, true, false};
	b[CD_OUT] = {out, NULL, rows * NH * HD * bf, false, true};
	b[CD_LSE] = {lse, NULL, rows * NH * sizeof(float), false, true};
	struct sdpa_key k = cd_key(B, T, NH, NKV, HD, 0);
	return cd_run(&k, b);
}

int cuda_cudnn_attention_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
				  const __nv_bfloat16 *qkv, const __nv_bfloat16 *out,
				  const float *lse, int B, int T, int NH, int NKV, int HD)
{
	if (B <= 0 || T <= 0 || NKV <= 0 || NH % NKV || (HD != 64 && HD != 128))
		return -1;
	size_t rows = (size_t)B * T, bf = sizeof(__nv_bfloat16);
	size_t qkv_bytes = rows * (NH + 2 * NKV) * HD * bf;
	struct cd_buf b[CD_NBUF] = {};
	b[CD_QKV] = {(void *)qkv, NULL, qkv_bytes, true, false};
	b[CD_OUT] = {(void *)out, NULL, rows * NH * HD * bf, true, false};
	b[CD_LSE] = {(void *)lse, NULL, rows * NH * sizeof(float), true, false};
	b[CD_DOUT] = {(void *)dout, NULL, rows * NH * HD * bf, true, false};
	b[CD_DQKV] = {dqkv, NULL, qkv_bytes, false, true};
	struct sdpa_key k = cd_key(B, T, NH, NKV, HD, 1);
	return cd_run(&k, b);
}

extern "C" long cuda_attention_cudnn_calls(char *why, size_t len)
{
	std::lock_guard<std::mutex> lock(cd_mutex);
	if (!cd_ctx)
		cd_ctx = sdpa_ctx_new(NULL);
	cuda_stream();
	int d = 0;
	CUDA_CHECK(cudaGetDevice(&d));
	void *h = sdpa_ctx_handle(cd_ctx, d);
	snprintf(why, len, "%s", sdpa_ctx_why(cd_ctx));
	return h ? cd_calls.load() : -1;
}
