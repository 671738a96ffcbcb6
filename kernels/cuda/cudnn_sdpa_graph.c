/* cudnn_sdpa_graph.c - the operation graphs of causal grouped-query
 * attention in cuDNN's backend API (cudnn_sdpa_graph.h): the composition
 * that cuDNN's fused flash-attention engines pattern-match, the one
 * cudnn-frontend's composite SDPA nodes lower to. Tensors are [batch, head,
 * row, column] with strides into our row-major buffers:
 *
 *   forward   S = Q K^T (fp32) * scale; causal: S where row >= col, else -inf
 *             M = rowmax S; E = exp(S - M); Z = rowsum E;
 *             stats = M + log Z (our lse); P = E / Z (bf16); O = P V
 *   backward  Dsum = rowsum(dO * O) (fp32, in our workspace)
 *             P = exp(mask(Q K^T * scale - stats))
 *             dV = P^T dO;  dS = (dO V^T - Dsum) * P * scale
 *             dK = dS^T Q;  dQ = dS K
 *
 * Grouped-query: K and V carry NKV heads; cuDNN broadcasts them over the
 * NH/NKV query heads of a group in the products, and the backward's dK and
 * dV are full-head products summed over the group by a reduction.
 *
 * Determinism: the backward writes dQ straight from its product (no fp32
 * dQ accumulator, which the engines fill with atomic adds; cudnn-frontend
 * builds this form when a deterministic algorithm is asked for on Hopper).
 */
#include "cudnn_sdpa.h"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define SDPA_HAVE_HEADERS 1
#endif
#endif

#ifdef SDPA_HAVE_HEADERS
#include "cudnn_sdpa_graph.h"

#include <stdbool.h>
#include <stdio.h>

void sdpa_gb_fail(struct gb *g, const char *what, cudnnStatus_t st)
{
	if (g->failed++)
		return;
	snprintf(g->why, sizeof(g->why), "%s: %s", what, g->api->cudnnGetErrorString(st));
}

cudnnBackendDescriptor_t sdpa_gb_new(struct gb *g, cudnnBackendDescriptorType_t type)
{
	cudnnBackendDescriptor_t d = NULL;
	if (g->failed)
		return NULL;
	if (g->ndesc == MAX_DESCS) {
		g->failed = 1;
		snprintf(g->why, sizeof(g->why), "graph too large");
		return NULL;
	}
	cudnnStatus_t st = g->api->cudnnBackendCreateDescriptor(type, &d);
	(*g->created)++;
	if (st != CUDNN_STATUS_SUCCESS) {
		sdpa_gb_fail(g, "cudnnBackendCreateDescriptor", st);
		return NULL;
	}
	g->desc[g->ndesc++] = d;
	return d;
}

void sdpa_gb_set(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
		   cudnnBackendAttributeType_t type, int64_t n, const void *v)
{
	if (g->failed)
		return;
	cudnnStatus_t st = g->api->cudnnBackendSetAttribute(d, name, type, n, v);
	if (st != CUDNN_STATUS_SUCCESS) {
		char what[64];
		snprintf(what, sizeof(what), "cudnnBackendSetAttribute(attribute %d)", (int)name);
		sdpa_gb_fail(g, what, st);
	}
}

/* attribute name of d: the one descriptor v */
static void gb_link(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
		    cudnnBackendDescriptor_t v)
{
	sdpa_gb_set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

void sdpa_gb_finalize(struct gb *g, cudnnBackendDescriptor_t d, const char *what)
{
	if (g->failed)
		return;
	cudnnStatus_t st = g->api->cudnnBackendFinalize(d);
	if (st != CUDNN_STATUS_SUCCESS)
		sdpa_gb_fail(g, what, st);
}

void sdpa_gb_destroy_all(struct gb *g)
{
	for (int i = 0; i < g->ndesc; i++)
		g->api->cudnnBackendDestroyDescriptor(g->desc[i]);
	g->ndesc = 0;
}

/* A 4-d tensor; uid 0 makes it virtual (a fresh uid). */
static cudnnBackendDescriptor_t gb_tensor(struct gb *g, int64_t uid, cudnnDataType_t dt,
					  const int64_t dims[4], const int64_t strides[4],
					  int by_value)
{
	cudnnBackendDescriptor_t t = sdpa_gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
	bool virt = uid == 0, byval = by_value != 0;
	int64_t align = 16;
	if (virt)
		uid = g->next_uid++;
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
	sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
	if (byval)
		sdpa_gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
	sdpa_gb_finalize(g, t, "tensor");
	return t;
}

/* a virtual tensor of dims d, contiguous */
static cudnnBackendDescriptor_t gb_virt(struct gb *g, cudnnDataType_t dt, int64_t d0, int64_t d1,
					int64_t d2, int64_t d3)
{
	int64_t dims[4] = {d0, d1, d2, d3};
	int64_t st[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
	return gb_tensor(g, 0, dt, dims, st, 0);
}

/* a pass-by-value fp32 scalar */
static cudnnBackendDescriptor_t gb_scalar(struct gb *g, int64_t uid)
{
	int64_t one[4] = {1, 1, 1, 1};
	return gb_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, 1);
}

static void gb_op(struct gb *g, cudnnBackendDescriptor_t op, const char *what)
{
	sdpa_gb_finalize(g, op, what);
	if (g->failed)
		return;
	if (g->nops == MAX_OPS) {
		g->failed = 1;
		snprintf(g->why, sizeof(g->why), "graph too large");
		return;
	}
	g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX */
static void gb_pw(struct gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
		  cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
		  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis)
{
	cudnnBackendDescriptor_t pw = sdpa_gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
	sdpa_gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
	sdpa_gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	if (axis >= 0)
		sdpa_gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
	sdpa_gb_finalize(g, pw, "pointwise descriptor");
	cudnnBackendDescriptor_t op = sdpa_gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
	gb_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
	gb_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
	if (b)
		gb_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
	if (t)
		gb_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
	gb_link(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
	gb_op(g, op, "pointwise operation");
}

/* y = reduce(x) over the dimensions where y's extent is 1 */
static void gb_reduce(struct gb *g, cudnnReduceTensorOp_t rop, cudnnBackendDescriptor_t x,
		      cudnnBackendDescriptor_t y)
{
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t r = sdpa_gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
	sdpa_gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1,
		    &rop);
	sdpa_gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	sdpa_gb_finalize(g, r, "reduction descriptor");
	cudnnBackendDescriptor_t op = sdpa_gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
	gb_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
	gb_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
	gb_link(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
	gb_op(g, op, "reduction operation");
}

/* c = a b, batched over the first two dimensions (fp32 accumulation) */
static void gb_matmul(struct gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
		      cudnnBackendDescriptor_t c)
{
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t m = sdpa_gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
	sdpa_gb_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	sdpa_gb_finalize(g, m, "matmul descriptor");
	cudnnBackendDescriptor_t op = sdpa_gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
	gb_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
	gb_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
	gb_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
	gb_link(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
	gb_op(g, op, "matmul operation");
}

/* y = x seen through other dims/strides (a transpose, no data moved) */
static void gb_reshape(struct gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
	cudnnBackendDescriptor_t op = sdpa_gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
	gb_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
	gb_link(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
	gb_op(g, op, "reshape operation");
}

/* s (fp32 [B,NH,T,T]) -> s where row >= col, else -inf: the causal mask as
 * GEN_INDEX on axes 2 and 3, CMP_GE, BINARY_SELECT (true keeps x) */
static cudnnBackendDescriptor_t gb_causal(struct gb *g, const struct sdpa_key *k,
					  cudnnBackendDescriptor_t s,
					  cudnnBackendDescriptor_t neg_inf)
{
	int64_t B = k->B, H = k->NH, T = k->T;
	cudnnBackendDescriptor_t row = gb_virt(g, CUDNN_DATA_INT32, B, H, T, T);
	cudnnBackendDescriptor_t col = gb_virt(g, CUDNN_DATA_INT32, B, H, T, T);
	cudnnBackendDescriptor_t keep = gb_virt(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
	cudnnBackendDescriptor_t y = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
	gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
	gb_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
	gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, y, -1);
	return y;
}

/* The real tensors, in the backend's layouts (see the header). */
struct io {
	cudnnBackendDescriptor_t q, kt, v, o, stats, scale, neg_inf;
};

static void gb_io(struct gb *g, const struct sdpa_key *k, struct io *t)
{
	int64_t B = k->B, T = k->T, H = k->NH, HK = k->NKV, D = k->HD;
	int64_t ld = (H + 2 * HK) * D; /* a qkv row */
	int64_t qd[4] = {B, H, T, D}, qs[4] = {T * ld, D, ld, 1};
	int64_t ktd[4] = {B, HK, D, T}, kts[4] = {T * ld, D, 1, ld}; /* K^T: a transposed view */
	int64_t vd[4] = {B, HK, T, D}, vs[4] = {T * ld, D, ld, 1};
	int64_t od[4] = {B, H, T, D}, os[4] = {T * H * D, D, H * D, 1};
	int64_t sd[4] = {B, H, T, 1}, ss[4] = {H * T, T, 1, 1};
	t->q = gb_tensor(g, SDPA_UID_Q, CUDNN_DATA_BFLOAT16, qd, qs, 0);
	t->kt = gb_tensor(g, SDPA_UID_K, CUDNN_DATA_BFLOAT16, ktd, kts, 0);
	t->v = gb_tensor(g, SDPA_UID_V, CUDNN_DATA_BFLOAT16, vd, vs, 0);
	t->o = gb_tensor(g, SDPA_UID_O, CUDNN_DATA_BFLOAT16, od, os, 0);
	t->stats = gb_tensor(g, SDPA_UID_STATS, CUDNN_DATA_FLOAT, sd, ss, 0);
	t->scale = gb_scalar(g, SDPA_UID_SCALE);
	t->neg_inf = gb_scalar(g, SDPA_UID_NEG_INF);
}

void sdpa_build_forward(struct gb *g, const struct sdpa_key *k)
{
	int64_t B = k->B, T = k->T, H = k->NH;
	struct io t;
	gb_io(g, k, &t);
	cudnnBackendDescriptor_t s = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_matmul(g, t.q, t.kt, s);
	cudnnBackendDescriptor_t ss = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, t.scale, NULL, ss, -1);
	cudnnBackendDescriptor_t sm = gb_causal(g, k, ss, t.neg_inf);
	/* softmax, keeping stats = max + log(sum) */
	cudnnBackendDescriptor_t m = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
	gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sm, m);
	cudnnBackendDescriptor_t sub = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sm, m, NULL, sub, -1);
	cudnnBackendDescriptor_t e = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, e, -1);
	cudnnBackendDescriptor_t z = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
	gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
	cudnnBackendDescriptor_t lz = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
	gb_pw(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, NULL, NULL, lz, -1);
	gb_pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, m, lz, NULL, t.stats, -1);
	/* P in the inputs' type, as the second product's A operand */
	cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_BFLOAT16, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, NULL, p, -1);
	gb_matmul(g, p, t.v, t.o);
}

/* dx = a b, or for grouped-query heads (NH > NKV) a full-head product
 * summed over each group into dx */
static void gb_matmul_grouped(struct gb *g, const struct sdpa_key *k, cudnnBackendDescriptor_t a,
			      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t dx)
{
	if (k->NH == k->NKV) {
		gb_matmul(g, a, b, dx);
		return;
	}
	cudnnBackendDescriptor_t full =
		gb_virt(g, CUDNN_DATA_BFLOAT16, k->B, k->NH, k->T, k->HD);
	gb_matmul(g, a, b, full);
	gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, dx);
}

void sdpa_build_backward(struct gb *g, const struct sdpa_key *k)
{
	int64_t B = k->B, T = k->T, H = k->NH, HK = k->NKV, D = k->HD;
	int64_t ld = (H + 2 * HK) * D;
	struct io t;
	gb_io(g, k, &t);
	/* V^T and dO; the gradients at the offsets of q, k, v in dqkv */
	int64_t vtd[4] = {B, HK, D, T}, vts[4] = {T * ld, D, 1, ld};
	int64_t od[4] = {B, H, T, D}, os[4] = {T * H * D, D, H * D, 1};
	int64_t qd[4] = {B, H, T, D}, qs[4] = {T * ld, D, ld, 1};
	int64_t kd[4] = {B, HK, T, D}, ks[4] = {T * ld, D, ld, 1};
	int64_t sd[4] = {B, H, T, 1}, ss[4] = {H * T, T, 1, 1};
	cudnnBackendDescriptor_t vt = gb_tensor(g, SDPA_UID_V, CUDNN_DATA_BFLOAT16, vtd, vts, 0);
	cudnnBackendDescriptor_t dout = gb_tensor(g, SDPA_UID_DO, CUDNN_DATA_BFLOAT16, od, os, 0);
	cudnnBackendDescriptor_t dq = gb_tensor(g, SDPA_UID_DQ, CUDNN_DATA_BFLOAT16, qd, qs, 0);
	cudnnBackendDescriptor_t dk = gb_tensor(g, SDPA_UID_DK, CUDNN_DATA_BFLOAT16, kd, ks, 0);
	cudnnBackendDescriptor_t dv = gb_tensor(g, SDPA_UID_DV, CUDNN_DATA_BFLOAT16, kd, ks, 0);
	cudnnBackendDescriptor_t one = gb_scalar(g, SDPA_UID_ONE);
	cudnnBackendDescriptor_t rowsum = gb_tensor(g, SDPA_UID_SOFTMAX_SUM, CUDNN_DATA_FLOAT, sd,
						    ss, 0);

	/* Dsum = rowsum(dO * O) (times 1: the dropout scale's place) */
	int64_t pd[4] = {B, H, T, D}, ps[4] = {H * T * D, T * D, H * D, 1};
	cudnnBackendDescriptor_t prod = gb_tensor(g, 0, CUDNN_DATA_FLOAT, pd, ps, 0);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, t.o, NULL, prod, -1);
	cudnnBackendDescriptor_t sum = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, 1);
	gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, prod, sum);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, sum, one, NULL, rowsum, -1);

	/* P = exp(mask(Q K^T * scale - stats)) */
	cudnnBackendDescriptor_t s = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_matmul(g, t.q, t.kt, s);
	cudnnBackendDescriptor_t s2 = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, t.scale, NULL, s2, -1);
	cudnnBackendDescriptor_t s3 = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s2, t.stats, NULL, s3, -1);
	cudnnBackendDescriptor_t s4 = gb_causal(g, k, s3, t.neg_inf);
	cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, s4, NULL, NULL, p, -1);

	/* dV = P^T dO: P seen transposed, in the inputs' type */
	int64_t trd[4] = {B, H, T, T}, trs[4] = {H * T * T, T * T, 1, T};
	cudnnBackendDescriptor_t pt = gb_tensor(g, 0, CUDNN_DATA_BFLOAT16, trd, trs, 0);
	gb_reshape(g, p, pt);
	gb_matmul_grouped(g, k, pt, dout, dv);

	/* dS = (dO V^T - Dsum) * P * scale */
	cudnnBackendDescriptor_t dp = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_matmul(g, dout, vt, dp);
	cudnnBackendDescriptor_t d1 = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, rowsum, NULL, d1, -1);
	cudnnBackendDescriptor_t d2 = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d1, p, NULL, d2, -1);
	cudnnBackendDescriptor_t ds = gb_virt(g, CUDNN_DATA_FLOAT, B, H, T, T);
	gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d2, t.scale, NULL, ds, -1);

	/* dK = dS^T Q */
	cudnnBackendDescriptor_t dst = gb_tensor(g, 0, CUDNN_DATA_BFLOAT16, trd, trs, 0);
	gb_reshape(g, ds, dst);
	gb_matmul_grouped(g, k, dst, t.q, dk);

	/* dQ = dS K, written directly: no fp32 accumulator, deterministic */
	cudnnBackendDescriptor_t kk = gb_tensor(g, 0, CUDNN_DATA_BFLOAT16, kd, ks, 0);
	gb_reshape(g, t.kt, kk);
	gb_matmul(g, ds, kk, dq);
}

#else
typedef int cudnn_sdpa_graph_unused; /* built without cuDNN's headers */
#endif
