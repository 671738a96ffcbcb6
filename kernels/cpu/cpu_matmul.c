/* cpu_matmul.c - matrix products through OpenBLAS.
 *
 * Legend: N rows (B*T), C input channels, OC output channels.
 *
 * Determinism: OpenBLAS's own threading is NOT thread-count invariant (it
 * splits the output between threads, and the edge tiles of a split go through
 * kernels that accumulate K in another order: about 5% of the elements of a
 * 134x320x192 product change between 1 and 2 threads). So OpenBLAS always runs
 * on one thread, and cpu_gemm cuts the output into tiles whose size depends
 * only on the shape, one single-threaded sgemm per tile, tiles spread over
 * OpenMP threads. A tile's bits then never depend on who computes it.
 */
#include <cblas.h>
#include <pthread.h>

#include "cpu.h"

#define TILE_M 256 /* output rows per tile */
#define TILE_N 1024 /* output columns per tile */

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void)
{
	openblas_set_num_threads(1);
}

void cpu_blas_init(void)
{
	pthread_once(&blas_once, blas_single_thread);
}

/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, row-major; op = transpose
 * when ta/tb. Same contract as cblas_sgemm, deterministic for any threads. */
void cpu_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
	      const float *B, int ldb, float beta, float *Cm, int ldc)
{
	int mt = (M + TILE_M - 1) / TILE_M, nt = (N + TILE_N - 1) / TILE_N;
	long tiles = (long)mt * nt;

	cpu_blas_init();
	if (M <= 0 || N <= 0)
		return;
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu_threads()) if (tiles > 1)
	for (long t = 0; t < tiles; t++) {
		int i0 = (int)(t / nt) * TILE_M, j0 = (int)(t % nt) * TILE_N;
		int m = M - i0 < TILE_M ? M - i0 : TILE_M, n = N - j0 < TILE_N ? N - j0 : TILE_N;
		/* op(A) rows i0.. : A + i0*lda, or columns i0.. of A^T : A + i0 */
		const float *a = ta ? A + i0 : A + (size_t)i0 * lda;
		const float *b = tb ? B + (size_t)j0 * ldb : B + j0;
		cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
			    tb ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b, ldb, beta,
			    Cm + (size_t)i0 * ldc + j0, ldc);
	}
}

/* out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] */
void cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
			int N, int C, int OC)
{
	float beta = 0.0f;

	if (bias) {
#pragma omp parallel for num_threads(cpu_threads()) if ((size_t)N * OC >= CPU_PAR_MIN)
		for (int n = 0; n < N; n++) {
			float *o = out + (size_t)n * OC;
			for (int c = 0; c < OC; c++)
				o[c] = bias[c];
		}
		beta = 1.0f;
	}
	cpu_gemm(0, 1, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

/* dinp[N,C] = dout[N,OC] @ w[OC,C] (skipped when dinp is NULL; w is read
 * for it only); dw[OC,C] += dout^T @ inp[N,C] (skipped when NULL); dbias[OC]
 * += column sums of dout (if non-NULL). The three share nothing, so a call
 * per part (the split backward) gives the one call's bits. */
void cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
			 const float *inp, const float *w, int N, int C, int OC)
{
	if (dinp)
		cpu_gemm(0, 0, N, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
	if (dw)
		cpu_gemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
	if (dbias)
		cpu_colsum_acc(dbias, dout, N, OC);
}
