/* cpu.h - the CPU reference backend's kernels, shared between the files of
 * kernels/cpu/ and the table in cpu_backend.c.
 *
 * Every kernel is plain fp32 C with OpenMP loops over independent outputs;
 * matrix products go through OpenBLAS. Results never depend on the number of
 * threads: reductions run in a fixed order (per output, in index order, or in
 * fixed-size chunks combined in index order), never as per-thread partial
 * sums. No kernel keeps global scratch, so several threads (pipeline stages)
 * may call the backend at once.
 *
 * Legend: see kernels/backend.h (B, T, N = B*T, C, NH, NKV, HD, F, V, Vp).
 */
#ifndef ASYNCPP_CPU_H
#define ASYNCPP_CPU_H

#include <stddef.h>
#include <stdint.h>

struct optim_elem_tensor;

/* Threads an OpenMP region uses: the count set_threads() chose (shared by all
 * calling threads, unlike omp_set_num_threads), or the OpenMP default. */
int cpu_threads(void);
/* Regions over fewer elements than this run on one thread (the result is the
 * same either way; it only saves the fork/join). */
#define CPU_PAR_MIN 16384

/* memory and threads (cpu_mem.c) */
void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
void cpu_memcpy(void *dst, const void *src, size_t bytes);
void cpu_zero(void *p, size_t bytes);
void cpu_synchronize(void);
void cpu_set_threads(int n);

/* embeddings and norms (cpu_norm.c) */
void cpu_embed_forward(float *out, const int32_t *tokens, const float *wte,
		       const float *wpe, int B, int T, int C);
void cpu_embed_backward(float *dwte, float *dwpe, const float *dout,
			const int32_t *tokens, int B, int T, int C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
			   const float *w, const float *b, int N, int C, float eps);
void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
			    const float *inp, const float *w, const float *mean,
			    const float *rstd, int N, int C);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
			 int N, int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
			  const float *w, const float *rstd, int N, int C);
/* dst[c] += sum over rows n (in order) of x[n,c], for c < C: the fixed-order
 * column reduction the bias/norm/embedding gradients share. */
void cpu_colsum_acc(float *dst, const float *x, int N, int C);

/* matrix products (cpu_matmul.c) */
/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C (row-major, op = transpose
 * when ta/tb): cblas_sgemm's contract, but bit-identical on any thread count.
 * Every matrix product of the backend goes through it. */
void cpu_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
	      const float *B, int ldb, float beta, float *Cm, int ldc);
/* Puts OpenBLAS on one thread (once); cpu_gemm does the threading. */
void cpu_blas_init(void);
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
			int N, int C, int OC);
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
			 const float *inp, const float *w, int N, int C, int OC);

/* attention (cpu_attention.c) */
void cpu_rope_forward(float *qkv, int B, int T, int NH, int NKV, int HD, float theta);
void cpu_rope_backward(float *dqkv, int B, int T, int NH, int NKV, int HD, float theta);
void cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T,
			   int NH, int NKV, int HD);
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv,
			    const float *out, const float *lse, int B, int T, int NH,
			    int NKV, int HD);

/* activations, residuals, loss (cpu_act.c) */
void cpu_gelu_forward(float *out, const float *inp, size_t n);
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void cpu_swiglu_forward(float *out, const float *inp, int N, int F);
void cpu_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F);
void cpu_add(float *out, const float *a, const float *b, size_t n);
void cpu_loss_mean(float *out, const float *losses, int N);
void cpu_softmax_xent(float *losses, float *dlogits, const float *logits,
		      const int32_t *targets, int N, int V, int Vp, float dloss);

/* bf16 storage (cpu_backend.c, which holds the tables):
 * out[n] = round to nearest even of in[n]; out[n] = in[n] widened */
void cpu_bf16_from_f32(void *out, const float *in, size_t n);
void cpu_bf16_to_f32(float *out, const void *in, size_t n);

/* optimizer pieces (cpu_optim.c) */
void cpu_ademamix_dir(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
		      float lr, float beta1, float beta2, float beta3, float alpha, float eps,
		      float bc1, float bc2);
void cpu_mars_correct(float *c, const float *g, float *gprev, size_t n, float coef);
void cpu_ema(float *x, const float *g, size_t n, float beta);
void cpu_soap_adam(float *out, const float *mr, const float *gr, float *v, size_t n,
		   float beta2, float eps);
void cpu_row_normalize(float *o, float *v, int rows, int cols, float beta2, float eps);
void cpu_gemm_op(float *c, const float *a, const float *b, int M, int N, int K, int ta, int tb,
		 float alpha, float beta);
void cpu_adan_dir(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
		  size_t n, float lr, float beta1, float beta2, float beta3, float eps, float bc1,
		  float bc2, float bc3, int first);
void cpu_adamw_dir(float *u, const float *g, float *m, float *v, size_t n, float lr,
		   float beta1, float beta2, float eps, float bc1, float bc2);
void cpu_lion_dir(float *u, const float *g, float *m, size_t n, float lr, float beta1,
		  float beta2);
void cpu_momentum(float *out, const float *g, float *m, size_t n, float mu, int nesterov);
void cpu_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
		       float *scratch);
void cpu_apply_update(float *w, const float *u, float *u_prev, size_t n, float decay,
		      float lambda);
double cpu_sumsq(const float *x, size_t n);
void cpu_elementwise_step(int rule, const struct optim_elem_tensor *t, int count, float lr,
			  float beta1, float beta2, float eps, float bc1, float bc2, float lambda);
void cpu_sumsq_many(double *out, const float *const *x, const size_t *n, int count);
void cpu_scale(float *x, float s, size_t n);

/* mixture-of-experts routing and dispatch (cpu_moe.c): backend.h's moe_*
 * ops, one set per activation dtype (cpu_f32_*, cpu_bf16_*) */
#define CPU_MOE_DECL(P)                                                                    \
	void P##_moe_route(float *score, int32_t *sel, float *gate, const void *z, int N,   \
			   int E, int K, int router);                                       \
	void P##_moe_gather(void *xd, const void *x, const int32_t *pos, int N, int K,      \
			    int C);                                                         \
	void P##_moe_combine(void *out, const void *y, const float *gate, const int32_t *pos, \
			     int N, int K, int C);                                          \
	void P##_moe_combine_backward(void *dy, float *dgate, const void *dout,             \
				      const void *y, const float *gate, const int32_t *pos, \
				      int N, int K, int C);                                 \
	void P##_moe_aux(float *aux, const void *z, const float *score, const int32_t *count, \
			 int N, int E, int K, int router);                                  \
	void P##_moe_router_backward(void *dz, const void *z, const float *score,           \
				     const int32_t *sel, const float *gate,                 \
				     const float *dgate, const int32_t *count, int N, int E, \
				     int K, int router, float dloss, float alpha, float beta);
CPU_MOE_DECL(cpu_f32)
CPU_MOE_DECL(cpu_bf16)
void cpu_moe_dispatch(int32_t *count, int32_t *pos, const int32_t *sel, int N, int K, int E);

#endif
