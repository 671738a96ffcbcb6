/* cpu_backend.c - the CPU backend's tables (backend_cpu, backend_cpu_bf16)
 * and their activation operations in both storage types of kernels/act.h,
 * around the float kernels of the other files of this folder.
 *
 * f32: the kernels themselves (the activation pointers are float arrays).
 * bf16: each op widens its bf16 inputs into float scratch (exact), runs the
 * float kernel, and rounds each output element into bf16 storage once
 * (round to nearest even). So a bf16 op's result is exactly the float op on
 * the rounded inputs, rounded: what tests check, and why any thread count
 * gives the same bits (the float kernels' property). Float operands
 * (weights, parameter gradients, statistics, losses) are passed through
 * untouched; parameter gradients accumulate in float as in f32 mode.
 * Speed is not the point of the bf16 mode: it runs the bf16 plumbing of the
 * model and the pipeline on every machine, and lets CPU-bf16 and CUDA-bf16
 * be compared closely.
 *
 * Legend: see kernels/backend.h.
 */
#include <stdlib.h>

#include "../../io/util.h"
#include "../backend.h"
#include "cpu.h"

/* ---- conversions ---- */

void cpu_bf16_from_f32(void *out, const float *in, size_t n)
{
	uint16_t *o = out;
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		o[i] = f32_to_bf16(in[i]);
}

void cpu_bf16_to_f32(float *out, const void *in, size_t n)
{
	const uint16_t *p = in;
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		out[i] = bf16_to_f32(p[i]);
}

static void f32_copy_from(void *out, const float *in, size_t n)
{
	if (out != (const void *)in)
		cpu_memcpy(out, in, n * sizeof(float));
}

static void f32_copy_to(float *out, const void *in, size_t n)
{
	if ((const void *)out != in)
		cpu_memcpy(out, in, n * sizeof(float));
}

/* float scratch holding bf16 p[n] widened; NULL for NULL */
static float *widen(const void *p, size_t n)
{
	float *f;
	if (!p)
		return NULL;
	f = xmalloc(st_mult(n ? n : 1, sizeof(float)));
	cpu_bf16_to_f32(f, p, n);
	return f;
}

/* uninitialised float scratch of n (NULL when p is NULL) */
static float *scratch(const void *p, size_t n)
{
	return p ? xmalloc(st_mult(n ? n : 1, sizeof(float))) : NULL;
}

/* round f[n] into bf16 p and free f */
static void narrow(void *p, float *f, size_t n)
{
	if (p)
		cpu_bf16_from_f32(p, f, n);
	free(f);
}

/* ---- f32: the kernels, with the interface's types ---- */

static void f32_embed_forward(void *out, const int32_t *tokens, const float *wte,
			      const float *wpe, int B, int T, int C)
{
	cpu_embed_forward(out, tokens, wte, wpe, B, T, C);
}

static void f32_embed_backward(float *dwte, float *dwpe, const void *dout,
			       const int32_t *tokens, int B, int T, int C)
{
	cpu_embed_backward(dwte, dwpe, dout, tokens, B, T, C);
}

static void f32_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
				  const float *w, const float *b, int N, int C, float eps)
{
	cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
}

static void f32_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
				   const void *inp, const float *w, const float *mean,
				   const float *rstd, int N, int C)
{
	cpu_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

static void f32_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w,
				int N, int C, float eps)
{
	cpu_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}

static void f32_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
				 const float *w, const float *rstd, int N, int C)
{
	cpu_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
}

static void f32_matmul_forward(void *out, const void *inp, const float *w, const float *bias,
			       int N, int C, int OC)
{
	cpu_matmul_forward(out, inp, w, bias, N, C, OC);
}

static void f32_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
				const void *inp, const float *w, int N, int C, int OC)
{
	cpu_matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

static void f32_rope_forward(void *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cpu_rope_forward(qkv, B, T, NH, NKV, HD, theta);
}

static void f32_rope_backward(void *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cpu_rope_backward(dqkv, B, T, NH, NKV, HD, theta);
}

static void f32_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int NH,
				  int NKV, int HD)
{
	cpu_attention_forward(out, lse, qkv, B, T, NH, NKV, HD);
}

static void f32_attention_backward(void *dqkv, const void *dout, const void *qkv,
				   const void *out, const float *lse, int B, int T, int NH,
				   int NKV, int HD)
{
	cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD);
}

static void f32_gelu_forward(void *out, const void *inp, size_t n)
{
	cpu_gelu_forward(out, inp, n);
}

static void f32_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
	cpu_gelu_backward(dinp, inp, dout, n);
}

static void f32_swiglu_forward(void *out, const void *inp, int N, int F)
{
	cpu_swiglu_forward(out, inp, N, F);
}

static void f32_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F)
{
	cpu_swiglu_backward(dinp, dout, inp, N, F);
}

static void f32_add_act(void *out, const void *a, const void *b, size_t n)
{
	cpu_add(out, a, b, n);
}

static void f32_softmax_xent(float *losses, void *dlogits, const void *logits,
			     const int32_t *targets, int N, int V, int Vp, float dloss)
{
	cpu_softmax_xent(losses, dlogits, logits, targets, N, V, Vp, dloss);
}

/* ---- bf16: widen, the float kernel, round ---- */

static void bf16_embed_forward(void *out, const int32_t *tokens, const float *wte,
			       const float *wpe, int B, int T, int C)
{
	size_t n = (size_t)B * T * C;
	float *o = scratch(out, n);
	cpu_embed_forward(o, tokens, wte, wpe, B, T, C);
	narrow(out, o, n);
}

static void bf16_embed_backward(float *dwte, float *dwpe, const void *dout,
				const int32_t *tokens, int B, int T, int C)
{
	float *d = widen(dout, (size_t)B * T * C);
	cpu_embed_backward(dwte, dwpe, d, tokens, B, T, C);
	free(d);
}

static void bf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
				   const float *w, const float *b, int N, int C, float eps)
{
	size_t n = (size_t)N * C;
	float *x = widen(inp, n), *o = scratch(out, n);
	cpu_layernorm_forward(o, mean, rstd, x, w, b, N, C, eps);
	narrow(out, o, n);
	free(x);
}

static void bf16_layernorm_backward(void *dinp, float *dw, float *db, const void *dout,
				    const void *inp, const float *w, const float *mean,
				    const float *rstd, int N, int C)
{
	size_t n = (size_t)N * C;
	float *d = widen(dout, n), *x = widen(inp, n), *di = scratch(dinp, n);
	cpu_layernorm_backward(di, dw, db, d, x, w, mean, rstd, N, C);
	narrow(dinp, di, n);
	free(d);
	free(x);
}

static void bf16_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, int N,
				 int C, float eps)
{
	size_t n = (size_t)N * C;
	float *x = widen(inp, n), *o = scratch(out, n);
	cpu_rmsnorm_forward(o, rstd, x, w, N, C, eps);
	narrow(out, o, n);
	free(x);
}

static void bf16_rmsnorm_backward(void *dinp, float *dw, const void *dout, const void *inp,
				  const float *w, const float *rstd, int N, int C)
{
	size_t n = (size_t)N * C;
	float *d = widen(dout, n), *x = widen(inp, n), *di = scratch(dinp, n);
	cpu_rmsnorm_backward(di, dw, d, x, w, rstd, N, C);
	narrow(dinp, di, n);
	free(d);
	free(x);
}

static void bf16_matmul_forward(void *out, const void *inp, const float *w, const float *bias,
				int N, int C, int OC)
{
	float *x = widen(inp, (size_t)N * C), *o = scratch(out, (size_t)N * OC);
	cpu_matmul_forward(o, x, w, bias, N, C, OC);
	narrow(out, o, (size_t)N * OC);
	free(x);
}

static void bf16_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
				 const void *inp, const float *w, int N, int C, int OC)
{
	float *d = widen(dout, (size_t)N * OC), *x = widen(inp, (size_t)N * C);
	float *di = scratch(dinp, (size_t)N * C);
	cpu_matmul_backward(di, dw, dbias, d, x, w, N, C, OC);
	narrow(dinp, di, (size_t)N * C);
	free(d);
	free(x);
}

static void bf16_rope(void *qkv, int B, int T, int NH, int NKV, int HD, float theta, int fwd)
{
	size_t n = (size_t)B * T * (NH + 2 * NKV) * HD;
	float *x = widen(qkv, n);
	if (fwd)
		cpu_rope_forward(x, B, T, NH, NKV, HD, theta);
	else
		cpu_rope_backward(x, B, T, NH, NKV, HD, theta);
	narrow(qkv, x, n);
}

static void bf16_rope_forward(void *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	bf16_rope(qkv, B, T, NH, NKV, HD, theta, 1);
}

static void bf16_rope_backward(void *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	bf16_rope(dqkv, B, T, NH, NKV, HD, theta, 0);
}

static void bf16_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int NH,
				   int NKV, int HD)
{
	size_t N = (size_t)B * T;
	float *x = widen(qkv, N * (NH + 2 * NKV) * HD), *o = scratch(out, N * NH * HD);
	cpu_attention_forward(o, lse, x, B, T, NH, NKV, HD);
	narrow(out, o, N * NH * HD);
	free(x);
}

static void bf16_attention_backward(void *dqkv, const void *dout, const void *qkv,
				    const void *out, const float *lse, int B, int T, int NH,
				    int NKV, int HD)
{
	size_t N = (size_t)B * T, nq = N * (NH + 2 * NKV) * HD, no = N * NH * HD;
	float *d = widen(dout, no), *x = widen(qkv, nq), *o = widen(out, no);
	float *dx = scratch(dqkv, nq);
	cpu_attention_backward(dx, d, x, o, lse, B, T, NH, NKV, HD);
	narrow(dqkv, dx, nq);
	free(d);
	free(x);
	free(o);
}

static void bf16_gelu_forward(void *out, const void *inp, size_t n)
{
	float *x = widen(inp, n), *o = scratch(out, n);
	cpu_gelu_forward(o, x, n);
	narrow(out, o, n);
	free(x);
}

static void bf16_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
	float *x = widen(inp, n), *d = widen(dout, n), *di = scratch(dinp, n);
	cpu_gelu_backward(di, x, d, n);
	narrow(dinp, di, n);
	free(x);
	free(d);
}

static void bf16_swiglu_forward(void *out, const void *inp, int N, int F)
{
	float *x = widen(inp, (size_t)N * 2 * F), *o = scratch(out, (size_t)N * F);
	cpu_swiglu_forward(o, x, N, F);
	narrow(out, o, (size_t)N * F);
	free(x);
}

static void bf16_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F)
{
	float *d = widen(dout, (size_t)N * F), *x = widen(inp, (size_t)N * 2 * F);
	float *di = scratch(dinp, (size_t)N * 2 * F);
	cpu_swiglu_backward(di, d, x, N, F);
	narrow(dinp, di, (size_t)N * 2 * F);
	free(d);
	free(x);
}

/* elementwise: no scratch needed (out may alias a or b) */
static void bf16_add_act(void *out, const void *a, const void *b, size_t n)
{
	uint16_t *o = out;
	const uint16_t *x = a, *y = b;
#pragma omp parallel for simd num_threads(cpu_threads()) if (n >= CPU_PAR_MIN)
	for (size_t i = 0; i < n; i++)
		o[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

static void bf16_softmax_xent(float *losses, void *dlogits, const void *logits,
			      const int32_t *targets, int N, int V, int Vp, float dloss)
{
	size_t n = (size_t)N * Vp;
	float *l = widen(logits, n);
	/* the float kernel allows dlogits == logits: the gradient overwrites l */
	cpu_softmax_xent(losses, dlogits ? l : NULL, l, targets, N, V, Vp, dloss);
	if (dlogits)
		cpu_bf16_from_f32(dlogits, l, n);
	free(l);
}

/* ---- the experts' products (backend.h moe_expert_forward/backward): one
 * matmul per expert over its rows, the loop model/moe.c ran before the op,
 * so the bits are those of before. count is host memory. ---- */

#define EXPERT_OPS(P, DT)                                                                   \
	static void P##_moe_expert_forward(void *out, const void *inp, const float *w,      \
					   const int32_t *count, int E, int C, int OC)      \
	{                                                                                   \
		size_t A = act_dtype_size(DT);                                              \
		for (int e = 0; e < E; e++) {                                               \
			size_t r0 = (size_t)count[e];                                       \
			int rows = count[e + 1] - count[e];                                 \
			if (rows)                                                           \
				P##_matmul_forward(act_at(out, r0 * OC, A),                 \
						   act_at(inp, r0 * C, A),                  \
						   w + (size_t)e * OC * C, NULL, rows, C, OC); \
		}                                                                           \
	}                                                                                   \
	static void P##_moe_expert_backward(void *dinp, float *dw, const void *dout,        \
					    const void *inp, const float *w,                \
					    const int32_t *count, int E, int C, int OC)     \
	{                                                                                   \
		size_t A = act_dtype_size(DT), n = (size_t)OC * C;                          \
		for (int e = 0; e < E; e++) {                                               \
			size_t r0 = (size_t)count[e];                                       \
			int rows = count[e + 1] - count[e];                                 \
			if (rows)                                                           \
				P##_matmul_backward(dinp ? act_at(dinp, r0 * C, A) : NULL,  \
						    dw ? dw + (size_t)e * n : NULL, NULL,   \
						    act_at(dout, r0 * OC, A),               \
						    inp ? act_at(inp, r0 * C, A) : NULL,    \
						    w ? w + (size_t)e * n : NULL, rows, C,  \
						    OC);                                    \
		}                                                                           \
	}

EXPERT_OPS(f32, ACT_F32)
EXPERT_OPS(bf16, ACT_BF16)

/* ---- the tables ---- */

#define ACT_OPS(P)                                             \
	.embed_forward = P##_embed_forward,                    \
	.embed_backward = P##_embed_backward,                  \
	.layernorm_forward = P##_layernorm_forward,            \
	.layernorm_backward = P##_layernorm_backward,          \
	.rmsnorm_forward = P##_rmsnorm_forward,                \
	.rmsnorm_backward = P##_rmsnorm_backward,              \
	.matmul_forward = P##_matmul_forward,                  \
	.matmul_backward = P##_matmul_backward,                \
	.rope_forward = P##_rope_forward,                      \
	.rope_backward = P##_rope_backward,                    \
	.attention_forward = P##_attention_forward,            \
	.attention_backward = P##_attention_backward,          \
	.gelu_forward = P##_gelu_forward,                      \
	.gelu_backward = P##_gelu_backward,                    \
	.swiglu_forward = P##_swiglu_forward,                  \
	.swiglu_backward = P##_swiglu_backward,                \
	.add_act = P##_add_act,                                \
	.softmax_xent = P##_softmax_xent,                      \
	.moe_route = cpu_##P##_moe_route,                      \
	.moe_dispatch = cpu_moe_dispatch,                      \
	.moe_gather = cpu_##P##_moe_gather,                    \
	.moe_combine = cpu_##P##_moe_combine,                  \
	.moe_combine_backward = cpu_##P##_moe_combine_backward, \
	.moe_aux = cpu_##P##_moe_aux,                          \
	.moe_router_backward = cpu_##P##_moe_router_backward, \
	.moe_expert_forward = P##_moe_expert_forward,          \
	.moe_expert_backward = P##_moe_expert_backward

#define REST_OPS                                       \
	.alloc = cpu_alloc,                            \
	.free = cpu_free,                              \
	.to_device = cpu_memcpy,                       \
	.to_host = cpu_memcpy,                         \
	.copy = cpu_memcpy,                            \
	.zero = cpu_zero,                              \
	.synchronize = cpu_synchronize,                \
	.set_threads = cpu_set_threads,                \
	.add = cpu_add,                                \
	.loss_mean = cpu_loss_mean,                    \
	.adamw_dir = cpu_adamw_dir,                    \
	.adan_dir = cpu_adan_dir,                      \
	.ademamix_dir = cpu_ademamix_dir,              \
	.mars_correct = cpu_mars_correct,              \
	.ema = cpu_ema,                                \
	.soap_adam = cpu_soap_adam,                    \
	.row_normalize = cpu_row_normalize,            \
	.gemm = cpu_gemm_op,                           \
	.lion_dir = cpu_lion_dir,                      \
	.momentum = cpu_momentum,                      \
	.newton_schulz = cpu_newton_schulz,            \
	.apply_update = cpu_apply_update,              \
	.elementwise_step = cpu_elementwise_step,      \
	.sumsq = cpu_sumsq,                            \
	.sumsq_many = cpu_sumsq_many,                  \
	.scale = cpu_scale

/* Both tables share every slot but the activation ops. */
const struct backend backend_cpu = {
	.name = "cpu",
	.act_dtype = ACT_F32,
	.act_from_f32 = f32_copy_from,
	.act_to_f32 = f32_copy_to,
	ACT_OPS(f32),
	REST_OPS,
};

const struct backend backend_cpu_bf16 = {
	.name = "cpu",
	.act_dtype = ACT_BF16,
	.act_from_f32 = cpu_bf16_from_f32,
	.act_to_f32 = cpu_bf16_to_f32,
	ACT_OPS(bf16),
	REST_OPS,
};
