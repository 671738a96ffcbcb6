/* cudnn_sdpa.h - causal attention (grouped-query, bf16) as a cuDNN graph,
 * through cuDNN's C backend API, with cuDNN loaded at run time.
 *
 * Plain C on the host side: it builds the operation graph of the SDPA
 * pattern that cuDNN's fused flash-attention engines accept (matmul,
 * scale, causal mask, softmax keeping its statistics, matmul; the
 * backward's ten products and pointwise steps), asks the heuristics for
 * engines, keeps the first deterministic one that finalizes, and runs the
 * plan. No CUDA call is made here: the caller (cuda_cudnn_attention.cu)
 * owns devices, streams and workspace memory, so the graph can be built
 * against a fake libcudnn on a machine without a GPU
 * (tests/unit/test_cudnn_graph.c).
 *
 * Layouts (the backend's): qkv[B*T, (NH + 2*NKV)*HD] bf16, q heads, then k,
 * then v; out and dout [B*T, NH*HD] bf16; lse[B, NH, T] fp32, the natural
 * log-sum-exp of each query's scaled scores (cuDNN's "stats"); dqkv like
 * qkv, every element overwritten. Scale 1/sqrt(HD).
 *
 * Every failure (library or symbol missing, a descriptor refused, no
 * engine, no deterministic engine) makes sdpa_plan_get return NULL; the
 * first one of a context is reported once through its notice function, so
 * the caller runs its own kernels instead with one line said.
 */
#ifndef ASYNCPP_CUDNN_SDPA_H
#define ASYNCPP_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the tensors' unique ids in every graph (and variant pack) */
enum {
	SDPA_UID_Q = 1, SDPA_UID_K, SDPA_UID_V, SDPA_UID_O, SDPA_UID_STATS, SDPA_UID_DO,
	SDPA_UID_DQ, SDPA_UID_DK, SDPA_UID_DV, SDPA_UID_SCALE, SDPA_UID_NEG_INF, SDPA_UID_ONE,
	SDPA_UID_SOFTMAX_SUM, /* backward: rowsum(dout * out), fp32, in our workspace */
	SDPA_UID_VIRTUAL = 100 /* virtual tensors count up from here */
};

/* What a plan is for: the cache key (compared with memcmp; zero padding). */
struct sdpa_key {
	int B, T, NH, NKV, HD;
	int bf16;     /* 1: bf16 in and out (the only type built) */
	int causal;   /* 1 (the only mask built) */
	int backward; /* 0 forward, 1 backward */
	int device;   /* plans belong to a handle, handles to a device */
};

struct sdpa_plan;
struct sdpa_ctx;

/* A context loading cuDNN from libpath (NULL: libcudnn.so.9, libcudnn.so,
 * /usr/local/cuda/lib64/libcudnn.so.9) at first use. Never fails. */
struct sdpa_ctx *sdpa_ctx_new(const char *libpath);
void sdpa_ctx_free(struct sdpa_ctx *c);
/* Where notices go (default: warning(), one line on stderr); arg is passed
 * back. */
void sdpa_ctx_set_notice(struct sdpa_ctx *c, void (*fn)(void *arg, const char *msg), void *arg);
/* How many notices the context has given (0 or 1) and the last reason a
 * plan was refused ("" if none). */
int sdpa_ctx_notices(const struct sdpa_ctx *c);
const char *sdpa_ctx_why(const struct sdpa_ctx *c);

/* The cuDNN handle of device `device` (created on first use, with that
 * device current), or NULL when cuDNN cannot be loaded (noticed). */
void *sdpa_ctx_handle(struct sdpa_ctx *c, int device);
/* Point the handle's work at a CUDA stream (cudaStream_t); 0 or -1. */
int sdpa_ctx_set_stream(struct sdpa_ctx *c, void *handle, void *stream);

/* The plan for k (built and cached on first use; a refusal is cached too),
 * or NULL: cuDNN missing, the shape refused or no deterministic engine. */
const struct sdpa_plan *sdpa_plan_get(struct sdpa_ctx *c, void *handle, const struct sdpa_key *k);
/* Bytes of device workspace the plan needs (cuDNN's plus the backward's
 * fp32 row sums), 256-byte aligned parts. */
size_t sdpa_plan_workspace(const struct sdpa_plan *p);
/* How many descriptors the context created so far (the cache test). */
long sdpa_ctx_descriptors(const struct sdpa_ctx *c);

/* Build k's operation graph and finalize it, without a handle, heuristics
 * or plan: what cuDNN's own descriptor checks say of the graph, which runs
 * on a machine without a GPU (test_cudnn_graph against the real library).
 * 0, or -1 with the reason in sdpa_ctx_why (no notice). */
int sdpa_graph_check(struct sdpa_ctx *c, const struct sdpa_key *k);

/* Device pointers of one call; forward reads qkv, writes out and lse;
 * backward reads qkv, out, dout, lse and writes dqkv. */
struct sdpa_ptrs {
	const void *qkv, *out_in, *dout;
	void *out, *dqkv;
	float *lse;
	const float *lse_in;
};
/* Enqueue the plan on the handle's stream with workspace (>=
 * sdpa_plan_workspace bytes, 256-byte aligned): 0, or -1 with the reason in
 * sdpa_ctx_why (the outputs are then undefined; nothing else is touched). */
int sdpa_plan_run(struct sdpa_ctx *c, void *handle, const struct sdpa_plan *p,
		  const struct sdpa_ptrs *x, void *workspace);

#ifdef __cplusplus
}
#endif

#endif
