/* cuda_newton_schulz.cu - Muon's orthogonalisation on bf16 GEMMs, one
 * matrix or a batch of one shape (backend.h: newton_schulz,
 * newton_schulz_many).
 *
 * Legend: see kernels/backend.h. The quintic iteration X <- a X + (b A + c
 * A A) X with A = X X^T runs on the orientation with rows <= cols (the
 * input is transposed when rows > cols, the result transposed back), from
 * in / (|in|_F + 1e-7). Every product is a bf16 GEMM with fp32 accumulation
 * (cuda_matmul.cu); X and A are kept in fp32 and rounded to bf16 for each
 * product. A batch runs each product as one strided-batched GEMM with the
 * algorithm of a single one, so each matrix gets the bits it gets alone.
 */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}

/* out = in * scale (R rows, C cols), transposed (out[c,r]) when transpose;
 * scale = 1/(sqrt(*ss) + 1e-7), or 1 when ss is NULL (multiplying by 1 is
 * exact: a plain copy or transpose) */
__global__ static void transpose_scale_kernel(float *out, const float *in, int R, int C,
					      const double *ss, int transpose)
{
	__shared__ float tile[32][33];
	float s = ss ? (float)(1.0 / (sqrt(*ss) + 1e-7)) : 1.0f;
	int bx = blockIdx.x * 32, by = blockIdx.y * 32;
	int tx = threadIdx.x, ty = threadIdx.y; /* 32 x 8 */
	if (!transpose) {
		for (int k = ty; k < 32; k += 8) {
			int r = by + k, c = bx + tx;
			if (r < R && c < C)
				out[(size_t)r * C + c] = in[(size_t)r * C + c] * s;
		}
		return;
	}
	for (int k = ty; k < 32; k += 8) {
		int r = by + k, c = bx + tx;
		if (r < R && c < C)
			tile[k][tx] = in[(size_t)r * C + c];
	}
	__syncthreads();
	for (int k = ty; k < 32; k += 8) {
		int c = bx + k, r = by + tx;
		if (r < R && c < C)
			out[(size_t)c * R + r] = tile[tx][k] * s;
	}
}

/* X[m,n] (m <= n) = in[rows,cols] / (|in|_F + 1e-7), transposed when tr;
 * ss: a device double for the sum of squares */
static void ns_load(float *X, const float *in, int rows, int cols, int tr, double *ss)
{
	cuda_sumsq_device(ss, in, (size_t)rows * cols);
	dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
	transpose_scale_kernel<<<grid, block, 0, cuda_stream()>>>(X, in, rows, cols, ss, tr);
	CUDA_LAUNCHED();
}

/* out[rows,cols] from X[m,n], transposed back when tr */
static void ns_store(float *out, const float *X, int m, int n, int tr)
{
	if (tr) {
		dim3 grid((n + 31) / 32, (m + 31) / 32), block(32, 8);
		transpose_scale_kernel<<<grid, block, 0, cuda_stream()>>>(out, X, m, n, NULL, 1);
		CUDA_LAUNCHED();
	} else {
		CUDA_CHECK(cudaMemcpyAsync(out, X, (size_t)m * n * sizeof(float),
					   cudaMemcpyDeviceToDevice, cuda_stream()));
	}
}

#define NS_A 3.4445f
#define NS_B (-4.7750f)
#define NS_C 2.0315f

static size_t up64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* X[m,n] (m <= n) = normalised in (transposed when rows > cols); per step
 * A = X X^T; A = c A A + b A; X = A X + a X, each product a bf16 GEMM with
 * fp32 accumulation. Buffers: X, A fp32; Xb, Ab bf16 copies. */
void cuda_newton_schulz(float *out, const float *in, int rows, int cols, int steps,
			float *scratch)
{
	if (rows <= 0 || cols <= 0)
		return;
	int tr = rows > cols;
	int m = tr ? cols : rows, n = tr ? rows : cols;
	size_t mn = (size_t)m * n, mm = (size_t)m * m;
	size_t need = up64(mn) + up64(mm) + up64((mn + 1) / 2) + up64((mm + 1) / 2);
	float *base = scratch, *own = NULL;
	if (!scratch || (uintptr_t)scratch % 256 || need > newton_schulz_scratch(rows, cols))
		base = own = (float *)cuda_scratch(need * sizeof(float));
	float *X = base, *A = X + up64(mn);
	__nv_bfloat16 *Xb = (__nv_bfloat16 *)(A + up64(mm));
	__nv_bfloat16 *Ab = (__nv_bfloat16 *)(A + up64(mm) + up64((mn + 1) / 2));

	double *ss = (double *)cuda_scratch(sizeof(double));
	ns_load(X, in, rows, cols, tr, ss);
	cuda_scratch_free(ss);
	for (int s = 0; s < steps; s++) {
		cuda_to_bf16(Xb, X, mn);
		cuda_gemm_bf16(A, Xb, Xb, NULL, m, m, n, 0, 1, 1.0f, 0.0f);   /* A = X X^T */
		cuda_to_bf16(Ab, A, mm);
		cuda_gemm_bf16(A, Ab, Ab, NULL, m, m, m, 0, 0, NS_C, NS_B);   /* c AA + b A */
		cuda_to_bf16(Ab, A, mm);
		cuda_gemm_bf16(X, Ab, Xb, NULL, m, n, m, 0, 0, 1.0f, NS_A);   /* B X + a X */
	}
	ns_store(out, X, m, n, tr);
	cuda_scratch_free(own);
}

/* newton_schulz of count matrices of one shape (backend.h): the same steps
 * on X[count][sX] and A[count][sA] (256-byte strides), each product one
 * strided-batched GEMM (cuda_gemm_bf16_batched), each matrix the bits
 * cuda_newton_schulz gives it alone. */
void cuda_newton_schulz_many(float *const *out, const float *const *in, int count, int rows,
			     int cols, int steps, float *scratch)
{
	if (count <= 0 || rows <= 0 || cols <= 0)
		return;
	if (count == 1) {
		cuda_newton_schulz(out[0], in[0], rows, cols, steps, scratch);
		return;
	}
	int tr = rows > cols;
	int m = tr ? cols : rows, n = tr ? rows : cols;
	size_t mn = (size_t)m * n, sX = up64(mn), sA = up64((size_t)m * m);
	size_t need = (size_t)count * (sX + sA + sX / 2 + sA / 2);
	float *base = scratch, *own = NULL;
	if (!scratch || (uintptr_t)scratch % 256 ||
	    need > newton_schulz_many_scratch(count, rows, cols))
		base = own = (float *)cuda_scratch(need * sizeof(float));
	float *X = base, *A = X + count * sX;
	__nv_bfloat16 *Xb = (__nv_bfloat16 *)(A + count * sA); /* [count][sX] */
	__nv_bfloat16 *Ab = Xb + count * sX;                    /* [count][sA] */

	double *ss = (double *)cuda_scratch((size_t)count * sizeof(double));
	for (int k = 0; k < count; k++)
		ns_load(X + k * sX, in[k], rows, cols, tr, ss + k);
	cuda_scratch_free(ss);
	long long lX = (long long)sX, lA = (long long)sA;
	for (int s = 0; s < steps; s++) {
		/* the padding between matrices converts too, and is never read */
		cuda_to_bf16(Xb, X, count * sX);
		cuda_gemm_bf16_batched(A, Xb, Xb, m, m, n, 0, 1, 1.0f, 0.0f, count, lX, lX, lA); /* X X^T */
		cuda_to_bf16(Ab, A, count * sA);
		cuda_gemm_bf16_batched(A, Ab, Ab, m, m, m, 0, 0, NS_C, NS_B, count, lA, lA, lA); /* cAA + bA */
		cuda_to_bf16(Ab, A, count * sA);
		cuda_gemm_bf16_batched(X, Ab, Xb, m, n, m, 0, 0, 1.0f, NS_A, count, lA, lX, lX); /* BX + aX */
	}
	for (int k = 0; k < count; k++)
		ns_store(out[k], X + k * sX, m, n, tr);
	cuda_scratch_free(own);
}
