/* cuda_optim.cu - the optimizer pieces of AdEMAMix, MARS, SOAP and NorMuon
 * (kernels/backend.h has each contract; the CPU versions in
 * kernels/cpu/cpu_optim.c compute the same formulas element by element).
 * Plain kernels: these run once per tensor per step, far from the hot path
 * (kernels/cuda/NOTES.md). */
#include "cuda_common.h"

#define EACH(i, n)                                                               \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
	     i += (size_t)gridDim.x * blockDim.x)

__global__ static void ademamix_kernel(float *u, const float *g, float *m1, float *m2, float *nu,
				       size_t n, float lr, float b1, float b2, float b3,
				       float alpha, float eps, float ib1, float isb2)
{
	EACH(i, n)
	{
		float gi = g[i];
		float a = b1 * m1[i] + (1.0f - b1) * gi;
		float b = b3 * m2[i] + (1.0f - b3) * gi;
		float c = b2 * nu[i] + (1.0f - b2) * gi * gi;
		m1[i] = a;
		m2[i] = b;
		nu[i] = c;
		u[i] = -lr * (a * ib1 + alpha * b) / (sqrtf(c) * isb2 + eps);
	}
}

void cuda_ademamix_dir(float *u, const float *g, float *m1, float *m2, float *nu, size_t n,
		       float lr, float beta1, float beta2, float beta3, float alpha, float eps,
		       float bc1, float bc2)
{
	ademamix_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
		u, g, m1, m2, nu, n, lr, beta1, beta2, beta3, alpha, eps, 1.0f / bc1,
		1.0f / sqrtf(bc2));
	CUDA_LAUNCHED();
}

__global__ static void mars_kernel(float *c, const float *g, float *gprev, size_t n, float coef)
{
	EACH(i, n)
	{
		float gi = g[i];
		c[i] = gi + coef * (gi - gprev[i]);
		gprev[i] = gi;
	}
}

void cuda_mars_correct(float *c, const float *g, float *gprev, size_t n, float coef)
{
	mars_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(c, g, gprev, n, coef);
	CUDA_LAUNCHED();
}

__global__ static void ema_kernel(float *x, const float *g, size_t n, float beta)
{
	EACH(i, n)
		x[i] = beta * x[i] + (1.0f - beta) * g[i];
}

void cuda_ema(float *x, const float *g, size_t n, float beta)
{
	ema_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(x, g, n, beta);
	CUDA_LAUNCHED();
}

__global__ static void soap_adam_kernel(float *out, const float *mr, const float *gr, float *v,
					size_t n, float b2, float eps)
{
	EACH(i, n)
	{
		float vi = b2 * v[i] + (1.0f - b2) * gr[i] * gr[i];
		v[i] = vi;
		out[i] = mr[i] / (sqrtf(vi) + eps);
	}
}

void cuda_soap_adam(float *out, const float *mr, const float *gr, float *v, size_t n,
		    float beta2, float eps)
{
	soap_adam_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, mr, gr, v, n, beta2,
									  eps);
	CUDA_LAUNCHED();
}

/* one block per row: the sum of squares in double, reduced in a fixed tree
 * (the bits depend on the shape only) */
__global__ static void row_normalize_kernel(float *o, float *v, int cols, float b2, float eps)
{
	__shared__ double part[256];
	float *row = o + (size_t)blockIdx.x * cols;
	double s = 0.0;
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		s += (double)row[c] * row[c];
	part[threadIdx.x] = s;
	__syncthreads();
	for (int w = blockDim.x / 2; w > 0; w /= 2) {
		if ((int)threadIdx.x < w)
			part[threadIdx.x] += part[threadIdx.x + w];
		__syncthreads();
	}
	float vr = b2 * v[blockIdx.x] + (1.0f - b2) * (float)(part[0] / cols);
	float inv = 1.0f / (sqrtf(vr) + eps);
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		row[c] *= inv;
	if (threadIdx.x == 0)
		v[blockIdx.x] = vr;
}

void cuda_row_normalize(float *o, float *v, int rows, int cols, float beta2, float eps)
{
	if (rows <= 0 || cols <= 0)
		return;
	row_normalize_kernel<<<rows, 256, 0, cuda_stream()>>>(o, v, cols, beta2, eps);
	CUDA_LAUNCHED();
}

/* C[M,N] = alpha op(A) op(B) + beta C in fp32, 16x16 tiles: a plain kernel
 * for SOAP's rotations (small matrices, once per tensor per step); each
 * output is one thread's sum over K in order, so the bits depend on the
 * shape only. */
#define GT 16
__global__ static void gemm_kernel(float *c, const float *a, const float *b, int M, int N, int K,
				   int ta, int tb, float alpha, float beta)
{
	__shared__ float as[GT][GT + 1], bs[GT][GT + 1];
	int row = blockIdx.y * GT + threadIdx.y, col = blockIdx.x * GT + threadIdx.x;
	float s = 0.0f;
	for (int k0 = 0; k0 < K; k0 += GT) {
		int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
		/* op(A)[row, ka]: A[row, ka] or A[ka, row]; op(B)[kb, col] likewise */
		as[threadIdx.y][threadIdx.x] =
			row < M && ka < K ? (ta ? a[(size_t)ka * M + row] : a[(size_t)row * K + ka])
					  : 0.0f;
		bs[threadIdx.y][threadIdx.x] =
			kb < K && col < N ? (tb ? b[(size_t)col * K + kb] : b[(size_t)kb * N + col])
					  : 0.0f;
		__syncthreads();
		for (int k = 0; k < GT; k++)
			s += as[threadIdx.y][k] * bs[k][threadIdx.x];
		__syncthreads();
	}
	if (row < M && col < N) {
		float *out = c + (size_t)row * N + col;
		*out = beta == 0.0f ? alpha * s : alpha * s + beta * *out;
	}
}

void cuda_gemm_f32(float *c, const float *a, const float *b, int M, int N, int K, int ta, int tb,
		   float alpha, float beta)
{
	if (M <= 0 || N <= 0)
		return;
	dim3 grid((N + GT - 1) / GT, (M + GT - 1) / GT), block(GT, GT);
	gemm_kernel<<<grid, block, 0, cuda_stream()>>>(c, a, b, M, N, K, ta, tb, alpha, beta);
	CUDA_LAUNCHED();
}
