/* cudnn_sdpa.c - causal grouped-query attention as cuDNN backend-API graphs
 * (see cudnn_sdpa.h). cuDNN is opened with dlopen at first use; its
 * headers give the types and enum values only.
 *
 * The graphs are the composition that cuDNN's fused flash-attention
 * engines pattern-match (the same one cudnn-frontend's SDPA nodes lower
 * to), tensors as [batch, head, row, column] with strides into our
 * row-major buffers:
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
 * builds this form when a deterministic algorithm is asked for on Hopper),
 * and any engine carrying CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC is refused.
 */
#include "cudnn_sdpa.h"

#include "../../io/util.h"

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define SDPA_HAVE_HEADERS 1
#endif
#endif

#ifdef SDPA_HAVE_HEADERS
#include <cudnn_graph.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the entry points used, resolved with dlsym */
#define SDPA_FUNCS(X)                                                                    \
	X(cudnnGetVersion, size_t, (void))                                               \
	X(cudnnGetErrorString, const char *, (cudnnStatus_t))                            \
	X(cudnnCreate, cudnnStatus_t, (cudnnHandle_t *))                                 \
	X(cudnnDestroy, cudnnStatus_t, (cudnnHandle_t))                                  \
	X(cudnnSetStream, cudnnStatus_t, (cudnnHandle_t, cudaStream_t))                  \
	X(cudnnBackendCreateDescriptor, cudnnStatus_t,                                   \
	  (cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *))                    \
	X(cudnnBackendDestroyDescriptor, cudnnStatus_t, (cudnnBackendDescriptor_t))      \
	X(cudnnBackendFinalize, cudnnStatus_t, (cudnnBackendDescriptor_t))               \
	X(cudnnBackendSetAttribute, cudnnStatus_t,                                       \
	  (cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,                        \
	   cudnnBackendAttributeType_t, int64_t, const void *))                          \
	X(cudnnBackendGetAttribute, cudnnStatus_t,                                       \
	  (cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,                  \
	   cudnnBackendAttributeType_t, int64_t, int64_t *, void *))                     \
	X(cudnnBackendExecute, cudnnStatus_t,                                            \
	  (cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t))

struct sdpa_api {
#define X(name, ret, args) ret(*name) args;
	SDPA_FUNCS(X)
#undef X
};

#define MAX_DEVICES 64
#define PLAN_CACHE 64
#define MAX_DESCS 192 /* descriptors of one graph and its engine choice */
#define MAX_OPS 40
#define HEUR_CONFIGS 16
#define WS_ALIGN 256

struct sdpa_plan {
	struct sdpa_key key;
	cudnnBackendDescriptor_t plan; /* NULL: refused (cached as such) */
	/* the graph's descriptors, kept while the plan lives (the plan refers
	 * to its engine configuration, that to the graph) */
	cudnnBackendDescriptor_t *graph;
	int ngraph;
	size_t cudnn_ws;               /* cuDNN's workspace, bytes */
	size_t rowsum_bytes;           /* backward: B*NH*T floats after it */
	/* pass-by-value scalars: the variant pack points at these */
	float scale, neg_inf, one;
};

struct sdpa_ctx {
	pthread_mutex_t mu;
	char *libpath;
	void *lib;
	int state; /* 0 not loaded, 1 loaded, -1 failed */
	struct sdpa_api api;
	cudnnHandle_t handle[MAX_DEVICES];
	struct sdpa_plan plans[PLAN_CACHE];
	int nplans;
	long ndesc;
	int notices;
	char why[512];
	void (*notice)(void *arg, const char *msg);
	void *notice_arg;
};

/* the default notice: a warning line (io/util.h: kept off a progress line) */
static void notice_stderr(void *arg, const char *msg)
{
	(void)arg;
	warning("%s", msg);
}

struct sdpa_ctx *sdpa_ctx_new(const char *libpath)
{
	struct sdpa_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	pthread_mutex_init(&c->mu, NULL);
	c->libpath = libpath ? strdup(libpath) : NULL;
	c->notice = notice_stderr;
	return c;
}

void sdpa_ctx_set_notice(struct sdpa_ctx *c, void (*fn)(void *arg, const char *msg), void *arg)
{
	c->notice = fn ? fn : notice_stderr;
	c->notice_arg = arg;
}

int sdpa_ctx_notices(const struct sdpa_ctx *c)
{
	return c->notices;
}

const char *sdpa_ctx_why(const struct sdpa_ctx *c)
{
	return c->why;
}

long sdpa_ctx_descriptors(const struct sdpa_ctx *c)
{
	return c->ndesc;
}

/* Record why cuDNN is not used and say it once per context. */
static void refuse(struct sdpa_ctx *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
	if (!c->notices) {
		char msg[640];
		c->notices = 1;
		snprintf(msg, sizeof(msg),
			 "cuDNN attention not used (%s); running the flash kernels", c->why);
		c->notice(c->notice_arg, msg);
	}
}

static int load_locked(struct sdpa_ctx *c)
{
	static const char *names[] = {
		"libcudnn.so.9", "libcudnn.so", "/usr/local/cuda/lib64/libcudnn.so.9",
	};
	if (c->state)
		return c->state > 0 ? 0 : -1;
	c->state = -1;
	const char *err = "not found";
	if (c->libpath) {
		c->lib = dlopen(c->libpath, RTLD_NOW | RTLD_LOCAL);
		if (!c->lib)
			err = dlerror();
	}
	for (size_t i = 0; !c->libpath && i < sizeof(names) / sizeof(names[0]) && !c->lib; i++) {
		c->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!c->lib)
			err = dlerror();
	}
	if (!c->lib) {
		refuse(c, "cannot load %s: %s", c->libpath ? c->libpath : "libcudnn.so.9",
		       err ? err : "not found");
		return -1;
	}
	/* dlsym's void * to a function pointer goes through memcpy (ISO C) */
#define X(name, ret, args)                                                              \
	{                                                                               \
		void *f_ = dlsym(c->lib, #name);                                        \
		if (!f_) {                                                              \
			refuse(c, "libcudnn lacks %s", #name);                          \
			return -1;                                                      \
		}                                                                       \
		memcpy(&c->api.name, &f_, sizeof(f_));                                  \
	}
	SDPA_FUNCS(X)
#undef X
	size_t v = c->api.cudnnGetVersion();
	if (v < 90000) {
		refuse(c, "cuDNN %zu is older than 9.0", v);
		return -1;
	}
	c->state = 1;
	return 0;
}

void *sdpa_ctx_handle(struct sdpa_ctx *c, int device)
{
	void *h = NULL;
	pthread_mutex_lock(&c->mu);
	if (device < 0 || device >= MAX_DEVICES) {
		refuse(c, "device %d out of range", device);
	} else if (load_locked(c) == 0) {
		if (!c->handle[device]) {
			cudnnStatus_t st = c->api.cudnnCreate(&c->handle[device]);
			if (st != CUDNN_STATUS_SUCCESS) {
				c->handle[device] = NULL;
				refuse(c, "cudnnCreate: %s", c->api.cudnnGetErrorString(st));
			}
		}
		h = c->handle[device];
	}
	pthread_mutex_unlock(&c->mu);
	return h;
}

int sdpa_ctx_set_stream(struct sdpa_ctx *c, void *handle, void *stream)
{
	if (c->state <= 0)
		return -1;
	cudnnStatus_t st = c->api.cudnnSetStream((cudnnHandle_t)handle, (cudaStream_t)stream);
	if (st != CUDNN_STATUS_SUCCESS) {
		pthread_mutex_lock(&c->mu);
		refuse(c, "cudnnSetStream: %s", c->api.cudnnGetErrorString(st));
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* graph building: every call checks the status; the first failure is */
/* kept (its call named) and later calls do nothing                     */

struct gb {
	struct sdpa_ctx *c;
	cudnnBackendDescriptor_t desc[MAX_DESCS];
	int ndesc;
	cudnnBackendDescriptor_t ops[MAX_OPS];
	int nops;
	int64_t next_uid; /* virtual tensors */
	int failed;
	char why[256];
};

static void gb_fail(struct gb *g, const char *what, cudnnStatus_t st)
{
	if (g->failed++)
		return;
	snprintf(g->why, sizeof(g->why), "%s: %s", what, g->c->api.cudnnGetErrorString(st));
}

static cudnnBackendDescriptor_t gb_new(struct gb *g, cudnnBackendDescriptorType_t type)
{
	cudnnBackendDescriptor_t d = NULL;
	if (g->failed)
		return NULL;
	if (g->ndesc == MAX_DESCS) {
		g->failed = 1;
		snprintf(g->why, sizeof(g->why), "graph too large");
		return NULL;
	}
	cudnnStatus_t st = g->c->api.cudnnBackendCreateDescriptor(type, &d);
	g->c->ndesc++;
	if (st != CUDNN_STATUS_SUCCESS) {
		gb_fail(g, "cudnnBackendCreateDescriptor", st);
		return NULL;
	}
	g->desc[g->ndesc++] = d;
	return d;
}

static void gb_set(struct gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
		   cudnnBackendAttributeType_t type, int64_t n, const void *v)
{
	if (g->failed)
		return;
	cudnnStatus_t st = g->c->api.cudnnBackendSetAttribute(d, name, type, n, v);
	if (st != CUDNN_STATUS_SUCCESS) {
		char what[64];
		snprintf(what, sizeof(what), "cudnnBackendSetAttribute(attribute %d)", (int)name);
		gb_fail(g, what, st);
	}
}

static void gb_finalize(struct gb *g, cudnnBackendDescriptor_t d, const char *what)
{
	if (g->failed)
		return;
	cudnnStatus_t st = g->c->api.cudnnBackendFinalize(d);
	if (st != CUDNN_STATUS_SUCCESS)
		gb_fail(g, what, st);
}

static void gb_destroy_all(struct gb *g)
{
	for (int i = 0; i < g->ndesc; i++)
		g->c->api.cudnnBackendDestroyDescriptor(g->desc[i]);
	g->ndesc = 0;
}

/* A 4-d tensor; uid 0 makes it virtual (a fresh uid). */
static cudnnBackendDescriptor_t gb_tensor(struct gb *g, int64_t uid, cudnnDataType_t dt,
					  const int64_t dims[4], const int64_t strides[4],
					  int by_value)
{
	cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
	bool virt = uid == 0, byval = by_value != 0;
	int64_t align = 16;
	if (virt)
		uid = g->next_uid++;
	gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
	gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
	gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
	gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
	gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
	gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
	if (byval)
		gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
	gb_finalize(g, t, "tensor");
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
	gb_finalize(g, op, what);
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
	cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
	gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
	gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	if (axis >= 0)
		gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
	gb_finalize(g, pw, "pointwise descriptor");
	cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
	gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR,
	       1, &pw);
	gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
	if (b)
		gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
		       1, &b);
	if (t)
		gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
		       1, &t);
	gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
	gb_op(g, op, "pointwise operation");
}

/* y = reduce(x) over the dimensions where y's extent is 1 */
static void gb_reduce(struct gb *g, cudnnReduceTensorOp_t rop, cudnnBackendDescriptor_t x,
		      cudnnBackendDescriptor_t y)
{
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
	gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop);
	gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	gb_finalize(g, r, "reduction descriptor");
	cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
	gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
	gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
	gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
	gb_op(g, op, "reduction operation");
}

/* c = a b, batched over the first two dimensions (fp32 accumulation) */
static void gb_matmul(struct gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
		      cudnnBackendDescriptor_t c)
{
	cudnnDataType_t prec = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t m = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
	gb_set(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	gb_finalize(g, m, "matmul descriptor");
	cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
	gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
	gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
	gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
	gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
	gb_op(g, op, "matmul operation");
}

/* y = x seen through other dims/strides (a transpose, no data moved) */
static void gb_reshape(struct gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
	cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
	gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
	gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
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

static void build_forward(struct gb *g, const struct sdpa_key *k)
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

static void build_backward(struct gb *g, const struct sdpa_key *k)
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

/* 1 if the engine configuration's engine is deterministic */
static int engine_deterministic(struct gb *g, cudnnBackendDescriptor_t cfg)
{
	struct sdpa_api *a = &g->c->api;
	cudnnBackendDescriptor_t eng = gb_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
	if (!eng)
		return 0;
	int64_t n = 0;
	cudnnStatus_t st = a->cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
						       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng);
	if (st != CUDNN_STATUS_SUCCESS || n != 1)
		return 0;
	cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
	n = 0;
	st = a->cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
					 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
					 &n, notes);
	if (st != CUDNN_STATUS_SUCCESS)
		return 0;
	for (int64_t i = 0; i < n && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
		if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
			return 0;
	return 1;
}

/* The engines heuristics `mode` offers for graph, in their order: the first
 * deterministic one whose execution plan finalizes becomes p's plan.
 * *offered and *ndet count the configurations offered and the
 * deterministic ones; g->why says why the last one tried failed. */
static void choose_engine(struct gb *g, cudnnHandle_t h, cudnnBackendDescriptor_t graph,
			  cudnnBackendHeurMode_t mode, struct sdpa_plan *p, int64_t *offered,
			  int *ndet)
{
	struct sdpa_api *a = &g->c->api;
	cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
	gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
	       &graph);
	gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
	gb_finalize(g, heur, "engine heuristics");
	cudnnBackendDescriptor_t cfg[HEUR_CONFIGS];
	int64_t ncfg = 0;
	for (int i = 0; i < HEUR_CONFIGS; i++)
		cfg[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
	if (g->failed)
		return;
	cudnnStatus_t st = a->cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
						       CUDNN_TYPE_BACKEND_DESCRIPTOR, HEUR_CONFIGS,
						       &ncfg, cfg);
	if (st != CUDNN_STATUS_SUCCESS) {
		gb_fail(g, "engine heuristics results", st);
		return;
	}
	*offered += ncfg;
	for (int64_t i = 0; !g->failed && i < ncfg && i < HEUR_CONFIGS && !p->plan; i++) {
		if (!engine_deterministic(g, cfg[i]))
			continue;
		(*ndet)++;
		cudnnBackendDescriptor_t plan = NULL;
		if (a->cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
						    &plan) != CUDNN_STATUS_SUCCESS)
			break;
		g->c->ndesc++;
		st = a->cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
						 CUDNN_TYPE_HANDLE, 1, &h);
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendSetAttribute(plan,
							 CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
							 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendFinalize(plan);
		int64_t ws = 0, n = 0;
		if (st == CUDNN_STATUS_SUCCESS)
			st = a->cudnnBackendGetAttribute(plan,
							 CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
							 CUDNN_TYPE_INT64, 1, &n, &ws);
		if (st != CUDNN_STATUS_SUCCESS || ws < 0) {
			snprintf(g->why, sizeof(g->why), "execution plan: %s",
				 a->cudnnGetErrorString(st));
			a->cudnnBackendDestroyDescriptor(plan);
			continue;
		}
		p->plan = plan;
		p->cudnn_ws = (size_t)ws;
	}
}

/* Build k's graph, choose its engine, make the plan; with c->mu held. */
static void plan_build(struct sdpa_ctx *c, cudnnHandle_t h, struct sdpa_plan *p)
{
	const struct sdpa_key *k = &p->key;
	struct gb g = {.c = c, .next_uid = SDPA_UID_VIRTUAL};
	if (k->backward)
		build_backward(&g, k);
	else
		build_forward(&g, k);

	cudnnBackendDescriptor_t graph = gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
	gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops,
	       g.ops);
	gb_finalize(&g, graph, "operation graph");

	/* the heuristics' first choice, then their fallback list */
	static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
	int64_t offered = 0;
	int ndet = 0;
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]) && !g.failed && !p->plan; m++)
		choose_engine(&g, h, graph, modes[m], p, &offered, &ndet);
	if (!g.failed && !p->plan && !offered)
		snprintf(g.why, sizeof(g.why), "the heuristics offer no engine");
	else if (!g.failed && !p->plan && !ndet)
		snprintf(g.why, sizeof(g.why), "no deterministic engine among %lld",
			 (long long)offered);
	if (p->plan) {
		p->graph = malloc((size_t)g.ndesc * sizeof(*p->graph));
		if (p->graph) {
			memcpy(p->graph, g.desc, (size_t)g.ndesc * sizeof(*p->graph));
			p->ngraph = g.ndesc;
			g.ndesc = 0;
		}
	}
	gb_destroy_all(&g);
	if (!p->plan) {
		refuse(c, "%s attention B=%d T=%d NH=%d NKV=%d HD=%d: %s",
		       k->backward ? "backward" : "forward", k->B, k->T, k->NH, k->NKV, k->HD,
		       g.why[0] ? g.why : "refused");
		return;
	}
	p->rowsum_bytes = k->backward ? (size_t)k->B * k->NH * k->T * sizeof(float) : 0;
	p->scale = 1.0f / sqrtf((float)k->HD);
	p->neg_inf = -INFINITY;
	p->one = 1.0f;
}

int sdpa_graph_check(struct sdpa_ctx *c, const struct sdpa_key *k)
{
	pthread_mutex_lock(&c->mu);
	if (load_locked(c) < 0) {
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	struct gb g = {.c = c, .next_uid = SDPA_UID_VIRTUAL};
	if (k->backward)
		build_backward(&g, k);
	else
		build_forward(&g, k);
	cudnnBackendDescriptor_t graph = gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
	gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops,
	       g.ops);
	gb_finalize(&g, graph, "operation graph");
	gb_destroy_all(&g);
	if (g.failed)
		snprintf(c->why, sizeof(c->why), "%s", g.why);
	pthread_mutex_unlock(&c->mu);
	return g.failed ? -1 : 0;
}

static void plan_destroy(struct sdpa_ctx *c, struct sdpa_plan *p)
{
	if (p->plan)
		c->api.cudnnBackendDestroyDescriptor(p->plan);
	for (int i = 0; i < p->ngraph; i++)
		c->api.cudnnBackendDestroyDescriptor(p->graph[i]);
	free(p->graph);
	memset(p, 0, sizeof(*p));
}

const struct sdpa_plan *sdpa_plan_get(struct sdpa_ctx *c, void *handle, const struct sdpa_key *k)
{
	struct sdpa_plan *p = NULL;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < c->nplans; i++)
		if (!memcmp(&c->plans[i].key, k, sizeof(*k))) {
			p = &c->plans[i];
			break;
		}
	if (!p) {
		if (!k->bf16 || !k->causal || k->B <= 0 || k->T <= 0 || k->NKV <= 0 ||
		    k->NH % k->NKV || (k->HD != 64 && k->HD != 128)) {
			/* never asked of cuDNN: the caller's kernels serve it, no notice */
			pthread_mutex_unlock(&c->mu);
			return NULL;
		}
		if (load_locked(c) < 0 || !handle) {
			pthread_mutex_unlock(&c->mu);
			return NULL;
		}
		if (c->nplans == PLAN_CACHE) { /* a model has a handful of shapes; start over */
			for (int i = 0; i < c->nplans; i++)
				plan_destroy(c, &c->plans[i]);
			c->nplans = 0;
		}
		p = &c->plans[c->nplans++];
		memset(p, 0, sizeof(*p));
		p->key = *k;
		plan_build(c, (cudnnHandle_t)handle, p);
	}
	pthread_mutex_unlock(&c->mu);
	return p->plan ? p : NULL;
}

static size_t ws_round(size_t n)
{
	return (n + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
}

size_t sdpa_plan_workspace(const struct sdpa_plan *p)
{
	return ws_round(p->cudnn_ws) + ws_round(p->rowsum_bytes);
}

int sdpa_plan_run(struct sdpa_ctx *c, void *handle, const struct sdpa_plan *p,
		  const struct sdpa_ptrs *x, void *workspace)
{
	const struct sdpa_key *k = &p->key;
	struct sdpa_api *a = &c->api;
	size_t q = 0, kk = (size_t)k->NH * k->HD, v = (size_t)(k->NH + k->NKV) * k->HD;
	const char *qkv = x->qkv;
	int64_t uids[16];
	void *ptrs[16];
	int n = 0;
#define PUT(uid, ptr) (uids[n] = (uid), ptrs[n] = (void *)(ptr), n++)
	PUT(SDPA_UID_Q, qkv + 2 * q); /* bf16: 2 bytes an element */
	PUT(SDPA_UID_K, qkv + 2 * kk);
	PUT(SDPA_UID_V, qkv + 2 * v);
	PUT(SDPA_UID_SCALE, &p->scale);
	PUT(SDPA_UID_NEG_INF, &p->neg_inf);
	if (!k->backward) {
		PUT(SDPA_UID_O, x->out);
		PUT(SDPA_UID_STATS, x->lse);
	} else {
		char *d = x->dqkv;
		PUT(SDPA_UID_O, x->out_in);
		PUT(SDPA_UID_STATS, x->lse_in);
		PUT(SDPA_UID_DO, x->dout);
		PUT(SDPA_UID_DQ, d + 2 * q);
		PUT(SDPA_UID_DK, d + 2 * kk);
		PUT(SDPA_UID_DV, d + 2 * v);
		PUT(SDPA_UID_ONE, &p->one);
		PUT(SDPA_UID_SOFTMAX_SUM, (char *)workspace + ws_round(p->cudnn_ws));
	}
#undef PUT
	cudnnBackendDescriptor_t pack = NULL;
	cudnnStatus_t st = a->cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
							   &pack);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
						 CUDNN_TYPE_INT64, n, uids);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
						 CUDNN_TYPE_VOID_PTR, n, ptrs);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
						 CUDNN_TYPE_VOID_PTR, 1, &workspace);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendFinalize(pack);
	if (st == CUDNN_STATUS_SUCCESS)
		st = a->cudnnBackendExecute((cudnnHandle_t)handle, p->plan, pack);
	if (pack)
		a->cudnnBackendDestroyDescriptor(pack);
	if (st != CUDNN_STATUS_SUCCESS) {
		pthread_mutex_lock(&c->mu);
		refuse(c, "executing the %s plan: %s", k->backward ? "backward" : "forward",
		       a->cudnnGetErrorString(st));
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	return 0;
}

void sdpa_ctx_free(struct sdpa_ctx *c)
{
	if (!c)
		return;
	if (c->state > 0) {
		for (int i = 0; i < c->nplans; i++)
			plan_destroy(c, &c->plans[i]);
		for (int d = 0; d < MAX_DEVICES; d++)
			if (c->handle[d])
				c->api.cudnnDestroy(c->handle[d]);
	}
	if (c->lib)
		dlclose(c->lib);
	pthread_mutex_destroy(&c->mu);
	free(c->libpath);
	free(c);
}

#else /* built without cuDNN's headers: every context refuses, once */

#include <stdio.h>
#include <stdlib.h>

struct sdpa_ctx {
	int notices;
	void (*notice)(void *arg, const char *msg);
	void *notice_arg;
};

#define SDPA_NO_HEADERS "built without cuDNN's headers (cudnn_graph.h; make CUDNN_INC=-IDIR)"

/* the default notice: a warning line (io/util.h: kept off a progress line) */
static void notice_stderr(void *arg, const char *msg)
{
	(void)arg;
	warning("%s", msg);
}

struct sdpa_ctx *sdpa_ctx_new(const char *libpath)
{
	(void)libpath;
	struct sdpa_ctx *c = calloc(1, sizeof(*c));
	if (c)
		c->notice = notice_stderr;
	return c;
}

void sdpa_ctx_free(struct sdpa_ctx *c)
{
	free(c);
}

void sdpa_ctx_set_notice(struct sdpa_ctx *c, void (*fn)(void *arg, const char *msg), void *arg)
{
	c->notice = fn ? fn : notice_stderr;
	c->notice_arg = arg;
}

int sdpa_ctx_notices(const struct sdpa_ctx *c)
{
	return c->notices;
}

const char *sdpa_ctx_why(const struct sdpa_ctx *c)
{
	return SDPA_NO_HEADERS;
}

long sdpa_ctx_descriptors(const struct sdpa_ctx *c)
{
	return 0;
}

void *sdpa_ctx_handle(struct sdpa_ctx *c, int device)
{
	(void)device;
	if (!c->notices++)
		c->notice(c->notice_arg, "cuDNN attention not used (" SDPA_NO_HEADERS
					 "); running the flash kernels");
	c->notices = 1;
	return NULL;
}

int sdpa_ctx_set_stream(struct sdpa_ctx *c, void *handle, void *stream)
{
	return -1;
}

const struct sdpa_plan *sdpa_plan_get(struct sdpa_ctx *c, void *handle, const struct sdpa_key *k)
{
	return NULL;
}

size_t sdpa_plan_workspace(const struct sdpa_plan *p)
{
	return 0;
}

int sdpa_plan_run(struct sdpa_ctx *c, void *handle, const struct sdpa_plan *p,
		  const struct sdpa_ptrs *x, void *workspace)
{
	return -1;
}

int sdpa_graph_check(struct sdpa_ctx *c, const struct sdpa_key *k)
{
	return -1;
}

#endif
