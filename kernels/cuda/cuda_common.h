/* cuda_common.h - shared by the .cu files of the CUDA backend (C++ only).
 *
 * Legend: see kernels/backend.h (B, T, N = B*T, C, NH, NKV, HD, F, V, Vp).
 *
 * Activations are fp32 or bf16 (the two tables of cuda_backend.cu; kernels
 * templated on the type through cuda_act.h); everything else is fp32. Matrix
 * products run on tensor cores with bf16 operands and fp32 accumulation
 * (cuBLASLt). All work is
 * queued on the calling thread's lane (backend.h: a stream on a device,
 * cuda_stream(); one per process unless pipeline.devices asks for more);
 * scratch memory comes from the device's stream-ordered pool
 * (cudaMallocAsync), so ops called from several threads never race on it.
 * Anything else an op reuses between calls (cuBLASLt workspace, the weight
 * copies) is kept per lane, so one lane never overwrites what another
 * lane's queued work still reads.
 *
 * Errors: a failing CUDA call leaves the context unusable (errors are
 * sticky), and the void ops of backend.h cannot return one, so cuda_fatal()
 * prints "asyncpp: cuda: FILE:LINE: MESSAGE" and exits 1.
 */
#ifndef ASYNCPP_CUDA_COMMON_H
#define ASYNCPP_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stddef.h>
#include <stdint.h>

#define CUDA_NORETURN __attribute__((noreturn))

void cuda_fatal(const char *file, int line, const char *fmt, ...) CUDA_NORETURN
	__attribute__((format(printf, 3, 4)));

#define CUDA_CHECK(call)                                                          \
	do {                                                                      \
		cudaError_t err_ = (call);                                        \
		if (err_ != cudaSuccess)                                          \
			cuda_fatal(__FILE__, __LINE__, "%s: %s", #call,           \
				   cudaGetErrorString(err_));                     \
	} while (0)
/* After a kernel launch: launch-configuration errors surface here. */
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

/* Lazily initialised (once per process): devices, streams, memory pools.
 * Returns the calling thread's lane's stream, its device made current. */
cudaStream_t cuda_stream(void);
/* The calling thread's lane, 0 .. lanes-1 (see MAX_LANES). */
int cuda_lane(void);
#define CUDA_MAX_LANES 64
/* Stream-ordered scratch; freed in stream order. */
void *cuda_scratch(size_t bytes);
void cuda_scratch_free(void *p);
/* The table's alloc and free (zeroed, counted in memory_peak; NULL with
 * error() set when the device is out of memory; free(NULL) does nothing);
 * this free leaves the weight copies' table alone (it is theirs). */
void *cuda_alloc_tracked(size_t bytes);
void cuda_free_tracked(void *p);

/* Queued copy of bytes (any devices; dst == src: nothing, backend.h). */
void cuda_copy(void *dst, const void *src, size_t bytes);
/* The table's to_device: src may be reused when it returns, and the data is
 * there for every op queued after it (small copies do not wait for the
 * stream: cuda_device.cu's staging ring). */
void cuda_upload(void *dst, const void *src, size_t bytes);
/* Count device memory allocated outside the table's alloc (cudaMalloc'ed
 * and kept, such as the RoPE tables) in memory_peak. */
void cuda_count_held(void *p, size_t bytes);

/* A grid-stride loop over i in [0, n). */
#define GRID_STRIDE(i, n)                                                         \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
	     i += (size_t)gridDim.x * blockDim.x)

static inline int cuda_blocks(size_t n, int threads)
{
	size_t b = (n + threads - 1) / threads;
	return (int)(b > 65535 * 16 ? 65535 * 16 : (b ? b : 1));
}

/* ---- the table's slots, by part: each file fills its own (cuda_backend.cu
 * builds the two tables from them); bf16: the table whose activations are
 * __nv_bfloat16, else float ---- */
struct backend;
void cuda_device_slots(struct backend &t);             /* cuda_device.cu */
void cuda_embed_slots(struct backend &t, bool bf16);   /* cuda_embed.cu */
void cuda_norm_slots(struct backend &t, bool bf16);    /* cuda_norm.cu */
void cuda_elementwise_slots(struct backend &t, bool bf16); /* cuda_elementwise.cu */
void cuda_xent_slots(struct backend &t, bool bf16);    /* cuda_xent.cu */
void cuda_optim_slots(struct backend &t);              /* cuda_optim.cu */
void cuda_moe_slots(struct backend &t, bool bf16);     /* cuda_moe.cu */
void cuda_moe_gemm_slots(struct backend &t, bool bf16); /* cuda_moe_gemm.cu */

/* ---- shared kernels ---- */
/* dst[i] = bf16(src[i]) (cuda_elementwise.cu) */
void cuda_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n);
/* GELU forward and backward (cuda_elementwise.cu; the fused products'
 * fallback) */
void cuda_gelu_forward(float *out, const float *inp, size_t n);
void cuda_gelu_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void cuda_gelu_backward(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp,
			const __nv_bfloat16 *dout, size_t n);
/* Deterministic sum of squares of x[n] into *out (device double), queued
 * (cuda_optim.cu). */
void cuda_sumsq_device(double *out, const float *x, size_t n);

/* ---- cuBLASLt (cuda_matmul.cu) ---- */
/* Row-major D[M,N] = alpha * op(A) op(B) + beta * D (+ bias[N]).
 * A is [M,K] (or [K,M] when ta), B is [K,N] (or [N,K] when tb), bf16;
 * D and bias fp32. Dies with a clear message when cuBLASLt cannot be used. */
void cuda_gemm_bf16(float *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
		    const float *bias, int M, int N, int K, int ta, int tb,
		    float alpha, float beta);
/* count products of one shape at element strides sA, sB, sD (fp32 D, no
 * bias), each matrix the bits cuda_gemm_bf16 gives it alone (the single
 * product's algorithm; one by one where the batch cannot take it). */
void cuda_gemm_bf16_batched(float *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B, int M,
			    int N, int K, int ta, int tb, float alpha, float beta, int count,
			    long long sA, long long sB, long long sD);
/* The same with bf16 D (no C input, beta 0): the reference rate for bench. */
void cuda_gemm_bf16_out(__nv_bfloat16 *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
			int M, int N, int K, int ta, int tb);
/* 0 when cuBLASLt is loaded; else -1 with the reason in why. */
int cuda_blaslt_load(char *why, size_t len);

/* ---- ops the table points at, defined across the .cu files ---- */
/* Activations are float (the f32 table) or __nv_bfloat16 (the bf16 table),
 * one overload each; weights, biases and their gradients are float. */
void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
			 int N, int C, int OC);
void cuda_matmul_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, const float *w,
			 const float *bias, int N, int C, int OC);
void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
			  const float *inp, const float *w, int N, int C, int OC);
void cuda_matmul_backward(__nv_bfloat16 *dinp, float *dw, float *dbias,
			  const __nv_bfloat16 *dout, const __nv_bfloat16 *inp, const float *w,
			  int N, int C, int OC);
/* The same without a bias, for an expert's rows (cuda_moe_gemm.cu's
 * loop): N changes at nearly every call, so the plan's algorithm is chosen
 * once per bucket of N and checked for the real N (cuda_matmul.cu's
 * plan_bucket_algo_locked); a function of the shape alone, as every plan. */
void cuda_expert_matmul_forward(float *out, const float *inp, const float *w, int N, int C,
				int OC);
void cuda_expert_matmul_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, const float *w,
				int N, int C, int OC);
void cuda_expert_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp,
				 const float *w, int N, int C, int OC);
void cuda_expert_matmul_backward(__nv_bfloat16 *dinp, float *dw, const __nv_bfloat16 *dout,
				 const __nv_bfloat16 *inp, const float *w, int N, int C, int OC);
/* matmul_forward + gelu_forward, matmul_backward + gelu_backward, each
 * in one cuBLASLt call with a GELU epilogue; -1 (nothing queued) where
 * that cannot run: the caller runs the ops apart. */
int cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
			     const float *bias, int N, int C, int OC);
int cuda_matmul_gelu_forward(__nv_bfloat16 *out, __nv_bfloat16 *pre, const __nv_bfloat16 *inp,
			     const float *w, const float *bias, int N, int C, int OC);
int cuda_matmul_backward_dgelu(float *dpre, float *dw, float *dbias, const float *dout,
			       const float *inp, const float *w, const float *pre, int N, int C,
			       int OC);
int cuda_matmul_backward_dgelu(__nv_bfloat16 *dpre, float *dw, float *dbias,
			       const __nv_bfloat16 *dout, const __nv_bfloat16 *inp, const float *w,
			       const __nv_bfloat16 *pre, int N, int C, int OC);
void cuda_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
			float *scratch);
void cuda_weights_bf16(const float *w, size_t n);
/* The bf16 operand of the weight w[n] for products the caller queues
 * itself: the prepared copy (cuda_weights_bf16), else w rounded into scratch
 * (*own). Holds the copies' lock until cuda_weight_bf16_release(own), which
 * the caller calls once its products are queued (and before any
 * matmul_forward/backward of its own: the lock is not recursive). */
const __nv_bfloat16 *cuda_weight_bf16_hold(const float *w, size_t n, __nv_bfloat16 **own);
void cuda_weight_bf16_release(__nv_bfloat16 *own);
/* Called by free: no prepared range lies in [p, p + bytes) any more. */
void cuda_weights_forget(const void *p, size_t bytes);
void cuda_newton_schulz_many(float *const *out, const float *const *in, int count, int rows,
			     int cols, int steps, float *scratch);
void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T,
			    int NH, int NKV, int HD);
void cuda_attention_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B,
			    int T, int NH, int NKV, int HD);
void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
			     const float *out, const float *lse, int B, int T, int NH,
			     int NKV, int HD);
void cuda_attention_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
			     const __nv_bfloat16 *qkv, const __nv_bfloat16 *out, const float *lse,
			     int B, int T, int NH, int NKV, int HD);
/* D[b,h,t] = sum_d dout[n, h*HD + d] * out[n, h*HD + d] (cuda_attention.cu),
 * queued; shared by the SIMT and flash backwards. */
void cuda_attention_delta(float *Dd, const float *dout, const float *out, int B, int T,
			  int NH, int HD);
void cuda_attention_delta(float *Dd, const __nv_bfloat16 *dout, const __nv_bfloat16 *out, int B,
			  int T, int NH, int HD);
/* bf16 tensor-core attention (cuda_flash.cu), same contract as the two
 * above; HD 64 or 128 only (cuda_flash_supported). */
int cuda_flash_supported(int NH, int NKV, int HD);
void cuda_flash_forward(float *out, float *lse, const float *qkv, int B, int T, int NH,
			int NKV, int HD);
void cuda_flash_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B, int T,
			int NH, int NKV, int HD);
void cuda_flash_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
			 const float *lse, int B, int T, int NH, int NKV, int HD);
void cuda_flash_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout,
			 const __nv_bfloat16 *qkv, const __nv_bfloat16 *out, const float *lse,
			 int B, int T, int NH, int NKV, int HD);
/* optimizer pieces of cuda_optim.cu (contracts in kernels/backend.h) */
void cuda_ademamix_dir(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
		       float lr, float beta1, float beta2, float beta3, float alpha, float eps,
		       float bc1, float bc2);
void cuda_mars_correct(float *c, const float *g, float *gprev, size_t n, float coef);
void cuda_ema(float *x, const float *g, size_t n, float beta);
void cuda_soap_adam(float *out, const float *mr, const float *gr, float *v, size_t n,
		    float beta2, float eps);
void cuda_row_normalize(float *o, float *v, int rows, int cols, float beta2, float eps);
void cuda_gemm_f32(float *c, const float *a, const float *b, int M, int N, int K, int ta, int tb,
		   float alpha, float beta);
/* dst[c] += sum over rows of x[N,C] (fixed order, float sums); for bias
 * gradients, over activations of either storage type. */
void cuda_colsum_acc(float *dst, const float *x, int N, int C);
void cuda_colsum_acc(float *dst, const __nv_bfloat16 *x, int N, int C);

#endif
