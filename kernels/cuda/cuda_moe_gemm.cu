/* cuda_moe_gemm.cu - the experts' products of a mixture-of-experts layer
 * (backend.h moe_expert_forward/backward): every expert's product of one
 * kind in one cublasGemmGroupedBatchedEx call, bf16 operands with fp32
 * accumulation (CUBLAS_COMPUTE_32F) as cuda_matmul.cu's products; beside it
 * the plain reference, one matmul_forward/backward per expert
 * (ASYNCPP_MOE_GEMM=loop), for a GPU run to compare the two.
 *
 * Legend: E experts; expert e's rows are [count[e], count[e+1]) (count is
 * host memory: model/moe.c copies it back once per pass); C input width,
 * OC output width; w holds E [OC,C] fp32 matrices back to back.
 *
 * Why cuBLAS's grouped call: CUDA 13's cuBLASLt batches matrices of one
 * shape only (CUBLASLT_BATCH_MODE_POINTER_ARRAY takes one layout for the
 * whole batch), and the experts' row counts differ; it has no grouped
 * matmul. cublasGemmGroupedBatchedEx (cuBLAS >= 12.5) takes a shape per
 * group, each expert a group of one, in one call: the shapes from the
 * host, the per-expert pointers from one upload. It is the pick until a
 * GPU run measures it against the loop (kernels/cuda/NOTES.md).
 *
 * libcublas is loaded with dlopen at first use like cuBLASLt (the header
 * only gives types and prototypes). cuBLAS's grouped call pairs bf16 A/B
 * with a bf16 C only (its documented type table for CUBLAS_COMPUTE_32F:
 * bf16 -> bf16, fp16 -> fp16, fp32 -> fp32); so it runs the products with
 * a bf16 result, the bf16 table's outputs and input gradients. An fp32
 * result (every weight gradient, accumulated with beta 1; the f32 table's
 * outputs) runs the loop, whose cuBLASLt products take bf16 operands into
 * an fp32 C, the bits of the dense path's matmul_backward: a TF32 grouped
 * call instead would widen every row into fp32 scratch (gigabytes per call
 * at production shapes) and round other bits. Whether cuBLAS takes the
 * bf16 pair is asked once per device with a 16 x 16 x 16 product
 * (types_supported), so no call's path depends on the calls before it.
 * Where no grouped call runs - the library is missing, cuBLAS refuses the
 * types, or a width is not a multiple of 8 (an expert's rows would lose
 * the 16-byte alignment cuBLAS asks of each matrix) - that product runs
 * the loop instead, with one notice per process naming why
 * (ASYNCPP_MOE_GEMM=strict makes that an error: the tests use it so that a
 * declined call cannot pass as the loop compared with itself). Each choice
 * is a fact of the library, types and shapes, never of where a buffer
 * sits: a base pointer off 16 bytes is staged through aligned scratch, as
 * cuda_matmul.cu does. Each product (out; dinp; dw) is its own call, so
 * the split backward's parts are the bits of the fused call.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <mutex>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "cuda_common.h"

extern "C" {
#include "../../io/util.h"
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* loading cuBLAS                                                       */

#define BLAS_FUNCS(X)                                                             \
	X(cublasCreate_v2)                                                        \
	X(cublasSetStream_v2)                                                     \
	X(cublasSetWorkspace_v2)                                                  \
	X(cublasGetStatusString)                                                  \
	X(cublasGemmGroupedBatchedEx)

static struct {
#define DECLARE(f) decltype(&::f) f;
	BLAS_FUNCS(DECLARE)
#undef DECLARE
} blas;

static std::mutex blas_mutex; /* loading, the handles, issuing the calls */
static int blas_state;        /* 0 not tried, 1 loaded, -1 failed */
static char blas_why[512];
/* A handle (handles belong to a device) and a workspace per lane, as
 * cuda_matmul.cu's: cuBLAS is deterministic for a given workspace and
 * stream, and two lanes' products must not share scratch. */
static struct {
	cublasHandle_t handle;
	void *workspace;
} blas_lane[CUDA_MAX_LANES];
#define BLAS_WORKSPACE_BYTES (32u << 20)

static int blas_load_locked(void)
{
	static const char *names[] = {
		"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
	};
	void *lib = NULL;
	const char *err = "";
	if (blas_state)
		return blas_state > 0 ? 0 : -1;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !lib; i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib)
			err = dlerror();
	}
	if (!lib) {
		snprintf(blas_why, sizeof(blas_why), "cannot load cuBLAS (libcublas.so.13): %s",
			 err ? err : "not found");
		blas_state = -1;
		return -1;
	}
#define RESOLVE(f)                                                                \
	if (!(blas.f = (decltype(blas.f))dlsym(lib, #f))) {                       \
		snprintf(blas_why, sizeof(blas_why), "cuBLAS lacks %s (older than 12.5?)", #f); \
		blas_state = -1;                                                  \
		return -1;                                                        \
	}
	BLAS_FUNCS(RESOLVE)
#undef RESOLVE
	blas_state = 1;
	return 0;
}

#define BLAS_CHECK(call)                                                          \
	do {                                                                      \
		cublasStatus_t st_ = (call);                                      \
		if (st_ != CUBLAS_STATUS_SUCCESS)                                 \
			cuda_fatal(__FILE__, __LINE__, "%s: %s", #call,           \
				   blas.cublasGetStatusString(st_));              \
	} while (0)

/* The calling lane's handle on its stream with its workspace, or NULL
 * (blas_why says why) without cuBLAS; blas_mutex held. */
static cublasHandle_t blas_ready_locked(void)
{
	cudaStream_t st = cuda_stream(); /* the lane's device is current */
	if (blas_load_locked() < 0)
		return NULL;
	int l = cuda_lane();
	if (!blas_lane[l].handle) {
		BLAS_CHECK(blas.cublasCreate_v2(&blas_lane[l].handle));
		CUDA_CHECK(cudaMalloc(&blas_lane[l].workspace, BLAS_WORKSPACE_BYTES));
		cuda_count_held(blas_lane[l].workspace, BLAS_WORKSPACE_BYTES);
	}
	/* cublasSetStream resets the workspace to the default pool: set ours
	 * after it, at every call (threads of one lane share the handle) */
	BLAS_CHECK(blas.cublasSetStream_v2(blas_lane[l].handle, st));
	BLAS_CHECK(blas.cublasSetWorkspace_v2(blas_lane[l].handle, blas_lane[l].workspace,
					      BLAS_WORKSPACE_BYTES));
	return blas_lane[l].handle;
}

/* ------------------------------------------------------------------ */
/* the grouped call                                                     */

/* One product of a group, column-major as cuBLAS sees it:
 * c[m,n] = op(a)[m,k] op(b)[k,n] (+ beta c). */
struct gproblem {
	const void *a, *b;
	void *c;
	int m, n, k, lda, ldb, ldc;
};

/* The problems p[g] (each a group of one), transpose ta of every A (B as
 * it is), bf16 operands and results, fp32 accumulation, alpha 1 and beta
 * 0. 0 once
 * queued; -1 with nothing queued and the reason in why where cuBLAS does
 * not support the call (NOT_SUPPORTED, ARCH_MISMATCH). Any other status -
 * INVALID_VALUE included, which the documentation gives for arguments
 * out of their ranges only, i.e. a bug here - stops the run. */
static int grouped_gemm(const std::vector<gproblem> &p, cublasOperation_t ta,
			char *why, size_t len)
{
	int g = (int)p.size();
	const cudaDataType_t ab = CUDA_R_16BF;
	const char *types = "bf16 A/B/C, fp32 accumulation";
	if (!g)
		return 0;
	std::vector<cublasOperation_t> tav(g, ta), tbv(g, CUBLAS_OP_N);
	std::vector<int> m(g), n(g), k(g), lda(g), ldb(g), ldc(g), size(g, 1);
	std::vector<float> alpha(g, 1.0f), betav(g, 0.0f);
	std::vector<const void *> ptr(3 * (size_t)g);
	for (int i = 0; i < g; i++) {
		m[i] = p[i].m, n[i] = p[i].n, k[i] = p[i].k;
		lda[i] = p[i].lda, ldb[i] = p[i].ldb, ldc[i] = p[i].ldc;
		ptr[i] = p[i].a, ptr[g + i] = p[i].b, ptr[2 * g + i] = p[i].c;
	}
	std::lock_guard<std::mutex> lock(blas_mutex);
	cublasHandle_t h = blas_ready_locked();
	if (!h) {
		snprintf(why, len, "%s", blas_why);
		return -1;
	}
	/* the pointer arrays live on the device; freed in stream order after
	 * the call that reads them */
	size_t bytes = ptr.size() * sizeof(void *);
	void **dev = (void **)cuda_scratch(bytes);
	cuda_upload(dev, ptr.data(), bytes);
	cublasStatus_t st = blas.cublasGemmGroupedBatchedEx(
		h, tav.data(), tbv.data(), m.data(), n.data(), k.data(), alpha.data(),
		(const void *const *)dev, ab, lda.data(), (const void *const *)(dev + g), ab,
		ldb.data(), betav.data(), (void *const *)(dev + 2 * g), ab, ldc.data(), g,
		size.data(), CUBLAS_COMPUTE_32F);
	cuda_scratch_free(dev);
	if (st == CUBLAS_STATUS_SUCCESS)
		return 0;
	if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH) {
		snprintf(why, len, "cublasGemmGroupedBatchedEx (%s): %s", types,
			 blas.cublasGetStatusString(st));
		return -1;
	}
	cuda_fatal(__FILE__, __LINE__, "cublasGemmGroupedBatchedEx (%s): %s", types,
		   blas.cublasGetStatusString(st));
}

/* Whether cuBLAS's grouped call takes bf16 operands and results: asked
 * once per process and device with one 16 x 16 x 16 product in scratch, so
 * the answer is a fact of the library and GPU, never of the model's shapes
 * or of which call came first (a pipeline stage and one device take the
 * same path at every call). why gets the reason for no. */
static bool types_supported(char *why, size_t len)
{
	static std::mutex mutex;
	static int known[CUDA_MAX_LANES]; /* per lane (a lane is one device) */
	static char reason[CUDA_MAX_LANES][256];
	std::lock_guard<std::mutex> lock(mutex);
	int l = cuda_lane();
	if (!known[l]) {
		size_t bytes = 3 * 256 * 2;
		char *buf = (char *)cuda_scratch(bytes);
		CUDA_CHECK(cudaMemsetAsync(buf, 0, bytes, cuda_stream()));
		std::vector<gproblem> p = {{buf, buf + 512, buf + 1024, 16, 16, 16, 16, 16, 16}};
		known[l] = grouped_gemm(p, CUBLAS_OP_N, reason[l],
					sizeof(reason[l])) ? -1 : 1;
		cuda_scratch_free(buf);
	}
	if (known[l] < 0)
		snprintf(why, len, "%s", reason[l]);
	return known[l] > 0;
}

/* ASYNCPP_MOE_GEMM: "grouped" (the default: grouped where cuBLAS can,
 * else the loop with a notice), "strict" (grouped where it applies, and a
 * declined call stops the run: the GPU tests' setting) or "loop" (one
 * product per expert, the reference). Read at every call (a getenv beside
 * a GEMM), so a test can switch it; anything else stops with the choices. */
enum { MOE_GEMM_LOOP, MOE_GEMM_GROUPED, MOE_GEMM_STRICT };

static int gemm_mode(void)
{
	const char *v = getenv("ASYNCPP_MOE_GEMM");
	if (!v || !*v || !strcmp(v, "grouped"))
		return MOE_GEMM_GROUPED;
	if (!strcmp(v, "strict"))
		return MOE_GEMM_STRICT;
	if (!strcmp(v, "loop"))
		return MOE_GEMM_LOOP;
	cuda_fatal(__FILE__, __LINE__, "ASYNCPP_MOE_GEMM=%s: expected grouped, strict or loop", v);
}

/* The notice that a grouped product runs the loop (once per process: the
 * reason is a fact of the library, types and shapes, the same at every
 * layer); under strict, the error. */
static void declined(const char *why)
{
	static std::once_flag once;
	if (gemm_mode() == MOE_GEMM_STRICT)
		cuda_fatal(__FILE__, __LINE__,
			   "ASYNCPP_MOE_GEMM=strict: the grouped call declined: %s", why);
	std::call_once(once, [why] {
		warning("cuda: the experts' products run one by one: %s", why);
	});
}

/* ------------------------------------------------------------------ */
/* operands at 16-byte aligned addresses                                */

static bool aligned16(const void *p)
{
	return (uintptr_t)p % 16 == 0;
}

/* p, or (off 16 bytes) a copy of its bytes in aligned scratch (*own) */
static const void *aligned_in(const void *p, size_t bytes, void **own)
{
	*own = NULL;
	if (aligned16(p))
		return p;
	*own = cuda_scratch(bytes); /* pool allocations are 256-byte aligned */
	CUDA_CHECK(cudaMemcpyAsync(*own, p, bytes, cudaMemcpyDeviceToDevice,
				   cuda_stream()));
	return *own;
}

/* Where a result of bytes goes: p, or aligned scratch (*own) that back_out
 * moves to p. */
static void *aligned_out(void *p, size_t bytes, void **own)
{
	*own = NULL;
	if (aligned16(p))
		return p;
	return *own = cuda_scratch(bytes);
}

static void back_out(void *p, void *own, size_t bytes, bool queued)
{
	if (!own)
		return;
	if (queued)
		CUDA_CHECK(cudaMemcpyAsync(p, own, bytes, cudaMemcpyDeviceToDevice, cuda_stream()));
	cuda_scratch_free(own);
}

/* The bf16 rows of an activation buffer x[n], staged when off 16 bytes */
static const __nv_bfloat16 *bf16_rows(const __nv_bfloat16 *x, size_t n, void **own)
{
	return (const __nv_bfloat16 *)aligned_in(x, n * sizeof(__nv_bfloat16), own);
}

/* The grouped path needs every expert's rows 16-byte aligned in bf16 and
 * fp32: widths multiples of 8 (a fact of the shape). */
static bool widths_ok(int C, int OC)
{
	return C % 8 == 0 && OC % 8 == 0;
}

/* ------------------------------------------------------------------ */
/* the two grouped products, column-major as cuBLAS sees them         */
/*
 * Row-major out_e[rows, OC] = x_e[rows, C] w_e^T is out_e^T [OC, rows] =
 * (w_e seen as [C, OC])^T x_e^T (FWD: transposes T, N); dinp_e[rows, C] =
 * dout_e w_e is dinp_e^T [C, rows] = w_e^T dout_e^T (DINP: N, N). An
 * expert with no row is left out. (The weight gradients, an fp32 result,
 * run the loop: the header.) */
enum { FWD = 0, DINP = 1 };

/* The problems of kind over every expert with rows: w the weights, r the
 * rows (x for FWD, dout for DINP) and c the results, all bf16. */
static std::vector<gproblem> problems(int kind, const void *w, const void *r, void *c,
				      const int32_t *count, int E, int C, int OC)
{
	std::vector<gproblem> p;
	size_t nw = (size_t)OC * C, in = kind == FWD ? C : OC, out = kind == FWD ? OC : C;
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)count[e];
		int rows = count[e + 1] - count[e];
		const char *we = (const char *)w + e * nw * 2, *re = (const char *)r + r0 * in * 2;
		if (!rows)
			continue;
		if (kind == FWD)
			p.push_back({we, re, (char *)c + r0 * out * 2, OC, rows, C, C, C, OC});
		else
			p.push_back({we, re, (char *)c + r0 * out * 2, C, rows, OC, C, OC, C});
	}
	return p;
}

/* One kind of product with a bf16 result (FWD, DINP) over every expert
 * into c (16-byte aligned), from the weights w (their bf16 copy) and the
 * rows x (FWD) or dout d (DINP). 0 once queued; -1 with why where cuBLAS
 * declines (the caller loops). */
static int run_kind(int kind, __nv_bfloat16 *c, const float *w, const __nv_bfloat16 *x,
		    const __nv_bfloat16 *d, const int32_t *count, int E, int C, int OC, char *why,
		    size_t len)
{
	size_t rows = (size_t)count[E], nw = (size_t)E * OC * C;
	cublasOperation_t ta = kind == FWD ? CUBLAS_OP_T : CUBLAS_OP_N;
	void *own_x = NULL, *own_d = NULL, *own_w = NULL;
	__nv_bfloat16 *own_wb = NULL;
	if (!types_supported(why, len))
		return -1;
	const __nv_bfloat16 *xb = kind == FWD ? bf16_rows(x, rows * C, &own_x) : NULL;
	const __nv_bfloat16 *db = kind == DINP ? bf16_rows(d, rows * OC, &own_d) : NULL;
	/* the copies' lock is held until the call is queued */
	const __nv_bfloat16 *wb = cuda_weight_bf16_hold(w, nw, &own_wb);
	wb = (const __nv_bfloat16 *)aligned_in(wb, nw * sizeof(__nv_bfloat16), &own_w);
	int rc = grouped_gemm(problems(kind, wb, kind == FWD ? (const void *)xb : db, c, count,
				       E, C, OC),
			      ta, why, len);
	cuda_scratch_free(own_w);
	cuda_weight_bf16_release(own_wb);
	cuda_scratch_free(own_x);
	cuda_scratch_free(own_d);
	return rc;
}

/* The reference: one matmul per expert, as model/moe.c looped before the
 * op (and the CPU's op does); cuda_expert_matmul_* are matmul's products
 * with plans for a row count that changes at every call (cuda_common.h). */
template <typename A>
static void forward_loop(A *out, const A *inp, const float *w, const int32_t *count, int E, int C,
			 int OC)
{
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)count[e];
		int rows = count[e + 1] - count[e];
		if (rows)
			cuda_expert_matmul_forward(out + r0 * OC, inp + r0 * C,
						   w + (size_t)e * OC * C, rows, C, OC);
	}
}

template <typename A>
static void backward_loop(A *dinp, float *dw, const A *dout, const A *inp, const float *w,
			  const int32_t *count, int E, int C, int OC)
{
	size_t n = (size_t)OC * C;
	for (int e = 0; e < E; e++) {
		size_t r0 = (size_t)count[e];
		int rows = count[e + 1] - count[e];
		if (rows)
			cuda_expert_matmul_backward(dinp ? dinp + r0 * C : NULL,
						    dw ? dw + e * n : NULL, dout + r0 * OC,
						    inp ? inp + r0 * C : NULL,
						    w ? w + e * n : NULL, rows, C, OC);
	}
}

/* Whether a product with a bf16 result runs grouped (else the caller
 * loops, with the notice where the shape is why). */
static bool grouped_for(int C, int OC)
{
	char why[96];
	if (gemm_mode() == MOE_GEMM_LOOP)
		return false;
	if (widths_ok(C, OC))
		return true;
	snprintf(why, sizeof(why), "widths %d and %d are not multiples of 8", C, OC);
	declined(why);
	return false;
}

/* The products of the f32 table (fp32 results) always loop (header). */
static void expert_forward_f32(void *out, const void *inp, const float *w, const int32_t *count,
			       int E, int C, int OC)
{
	if (count[E])
		forward_loop((float *)out, (const float *)inp, w, count, E, C, OC);
}

static void expert_backward_f32(void *dinp, float *dw, const void *dout, const void *inp,
				const float *w, const int32_t *count, int E, int C, int OC)
{
	if (count[E] && (dinp || dw))
		backward_loop((float *)dinp, dw, (const float *)dout, (const float *)inp, w,
			      count, E, C, OC);
}

static void expert_forward(void *outv, const void *inpv, const float *w, const int32_t *count,
			   int E, int C, int OC)
{
	__nv_bfloat16 *out = (__nv_bfloat16 *)outv;
	const __nv_bfloat16 *inp = (const __nv_bfloat16 *)inpv;
	size_t rows = (size_t)count[E], bytes = rows * OC * sizeof(*out);
	char why[512] = "";
	void *own;
	if (!rows)
		return;
	if (!grouped_for(C, OC))
		return forward_loop(out, inp, w, count, E, C, OC);
	__nv_bfloat16 *o = (__nv_bfloat16 *)aligned_out(out, bytes, &own);
	int rc = run_kind(FWD, o, w, inp, NULL, count, E, C, OC, why, sizeof(why));
	back_out(out, own, bytes, rc == 0);
	if (rc) {
		declined(why);
		forward_loop(out, inp, w, count, E, C, OC);
	}
}

/* dinp grouped, dw (fp32, beta 1) by the loop: each alone what it is with
 * the other (the split backward) */
static void expert_backward(void *dinpv, float *dw, const void *doutv, const void *inpv,
			    const float *w, const int32_t *count, int E, int C, int OC)
{
	__nv_bfloat16 *dinp = (__nv_bfloat16 *)dinpv;
	const __nv_bfloat16 *dout = (const __nv_bfloat16 *)doutv;
	const __nv_bfloat16 *inp = (const __nv_bfloat16 *)inpv;
	size_t rows = (size_t)count[E];
	char why[512] = "";
	void *own;
	if (!rows)
		return;
	if (dinp && !grouped_for(C, OC)) {
		backward_loop(dinp, (float *)NULL, dout, inp, w, count, E, C, OC);
	} else if (dinp) {
		size_t bytes = rows * C * sizeof(*dinp);
		__nv_bfloat16 *o = (__nv_bfloat16 *)aligned_out(dinp, bytes, &own);
		int rc = run_kind(DINP, o, w, NULL, dout, count, E, C, OC, why, sizeof(why));
		back_out(dinp, own, bytes, rc == 0);
		if (rc) {
			declined(why);
			backward_loop(dinp, (float *)NULL, dout, inp, w, count, E, C, OC);
		}
	}
	if (dw)
		backward_loop((__nv_bfloat16 *)NULL, dw, dout, inp, (const float *)NULL, count, E,
			      C, OC);
}

void cuda_moe_gemm_slots(struct backend &t, bool bf16)
{
	if (bf16) {
		t.moe_expert_forward = expert_forward;
		t.moe_expert_backward = expert_backward;
	} else {
		t.moe_expert_forward = expert_forward_f32;
		t.moe_expert_backward = expert_backward_f32;
	}
}
