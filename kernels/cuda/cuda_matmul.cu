/* cuda_matmul.cu - matrix products through cuBLASLt: plans, single,
 * batched and epilogue GEMMs, the weights' bf16 copies, matmul_forward and
 * matmul_backward (Newton-Schulz: cuda_newton_schulz.cu).
 *
 * Legend: see kernels/backend.h. Every product multiplies bf16 operands on
 * tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F, bf16 A/B): fp32
 * weights and fp32 activations are rounded to bf16 (nearest even) into
 * scratch first; bf16 activations (the ACT_BF16 table) are used as stored.
 * The output is fp32 (C/D fp32), or bf16 for bf16 activations (D bf16, the
 * fp32 result plus the fp32 bias rounded once, as backend.h asks); weight
 * gradients are always fp32, accumulated with beta = 1. Expected error
 * against the fp32 reference: about 2^-8 relative per operand, so |err| <~
 * 1e-2 * max|ref| on random data (the tests' bound).
 *
 * cuBLASLt exists only as a shared library: it is loaded with dlopen at first
 * use, so the binary starts without it; the header is included only for
 * types and prototypes (decltype), never linked.
 *
 * Row-major D[M,N] = op(A) op(B) is computed as the column-major product
 * D^T[N,M] = op(B)^T op(A)^T, i.e. cuBLASLt's A is our B and vice versa.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <mutex>
#include <stdio.h>
#include <string.h>

#include "cuda_common.h"

extern "C" {
#include "../backend.h"
#include "../plan_cache.h"
}

/* ------------------------------------------------------------------ */
/* loading cuBLASLt                                                     */

#define LT_FUNCS(X)                                                               \
	X(cublasLtCreate)                                                         \
	X(cublasLtGetStatusString)                                                \
	X(cublasLtMatmul)                                                         \
	X(cublasLtMatmulDescCreate)                                               \
	X(cublasLtMatmulDescDestroy)                                              \
	X(cublasLtMatmulDescSetAttribute)                                         \
	X(cublasLtMatrixLayoutCreate)                                             \
	X(cublasLtMatrixLayoutDestroy)                                            \
	X(cublasLtMatrixLayoutSetAttribute)                                       \
	X(cublasLtMatmulAlgoCheck)                                                \
	X(cublasLtMatmulPreferenceCreate)                                         \
	X(cublasLtMatmulPreferenceDestroy)                                        \
	X(cublasLtMatmulPreferenceSetAttribute)                                   \
	X(cublasLtMatmulAlgoGetHeuristic)

static struct {
#define DECLARE(f) decltype(&::f) f;
	LT_FUNCS(DECLARE)
#undef DECLARE
} lt;

static std::mutex lt_mutex; /* loading, the plan cache, issuing matmuls */
static int lt_state;        /* 0 not tried, 1 loaded, -1 failed */
static char lt_why[512];
/* A handle (handles belong to a device) and a workspace per lane: two
 * lanes' products may run at once, and must not share scratch. */
static struct {
	cublasLtHandle_t handle;
	void *workspace;
} lt_lane[CUDA_MAX_LANES];
#define lt_handle (lt_lane[cuda_lane()].handle)
#define lt_workspace (lt_lane[cuda_lane()].workspace)
#define LT_WORKSPACE_BYTES (32u << 20) /* what Hopper's kernels like */

static int lt_load_locked(void)
{
	static const char *names[] = {
		"libcublasLt.so.13", "libcublasLt.so",
		"/usr/local/cuda/lib64/libcublasLt.so.13",
	};
	void *lib = NULL;
	const char *err = "";
	if (lt_state)
		return lt_state > 0 ? 0 : -1;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib)
			err = dlerror();
	}
	if (!lib) {
		snprintf(lt_why, sizeof(lt_why), "cannot load cuBLASLt (libcublasLt.so.13): %s",
			 err ? err : "not found");
		lt_state = -1;
		return -1;
	}
#define RESOLVE(f)                                                                \
	if (!(lt.f = (decltype(lt.f))dlsym(lib, #f))) {                           \
		snprintf(lt_why, sizeof(lt_why), "cuBLASLt lacks %s", #f);        \
		lt_state = -1;                                                    \
		return -1;                                                        \
	}
	LT_FUNCS(RESOLVE)
#undef RESOLVE
	lt_state = 1;
	return 0;
}

int cuda_blaslt_load(char *why, size_t len)
{
	std::lock_guard<std::mutex> lock(lt_mutex);
	if (lt_load_locked() < 0) {
		snprintf(why, len, "%s", lt_why);
		return -1;
	}
	return 0;
}

#define LT_CHECK(call)                                                            \
	do {                                                                      \
		cublasStatus_t st_ = (call);                                      \
		if (st_ != CUBLAS_STATUS_SUCCESS)                                 \
			cuda_fatal(__FILE__, __LINE__, "%s: %s", #call,           \
				   lt.cublasLtGetStatusString(st_));              \
	} while (0)

/* The calling lane's handle and workspace; called with lt_mutex held. */
static void lt_ready_locked(void)
{
	cuda_stream(); /* the lane's device is current */
	if (lt_handle)
		return;
	if (lt_load_locked() < 0)
		cuda_fatal(__FILE__, __LINE__, "%s", lt_why);
	LT_CHECK(lt.cublasLtCreate(&lt_handle));
	CUDA_CHECK(cudaMalloc(&lt_workspace, LT_WORKSPACE_BYTES));
}

/* ------------------------------------------------------------------ */
/* plans: descriptors + the heuristic's algorithm, cached per shape     */
/*
 * The key is the shape, the transposes, the bias epilogue, the output
 * type and which dimension varies: never the pointers' alignment. cuBLASLt picks its algorithm from
 * the alignment it is promised, and two algorithms round differently, so a
 * key with alignment in it would give a pipeline stage (whose buffers sit at
 * other offsets) other bits than one device. Every plan is made for
 * PLAN_ALIGN-byte pointers, and gemm() stages a pointer that is not so
 * aligned through aligned scratch: same algorithm, same bits, whatever the
 * offsets. */

#define PLAN_ALIGN 16

/* epilogues beyond the bias (plan_key.epi) */
enum { EPI_NONE = 0, EPI_GELU_AUX = 1, EPI_DGELU = 2 };

/* The dimension that changes from call to call (plan_key.vary): an
 * expert's row count, new at nearly every micro-batch (M of its forward
 * and input-gradient products, K of its weight gradients). */
enum { VARY_NONE = 0, VARY_M = 1, VARY_K = 2 };

struct plan_key {
	int M, N, K, ta, tb, bias, out_bf16, epi, vary;
};

/* The plans live in slots of a least-recently-used table (plan_cache.h):
 * a model's few dozen fixed shapes, looked up every step, stay while the
 * experts' one-off row counts come and go. */
struct plan {
	int ok;       /* 0: the heuristic offered no algorithm (bf16 D only; see gemm) */
	int bucketed; /* algo is its bucket's (plan_bucket_algo_locked) */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
};

#define PLAN_CACHE 256
static struct plan plans[PLAN_CACHE];
static struct plan_key plan_keys[PLAN_CACHE];
static uint64_t plan_used[PLAN_CACHE];
static struct plan_lru plan_lru = {(unsigned char *)plan_keys, plan_used, sizeof(struct plan_key),
				   PLAN_CACHE, 0, 0};

/* The algorithm chosen for a bucket of a varying dimension (found: the
 * heuristic offered one), in a table of its own: a few buckets per
 * product, looked up by every new row count. */
struct bucket_algo {
	int found;
	cublasLtMatmulAlgo_t algo;
};

#define BUCKET_CACHE 64
static struct bucket_algo bucket_algos[BUCKET_CACHE];
static struct plan_key bucket_keys[BUCKET_CACHE];
static uint64_t bucket_used[BUCKET_CACHE];
static struct plan_lru bucket_lru = {(unsigned char *)bucket_keys, bucket_used,
				     sizeof(struct plan_key), BUCKET_CACHE, 0, 0};

static unsigned ptr_align(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	unsigned al = 256;
	while (al > 1 && a % al)
		al >>= 1;
	return al;
}

/* The column-major views of k's operands: lt's A = our B, lt's B = our A,
 * C/D = D^T [N, M]. */
static void plan_layouts(const struct plan_key *k, cublasLtMatrixLayout_t *la,
			 cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *lc)
{
	uint64_t ar = k->tb ? k->K : k->N, ac = k->tb ? k->N : k->K;
	uint64_t br = k->ta ? k->M : k->K, bc = k->ta ? k->K : k->M;
	cudaDataType_t dt = k->out_bf16 ? CUDA_R_16BF : CUDA_R_32F;
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(la, CUDA_R_16BF, ar, ac, ar));
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(lb, CUDA_R_16BF, br, bc, br));
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(lc, dt, k->N, k->M, k->N));
}

/* The heuristic's first algorithm for desc on these layouts, for
 * PLAN_ALIGN-byte pointers and our workspace: its status, *found 0 or 1. */
static cublasStatus_t plan_heuristic_locked(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
					    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
					    cublasLtMatmulAlgo_t *algo, int *found)
{
	cublasLtMatmulPreference_t pref;
	LT_CHECK(lt.cublasLtMatmulPreferenceCreate(&pref));
	uint64_t ws = LT_WORKSPACE_BYTES;
	LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
		pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
	cublasLtMatmulPreferenceAttributes_t which[4] = {
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
	};
	uint32_t al = PLAN_ALIGN;
	for (int i = 0; i < 4; i++)
		LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al, sizeof(al)));
	cublasLtMatmulHeuristicResult_t res;
	*found = 0;
	cublasStatus_t st = lt.cublasLtMatmulAlgoGetHeuristic(lt_handle, desc, la, lb, lc, lc, pref,
							      1, &res, found);
	lt.cublasLtMatmulPreferenceDestroy(pref);
	if (st == CUBLAS_STATUS_SUCCESS && *found > 0)
		*algo = res.algo;
	return st;
}

/* A product whose dimension k->vary changes at nearly every call (an
 * expert's rows) would ask the heuristic (tens of microseconds on the
 * host, lt_mutex held) at nearly every call. Instead the algorithm is
 * chosen once per bucket of that dimension (plan_bucket: the next power of
 * two), on the bucket's layouts, and verified for p's real layouts with
 * cublasLtMatmulAlgoCheck (supported for this shape, its workspace within
 * ours); 1 and p->algo set where it passes, else 0 (the caller asks the
 * heuristic for the real shape). Both the bucket's heuristic and the check
 * are functions of the shape alone, never of which calls came before or
 * of where the buffers sit, so a pipeline stage and one device still get
 * the same algorithm, hence the same bits. */
static int plan_bucket_algo_locked(const struct plan_key *k, struct plan *p)
{
	struct plan_key bk = *k;
	int *dim = k->vary == VARY_M ? &bk.M : &bk.K;
	*dim = plan_bucket(*dim);
	int hit;
	struct bucket_algo *b = &bucket_algos[plan_lru_get(&bucket_lru, &bk, &hit)];
	if (!hit) {
		cublasLtMatrixLayout_t la, lb, lc;
		plan_layouts(&bk, &la, &lb, &lc);
		/* p->desc is fresh, as a plan's desc is when its heuristic runs,
		 * and nothing in it depends on M or K */
		cublasStatus_t st = plan_heuristic_locked(p->desc, la, lb, lc, &b->algo, &b->found);
		b->found = st == CUBLAS_STATUS_SUCCESS && b->found > 0;
		lt.cublasLtMatrixLayoutDestroy(la);
		lt.cublasLtMatrixLayoutDestroy(lb);
		lt.cublasLtMatrixLayoutDestroy(lc);
	}
	if (!b->found)
		return 0;
	/* cublasLt.h: INVALID_VALUE where the layouts do not match the
	 * algorithm, NOT_SUPPORTED where its configuration cannot run them;
	 * result.workspaceSize is what it needs for this shape */
	cublasLtMatmulHeuristicResult_t res;
	memset(&res, 0, sizeof(res));
	if (lt.cublasLtMatmulAlgoCheck(lt_handle, p->desc, p->la, p->lb, p->lc, p->lc, &b->algo,
				       &res) != CUBLAS_STATUS_SUCCESS ||
	    res.workspaceSize > LT_WORKSPACE_BYTES)
		return 0;
	p->algo = b->algo;
	return 1;
}

/* p's algorithm from the heuristic for its real shape: p->ok 1, or 0
 * where none is offered for a bf16 D or an epilogue (gemm computes fp32
 * and rounds; gemm_epi declines); dies where an fp32 product has none. */
static void plan_real_algo_locked(const struct plan_key *k, struct plan *p)
{
	int found;
	cublasStatus_t st = plan_heuristic_locked(p->desc, p->la, p->lb, p->lc, &p->algo, &found);
	p->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
	p->bucketed = 0;
	if (!p->ok && !k->out_bf16 && !k->epi)
		cuda_fatal(__FILE__, __LINE__,
			   "cuBLASLt has no bf16 algorithm for M=%d N=%d K=%d ta=%d tb=%d bias=%d "
			   "(%s)", k->M, k->N, k->K, k->ta, k->tb, k->bias,
			   lt.cublasLtGetStatusString(st));
}

static struct plan *plan_get_locked(const struct plan_key *k)
{
	int hit;
	struct plan *p = &plans[plan_lru_get(&plan_lru, k, &hit)];
	if (hit)
		return p;
	if (p->desc) { /* the least recently used plan's slot */
		lt.cublasLtMatmulDescDestroy(p->desc);
		lt.cublasLtMatrixLayoutDestroy(p->la);
		lt.cublasLtMatrixLayoutDestroy(p->lb);
		lt.cublasLtMatrixLayoutDestroy(p->lc);
	}
	memset(p, 0, sizeof(*p));

	cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* lt's A = our B */
	cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* lt's B = our A */
	LT_CHECK(lt.cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
						   sizeof(opa)));
	LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
						   sizeof(opb)));
	if (k->bias || k->epi) {
		cublasLtEpilogue_t ep = k->epi == EPI_GELU_AUX ? (k->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
									  : CUBLASLT_EPILOGUE_GELU_AUX)
					: k->epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
							      : CUBLASLT_EPILOGUE_BIAS;
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
							   &ep, sizeof(ep)));
	}
	if (k->epi) {
		/* the aux matrix (GELU's input) is laid out as D, in D's type
		 * (cuBLASLt's default aux type). The heuristic reads the bias and
		 * aux pointers for their alignment: promise PLAN_ALIGN, what
		 * gemm_epi hands it, not the full alignment NULL would mean. */
		int64_t ld = k->N;
		const void *al = (const void *)(uintptr_t)PLAN_ALIGN;
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
							   &ld, sizeof(ld)));
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(
			p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &al, sizeof(al)));
		if (k->bias)
			LT_CHECK(lt.cublasLtMatmulDescSetAttribute(
				p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &al, sizeof(al)));
	}
	if (k->bias && k->out_bf16) {
		/* the bias is fp32 whatever D is (cuBLASLt's default: D's type) */
		int32_t bt = CUDA_R_32F;
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(
			p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
	}
	plan_layouts(k, &p->la, &p->lb, &p->lc);
	if (k->vary && !k->bias && !k->epi && plan_bucket_algo_locked(k, p)) {
		p->ok = p->bucketed = 1;
		return p;
	}
	plan_real_algo_locked(k, p);
	return p;
}

static void *aligned_copy(const void *src, size_t bytes)
{
	void *dst = cuda_scratch(bytes); /* pool allocations are 256-byte aligned */
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
	return dst;
}

/* Called with lt_mutex held; vary: the dimension that changes from call
 * to call (VARY_*). A bf16 D for which cuBLASLt offers no algorithm (with
 * an fp32 bias, say) is computed with an fp32 D in scratch and rounded to
 * nearest even: the same contract, one more pass. */
static void gemm_locked(void *D, int out_bf16, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
			const float *bias, int M, int N, int K, int ta, int tb, float alpha,
			float beta, int vary)
{
	struct plan_key k;
	memset(&k, 0, sizeof(k));
	k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb, k.bias = bias != NULL;
	k.out_bf16 = out_bf16, k.vary = vary;
	struct plan *p = plan_get_locked(&k);
	if (!p->ok) {
		if (beta != 0.0f)
			cuda_fatal(__FILE__, __LINE__,
				   "gemm: a bf16 D with beta != 0 (M=%d N=%d K=%d)", M, N, K);
		float *f = (float *)cuda_scratch((size_t)M * N * sizeof(float));
		gemm_locked(f, 0, A, B, bias, M, N, K, ta, tb, alpha, 0.0f, vary);
		cuda_to_bf16((__nv_bfloat16 *)D, f, (size_t)M * N);
		cuda_scratch_free(f);
		return;
	}

	/* misaligned pointers go through aligned scratch (see plan_key) */
	size_t esz = out_bf16 ? 2 : 4, dbytes = (size_t)M * N * esz;
	const void *a = A, *b = B;
	void *d = D;
	if (ptr_align(A) < PLAN_ALIGN)
		a = aligned_copy(A, (size_t)M * K * sizeof(__nv_bfloat16));
	if (ptr_align(B) < PLAN_ALIGN)
		b = aligned_copy(B, (size_t)K * N * sizeof(__nv_bfloat16));
	const float *bias_in = bias;
	if (bias && ptr_align(bias) < PLAN_ALIGN)
		bias = (const float *)aligned_copy(bias, (size_t)N * sizeof(float));
	if (ptr_align(D) < PLAN_ALIGN)
		d = beta != 0.0f ? aligned_copy(D, dbytes) : cuda_scratch(dbytes);
	if (bias)
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
							   &bias, sizeof(bias)));
	cublasStatus_t st = lt.cublasLtMatmul(lt_handle, p->desc, &alpha, b, p->la, a, p->lb, &beta,
					      d, p->lc, d, p->lc, &p->algo, lt_workspace,
					      LT_WORKSPACE_BYTES, cuda_stream());
	if (st != CUBLAS_STATUS_SUCCESS && p->bucketed) {
		/* cublasLtMatmulAlgoCheck's success does not promise a run; a
		 * refusal (assumed to come before anything is queued, as its
		 * argument checks do) is a fact of the shape, as the check is:
		 * the real shape's heuristic then, for good */
		plan_real_algo_locked(&k, p);
		st = lt.cublasLtMatmul(lt_handle, p->desc, &alpha, b, p->la, a, p->lb, &beta, d,
				       p->lc, d, p->lc, &p->algo, lt_workspace, LT_WORKSPACE_BYTES,
				       cuda_stream());
	}
	if (st != CUBLAS_STATUS_SUCCESS)
		cuda_fatal(__FILE__, __LINE__, "cublasLtMatmul (M=%d N=%d K=%d ta=%d tb=%d): %s", M,
			   N, K, ta, tb, lt.cublasLtGetStatusString(st));
	if (d != D) {
		CUDA_CHECK(cudaMemcpyAsync(D, d, dbytes, cudaMemcpyDeviceToDevice, cuda_stream()));
		cuda_scratch_free(d);
	}
	if (a != A)
		cuda_scratch_free((void *)a);
	if (b != B)
		cuda_scratch_free((void *)b);
	if (bias != bias_in)
		cuda_scratch_free((void *)bias);
}

/* ---- strided batches with the single product's algorithm ----
 *
 * count products of one shape, matrix i at A + i sA, B + i sB, D + i sD
 * (elements), fp32 D, no bias. Each runs the algorithm the plan of one such
 * product chose (plan_get_locked), given batched layouts: an algorithm's
 * tiles and split of K do not depend on the batch, which cuBLASLt runs as
 * one more grid dimension, so every matrix gets the bits a product of its
 * own gets (test_cuda_ops checks it on the GPU). Where cuBLASLt refuses
 * that algorithm for the batch (cublasLtMatmulAlgoCheck), or a pointer is
 * not PLAN_ALIGN-aligned, the products run one by one. */
struct bplan_key {
	int M, N, K, ta, tb, count;
	long long sA, sB, sD;
};
struct bplan {
	struct bplan_key key;
	int ok; /* the single plan's algorithm takes the batch */
	cublasLtMatrixLayout_t la, lb, lc;
};
#define BPLAN_CACHE 64
static struct bplan bplans[BPLAN_CACHE];
static int nbplans;

static void batch_layout(cublasLtMatrixLayout_t l, int count, long long stride)
{
	int32_t c = count;
	int64_t s = stride;
	LT_CHECK(lt.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c,
						     sizeof(c)));
	LT_CHECK(lt.cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
						     &s, sizeof(s)));
}

static struct bplan *bplan_get_locked(const struct bplan_key *k, const struct plan *single)
{
	for (int i = 0; i < nbplans; i++)
		if (!memcmp(&bplans[i].key, k, sizeof(*k)))
			return &bplans[i];
	if (nbplans == BPLAN_CACHE)
		nbplans = 0;
	struct bplan *p = &bplans[nbplans++];
	if (p->la) {
		lt.cublasLtMatrixLayoutDestroy(p->la);
		lt.cublasLtMatrixLayoutDestroy(p->lb);
		lt.cublasLtMatrixLayoutDestroy(p->lc);
	}
	memset(p, 0, sizeof(*p));
	p->key = *k;
	/* as plan_get_locked: lt's A = our B, lt's B = our A, C/D = D^T */
	uint64_t ar = k->tb ? k->K : k->N, ac = k->tb ? k->N : k->K;
	uint64_t br = k->ta ? k->M : k->K, bc = k->ta ? k->K : k->M;
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, ar, ac, ar));
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, br, bc, br));
	LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, k->N, k->M, k->N));
	batch_layout(p->la, k->count, k->sB);
	batch_layout(p->lb, k->count, k->sA);
	batch_layout(p->lc, k->count, k->sD);
	cublasLtMatmulHeuristicResult_t res;
	memset(&res, 0, sizeof(res));
	p->ok = lt.cublasLtMatmulAlgoCheck(lt_handle, single->desc, p->la, p->lb, p->lc, p->lc,
					   &single->algo, &res) == CUBLAS_STATUS_SUCCESS &&
		res.workspaceSize <= LT_WORKSPACE_BYTES;
	return p;
}

void cuda_gemm_bf16_batched(float *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B, int M,
			    int N, int K, int ta, int tb, float alpha, float beta, int count,
			    long long sA, long long sB, long long sD)
{
	if (M <= 0 || N <= 0 || count <= 0)
		return;
	std::lock_guard<std::mutex> lock(lt_mutex);
	lt_ready_locked();
	struct plan_key k;
	memset(&k, 0, sizeof(k));
	k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb;
	struct plan *single = plan_get_locked(&k);
	int aligned = ptr_align(A) >= PLAN_ALIGN && ptr_align(B) >= PLAN_ALIGN &&
		      ptr_align(D) >= PLAN_ALIGN && (sA * 2) % PLAN_ALIGN == 0 &&
		      (sB * 2) % PLAN_ALIGN == 0 && (sD * 4) % PLAN_ALIGN == 0;
	if (count > 1 && single->ok && aligned) {
		struct bplan_key bk;
		memset(&bk, 0, sizeof(bk));
		bk.M = M, bk.N = N, bk.K = K, bk.ta = ta, bk.tb = tb, bk.count = count;
		bk.sA = sA, bk.sB = sB, bk.sD = sD;
		struct bplan *bp = bplan_get_locked(&bk, single);
		/* cublasLtMatmulAlgoCheck's success does not promise a run: a
		 * refusal here also falls back to one product at a time */
		if (bp->ok &&
		    lt.cublasLtMatmul(lt_handle, single->desc, &alpha, B, bp->la, A, bp->lb, &beta,
				      D, bp->lc, D, bp->lc, &single->algo, lt_workspace,
				      LT_WORKSPACE_BYTES, cuda_stream()) == CUBLAS_STATUS_SUCCESS)
			return;
		bp->ok = 0;
	}
	for (int i = 0; i < count; i++)
		gemm_locked(D + i * sD, 0, A + i * sA, B + i * sB, NULL, M, N, K, ta, tb, alpha, beta,
			    VARY_NONE);
}

/* D = op(A) op(B) (+ bias) through epilogue epi with its aux matrix (laid
 * out as D, in D's type; EPI_GELU_AUX writes it, EPI_DGELU reads it),
 * alpha 1, beta 0. Returns -1 with nothing that matters queued where the
 * epilogues are off (unless ASYNCPP_GEMM_EPILOGUES=1), the aux's leading
 * dimension (N) is not a multiple of 8, or cuBLASLt offers or runs no
 * algorithm for it: all of them facts of the shape, never of where a
 * buffer sits (misaligned pointers are staged as in gemm_locked), so a
 * pipeline stage and one device take the same path. The caller then runs
 * the product and the elementwise op apart. */
/* Off until a GPU run has measured them (NOTES.md): ASYNCPP_GEMM_EPILOGUES=1
 * turns them on. Read at every call (a getenv beside a GEMM), so a test can
 * switch them. */
static int epilogues_on(void)
{
	const char *e = getenv("ASYNCPP_GEMM_EPILOGUES");
	return e && !strcmp(e, "1");
}

static int gemm_epi(void *D, int out_bf16, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
		    const float *bias, int M, int N, int K, int ta, int tb, int epi, void *aux)
{
	if (!epilogues_on() || M <= 0 || N <= 0 || N % 8)
		return -1;
	std::lock_guard<std::mutex> lock(lt_mutex);
	lt_ready_locked();
	struct plan_key k;
	memset(&k, 0, sizeof(k));
	k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb, k.bias = bias != NULL;
	k.out_bf16 = out_bf16, k.epi = epi;
	struct plan *p = plan_get_locked(&k);
	if (!p->ok)
		return -1;
	size_t dbytes = (size_t)M * N * (out_bf16 ? 2 : 4);
	const void *a = A, *b = B;
	const float *bi = bias;
	void *d = D, *x = aux;
	if (ptr_align(A) < PLAN_ALIGN)
		a = aligned_copy(A, (size_t)M * K * sizeof(__nv_bfloat16));
	if (ptr_align(B) < PLAN_ALIGN)
		b = aligned_copy(B, (size_t)K * N * sizeof(__nv_bfloat16));
	if (bias && ptr_align(bias) < PLAN_ALIGN)
		bi = (const float *)aligned_copy(bias, (size_t)N * sizeof(float));
	if (ptr_align(D) < PLAN_ALIGN)
		d = cuda_scratch(dbytes);
	if (ptr_align(aux) < PLAN_ALIGN) /* DGELU reads it, GELU_AUX writes it */
		x = epi == EPI_DGELU ? aligned_copy(aux, dbytes) : cuda_scratch(dbytes);
	float alpha = 1.0f, beta = 0.0f;
	if (bi)
		LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
							   &bi, sizeof(bi)));
	LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
						   &x, sizeof(x)));
	cublasStatus_t st = lt.cublasLtMatmul(lt_handle, p->desc, &alpha, b, p->la, a, p->lb, &beta,
					      d, p->lc, d, p->lc, &p->algo, lt_workspace,
					      LT_WORKSPACE_BYTES, cuda_stream());
	if (st != CUBLAS_STATUS_SUCCESS)
		p->ok = 0; /* never again for this shape */
	if (st == CUBLAS_STATUS_SUCCESS && d != D)
		CUDA_CHECK(cudaMemcpyAsync(D, d, dbytes, cudaMemcpyDeviceToDevice, cuda_stream()));
	if (st == CUBLAS_STATUS_SUCCESS && x != aux && epi == EPI_GELU_AUX)
		CUDA_CHECK(cudaMemcpyAsync(aux, x, dbytes, cudaMemcpyDeviceToDevice, cuda_stream()));
	if (a != A)
		cuda_scratch_free((void *)a);
	if (b != B)
		cuda_scratch_free((void *)b);
	if (bi != bias)
		cuda_scratch_free((void *)bi);
	if (d != D)
		cuda_scratch_free(d);
	if (x != aux)
		cuda_scratch_free(x);
	return st == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

static void gemm(void *D, int out_bf16, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
		 const float *bias, int M, int N, int K, int ta, int tb, float alpha, float beta,
		 int vary = VARY_NONE)
{
	if (M <= 0 || N <= 0)
		return;
	std::lock_guard<std::mutex> lock(lt_mutex);
	lt_ready_locked();
	gemm_locked(D, out_bf16, A, B, bias, M, N, K, ta, tb, alpha, beta, vary);
}

void cuda_gemm_bf16(float *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
		    const float *bias, int M, int N, int K, int ta, int tb,
		    float alpha, float beta)
{
	/* the bias always goes through the epilogue (a misaligned vector is
	 * staged by gemm), so where it sits never changes the arithmetic */
	gemm(D, 0, A, B, bias, M, N, K, ta, tb, alpha, beta);
}

void cuda_gemm_bf16_out(__nv_bfloat16 *D, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
			int M, int N, int K, int ta, int tb)
{
	gemm(D, 1, A, B, NULL, M, N, K, ta, tb, 1.0f, 0.0f);
}

/* ------------------------------------------------------------------ */
/* matmul ops                                                           */

static __nv_bfloat16 *bf16_copy(const float *x, size_t n)
{
	__nv_bfloat16 *b = (__nv_bfloat16 *)cuda_scratch(n * sizeof(__nv_bfloat16));
	cuda_to_bf16(b, x, n);
	return b;
}

/* The bf16 operand for x[n]: rounded into scratch (*own, freed by the
 * caller) from fp32, or x itself when it is stored as bf16 already. */
static const __nv_bfloat16 *bf16_operand(const float *x, size_t n, __nv_bfloat16 **own)
{
	return *own = bf16_copy(x, n);
}

static const __nv_bfloat16 *bf16_operand(const __nv_bfloat16 *x, size_t n, __nv_bfloat16 **own)
{
	(void)n;
	*own = NULL;
	return x;
}

/* ---- bf16 copies of the weights (backend.h: weights_bf16) ----
 *
 * model/ calls weights_bf16(params, n) before every pass over a stage's
 * weights; the matmuls of the pass then read each weight's bf16 copy instead
 * of rounding it into scratch per product (158 conversions in a GPT-2 124M
 * step, 12% of its GPU time on an H100, NOTES.md). The copy is the same
 * rounding (cuda_to_bf16), so products give the same bits either way.
 *
 * A few ranges are kept (a stage's weights, two versions under 2bw, ...);
 * preparing another reuses the least recently prepared buffer. Lookups hold
 * shadow_mutex until their GEMM is queued, and prepares hold it while they
 * queue their conversion: with every op on one stream, a buffer is never
 * rewritten before the GEMMs queued against it have run. Each lane
 * (backend.h) has its own copies, made and read on its stream only, so the
 * same holds with several lanes, and no lane reads another device's copy.
 * A weight outside every prepared range of the lane, or a failed
 * allocation, falls back to the per-product conversion. */
#define SHADOWS 8
struct shadow {
	const float *w;    /* the fp32 range, NULL when free */
	size_t n;          /* floats in it */
	__nv_bfloat16 *b;  /* [cap] its copy */
	size_t cap;
	unsigned long used; /* when last prepared (shadow_clock) */
};
static struct shadow shadow_lanes[CUDA_MAX_LANES][SHADOWS];
#define shadows (shadow_lanes[cuda_lane()])
static std::mutex shadow_mutex;
static unsigned long shadow_clock;

void cuda_weights_bf16(const float *w, size_t n)
{
	std::lock_guard<std::mutex> lock(shadow_mutex);
	struct shadow *e = NULL;
	for (int i = 0; i < SHADOWS; i++) {
		struct shadow *s = &shadows[i];
		if (s->w == w && s->n == n)
			e = s;
		else if (s->w && s->w < w + n && w < s->w + s->n)
			s->w = NULL; /* overlaps the new range: one copy per weight */
	}
	for (int i = 0; !e && i < SHADOWS; i++) /* else a free entry large enough */
		if (!shadows[i].w && shadows[i].cap >= n)
			e = &shadows[i];
	for (int i = 0; !e && i < SHADOWS; i++) /* else any free entry */
		if (!shadows[i].w)
			e = &shadows[i];
	if (!e) { /* else the least recently prepared */
		e = &shadows[0];
		for (int i = 1; i < SHADOWS; i++)
			if (shadows[i].used < e->used)
				e = &shadows[i];
	}
	e->w = NULL;
	if (e->cap < n) {
		cuda_free_tracked(e->b);
		e->cap = 0;
		if (!(e->b = (__nv_bfloat16 *)cuda_alloc_tracked(n * sizeof(__nv_bfloat16))))
			return; /* out of memory: the products convert per call */
		e->cap = n;
	}
	cuda_to_bf16(e->b, w, n);
	e->w = w, e->n = n, e->used = ++shadow_clock;
}

/* Memory being freed holds no prepared range any more: a later allocation
 * there, weights or not, must never be read through an old copy. */
void cuda_weights_forget(const void *p, size_t bytes)
{
	const char *lo = (const char *)p, *hi = lo + bytes;
	std::lock_guard<std::mutex> lock(shadow_mutex);
	for (int l = 0; l < CUDA_MAX_LANES; l++) /* every lane's */
		for (int i = 0; i < SHADOWS; i++) {
			struct shadow *s = &shadow_lanes[l][i];
			if (s->w && (const char *)s->w < hi && lo < (const char *)(s->w + s->n))
				s->w = NULL;
		}
}

/* The bf16 copy of w[count] if a prepared range holds it; call with
 * shadow_mutex held, and queue the product before releasing it. */
static const __nv_bfloat16 *shadow_find(const float *w, size_t count)
{
	for (int i = 0; i < SHADOWS; i++) {
		const struct shadow *s = &shadows[i];
		if (s->w && w >= s->w && w + count <= s->w + s->n)
			return s->b + (w - s->w);
	}
	return NULL;
}

/* The bf16 weight w[count]: its prepared copy, else rounded into scratch
 * (*own, freed by the caller after queueing the product). shadow_mutex
 * held. */
static const __nv_bfloat16 *bf16_weight(const float *w, size_t count, __nv_bfloat16 **own)
{
	const __nv_bfloat16 *b = shadow_find(w, count);
	*own = b ? NULL : bf16_copy(w, count);
	return b ? b : *own;
}

const __nv_bfloat16 *cuda_weight_bf16_hold(const float *w, size_t n, __nv_bfloat16 **own)
{
	shadow_mutex.lock();
	return bf16_weight(w, n, own);
}

void cuda_weight_bf16_release(__nv_bfloat16 *own)
{
	cuda_scratch_free(own);
	shadow_mutex.unlock();
}

/* Whether an activation pointer's D is bf16 (gemm's out_bf16). */
static int is_bf16(const float *) { return 0; }
static int is_bf16(const __nv_bfloat16 *) { return 1; }

/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]; out, inp activations (A).
 * rows_vary: N changes from call to call (an expert's rows; see
 * plan_bucket_algo_locked). */
template <typename A>
static void matmul_forward(A *out, const A *inp, const float *w, const float *bias, int N, int C,
			   int OC, bool rows_vary = false)
{
	__nv_bfloat16 *own, *own_w;
	const __nv_bfloat16 *ib = bf16_operand(inp, (size_t)N * C, &own);
	std::lock_guard<std::mutex> lock(shadow_mutex);
	const __nv_bfloat16 *wb = bf16_weight(w, (size_t)OC * C, &own_w);
	/* the bias always goes through the epilogue (a misaligned vector is
	 * staged by gemm), so where it sits never changes the arithmetic */
	gemm(out, is_bf16(out), ib, wb, bias, N, OC, C, 0, 1, 1.0f, 0.0f,
	     rows_vary ? VARY_M : VARY_NONE);
	cuda_scratch_free(own);
	cuda_scratch_free(own_w);
}

/* dinp[N,C] = dout[N,OC] @ w[OC,C]; dw[OC,C] += dout^T @ inp[N,C] (fp32,
 * beta 1); dbias[OC] += column sums of dout (deterministic,
 * cuda_colsum_acc). dinp, dout, inp activations (A). rows_vary as
 * matmul_forward (N is the dinp product's M and the dw product's K). */
template <typename A>
static void matmul_backward(A *dinp, float *dw, float *dbias, const A *dout, const A *inp,
			    const float *w, int N, int C, int OC, bool rows_vary = false)
{
	if (dbias)
		cuda_colsum_acc(dbias, dout, N, OC);
	__nv_bfloat16 *own_d, *own_i;
	const __nv_bfloat16 *db = bf16_operand(dout, (size_t)N * OC, &own_d);
	if (dinp) {
		__nv_bfloat16 *own_w;
		std::lock_guard<std::mutex> lock(shadow_mutex);
		const __nv_bfloat16 *wb = bf16_weight(w, (size_t)OC * C, &own_w);
		gemm(dinp, is_bf16(dinp), db, wb, NULL, N, C, OC, 0, 0, 1.0f, 0.0f,
		     rows_vary ? VARY_M : VARY_NONE);
		cuda_scratch_free(own_w);
	}
	if (dw) {
		const __nv_bfloat16 *ib = bf16_operand(inp, (size_t)N * C, &own_i);
		gemm(dw, 0, db, ib, NULL, OC, C, N, 1, 0, 1.0f, 1.0f,
		     rows_vary ? VARY_K : VARY_NONE);
		cuda_scratch_free(own_i);
	}
	cuda_scratch_free(own_d);
}

void cuda_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
			 int C, int OC)
{
	matmul_forward(out, inp, w, bias, N, C, OC);
}

void cuda_matmul_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, const float *w,
			 const float *bias, int N, int C, int OC)
{
	matmul_forward(out, inp, w, bias, N, C, OC);
}

void cuda_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
			  const float *inp, const float *w, int N, int C, int OC)
{
	matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

void cuda_matmul_backward(__nv_bfloat16 *dinp, float *dw, float *dbias,
			  const __nv_bfloat16 *dout, const __nv_bfloat16 *inp, const float *w,
			  int N, int C, int OC)
{
	matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
}

void cuda_expert_matmul_forward(float *out, const float *inp, const float *w, int N, int C,
				int OC)
{
	matmul_forward(out, inp, w, (const float *)NULL, N, C, OC, true);
}

void cuda_expert_matmul_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, const float *w,
				int N, int C, int OC)
{
	matmul_forward(out, inp, w, (const float *)NULL, N, C, OC, true);
}

void cuda_expert_matmul_backward(float *dinp, float *dw, const float *dout, const float *inp,
				 const float *w, int N, int C, int OC)
{
	matmul_backward(dinp, dw, (float *)NULL, dout, inp, w, N, C, OC, true);
}

void cuda_expert_matmul_backward(__nv_bfloat16 *dinp, float *dw, const __nv_bfloat16 *dout,
				 const __nv_bfloat16 *inp, const float *w, int N, int C, int OC)
{
	matmul_backward(dinp, dw, (float *)NULL, dout, inp, w, N, C, OC, true);
}

/* ---- products with GELU in their epilogue (backend.h) ----
 * pre[N,OC] = inp w^T + bias and out = gelu(pre) from one GEMM
 * (GELU_AUX_BIAS: the GELU input goes to the aux matrix); dpre[N,C] =
 * (dout w) * gelu'(pre) from the dinp GEMM (DGELU reads pre as aux), with
 * dw and dbias as matmul_backward. -1, nothing queued, where gemm_epi
 * declines: the caller (cuda_backend.cu) runs the ops apart. */
template <typename A>
static int matmul_gelu_forward(A *out, A *pre, const A *inp, const float *w, const float *bias,
			       int N, int C, int OC)
{
	__nv_bfloat16 *own, *own_w;
	const __nv_bfloat16 *ib = bf16_operand(inp, (size_t)N * C, &own);
	int rc;
	{
		std::lock_guard<std::mutex> lock(shadow_mutex);
		const __nv_bfloat16 *wb = bf16_weight(w, (size_t)OC * C, &own_w);
		rc = gemm_epi(out, is_bf16(out), ib, wb, bias, N, OC, C, 0, 1, EPI_GELU_AUX, pre);
		cuda_scratch_free(own_w);
	}
	cuda_scratch_free(own);
	return rc;
}

template <typename A>
static int matmul_backward_dgelu(A *dpre, float *dw, float *dbias, const A *dout, const A *inp,
				 const float *w, const A *pre, int N, int C, int OC)
{
	__nv_bfloat16 *own_d, *own_i, *own_w;
	const __nv_bfloat16 *db = bf16_operand(dout, (size_t)N * OC, &own_d);
	int rc;
	{
		std::lock_guard<std::mutex> lock(shadow_mutex);
		const __nv_bfloat16 *wb = bf16_weight(w, (size_t)OC * C, &own_w);
		rc = gemm_epi(dpre, is_bf16(dpre), db, wb, NULL, N, C, OC, 0, 0, EPI_DGELU,
			      (void *)pre);
		cuda_scratch_free(own_w);
	}
	if (!rc) {
		if (dbias)
			cuda_colsum_acc(dbias, dout, N, OC);
		if (dw) {
			const __nv_bfloat16 *ib = bf16_operand(inp, (size_t)N * C, &own_i);
			gemm(dw, 0, db, ib, NULL, OC, C, N, 1, 0, 1.0f, 1.0f);
			cuda_scratch_free(own_i);
		}
	}
	cuda_scratch_free(own_d);
	return rc;
}

int cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *w,
			     const float *bias, int N, int C, int OC)
{
	return matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC);
}

int cuda_matmul_gelu_forward(__nv_bfloat16 *out, __nv_bfloat16 *pre, const __nv_bfloat16 *inp,
			     const float *w, const float *bias, int N, int C, int OC)
{
	return matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC);
}

int cuda_matmul_backward_dgelu(float *dpre, float *dw, float *dbias, const float *dout,
			       const float *inp, const float *w, const float *pre, int N, int C,
			       int OC)
{
	return matmul_backward_dgelu(dpre, dw, dbias, dout, inp, w, pre, N, C, OC);
}

int cuda_matmul_backward_dgelu(__nv_bfloat16 *dpre, float *dw, float *dbias,
			       const __nv_bfloat16 *dout, const __nv_bfloat16 *inp, const float *w,
			       const __nv_bfloat16 *pre, int N, int C, int OC)
{
	return matmul_backward_dgelu(dpre, dw, dbias, dout, inp, w, pre, N, C, OC);
}
