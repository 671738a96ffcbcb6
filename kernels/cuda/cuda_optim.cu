/* cuda_optim.cu - the optimizers' kernels: the pieces of AdEMAMix, MARS,
 * SOAP and NorMuon, AdamW, Adan, Lion, momentum, the update (with the
 * error-feedback correction), AdamW and Lion over many tensors in one
 * launch, and the gradient norm's sums of squares (kernels/backend.h has
 * each contract; the CPU versions in kernels/cpu/cpu_optim.c compute the
 * same formulas element by element). Plain kernels but the multi-tensor
 * ones: they run once per tensor per step, far from the hot path
 * (kernels/cuda/NOTES.md). */
#include <stdint.h>
#include <string.h>

#include "cuda_common.h"

extern "C" {
#include "../backend.h"
}


__global__ static void ademamix_kernel(float *u, const float *g, float *m1, float *m2, float *nu,
				       size_t n, float lr, float b1, float b2, float b3,
				       float alpha, float eps, float ib1, float isb2)
{
	GRID_STRIDE(i, n)
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
	GRID_STRIDE(i, n)
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
	GRID_STRIDE(i, n)
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
	GRID_STRIDE(i, n)
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

/* ------------------------------------------------------------------ */
/* the gradient norm                                                    */

/* Sum of squares: SUMSQ_BLOCKS fixed partial sums (by shape only), then one
 * block adds them in a fixed tree. Double accumulation throughout. */
#define SUMSQ_THREADS 256
#define SUMSQ_MAX_BLOCKS 1024

/* Partial sums for n elements: a function of n only. */
static int sumsq_blocks(size_t n)
{
	size_t want = (n + SUMSQ_THREADS * 8 - 1) / (SUMSQ_THREADS * 8);
	return (int)(want < 1 ? 1 : want > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : want);
}


/* Block lb of nb over x[n]: its grid-stride share of the squares, then a
 * fixed tree; thread 0 stores the block's partial at *part. The one body of
 * both partial kernels, so cu_sumsq and cu_sumsq_many give the same bits. */
__device__ static void sumsq_partial_body(double *part, const float *x, size_t n, int lb, int nb)
{
	__shared__ double sh[SUMSQ_THREADS];
	double s = 0;
	size_t stride = (size_t)nb * SUMSQ_THREADS;
	for (size_t i = (size_t)lb * SUMSQ_THREADS + threadIdx.x; i < n; i += stride) {
		double v = x[i];
		s += v * v;
	}
	sh[threadIdx.x] = s;
	__syncthreads();
	for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
		if (threadIdx.x < w)
			sh[threadIdx.x] += sh[threadIdx.x + w];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		*part = sh[0];
}

__global__ static void sumsq_partial_kernel(double *part, const float *x, size_t n)
{
	sumsq_partial_body(part + blockIdx.x, x, n, blockIdx.x, gridDim.x);
}

/* One block of SUMSQ_MAX_BLOCKS threads adds nparts partials in a fixed tree. */
__device__ static void sumsq_final_kernel_body(double *out, const double *part, int nparts)
{
	__shared__ double sh[SUMSQ_MAX_BLOCKS];
	int t = threadIdx.x;
	sh[t] = t < nparts ? part[t] : 0.0;
	__syncthreads();
	for (int w = SUMSQ_MAX_BLOCKS / 2; w > 0; w >>= 1) {
		if (t < w)
			sh[t] += sh[t + w];
		__syncthreads();
	}
	if (t == 0)
		*out = sh[0];
}

__global__ static void sumsq_final_kernel(double *out, const double *part, int nparts)
{
	sumsq_final_kernel_body(out, part, nparts);
}

void cuda_sumsq_device(double *out, const float *x, size_t n)
{
	int nb = sumsq_blocks(n);
	double *part = (double *)cuda_scratch(nb * sizeof(double));
	sumsq_partial_kernel<<<nb, SUMSQ_THREADS, 0, cuda_stream()>>>(part, x, n);
	CUDA_LAUNCHED();
	sumsq_final_kernel<<<1, SUMSQ_MAX_BLOCKS, 0, cuda_stream()>>>(out, part, nb);
	CUDA_LAUNCHED();
	cuda_scratch_free(part);
}

static double cu_sumsq(const float *x, size_t n)
{
	double *d = (double *)cuda_scratch(sizeof(double)), h = 0;
	cuda_sumsq_device(d, x, n);
	CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof(double), cudaMemcpyDeviceToHost, cuda_stream()));
	cuda_scratch_free(d);
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
	return h;
}

/* Many sums of squares in two launches per group of SUMSQ_GROUP tensors and
 * one wait: block b of a tensor computes what block b of its own
 * sumsq_partial_kernel launch would (the same number of blocks for its n,
 * the same loop and tree), and one block per tensor adds its partials with
 * sumsq_final_kernel's tree, so the bits are those of cu_sumsq per tensor.
 * The tensor table travels as a kernel argument (no upload to wait for). */
#define SUMSQ_GROUP 96

struct sumsq_group {
	const float *x[SUMSQ_GROUP];
	unsigned long long n[SUMSQ_GROUP];
	int first[SUMSQ_GROUP + 1]; /* tensor k's partials: [first[k], first[k+1]) */
	int count;
};

__global__ static void sumsq_many_partial_kernel(double *part, const struct sumsq_group g)
{
	int b = blockIdx.x, k = 0;
	while (k + 1 < g.count && g.first[k + 1] <= b)
		k++;
	sumsq_partial_body(part + b, g.x[k], g.n[k], b - g.first[k], g.first[k + 1] - g.first[k]);
}

__global__ static void sumsq_many_final_kernel(double *out, const double *part,
					       const struct sumsq_group g)
{
	int k = blockIdx.x;
	sumsq_final_kernel_body(out + k, part + g.first[k], g.first[k + 1] - g.first[k]);
}

static void cu_sumsq_many(double *out, const float *const *x, const size_t *n, int count)
{
	if (count <= 0)
		return;
	double *d = (double *)cuda_scratch((size_t)count * sizeof(double));
	for (int k0 = 0; k0 < count; k0 += SUMSQ_GROUP) {
		struct sumsq_group g;
		memset(&g, 0, sizeof(g));
		g.count = count - k0 < SUMSQ_GROUP ? count - k0 : SUMSQ_GROUP;
		for (int k = 0; k < g.count; k++) {
			g.x[k] = x[k0 + k];
			g.n[k] = n[k0 + k];
			g.first[k + 1] = g.first[k] + sumsq_blocks(n[k0 + k]);
		}
		int blocks = g.first[g.count];
		double *part = (double *)cuda_scratch((size_t)blocks * sizeof(double));
		sumsq_many_partial_kernel<<<blocks, SUMSQ_THREADS, 0, cuda_stream()>>>(part, g);
		CUDA_LAUNCHED();
		sumsq_many_final_kernel<<<g.count, SUMSQ_MAX_BLOCKS, 0, cuda_stream()>>>(d + k0, part, g);
		CUDA_LAUNCHED();
		cuda_scratch_free(part);
	}
	CUDA_CHECK(cudaMemcpyAsync(out, d, (size_t)count * sizeof(double), cudaMemcpyDeviceToHost,
				   cuda_stream()));
	cuda_scratch_free(d);
	CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}


/* ------------------------------------------------------------------ */
/* optimizer pieces: one element per call of a __device__ function, so a
 * multi-tensor kernel (a table of {pointer, n} chunks) can reuse them.    */

__device__ static inline void adamw_elem(float *u, const float *g, float *m, float *v, size_t i,
					 float lr, float b1, float b2, float eps, float bc1,
					 float bc2)
{
	float gi = g[i];
	float mi = b1 * m[i] + (1.0f - b1) * gi;
	float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
	m[i] = mi;
	v[i] = vi;
	u[i] = -lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

__global__ static void adamw_kernel(float *u, const float *g, float *m, float *v, size_t n,
				    float lr, float b1, float b2, float eps, float bc1, float bc2)
{
	GRID_STRIDE(i, n)
		adamw_elem(u, g, m, v, i, lr, b1, b2, eps, bc1, bc2);
}

static void cu_adamw_dir(float *u, const float *g, float *m, float *v, size_t n, float lr,
			 float beta1, float beta2, float eps, float bc1, float bc2)
{
	adamw_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(u, g, m, v, n, lr, beta1,
								      beta2, eps, bc1, bc2);
	CUDA_LAUNCHED();
}

/* Adan, the CPU's formula element by element (backend.h) */
__global__ static void adan_kernel(float *u, const float *g, float *m, float *v, float *nacc,
				   float *gprev, size_t n, float lr, float b1, float b2, float b3,
				   float eps, float ib1, float ib2, float isb3, int first)
{
	GRID_STRIDE(i, n)
	{
		float gi = g[i], d = first ? 0.0f : gi - gprev[i], z = gi + b2 * d;
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * d;
		float ni = b3 * nacc[i] + (1.0f - b3) * z * z;
		m[i] = mi;
		v[i] = vi;
		nacc[i] = ni;
		gprev[i] = gi;
		u[i] = -lr * (mi * ib1 + b2 * vi * ib2) / (sqrtf(ni) * isb3 + eps);
	}
}

static void cu_adan_dir(float *u, const float *g, float *m, float *v, float *nacc, float *gprev,
			size_t n, float lr, float beta1, float beta2, float beta3, float eps,
			float bc1, float bc2, float bc3, int first)
{
	adan_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(
		u, g, m, v, nacc, gprev, n, lr, beta1, beta2, beta3, eps, 1.0f / bc1, 1.0f / bc2,
		1.0f / sqrtf(bc3), first);
	CUDA_LAUNCHED();
}

__device__ static inline void lion_elem(float *u, const float *g, float *m, size_t i, float lr,
					float b1, float b2)
{
	float gi = g[i], mi = m[i];
	float c = b1 * mi + (1.0f - b1) * gi;
	u[i] = c > 0.0f ? -lr : c < 0.0f ? lr : 0.0f;
	m[i] = b2 * mi + (1.0f - b2) * gi;
}

__global__ static void lion_kernel(float *u, const float *g, float *m, size_t n, float lr,
				   float b1, float b2)
{
	GRID_STRIDE(i, n)
		lion_elem(u, g, m, i, lr, b1, b2);
}

static void cu_lion_dir(float *u, const float *g, float *m, size_t n, float lr, float beta1,
			float beta2)
{
	lion_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(u, g, m, n, lr, beta1, beta2);
	CUDA_LAUNCHED();
}

__global__ static void momentum_kernel(float *out, const float *g, float *m, size_t n, float mu,
				       int nesterov)
{
	GRID_STRIDE(i, n) {
		float gi = g[i];
		float mi = mu * m[i] + gi;
		m[i] = mi;
		out[i] = nesterov ? gi + mu * mi : mi;
	}
}

static void cu_momentum(float *out, const float *g, float *m, size_t n, float mu, int nesterov)
{
	momentum_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(out, g, m, n, mu,
									 nesterov);
	CUDA_LAUNCHED();
}

__global__ static void apply_update_kernel(float *w, const float *u, float *u_prev, size_t n,
					   float decay, float lambda)
{
	GRID_STRIDE(i, n) {
		float ui = u[i];
		float wi = w[i] * (1.0f - decay) + ui;
		if (u_prev) {
			wi += lambda * (ui - u_prev[i]);
			u_prev[i] = ui;
		}
		w[i] = wi;
	}
}

static void cu_apply_update(float *w, const float *u, float *u_prev, size_t n, float decay,
			    float lambda)
{
	apply_update_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(w, u, u_prev, n,
									     decay, lambda);
	CUDA_LAUNCHED();
}

/* AdamW or Lion then apply_update over a group of tensors in one launch
 * (backend.h, elementwise_step). A block belongs to one tensor (the group
 * table, passed by value, gives each tensor a run of blocks) and strides
 * over it. The direction is adamw_elem's / lion_elem's expression, kept in a
 * register instead of u[]; the update is apply_update_kernel's statements.
 * AdamW's direction ends in a division and Lion's is a selection, so no
 * multiply-add can be contracted across the seam: the bits are the
 * per-tensor kernels' (test_cuda_ops, cuda_elementwise_step). */
#define ELEM_GROUP 48
#define ELEM_PER_BLOCK (256 * 8)

struct elem_group {
	float *w[ELEM_GROUP];
	const float *g[ELEM_GROUP];
	float *s0[ELEM_GROUP], *s1[ELEM_GROUP], *up[ELEM_GROUP];
	unsigned long long n[ELEM_GROUP];
	float decay[ELEM_GROUP];
	int correct[ELEM_GROUP];
	int first[ELEM_GROUP + 1]; /* tensor k's blocks: [first[k], first[k+1]) */
	int count;
};

__global__ static void elementwise_step_kernel(const struct elem_group G, int rule, float lr,
					       float b1, float b2, float eps, float bc1, float bc2,
					       float lambda)
{
	int b = blockIdx.x, k = 0;
	while (k + 1 < G.count && G.first[k + 1] <= b)
		k++;
	size_t n = G.n[k], nb = (size_t)(G.first[k + 1] - G.first[k]);
	float *w = G.w[k], *m = G.s0[k], *v = G.s1[k], *up = G.up[k];
	const float *g = G.g[k];
	float keep = 1.0f - G.decay[k];
	int correct = up && G.correct[k];
	for (size_t i = (size_t)(b - G.first[k]) * blockDim.x + threadIdx.x; i < n;
	     i += nb * blockDim.x) {
		float gi = g[i], ui;
		if (rule == 0) {
			float mi = b1 * m[i] + (1.0f - b1) * gi;
			float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
			m[i] = mi;
			v[i] = vi;
			ui = -lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
		} else {
			float mi = m[i];
			float c = b1 * mi + (1.0f - b1) * gi;
			ui = c > 0.0f ? -lr : c < 0.0f ? lr : 0.0f;
			m[i] = b2 * mi + (1.0f - b2) * gi;
		}
		float wi = w[i] * keep + ui;
		if (correct)
			wi += lambda * (ui - up[i]);
		if (up)
			up[i] = ui;
		w[i] = wi;
	}
}

static void cu_elementwise_step(int rule, const struct optim_elem_tensor *t, int count, float lr,
				float beta1, float beta2, float eps, float bc1, float bc2,
				float lambda)
{
	for (int k0 = 0; k0 < count; k0 += ELEM_GROUP) {
		struct elem_group G;
		memset(&G, 0, sizeof(G));
		G.count = count - k0 < ELEM_GROUP ? count - k0 : ELEM_GROUP;
		for (int k = 0; k < G.count; k++) {
			const struct optim_elem_tensor *e = &t[k0 + k];
			G.w[k] = e->w;
			G.g[k] = e->g;
			G.s0[k] = e->s0;
			G.s1[k] = e->s1;
			G.up[k] = e->u_prev;
			G.n[k] = e->n;
			G.decay[k] = e->decay;
			G.correct[k] = e->correct;
			size_t nb = (e->n + ELEM_PER_BLOCK - 1) / ELEM_PER_BLOCK;
			G.first[k + 1] = G.first[k] + (int)(nb < 1 ? 1 : nb > 65536 ? 65536 : nb);
		}
		elementwise_step_kernel<<<G.first[G.count], 256, 0, cuda_stream()>>>(
			G, rule, lr, beta1, beta2, eps, bc1, bc2, lambda);
		CUDA_LAUNCHED();
	}
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
	GRID_STRIDE(i, n)
		x[i] *= s;
}

static void cu_scale(float *x, float s, size_t n)
{
	scale_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_stream()>>>(x, s, n);
	CUDA_LAUNCHED();
}


void cuda_optim_slots(struct backend &t)
{
	t.sumsq = cu_sumsq;
	t.sumsq_many = cu_sumsq_many;
	t.adamw_dir = cu_adamw_dir;
	t.adan_dir = cu_adan_dir;
	t.lion_dir = cu_lion_dir;
	t.momentum = cu_momentum;
	t.apply_update = cu_apply_update;
	t.elementwise_step = cu_elementwise_step;
	t.scale = cu_scale;
	t.ademamix_dir = cuda_ademamix_dir;
	t.mars_correct = cuda_mars_correct;
	t.ema = cuda_ema;
	t.soap_adam = cuda_soap_adam;
	t.row_normalize = cuda_row_normalize;
	t.gemm = cuda_gemm_f32;
	t.newton_schulz = cuda_newton_schulz;
	t.newton_schulz_many = cuda_newton_schulz_many;
}
