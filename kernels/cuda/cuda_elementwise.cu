/* cuda_elementwise.cu - the elementwise kernels: RoPE, GELU, SwiGLU, the
 * residual add and the conversions between storage types, four elements
 * per thread where the pointers allow (the same bits either way).
 *
 * Legend: see kernels/backend.h. */
#include <mutex>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_act.h"
#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}

/* ------------------------------------------------------------------ */
/* RoPE                                                                 */

/* One thread per (row, head of q or k, pair i < HD/2). The angle is
 * pos * theta^(-2i/HD), computed in double so long contexts keep fp32
 * accuracy; dir = +1 rotates, -1 applies the inverse (the backward). The
 * cos and sin of each (pos, i) come from a table made once per shape and
 * lane (rope_table), by the same double arithmetic rounded to float, so
 * the bits are those of computing them in place (where no table could be
 * had, cs is NULL and they are). */
__device__ static __forceinline__ void rope_cs(int pos, int p, int HD, float theta, float *c,
					       float *s)
{
	double freq = pow((double)theta, -2.0 * p / HD);
	double sd, cd;
	sincos(pos * freq, &sd, &cd);
	*c = (float)cd;
	*s = (float)sd;
}

/* cs[0][T][half] = cos, cs[1][T][half] = sin */
__global__ static void rope_table_kernel(float *cs, int T, int HD, float theta)
{
	int half = HD / 2;
	size_t total = (size_t)T * half;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x)
		rope_cs((int)(i / half), (int)(i % half), HD, theta, &cs[i], &cs[total + i]);
}

template <typename A>
__global__ static void rope_kernel(A *qkv, const float *cs, int Tt, int N, int T, int NH,
				   int NKV, int HD, float theta, float dir)
{
	int half = HD / 2, heads = NH + NKV;
	int QKV = (NH + 2 * NKV) * HD;
	size_t total = (size_t)N * heads * half;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * blockDim.x) {
		int p = (int)(i % half);
		size_t rh = i / half;
		int h = (int)(rh % heads);
		size_t n = rh / heads;
		int pos = (int)(n % T);
		float c, s;
		if (cs) {
			c = cs[(size_t)pos * half + p]; /* the table holds Tt >= T positions */
			s = cs[(size_t)Tt * half + (size_t)pos * half + p];
		} else {
			rope_cs(pos, p, HD, theta, &c, &s);
		}
		float sf = s * dir, cf = c;
		/* q heads then k heads are contiguous at the start of the row */
		A *x = qkv + n * QKV + (size_t)h * HD;
		float x1 = act_ld(x, p), x2 = act_ld(x, p + half);
		act_st(x, p, x1 * cf - x2 * sf);
		act_st(x, p + half, x2 * cf + x1 * sf);
	}
}

/* The calling lane's table for (HD, theta) of at least T positions (its
 * stride *Tt), made on first use; a few per lane are kept for the
 * process's life (a model has one), none ever rewritten, so no queued
 * kernel reads a table that changes (a longer T makes a new one). NULL
 * when the lane has no room left, theta is NaN or memory is short: the
 * kernel then computes in place (the same bits). */
#define ROPE_TABLES 8
static struct rope_table {
	int T, HD;
	uint32_t theta;  /* its bits */
	float *cs;
} rope_tables[CUDA_MAX_LANES][ROPE_TABLES];
static bool rope_no_memory[CUDA_MAX_LANES];
static int rope_made;    /* tables made, for the test */
static std::mutex rope_mutex[CUDA_MAX_LANES];

extern "C" int cuda_rope_tables_made(void)
{
	return __atomic_load_n(&rope_made, __ATOMIC_RELAXED);
}

static const float *rope_table(int T, int HD, float theta, int *Tt)
{
	cuda_stream(); /* the lane's device is current */
	if (!(theta == theta))
		return NULL;
	uint32_t tb;
	memcpy(&tb, &theta, sizeof(tb));
	int l = cuda_lane();
	std::lock_guard<std::mutex> lock(rope_mutex[l]);
	struct rope_table *t = rope_tables[l];
	int i = 0;
	for (; i < ROPE_TABLES && t[i].cs; i++)
		if (t[i].HD == HD && t[i].theta == tb && t[i].T >= T) {
			*Tt = t[i].T;
			return t[i].cs;
		}
	if (i == ROPE_TABLES || rope_no_memory[l])
		return NULL;
	size_t n = (size_t)T * (HD / 2);
	/* counted with the allocations; short of memory, no table */
	float *cs = NULL;
	cudaError_t err = cudaMalloc(&cs, 2 * n * sizeof(float));
	if (err == cudaErrorMemoryAllocation) {
		cudaGetLastError();
		rope_no_memory[l] = true;
		return NULL;
	}
	CUDA_CHECK(err);
	cuda_count_held(cs, 2 * n * sizeof(float));
	rope_table_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(cs, T, HD, theta);
	CUDA_LAUNCHED();
	t[i].T = T;
	t[i].HD = HD;
	t[i].theta = tb;
	t[i].cs = cs;
	__atomic_add_fetch(&rope_made, 1, __ATOMIC_RELAXED);
	*Tt = T;
	return cs;
}

template <typename A>
static void rope(A *qkv, int B, int T, int NH, int NKV, int HD, float theta, float dir)
{
	size_t total = (size_t)B * T * (NH + NKV) * (HD / 2);
	if (!total)
		return;
	/* ASYNCPP_ROPE_TABLE=0: cos and sin in place (the test of equal bits) */
	const char *env = getenv("ASYNCPP_ROPE_TABLE");
	int Tt = T;
	const float *cs = env && !strcmp(env, "0") ? NULL : rope_table(T, HD, theta, &Tt);
	rope_kernel<A><<<cuda_blocks(total, 256), 256, 0, cuda_stream()>>>(qkv, cs, Tt, B * T, T,
									    NH, NKV, HD, theta, dir);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_rope_forward(A *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope(qkv, B, T, NH, NKV, HD, theta, 1.0f);
}

template <typename A>
static void cu_rope_backward(A *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	rope(dqkv, B, T, NH, NKV, HD, theta, -1.0f);
}


/* ------------------------------------------------------------------ */
/* activations, residuals                                               */

/* Elementwise kernels move 4 elements per thread and step (8 bytes of
 * bf16, 16 of float) wherever every pointer is aligned to that and n is a
 * multiple of 4 (vec4_ok), else one; the arithmetic of each element is
 * one __device__ function either way, so the bits are the same. */
template <typename A> struct vec4_of;
template <> struct vec4_of<float> { typedef float4 T; };
template <> struct vec4_of<__nv_bfloat16> { typedef uint2 T; };

template <typename A> __device__ static __forceinline__ void ld4(float *o, const A *p)
{
	typename vec4_of<A>::T u = *reinterpret_cast<const typename vec4_of<A>::T *>(p);
	const A *e = reinterpret_cast<const A *>(&u);
#pragma unroll
	for (int v = 0; v < 4; v++)
		o[v] = act_ld(e, v);
}

template <typename A> __device__ static __forceinline__ void st4(A *p, const float *x)
{
	typename vec4_of<A>::T u;
	A *e = reinterpret_cast<A *>(&u);
#pragma unroll
	for (int v = 0; v < 4; v++)
		act_st(e, v, x[v]);
	*reinterpret_cast<typename vec4_of<A>::T *>(p) = u;
}

/* Whether n elements at every pointer given (NULL skipped) go 4 at a time.
 * ASYNCPP_VEC4=0 (read at each launch) keeps every elementwise kernel to
 * one element per thread: the same bits, for timing, or a way around a
 * fault in the 4-wide path without a rebuild. */
template <typename A>
static bool vec4_ok(size_t n, const void *a, const void *b = NULL, const void *c = NULL)
{
	const char *env = getenv("ASYNCPP_VEC4");
	if (env && !strcmp(env, "0"))
		return false;
	uintptr_t m = 4 * sizeof(A) - 1;
	return n % 4 == 0 && !((uintptr_t)a & m) && !((uintptr_t)b & m) && !((uintptr_t)c & m);
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

__device__ static __forceinline__ float gelu_f(float x)
{
	float u = GELU_K * (x + 0.044715f * x * x * x);
	return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu(x) / dx times dy */
__device__ static __forceinline__ float gelu_grad_f(float x, float dy)
{
	float u = GELU_K * (x + 0.044715f * x * x * x);
	float th = tanhf(u);
	float sech2 = 1.0f - th * th;
	float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
	return g * dy;
}

/* out[i] = op(a[i]): 4 per thread and step with V4 (map1 chooses) */
template <typename O, typename I, bool V4, typename Op>
__global__ static void map1_kernel(O *out, const I *a, size_t n, Op op)
{
	if (V4) {
		GRID_STRIDE(j, n / 4) {
			float x[4];
			ld4(x, a + 4 * j);
#pragma unroll
			for (int v = 0; v < 4; v++)
				x[v] = op(x[v]);
			st4(out + 4 * j, x);
		}
	} else {
		GRID_STRIDE(i, n)
			act_st(out, i, op(act_ld(a, i)));
	}
}

/* out[i] = op(a[i], b[i]) */
template <typename A, bool V4, typename Op>
__global__ static void map2_kernel(A *out, const A *a, const A *b, size_t n, Op op)
{
	if (V4) {
		GRID_STRIDE(j, n / 4) {
			float x[4], y[4];
			ld4(x, a + 4 * j);
			ld4(y, b + 4 * j);
#pragma unroll
			for (int v = 0; v < 4; v++)
				x[v] = op(x[v], y[v]);
			st4(out + 4 * j, x);
		}
	} else {
		GRID_STRIDE(i, n)
			act_st(out, i, op(act_ld(a, i), act_ld(b, i)));
	}
}

template <typename O, typename I, typename Op>
static void map1(O *out, const I *a, size_t n, Op op)
{
	if (!n)
		return;
	if (vec4_ok<O>(n, out) && vec4_ok<I>(n, a))
		map1_kernel<O, I, true, Op><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			out, a, n, op);
	else
		map1_kernel<O, I, false, Op><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, a, n,
											    op);
	CUDA_LAUNCHED();
}

template <typename A, typename Op>
static void map2(A *out, const A *a, const A *b, size_t n, Op op)
{
	if (!n)
		return;
	if (vec4_ok<A>(n, out, a, b))
		map2_kernel<A, true, Op><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(out, a, b,
											     n, op);
	else
		map2_kernel<A, false, Op><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, a, b, n,
											      op);
	CUDA_LAUNCHED();
}

struct gelu_op {
	__device__ float operator()(float x) const { return gelu_f(x); }
};
struct gelu_grad_op { /* (x, dy) */
	__device__ float operator()(float x, float dy) const { return gelu_grad_f(x, dy); }
};
struct add_op {
	__device__ float operator()(float a, float b) const { return a + b; }
};
struct copy_op { /* a conversion between storage types */
	__device__ float operator()(float x) const { return x; }
};

template <typename A> static void cu_gelu_forward(A *out, const A *inp, size_t n)
{
	map1(out, inp, n, gelu_op());
}

template <typename A>
static void cu_gelu_backward(A *dinp, const A *inp, const A *dout, size_t n)
{
	map2(dinp, inp, dout, n, gelu_grad_op());
}

__device__ static __forceinline__ float swiglu_f(float g, float u)
{
	return g / (1.0f + expf(-g)) * u;
}

/* the gradients of silu(g) * u: *dg, *du from d */
__device__ static __forceinline__ void swiglu_grad_f(float g, float u, float d, float *dg,
						     float *du)
{
	float sg = 1.0f / (1.0f + expf(-g));
	*dg = d * u * sg * (1.0f + g * (1.0f - sg));
	*du = d * g * sg;
}

/* V4: 4 neighbouring f of one row per thread and step (F % 4 == 0, every
 * pointer aligned to 4 elements: swiglu_vec4) */
template <typename A, bool V4>
__global__ static void swiglu_forward_kernel(A *out, const A *inp, int N, int F)
{
	if (V4) {
		GRID_STRIDE(j, (size_t)N * F / 4) {
			size_t i = 4 * j, n = i / F, f = i % F;
			float g[4], u[4];
			ld4(g, inp + n * 2 * F + f);
			ld4(u, inp + n * 2 * F + F + f);
#pragma unroll
			for (int v = 0; v < 4; v++)
				g[v] = swiglu_f(g[v], u[v]);
			st4(out + i, g);
		}
	} else {
		GRID_STRIDE(i, (size_t)N * F) {
			size_t n = i / F, f = i % F;
			act_st(out, i, swiglu_f(act_ld(inp, n * 2 * F + f), act_ld(inp, n * 2 * F + F + f)));
		}
	}
}

template <typename A, bool V4>
__global__ static void swiglu_backward_kernel(A *dinp, const A *dout, const A *inp, int N, int F)
{
	if (V4) {
		GRID_STRIDE(j, (size_t)N * F / 4) {
			size_t i = 4 * j, n = i / F, f = i % F;
			float g[4], u[4], d[4], dg[4], du[4];
			ld4(g, inp + n * 2 * F + f);
			ld4(u, inp + n * 2 * F + F + f);
			ld4(d, dout + i);
#pragma unroll
			for (int v = 0; v < 4; v++)
				swiglu_grad_f(g[v], u[v], d[v], &dg[v], &du[v]);
			st4(dinp + n * 2 * F + f, dg);
			st4(dinp + n * 2 * F + F + f, du);
		}
	} else {
		GRID_STRIDE(i, (size_t)N * F) {
			size_t n = i / F, f = i % F;
			float dg, du;
			swiglu_grad_f(act_ld(inp, n * 2 * F + f), act_ld(inp, n * 2 * F + F + f),
				      act_ld(dout, i), &dg, &du);
			act_st(dinp, n * 2 * F + f, dg);
			act_st(dinp, n * 2 * F + F + f, du);
		}
	}
}

template <typename A>
static bool swiglu_vec4(int F, const void *a, const void *b, const void *c = NULL)
{
	return F % 4 == 0 && vec4_ok<A>(4, a, b, c);
}

template <typename A> static void cu_swiglu_forward(A *out, const A *inp, int N, int F)
{
	size_t n = (size_t)N * F;
	if (swiglu_vec4<A>(F, out, inp))
		swiglu_forward_kernel<A, true><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			out, inp, N, F);
	else
		swiglu_forward_kernel<A, false><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
			out, inp, N, F);
	CUDA_LAUNCHED();
}

template <typename A>
static void cu_swiglu_backward(A *dinp, const A *dout, const A *inp, int N, int F)
{
	size_t n = (size_t)N * F;
	if (swiglu_vec4<A>(F, dinp, dout, inp))
		swiglu_backward_kernel<A, true><<<cuda_blocks(n / 4, 256), 256, 0, cuda_stream()>>>(
			dinp, dout, inp, N, F);
	else
		swiglu_backward_kernel<A, false><<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
			dinp, dout, inp, N, F);
	CUDA_LAUNCHED();
}

/* out[n] = a[n] + b[n]: activations (add_act) or floats (add) */
template <typename A> static void cu_add(A *out, const A *a, const A *b, size_t n)
{
	map2(out, a, b, n, add_op());
}


/* dst[n] = src[n] from one storage type into another (cuda_act.h: widening
 * is exact, narrowing rounds to nearest even) */
template <typename O, typename I> static void convert(O *dst, const I *src, size_t n)
{
	map1(dst, src, n, copy_op());
}

void cuda_to_bf16(__nv_bfloat16 *dst, const float *src, size_t n)
{
	convert(dst, src, n);
}


/* GELU of a product's output, for the table's fused forms (cuda_backend.cu)
 * where cuBLASLt declines the epilogue */
void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
	cu_gelu_forward(out, inp, n);
}
void cuda_gelu_forward(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n)
{
	cu_gelu_forward(out, inp, n);
}
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
	cu_gelu_backward(dinp, inp, dout, n);
}
void cuda_gelu_backward(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp,
			const __nv_bfloat16 *dout, size_t n)
{
	cu_gelu_backward(dinp, inp, dout, n);
}

/* ------------------------------------------------------------------ */
/* the table's slots: activations travel as void * in the table's       */
/* act_dtype (float or __nv_bfloat16: A)                                 */

/* f32: copies (in place: nothing) */
static void f32_from_f32(void *out, const float *in, size_t n)
{
	if (out != (const void *)in)
		cuda_copy(out, in, n * sizeof(float));
}
static void f32_to_f32(float *out, const void *in, size_t n)
{
	if ((const void *)out != in)
		cuda_copy(out, in, n * sizeof(float));
}

/* bf16: out[n] rounded from in[n]; out[n] widened from in[n] */
static void bf16_from_f32(void *out, const float *in, size_t n)
{
	convert((__nv_bfloat16 *)out, in, n);
}
static void bf16_to_f32(float *out, const void *in, size_t n)
{
	convert(out, (const __nv_bfloat16 *)in, n);
}

template <typename A>
static void act_rope_forward(void *qkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cu_rope_forward((A *)qkv, B, T, NH, NKV, HD, theta);
}

template <typename A>
static void act_rope_backward(void *dqkv, int B, int T, int NH, int NKV, int HD, float theta)
{
	cu_rope_backward((A *)dqkv, B, T, NH, NKV, HD, theta);
}

template <typename A> static void act_gelu_forward(void *out, const void *inp, size_t n)
{
	cu_gelu_forward((A *)out, (const A *)inp, n);
}

template <typename A>
static void act_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
	cu_gelu_backward((A *)dinp, (const A *)inp, (const A *)dout, n);
}

template <typename A> static void act_swiglu_forward(void *out, const void *inp, int N, int F)
{
	cu_swiglu_forward((A *)out, (const A *)inp, N, F);
}

template <typename A>
static void act_swiglu_backward(void *dinp, const void *dout, const void *inp, int N, int F)
{
	cu_swiglu_backward((A *)dinp, (const A *)dout, (const A *)inp, N, F);
}

template <typename A> static void act_add(void *out, const void *a, const void *b, size_t n)
{
	cu_add((A *)out, (const A *)a, (const A *)b, n);
}

template <typename A> static void fill(struct backend &t)
{
	t.rope_forward = act_rope_forward<A>;
	t.rope_backward = act_rope_backward<A>;
	t.gelu_forward = act_gelu_forward<A>;
	t.gelu_backward = act_gelu_backward<A>;
	t.swiglu_forward = act_swiglu_forward<A>;
	t.swiglu_backward = act_swiglu_backward<A>;
	t.add_act = act_add<A>;
}

void cuda_elementwise_slots(struct backend &t, bool bf16)
{
	t.add = cu_add<float>;
	if (bf16) {
		t.act_from_f32 = bf16_from_f32;
		t.act_to_f32 = bf16_to_f32;
		fill<__nv_bfloat16>(t);
	} else {
		t.act_from_f32 = f32_from_f32;
		t.act_to_f32 = f32_to_f32;
		fill<float>(t);
	}
}
