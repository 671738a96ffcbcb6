/* cuda_bench.cu - `asyncpp bench kernels --device cuda`: every backend
 * operation on model-sized shapes, timed with CUDA events, against the
 * device's peak. Timings are printed, never asserted (see HACKING.md).
 *
 * FLOP counts: a matmul forward is 2*N*C*OC, its backward 4*N*C*OC; causal
 * attention forward 2*B*NH*T*T*HD (half of the 4*B*NH*T^2*HD of full
 * attention), backward 2.5x the forward (the five products of flash
 * attention's backward); attention rows come once per implementation,
 * "simt" (fp32) and "flash" (bf16 tensor cores, HD 64 and 128). Bandwidth rows count each tensor read or written
 * once, in fp32.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <string.h>

#include "cuda_bench.h"
#include "cuda_common.h"
#include "cuda_flash.h"

extern "C" {
#include "../../io/util.h"
#include "../backend.h"
}

struct peak_entry {
	const char *match, *also, *label;
	double tflops, gbs;
};

/* Dense bf16 without sparsity; HBM per the vendors' data sheets. */
static const struct peak_entry peaks[] = {
	{"H200", NULL, "H200", 989, 4800},
	{"H100", "PCIe", "H100 PCIe", 756, 2000},
	{"H100", "NVL", "H100 NVL", 835, 3900},
	{"H100", NULL, "H100 SXM", 989, 3350},
	{"A100", "40GB", "A100 40GB", 312, 1555},
	{"A100", NULL, "A100 80GB", 312, 2039},
};

extern "C" int cuda_device_peak(double *tflops, double *gbs, char *label, size_t len)
{
	char why[256];
	int dev;
	cudaDeviceProp prop;
	*tflops = *gbs = 0;
	if (!cuda_available(why, sizeof(why)))
		return error("cuda: %s", why);
	CUDA_CHECK(cudaGetDevice(&dev));
	CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
	snprintf(label, len, "%s", prop.name);
	for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
		const struct peak_entry *p = &peaks[i];
		if (!strstr(prop.name, p->match) || (p->also && !strstr(prop.name, p->also)))
			continue;
		*tflops = p->tflops;
		*gbs = p->gbs;
		snprintf(label, len, "%s", p->label);
		break;
	}
	return 0;
}

/* ---- inputs ---- */

__global__ static void fill_kernel(float *x, size_t n, uint32_t seed, float scale)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint32_t h = (uint32_t)i * 2654435761u ^ seed;
		h ^= h >> 16;
		h *= 0x7feb352du;
		h ^= h >> 15;
		x[i] = scale * ((h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
	}
}

__global__ static void tokens_kernel(int32_t *t, size_t n, int V)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		t[i] = (int32_t)((i * 2654435761u) % (uint32_t)V);
}

static float *rnd(size_t n, float scale)
{
	static uint32_t seed = 1;
	float *x = NULL;
	CUDA_CHECK(cudaMalloc(&x, n * sizeof(float)));
	fill_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(x, n, seed++ * 0x9e3779b9u,
								     scale);
	CUDA_LAUNCHED();
	return x;
}

/* ---- timing ---- */

struct bench {
	FILE *out;
	int iters;
	double peak_tflops, peak_gbs;
	cudaEvent_t e0, e1;
};

#define TIME(bp, seconds, stmt)                                                   \
	do {                                                                      \
		stmt;                                                             \
		CUDA_CHECK(cudaEventRecord((bp)->e0, cuda_stream()));             \
		for (int it_ = 0; it_ < (bp)->iters; it_++) {                     \
			stmt;                                                     \
		}                                                                 \
		CUDA_CHECK(cudaEventRecord((bp)->e1, cuda_stream()));             \
		CUDA_CHECK(cudaEventSynchronize((bp)->e1));                       \
		float ms_;                                                        \
		CUDA_CHECK(cudaEventElapsedTime(&ms_, (bp)->e0, (bp)->e1));       \
		seconds = ms_ / 1e3 / (bp)->iters;                                \
	} while (0)

static void row_flops(struct bench *b, const char *op, const char *shape, double s, double flops)
{
	double tf = flops / s / 1e12;
	fprintf(b->out, "%-26s %-24s %10.1f %9.1f TFLOP/s", op, shape, s * 1e6, tf);
	if (b->peak_tflops > 0)
		fprintf(b->out, " %6.1f%%", 100 * tf / b->peak_tflops);
	fputc('\n', b->out);
}

static void row_bytes(struct bench *b, const char *op, const char *shape, double s, double bytes)
{
	double gbs = bytes / s / 1e9;
	fprintf(b->out, "%-26s %-24s %10.1f %9.1f GB/s   ", op, shape, s * 1e6, gbs);
	if (b->peak_gbs > 0)
		fprintf(b->out, " %6.1f%%", 100 * gbs / b->peak_gbs);
	fputc('\n', b->out);
}

static void bench_matmul(struct bench *b, const struct backend *be, const char *name, int N,
			 int C, int OC, int bias)
{
	char shape[64];
	double s;
	snprintf(shape, sizeof(shape), "%dx%d @ %dx%d", N, C, OC, C);
	float *x = rnd((size_t)N * C, 1), *w = rnd((size_t)OC * C, 0.05f);
	float *bb = bias ? rnd(OC, 1) : NULL, *y = rnd((size_t)N * OC, 1);
	float *dy = rnd((size_t)N * OC, 1), *dx = rnd((size_t)N * C, 1), *dw = rnd((size_t)OC * C, 1);
	float *db = rnd(OC, 1);
	char op[64];
	snprintf(op, sizeof(op), "matmul_fwd %s", name);
	TIME(b, s, be->matmul_forward(y, x, w, bb, N, C, OC));
	row_flops(b, op, shape, s, 2.0 * N * C * OC);
	snprintf(op, sizeof(op), "matmul_bwd %s", name);
	TIME(b, s, be->matmul_backward(dx, dw, bias ? db : NULL, dy, x, w, N, C, OC));
	row_flops(b, op, shape, s, 4.0 * N * C * OC);
	/* reference: cuBLASLt alone, bf16 in and out, same shape as the forward */
	__nv_bfloat16 *xb, *wb, *yb;
	CUDA_CHECK(cudaMalloc(&xb, (size_t)N * C * 2));
	CUDA_CHECK(cudaMalloc(&wb, (size_t)OC * C * 2));
	CUDA_CHECK(cudaMalloc(&yb, (size_t)N * OC * 2));
	cuda_to_bf16(xb, x, (size_t)N * C);
	cuda_to_bf16(wb, w, (size_t)OC * C);
	TIME(b, s, cuda_gemm_bf16_out(yb, xb, wb, N, OC, C, 0, 1));
	row_flops(b, "  cuBLASLt bf16 reference", shape, s, 2.0 * N * C * OC);
	cudaFree(xb), cudaFree(wb), cudaFree(yb);
	cudaFree(x), cudaFree(w), cudaFree(bb), cudaFree(y), cudaFree(dy), cudaFree(dx);
	cudaFree(dw), cudaFree(db);
}

/* Rows "attention_fwd NAME" and "attention_bwd NAME": table t's attention
 * on its activations (att, qkv, dqkv, dy); af the forward's FLOPs. */
static void time_attention(struct bench *b, const struct backend *t, const char *name,
			   const char *shape, void *att, float *lse, const void *qkv, void *dqkv,
			   const void *dy, int B, int T, int NH, int NKV, int HD, double af)
{
	char op[64];
	double s;
	snprintf(op, sizeof(op), "attention_fwd %s", name);
	TIME(b, s, t->attention_forward(att, lse, qkv, B, T, NH, NKV, HD));
	row_flops(b, op, shape, s, af);
	snprintf(op, sizeof(op), "attention_bwd %s", name);
	TIME(b, s, t->attention_backward(dqkv, dy, qkv, att, lse, B, T, NH, NKV, HD));
	row_flops(b, op, shape, s, 2.5 * af);
}

/* Causal attention forward and backward with each implementation
 * (cuda_flash.h) that takes the shape: rows "attention_fwd simt",
 * "attention_fwd flash", ..., "attention_fwd cudnn bf16" (where libcudnn
 * loads). The choice in force before is restored. */
static void bench_attention(struct bench *b, const struct backend *be, float *att, float *lse,
			    const float *qkv, float *dqkv, const float *dy, int B, int T, int NH,
			    int NKV, int HD)
{
	static const struct {
		int impl;
		const char *name;
	} impls[] = {{CUDA_ATTENTION_SIMT, "simt"}, {CUDA_ATTENTION_FLASH, "flash"}};
	char shape[64];
	double af = 2.0 * B * NH * (double)T * T * HD;
	snprintf(shape, sizeof(shape), "B %d T %d H %d/%d D %d", B, T, NH, NKV, HD);
	int prev = cuda_attention_impl();
	for (size_t k = 0; k < sizeof(impls) / sizeof(impls[0]); k++) {
		if (impls[k].impl == CUDA_ATTENTION_FLASH &&
		    !cuda_attention_flash_supported(NH, NKV, HD))
			continue;
		cuda_attention_set_impl(impls[k].impl);
		time_attention(b, be, impls[k].name, shape, att, lse, qkv, dqkv, dy, B, T, NH, NKV,
			       HD, af);
	}
	/* bf16 activations (the default on cuda): the flash kernels with tiles
	 * streamed by cp.async ("flash") and loaded synchronously ("flash-sync") */
	const struct backend *b16 = backend_cuda_bf16();
	if (b16 && cuda_attention_flash_supported(NH, NKV, HD)) {
		size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
		__nv_bfloat16 *q16, *dq16, *o16, *dy16;
		CUDA_CHECK(cudaMalloc((void **)&q16, nq * 2));
		CUDA_CHECK(cudaMalloc((void **)&dq16, nq * 2));
		CUDA_CHECK(cudaMalloc((void **)&o16, no * 2));
		CUDA_CHECK(cudaMalloc((void **)&dy16, no * 2));
		cuda_to_bf16(q16, qkv, nq);
		cuda_to_bf16(dy16, dy, no);
		static const struct {
			int impl;
			const char *name;
		} fl[] = {{CUDA_ATTENTION_FLASH, "flash bf16"}, {CUDA_ATTENTION_FLASH_SYNC, "flash-sync bf16"}};
		for (size_t k = 0; k < sizeof(fl) / sizeof(fl[0]); k++) {
			cuda_attention_set_impl(fl[k].impl);
			time_attention(b, b16, fl[k].name, shape, o16, lse, q16, dq16, dy16, B, T, NH,
				       NKV, HD, af);
		}
		/* cuDNN's fused attention where libcudnn loads (ASYNCPP_ATTENTION=cudnn);
		 * a shape it refuses runs flash, and the line after the rows says so */
		char why[256];
		long c0 = cuda_attention_cudnn_calls(why, sizeof(why));
		if (c0 < 0) {
			fprintf(b->out, "attention cudnn bf16: not run (%s)\n", why);
		} else {
			cuda_attention_set_impl(CUDA_ATTENTION_CUDNN);
			time_attention(b, b16, "cudnn bf16", shape, o16, lse, q16, dq16, dy16, B, T, NH,
				       NKV, HD, af);
			long c1 = cuda_attention_cudnn_calls(why, sizeof(why));
			if (c1 == c0)
				fprintf(b->out, "attention cudnn bf16: cuDNN refused %s, the rows ran "
					"flash (%s)\n", shape, why);
		}
		cudaFree(q16), cudaFree(dq16), cudaFree(o16), cudaFree(dy16);
	}
	cuda_attention_set_impl(prev);
}

/* Attention alone at a shape no layer above has (HD 128). */
static void bench_attention_only(struct bench *b, const struct backend *be, int B, int T, int NH,
				 int NKV, int HD)
{
	size_t N = (size_t)B * T, QKV = (size_t)(NH + 2 * NKV) * HD, C = (size_t)NH * HD;
	fprintf(b->out, "-- attention: B %d, T %d, heads %d/%d, HD %d\n", B, T, NH, NKV, HD);
	float *qkv = rnd(N * QKV, 1), *dqkv = rnd(N * QKV, 1), *att = rnd(N * C, 1);
	float *dy = rnd(N * C, 1), *lse = rnd((size_t)B * NH * T, 1);
	bench_attention(b, be, att, lse, qkv, dqkv, dy, B, T, NH, NKV, HD);
	cudaFree(qkv), cudaFree(dqkv), cudaFree(att), cudaFree(dy), cudaFree(lse);
}

static void bench_layer(struct bench *b, const struct backend *be, const char *model, int B,
			int T, int C, int NH, int NKV, int F, int gelu)
{
	int HD = C / NH, N = B * T, QKV = (NH + 2 * NKV) * HD;
	size_t nc = (size_t)N * C;
	char shape[64];
	double s;
	fprintf(b->out, "-- %s layer: B %d, T %d, C %d, heads %d/%d, FFN %d\n", model, B, T, C,
		NH, NKV, F);
	snprintf(shape, sizeof(shape), "N %d, C %d", N, C);
	float *x = rnd(nc, 1), *y = rnd(nc, 1), *dy = rnd(nc, 1), *dx = rnd(nc, 1);
	float *w = rnd(C, 1), *bb = rnd(C, 1), *dw = rnd(C, 1), *db = rnd(C, 1);
	float *mean = rnd(N, 0), *rstd = rnd(N, 1);
	if (gelu) {
		TIME(b, s, be->layernorm_forward(y, mean, rstd, x, w, bb, N, C, 1e-5f));
		row_bytes(b, "layernorm_fwd", shape, s, 8.0 * nc);
		TIME(b, s, be->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C));
		row_bytes(b, "layernorm_bwd", shape, s, 12.0 * nc);
	} else {
		TIME(b, s, be->rmsnorm_forward(y, rstd, x, w, N, C, 1e-5f));
		row_bytes(b, "rmsnorm_fwd", shape, s, 8.0 * nc);
		TIME(b, s, be->rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C));
		row_bytes(b, "rmsnorm_bwd", shape, s, 12.0 * nc);
	}
	TIME(b, s, be->add(y, x, dy, nc));
	row_bytes(b, "add (residual)", shape, s, 12.0 * nc);
	if (be->add_norm_forward && be->norm_backward_add) {
		/* the residual add fused into the norm (what the model runs):
		 * against the two rows above, the add's pass saved */
		float *res = rnd(nc, 1);
		TIME(b, s, be->add_norm_forward(res, y, mean, rstd, x, dy, w, bb, N, C, 1e-5f, gelu));
		row_bytes(b, gelu ? "add+layernorm_fwd" : "add+rmsnorm_fwd", shape, s, 16.0 * nc);
		TIME(b, s, be->norm_backward_add(dx, dw, db, dy, x, w, mean, rstd, N, C, gelu));
		row_bytes(b, gelu ? "layernorm_bwd+add" : "rmsnorm_bwd+add", shape, s, 16.0 * nc);
		cudaFree(res);
	}

	bench_matmul(b, be, "qkv", N, C, QKV, gelu);
	float *qkv = rnd((size_t)N * QKV, 1), *dqkv = rnd((size_t)N * QKV, 1);
	float *att = rnd(nc, 1), *lse = rnd((size_t)B * NH * T, 1);
	if (!gelu) {
		snprintf(shape, sizeof(shape), "N %d, heads %d/%d", N, NH, NKV);
		TIME(b, s, be->rope_forward(qkv, B, T, NH, NKV, HD, 10000.0f));
		row_bytes(b, "rope_fwd", shape, s, 8.0 * N * (NH + NKV) * HD);
	}
	bench_attention(b, be, att, lse, qkv, dqkv, dy, B, T, NH, NKV, HD);
	bench_matmul(b, be, "attn proj", N, C, C, gelu);
	if (gelu) {
		bench_matmul(b, be, "fc", N, C, F, 1);
		size_t nf = (size_t)N * F;
		float *h = rnd(nf, 1), *g = rnd(nf, 1), *dh = rnd(nf, 1);
		snprintf(shape, sizeof(shape), "%zu", nf);
		TIME(b, s, be->gelu_forward(g, h, nf));
		row_bytes(b, "gelu_fwd", shape, s, 8.0 * nf);
		TIME(b, s, be->gelu_backward(dh, h, g, nf));
		row_bytes(b, "gelu_bwd", shape, s, 12.0 * nf);
		cudaFree(h), cudaFree(g), cudaFree(dh);
	} else {
		bench_matmul(b, be, "gate+up", N, C, 2 * F, 0);
		size_t nf = (size_t)N * F;
		float *h = rnd(2 * nf, 1), *g = rnd(nf, 1), *dh = rnd(2 * nf, 1);
		snprintf(shape, sizeof(shape), "N %d, F %d", N, F);
		TIME(b, s, be->swiglu_forward(g, h, N, F));
		row_bytes(b, "swiglu_fwd", shape, s, 12.0 * nf);
		TIME(b, s, be->swiglu_backward(dh, g, h, N, F));
		row_bytes(b, "swiglu_bwd", shape, s, 20.0 * nf);
		cudaFree(h), cudaFree(g), cudaFree(dh);
	}
	bench_matmul(b, be, "ffn out", N, F, C, gelu);
	cudaFree(x), cudaFree(y), cudaFree(dy), cudaFree(dx), cudaFree(w), cudaFree(bb);
	cudaFree(dw), cudaFree(db), cudaFree(mean), cudaFree(rstd), cudaFree(qkv);
	cudaFree(dqkv), cudaFree(att), cudaFree(lse);
}

/* Replace the data sheet's peaks by measured ones: the largest square bf16
 * GEMM cuBLASLt runs, and a device-to-device copy (bytes read + written). */
static void measure_peaks(struct bench *b)
{
	const int n = 8192;
	const size_t copy_bytes = (size_t)1 << 30;
	double s;
	float *x = rnd((size_t)n * n, 1), *y = rnd((size_t)n * n, 1);
	__nv_bfloat16 *xb, *yb, *zb;
	CUDA_CHECK(cudaMalloc(&xb, (size_t)n * n * 2));
	CUDA_CHECK(cudaMalloc(&yb, (size_t)n * n * 2));
	CUDA_CHECK(cudaMalloc(&zb, (size_t)n * n * 2));
	cuda_to_bf16(xb, x, (size_t)n * n); /* random data: zeros run faster */
	cuda_to_bf16(yb, y, (size_t)n * n);
	TIME(b, s, cuda_gemm_bf16_out(zb, xb, yb, n, n, n, 0, 1));
	b->peak_tflops = 2.0 * n * n * (double)n / s / 1e12;
	cudaFree(xb), cudaFree(yb), cudaFree(zb), cudaFree(x), cudaFree(y);
	void *src, *dst;
	CUDA_CHECK(cudaMalloc(&src, copy_bytes));
	CUDA_CHECK(cudaMalloc(&dst, copy_bytes));
	CUDA_CHECK(cudaMemsetAsync(src, 1, copy_bytes, cuda_stream()));
	TIME(b, s, CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice,
					     cuda_stream())));
	b->peak_gbs = 2.0 * copy_bytes / s / 1e9;
	cudaFree(src), cudaFree(dst);
}

extern "C" int cuda_bench_kernels(FILE *out, int iters)
{
	struct bench b;
	char label[128];
	memset(&b, 0, sizeof(b));
	if (cuda_device_peak(&b.peak_tflops, &b.peak_gbs, label, sizeof(label)) < 0)
		return -1;
	b.out = out;
	b.iters = iters > 0 ? iters : 20;
	const struct backend *be = backend_cuda();
	cuda_stream();
	CUDA_CHECK(cudaEventCreate(&b.e0));
	CUDA_CHECK(cudaEventCreate(&b.e1));
	fprintf(out, "device: %s; data sheet: bf16 dense ", label);
	if (b.peak_tflops > 0)
		fprintf(out, "%.0f TFLOP/s, HBM %.0f GB/s\n", b.peak_tflops, b.peak_gbs);
	else
		fprintf(out, "unknown\n");
	/* The ceilings every row is a percentage of, measured here and now: the
	 * data sheet's are not what this card at this clock delivers. */
	measure_peaks(&b);
	fprintf(out, "measured peaks: bf16 GEMM 8192^3 %.1f TFLOP/s; device copy of 1 GiB %.0f GB/s "
		"(read + write)\n", b.peak_tflops, b.peak_gbs);
	fprintf(out, "%-26s %-24s %10s %17s %7s\n", "op", "shape", "time_us", "rate", "%peak");

	bench_layer(&b, be, "GPT-2 124M", 8, 1024, 768, 12, 12, 3072, 1);
	bench_layer(&b, be, "SmolLM-360M", 8, 1024, 960, 15, 5, 2560, 0);
	bench_attention_only(&b, be, 4, 2048, 16, 4, 128);

	/* embeddings and the loss at GPT-2's vocabulary */
	int B = 8, T = 1024, C = 768, N = B * T, V = 50257, Vp = 50304;
	char shape[64];
	double s;
	fprintf(out, "-- embeddings, head and loss: N %d, C %d, V %d\n", N, C, V);
	int32_t *tok;
	CUDA_CHECK(cudaMalloc(&tok, N * sizeof(int32_t)));
	tokens_kernel<<<cuda_blocks(N, 256), 256, 0, cuda_stream()>>>(tok, N, V);
	CUDA_LAUNCHED();
	float *wte = rnd((size_t)Vp * C, 1), *wpe = rnd((size_t)T * C, 1);
	float *x = rnd((size_t)N * C, 1), *dwte = rnd((size_t)Vp * C, 1), *dwpe = rnd((size_t)T * C, 1);
	snprintf(shape, sizeof(shape), "N %d, C %d", N, C);
	TIME(&b, s, be->embed_forward(x, tok, wte, wpe, B, T, C));
	row_bytes(&b, "embed_fwd", shape, s, 12.0 * N * C);
	TIME(&b, s, be->embed_backward(dwte, dwpe, x, tok, B, T, C));
	row_bytes(&b, "embed_bwd (host bucketing)", shape, s, 12.0 * N * C);
	bench_matmul(&b, be, "lm head", N, C, Vp, 0);
	float *logits = rnd((size_t)N * Vp, 4), *losses = rnd(N, 1);
	snprintf(shape, sizeof(shape), "N %d, Vp %d", N, Vp);
	TIME(&b, s, be->softmax_xent(losses, logits, logits, tok, N, V, Vp, 1.0f / N));
	row_bytes(&b, "softmax_xent (in place)", shape, s, 8.0 * N * Vp);
	/* the vectorised kernel (cuda_flash.h), and both on bf16 logits */
	int xprev = cuda_xent_set_impl(CUDA_XENT_VEC);
	TIME(&b, s, be->softmax_xent(losses, logits, logits, tok, N, V, Vp, 1.0f / N));
	row_bytes(&b, "softmax_xent vec", shape, s, 8.0 * N * Vp);
	const struct backend *x16 = backend_cuda_bf16();
	if (x16) {
		__nv_bfloat16 *lg16;
		CUDA_CHECK(cudaMalloc((void **)&lg16, (size_t)N * Vp * 2));
		cuda_to_bf16(lg16, logits, (size_t)N * Vp);
		cuda_xent_set_impl(CUDA_XENT_PLAIN);
		TIME(&b, s, x16->softmax_xent(losses, lg16, lg16, tok, N, V, Vp, 1.0f / N));
		row_bytes(&b, "softmax_xent bf16", shape, s, 4.0 * N * Vp);
		cuda_xent_set_impl(CUDA_XENT_VEC);
		TIME(&b, s, x16->softmax_xent(losses, lg16, lg16, tok, N, V, Vp, 1.0f / N));
		row_bytes(&b, "softmax_xent vec bf16", shape, s, 4.0 * N * Vp);
		cudaFree(lg16);
	}
	cuda_xent_set_impl(xprev);
	cudaFree(tok), cudaFree(wte), cudaFree(wpe), cudaFree(x), cudaFree(dwte), cudaFree(dwpe);
	cudaFree(logits), cudaFree(losses);

	/* optimizer pieces over GPT-2 124M's parameter count */
	size_t P = 124475904;
	fprintf(out, "-- optimizer over %zu parameters\n", P);
	snprintf(shape, sizeof(shape), "%zu", P);
	float *w = rnd(P, 1), *g = rnd(P, 1), *m = rnd(P, 0.1f), *v = rnd(P, 0.1f);
	float *u = rnd(P, 0.01f), *up = rnd(P, 0.01f);
	be->scale(v, 0.0f, P); /* second moments must be >= 0 */
	TIME(&b, s, be->adamw_dir(u, g, m, v, P, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.5f));
	row_bytes(&b, "adamw_dir", shape, s, 24.0 * P);
	TIME(&b, s, be->lion_dir(u, g, m, P, 1e-4f, 0.9f, 0.99f));
	row_bytes(&b, "lion_dir", shape, s, 16.0 * P);
	TIME(&b, s, be->momentum(u, g, m, P, 0.95f, 1));
	row_bytes(&b, "momentum", shape, s, 16.0 * P);
	TIME(&b, s, be->apply_update(w, u, up, P, 1e-4f, 1.0f));
	row_bytes(&b, "apply_update (corrected)", shape, s, 20.0 * P);
	TIME(&b, s, (void)be->sumsq(g, P));
	row_bytes(&b, "sumsq (+ host sync)", shape, s, 4.0 * P);
	TIME(&b, s, be->scale(g, 1.0f, P));
	row_bytes(&b, "scale", shape, s, 8.0 * P);
	/* the bf16 copy of the weights a pass makes (model/: weights_bf16) */
	TIME(&b, s, be->weights_bf16(w, P));
	row_bytes(&b, "weights_bf16 (copy)", shape, s, 6.0 * P);
	cuda_weights_forget(w, P * sizeof(float)); /* w is freed with cudaFree below */
	/* Newton-Schulz, 5 steps, on the largest Muon matrices */
	int ns_shapes[][2] = {{768, 3072}, {3072, 768}, {960, 2560}, {768, 768}};
	for (size_t k = 0; k < sizeof(ns_shapes) / sizeof(ns_shapes[0]); k++) {
		int r = ns_shapes[k][0], c = ns_shapes[k][1];
		double mm = r < c ? r : c, nn = r < c ? c : r;
		float *scr = rnd(newton_schulz_scratch(r, c), 0);
		snprintf(shape, sizeof(shape), "%dx%d, 5 steps", r, c);
		TIME(&b, s, be->newton_schulz(u, g, r, c, 5, scr));
		row_flops(&b, "newton_schulz", shape, s,
			  5 * (4.0 * mm * mm * nn + 2.0 * mm * mm * mm));
		cudaFree(scr);
		/* 8 of them batched (newton_schulz_many, as optim.c calls it):
		 * the per-matrix time is the figure to compare with the row above */
		enum { NB = 8 };
		size_t rc = (size_t)r * c;
		float *in8 = rnd(NB * rc, 1), *out8 = rnd(NB * rc, 0);
		float *scr8 = rnd(newton_schulz_many_scratch(NB, r, c), 0);
		float *outs[NB];
		const float *ins[NB];
		for (int i = 0; i < NB; i++)
			ins[i] = in8 + i * rc, outs[i] = out8 + i * rc;
		snprintf(shape, sizeof(shape), "8 x %dx%d, per matrix", r, c);
		TIME(&b, s, be->newton_schulz_many(outs, ins, NB, r, c, 5, scr8));
		row_flops(&b, "newton_schulz_many", shape, s / NB,
			  5 * (4.0 * mm * mm * nn + 2.0 * mm * mm * mm));
		cudaFree(in8), cudaFree(out8), cudaFree(scr8);
	}
	cudaFree(w), cudaFree(g), cudaFree(m), cudaFree(v), cudaFree(u), cudaFree(up);
	cudaEventDestroy(b.e0);
	cudaEventDestroy(b.e1);
	return 0;
}
